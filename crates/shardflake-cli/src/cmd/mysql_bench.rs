//! `shardflake mysql bench`: every way to get an id on MariaDB, measured
//! against `AUTO_INCREMENT` in one run on one server: inserts per second
//! from N clients sharing one shard key, the server's CPU per insert (all
//! its threads, from `/proc/PID/task/*/schedstat`, when the server runs on
//! this machine), and the CPU of one connection per row of a bulk `INSERT
//! ... SELECT`. A harness of the CLI, not of the library: it drives
//! `shardflake_db::mysql` as a user of it would.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardflake::Layout;
use shardflake_db::Error;
use shardflake_db::mysql::{self, Names, Options, Plan, apply, sql};
use shardflake_db::mysql_async::prelude::*;
use shardflake_db::mysql_async::{self, Conn, Pool};

fn my(context: &str) -> impl FnOnce(mysql_async::Error) -> Error + '_ {
    Error::mysql(context)
}

fn other(context: &str, message: impl Into<String>) -> Error {
    Error::mysql_refused(context, message)
}

/// Ends a clock event's loop (the connection holding its lock), so the
/// scheduler starts the event's new body.
async fn stop_clock(conn: &mut Conn, names: &Names) -> Result<(), Error> {
    let holder: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .map_err(my("looking for a running clock event"))?;
    if let Some(Some(id)) = holder {
        let _ = conn.query_drop(format!("KILL CONNECTION {id}")).await;
    }
    Ok(())
}

/// One way to get an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchMode {
    /// `INSERT`, the id from the OK packet.
    AutoIncrement,
    /// The same, sent as text (the baseline of [`BenchMode::DefaultText`]).
    AutoIncrementText,
    /// Ours, as `mysql apply` installs it: the trigger on a cached sequence
    /// (`CACHE 1000`); the id from the OK packet.
    Trigger,
    /// The same table, `INSERT ... RETURNING id`.
    TriggerReturning,
    /// The same with a `NOCACHE` sequence.
    TriggerNocache,
    /// A `BEFORE INSERT` trigger calling a stored function per row.
    TriggerFunction,
    /// The expression as the column's `DEFAULT`, sent as text (a
    /// server-side prepared `INSERT` into it repeats ids and crashes
    /// MariaDB 10.11.19: measured only).
    DefaultText,
    /// `CALL generate_post_id(?, ?)` on the sequence, then `INSERT`.
    Procedure,
    /// `CALL generate_post_id_locked(?, ?)` (row lock on `sequences`, the
    /// previous design), then `INSERT`.
    LockedProcedure,
    /// The seed's procedure, verbatim, then `INSERT IGNORE` (duplicates
    /// counted).
    SeedProcedure,
}

impl BenchMode {
    /// Every mode, in report order.
    pub const ALL: [BenchMode; 10] = [
        BenchMode::AutoIncrement,
        BenchMode::AutoIncrementText,
        BenchMode::Trigger,
        BenchMode::TriggerReturning,
        BenchMode::TriggerNocache,
        BenchMode::TriggerFunction,
        BenchMode::DefaultText,
        BenchMode::Procedure,
        BenchMode::LockedProcedure,
        BenchMode::SeedProcedure,
    ];

