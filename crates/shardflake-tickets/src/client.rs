//! [`TicketClient`]: the async API the CLI and the service call. Per-id
//! sequences make one round trip per id, to the up server with the fewest
//! calls in flight (in turn when even: `failover::call_order`);
//! segment sequences are served from the double buffer of
//! [`crate::segment`].
//! Background tasks: a prober that takes failed servers back, a writer of
//! high-water marks, and the segment prefetches. They stop when the last
//! clone of the client is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::task::JoinHandle;

use crate::backend::Backend;
use crate::config::{Config, Kind, Mode, PgTickets};
use crate::error::{ServerFailure, TicketError};
use crate::failover::{Health, Server, ServerMetrics, alone, call_order};
use crate::high_water::BoxFuture;
use crate::high_water::{HighWaterStore, PeersStore};
use crate::segment::{Block, SegmentSequence, Take, adapt};
use crate::session::Session;

/// The limits on one call, kept at their old path.
pub use crate::config::{MAX_COUNT, MAX_PER_ID_COUNT};

pub(crate) struct Inner {
    pub config: Config,
    pub servers: Vec<Server>,
    pub store: Arc<dyn HighWaterStore>,
    /// Per sequence: its buffers in segment mode.
    pub segments: Vec<Option<SegmentSequence>>,
    next_server: AtomicUsize,
    /// Wakes the high-water writer (a block boundary).
    record_now: Arc<tokio::sync::Notify>,
}

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
    inner: Arc<Inner>,
    _tasks: Arc<Tasks>,
}

impl std::fmt::Debug for TicketClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |v: Vec<&str>| v.join(",");
        let config = &self.inner.config;
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
    /// Ids given back to their server (compare-and-set succeeded).
    pub returned_ids: u64,
    /// Ids reserved and never handed out nor returned.
    pub skipped_ids: u64,
}

impl TicketClient {
    /// Connects to every server with the high-water marks kept in the peers
    /// ([`PeersStore`]). Servers that cannot be used now are marked down or
    /// refused (and probed); an error only when none can be used.
    pub async fn connect(config: Config) -> Result<TicketClient, TicketError> {
        let store = Arc::new(PeersStore::new(config.clone()));
        TicketClient::connect_with_store(config, store).await
    }

