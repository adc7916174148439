//! The issuing path: the node identity currently held, its generators, and
//! the two fences every id passes before it leaves the process.
//!
//! - **Lease fence**: `fence_until`, a monotonic deadline (last keep-alive's
//!   send time + TTL − safety margin). Checked before and after taking ids,
//!   so a process that was paused (SIGSTOP) past its deadline refuses on wake,
//!   before its background tasks have run.
//! - **High-water fence**: no id is stamped with a tick after the last
//!   durably recorded high-water time, so a successor that resumes after that
//!   record can never reissue a tick, even if this process crashes.
//!
//! Both are single atomic loads; the identity itself sits behind an
//! [`ArcSwapOption`] that the lease keeper replaces.
//!
//! Time: the lease fence reads tokio's monotonic clock
//! ([`tokio::time::Instant`], std's outside tests), the same clock the keeper
//! times renewals with, so a test that advances paused time sees the issuing
//! path refuse at once. Ids are stamped from the [`WallClock`] the issuer was
//! built with ([`SystemClock`] in the service), which the keeper also reads
//! for the high-water it records.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use shardflake::{
    Attempt, Batch, Clock, ExhaustedPolicy, Format, Generator, Id, Layout, ObjectIdGenerator,
    Parts, Stats, Step, SystemClock,
};
use tokio::time::Instant;

use shardflake_tickets::TicketClient;

use crate::config::Config;
use crate::counters::Metrics;
use crate::error::IssueError;

/// Batches above this many ids need a permit (see [`Issuer::large_batch_permit`]).
pub const LARGE_BATCH: u64 = 65_536;
/// Large batches built at once: each holds its ids and its answer (up to
/// ~30 bytes an id) in memory, so this bounds the memory batches take.
pub const LARGE_BATCHES_AT_ONCE: usize = 2;
/// How long a large batch waits for a permit before the answer is 503 `busy`.
pub const LARGE_BATCH_WAIT: Duration = Duration::from_secs(5);

/// The lease state, as `/readyz`, `/v1/info` and metrics report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LeaseState {
    /// Looking for a node id (at start or after losing one).
    Acquiring = 0,
    /// Holding a leased node id.
    Held = 1,
    /// A static node id (no coordination).
    Static = 2,
    /// Lost the lease; fenced until re-acquired.
    Lost = 3,
    /// Shutting down; nothing more is issued.
    Stopped = 4,
    /// Holding a node id, waiting for the clock to pass its recorded
    /// high-water (state file or registry) before issuing.
    WaitingForClock = 5,
}

impl LeaseState {
    /// The name shown to clients.
    pub fn name(self) -> &'static str {
        match self {
            LeaseState::Acquiring => "acquiring",
            LeaseState::Held => "held",
            LeaseState::Static => "static",
            LeaseState::Lost => "lost",
            LeaseState::Stopped => "stopped",
            LeaseState::WaitingForClock => "waiting_for_clock",
        }
    }
    /// Why nothing is issued in this state.
    fn refusal(self) -> IssueError {
        match self {
            LeaseState::WaitingForClock => IssueError::WaitingForClock,
            state => IssueError::NoLease(state.name()),
        }
    }
    fn from_u8(v: u8) -> Self {
        match v {
            1 => LeaseState::Held,
            2 => LeaseState::Static,
            3 => LeaseState::Lost,
            4 => LeaseState::Stopped,
            5 => LeaseState::WaitingForClock,
            _ => LeaseState::Acquiring,
        }
    }
}

/// One held node identity and its generators.
#[derive(Debug)]
pub struct Active {
    /// The node id.
    pub node_id: u64,
    /// Ids are stamped strictly after this Unix ms (the resumed high-water).
    pub resumed_after_ms: u64,
    /// Per shard value (one entry when the layout has no shard field).
    generators: Box<[OnceLock<Generator<WallClock>>]>,
    fence_until_ns: AtomicU64,
    durable_hw_ms: AtomicU64,
}

/// The issuing state shared by the HTTP and gRPC front ends.
#[derive(Debug)]
pub struct Issuer {
    current: ArcSwapOption<Active>,
    /// The validated configuration.
    pub config: Config,
    /// Counters.
    pub metrics: Metrics,
    base: Instant,
    clock: WallClock,
    state: AtomicU8,
    objectids: ObjectIdGenerator,
    retired: std::sync::Mutex<Stats>,
    large_batches: Arc<tokio::sync::Semaphore>,
    tickets: Option<TicketClient>,
}

