//! The ticket servers as a client sees them. `Pool`: every server of
//! the file and the marks store; the failover loop each call runs
//! through (a per-id ticket, a block), and the marks
//! written ahead of the ids. `Server`: one server, with a few sessions,
//! a circuit breaker (up, down, refused), the high-water marks it is known
//! to have reached, its metrics, and the checks of every session and
//! answer.
//!
//! A server whose call errs or times out is marked down and skipped; the
//! client's prober ([`crate::client`]) reconnects it in the background
//! every `probe_interval_ms` and takes it back when the reconnect passes the
//! checks. Every new session is checked before its first use: increment and
//! offset (or the sequence's schema), each sequence's recorded lattice as
//! in the file, and the guard on every table it watches; and, the first
//! after a failure or a restart of the server, against the marks (a
//! segment row off the server's lattice is refused): each counter is
//! raised past the largest of the marks in the
//! [`HighWaterStore`], this client's own, and its answers; when no place
//! holding marks answers and the client has none, the server is refused
//! (`no_high_water`). Every answer is compared with the previous one from
//! the same server and sequence: one at or below means the server went back
//! (`went_back`): it is never handed out, and the server is refused until a
//! fresh session has been checked against the marks again.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::backend::Backend;
use crate::config::{Config, Mode, SequenceConfig, ServerConfig};
use crate::error::{ServerFailure, TicketError};
use crate::high_water::{BoxFuture, HighWaterStore, ResidueClass};
use crate::segment::{Block, Lattice};
use crate::session::Session;

/// A server's breaker state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Calls go to it.
    Up,
    /// Its last call or connect failed; probed until it answers.
    Down(String),
    /// It answers but must not be used: it went back, was recreated, has
    /// no place holding its marks answering, a lattice other than the
    /// file's, or is misconfigured (a table without its guard, a segment
    /// row off its lattice, ...). Probed until the reason is gone.
    Refused(TicketError),
}

impl Health {
    /// `up`, `down`, or the refusal's code (`went_back`, `recreated`,
    /// `no_high_water`, `lattice_changed`, `misconfigured`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Down(_) => "down",
            Health::Refused(e) => e.code(),
        }
    }
}

/// A server's metrics, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerMetrics {
    /// Its name.
    pub name: String,
    /// `mariadb` or `postgres`.
    pub kind: &'static str,
    /// `up`, `down`, or the code of the refusal ([`Health::as_str`]).
    pub state: &'static str,
    /// Why it is not up.
    pub reason: Option<String>,
    /// Calls that succeeded (ids in per-id mode, blocks in segment mode).
    pub calls: u64,
    /// Calls that failed on it (each moved to another server or failed).
    pub failovers: u64,
    /// Mean latency of its successful calls, in microseconds.
    pub latency_mean_us: f64,
    /// Largest latency of a successful call, in microseconds.
    pub latency_max_us: u64,
    /// Ids reserved from it and never handed out (segment mode).
    pub skipped_ids: u64,
}

/// An identity not known (see [`Server::tables`]).
const UNKNOWN: i64 = i64::MIN;

/// A server's state before its first connect.
const NOT_CONNECTED: &str = "not connected yet";

