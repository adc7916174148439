//! [`TicketClient`]: the async API the CLI and the service call. Per-id
//! sequences make one round trip per id through the servers' failover
//! loop (`failover::Pool`), to the up server with the fewest calls in
//! flight (in turn when even: `failover::call_order`); segment sequences
//! are served from the double buffer of [`crate::segment`].
//! Background tasks: a prober that takes failed servers back, a writer of
//! high-water marks, and the segment prefetches. They stop when the last
//! clone of the client is dropped.

use std::sync::{Arc, Weak};

use tokio::task::JoinHandle;

use crate::config::{Config, Kind, Mode, PgTickets};
use crate::error::{ServerFailure, TicketError};
use crate::failover::{Health, Pool, Server, ServerMetrics};
use crate::high_water::{HighWaterStore, PeersStore};
use crate::segment::SegmentSequence;

/// The limits on one call, kept at their old path.
pub use crate::config::{MAX_COUNT, MAX_PER_ID_COUNT};

struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A client of the ticket servers of one configuration. Cheap to clone;
/// must be created inside a tokio runtime.
#[derive(Clone)]
pub struct TicketClient {
    pool: Arc<Pool>,
    /// Per sequence: its buffers in segment mode.
    segments: Arc<[Option<Arc<SegmentSequence>>]>,
    _tasks: Arc<Tasks>,
}

impl std::fmt::Debug for TicketClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |v: Vec<&str>| v.join(",");
        let config = &self.pool.config;
        f.debug_struct("TicketClient")
            .field(
                "servers",
                &names(config.servers.iter().map(|s| s.name.as_str()).collect()),
            )
            .field(
                "sequences",
                &names(config.sequences.iter().map(|q| q.name.as_str()).collect()),
            )
            .finish_non_exhaustive()
    }
}

/// What [`TicketClient::shutdown`] did with the segment blocks it held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Ids reserved and never handed out (a tail is never given back:
    /// see [`crate::segment`]).
    pub skipped_ids: u64,
}

impl TicketClient {
    /// Connects to every server with the high-water marks kept in the peers
    /// ([`PeersStore`]). Servers that cannot be used now are marked down or
    /// refused (and probed); an error only when none can be used.
    pub async fn connect(config: Config) -> Result<TicketClient, TicketError> {
        let store = crate::high_water::stores(PeersStore::new(config.clone()));
        TicketClient::connect_with_store(config, store).await
    }

    /// [`TicketClient::connect`] with another high-water store.
    pub async fn connect_with_store(
        config: Config,
        store: Arc<dyn HighWaterStore>,
    ) -> Result<TicketClient, TicketError> {
        let (client, failures) = TicketClient::start(config, store).await;
        if failures.len() == client.pool.servers.len() {
            return Err(TicketError::Unavailable {
                sequence: String::new(),
                failures,
            });
        }
        Ok(client)
    }

    /// [`TicketClient::connect_with_store`] for a process whose other work
    /// must not wait on the ticket servers (the service: its Snowflake ids
    /// never depend on them): never an error. Servers that cannot be used
    /// now (a stalled one, one whose marks no place holds) are marked down
    /// or refused, calls answer `unavailable` while none is up, and the
    /// prober takes each back once it passes the checks.
    pub async fn start_with_store(config: Config, store: Arc<dyn HighWaterStore>) -> TicketClient {
        TicketClient::start(config, store).await.0
    }