impl Issuer {
    /// An issuer holding nothing yet, stamping ids from the system clock.
    pub fn new(config: Config) -> Self {
        Self::with_clock(config, Arc::new(SystemClock))
    }

    /// An issuer stamping ids from `clock` (tests give a manual one).
    pub fn with_clock(config: Config, clock: Arc<dyn Clock>) -> Self {
        let objectids = ObjectIdGenerator::new().on_rollback(config.rollback);
        Issuer {
            current: ArcSwapOption::empty(),
            config,
            metrics: Metrics::default(),
            base: Instant::now(),
            clock: WallClock(clock),
            state: AtomicU8::new(LeaseState::Acquiring as u8),
            objectids,
            retired: std::sync::Mutex::new(Stats::default()),
            large_batches: Arc::new(tokio::sync::Semaphore::new(LARGE_BATCHES_AT_ONCE)),
            tickets: None,
        }
    }

    /// This issuer, also handing out the ticket sequences of `client`
    /// (`--tickets`).
    pub fn with_tickets(mut self, client: TicketClient) -> Self {
        self.tickets = Some(client);
        self
    }

    /// The ticket servers' client, when the node serves tickets.
    pub fn tickets(&self) -> Option<&TicketClient> {
        self.tickets.as_ref()
    }

    /// `count` ids of the ticket sequence `sequence` (increasing in segment
    /// mode). Tickets need no node identity: they come from the ticket
    /// servers, whatever the lease's state.
    pub async fn next_tickets(&self, sequence: &str, count: u64) -> Result<Vec<u64>, IssueError> {
        let tickets = self.tickets.as_ref().ok_or(IssueError::NoTickets)?;
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        tickets
            .next_n(sequence, count)
            .await
            .map_err(IssueError::from)
    }