    /// Label in reports.
    pub fn label(self) -> &'static str {
        match self {
            BenchMode::AutoIncrement => "AUTO_INCREMENT (id in the OK packet)",
            BenchMode::AutoIncrementText => "AUTO_INCREMENT, text protocol",
            BenchMode::Trigger => "**ours: sequence + trigger (id in the OK packet)**",
            BenchMode::TriggerReturning => "ours, INSERT ... RETURNING id",
            BenchMode::TriggerNocache => "ours with a NOCACHE sequence",
            BenchMode::TriggerFunction => "trigger calling a stored function",
            BenchMode::DefaultText => "column DEFAULT on the sequence (text protocol only)",
            BenchMode::Procedure => "CALL generate_post_id (sequence) + INSERT",
            BenchMode::LockedProcedure => "CALL generate_post_id_locked (row lock) + INSERT",
            BenchMode::SeedProcedure => "seed procedure (verbatim) + INSERT IGNORE",
        }
    }

    fn table(self) -> &'static str {
        match self {
            BenchMode::AutoIncrement | BenchMode::AutoIncrementText => "bench_auto",
            BenchMode::Trigger | BenchMode::TriggerReturning => "bench_trigger",
            BenchMode::TriggerNocache => "bench_nocache",
            BenchMode::TriggerFunction => "bench_trigfn",
            BenchMode::DefaultText => "bench_default",
            BenchMode::Procedure => "bench_proc",
            BenchMode::LockedProcedure => "bench_locked",
            BenchMode::SeedProcedure => "bench_seed",
        }
    }

    /// Whether the server makes the id inside the `INSERT` (bulk CPU
    /// measure possible).
    pub fn one_statement(self) -> bool {
        !matches!(
            self,
            BenchMode::Procedure
                | BenchMode::LockedProcedure
                | BenchMode::SeedProcedure
                | BenchMode::TriggerReturning
                | BenchMode::AutoIncrementText
        )
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Concurrent connections.
    pub clients: usize,
    /// Inserts per client per mode per round.
    pub rows: u64,
    /// The shard key every insert uses.
    pub user_id: i64,
    /// Rounds, each in a rotated order of the modes.
    pub rounds: usize,
    /// Modes to run.
    pub modes: Vec<BenchMode>,
    /// The server's pid, when it runs on this machine: CPU measures.
    pub server_pid: Option<u32>,
    /// Rows of the bulk `INSERT ... SELECT` per-row CPU measure (0: skip).
    pub cpu_rows: u64,
    /// Runs of it per mode.
    pub cpu_runs: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            clients: 8,
            rows: 2000,
            user_id: 1801,
            rounds: 1,
            modes: BenchMode::ALL.to_vec(),
            server_pid: None,
            cpu_rows: 0,
            cpu_runs: 3,
        }
    }
}

/// One mode in one round.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// Mode.
    pub mode: BenchMode,
    /// Round (1-based).
    pub round: usize,
    /// Inserts done.
    pub rows: u64,
    /// Rows whose id was a duplicate (seed only; ours would fail).
    pub duplicates: u64,
    /// Wall time.
    pub elapsed: Duration,
    /// CPU of all the server's threads during the mode.
    pub server_cpu: Option<Duration>,
    /// Largest lag of an id's time behind the client's clock when the
    /// insert returned, in ms (one-statement modes; negative: ahead).
    pub max_lag_ms: Option<i64>,
}