    /// Probes every server once (each within the attempt timeout) and starts
    /// the background tasks: the client, and why each server that is not
    /// up is not.
    async fn start(
        config: Config,
        store: Arc<dyn HighWaterStore>,
    ) -> (TicketClient, Vec<ServerFailure>) {
        if config.postgres_tickets == PgTickets::Sequence
            && config.servers.iter().any(|s| s.kind == Kind::Postgres)
            && config.sequences.iter().any(|q| q.mode == Mode::PerId)
        {
            tracing::warn!(
                "postgres_tickets = \"sequence\": a restore that sets a ticket sequence back in place (setval, a data-only dump) while clients run is not refused, and a client whose last answer was below it hands out ids again; the default \"table\" refuses it"
            );
        }
        let pool = Arc::new(Pool::new(config, store));
        let mut failures = Vec::new();
        for server in &pool.servers {
            match pool.probe(server).await {
                Ok(()) => {}
                Err(e) => failures.push(ServerFailure {
                    server: server.config.name.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        let segments = (0..pool.config.sequences.len())
            .map(|i| {
                (pool.config.sequences[i].mode == Mode::Segment)
                    .then(|| Arc::new(SegmentSequence::new(Arc::clone(&pool), i)))
            })
            .collect();
        let weak = Arc::downgrade(&pool);
        let tasks = vec![
            tokio::spawn(prober(weak.clone())),
            tokio::spawn(recorder(weak)),
        ];
        let client = TicketClient {
            pool,
            segments,
            _tasks: Arc::new(Tasks(tasks)),
        };
        (client, failures)
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.pool.config
    }

    /// One id of `sequence`.
    pub async fn next(&self, sequence: &str) -> Result<u64, TicketError> {
        let (index, mode) = self.lookup(sequence)?;
        match mode {
            Mode::PerId => self.pool.ticket(index).await,
            Mode::Segment => Ok(self.segment(index)?.take(1).await?[0]),
        }
    }

    /// `count` ids of `sequence` (1 to [`Mode::max_count`]: [`MAX_COUNT`]
    /// in segment mode, [`MAX_PER_ID_COUNT`] per id), in increasing order.
    pub async fn next_n(&self, sequence: &str, count: usize) -> Result<Vec<u64>, TicketError> {
        let (index, mode) = self.lookup(sequence)?;
        let max = mode.max_count();
        if count == 0 || count > max {
            return Err(TicketError::BadCount { count, max });
        }
        match mode {
            Mode::PerId => {
                let mut ids = Vec::with_capacity(count);
                for _ in 0..count {
                    ids.push(self.pool.ticket(index).await?);
                }
                // Taken from the servers in turn, each counting on its own
                // residue: ["11","10","13","12"] unsorted (issue 30).
                ids.sort_unstable();
                Ok(ids)
            }
            Mode::Segment => self.segment(index)?.take(count).await,
        }
    }

    /// The buffers of segment sequence `index`.
    fn segment(&self, index: usize) -> Result<&Arc<SegmentSequence>, TicketError> {
        self.segments[index].as_ref().ok_or_else(|| {
            TicketError::UnknownSequence(self.pool.config.sequences[index].name.clone())
        })
    }

    fn lookup(&self, sequence: &str) -> Result<(usize, Mode), TicketError> {
        self.pool
            .config
            .sequence(sequence)
            .map(|(i, q)| (i, q.mode))
            .ok_or_else(|| TicketError::UnknownSequence(sequence.to_string()))
    }

    /// Each server's state and counters.
    pub fn metrics(&self) -> Vec<ServerMetrics> {
        self.pool.servers.iter().map(Server::metrics).collect()
    }

    /// Writes every high-water mark this client holds now (they are also
    /// written ahead of every id, and again every `high_water_interval_ms`).
    pub async fn record_high_water(&self) -> Result<(), TicketError> {
        self.pool.record(true).await
    }

    /// Stops fetching (the unused tails of the segment blocks are skipped,
    /// never given back) and writes the high-water marks. Later segment
    /// calls fail with `unavailable`.
    pub async fn shutdown(&self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        for segment in self.segments.iter().flatten() {
            report.skipped_ids += segment.close().await;
        }
        if let Err(e) = self.pool.record(true).await {
            tracing::warn!(error = %e, "could not write the high-water marks at shutdown");
        }
        report
    }
}

/// Takes failed servers back once a fresh session passes the checks.
async fn prober(pool: Weak<Pool>) {
    loop {
        let Some(strong) = pool.upgrade() else {
            return;
        };
        let interval = strong.config.failover.probe_interval();
        for server in &strong.servers {
            if server.health() != Health::Up {
                let _ = strong.probe(server).await;
            }
        }
        drop(strong);
        tokio::time::sleep(interval).await;
    }
}

/// Every how many writer rounds every mark is written again.
const REWRITE_EVERY: u64 = 20;

/// Writes the marks wanted ahead when a call asks and every interval, and
/// every mark again every [`REWRITE_EVERY`] intervals.
async fn recorder(pool: Weak<Pool>) {
    for round in 0u64.. {
        let Some(strong) = pool.upgrade() else {
            return;
        };
        let interval = strong.config.failover.high_water_interval();
        if let Err(e) = strong.record(round % REWRITE_EVERY == 0).await {
            tracing::debug!(error = %e, "high-water marks not written");
        }
        let wake = Arc::clone(&strong.record_now);
        drop(strong);
        let _ = tokio::time::timeout(interval, wake.notified()).await;
    }
}