    /// For a batch of more than [`LARGE_BATCH`] ids, a permit to build it
    /// (hold it until the answer is made); waits up to `wait`, then 503
    /// `busy`. Smaller batches need none (`None`).
    pub async fn large_batch_permit(
        &self,
        count: u64,
        wait: Duration,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, IssueError> {
        if count <= LARGE_BATCH {
            return Ok(None);
        }
        match tokio::time::timeout(wait, self.large_batches.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(permit)),
            _ => Err(IssueError::Busy {
                at_once: LARGE_BATCHES_AT_ONCE,
                over: LARGE_BATCH,
            }),
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.config.layout
    }

    /// The wall clock ids are stamped from.
    pub fn clock(&self) -> &WallClock {
        &self.clock
    }

    /// Nanoseconds on this issuer's monotonic clock (tokio's).
    pub fn mono_ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// The lease state.
    pub fn lease_state(&self) -> LeaseState {
        LeaseState::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Sets the lease state.
    pub fn set_state(&self, s: LeaseState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    /// The identity held now.
    pub fn active(&self) -> Option<Arc<Active>> {
        self.current.load_full()
    }

    /// Builds an identity for `node_id`, issuing after `resume_after_ms`,
    /// fenced until `fence_until` and capped at `durable_hw_ms`.
    pub fn make_active(
        &self,
        node_id: u64,
        resume_after_ms: u64,
        fence_until: Option<Instant>,
        durable_hw_ms: u64,
    ) -> Result<Active, IssueError> {
        let slots = if self.config.shard_field.is_some() {
            self.config.shards as usize
        } else {
            1
        };
        let active = Active {
            node_id,
            resumed_after_ms: resume_after_ms,
            generators: (0..slots).map(|_| OnceLock::new()).collect(),
            fence_until_ns: AtomicU64::new(fence_until.map_or(u64::MAX, |t| self.mono_ns(t))),
            durable_hw_ms: AtomicU64::new(durable_hw_ms),
        };
        // Build shard 0 now so a bad node id fails here, not on a request.
        self.generator(&active, 0)?;
        Ok(active)
    }

    /// Publishes an identity (or withdraws it with `None`). The stats of a
    /// withdrawn identity's generators are kept for metrics.
    pub fn publish(&self, active: Option<Arc<Active>>) {
        let old = self.current.swap(active);
        if let Some(old) = old {
            let s = old.stats();
            if let Ok(mut r) = self.retired.lock() {
                r.exhaustions += s.exhaustions;
                r.clock_behind += s.clock_behind;
                r.rollback_errors += s.rollback_errors;
            }
        }
    }

    /// Generator stats, including withdrawn identities.
    pub fn stats(&self) -> Stats {
        let mut s = self.retired.lock().map(|r| *r).unwrap_or_default();
        if let Some(a) = self.active() {
            let c = a.stats();
            s.exhaustions += c.exhaustions;
            s.clock_behind += c.clock_behind;
            s.rollback_errors += c.rollback_errors;
        }
        s
    }

    fn generator<'a>(
        &self,
        active: &'a Active,
        shard: u64,
    ) -> Result<&'a Generator<WallClock>, IssueError> {
        let cell = active
            .generators
            .get(shard as usize)
            .ok_or_else(|| IssueError::InvalidKey(format!("shard {shard} out of range")))?;
        if let Some(g) = cell.get() {
            return Ok(g);
        }
        let c = &self.config;
        // Not `builder(..).clock(..)`: that would start the monotonic
        // clock's ticker thread (a wake-up every 100 µs) for nothing.
        let mut b = Generator::with_clock(c.layout.clone(), self.clock.clone())
            .node(c.node_field.clone(), active.node_id)
            .on_rollback(c.rollback)
            .max_batch(c.max_batch)
            .resume_after(active.resumed_after_ms);
        if !c.borrow.is_zero() {
            b = b.on_exhausted(ExhaustedPolicy::Borrow { max_lead: c.borrow });
        }
        for (name, value) in &c.fixed_fields {
            b = b.node(name.clone(), *value);
        }
        if let Some(f) = &c.shard_field {
            b = b.node(f.clone(), shard);
        }
        let g = b
            .build()
            .map_err(|e| IssueError::BadNodeId(e.to_string()))?;
        // Another request may have set it first: either generator is fine,
        // as long as one is kept (`get_or_init` cannot fail the build).
        Ok(cell.get_or_init(|| g))
    }

    /// `count` ids (1..=max_batch) from one reservation, for `shard`
    /// (0 without a shard field). The count must be checked by the caller.
    ///
    /// Waits for the clock (a full tick, a batch's ticks, a rollback the
    /// policy waits out) happen on tokio's timer, never on a worker thread,
    /// and stop when the caller drops the future (the claimed ids are then
    /// skipped, never reissued).
    async fn issue(&self, shard: u64, count: u64) -> Result<(Batch, u64), IssueError> {
        let active = self
            .current
            .load_full()
            .ok_or_else(|| self.lease_state().refusal())?;
        self.check_fence(&active)?;
        let generator = self.generator(&active, shard)?;
        let mut attempt = Attempt::new();
        let batch = match generator.try_next_ids(count, &mut attempt)? {
            Step::Ready(batch) => batch,
            Step::Wait(d) => {
                // Counted while in progress (a large batch waits for ticks).
                let _in_flight =
                    (count > 1).then(|| InFlight::enter(&self.metrics.batches_in_flight));
                let mut wait = d;
                loop {
                    pause(wait).await;
                    match generator.try_next_ids(count, &mut attempt)? {
                        Step::Ready(batch) => break batch,
                        Step::Wait(d) => wait = d,
                    }
                }
            }
        };
        // Pairs with the fence in `close`: an id taken after the deadline
        // moved is seen by the check below.
        std::sync::atomic::fence(Ordering::SeqCst);
        self.check_fence(&active)?;
        let tick = self.config.layout.time().extract(batch.last().get());
        if self.config.layout.tick_to_unix_ms(tick) > active.durable_hw_ms.load(Ordering::Acquire) {
            self.metrics
                .refused_high_water
                .fetch_add(1, Ordering::Relaxed);
            return Err(IssueError::HighWaterNotRecorded);
        }
        self.metrics.ids.fetch_add(count, Ordering::Relaxed);
        if count > 1 {
            self.metrics.batches.fetch_add(1, Ordering::Relaxed);
        }
        Ok((batch, active.node_id))
    }

    /// Whether ids can be issued now, or why not: an identity is held, its
    /// lease deadline has not passed, the recorded high-water is ahead of
    /// the clock (else every id would be refused as
    /// `high_water_not_recorded`), and the clock is not behind further than
    /// the rollback policy rides or waits out. Returns the node id.
    pub fn readiness(&self) -> Result<u64, IssueError> {
        let state = self.lease_state();
        let active = match self.active() {
            Some(a) if matches!(state, LeaseState::Held | LeaseState::Static) => a,
            _ => return Err(state.refusal()),
        };
        if active.fence_ns() != u64::MAX && self.mono_ns(Instant::now()) >= active.fence_ns() {
            return Err(IssueError::Fenced);
        }
        if active.durable_hw() <= self.clock.now_ms() {
            return Err(IssueError::HighWaterNotRecorded);
        }
        for g in active.generators.iter().filter_map(|g| g.get()) {
            g.check_clock()?;
        }
        Ok(active.node_id)
    }

    fn check_fence(&self, active: &Active) -> Result<(), IssueError> {
        let until = active.fence_until_ns.load(Ordering::SeqCst);
        if until != u64::MAX && self.mono_ns(Instant::now()) >= until {
            self.metrics.refused_fenced.fetch_add(1, Ordering::Relaxed);
            return Err(IssueError::Fenced);
        }
        Ok(())
    }

    /// The next id (for layouts with a shard field: of shard 0).
    pub async fn next_id(&self) -> Result<Id, IssueError> {
        Ok(self.issue(0, 1).await?.0.first())
    }

    /// `count` ids from one reservation: `1..=max_batch`, and a batch over
    /// [`LARGE_BATCH`] waits for one of [`LARGE_BATCHES_AT_ONCE`] permits
    /// (then [`IssueError::Busy`]). Hold the answer's permit until the
    /// batch is written out: it bounds the memory batches take.
    pub async fn next_ids(&self, count: u64) -> Result<IssuedBatch, IssueError> {
        let max = self.config.max_batch;
        if count == 0 || count > max {
            return Err(IssueError::InvalidCount {
                text: count.to_string(),
                max,
            });
        }
        let permit = self.large_batch_permit(count, LARGE_BATCH_WAIT).await?;
        let (batch, _) = self.issue(0, count).await?;
        Ok(IssuedBatch {
            batch,
            _permit: permit,
        })
    }

    /// An id for sharding key `key`: its shard is `key % shards`.
    pub async fn shard_id(&self, key: u64) -> Result<ShardId, IssueError> {
        if self.config.shard_field.is_none() {
            return Err(IssueError::NoShardField(self.layout().name().to_string()));
        }
        let shard = key % self.config.shards;
        let (batch, _) = self.issue(shard, 1).await?;
        Ok(ShardId {
            id: batch.first(),
            shard,
            key,
        })
    }

    /// Decodes `text` (decimal, or `format`) with the layout.
    pub fn decode(&self, text: &str, format: Option<Format>) -> Result<(Id, Parts), IssueError> {
        let id = format
            .unwrap_or(Format::Dec)
            .parse(text.trim())
            .map_err(|e| IssueError::MalformedId(format!("{text:?}: {e}")))?;
        let parts = id
            .decode(self.layout())
            .map_err(|e| IssueError::MalformedId(e.to_string()))?;
        Ok((id, parts))
    }

    /// The ids of the span `from..to` (`to` defaults to now), each time as
    /// RFC 3339, Unix ms, `now` or an offset from now (`-7d`): the span's
    /// Unix ms and its [`IdRange`](shardflake::IdRange). HTTP's `/v1/range`
    /// and gRPC's `Range`.
    pub fn range(
        &self,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(u64, u64, shardflake::IdRange), IssueError> {
        // Precise: the coarse clock may lag the ids just stamped by a few ms.
        let now = self.clock.now_ms_precise();
        let time = |name: &str, text: Option<&str>| {
            let text = text.ok_or_else(|| {
                IssueError::InvalidParameter(format!("parameter `{name}` is required"))
            })?;
            shardflake::timestamp::parse_time(text, now).ok_or_else(|| {
                IssueError::InvalidParameter(format!(
                    "{name} {text:?} is not a time: use RFC 3339, Unix ms, now, or -7d / +1h"
                ))
            })
        };
        let from = time("from", from)?;
        let to = time("to", Some(to.unwrap_or("now")))?;
        let range = self
            .layout()
            .id_range(from..to)
            .map_err(IssueError::TimeRange)?;
        Ok((from, to, range))
    }

    /// The layout and the node identity held now.
    pub fn info(&self) -> Info {
        let c = &self.config;
        let active = self.active();
        Info {
            layout: c.layout.name().to_string(),
            layout_spec: c.layout.to_string(),
            node_field: c.node_field.clone(),
            node_id: active.as_ref().map(|a| a.node_id),
            node_source: match c.node {
                crate::config::NodeSource::Static(_) => "static",
                crate::config::NodeSource::Etcd(_) => "etcd",
            },
            etcd_prefix: match &c.node {
                crate::config::NodeSource::Static(_) => None,
                crate::config::NodeSource::Etcd(e) => Some(e.prefix.clone()),
            },
            lease_state: self.lease_state().name(),
            fixed_fields: c.fixed_fields.iter().cloned().collect(),
            shard_field: c.shard_field.clone(),
            shards: c.shard_field.as_ref().map(|_| c.shards),
            max_batch: c.max_batch,
            ids_per_ms: c.layout.ids_per_tick() / c.layout.tick_ms().max(1),
            resumed_after_ms: active.as_ref().map(|a| a.resumed_after_ms),
            high_water_ms: active.as_ref().map(|a| a.durable_hw()),
            kinds: &KINDS,
            lifetime_left_s: u64::try_from(c.layout.lifetime_left_ms(self.clock.now_ms()) / 1000)
                .unwrap_or(u64::MAX),
            lifetime_ends: shardflake::timestamp::rfc3339_ms(
                u64::try_from(c.layout.lifetime_end_ms()).unwrap_or(u64::MAX),
            ),
        }
    }

    /// Another kind of id by name.
    pub async fn other_kind(&self, kind: &str) -> Result<(&'static str, String), IssueError> {
        use shardflake::Kind;
        let k: Kind = kind.parse().map_err(|_| {
            IssueError::UnknownKind(format!(
                "unknown kind {kind:?}; use layout, uuidv1, uuidv4, uuidv6, uuidv7, uuid-nil or objectid"
            ))
        })?;
        let text = match k {
            Kind::ObjectId => {
                let mut attempt = Attempt::new();
                loop {
                    match self.objectids.try_next_id(&mut attempt)? {
                        Step::Ready(id) => break id.to_string(),
                        Step::Wait(d) => pause(d).await,
                    }
                }
            }
            Kind::Layout => return Err(IssueError::UnknownKind("use /v1/id".into())),
            k if k.is_name_based() => {
                return Err(IssueError::UnknownKind(format!(
                    "{} is name-based; the service makes uuidv1, uuidv4, uuidv6, uuidv7, uuid-nil and objectid",
                    k.name()
                )));
            }
            k => shardflake::uuid::generate(k, None)
                .map_err(|e| IssueError::UnknownKind(e.to_string()))?
                .to_string(),
        };
        self.metrics.other_kinds.fetch_add(1, Ordering::Relaxed);
        Ok((k.name(), text))
    }
}

/// The wall clock of an issuer and its keeper: a shared [`Clock`].
#[derive(Clone)]
pub struct WallClock(Arc<dyn Clock>);

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WallClock({} ms)", self.0.now_ms())
    }
}

