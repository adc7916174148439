//! The node identity's life: acquire, keep, record the high-water, lose and
//! re-acquire, give back. The keeper runs beside the servers and publishes
//! the identity it holds into the [`Issuer`]; the coordination store is a
//! [`Registry`] (etcd, in-memory, or a static node id), so this logic runs
//! the same against all three and is tested in process on paused tokio time
//! (`lease/tests.rs`).
//!
//! **Static** ids just resume after the local state file and record
//! `now + window` there periodically (the [`StaticRegistry`] holding never
//! expires, so there is nothing to renew and no lease fence).
//!
//! **Leased** ids: the registry takes the lowest free node id and reads the
//! high-water of whoever held it before (see [`crate::registry`]). The node
//! issues nothing until its clock is past max(that, local state file), and
//! gives the id back if that is more than window + `max_resume_wait` ahead
//! (a bad clock here, or a corrupt record; an unreadable record is refused
//! too, never read as 0). It keeps the lease alive every
//! (TTL − margin)/4; each success moves the fence to the renewal's *send*
//! time + TTL − margin. It records `now + window` as the id's high-water
//! (only while it still holds the id); ids are never stamped past the last
//! successful record. A failed holder check, a renewal answered "gone", a
//! change to its records by another writer ([`Registry::changed`], watched
//! from a task of its own that stops issuing the moment it sees one), or a
//! passed deadline withdraws the identity (503) and starts over. The
//! recorded high-water is max(now, the generators' latest tick) + window.
//! A re-acquisition that finds a record or layout only an operator can fix
//! ([`AcquireError::is_fatal`]) stops the node: [`Keeper::run`] returns it.
//!
//! Time: renewals and deadlines run on tokio's clock (the issuer's fence
//! reads the same one); wall time comes from the issuer's `WallClock`.
//! Registry calls are never cancelled half-way (each is bounded by the
//! store's request timeout), so a lease taken is always known; shutdown
//! interrupts only the keeper's own waits, and a lease taken before it is
//! revoked (a SIGTERM during the first acquisition leaves nothing behind).
//!
//! On shutdown the keeper keeps renewing while in-flight requests drain
//! (they may still issue), then writes the exact final high-water and
//! revokes the lease. Failures there are logged, not fatal: the periodic
//! record already covers everything issued, and the lease expires anyway.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use shardflake::Clock;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::config::{NodeSource, ResumeAfter};
use crate::issuer::{Active, Issuer, LeaseState};
use crate::registry::STATIC;
use crate::state_file::{State, StateFile, StateLock};

/// How often a wait for the clock to pass a high-water says it still
/// waits (at its start too).
const WAIT_SAID_EVERY: Duration = Duration::from_secs(5);

pub use crate::registry::{
    AcquireError, Claim, Holding, PreviousFleet, RecordError, Registry, RegistryError, Renewal,
    StaticRegistry,
};

#[cfg(test)]
mod tests;

/// How long start keeps trying once the registry has answered at least once.
const CONTENDED_START: Duration = Duration::from_secs(60);

/// How long the first acquisition may take before start fails: five
/// request timeouts, at least 10 s (etcd may be starting too, or stalled
/// for seconds on a loaded host: 3 s was too short under the test suite).
fn start_deadline(timeout: Duration) -> Duration {
    // (see CONTENDED_START for a registry that answers)
    (timeout * 5).max(Duration::from_secs(10))
}