pub(crate) struct Server {
    pub config: ServerConfig,
    pub index: usize,
    pub lattice: Lattice,
    /// The class it answers for: whose marks it is raised past and writes.
    pub class: ResidueClass,
    slots: Vec<tokio::sync::Mutex<Option<Session>>>,
    next_slot: AtomicUsize,
    health: Mutex<Health>,
    /// The checks against the marks passed since its last failure.
    verified: AtomicBool,
    /// Refused as superseded (another identity took its class over) and
    /// not checked against a quorum of the places since: this client's
    /// own marks never vouch for it again (the class's new holder hands
    /// out ids above them).
    superseded: AtomicBool,
    /// The server's start time (unix seconds) at the last check.
    started: AtomicI64,
    /// The lattice version its last session was pinned to (0: none yet),
    /// and the one it recorded when a session was last refused: a server
    /// refusing the file's lattice at a lower version than another server
    /// takes it at went back.
    version: AtomicI64,
    refused_at: AtomicI64,
    /// The lattice version of its last session opened (0: none yet; a
    /// refused session leaves it): every mark write of its class carries
    /// it, and a place recording another version takes none
    /// (`backend::lattice_fence`), so a server gone back to before a
    /// reshape, or a client of the file of before it, writes no mark on
    /// a place that is past it, whatever the reshape changed.
    pinned: AtomicI64,
    /// The server's identity (as the database reports it) at the last
    /// check: the holder its marks are written as.
    identity: Mutex<Option<String>>,
    /// Per sequence: the largest answer it gave this client (per-id: an id;
    /// segment: a row). A later answer at or below means it went back.
    pub seen: Vec<AtomicI64>,
    /// Per sequence: the identity of its table or sequence on the server
    /// (`backend::Stamped`) when it was last checked against the marks
    /// ([`UNKNOWN`]: never, or the server cannot say). An answer from
    /// another is never handed out.
    tables: Vec<AtomicI64>,
    /// Per sequence: the mark this client knows is written; every id it
    /// hands out from this server is at or below it.
    pub reserved: Vec<AtomicU64>,
    /// Per sequence (per-id): the mark the client wants written next.
    pub wanted: Vec<AtomicU64>,
    /// One write-ahead of marks at a time (callers that find their id
    /// covered once they hold it go on).
    pub mark_lock: tokio::sync::Mutex<()>,
    /// Calls on it now (waiting for a session or running): the client
    /// sends the next call to the up server with the fewest.
    in_flight: AtomicUsize,
    calls: AtomicU64,
    failovers: AtomicU64,
    latency_ns: AtomicU64,
    latency_max_ns: AtomicU64,
    pub skipped: AtomicU64,
}

