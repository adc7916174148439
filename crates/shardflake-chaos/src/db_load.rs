//! The writers every in-database mode runs (`db`, `db-pg`, `db-adopt`):
//! clients inserting rows with `INSERT ... RETURNING id` into MariaDB or
//! PostgreSQL, single rows and bursts, one connection at a time, each
//! connection's answers one log for the checker. What a run's faults do
//! to them goes through [`Writers`]: a lane paused (its writers wait, and
//! the pause waits for their statements under way), the generation bumped
//! (a new server process, a restore, a changed default: every
//! connection's log ends there), the restores counted.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable as _;

use crate::load::Answers;
use crate::record::{ConnLog, Protocol, ms_since};
use crate::verdict::ClientLog;

/// Pause after a failed connect or statement, so a server that refuses
/// or is down is not spun on.
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// The MariaDB writers' shard key (`user_id`): shard 777 of 1024.
const MARIADB_KEY: u64 = 1801;

/// The server the writers insert into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `tokio-postgres`; rows from `generate_series`.
    Postgres,
    /// `mysql_async`; rows from the `seq_1_to_N` engine.
    MariaDb,
}

impl Backend {
    /// The name the error codes and the report use.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgresql",
            Backend::MariaDb => "mariadb",
        }
    }

    fn protocol(self) -> Protocol {
        match self {
            Backend::Postgres => Protocol::Postgres,
            Backend::MariaDb => Protocol::MariaDb,
        }
    }

    fn code(self) -> &'static str {
        match self {
            Backend::Postgres => "pg",
            Backend::MariaDb => "mariadb",
        }
    }
}

/// A short code for a failed PostgreSQL statement or connect.
fn pg_code(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("pg:{}", d.code().code()),
        None => "pg:io".into(),
    }
}

/// A short code for a failed MariaDB statement or connect.
fn mariadb_code(e: &mysql_async::Error) -> String {
    match e {
        mysql_async::Error::Server(s) => format!("mariadb:server_{}", s.code),
        mysql_async::Error::Io(_) => "mariadb:io".into(),
        mysql_async::Error::Driver(_) => "mariadb:driver".into(),
        _ => "mariadb:other".into(),
    }
}

/// One lane's state: writers of a lane pause together.
#[derive(Default)]
struct LaneState {
    paused: AtomicBool,
    /// Statements under way: a pause waits for them to end.
    in_flight: AtomicU32,
}

/// What the writers share with the run's fault thread.
pub struct Writers {
    /// When the load began.
    pub start: Instant,
    stop: AtomicBool,
    lanes: Vec<LaneState>,
    generation: AtomicU32,
    restores: AtomicU32,
    /// Every id answered, with the restores before it (kept on request).
    answered: Option<Mutex<Vec<(u32, u64)>>>,
    /// Successful answers, for the outage and "came back".
    pub answers: Mutex<Answers>,
}

impl Writers {
    /// Writers in `lanes` lanes; `keep_ids`: remember every id answered
    /// (for a read-back of the table at the end).
    pub fn new(lanes: usize, keep_ids: bool) -> Arc<Writers> {
        Arc::new(Writers {
            start: Instant::now(),
            stop: AtomicBool::new(false),
            lanes: (0..lanes.max(1)).map(|_| LaneState::default()).collect(),
            generation: AtomicU32::new(0),
            restores: AtomicU32::new(0),
            answered: keep_ids.then(|| Mutex::new(Vec::new())),
            answers: Mutex::new(Answers::default()),
        })
    }

    /// Ms since the load began.
    pub fn now_ms(&self) -> u32 {
        ms_since(self.start)
    }

    /// Ends the load: each writer stops after its statement under way.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// The generation now.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A new generation: every connection's log ends, and a connection
    /// made across the change is made again.
    pub fn next_generation(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// A restore: a new generation, and ids answered before it may be gone.
    pub fn restored(&self) {
        self.restores.fetch_add(1, Ordering::SeqCst);
        self.next_generation();
    }

    /// Restores so far.
    pub fn restores(&self) -> u32 {
        self.restores.load(Ordering::SeqCst)
    }

    /// Every id answered, with the restores before it (empty unless kept).
    pub fn answered(&self) -> Vec<(u32, u64)> {
        self.answered.as_ref().map_or_else(Vec::new, |a| {
            a.lock().unwrap_or_else(|p| p.into_inner()).clone()
        })
    }

    /// Pauses the lane's writers and waits (at most `within`) for their
    /// statements under way to end.
    pub fn pause(&self, lane: usize, within: Duration) {
        let Some(l) = self.lanes.get(lane) else {
            return;
        };
        l.paused.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + within;
        while l.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets the lane's writers go on.
    pub fn resume(&self, lane: usize) {
        if let Some(l) = self.lanes.get(lane) {
            l.paused.store(false, Ordering::SeqCst);
        }
    }

    fn paused(&self, lane: usize) -> bool {
        self.lanes
            .get(lane)
            .is_some_and(|l| l.paused.load(Ordering::SeqCst))
    }
}

/// The checker's slot of a connection's log.
#[derive(Debug, Clone, Copy)]
pub enum Slots {
    /// This slot, the generation as its process: ids of a later generation
    /// must all be above an earlier one's (a restarted server).
    Incarnation(usize),
    /// A slot of its own per generation (`generation * 1000 + slot`): ids
    /// may go down from one generation to the next by design (a default
    /// put back by hand). Ids are plain numbers: no sequence field.
    PerGeneration(usize),
}

/// The statements a writer sends.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// A burst is 2 to this many rows (four in ten statements); the rest
    /// one row.
    pub max_rows: u32,
    /// Pause before each statement.
    pub pause: Duration,
    /// Longest a connect or a statement may take.
    pub timeout: Duration,
}

/// Where one writer writes.
pub struct Lane {
    /// Which lane of [`Writers`] it pauses with.
    pub lane: usize,
    /// The server's kind.
    pub backend: Backend,
    /// The table (`user_id` and `body` columns; the id from its default).
    pub table: String,
    /// The URL to connect to now (asked again for each connection: a
    /// shard's writers follow its moves).
    pub url: Box<dyn Fn() -> anyhow::Result<String> + Send + Sync>,
    /// How its logs are slotted.
    pub slots: Slots,
    /// The id bits that are not the sequence (0: plain numbers).
    pub sequence_mask: u64,
    /// Its statements.
    pub mix: Mix,
}

impl Lane {
    fn log(&self, generation: u32) -> ConnLog {
        let p = self.backend.protocol();
        match self.slots {
            Slots::Incarnation(slot) => ConnLog::new(slot, generation, p, self.sequence_mask),
            Slots::PerGeneration(slot) => ConnLog::new(generation as usize * 1000 + slot, 0, p, 0),
        }
    }
}

/// An open connection.
enum Conn {
    Postgres(tokio_postgres::Client),
    MariaDb(mysql_async::Conn),
}

impl Conn {
    async fn open(backend: Backend, url: &str) -> Result<Conn, String> {
        match backend {
            Backend::Postgres => {
                let (c, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| pg_code(&e))?;
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                Ok(Conn::Postgres(c))
            }
            Backend::MariaDb => mysql_async::Conn::from_url(url)
                .await
                .map(Conn::MariaDb)
                .map_err(|e| mariadb_code(&e)),
        }
    }