impl BenchResult {
    /// Inserts per second.
    pub fn rate(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
    /// Server CPU per insert, µs.
    pub fn cpu_per_row_us(&self) -> Option<f64> {
        self.server_cpu
            .map(|c| c.as_secs_f64() * 1e6 / self.rows.max(1) as f64)
    }
}

/// CPU of one connection per row of a bulk `INSERT ... SELECT`.
#[derive(Debug, Clone)]
pub struct CpuResult {
    /// Mode.
    pub mode: BenchMode,
    /// µs per row, each run.
    pub per_row_us: Vec<f64>,
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct BenchReport {
    /// `VERSION()`.
    pub version: String,
    /// Per mode and round.
    pub results: Vec<BenchResult>,
    /// Bulk per-row CPU.
    pub cpu: Vec<CpuResult>,
    /// CPU of the clock event's loop (of `bench_trigger`'s sequence), per
    /// second of the run.
    pub clock_cpu_share: Option<f64>,
}

impl BenchReport {
    /// Results of one mode, by round.
    pub fn of(&self, mode: BenchMode) -> Vec<&BenchResult> {
        self.results.iter().filter(|r| r.mode == mode).collect()
    }
}

fn names(table: &str, procedure: &str) -> Names {
    Names {
        table: table.into(),
        key: "user_id".into(),
        procedure: procedure.into(),
    }
}

fn ours() -> Names {
    names("bench_trigger", "bench_proc")
}

/// Drops and re-creates every bench table, sequence, event and routine.
async fn setup(conn: &mut Conn, layout: &Layout) -> Result<Plan, Error> {
    let plan = Plan::new(layout).map_err(|e| other("bench layout", e.to_string()))?;
    let ours = ours();
    let nocache = names("bench_nocache", "bench_nocache_proc");
    for n in [&ours, &nocache] {
        conn.query_drop(format!("DROP EVENT IF EXISTS `{}`", n.event()))
            .await
            .map_err(my("dropping a bench event"))?;
        stop_clock(conn, n).await?;
    }
    conn.query_drop(
        "DROP TABLE IF EXISTS bench_auto, bench_trigger, bench_nocache, bench_trigfn, bench_default, bench_proc, bench_locked, bench_seed;
         DROP SEQUENCE IF EXISTS bench_trigger_id_seq;
         DROP SEQUENCE IF EXISTS bench_nocache_id_seq;
         DROP FUNCTION IF EXISTS bench_next_id;",
    )
    .await
    .map_err(my("dropping the bench tables"))?;
    // And their high-waters: a sequence made anew below the last run's
    // would be refused as set back (as it must be outside a benchmark).
    let db: Option<String> = conn
        .query_first("SELECT DATABASE()")
        .await
        .map_err(my("reading the database"))?;
    if let Some(db) = db {
        for n in [&ours, &nocache] {
            if let Some(hw) = plan.clone().in_database(&db).high_water(n) {
                conn.query_drop(format!("DROP SEQUENCE IF EXISTS {hw}"))
                    .await
                    .map_err(my("dropping a bench high-water"))?;
            }
        }
    }
    apply(
        conn,
        layout,
        &Options {
            names: ours.clone(),
            cache: sql::DEFAULT_CACHE,
            locked: true,
            seed: true,
            // Bench tables, not a deployment's.
            new_deployment: true,
            ..Options::default()
        },
    )
    .await?;
    apply(
        conn,
        layout,
        &Options {
            names: nocache,
            cache: 0,
            locked: false,
            seed: false,
            new_deployment: true,
            ..Options::default()
        },
    )
    .await?;
    // Fresh rows in `sequences` for the locked and seed procedures.
    conn.exec_drop(
        "UPDATE sequences SET next_val = 1 WHERE name IN (?, ?)",
        (ours.locked_row(), ours.seed_row()),
    )
    .await
    .map_err(my("resetting sequences"))?;
    let mode = sql::SQL_MODE;
    conn.query_drop(format!("SET SESSION sql_mode = '{mode}'"))
        .await
        .map_err(my("setting sql_mode"))?;
    conn.query_drop(format!(
        "CREATE TABLE bench_auto (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE bench_trigfn (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE bench_default (user_id BIGINT NOT NULL, id BIGINT NOT NULL DEFAULT ({}) PRIMARY KEY, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE bench_proc (id BIGINT NOT NULL PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE bench_locked (id BIGINT NOT NULL PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE bench_seed (id BIGINT NOT NULL PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;",
        default_candidate_sql(&plan, &ours)
    ))
    .await
    .map_err(my("creating the bench tables"))?;
    conn.query_drop(id_function_sql(&plan, &ours, "bench_next_id"))
        .await
        .map_err(my("creating the id function"))?;
    conn.query_drop(function_trigger_sql("bench_trigfn", &ours, "bench_next_id"))
        .await
        .map_err(my("creating the function trigger"))?;
    Ok(plan)
}

// The SQL of the candidates measured here and never installed by `mysql
// apply` (what is installed lives in `shardflake_db::mysql::sql`).

/// `s` as an SQL string literal.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// A candidate measured by `mysql bench`, **not** installed: the same
/// expression as the column's `DEFAULT` (no function call: an error comes
/// from drawing an exhausted sequence). Unsafe with server-side prepared
/// statements on MariaDB 10.11 (see [`sql::trigger_sql`]).
fn default_candidate_sql(plan: &Plan, names: &Names) -> String {
    let seq = format!("`{}`", names.sequence());
    let key = format!("`{}`", names.key);
    let us = plan.micros_sql("UTC_TIMESTAMP(6)");
    format!(
        "CASE WHEN (NEXT VALUE FOR {seq}) + {stale} >= {clock} AND {us} >= 0 AND {key} >= 0 \
         THEN {id} ELSE NULL END",
        stale = plan.packed_ms(sql::STALE_MS),
        clock = plan.packed_sql(&us),
        id = plan.id_sql(&format!("(PREVIOUS VALUE FOR {seq})"), &key),
    )
}

/// A stored function with the default's semantics (draw, check, id; errors
/// by `SIGNAL`), for the trigger candidates of the benchmark:
/// `{fn_name}(key BIGINT) RETURNS BIGINT`.
fn id_function_sql(plan: &Plan, names: &Names, fn_name: &str) -> String {
    let us = plan.micros_sql("UTC_TIMESTAMP(6)");
    format!(
        "CREATE FUNCTION `{fn_name}`(k BIGINT) RETURNS BIGINT NOT DETERMINISTIC
COMMENT {comment}
BEGIN
  DECLARE w BIGINT DEFAULT NEXT VALUE FOR `{seq}`;
  DECLARE us BIGINT DEFAULT {us};
  IF k IS NULL OR k < 0 THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{fn_name}: the shard key must be >= 0';
  END IF;
  IF us < 0 OR w + {stale} < {clock} THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{fn_name}: the clock is before the epoch, or the sequence is far behind it';
  END IF;
  RETURN {id};
END",
        comment = quoted(&plan.marker()),
        seq = names.sequence(),
        stale = plan.packed_ms(sql::STALE_MS),
        clock = plan.packed_sql("us"),
        id = plan.id_sql("w", "k"),
    )
}

/// A `BEFORE INSERT` trigger on `table` calling [`id_function_sql`]'s
/// function for every row: the candidate "trigger calling a stored
/// function" of `mysql bench` (not installed).
fn function_trigger_sql(table: &str, names: &Names, fn_name: &str) -> String {
    format!(
        "CREATE OR REPLACE TRIGGER `{table}_id` BEFORE INSERT ON `{table}` FOR EACH ROW SET NEW.id = `{fn_name}`(NEW.`{}`)",
        names.key
    )
}

/// CPU time of every thread of `pid` so far.
fn process_cpu(pid: u32) -> Option<Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let path = task.ok()?.path().join("schedstat");
        ns += thread_ns(&path).unwrap_or(0);
    }
    Some(Duration::from_nanos(ns))
}