impl Server {
    pub fn new(config: &Config, index: usize) -> Server {
        let server = config.servers[index].clone();
        let per_sequence = || config.sequences.iter().map(|_| AtomicU64::new(0)).collect();
        Server {
            lattice: Lattice::new(config, &server),
            class: ResidueClass::of(config, &server),
            slots: (0..server.connections)
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            config: server,
            index,
            next_slot: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            health: Mutex::new(Health::Down(NOT_CONNECTED.into())),
            verified: AtomicBool::new(false),
            superseded: AtomicBool::new(false),
            started: AtomicI64::new(i64::MIN),
            version: AtomicI64::new(0),
            refused_at: AtomicI64::new(0),
            pinned: AtomicI64::new(0),
            identity: Mutex::new(None),
            seen: config
                .sequences
                .iter()
                .map(|_| AtomicI64::new(i64::MIN))
                .collect(),
            tables: config
                .sequences
                .iter()
                .map(|_| AtomicI64::new(UNKNOWN))
                .collect(),
            reserved: per_sequence(),
            wanted: per_sequence(),
            mark_lock: tokio::sync::Mutex::new(()),
            calls: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            latency_ns: AtomicU64::new(0),
            latency_max_ns: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    pub fn health(&self) -> Health {
        self.health.lock().map(|h| h.clone()).unwrap_or(Health::Up)
    }

    fn set_health(&self, health: Health) {
        if let Ok(mut h) = self.health.lock() {
            let first = *h == Health::Down(NOT_CONNECTED.into());
            if *h != health {
                match &health {
                    Health::Up if first => {
                        tracing::debug!(server = %self.config.name, "ticket server up")
                    }
                    Health::Up => {
                        tracing::info!(server = %self.config.name, "ticket server up again")
                    }
                    Health::Down(reason) => {
                        tracing::warn!(server = %self.config.name, %reason, "ticket server down")
                    }
                    Health::Refused(e) => {
                        tracing::error!(server = %self.config.name, error = %e, "ticket server refused")
                    }
                }
            }
            *h = health;
        }
    }

    pub fn mark_up(&self) {
        self.set_health(Health::Up);
    }

    /// Records a failed call or connect: refused for a typed refusal, down otherwise.
    pub fn failed(&self, error: &TicketError) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
        self.mark_failed(error);
    }

    pub fn mark_failed(&self, error: &TicketError) {
        self.verified.store(false, Ordering::Relaxed);
        if matches!(error, TicketError::Superseded(_)) {
            self.superseded.store(true, Ordering::Relaxed);
        }
        match error {
            TicketError::BehindHighWater { .. }
            | TicketError::Misconfigured { .. }
            | TicketError::WentBack { .. }
            | TicketError::Recreated { .. }
            | TicketError::NoHighWater { .. }
            | TicketError::Superseded(_)
            | TicketError::LatticeChanged { .. } => self.set_health(Health::Refused(error.clone())),
            other => self.set_health(Health::Down(other.to_string())),
        }
        self.drop_idle_sessions();
    }

    /// Closes the sessions not in use: after a failure they most likely
    /// lead to a dead or refused server, and each would fail once more
    /// after the server is taken back (sessions in use drop themselves
    /// when they fail).
    fn drop_idle_sessions(&self) {
        for slot in &self.slots {
            if let Ok(mut session) = slot.try_lock() {
                session.take();
            }
        }
    }

    /// The largest id this client saw from it for sequence `index`.
    fn seen_mark(&self, config: &Config, index: usize) -> u64 {
        let seen = self.seen[index].load(Ordering::Relaxed);
        match config.sequences[index].mode {
            _ if seen == i64::MIN => 0,
            Mode::PerId => seen.max(0) as u64,
            Mode::Segment => self.lattice.counter_of_row(seen),
        }
    }

    /// A new session, checked against the marks when `force`d, when the
    /// server failed since the last check, or when it restarted since
    /// (another start time: a client that saw no failure must not trust a
    /// server restarted, perhaps restored, meanwhile). `alone`: no other
    /// server is up, so this client's own marks may stand in for marks no
    /// place answered with.
    pub async fn open(
        &self,
        config: &Config,
        store: &dyn HighWaterStore,
        force: bool,
        alone: bool,
    ) -> Result<Session, TicketError> {
        let mut read = None;
        let connected = Session::connect(&self.config, config, &mut read).await;
        let (slot, other) = match &connected {
            Ok(_) => (&self.version, &self.refused_at),
            Err(_) => (&self.refused_at, &self.version),
        };
        slot.store(read.unwrap_or(0), Ordering::Relaxed);
        other.store(0, Ordering::Relaxed);
        let mut session = connected?;
        self.pinned.store(read.unwrap_or(0), Ordering::Relaxed);
        let who = session.identify().await?;
        let known = self.started.load(Ordering::Relaxed);
        // Start times are computed to the second: one apart is the same start.
        let restarted = known == i64::MIN || who.started.abs_diff(known) > 1;
        // Another server behind the same address (a copy, a standby).
        let moved = self.identity().as_deref() != Some(who.id.as_str());
        if force || restarted || moved || !self.verified.load(Ordering::Relaxed) {
            self.verify(&mut session, config, store, alone, &who.id)
                .await?;
            self.started.store(who.started, Ordering::Relaxed);
            if let Ok(mut identity) = self.identity.lock() {
                *identity = Some(who.id);
            }
            self.verified.store(true, Ordering::Relaxed);
        }
        Ok(session)
    }

    /// The server's identity at the last check.
    pub fn identity(&self) -> Option<String> {
        self.identity.lock().ok().and_then(|i| i.clone())
    }

    /// The sequences whose table or sequence on the server is not the one
    /// this client last checked against the marks (`now`: the identities
    /// read from the server), or whose identity is unknown either side (a
    /// client that cannot tell the table is the same cannot vouch for it).
    fn changed_tables(&self, config: &Config, now: &[i64]) -> Vec<String> {
        config
            .sequences
            .iter()
            .zip(now.iter().zip(&self.tables))
            .filter(|(_, (now, known))| {
                let known = known.load(Ordering::Acquire);
                known == UNKNOWN || **now == UNKNOWN || **now != known
            })
            .map(|(seq, _)| seq.name.clone())
            .collect()
    }

    /// Every counter at or above everything that could have been handed out
    /// from it: the marks in the store, this client's own, its answers. A
    /// counter below (restored, or ids reserved ahead and not yet used) is
    /// raised past them; the ids between are skipped, never handed out
    /// twice. No mark is written ahead here: a per-id mark is written by
    /// the first id of the sequence this client hands out (`Pool::cover`),
    /// so a client that never asks for a sequence leaves its counter where
    /// the marks are (each client's marks ahead raised it once more).
    ///
    /// First the server's identity takes its residue class over where
    /// another held it (every place that answers), then the class's marks
    /// are read: a mark written by the previous holder is either read
    /// here or refused (its writes are fenced by the holder record).
    async fn verify(
        &self,
        session: &mut Session,
        config: &Config,
        store: &dyn HighWaterStore,
        alone: bool,
        identity: &str,
    ) -> Result<(), TicketError> {
        let name = &self.config.name;
        // Read before the counters: a recreation after this read shows in
        // the next answer (recorded after it, an answer from a table restored
        // after the raise could pass).
        let mut tables = Vec::with_capacity(config.sequences.len());
        for seq in &config.sequences {
            tables.push(session.identity(seq).await?.unwrap_or(UNKNOWN));
        }
        let deadline = Instant::now() + config.failover.attempt_timeout() / 2;
        let loaded = match claim_class(store, &self.class, identity, deadline).await {
            Err(e) if e.is_refusal() => return Err(e),
            Err(e) => Err(e),
            // The marks moved away from the file's place: no other place,
            // and no memory, vouches for the server.
            Ok(()) => match load_marks(store, &self.class, deadline).await {
                Err(e) if e.is_refusal() => return Err(e),
                loaded => loaded,
            },
        };
        // Only the marks of every client vouch for a per-id row (MariaDB's
        // guard answers without its proof until then).
        let vouching = loaded.is_ok() || config.failover.allow_without_marks;
        let stored = match loaded {
            Ok(marks) => {
                self.superseded.store(false, Ordering::Relaxed);
                marks
            }
            Err(e) => {
                // Own marks cover only this client's ids: they stand in
                // only where no other server could serve instead (a peer
                // slow under load must not let another client's ids out
                // again), and only for the very tables this client checked
                // last (a table recreated since, by a restore, holds other
                // clients' ids that only the marks in the store cover), on
                // the very server (another identity behind the address, a
                // copy or a standby, holds ids of other clients too).
                let changed = self.changed_tables(config, &tables);
                let same_server = self.identity().as_deref() == Some(identity);
                let superseded = self.superseded.load(Ordering::Relaxed);
                let own = alone
                    && same_server
                    && !superseded
                    && changed.is_empty()
                    && (0..config.sequences.len()).any(|i| {
                        self.reserved[i].load(Ordering::Relaxed) > 0
                            || self.seen_mark(config, i) > 0
                    });
                if !own && !config.failover.allow_without_marks {
                    let reason = match e {
                        TicketError::NoHighWater { reason, .. } => reason,
                        other => other.to_string(),
                    };
                    let reason = match same_server {
                        true => reason,
                        false => format!(
                            "{reason}; it answers as {identity}, not as the server this client last checked: only the marks of every client vouch for it"
                        ),
                    };
                    let reason = match superseded {
                        false => reason,
                        true => format!(
                            "{reason}; another identity took its residue class over (superseded): only the marks of every client vouch for it"
                        ),
                    };
                    let reason = match changed.is_empty() {
                        true => reason,
                        false => format!(
                            "{reason}; the tables of {} are not the ones this client last checked (restored?): only the marks of every client vouch for them",
                            changed.join(", ")
                        ),
                    };
                    return Err(TicketError::NoHighWater {
                        server: name.clone(),
                        reason,
                    });
                }
                tracing::warn!(server = %name, error = %e, own_marks = own,
                    "too few places holding this server's marks answered; checking it against the marks in memory only");
                Default::default()
            }
        };
        let span = config.failover.mark_ahead.saturating_mul(config.increment);
        for (i, seq) in config.sequences.iter().enumerate() {
            let counter = session
                .counter(config, &self.config, seq)
                .await?
                .ok_or_else(|| {
                    TicketError::missing_record(name, &format!("the counter of {:?}", seq.name))
                })?;
            if seq.mode == Mode::Segment {
                // Raised past the marks, a row off the lattice would land
                // on it unseen: it is refused until `repair`.
                let row = self.lattice.row_of_counter(counter);
                self.lattice.check_row(name, &seq.name, row)?;
            }
            let stored = stored.get(&seq.name).copied().unwrap_or(0);
            let mark = stored
                .max(self.reserved[i].load(Ordering::Relaxed))
                .max(self.seen_mark(config, i));
            let mut after = counter;
            if counter < mark {
                session.raise(config, &self.config, seq, mark).await?;
                // A per-id counter is below the marks written ahead of it by
                // at most the span: beyond that (or any segment row below
                // its marks), it went back.
                if seq.mode == Mode::PerId && counter.saturating_add(span) >= mark {
                    tracing::debug!(server = %name, sequence = %seq.name, counter, mark,
                        "counter raised past the marks written ahead of it");
                } else {
                    tracing::warn!(server = %name, sequence = %seq.name, counter, mark,
                        "counter behind the high-water marks (restored from a backup?): raised past them");
                }
                after = mark;
            }
            if vouching {
                session.vouch(config, &self.config, seq, mark).await?;
            }
            // What the store holds, this client knows is written.
            self.reserved[i].fetch_max(stored, Ordering::Relaxed);
            match seq.mode {
                Mode::PerId => {
                    // Every later id is above the counter.
                    self.seen[i].fetch_max(after.min(i64::MAX as u64) as i64, Ordering::Relaxed);
                }
                Mode::Segment => {
                    let row = self.lattice.row_of_counter(after);
                    self.seen[i].fetch_max(row, Ordering::Relaxed);
                }
            }
        }
        // Every counter is past the marks now: answers from these tables
        // may be handed out.
        for (table, known) in tables.into_iter().zip(&self.tables) {
            known.store(table, Ordering::Release);
        }
        Ok(())
    }

    /// Runs `call` on one of its sessions (opening it if needed) and
    /// returns its typed answer. A session whose call failed is dropped
    /// (also when the caller's timeout cancels the call: the session is out
    /// of its slot while in use); a pooled one that failed (the server
    /// restarted under it?) is replaced by a fresh, checked one and the call
    /// runs once more.
    pub async fn run<T>(
        &self,
        config: &Config,
        store: &dyn HighWaterStore,
        alone: bool,
        call: impl for<'s> Fn(
            &'s Server,
            &'s Config,
            &'s mut Session,
        ) -> BoxFuture<'s, Result<T, TicketError>>,
    ) -> Result<T, TicketError> {
        let _in_flight = InFlight::enter(&self.in_flight);
        let n = self.slots.len();
        let first = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let mut guard = None;
        for k in 0..n {
            if let Ok(g) = self.slots[(first + k) % n].try_lock() {
                guard = Some(g);
                break;
            }
        }
        let mut guard = match guard {
            Some(g) => g,
            None => self.slots[first % n].lock().await,
        };
        let (mut session, pooled) = match guard.take() {
            Some(s) => (s, true),
            None => (self.open(config, store, false, alone).await?, false),
        };
        let started = Instant::now();
        let mut result = call(self, config, &mut session).await;
        let retry = match &result {
            Err(TicketError::Database { .. }) => pooled,
            Err(TicketError::Recreated { .. }) => true,
            _ => false,
        };
        if retry {
            tracing::debug!(server = %self.config.name, error = ?result.as_ref().err(),
                "once more on a fresh session, checked against the marks");
            session = self.open(config, store, true, alone).await?;
            result = call(self, config, &mut session).await;
        }
        match &result {
            Ok(_) => {
                let ns = started.elapsed().as_nanos() as u64;
                self.calls.fetch_add(1, Ordering::Relaxed);
                self.latency_ns.fetch_add(ns, Ordering::Relaxed);
                self.latency_max_ns.fetch_max(ns, Ordering::Relaxed);
                *guard = Some(session);
            }
            Err(TicketError::Exhausted { .. }) => *guard = Some(session),
            Err(_) => {}
        }
        result
    }