    /// Inserts `rows` rows; the ids the server answered, in its order.
    async fn insert(&mut self, table: &str, rows: u32) -> Result<Vec<u64>, String> {
        match self {
            Conn::Postgres(c) => {
                let sql = format!(
                    "INSERT INTO {table} (user_id, body) SELECT g, 'chaos' FROM generate_series(1, $1::bigint) g RETURNING id"
                );
                let r = c
                    .query(&sql, &[&i64::from(rows)])
                    .await
                    .map_err(|e| pg_code(&e))?;
                Ok(r.iter().map(|r| r.get::<_, i64>(0) as u64).collect())
            }
            Conn::MariaDb(c) => {
                let sql = if rows == 1 {
                    format!("INSERT INTO {table} (user_id, body) VALUES (?, 'chaos') RETURNING id")
                } else {
                    format!(
                        "INSERT INTO {table} (user_id, body) SELECT ?, 'chaos' FROM seq_1_to_{rows} RETURNING id"
                    )
                };
                c.exec::<u64, _, _>(sql, (MARIADB_KEY,))
                    .await
                    .map_err(|e| mariadb_code(&e))
            }
        }
    }
}

/// One writer: a connection at a time (a failed statement ends it and a
/// new one is opened, so one connection's log is one server process's
/// answers), statements in a seeded mix, until the load stops.
pub async fn writer(w: Arc<Writers>, lane: Lane, seed: u64) -> ClientLog {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = ClientLog::default();
    let code = lane.backend.code();
    let state = &w.lanes[lane.lane.min(w.lanes.len() - 1)];
    while !w.stopped() {
        if w.paused(lane.lane) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let Ok(url) = (lane.url)() else {
            out.error(format!("{code}:route"));
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        // A connection is labelled with the generation it reached: read
        // before and after connecting, they must agree.
        let before = w.generation();
        let conn = tokio::time::timeout(lane.mix.timeout, Conn::open(lane.backend, &url)).await;
        let generation = w.generation();
        let mut conn = match conn {
            Ok(Ok(c)) if before == generation => c,
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => {
                out.error(format!("{e} (connect)"));
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
            Err(_) => {
                out.error(format!("{code}:connect_timeout"));
                continue;
            }
        };
        let mut log = lane.log(generation);
        while !w.stopped() && !w.paused(lane.lane) && w.generation() == generation {
            let rows = if rng.f64() < 0.6 {
                1
            } else {
                rng.u32(2..=lane.mix.max_rows.max(2))
            };
            if !lane.mix.pause.is_zero() {
                tokio::time::sleep(lane.mix.pause).await;
            }
            // Counted before the pause is looked at: a pause that begins
            // after the look waits for this statement.
            state.in_flight.fetch_add(1, Ordering::SeqCst);
            if state.paused.load(Ordering::SeqCst) {
                state.in_flight.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            let restores = w.restores();
            let answer =
                tokio::time::timeout(lane.mix.timeout, conn.insert(&lane.table, rows)).await;
            state.in_flight.fetch_sub(1, Ordering::SeqCst);
            match answer {
                Ok(Ok(ids)) => {
                    let at = w.now_ms();
                    log.record(&ids, at);
                    if let Some(kept) = &w.answered {
                        kept.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .extend(ids.iter().map(|&id| (restores, id)));
                    }
                    w.answers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .answered(u64::from(at));
                }
                Ok(Err(e)) => {
                    out.error(e);
                    // Refused for a while (restored, not yet repaired or
                    // adopted again; a move's pause): not spun on.
                    tokio::time::sleep(RETRY_PAUSE).await;
                    break;
                }
                Err(_) => {
                    out.error(format!("{code}:timeout"));
                    break;
                }
            }
        }
        out.logs.push(log);
    }
    out
}