/// Why the keeper could not start, or stopped the node.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// Another process holds the state file, or it cannot be opened.
    #[error("locking the state file")]
    Lock(#[source] std::io::Error),
    /// The state file does not read.
    #[error("reading state file {}", path.display())]
    ReadState {
        /// The state file.
        path: PathBuf,
        /// The read or parse failure.
        #[source]
        source: std::io::Error,
    },
    /// A static node id given by the operator, with no state file and no
    /// `--resume-after`: it cannot know whether it issued ids before.
    #[error(
        "state file {} is missing (or empty): a static node id cannot know whether it issued ids before, nor which (a clock set back would repeat them). If this is its first start (it never issued an id), start it once with --resume-after now; else restore the file from a backup, or start it with --resume-after <a Unix ms or RFC 3339 time after every id it issued>",
        path.display()
    )]
    StateLost {
        /// The state file.
        path: PathBuf,
    },
    /// The state file records another path: a copy, or a hard link made
    /// before its node replaced it, of another node's state file.
    #[error(
        "state file {} was written for {written_for}: it is a copy or a link of another node's state file, and two nodes with one history issue the same ids. Give each node its own state file; {way_out}",
        path.display()
    )]
    StateCopied {
        /// The state file.
        path: PathBuf,
        /// The path its `path` line records.
        written_for: String,
        /// What to do where the file was moved on purpose.
        way_out: String,
    },
    /// A static node's state file without its `path` line (every write
    /// records it): a copy of another node's file with that line deleted
    /// would give two nodes one history.
    #[error(
        "state file {} records no line \"path ...\" (every write of a node records it): it may be another node's state file copied with that line deleted, and two nodes with one history issue the same ids. If it is this node's own (written by hand, or by an earlier version) and no other process runs as static node {node_id}: start this node once with --resume-after {high_water_ms} (its high_water_ms, or later); the file is then this node's, and its next write records its path",
        path.display()
    )]
    StateUnowned {
        /// The state file.
        path: PathBuf,
        /// This node's static id.
        node_id: u64,
        /// What the file records.
        high_water_ms: u64,
    },
    /// The state file was written by another node id or layout.
    #[error(
        "state file {} was written with {what} {recorded:?}, this node has {now:?}: ids of the two can collide or go below those issued. Give each node its own state file; to change the {what} deliberately, start from a new node id range or cluster (see docs/guide/operations-service.md)",
        path.display()
    )]
    StateMismatch {
        /// The state file.
        path: PathBuf,
        /// `node id` or `layout`.
        what: &'static str,
        /// What it records.
        recorded: String,
        /// What this node has.
        now: String,
    },
    /// A static node id could not resume after its state file.
    #[error("state file {}", path.display())]
    Resume {
        /// The state file.
        path: PathBuf,
        /// Why not: the record is too far ahead of the clock, or the
        /// state file failed.
        #[source]
        source: AcquireError,
    },
    /// No node id could be taken before start's deadline.
    #[error("no node id within {waited:?}")]
    NoNodeId {
        /// How long start tried.
        waited: Duration,
        /// The last failure.
        #[source]
        source: AcquireError,
    },
    /// Start found something only an operator can fix.
    #[error(transparent)]
    Acquire(AcquireError),
    /// The node lost its id and found, re-acquiring, something only an
    /// operator can fix.
    #[error("re-acquiring a node id")]
    Reacquire(#[source] AcquireError),
}

/// How an acquisition ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acquired {
    /// Holding and published.
    Held,
    /// Shutdown came first; any lease taken was released.
    ShutDown,
}

/// The lease timing of a leased node id.
#[derive(Debug, Clone, Copy)]
struct Terms {
    ttl: Duration,
    safety_margin: Duration,
    timeout: Duration,
}

/// Keeps the node identity: see the module docs.
#[derive(Debug)]
pub struct Keeper {
    issuer: Arc<Issuer>,
    registry: Arc<dyn Registry>,
    claim: Claim,
    terms: Option<Terms>,
    state_file: StateFile,
    /// The holding taken, kept from the registry's answer on until released.
    lease: Option<Holding>,
    state_lock: Arc<StateLock>,
    /// Lease generations taken so far, and the span of the current one.
    generation: u64,
    span: tracing::Span,
    /// The watch on the records of the leased id held.
    records: Option<RecordsWatch>,
}

/// A task waiting for [`Registry::changed`] on the holding published: it
/// closes the identity (no id issued from then on) and says why. Dropped,
/// it stops watching.
#[derive(Debug)]
struct RecordsWatch {
    task: tokio::task::AbortHandle,
    changed: oneshot::Receiver<String>,
}