    /// One per-id ticket of sequence `index`, checked against the previous
    /// answer and the residue.
    pub async fn ticket(
        &self,
        config: &Config,
        session: &mut Session,
        index: usize,
    ) -> Result<u64, TicketError> {
        let seq = &config.sequences[index];
        // Any id answered before this call is sent was assigned before it:
        // a healthy server answers above it.
        let before = self.seen[index].load(Ordering::Relaxed);
        let known = self.tables[index].load(Ordering::Acquire);
        let stamped = session.next_ticket(index, seq).await?;
        self.check_table(seq, known, stamped.table)?;
        let id = stamped.value;
        let answer = id.min(i64::MAX as u64) as i64;
        self.seen[index].fetch_max(answer, Ordering::Relaxed);
        if answer <= before {
            return Err(self.went_back(seq, answer, before));
        }
        self.check_residue(config, id)?;
        if id > seq.max_id() {
            return Err(TicketError::Exhausted {
                sequence: seq.name.clone(),
                max: seq.max_id(),
            });
        }
        Ok(id)
    }

    /// Reserves a block of sequence `index` (`max_id = GREATEST(max_id,
    /// floor) + step`): the row after it, at or above every row this
    /// client saw from the server.
    pub async fn reserve(
        &self,
        config: &Config,
        session: &mut Session,
        index: usize,
        floor: i64,
        step: i64,
    ) -> Result<i64, TicketError> {
        let seq = &config.sequences[index];
        let seen = self.seen[index].load(Ordering::Relaxed);
        let known = self.tables[index].load(Ordering::Acquire);
        let stamped = session.reserve(seq, floor, step, seen).await?;
        self.check_table(seq, known, stamped.table)?;
        let (Ok(row) | Err(row)) = stamped.value;
        self.lattice.check_row(&self.config.name, &seq.name, row)?;
        match stamped.value {
            Ok(row) => {
                self.seen[index].fetch_max(row, Ordering::Relaxed);
                Ok(row)
            }
            Err(row) => Err(self.went_back(seq, row, seen)),
        }
    }