    /// [`TicketClient::connect`] with another high-water store.
    pub async fn connect_with_store(
        config: Config,
        store: Arc<dyn HighWaterStore>,
    ) -> Result<TicketClient, TicketError> {
        if config.postgres_tickets == PgTickets::Sequence
            && config.servers.iter().any(|s| s.kind == Kind::Postgres)
            && config.sequences.iter().any(|q| q.mode == Mode::PerId)
        {
            tracing::warn!(
                "postgres_tickets = \"sequence\": a restore that sets a ticket sequence back in place (setval, a data-only dump) while clients run is not refused, and a client whose last answer was below it hands out ids again; the default \"table\" refuses it"
            );
        }
        let servers: Vec<Server> = (0..config.servers.len())
            .map(|i| Server::new(&config, i))
            .collect();
        let segments = config
            .sequences
            .iter()
            .map(|q| (q.mode == Mode::Segment).then(|| SegmentSequence::new(&config, q.start)))
            .collect();
        let inner = Arc::new(Inner {
            config,
            servers,
            store,
            segments,
            next_server: AtomicUsize::new(0),
            record_now: Arc::new(tokio::sync::Notify::new()),
        });
        let mut failures = Vec::new();
        for server in &inner.servers {
            match probe(&inner, server).await {
                Ok(()) => {}
                Err(e) => failures.push(ServerFailure {
                    server: server.config.name.clone(),
                    reason: e.to_string(),
                }),
            }
        }
        if failures.len() == inner.servers.len() {
            return Err(TicketError::Unavailable {
                sequence: "*".into(),
                failures,
            });
        }
        let weak = Arc::downgrade(&inner);
        let tasks = vec![
            tokio::spawn(prober(weak.clone())),
            tokio::spawn(recorder(weak)),
        ];
        Ok(TicketClient {
            inner,
            _tasks: Arc::new(Tasks(tasks)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// One id of `sequence`.
    pub async fn next(&self, sequence: &str) -> Result<u64, TicketError> {
        let (index, mode) = self.lookup(sequence)?;
        match mode {
            Mode::PerId => self.inner.ticket(index).await,
            Mode::Segment => Ok(self.inner.take(index, 1).await?[0]),
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
                    ids.push(self.inner.ticket(index).await?);
                }
                // Taken from the servers in turn, each counting on its own
                // residue: ["11","10","13","12"] unsorted (issue 30).
                ids.sort_unstable();
                Ok(ids)
            }
            Mode::Segment => self.inner.take(index, count).await,
        }
    }

    fn lookup(&self, sequence: &str) -> Result<(usize, Mode), TicketError> {
        self.inner
            .config
            .sequence(sequence)
            .map(|(i, q)| (i, q.mode))
            .ok_or_else(|| TicketError::UnknownSequence(sequence.to_string()))
    }

    /// Each server's state and counters.
    pub fn metrics(&self) -> Vec<ServerMetrics> {
        self.inner.servers.iter().map(Server::metrics).collect()
    }

    /// Writes every high-water mark this client holds now (they are also
    /// written ahead of every id, and again every `high_water_interval_ms`).
    pub async fn record_high_water(&self) -> Result<(), TicketError> {
        self.inner.record(true).await
    }

    /// Gives back the unused tails of the segment blocks (compare-and-set),
    /// writes the high-water marks, and stops fetching. Later segment calls
    /// fail with `unavailable`.
    pub async fn shutdown(&self) -> ShutdownReport {
        let mut report = ShutdownReport::default();
        for (index, segment) in self.inner.segments.iter().enumerate() {
            let Some(segment) = segment else { continue };
            // A fetch under way lands in `next` first, to be given back too.
            let deadline = Instant::now() + self.inner.config.failover.timeout();
            let (current, next) = loop {
                let fetched = segment.fetched.notified();
                {
                    let Ok(mut b) = segment.buffers.lock() else {
                        break (None, None);
                    };
                    b.closed = true;
                    if !b.fetching || Instant::now() >= deadline {
                        break (b.current.take(), b.next.take());
                    }
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = tokio::time::timeout(left, fetched).await;
            };
            // The later block first: if both came from one server, the
            // earlier one's compare-and-set then finds its own row again.
            for block in [next, current].into_iter().flatten() {
                let server = &self.inner.servers[block.server];
                let unused = block.size - block.taken;
                let lost = block.lost_on_give_back();
                let (expected, to) = (block.row, block.give_back_to());
                let timeout = self.inner.config.failover.attempt_timeout();
                let given_back = matches!(
                    tokio::time::timeout(
                        timeout,
                        server.run(
                            &self.inner.config,
                            &*self.inner.store,
                            alone(&self.inner.servers, server.index),
                            move |_, config, session| {
                                Box::pin(session.give_back(&config.sequences[index], expected, to))
                            },
                        )
                    )
                    .await,
                    Ok(Ok(true))
                );
                if given_back {
                    // The mark follows the row, under the same compare-and-set.
                    let name = &self.inner.config.sequences[index].name;
                    let (from, to) = (
                        server.lattice.counter_of_row(block.row),
                        server.lattice.counter_of_row(block.give_back_to()),
                    );
                    let lowered = tokio::time::timeout(
                        timeout,
                        self.inner
                            .store
                            .give_back(&server.config.name, name, from, to),
                    )
                    .await;
                    if matches!(lowered, Ok(Ok(()))) {
                        // Not written again at the end of the shutdown.
                        let _ = server.reserved[index].compare_exchange(
                            from,
                            to,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                    } else {
                        tracing::debug!(server = %server.config.name, "a mark was not given back: its ids are skipped");
                    }
                }
                let skipped = if given_back { lost } else { unused };
                report.returned_ids += unused - skipped;
                report.skipped_ids += skipped;
                server.skipped.fetch_add(skipped, Ordering::Relaxed);
            }
        }
        if let Err(e) = self.inner.record(true).await {
            tracing::warn!(error = %e, "could not write the high-water marks at shutdown");
        }
        report
    }
}

/// Connects a fresh, checked session to `server` and marks it up, or
/// marks why not.
async fn probe(inner: &Inner, server: &Server) -> Result<(), TicketError> {
    let timeout = inner.config.failover.attempt_timeout();
    let alone = alone(&inner.servers, server.index);
    let opened = tokio::time::timeout(
        timeout,
        server.open(&inner.config, &*inner.store, true, alone),
    )
    .await
    .unwrap_or_else(|_| {
        Err(TicketError::Timeout {
            server: server.config.name.clone(),
            context: "connect".into(),
            ms: timeout.as_millis() as u64,
        })
    });
    match opened {
        Ok(session) => {
            server.adopt(session).await;
            server.mark_up();
            Ok(())
        }
        Err(e) => {
            server.mark_failed(&e);
            Err(e)
        }
    }
}

/// Takes failed servers back once a fresh session passes the checks.
async fn prober(inner: Weak<Inner>) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let interval = strong.config.failover.probe_interval();
        for server in &strong.servers {
            if server.health() != Health::Up {
                let _ = probe(&strong, server).await;
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
async fn recorder(inner: Weak<Inner>) {
    for round in 0u64.. {
        let Some(strong) = inner.upgrade() else {
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

impl Inner {
    /// Writes the per-id marks wanted ahead, and with `all` every mark this
    /// client holds again (a place that missed a write catches up).
    async fn record(&self, all: bool) -> Result<(), TicketError> {
        let mut result = Ok(());
        for server in &self.servers {
            let marks: Vec<(String, u64)> = self
                .config
                .sequences
                .iter()
                .enumerate()
                .filter_map(|(i, q)| {
                    let wanted = server.wanted[i].load(Ordering::Relaxed);
                    let reserved = server.reserved[i].load(Ordering::Relaxed);
                    let mark = wanted.max(reserved);
                    (wanted > reserved || (all && mark > 0)).then(|| (q.name.clone(), mark))
                })
                .collect();
            if marks.is_empty() {
                continue;
            }
            match self.write_marks(server, &marks).await {
                Ok(()) => {}
                Err(e) => result = Err(e),
            }
        }
        result
    }

    /// Writes `marks` of `server`, asked again (every 20 ms) while no place
    /// took them, for up to half an attempt, and notes them written.
    async fn write_marks(
        &self,
        server: &Server,
        marks: &[(String, u64)],
    ) -> Result<(), TicketError> {
        let timeout = self.config.failover.attempt_timeout() / 2;
        let deadline = Instant::now() + timeout;
        let name = &server.config.name;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let written = tokio::time::timeout(left, self.store.record(name, marks))
                .await
                .unwrap_or_else(|_| {
                    Err(TicketError::Timeout {
                        server: name.clone(),
                        context: "write high-water marks".into(),
                        ms: timeout.as_millis() as u64,
                    })
                });
            match written {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        for (i, q) in self.config.sequences.iter().enumerate() {
            if let Some((_, mark)) = marks.iter().find(|(name, _)| *name == q.name) {
                server.reserved[i].fetch_max(*mark, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Before per-id `id` of `server` is handed out: a mark at or above it
    /// must be written. Marks are written `mark_ahead` ids ahead, in the
    /// background from half-way, so a call waits only when the writer fell
    /// behind.
    async fn cover(&self, server: usize, index: usize, id: u64) -> Result<(), TicketError> {
        let s = &self.servers[server];
        let seq = &self.config.sequences[index];
        let span = self
            .config
            .failover
            .mark_ahead
            .saturating_mul(self.config.increment);
        s.wanted[index].fetch_max(id.saturating_add(span).min(seq.max_id()), Ordering::Relaxed);
        let reserved = s.reserved[index].load(Ordering::Relaxed);
        if id <= reserved {
            if id.saturating_add(span / 2) > reserved {
                self.record_now.notify_one();
            }
            return Ok(());
        }
        let _one = s.mark_lock.lock().await;
        if id <= s.reserved[index].load(Ordering::Relaxed) {
            return Ok(());
        }
        let mark = s.wanted[index].load(Ordering::Relaxed);
        self.write_marks(s, &[(seq.name.clone(), mark)]).await
    }

    /// Runs `call` on the servers in [`call_order`] until one answers,
    /// within the call's timeout: that server's index and its answer.
    async fn failover<T>(
        &self,
        index: usize,
        call: impl for<'s> Fn(
            &'s Server,
            &'s Config,
            &'s mut Session,
        ) -> BoxFuture<'s, Result<T, TicketError>>,
    ) -> Result<(usize, T), TicketError> {
        let f = &self.config.failover;
        let deadline = Instant::now() + f.timeout();
        let first = self.next_server.fetch_add(1, Ordering::Relaxed);
        let mut failures = Vec::new();
        let mut exhausted = None;
        for server in &self.servers {
            if let Health::Refused(e) = server.health() {
                failures.push(ServerFailure {
                    server: server.config.name.clone(),
                    reason: format!("refused: {e}"),
                });
            }
        }
        for server in call_order(&self.servers, first) {
            let name = &server.config.name;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let budget = left.min(f.attempt_timeout());
            let result = tokio::time::timeout(
                budget,
                server.run(
                    &self.config,
                    &*self.store,
                    alone(&self.servers, server.index),
                    &call,
                ),
            )
            .await
            .unwrap_or_else(|_| {
                Err(TicketError::Timeout {
                    server: name.clone(),
                    context: "call".into(),
                    ms: budget.as_millis() as u64,
                })
            });
            match result {
                Ok(answer) => {
                    server.mark_up();
                    return Ok((server.index, answer));
                }
                Err(e @ TicketError::Exhausted { .. }) => {
                    failures.push(ServerFailure {
                        server: name.clone(),
                        reason: e.to_string(),
                    });
                    exhausted = Some(e);
                }
                Err(e) => {
                    server.failed(&e);
                    failures.push(ServerFailure {
                        server: name.clone(),
                        reason: e.to_string(),
                    });
                }
            }
        }
        Err(exhausted.unwrap_or_else(|| TicketError::Unavailable {
            sequence: self.config.sequences[index].name.clone(),
            failures,
        }))
    }

    /// One per-id ticket.
    async fn ticket(&self, index: usize) -> Result<u64, TicketError> {
        let (server, id) = self
            .failover(index, move |server, config, session| {
                Box::pin(server.ticket(config, session, index))
            })
            .await?;
        self.cover(server, index, id).await?;
        Ok(id)
    }

    /// `count` ids from the segment buffers of sequence `index`.
    async fn take(self: &Arc<Self>, index: usize, count: usize) -> Result<Vec<u64>, TicketError> {
        let seq = &self.config.sequences[index];
        let segment = self.segments[index]
            .as_ref()
            .ok_or_else(|| TicketError::UnknownSequence(seq.name.clone()))?;
        // Served from memory, a call completes without awaiting anything:
        // spend tokio's cooperative budget so that a caller in a loop still
        // lets the fetches, timers and other tasks on its worker run.
        tokio::task::consume_budget().await;
        let deadline = Instant::now() + self.config.failover.timeout();
        let mut ids = Vec::with_capacity(count);
        loop {
            let notified = segment.fetched.notified();
            {
                let mut b = segment
                    .buffers
                    .lock()
                    .map_err(|_| TicketError::db("*", "segment", "poisoned lock"))?;
                if b.closed {
                    return Err(TicketError::Unavailable {
                        sequence: seq.name.clone(),
                        failures: vec![],
                    });
                }
                loop {
                    if let Some(block) = b.current.as_mut() {
                        while ids.len() < count {
                            match block.take() {
                                Take::Id(id, _) => ids.push(id),
                                Take::Empty => break,
                                Take::Exhausted => {
                                    return Err(TicketError::Exhausted {
                                        sequence: seq.name.clone(),
                                        max: seq.max_id(),
                                    });
                                }
                            }
                        }
                        let prefetch = block.used_share() >= self.config.segment.prefetch_at;
                        if prefetch && b.next.is_none() && !b.fetching {
                            self.start_fetch(index, &mut b);
                        }
                    }
                    if ids.len() == count {
                        return Ok(ids);
                    }
                    // The current block is used up.
                    if let Some(next) = b.next.take() {
                        b.current = Some(next);
                        continue;
                    }
                    if let Some(e) = b.failure.take() {
                        return Err(e);
                    }
                    if !b.fetching {
                        self.start_fetch(index, &mut b);
                    }
                    break;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, notified).await.is_err() {
                return Err(TicketError::Unavailable {
                    sequence: seq.name.clone(),
                    failures: vec![],
                });
            }
        }
    }

    /// Starts a background reservation of the next block.
    fn start_fetch(self: &Arc<Self>, index: usize, b: &mut crate::segment::Buffers) {
        b.fetching = true;
        let now = Instant::now();
        b.chunks = adapt(&self.config, b.chunks, b.last_fetch.map(|t| now - t));
        b.last_fetch = Some(now);
        let (chunks, floor) = (b.chunks, b.floor);
        let inner = Arc::clone(self);
        tokio::spawn(async move {
            let seq = &inner.config.sequences[index];
            let mut result = inner
                .failover(index, move |server, config, session| {
                    let floor = server.lattice.row_above(floor);
                    let step = chunks * server.lattice.stride();
                    Box::pin(server.reserve(config, session, index, floor, step))
                })
                .await;
            // The block's mark is written before any of its ids is handed
            // out; a block whose mark no place took is never used (its ids
            // are skipped).
            if let Ok((server, row)) = &result {
                let s = &inner.servers[*server];
                let mark = s.lattice.counter_of_row(*row);
                if let Err(e) = inner.write_marks(s, &[(seq.name.clone(), mark)]).await {
                    s.skipped
                        .fetch_add((chunks * s.lattice.stride()) as u64, Ordering::Relaxed);
                    result = Err(e);
                }
            }
            let Some(segment) = inner.segments[index].as_ref() else {
                return;
            };
            if let Ok(mut b) = segment.buffers.lock() {
                b.fetching = false;
                match result {
                    Ok((server, row)) => {
                        let lattice = inner.servers[server].lattice;
                        let block = Block::new(
                            server,
                            row,
                            chunks,
                            lattice,
                            inner.config.sequences[index].max_id(),
                        );
                        b.floor = b.floor.max(block.end());
                        if b.current.is_none() {
                            b.current = Some(block);
                        } else {
                            b.next = Some(block);
                        }
                    }
                    Err(e) => b.failure = Some(e),
                }
            }
            segment.fetched.notify_waiters();
        });
    }
}