impl Clock for WallClock {
    #[inline]
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
    fn now_ms_precise(&self) -> u64 {
        self.0.now_ms_precise()
    }
}

/// The kinds of id the service makes.
const KINDS: [&str; 7] = [
    "layout", "uuidv1", "uuidv4", "uuidv6", "uuidv7", "uuid-nil", "objectid",
];

/// Batches above this many ids get their wire form (JSON text, a protobuf
/// list) built off the async workers: a million ids take milliseconds.
pub(crate) const BLOCKING_BATCH: u64 = 4096;

/// Runs `encode`, the wire form of a batch of `count` ids, on a blocking
/// thread when the batch is large, inline otherwise. Both transports use it,
/// so they agree on the threshold. An error is a panic inside `encode`.
pub(crate) async fn encode_batch<T: Send + 'static>(
    count: u64,
    encode: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if count > BLOCKING_BATCH {
        tokio::task::spawn_blocking(encode).await
    } else {
        Ok(encode())
    }
}

/// A batch and, for a large one, the permit that counts it until dropped.
#[derive(Debug)]
pub struct IssuedBatch {
    /// The ids.
    pub batch: Batch,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

/// An id for a sharding key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardId {
    /// The id.
    pub id: Id,
    /// Its shard (`key % shards`).
    pub shard: u64,
    /// The key asked for.
    pub key: u64,
}