impl Drop for RecordsWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Keeper {
    /// Acquires the first identity from `registry` and publishes it; fails
    /// with a clear error when the registry is unreachable or every node id
    /// is taken. Returns `None` when `shutdown` turned true first (a lease
    /// taken so far is revoked).
    pub async fn start(
        issuer: Arc<Issuer>,
        registry: Box<dyn Registry>,
        holder: String,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Option<Keeper>, KeeperError> {
        let state_lock = StateFile::new(issuer.config.state_file.clone())
            .lock()
            .map_err(KeeperError::Lock)?;
        Self::start_locked(issuer, registry, holder, state_lock, shutdown).await
    }

    /// [`Keeper::start`] with the state file's lock already taken (the
    /// server takes it before it announces its addresses).
    pub async fn start_locked(
        issuer: Arc<Issuer>,
        registry: Box<dyn Registry>,
        holder: String,
        state_lock: StateLock,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Option<Keeper>, KeeperError> {
        let state_file = StateFile::new(issuer.config.state_file.clone());
        let terms = match &issuer.config.node {
            NodeSource::Static(_) => None,
            NodeSource::Etcd(e) => Some(Terms {
                ttl: e.lease_ttl,
                safety_margin: e.safety_margin,
                timeout: e.timeout,
            }),
        };
        let claim = Claim {
            max_node_id: issuer.config.max_node_id(),
            ttl: terms.map_or(Duration::ZERO, |t| t.ttl),
            layout: Claim::layout_of(&issuer.config),
            earlier_layout: Claim::earlier_layout_of(&issuer.config),
            holder,
            now_ms: 0,
            window_ms: issuer.config.window.as_millis() as u64,
            max_ahead_ms: (issuer.config.window + issuer.config.max_resume_wait).as_millis() as u64,
            pinned: match &issuer.config.node {
                NodeSource::Etcd(e) => e.pinned_node_id,
                NodeSource::Static(_) => None,
            },
            expected_registry: None,
            previous: match &issuer.config.node {
                NodeSource::Etcd(e) => e.previous_prefix.clone().map(|prefix| PreviousFleet {
                    prefix,
                    layout: issuer.config.layout.clone(),
                }),
                NodeSource::Static(_) => None,
            },
        };
        let mut keeper = Keeper {
            issuer,
            registry: Arc::from(registry),
            claim,
            terms,
            state_file,
            lease: None,
            state_lock: Arc::new(state_lock),
            generation: 0,
            span: tracing::Span::none(),
            records: None,
        };
        let state =
            read_state(&keeper.state_file)
                .await
                .map_err(|source| KeeperError::ReadState {
                    path: keeper.state_file.path().to_path_buf(),
                    source,
                })?;
        let local = keeper.check_state(state)?;
        let Some(terms) = terms else {
            return match keeper.acquire(local, &mut shutdown).await {
                Ok(Acquired::Held) => Ok(Some(keeper)),
                Ok(Acquired::ShutDown) => Ok(None),
                Err(source) => Err(KeeperError::Resume {
                    path: keeper.state_file.path().to_path_buf(),
                    source,
                }),
            };
        };
        // Unreachable fails fast; once the registry has answered,
        // contention (many nodes starting at once) gets a longer wait.
        let started = Instant::now();
        let mut answered = false;
        loop {
            match keeper.acquire(local, &mut shutdown).await {
                Ok(Acquired::Held) => return Ok(Some(keeper)),
                Ok(Acquired::ShutDown) => return Ok(None),
                // Retrying cannot help: the operator must act.
                Err(e @ AcquireError::Full { .. }) => return Err(KeeperError::Acquire(e)),
                Err(e) if e.is_fatal() => return Err(KeeperError::Acquire(e)),
                Err(e) => {
                    answered |= !e.is_unreachable();
                    let waited = if answered {
                        CONTENDED_START
                    } else {
                        start_deadline(terms.timeout)
                    };
                    if started.elapsed() >= waited {
                        return Err(KeeperError::NoNodeId { waited, source: e });
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                        _ = turned_true(&mut shutdown) => return Ok(None),
                    }
                }
            }
        }
    }

    /// Keeps the identity (renewing, recording, re-acquiring when lost) until
    /// `drained` turns true. Once `shutdown` turns true it still renews and
    /// records (in-flight requests may issue) but takes no new identity.
    /// Returns an error when a re-acquisition finds what only an operator
    /// can fix (a corrupt high-water record, another layout): the node must
    /// stop rather than retry forever.
    pub async fn run(
        &mut self,
        mut shutdown: watch::Receiver<bool>,
        mut drained: watch::Receiver<bool>,
    ) -> Result<(), KeeperError> {
        let window = self.issuer.config.window;
        let hw_every = window / 3;
        let ka_every = self
            .terms
            .map_or(hw_every, |t| (t.ttl - t.safety_margin) / 4);
        let tick = hw_every.min(ka_every).min(Duration::from_millis(250));
        let mut next_hw = Instant::now() + hw_every;
        let mut next_ka = Instant::now() + ka_every;
        let mut backoff = Duration::from_millis(100);
        loop {
            if *drained.borrow() {
                return Ok(());
            }
            tokio::select! {
                _ = drained.changed() => return Ok(()),
                _ = tokio::time::sleep(tick) => {}
            }
            let Some(active) = self.issuer.active() else {
                if *shutdown.borrow() {
                    continue; // draining: no new identity
                }
                // Lost: look for a node id again. A state file that cannot
                // be read must not become 0: wait and retry.
                let local = match read_state(&self.state_file).await {
                    Ok(state) => state.map_or(0, |s| s.high_water_ms),
                    Err(e) => {
                        tracing::error!(
                            error = %e,
                            path = %self.state_file.path().display(),
                            "reading the state file"
                        );
                        continue;
                    }
                };
                match self.acquire(local, &mut shutdown).await {
                    Ok(Acquired::Held) => {
                        backoff = Duration::from_millis(100);
                        next_hw = Instant::now() + hw_every;
                        next_ka = Instant::now() + ka_every;
                    }
                    Ok(Acquired::ShutDown) => {}
                    Err(e) if e.is_fatal() => {
                        tracing::error!(error = %e, "re-acquiring a node id: stopping");
                        return Err(KeeperError::Reacquire(e));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "re-acquiring a node id");
                        tokio::select! {
                            _ = drained.changed() => return Ok(()),
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
                continue;
            };
            if let Some(why) = self
                .records
                .as_mut()
                .and_then(|r| r.changed.try_recv().ok())
            {
                self.lose(&active, &format!("its records in etcd changed: {why}"))
                    .await;
                continue;
            }
            let now = Instant::now();
            if self.leased() && now >= next_ka {
                next_ka = now + ka_every;
                if !self.keep_alive(&active).await {
                    self.lose(&active, "the lease is gone").await;
                    continue;
                }
            }
            if self.leased() && self.issuer.mono_ns(Instant::now()) >= active.fence_ns() {
                self.lose(&active, "keep-alives failed until the safety deadline")
                    .await;
                continue;
            }
            if now >= next_hw {
                next_hw = now + hw_every;
                let target = self.target_hw(active.high_water_ms(), active.durable_hw());
                match self.record_hw(target).await {
                    Ok(()) => active.set_durable_hw(target),
                    Err(AcquireError::LeaseLost) => {
                        self.lose(&active, "another holder owns the node id").await
                    }
                    Err(e) => {
                        self.issuer
                            .metrics
                            .high_water_failures
                            .fetch_add(1, Ordering::Relaxed);
                        self.span
                            .in_scope(|| tracing::warn!(error = %e, "recording the high-water"));
                    }
                }
            }
        }
    }

    /// Stops issuing, records the exact final high-water, revokes the lease
    /// (also one taken by an acquisition that shutdown interrupted).
    ///
    /// Failures are logged, not returned: every id issued is already below
    /// the last periodic record (the issuing fence guarantees it), and an
    /// unrevoked lease expires after its TTL.
    pub async fn stop(&mut self) {
        // Our own release deletes the node key: not a change to act on.
        self.records = None;
        self.issuer.set_state(LeaseState::Stopped);
        let active = self.issuer.active();
        self.issuer.publish(None);
        let last = active.map(|a| {
            a.close();
            a.high_water_ms()
        });
        if let Some(last) = last
            && let Err(e) = self.write_state(last).await
        {
            tracing::error!(
                error = %e,
                path = %self.state_file.path().display(),
                "final high-water to the state file"
            );
        }
        let Some(holding) = self.lease.take() else {
            return;
        };
        if let Some(last) = last
            && let Err(e) = self.registry.record_high_water(&holding, last).await
        {
            self.span.in_scope(|| {
                tracing::warn!(
                    error = %e,
                    "final high-water to the registry (the last periodic record, which is later, stands)"
                )
            });
        }
        if let Err(e) = self.registry.release(holding.lease).await {
            self.span.in_scope(|| {
                tracing::warn!(error = %e, "revoking the lease (the node id is free once its TTL ends)")
            });
        }
    }

    /// Compares the state file with this start (node id, layout, registry;
    /// see `state_file.rs`) and returns the high-water to resume after.
    /// A registry that can only be compared after a take (the etcd cluster
    /// id) goes into the claim.
    fn check_state(&mut self, state: Option<State>) -> Result<u64, KeeperError> {
        let path = self.state_file.path().to_path_buf();
        let config = &self.issuer.config;
        let floor = match config.resume_after {
            Some(ResumeAfter::Now) => self.issuer.clock().now_ms(),
            Some(ResumeAfter::UnixMs(ms)) => ms,
            None => 0,
        };
        let Some(state) = state else {
            match &config.node {
                // A node id the operator gave (or the host's): its history
                // is in this file alone. Only the default node 0 (no node
                // option at all: a trial) starts fresh unasked.
                NodeSource::Static(_)
                    if config.resume_after.is_none() && config.node_origin != "default" =>
                {
                    return Err(KeeperError::StateLost { path });
                }
                _ => tracing::info!(
                    path = %path.display(),
                    resume_after_ms = floor,
                    "no state file: this node's first start, or its file was lost"
                ),
            }
            return Ok(floor);
        };
        let layout = String::from_utf8_lossy(&self.claim.layout).into_owned();
        // An earlier version's line names no fixed fields: accepted (the
        // next write records them).
        let earlier = self
            .claim
            .earlier_layout
            .as_deref()
            .map(String::from_utf8_lossy);
        if let Some(recorded) = state
            .layout
            .filter(|l| *l != layout && Some(l.as_str()) != earlier.as_deref())
        {
            return Err(KeeperError::StateMismatch {
                path,
                what: "layout",
                recorded,
                now: layout,
            });
        }
        match (&config.node, state.registry) {
            (NodeSource::Static(id), registry) => {
                if let Some(recorded) = registry.filter(|r| r != STATIC) {
                    return Err(KeeperError::Acquire(AcquireError::RegistryChanged {
                        recorded,
                        now: format!("static node id {id}"),
                    }));
                }
                if let Some(recorded) = state.node_id.filter(|n| n != id) {
                    return Err(KeeperError::StateMismatch {
                        path,
                        what: "node id",
                        recorded: recorded.to_string(),
                        now: id.to_string(),
                    });
                }
            }
            // A static id moving to etcd: only as itself (its id reserved
            // there); the lowest free id could be another static node's.
            (NodeSource::Etcd(e), Some(r)) if r == STATIC => {
                let recorded = state
                    .node_id
                    .map_or("static".into(), |n| format!("static node id {n}"));
                match (e.pinned_node_id, state.node_id) {
                    (Some(now), Some(was)) if now == was => {}
                    (Some(_), None) => {}
                    _ => {
                        return Err(KeeperError::Acquire(AcquireError::RegistryChanged {
                            recorded,
                            now: format!(
                                "etcd prefix={}, {}",
                                e.prefix,
                                e.pinned_node_id
                                    .map_or("the lowest free node id".into(), |n| format!(
                                        "node id {n}"
                                    ))
                            ),
                        }));
                    }
                }
            }
            (NodeSource::Etcd(e), registry) => {
                if let (Some(given), Some(recorded)) = (&e.fleet, &state.fleet)
                    && given != recorded
                {
                    return Err(KeeperError::Acquire(AcquireError::FleetFlagDiffers {
                        given: given.clone(),
                        recorded: recorded.clone(),
                        path: path.display().to_string(),
                    }));
                }
                if registry.is_some()
                    && let Some(r) = state.etcd_revision
                {
                    self.registry.remember_revision(r);
                }
                if let Some(fleet) = state.fleet {
                    self.registry
                        .expect_fleet(fleet, state.generation.unwrap_or(0));
                }
                self.claim.expected_registry = registry;
            }
        }
        // Last: a file copied from another node is named for what differs
        // first (its node id, layout or registry). A static node's file
        // must name this path: nothing else keeps two static nodes from
        // sharing one history, and a line can be deleted. Only the
        // operator's --resume-after takes such a file as this node's.
        let own = state.path.as_deref() == Some(self.state_lock.canonical_path().as_str());
        match (&config.node, state.path) {
            _ if own => {}
            (NodeSource::Static(_), written_for) if config.resume_after.is_some() => {
                let resume = state.high_water_ms.max(floor);
                tracing::warn!(
                    path = %path.display(),
                    written_for = written_for.as_deref().unwrap_or("(no path line)"),
                    resume_after_ms = resume,
                    "the state file is taken as this node's on --resume-after; its next write records its path"
                );
                return Ok(resume);
            }
            (NodeSource::Static(id), None) => {
                return Err(KeeperError::StateUnowned {
                    path,
                    node_id: *id,
                    high_water_ms: state.high_water_ms,
                });
            }
            (NodeSource::Static(id), Some(written_for)) => {
                let way_out = format!(
                    "if you moved this file here and no process runs as static node {id} on {written_for}: start this node once with --resume-after {} (its high_water_ms, or later)",
                    state.high_water_ms
                );
                return Err(KeeperError::StateCopied {
                    path,
                    written_for,
                    way_out,
                });
            }
            // A leased node: etcd keeps the ids of two nodes apart; the
            // line catches a copy, and deleting it accepts a move.
            (NodeSource::Etcd(_), Some(written_for)) => {
                let way_out = "if you moved this file, delete its line \"path ...\"".into();
                return Err(KeeperError::StateCopied {
                    path,
                    written_for,
                    way_out,
                });
            }
            (NodeSource::Etcd(_), None) => {}
        }
        if config.resume_after.is_some() {
            tracing::info!(
                path = %self.state_file.path().display(),
                "--resume-after ignored: the state file records where to resume"
            );
        }
        Ok(state.high_water_ms)
    }

    /// Writes `ms` to the state file, with what this node is.
    async fn write_state(&self, ms: u64) -> std::io::Result<()> {
        let state = State {
            high_water_ms: ms,
            node_id: self.lease.map(|h| h.node_id),
            path: None,
            layout: Some(String::from_utf8_lossy(&self.claim.layout).into_owned()),
            registry: self.registry.identity(),
            etcd_revision: self.registry.revision(),
            fleet: self.registry.fleet(),
            generation: self.registry.generation(),
        };
        let lock = self.state_lock.clone();
        tokio::task::spawn_blocking(move || lock.write(&state))
            .await
            .map_err(std::io::Error::other)?
    }

    /// Whether the identity held is leased (renewed and fenced).
    fn leased(&self) -> bool {
        self.lease.is_some_and(|h| h.ttl.is_some())
    }

    /// max(now, `issued_ms`) + window, never below `floor`. `issued_ms` is
    /// the latest tick issued, which may be ahead of the clock (borrowed
    /// sequence, or a `continue` ride through a clock step).
    fn target_hw(&self, issued_ms: u64, floor: u64) -> u64 {
        let window = self.issuer.config.window.as_millis() as u64;
        self.issuer
            .clock()
            .now_ms()
            .max(issued_ms)
            .saturating_add(window)
            .max(floor)
    }

    /// Sleeps until the wall clock is past `unix_ms`, keeping any lease
    /// alive; a record more than window + `max_resume_wait` ahead is an
    /// error, at once, or once the wait has taken that much longer than it
    /// needed (a clock that stalled or stepped back). `Ok(false)`:
    /// shutdown came first.
    async fn wait_past(
        &self,
        unix_ms: u64,
        whose: String,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<bool, AcquireError> {
        let clock = self.issuer.clock();
        let limit = self.issuer.config.window + self.issuer.config.max_resume_wait;
        let too_far = |now: u64| AcquireError::HighWaterAhead {
            whose: whose.clone(),
            high_water_ms: unix_ms,
            ahead: Duration::from_millis(unix_ms.saturating_sub(now)),
            limit,
        };
        let now = clock.now_ms();
        if Duration::from_millis(unix_ms.saturating_sub(now)) > limit {
            return Err(too_far(now));
        }
        // The clock could stall or step back while we wait: bound it too.
        let deadline = Instant::now() + Duration::from_millis(unix_ms.saturating_sub(now)) + limit;
        // A wait is said, with its length and its reason, at its start and
        // every few seconds: a node silent for a minute looks hung.
        if unix_ms >= now {
            tracing::info!(
                resume_after_ms = unix_ms,
                wait_ms = unix_ms - now + 1,
                "waiting {} ms for this clock to pass the high-water {whose} before issuing: an id at or before it may have been issued already",
                unix_ms - now + 1
            );
        }
        let mut next_said = Instant::now() + WAIT_SAID_EVERY;
        loop {
            let now = clock.now_ms();
            if now > unix_ms {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Err(too_far(now));
            }
            if Instant::now() >= next_said {
                next_said += WAIT_SAID_EVERY;
                tracing::info!(
                    resume_after_ms = unix_ms,
                    wait_ms = unix_ms - now + 1,
                    "still waiting {} ms for this clock to pass the high-water {whose}",
                    unix_ms - now + 1
                );
            }
            let step = Duration::from_millis(unix_ms - now + 1).min(Duration::from_millis(500));
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                _ = turned_true(shutdown) => return Ok(false),
            }
            if self.leased()
                && let Some(holding) = self.lease
            {
                let _ = self.registry.renew(holding.lease).await;
            }
        }
    }

    /// Which record a resume waits for, for the error when it is too far
    /// and the log lines while it waits.
    fn whose(&self, local_hw: u64, holding: &Holding) -> String {
        if local_hw >= holding.previous_high_water_ms {
            format!("in the state file {}", self.state_file.path().display())
        } else {
            holding.resume_from.describe(holding.node_id)
        }
    }

    /// Revokes the lease taken by a failed or interrupted acquisition (best
    /// effort: it expires after its TTL anyway).
    async fn release(&mut self) {
        self.records = None;
        if let Some(holding) = self.lease.take()
            && let Err(e) = self.registry.release(holding.lease).await
        {
            tracing::warn!(error = %e, node_id = holding.node_id, "revoking a lease not used");
        }
    }

    /// Renews the lease and moves the fence; false when the lease is gone.
    async fn keep_alive(&self, active: &Active) -> bool {
        let (Some(holding), Some(terms)) = (self.lease, self.terms) else {
            return true;
        };
        let Some(granted) = holding.ttl else {
            return true;
        };
        let sent = Instant::now();
        match self.registry.renew(holding.lease).await {
            Ok(Renewal::Alive(ttl)) => {
                let ttl = ttl.min(granted);
                let until = self
                    .issuer
                    .mono_ns(sent + ttl.saturating_sub(terms.safety_margin));
                // Only ever later: an answer to an older send never shortens it.
                if until > active.fence_ns() {
                    active.set_fence(until);
                }
                self.issuer.metrics.renewals.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(Renewal::Gone) => false,
            Err(e) => {
                self.issuer
                    .metrics
                    .renewal_failures
                    .fetch_add(1, Ordering::Relaxed);
                self.span
                    .in_scope(|| tracing::warn!(error = %e, "lease keep-alive"));
                true
            }
        }
    }

    async fn lose(&mut self, active: &Arc<Active>, why: &str) {
        active.close();
        self.issuer.publish(None);
        self.issuer.set_state(LeaseState::Lost);
        self.issuer.metrics.losses.fetch_add(1, Ordering::Relaxed);
        self.span
            .in_scope(|| tracing::warn!(why, "node id withdrawn; re-acquiring"));
        // The local record must cover what this identity issued.
        let _ = self
            .write_state(active.high_water_ms().max(active.durable_hw()))
            .await;
        self.release().await;
    }

    /// Writes `target` to the state file, then to the registry while still
    /// holding; [`AcquireError::LeaseLost`] when another holder has the id.
    async fn record_hw(&self, target: u64) -> Result<(), AcquireError> {
        self.write_state(target)
            .await
            .map_err(AcquireError::StateFile)?;
        if let Some(holding) = &self.lease {
            match self.registry.record_high_water(holding, target).await {
                Ok(()) => {}
                Err(RecordError::NotHolder) => return Err(AcquireError::LeaseLost),
                Err(RecordError::Registry(e)) => return Err(e.into()),
            }
        }
        self.issuer
            .metrics
            .high_water_writes
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Takes the lowest free node id, waits out its high-water, publishes.
    async fn acquire(
        &mut self,
        local_hw: u64,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<Acquired, AcquireError> {
        if let Some(terms) = self.terms {
            self.issuer.set_state(LeaseState::Acquiring);
            // The fence runs from the grant's send time.
            let sent = Instant::now();
            self.claim.now_ms = self.issuer.clock().now_ms();
            let mut holding = self.registry.acquire(&self.claim).await?;
            self.lease = Some(holding);
            let ttl = holding.ttl.unwrap_or(terms.ttl).min(terms.ttl);
            let mut fence = sent + ttl.saturating_sub(terms.safety_margin);
            let resume = local_hw.max(holding.previous_high_water_ms);
            // Nothing to wait out (the usual start): the grant's fence is
            // fresh, and a renewal would only cost a round trip.
            let must_wait = self.issuer.clock().now_ms() <= resume;
            let whose = self.whose(local_hw, &holding);
            match self.wait_past(resume, whose, shutdown).await {
                Ok(true) if !must_wait => {
                    return self.publish(holding, resume, Some(fence)).await;
                }
                // The take's record is as old as the take: record afresh.
                Ok(true) if holding.recorded_high_water_ms.is_some() => {
                    holding.recorded_high_water_ms = None;
                }
                Ok(true) => {}
                Ok(false) => {
                    self.release().await;
                    return Ok(Acquired::ShutDown);
                }
                Err(e) => {
                    self.release().await;
                    return Err(e);
                }
            }
            // Renew once more so the fence starts fresh after the wait.
            let sent = Instant::now();
            match self.registry.renew(holding.lease).await {
                Ok(Renewal::Alive(t)) => {
                    fence = sent + t.min(ttl).saturating_sub(terms.safety_margin)
                }
                Ok(Renewal::Gone) => {
                    self.lease = None;
                    return Err(AcquireError::LeaseLost);
                }
                Err(_) => {}
            }
            self.publish(holding, resume, Some(fence)).await
        } else {
            let holding = self.registry.acquire(&self.claim).await?;
            self.lease = Some(holding);
            let resume = local_hw.max(holding.previous_high_water_ms);
            if self.issuer.clock().now_ms() <= resume {
                // A static node waiting out its own record: say so (503
                // `waiting_for_clock`, not `no_lease`).
                self.issuer.set_state(LeaseState::WaitingForClock);
            }
            let whose = self.whose(local_hw, &holding);
            if !self.wait_past(resume, whose, shutdown).await? {
                return Ok(Acquired::ShutDown);
            }
            self.publish(holding, resume, None).await
        }
    }

    /// Builds the identity, records its first high-water and publishes it
    /// (releasing the lease when any step fails).
    async fn publish(
        &mut self,
        holding: Holding,
        resume: u64,
        fence: Option<Instant>,
    ) -> Result<Acquired, AcquireError> {
        let node_id = holding.node_id;
        let active = match self.issuer.make_active(node_id, resume, fence, 0) {
            Ok(a) => a,
            Err(e) => {
                self.release().await;
                return Err(AcquireError::BadNodeId(e));
            }
        };
        // The take recorded a high-water already (past the previous
        // holder's, and `window` past the clock when it was sent): it is
        // durable once the local file has it too. Else (a static id, a take
        // older than the wait for the previous holder's record, or one so
        // slow that half the window is gone) one is recorded now.
        let half_window = self.claim.window_ms / 2;
        let fresh_until = self.issuer.clock().now_ms().saturating_add(half_window);
        let target = match holding.recorded_high_water_ms {
            Some(recorded) if recorded > resume && recorded > fresh_until => {
                let written = self
                    .write_state(recorded)
                    .await
                    .map_err(AcquireError::StateFile);
                self.issuer
                    .metrics
                    .high_water_writes
                    .fetch_add(1, Ordering::Relaxed);
                written.map(|()| recorded)
            }
            _ => {
                let target = self.target_hw(resume, resume);
                self.record_hw(target).await.map(|()| target)
            }
        };
        let target = match target {
            Ok(t) => t,
            Err(e) => {
                self.release().await;
                return Err(e);
            }
        };
        active.set_durable_hw(target);
        let active = Arc::new(active);
        self.issuer.publish(Some(active.clone()));
        self.issuer
            .metrics
            .acquisitions
            .fetch_add(1, Ordering::Relaxed);
        if fence.is_none() {
            self.issuer.set_state(LeaseState::Static);
            return Ok(Acquired::Held);
        }
        self.issuer.set_state(LeaseState::Held);
        // One span per lease generation: every later line about this
        // holding carries its node id and lease.
        self.generation += 1;
        self.span = tracing::info_span!(
            "lease",
            generation = self.generation,
            node_id,
            lease = format!("{:x}", holding.lease)
        );
        self.span
            .in_scope(|| tracing::info!(resumed_after_ms = resume, "holding the node id"));
        self.watch_records(holding, active);
        Ok(Acquired::Held)
    }

    /// Watches the records of the leased `holding` from a task of its own:
    /// the moment another writer changes them, it closes `active`, so that
    /// no id is issued from then on, not only from the keeper's next tick.
    fn watch_records(&mut self, holding: Holding, active: Arc<Active>) {
        let registry = self.registry.clone();
        let (tell, changed) = oneshot::channel();
        let span = self.span.clone();
        let task = tokio::spawn(async move {
            let why = registry.changed(&holding).await;
            span.in_scope(|| tracing::warn!(why, "the node id's records changed: issuing stopped"));
            // Told first, so that the keeper's next tick names the reason
            // rather than a passed deadline.
            let _ = tell.send(why);
            active.close();
        });
        self.records = Some(RecordsWatch {
            task: task.abort_handle(),
            changed,
        });
    }
}

/// Resolves once `rx` holds true; never when its sender is gone (nobody
/// can ask for shutdown any more).
async fn turned_true(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|v| *v).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn read_state(f: &StateFile) -> std::io::Result<Option<State>> {
    let f = f.clone();
    tokio::task::spawn_blocking(move || f.read())
        .await
        .map_err(std::io::Error::other)?
}
