//! Throughput of the tickets client against a bare loop on the same
//! servers, for `shardflake tickets bench` and `scripts/bench-tickets.sh`
//! (the CLI's, not the library's: a library holds no benchmark harness): `tasks`
//! concurrent callers for a fixed time, counting ids, errors, and when the
//! errors happened (a server killed under load shows as an error window).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use shardflake_tickets::mysql_async::{self, prelude::*};
use shardflake_tickets::{Config, Kind, PgTickets, TicketClient, VERSION_TABLE, tokio_postgres};

/// What one run measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BenchReport {
    /// Ids handed out.
    pub(crate) ids: u64,
    /// Calls that failed.
    pub(crate) errors: u64,
    /// Wall time of the run.
    pub(crate) elapsed: Duration,
    /// From the first failed call's start to the last failed call's end
    /// (zero when none failed).
    pub(crate) error_window: Duration,
}

impl BenchReport {
    /// Ids per second.
    pub(crate) fn rate(&self) -> f64 {
        self.ids as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

struct Tally {
    ids: AtomicU64,
    errors: AtomicU64,
    first_error_ns: AtomicU64,
    last_error_ns: AtomicU64,
}

impl Tally {
    fn new() -> Arc<Tally> {
        Arc::new(Tally {
            ids: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            first_error_ns: AtomicU64::new(u64::MAX),
            last_error_ns: AtomicU64::new(0),
        })
    }

    fn error(&self, start: Instant, began: Instant) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.first_error_ns
            .fetch_min((began - start).as_nanos() as u64, Ordering::Relaxed);
        self.last_error_ns
            .fetch_max(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn report(&self, elapsed: Duration) -> BenchReport {
        let errors = self.errors.load(Ordering::Relaxed);
        BenchReport {
            ids: self.ids.load(Ordering::Relaxed),
            errors,
            elapsed,
            error_window: if errors == 0 {
                Duration::ZERO
            } else {
                Duration::from_nanos(
                    self.last_error_ns
                        .load(Ordering::Relaxed)
                        .saturating_sub(self.first_error_ns.load(Ordering::Relaxed)),
                )
            },
        }
    }
}

/// `tasks` callers of `client.next_n(sequence, batch)` for `duration`.
pub(crate) async fn bench_client(
    client: &TicketClient,
    sequence: &str,
    tasks: usize,
    batch: usize,
    duration: Duration,
) -> anyhow::Result<BenchReport> {
    // Unknown sequences and bad counts fail here, not as bench errors.
    client.next_n(sequence, batch).await?;
    let tally = Tally::new();
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (client, tally, sequence) = (client.clone(), tally.clone(), sequence.to_string());
        handles.push(tokio::spawn(async move {
            while start.elapsed() < duration {
                let began = Instant::now();
                match client.next_n(&sequence, batch).await {
                    Ok(ids) => {
                        tally.ids.fetch_add(ids.len() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "bench call failed");
                        tally.error(start, began);
                    }
                }
            }
        }));
    }
    for h in handles {
        let _ = h.await;
    }
    Ok(tally.report(start.elapsed()))
}

/// The bare loop the per-id mode is compared with: each task keeps one
/// connection to one server (task `i` to server `i mod N`) and runs
/// MariaDB's counter-row `UPDATE … LAST_INSERT_ID(id) + increment` and
/// `SELECT LAST_INSERT_ID()` (one round trip; the guard's trigger fires,
/// its proof is not read), or PostgreSQL's `nextval` (prepared), with no
/// failover, checks or marks.
pub(crate) async fn bench_bare(
    config: &Config,
    sequence: &str,
    tasks: usize,
    duration: Duration,
) -> anyhow::Result<BenchReport> {
    let (_, seq) = config
        .sequence(sequence)
        .with_context(|| format!("unknown sequence {sequence:?}"))?;
    let table = seq.table();
    let tally = Tally::new();
    let mut handles = Vec::new();
    let start = Instant::now();
    for i in 0..tasks {
        let server = config.servers[i % config.servers.len()].clone();
        let (increment, tally, table) = (config.increment, tally.clone(), table.clone());
        let pg_sequence = config.postgres_tickets == PgTickets::Sequence;
        handles.push(tokio::spawn(async move {
            let name = server.name.clone();
            match server.kind {
                Kind::Mariadb => {
                    let opts = mysql_async::Opts::from_url(&server.url)
                        .with_context(|| format!("server {name}: url"))?;
                    let mut conn = mysql_async::Conn::new(opts)
                        .await
                        .with_context(|| format!("server {name}: connect"))?;
                    // Pinned to the lattice's version, as a client's
                    // session is: the table's guard compares it.
                    conn.query_drop(format!(
                        "SET @shardflake_lattice = (SELECT version FROM {VERSION_TABLE})"
                    ))
                    .await
                    .with_context(|| format!("server {name}: pin the lattice version"))?;
                    let sql = format!(
                        "UPDATE {table} SET id = LAST_INSERT_ID(id) + {increment} WHERE stub = 'a'; SELECT LAST_INSERT_ID()"
                    );
                    while start.elapsed() < duration {
                        let began = Instant::now();
                        let answered = match conn.query_iter(sql.as_str()).await {
                            Ok(mut result) => {
                                let mut id = None;
                                while !result.is_empty() {
                                    match result.collect::<mysql_async::Row>().await {
                                        Ok(rows) => id = id.or(rows.into_iter().next()),
                                        Err(_) => break,
                                    }
                                }
                                id.is_some()
                            }
                            Err(_) => false,
                        };
                        if answered {
                            tally.ids.fetch_add(1, Ordering::Relaxed);
                        } else {
                            tally.error(start, began);
                        }
                    }
                }
                Kind::Postgres => {
                    let (client, connection) = tokio_postgres::connect(&server.url, tokio_postgres::NoTls)
                        .await
                        .with_context(|| format!("server {name}: connect"))?;
                    tokio::spawn(connection);
                    let sql = if pg_sequence {
                        format!("SELECT nextval('{table}')")
                    } else {
                        format!(
                            "INSERT INTO {table} AS t (stub, id) VALUES ('a', {}) ON CONFLICT (stub) DO UPDATE SET id = t.id + {increment} RETURNING id",
                            server.offset
                        )
                    };
                    let statement = client
                        .prepare(&sql)
                        .await
                        .with_context(|| format!("server {name}: prepare"))?;
                    while start.elapsed() < duration {
                        let began = Instant::now();
                        match client.query_one(&statement, &[]).await {
                            Ok(_) => {
                                tally.ids.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => tally.error(start, began),
                        }
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        if let Ok(Err(e)) = h.await {
            return Err(e);
        }
    }
    Ok(tally.report(start.elapsed()))
}