/// The layout and node identity, as `/v1/info` and the gRPC `Info` call show them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Info {
    /// Layout name.
    pub layout: String,
    /// Layout spec string.
    pub layout_spec: String,
    /// The field holding the node id.
    pub node_field: String,
    /// The node id held, if any.
    pub node_id: Option<u64>,
    /// `static` or `etcd`.
    pub node_source: &'static str,
    /// The etcd key prefix of a leased (or registry-pinned) node id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_prefix: Option<String>,
    /// The lease state's name.
    pub lease_state: &'static str,
    /// Other node fields and their fixed values.
    pub fixed_fields: std::collections::BTreeMap<String, u64>,
    /// The shard field, if the layout has one.
    pub shard_field: Option<String>,
    /// Number of shards (with a shard field).
    pub shards: Option<u64>,
    /// Largest batch.
    pub max_batch: u64,
    /// The layout's cap per node.
    pub ids_per_ms: u64,
    /// Ids are stamped after this Unix ms.
    pub resumed_after_ms: Option<u64>,
    /// The last recorded high-water, Unix ms.
    pub high_water_ms: Option<u64>,
    /// The kinds of id made.
    pub kinds: &'static [&'static str],
    /// Seconds until the layout's ids stop fitting a signed `bigint`: its
    /// end of life, or the first negative id if earlier (0 once past).
    pub lifetime_left_s: u64,
    /// When that is, RFC 3339.
    pub lifetime_ends: String,
}