    /// An answer must come from the table or sequence that was checked
    /// against the marks: `known`, read before the call was sent (a check
    /// that completes meanwhile records its identity only after its raise).
    fn check_table(
        &self,
        seq: &SequenceConfig,
        known: i64,
        table: Option<i64>,
    ) -> Result<(), TicketError> {
        match table {
            Some(table) if known != UNKNOWN && table != known => {
                // `tables` keeps the old identity: every answer from the
                // new table is refused until a check records it.
                Err(TicketError::Recreated {
                    server: self.config.name.clone(),
                    sequence: seq.name.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    fn went_back(&self, seq: &SequenceConfig, answer: i64, seen: i64) -> TicketError {
        TicketError::WentBack {
            server: self.config.name.clone(),
            sequence: seq.name.clone(),
            answer,
            seen,
        }
    }

    /// A per-id ticket must be in this server's residue class: one that is
    /// not means the server hands out another server's ids.
    fn check_residue(&self, config: &Config, id: u64) -> Result<(), TicketError> {
        if id % config.increment != self.config.offset % config.increment {
            return Err(TicketError::misconfigured(
                &self.config.name,
                format!(
                    "it handed out {id}, which is not ≡ {} (mod {})",
                    self.config.offset, config.increment
                ),
            ));
        }
        Ok(())
    }

    /// Calls on this server now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Puts a probed session into an empty slot.
    pub async fn adopt(&self, session: Session) {
        let mut slot = self.slots[0].lock().await;
        if slot.is_none() {
            *slot = Some(session);
        }
    }

    pub fn metrics(&self) -> ServerMetrics {
        let health = self.health();
        let calls = self.calls.load(Ordering::Relaxed);
        let latency = self.latency_ns.load(Ordering::Relaxed);
        ServerMetrics {
            name: self.config.name.clone(),
            kind: self.config.kind.as_str(),
            state: health.as_str(),
            reason: match health {
                Health::Up => None,
                Health::Down(r) => Some(r),
                Health::Refused(e) => Some(e.to_string()),
            },
            calls,
            failovers: self.failovers.load(Ordering::Relaxed),
            latency_mean_us: if calls == 0 {
                0.0
            } else {
                latency as f64 / calls as f64 / 1000.0
            },
            latency_max_us: self.latency_max_ns.load(Ordering::Relaxed) / 1000,
            skipped_ids: self.skipped.load(Ordering::Relaxed),
        }
    }
}

/// The servers of one file and the place their marks live: every call of
/// a client runs through here (the failover loop, then [`Server::run`]),
/// so each check is written once for every client. Marks are written
/// ahead of the ids here too.
pub(crate) struct Pool {
    pub config: Config,
    pub servers: Vec<Server>,
    pub store: Arc<dyn HighWaterStore>,
    next_server: AtomicUsize,
    /// Wakes the high-water writer (a block boundary).
    pub record_now: Arc<Notify>,
}

impl Pool {
    pub fn new(config: Config, store: Arc<dyn HighWaterStore>) -> Pool {
        Pool {
            servers: (0..config.servers.len())
                .map(|i| Server::new(&config, i))
                .collect(),
            config,
            store,
            next_server: AtomicUsize::new(0),
            record_now: Arc::new(Notify::new()),
        }
    }

    /// Connects a fresh, checked session to `server` and marks it up, or
    /// marks why not.
    pub async fn probe(&self, server: &Server) -> Result<(), TicketError> {
        let timeout = self.config.failover.attempt_timeout();
        let alone = alone(&self.servers, server.index);
        let opened = tokio::time::timeout(
            timeout,
            server.open(&self.config, &*self.store, true, alone),
        )
        .await
        .unwrap_or_else(|_| {
            Err(TicketError::Timeout {
                server: server.config.name.clone(),
                context: "connect".into(),
                ms: timeout.as_millis() as u64,
                setting: "`[failover] attempt_timeout_ms`",
            })
        });
        match opened {
            Ok(session) => {
                server.adopt(session).await;
                server.mark_up();
                Ok(())
            }
            Err(e) => {
                let e = self.went_back(server, e);
                server.mark_failed(&e);
                Err(e)
            }
        }
    }

    /// `e` of `server`, said as it is: a lattice refusal of a server that
    /// records a lower lattice version than another server this client
    /// holds a session of on the file's lattice is that server gone back
    /// to before a reshape (its own dump loaded), not this client's file.
    fn went_back(&self, server: &Server, e: TicketError) -> TicketError {
        if !matches!(e, TicketError::LatticeChanged { .. }) {
            return e;
        }
        // The server that refused: this one at its session, or a peer
        // refusing this one's marks (its lattice fence).
        let refusing = match e.server() {
            Some(name) => self.servers.iter().find(|s| s.config.name == name),
            None => Some(server),
        };
        let Some(refusing) = refusing else { return e };
        let own = refusing.refused_at.load(Ordering::Relaxed);
        let current = self
            .servers
            .iter()
            .filter(|s| s.index != refusing.index)
            .map(|s| (s.version.load(Ordering::Relaxed), s.config.name.as_str()))
            .max();
        match current {
            Some((version, other)) if own > 0 && version > own => {
                TicketError::went_back_before_reshape(&refusing.config.name, own, other, version)
            }
            _ => e,
        }
    }

    /// Writes the per-id marks wanted ahead, and with `all` every mark this
    /// client holds again (a place that missed a write catches up).
    pub async fn record(&self, all: bool) -> Result<(), TicketError> {
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
        let identity = server.identity();
        let class = server.class.pinned(server.pinned.load(Ordering::Relaxed));
        // Why the places did not take them, as they said it: a retry cut
        // short by the deadline names no place.
        let mut last = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let record = self.store.record(&class, identity.as_deref(), marks);
            let written = match tokio::time::timeout(left, record).await {
                Ok(written) => written,
                Err(_) => Err(last.take().unwrap_or_else(|| TicketError::Timeout {
                    server: name.clone(),
                    context: "the places holding its marks, asked together".into(),
                    ms: timeout.as_millis() as u64,
                    setting: "half of `[failover] attempt_timeout_ms`",
                })),
            };
            match written {
                Ok(()) => break,
                Err(e) if e.is_refusal() => {
                    // Taken over, or its lattice reshaped away: no id above
                    // its written marks goes out, and no retry changes that.
                    server.mark_failed(&e);
                    return Err(e);
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await
                }
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
        self.write_ahead(s, &[(seq.name.clone(), mark)]).await
    }

    /// [`Pool::write_marks`] ahead of ids: a server whose marks the places
    /// did not take is refused (or down) until a checked session finds
    /// them answering again, so calls go elsewhere or fail at once rather
    /// than each taking an id or a block that is never handed out.
    async fn write_ahead(&self, s: &Server, marks: &[(String, u64)]) -> Result<(), TicketError> {
        let written = self.write_marks(s, marks).await;
        if let Err(e) = &written {
            s.mark_failed(e);
        }
        written
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
                    setting: match budget < f.attempt_timeout() {
                        true => "`[failover] timeout_ms`, what was left of it",
                        false => "`[failover] attempt_timeout_ms`",
                    },
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
                    let e = self.went_back(server, e);
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
    pub async fn ticket(&self, index: usize) -> Result<u64, TicketError> {
        let (server, id) = self
            .failover(index, move |server, config, session| {
                Box::pin(server.ticket(config, session, index))
            })
            .await?;
        self.cover(server, index, id).await?;
        Ok(id)
    }

    /// A block of `chunks` chunks of sequence `index`, every id above
    /// `floor`, its mark written.
    pub async fn reserve_block(
        &self,
        index: usize,
        chunks: i64,
        floor: u64,
    ) -> Result<Block, TicketError> {
        let seq = &self.config.sequences[index];
        let (server, row) = self
            .failover(index, move |server, config, session| {
                let floor = server.lattice.row_above(floor);
                let step = chunks * server.lattice.stride();
                Box::pin(server.reserve(config, session, index, floor, step))
            })
            .await?;
        // The block's mark is written before any of its ids is handed
        // out; a block whose mark no place took is never used (its ids
        // are skipped).
        let s = &self.servers[server];
        let block = Block::new(server, row, chunks, s.lattice, seq.max_id());
        let mark = s.lattice.counter_of_row(row);
        if let Err(e) = self.write_ahead(s, &[(seq.name.clone(), mark)]).await {
            s.skipped.fetch_add(block.size, Ordering::Relaxed);
            return Err(e);
        }
        Ok(block)
    }
}

/// The class taken over by `identity` where another held it, asked again
/// (every 20 ms) while no place that protects it answered, until
/// `deadline`; a refusal (superseded) is final.
async fn claim_class(
    store: &dyn HighWaterStore,
    class: &ResidueClass,
    identity: &str,
    deadline: Instant,
) -> Result<(), TicketError> {
    loop {
        match store.claim(class, identity, false).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_refusal() => return Err(e),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

/// A server's marks, asked again (every 20 ms) while no place that
/// protects it answered, until `deadline` (half the attempt): a peer slow
/// under load gets more than one `marks_timeout_ms`, a stalled one costs
/// a bounded share.
async fn load_marks(
    store: &dyn HighWaterStore,
    class: &ResidueClass,
    deadline: Instant,
) -> Result<std::collections::HashMap<String, u64>, TicketError> {
    loop {
        match store.load(class).await {
            Ok(marks) => return Ok(marks),
            Err(e) if e.is_refusal() || Instant::now() >= deadline => return Err(e),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

/// Whether no server but `index` is up.
pub(crate) fn alone(servers: &[Server], index: usize) -> bool {
    !servers
        .iter()
        .any(|s| s.index != index && s.health() == Health::Up)
}

/// The servers one call tries, starting from turn `first`: those up, the
/// one with the fewest calls in flight first (the turn breaks ties); then,
/// if none of them answered, those marked down (a breaker that is open on
/// every server must not fail calls without trying); never those refused.
///
/// Fewest in flight, not the turn alone: callers pinned to a server, as in
/// a bare loop, spread evenly, but blind turns pile calls up on one server
/// while another idles (MariaDB per-id, 8 callers: 0.81x the bare loop by
/// turns alone, 1.00x this way; docs/BENCHMARKS.md).
pub(crate) fn call_order(servers: &[Server], first: usize) -> Vec<&Server> {
    let n = servers.len();
    let (mut up, mut down) = (Vec::with_capacity(n), Vec::new());
    for server in (0..n).map(|k| &servers[(first + k) % n]) {
        match server.health() {
            Health::Up => up.push(server),
            Health::Down(_) => down.push(server),
            Health::Refused(_) => {}
        }
    }
    // Each count read once: other calls move them while this one sorts, and
    // a sort whose keys change under it may panic. Stable: ties keep the turn.
    up.sort_by_cached_key(|s| s.in_flight());
    up.extend(down);
    up
}

/// Counts a call in [`Server::run`] until it returns or is cancelled (the
/// caller's timeout drops the future).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> InFlight<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: usize) -> Vec<Server> {
        let mut toml = String::new();
        for i in 1..=n {
            toml += &format!(
                "[[servers]]\nname = \"s{i}\"\nkind = \"mariadb\"\nurl = \"mysql://root@127.0.0.1:1/app\"\noffset = {i}\n"
            );
        }
        toml += "[[sequences]]\nname = \"photos\"\n";
        let config = Config::parse(&toml).unwrap();
        (0..n).map(|i| Server::new(&config, i)).collect()
    }

    fn names(order: Vec<&Server>) -> Vec<&str> {
        order.iter().map(|s| s.config.name.as_str()).collect()
    }

    #[test]
    fn calls_go_in_turn_to_the_least_busy_up_server_then_to_those_down() {
        let s = servers(3);
        for server in &s {
            server.mark_up();
        }
        // Idle: the turn decides.
        assert_eq!(names(call_order(&s, 0)), ["s1", "s2", "s3"]);
        assert_eq!(names(call_order(&s, 4)), ["s2", "s3", "s1"]);
        // Two calls on s2, one on s3: s1 first whatever the turn.
        let _a = InFlight::enter(&s[1].in_flight);
        let _b = InFlight::enter(&s[1].in_flight);
        let c = InFlight::enter(&s[2].in_flight);
        assert_eq!(names(call_order(&s, 1)), ["s1", "s3", "s2"]);
        drop(c);
        assert_eq!(names(call_order(&s, 1)), ["s3", "s1", "s2"]);
        // Down goes last, refused never.
        s[0].mark_failed(&TicketError::Timeout {
            server: "s1".into(),
            context: "call".into(),
            ms: 1,
            setting: "`[failover] attempt_timeout_ms`",
        });
        s[2].mark_failed(&TicketError::misconfigured("s3", "offset"));
        assert_eq!(names(call_order(&s, 0)), ["s2", "s1"]);
        assert_eq!(s[1].in_flight(), 2);
    }
}