fn thread_ns(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

async fn thread_of(conn: &mut Conn, connection_sql: &str) -> Result<Option<u64>, Error> {
    let tid: Option<Option<u64>> = conn
        .query_first(format!(
            "SELECT TID FROM information_schema.PROCESSLIST WHERE ID = {connection_sql}"
        ))
        .await
        .map_err(my("looking up a server thread"))?;
    Ok(tid.flatten())
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One client's inserts; returns (duplicates, largest id-time lag in ms).
async fn client(
    mut c: Conn,
    mode: BenchMode,
    rows: u64,
    user_id: i64,
    plan: Plan,
) -> Result<(u64, Option<i64>), Error> {
    let table = mode.table();
    let mut dups = 0u64;
    let mut lag: Option<i64> = None;
    let decode_lag = |id: i64, lag: &mut Option<i64>| {
        if let Ok(p) = shardflake::Id(id as u64).decode(plan.layout()) {
            let l = now_ms() - p.unix_ms as i64;
            *lag = Some(lag.map_or(l, |m: i64| m.max(l)));
        }
    };
    let insert_auto = format!("INSERT INTO {table} (user_id, body) VALUES (?, 'hello')");
    let insert_auto_text =
        format!("INSERT INTO {table} (user_id, body) VALUES ({user_id}, 'hello')");
    let insert_returning =
        format!("INSERT INTO {table} (user_id, body) VALUES (?, 'hello') RETURNING id");
    let insert_text =
        format!("INSERT INTO {table} (user_id, body) VALUES ({user_id}, 'hello') RETURNING id");
    let insert_id = format!("INSERT INTO {table} (id, user_id, body) VALUES (?, ?, 'hello')");
    let insert_ignore =
        format!("INSERT IGNORE INTO {table} (id, user_id, body) VALUES (?, ?, 'hello')");
    let n = ours();
    let procedure = match mode {
        BenchMode::Procedure => n.procedure.clone(),
        BenchMode::LockedProcedure => n.locked_procedure(),
        _ => n.seed_procedure(),
    };
    for _ in 0..rows {
        match mode {
            BenchMode::AutoIncrement | BenchMode::AutoIncrementText => {
                if mode == BenchMode::AutoIncrement {
                    c.exec_drop(&insert_auto, (user_id,)).await
                } else {
                    c.query_drop(&insert_auto_text).await
                }
                .map_err(my("insert"))?;
                if c.last_insert_id().is_none() {
                    return Err(other("insert", "no id in the OK packet"));
                }
            }
            BenchMode::Trigger | BenchMode::TriggerNocache | BenchMode::TriggerFunction => {
                c.exec_drop(&insert_auto, (user_id,))
                    .await
                    .map_err(my("insert"))?;
                let id = c
                    .last_insert_id()
                    .ok_or_else(|| other("insert", "no id in the OK packet"))?;
                decode_lag(id as i64, &mut lag);
            }
            BenchMode::TriggerReturning | BenchMode::DefaultText => {
                let id: Option<i64> = if mode == BenchMode::DefaultText {
                    c.query_first(&insert_text).await
                } else {
                    c.exec_first(&insert_returning, (user_id,)).await
                }
                .map_err(my("insert"))?;
                let id = id.ok_or_else(|| other("insert", "RETURNING gave no row"))?;
                decode_lag(id, &mut lag);
            }
            BenchMode::Procedure | BenchMode::LockedProcedure | BenchMode::SeedProcedure => {
                let id = mysql::generate_post_id(&mut c, &procedure, user_id).await?;
                if mode == BenchMode::SeedProcedure {
                    c.exec_drop(&insert_ignore, (id, user_id))
                        .await
                        .map_err(my("insert"))?;
                    if c.affected_rows() == 0 {
                        dups += 1;
                    }
                } else {
                    c.exec_drop(&insert_id, (id, user_id))
                        .await
                        .map_err(my("insert"))?;
                    decode_lag(id, &mut lag);
                }
            }
        }
    }
    Ok((dups, lag))
}

async fn run_mode(
    pool: &Pool,
    plan: &Plan,
    mode: BenchMode,
    round: usize,
    opts: &BenchOptions,
) -> Result<BenchResult, Error> {
    let mut c = pool.get_conn().await.map_err(my("connecting"))?;
    c.query_drop(format!("TRUNCATE TABLE {}", mode.table()))
        .await
        .map_err(my("truncating"))?;
    drop(c);
    // Connect every client before the clock starts.
    let mut conns = Vec::with_capacity(opts.clients);
    for _ in 0..opts.clients {
        conns.push(pool.get_conn().await.map_err(my("connecting"))?);
    }
    let cpu0 = opts.server_pid.and_then(process_cpu);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in conns {
        tasks.push(tokio::spawn(client(
            c,
            mode,
            opts.rows,
            opts.user_id,
            plan.clone(),
        )));
    }
    let mut duplicates = 0;
    let mut max_lag: Option<i64> = None;
    for t in tasks {
        let (d, l) = t.await.map_err(|e| other("bench task", e.to_string()))??;
        duplicates += d;
        if let Some(l) = l {
            max_lag = Some(max_lag.map_or(l, |m| m.max(l)));
        }
    }
    let elapsed = start.elapsed();
    let cpu1 = opts.server_pid.and_then(process_cpu);
    let rows = opts.rows * opts.clients as u64;
    let mut c = pool.get_conn().await.map_err(my("connecting"))?;
    let stored: Option<i64> = c
        .query_first(format!("SELECT COUNT(*) FROM {}", mode.table()))
        .await
        .map_err(my("counting"))?;
    if stored.unwrap_or(0) as u64 != rows - duplicates {
        return Err(other(
            "bench",
            format!(
                "{}: {} rows stored, {} expected",
                mode.table(),
                stored.unwrap_or(0),
                rows - duplicates
            ),
        ));
    }
    Ok(BenchResult {
        mode,
        round,
        rows,
        duplicates,
        elapsed,
        server_cpu: cpu0.zip(cpu1).map(|(a, b)| b.saturating_sub(a)),
        max_lag_ms: max_lag,
    })
}

async fn bulk_cpu(
    pool: &Pool,
    pid: u32,
    mode: BenchMode,
    rows: u64,
    user_id: i64,
) -> Result<Option<f64>, Error> {
    let mut c = pool.get_conn().await.map_err(my("connecting"))?;
    c.query_drop(format!("TRUNCATE TABLE {}", mode.table()))
        .await
        .map_err(my("truncating"))?;
    let Some(tid) = thread_of(&mut c, "CONNECTION_ID()").await? else {
        return Ok(None);
    };
    let path = std::path::PathBuf::from(format!("/proc/{pid}/task/{tid}/schedstat"));
    let Some(ns0) = thread_ns(&path) else {
        return Ok(None);
    };
    c.query_drop(format!(
        "INSERT INTO {} (user_id, body) SELECT {user_id}, 'hello' FROM seq_1_to_{rows}",
        mode.table()
    ))
    .await
    .map_err(my("bulk insert"))?;
    let ns1 = thread_ns(&path).unwrap_or(ns0);
    Ok(Some((ns1 - ns0) as f64 / 1000.0 / rows.max(1) as f64))
}

/// Runs the benchmark: sets up every table (dropping the bench tables
/// first), then `rounds` rounds of every mode in a rotated order, then the
/// bulk CPU measure.
pub async fn bench(
    pool: &Pool,
    layout: &Layout,
    opts: &BenchOptions,
) -> Result<BenchReport, Error> {
    let mut c = pool.get_conn().await.map_err(my("connecting"))?;
    let version: Option<String> = c
        .query_first("SELECT VERSION()")
        .await
        .map_err(my("reading the version"))?;
    let plan = setup(&mut c, layout).await?;
    let default = ours();
    let clock_tid = match opts.server_pid {
        Some(_) => {
            thread_of(
                &mut c,
                &format!("IS_USED_LOCK({})", default.clock_lock_sql()),
            )
            .await?
        }
        None => None,
    };
    drop(c);
    let clock_path = opts
        .server_pid
        .zip(clock_tid)
        .map(|(pid, tid)| std::path::PathBuf::from(format!("/proc/{pid}/task/{tid}/schedstat")));
    let clock0 = clock_path.as_deref().and_then(thread_ns);
    let wall0 = Instant::now();
    let mut results = Vec::new();
    let modes = &opts.modes;
    for round in 1..=opts.rounds {
        let k = (round - 1) % modes.len().max(1);
        for &mode in modes[k..].iter().chain(&modes[..k]) {
            results.push(run_mode(pool, &plan, mode, round, opts).await?);
        }
    }
    let clock_cpu_share = clock_path
        .as_deref()
        .and_then(thread_ns)
        .zip(clock0)
        .map(|(b, a)| (b - a) as f64 / 1e9 / wall0.elapsed().as_secs_f64());
    let mut cpu = Vec::new();
    if let Some(pid) = opts.server_pid
        && opts.cpu_rows > 0
    {
        for &mode in modes.iter().filter(|m| m.one_statement()) {
            let mut runs = Vec::new();
            for _ in 0..opts.cpu_runs {
                if let Some(us) = bulk_cpu(pool, pid, mode, opts.cpu_rows, opts.user_id).await? {
                    runs.push(us);
                }
            }
            cpu.push(CpuResult {
                mode,
                per_row_us: runs,
            });
        }
    }
    Ok(BenchReport {
        version: version.unwrap_or_default(),
        results,
        cpu,
        clock_cpu_share,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake_testkit::MariaDbServer;

    /// Moved from `shardflake-db/tests/it/mysql.rs` with the harness.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bench_runs_every_mode() {
        let server = MariaDbServer::start_with("", None).unwrap();
        let pool = mysql::pool(&server.url()).unwrap();
        let pid: u32 = server.pid().unwrap();
        let opts = BenchOptions {
            clients: 4,
            rows: 50,
            rounds: 2,
            server_pid: Some(pid),
            cpu_rows: 2000,
            cpu_runs: 1,
            ..Default::default()
        };
        let layout = shardflake::preset::by_name("mysql-procedure").unwrap();
        let r = bench(&pool, &layout, &opts).await.unwrap();
        assert_eq!(r.results.len(), 20);
        for res in &r.results {
            if res.mode != BenchMode::SeedProcedure {
                assert_eq!(res.duplicates, 0, "{res:?}");
            }
            assert!(res.cpu_per_row_us().is_some());
        }
        assert_eq!(r.cpu.len(), 5);
        assert!(r.clock_cpu_share.is_some());
    }
}