impl Active {
    /// Moves the lease deadline (monotonic ns of the issuer).
    pub fn set_fence(&self, until_ns: u64) {
        self.fence_until_ns.store(until_ns, Ordering::SeqCst);
    }
    /// The lease deadline.
    pub fn fence_ns(&self) -> u64 {
        self.fence_until_ns.load(Ordering::SeqCst)
    }
    /// Stops all issuing by this identity; returns once every id that got
    /// past the fence is visible to [`Active::high_water_ms`].
    pub fn close(&self) {
        self.fence_until_ns.store(0, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }
    /// Records that `unix_ms` is durably stored as the high-water.
    pub fn set_durable_hw(&self, unix_ms: u64) {
        self.durable_hw_ms.fetch_max(unix_ms, Ordering::AcqRel);
    }
    /// The last durable high-water.
    pub fn durable_hw(&self) -> u64 {
        self.durable_hw_ms.load(Ordering::Acquire)
    }
    /// End of the latest tick used by any generator (Unix ms), at least the
    /// resumed high-water.
    pub fn high_water_ms(&self) -> u64 {
        self.generators
            .iter()
            .filter_map(|g| g.get())
            .map(|g| g.high_water_ms())
            .fold(self.resumed_after_ms, u64::max)
    }
    /// Largest borrowed lead of any generator, ms.
    pub fn lead_ms(&self) -> u64 {
        self.generators
            .iter()
            .filter_map(|g| g.get())
            .map(|g| g.lead().as_millis() as u64)
            .max()
            .unwrap_or(0)
    }
    fn stats(&self) -> Stats {
        let mut s = Stats::default();
        for g in self.generators.iter().filter_map(|g| g.get()) {
            let c = g.stats();
            s.exhaustions += c.exhaustions;
            s.clock_behind += c.clock_behind;
            s.rollback_errors += c.rollback_errors;
        }
        s
    }
}

/// Waits `d` without holding a worker thread: on tokio's timer, or for a
/// wait under its millisecond resolution, by yielding to other tasks.
async fn pause(d: Duration) {
    if d <= Duration::from_millis(1) {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(d).await;
    }
}

/// Counts a call in progress for as long as it lives (dropped futures too).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicU64) -> Self {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The node field value of an id in `layout`.
pub fn node_of(layout: &Layout, field: &str, id: Id) -> Option<u64> {
    layout.field(field).map(|f| f.extract(id.get()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn large_batches_wait_for_a_permit_then_are_busy() {
        let config = Config::from_toml("").unwrap();
        let issuer = Issuer::new(config);
        let short = Duration::from_millis(20);
        assert!(
            issuer
                .large_batch_permit(LARGE_BATCH, short)
                .await
                .unwrap()
                .is_none()
        );
        let held: Vec<_> = (0..LARGE_BATCHES_AT_ONCE)
            .map(|_| issuer.large_batches.clone().try_acquire_owned().unwrap())
            .collect();
        // Caught: a missing bound (a third large batch built at once).
        let err = issuer
            .large_batch_permit(LARGE_BATCH + 1, short)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "busy");
        drop(held);
        assert!(
            issuer
                .large_batch_permit(LARGE_BATCH + 1, short)
                .await
                .unwrap()
                .is_some()
        );
    }
}
