//! The node identity's life: acquire, keep, record the high-water, lose and
//! re-acquire, give back.
//!
//! **Static** ids just resume after the local state file and record
//! `now + window` there periodically.
//!
//! **etcd**: under `<prefix>/node/<id>` (attached to a lease) the node takes
//! the lowest free id in one transaction (`create_revision == 0`), reading
//! `<prefix>/hw/<id>` (not leased: it outlives holders), the high-water of
//! whoever held the id before, in the same transaction. The same transaction
//! checks `<prefix>/layout` (layout and node field, written by the first node
//! of the cluster): nodes with different layouts under one prefix would
//! compose equal ids from different node ids, so a mismatch is refused. It
//! issues nothing until its clock is past max(that, local state file), and
//! gives the id back if that is more than window + `max_resume_wait` ahead
//! (a bad clock here, or a corrupt record; an unreadable record is refused
//! too, never read as 0). It keeps the lease
//! alive every (TTL − margin)/4; each success moves the fence to the
//! keep-alive's *send* time + TTL − margin. It writes `now + window` to
//! `hw/<id>` in a transaction that checks it still holds the key, the way
//! TiKV's PD persists a timestamp window in etcd; ids are never stamped past
//! the last successful write. A failed check, a keep-alive answered with
//! TTL 0, or a passed deadline withdraws the identity (503) and starts over.
//! The recorded high-water is max(now, the generators' latest tick) + window.
//!
//! On shutdown the keeper keeps renewing while in-flight requests drain
//! (they may still issue), then writes the exact final high-water and
//! revokes the lease. Failures there are logged, not fatal: the periodic
//! record already covers everything issued, and the lease expires anyway.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use shardflake::{Clock, SystemClock};
use tokio::sync::watch;

use crate::config::{EtcdConfig, NodeSource};
use crate::etcd::{Client, Compare, EtcdError, Op};
use crate::issuer::{Active, Issuer, LeaseState};
use crate::state_file::{StateFile, StateLock};

/// How long start keeps trying once etcd has answered at least once.
const CONTENDED_START: Duration = Duration::from_secs(60);

/// How long the first acquisition may take before start fails: five
/// request timeouts, at least 3 s (etcd may be starting too).
fn start_deadline(timeout: Duration) -> Duration {
    // (see CONTENDED_START for an etcd that answers)
    (timeout * 5).max(Duration::from_secs(3))
}

/// A held etcd lease and the node id under it.
#[derive(Debug, Clone)]
struct Lease {
    id: i64,
    node_id: u64,
    ttl: Duration,
}

/// Keeps the node identity: see the module docs.
#[derive(Debug)]
pub struct Keeper {
    issuer: Arc<Issuer>,
    state_file: StateFile,
    etcd: Option<(Client, EtcdConfig)>,
    lease: Option<Lease>,
    holder: String,
    _state_lock: StateLock,
    /// Lease generations taken so far, and the span of the current one.
    generation: u64,
    span: tracing::Span,
}

fn now_ms() -> u64 {
    SystemClock.now_ms()
}

impl Keeper {
    /// Acquires the first identity and publishes it; fails with a clear
    /// error when etcd is unreachable or every node id is taken.
    pub async fn start(issuer: Arc<Issuer>, holder: String) -> anyhow::Result<Keeper> {
        let state_file = StateFile::new(issuer.config.state_file.clone());
        let state_lock = state_file.lock().context("locking the state file")?;
        let local = read_state(&state_file).await?;
        let etcd = match &issuer.config.node {
            NodeSource::Static(_) => None,
            NodeSource::Etcd(e) => Some((
                Client::connect(&e.endpoints, e.timeout, e.tls.as_ref(), e.auth.as_ref())?,
                e.clone(),
            )),
        };
        let mut keeper = Keeper {
            issuer,
            state_file,
            etcd,
            lease: None,
            holder,
            _state_lock: state_lock,
            generation: 0,
            span: tracing::Span::none(),
        };
        match keeper.issuer.config.node.clone() {
            NodeSource::Static(id) => {
                keeper.wait_past(local).await.with_context(|| {
                    format!("state file {}", keeper.state_file.path().display())
                })?;
                let hw = keeper.target_hw(local, local);
                write_state(&keeper.state_file, hw)
                    .await
                    .context("writing the state file")?;
                let active = keeper
                    .issuer
                    .make_active(id, local, None, hw)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                keeper.issuer.publish(Some(Arc::new(active)));
                keeper.issuer.set_state(LeaseState::Static);
                keeper
                    .issuer
                    .metrics
                    .acquisitions
                    .fetch_add(1, Ordering::Relaxed);
            }
            NodeSource::Etcd(e) => {
                // Unreachable fails fast; once etcd has answered, contention
                // (many nodes starting at once) gets a longer wait.
                let started = Instant::now();
                let mut answered = false;
                loop {
                    match keeper.acquire(local).await {
                        Ok(()) => break,
                        // Retrying cannot help: wrong TLS files or credentials.
                        Err(AcquireError::Etcd(err)) if err.needs_operator() => {
                            return Err(anyhow::Error::new(err).context("no node id"));
                        }
                        Err(AcquireError::Etcd(err)) => {
                            answered |= !matches!(err, EtcdError::Unreachable { .. });
                            let wait = if answered {
                                CONTENDED_START
                            } else {
                                start_deadline(e.timeout)
                            };
                            if started.elapsed() >= wait {
                                return Err(anyhow::Error::new(err)
                                    .context(format!("no node id within {wait:?}")));
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        // Retrying cannot help: the operator must act.
                        Err(fatal) => return Err(fatal.into()),
                    }
                }
            }
        }
        Ok(keeper)
    }

    /// Keeps the identity (renewing, recording, re-acquiring when lost) until
    /// `drained` turns true. Once `shutdown` turns true it still renews and
    /// records (in-flight requests may issue) but takes no new identity.
    pub async fn run(
        &mut self,
        mut shutdown: watch::Receiver<bool>,
        mut drained: watch::Receiver<bool>,
    ) {
        let window = self.issuer.config.window;
        let hw_every = window / 3;
        let ka_every = self
            .etcd
            .as_ref()
            .map_or(hw_every, |(_, e)| (e.lease_ttl - e.safety_margin) / 4);
        let tick = hw_every.min(ka_every).min(Duration::from_millis(250));
        let mut next_hw = Instant::now() + hw_every;
        let mut next_ka = Instant::now() + ka_every;
        let mut backoff = Duration::from_millis(100);
        loop {
            if *drained.borrow() {
                return;
            }
            tokio::select! {
                _ = drained.changed() => return,
                _ = tokio::time::sleep(tick) => {}
            }
            let Some(active) = self.issuer.active() else {
                if *shutdown.borrow() {
                    continue; // draining: no new identity
                }
                // Lost: look for a node id again. A state file that cannot
                // be read must not become 0: wait and retry.
                let local = match read_state(&self.state_file).await {
                    Ok(ms) => ms,
                    Err(e) => {
                        tracing::error!(error = format!("{e:#}"), "reading the state file");
                        continue;
                    }
                };
                // Cancelled by shutdown: `stop` revokes a lease taken so far.
                let acquired = tokio::select! {
                    r = self.acquire(local) => r,
                    _ = shutdown.wait_for(|v| *v) => continue,
                };
                match acquired {
                    Ok(()) => {
                        backoff = Duration::from_millis(100);
                        next_hw = Instant::now() + hw_every;
                        next_ka = Instant::now() + ka_every;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "re-acquiring a node id");
                        tokio::select! {
                            _ = drained.changed() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
                continue;
            };
            let now = Instant::now();
            if self.lease.is_some() && now >= next_ka {
                next_ka = now + ka_every;
                if !self.keep_alive(&active).await {
                    self.lose(&active, "the lease is gone").await;
                    continue;
                }
            }
            if self.lease.is_some() && self.issuer.mono_ns(Instant::now()) >= active.fence_ns() {
                self.lose(&active, "keep-alives failed until the safety deadline")
                    .await;
                continue;
            }
            if now >= next_hw {
                next_hw = now + hw_every;
                let target = self.target_hw(active.high_water_ms(), active.durable_hw());
                match self.record_hw(&active, target).await {
                    Ok(()) => active.set_durable_hw(target),
                    Err(HwError::NotHolder) => {
                        self.lose(&active, "another holder owns the node id").await
                    }
                    Err(HwError::Io(e)) => {
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
    /// (also one taken by an acquisition that shutdown cancelled).
    ///
    /// Failures are logged, not returned: every id issued is already below
    /// the last periodic record (the issuing fence guarantees it), and an
    /// unrevoked lease expires after its TTL.
    pub async fn stop(&mut self) {
        self.issuer.set_state(LeaseState::Stopped);
        let active = self.issuer.active();
        self.issuer.publish(None);
        let last = active.map(|a| {
            a.close();
            a.high_water_ms()
        });
        if let Some(last) = last
            && let Err(e) = write_state(&self.state_file, last).await
        {
            tracing::error!(
                error = format!("{e:#}"),
                "final high-water to the state file"
            );
        }
        let (Some((client, cfg)), Some(lease)) = (&self.etcd, self.lease.take()) else {
            return;
        };
        if let Some(last) = last {
            let (node, hw) = keys(cfg, lease.node_id);
            let put = client
                .txn(
                    &[Compare::LeaseIs(node, lease.id)],
                    &[Op::Put(hw, last.to_string().into_bytes(), 0)],
                    &[],
                )
                .await;
            if let Err(e) = put {
                self.span.in_scope(|| {
                    tracing::warn!(
                        error = %e,
                        "final high-water to etcd (the last periodic record, which is later, stands)"
                    )
                });
            }
        }
        if let Err(e) = client.revoke(lease.id).await {
            self.span.in_scope(|| {
                tracing::warn!(error = %e, "revoking the lease (the node id is free once its TTL ends)")
            });
        }
    }

    /// max(now, `issued_ms`) + window, never below `floor`. `issued_ms` is
    /// the latest tick issued, which may be ahead of the clock (borrowed
    /// sequence, or a `continue` ride through a clock step).
    fn target_hw(&self, issued_ms: u64, floor: u64) -> u64 {
        let window = self.issuer.config.window.as_millis() as u64;
        now_ms().max(issued_ms).saturating_add(window).max(floor)
    }

    /// Sleeps until the wall clock is past `unix_ms`, keeping any lease
    /// alive; a record more than window + `max_resume_wait` ahead is an
    /// error, at once or when that much time has passed.
    async fn wait_past(&self, unix_ms: u64) -> Result<(), AcquireError> {
        let limit = self.issuer.config.window + self.issuer.config.max_resume_wait;
        let too_far = |now: u64| AcquireError::HighWaterAhead {
            high_water_ms: unix_ms,
            ahead: Duration::from_millis(unix_ms.saturating_sub(now)),
            limit,
        };
        let now = now_ms();
        if Duration::from_millis(unix_ms.saturating_sub(now)) > limit {
            return Err(too_far(now));
        }
        // The clock could stall or step back while we wait: bound it too.
        let deadline = Instant::now() + limit;
        loop {
            let now = now_ms();
            if now > unix_ms {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(too_far(now));
            }
            let step = Duration::from_millis(unix_ms - now + 1).min(Duration::from_millis(500));
            tokio::time::sleep(step).await;
            if let (Some((client, _)), Some(lease)) = (&self.etcd, &self.lease) {
                let _ = client.keep_alive(lease.id).await;
            }
        }
    }

    /// Revokes the lease taken by a failed acquisition (best effort: it
    /// expires after its TTL anyway).
    async fn release(&mut self) {
        if let (Some((client, _)), Some(lease)) = (&self.etcd, self.lease.take()) {
            let _ = client.revoke(lease.id).await;
        }
    }

    async fn keep_alive(&self, active: &Active) -> bool {
        let (Some((client, cfg)), Some(lease)) = (&self.etcd, &self.lease) else {
            return true;
        };
        let sent = Instant::now();
        match client.keep_alive(lease.id).await {
            Ok(ttl) if ttl > 0 => {
                let ttl = Duration::from_secs(ttl).min(lease.ttl);
                let until = self.issuer.mono_ns(sent + ttl - cfg.safety_margin);
                // Only ever later: an answer to an older send never shortens it.
                if until > active.fence_ns() {
                    active.set_fence(until);
                }
                self.issuer.metrics.renewals.fetch_add(1, Ordering::Relaxed);
                true
            }
            Ok(_) => false,
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
        let _ = write_state(
            &self.state_file,
            active.high_water_ms().max(active.durable_hw()),
        )
        .await;
        if let (Some((client, _)), Some(lease)) = (&self.etcd, self.lease.take()) {
            let _ = client.revoke(lease.id).await;
        }
    }

    async fn record_hw(&self, active: &Active, target: u64) -> Result<(), HwError> {
        write_state(&self.state_file, target)
            .await
            .map_err(|e| HwError::Io(format!("state file: {e}")))?;
        if let (Some((client, cfg)), Some(lease)) = (&self.etcd, &self.lease) {
            let (node, hw) = keys(cfg, active.node_id);
            let (ok, _) = client
                .txn(
                    &[Compare::LeaseIs(node, lease.id)],
                    &[Op::Put(hw, target.to_string().into_bytes(), 0)],
                    &[],
                )
                .await
                .map_err(|e| HwError::Io(e.to_string()))?;
            if !ok {
                return Err(HwError::NotHolder);
            }
        }
        self.issuer
            .metrics
            .high_water_writes
            .fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Takes the lowest free node id, waits out its high-water, publishes.
    async fn acquire(&mut self, local_hw: u64) -> Result<(), AcquireError> {
        let Some((client, cfg)) = &self.etcd else {
            return Err(AcquireError::Etcd(EtcdError::Protocol("no etcd".into())));
        };
        self.issuer.set_state(LeaseState::Acquiring);
        let sent = Instant::now();
        let (lease_id, ttl) = client.grant(cfg.lease_ttl.as_secs()).await?;
        let ttl = Duration::from_secs(ttl).min(cfg.lease_ttl);
        let taken = match take_lowest(
            client,
            cfg,
            lease_id,
            self.issuer.config.max_node_id(),
            &self.holder,
            &cluster_layout(&self.issuer.config),
        )
        .await
        {
            Ok(t) => t,
            Err(e) => {
                let _ = client.revoke(lease_id).await;
                return Err(e);
            }
        };
        let (node_id, etcd_hw) = taken;
        self.lease = Some(Lease {
            id: lease_id,
            node_id,
            ttl,
        });
        let resume = local_hw.max(etcd_hw);
        let mut fence = sent + ttl - cfg.safety_margin;
        if let Err(e) = self.wait_past(resume).await {
            self.release().await;
            return Err(e);
        }
        // Renew once more so the fence starts fresh after the wait.
        let sent = Instant::now();
        match client.keep_alive(lease_id).await {
            Ok(t) if t > 0 => fence = sent + Duration::from_secs(t).min(ttl) - cfg.safety_margin,
            Ok(_) => {
                self.lease = None;
                return Err(AcquireError::Etcd(EtcdError::Server(
                    "lease expired while waiting".into(),
                )));
            }
            Err(_) => {}
        }
        let active = match self.issuer.make_active(node_id, resume, Some(fence), 0) {
            Ok(a) => a,
            Err(e) => {
                self.release().await;
                return Err(AcquireError::Etcd(EtcdError::Protocol(e.to_string())));
            }
        };
        let target = self.target_hw(resume, resume);
        if let Err(e) = self.record_hw(&active, target).await {
            self.release().await;
            return Err(AcquireError::Etcd(EtcdError::Server(format!(
                "recording the high-water: {e:?}"
            ))));
        }
        active.set_durable_hw(target);
        self.issuer.publish(Some(Arc::new(active)));
        self.issuer.set_state(LeaseState::Held);
        self.issuer
            .metrics
            .acquisitions
            .fetch_add(1, Ordering::Relaxed);
        // One span per lease generation: every later line about this
        // holding carries its node id and lease.
        self.generation += 1;
        self.span = tracing::info_span!(
            "lease",
            generation = self.generation,
            node_id,
            lease = format!("{lease_id:x}")
        );
        self.span
            .in_scope(|| tracing::info!(resumed_after_ms = resume, "holding the node id"));
        Ok(())
    }
}

#[derive(Debug)]
enum HwError {
    NotHolder,
    Io(String),
}

/// Why no node id could be taken.
#[derive(Debug, thiserror::Error)]
pub enum AcquireError {
    /// Every id of the node field is held.
    #[error(
        "cluster full: all {count} node ids under {prefix}/node/ are held; widen the node field or use another prefix"
    )]
    Full {
        /// Number of ids the field holds.
        count: u64,
        /// The key prefix.
        prefix: String,
    },
    /// Another layout or node field already uses this prefix.
    #[error(
        "etcd prefix {prefix} belongs to a cluster with another layout: it records {recorded:?}, this node has {ours:?}; use another --etcd-prefix, or the same layout and node field"
    )]
    LayoutMismatch {
        /// The key prefix.
        prefix: String,
        /// What `<prefix>/layout` holds (empty: deleted since).
        recorded: String,
        /// What this node would record.
        ours: String,
    },
    /// The recorded high-water of the id taken does not read as a number.
    #[error(
        "{key} holds {value:?}, not a Unix ms high-water; refusing node id {node_id} (set it to a time at or after the last id its holder issued)"
    )]
    BadHighWater {
        /// The node id (released again).
        node_id: u64,
        /// The high-water key.
        key: String,
        /// Its value.
        value: String,
    },
    /// The recorded high-water is further ahead of this clock than start may wait.
    #[error(
        "the recorded high-water {high_water_ms} is {ahead:?} ahead of this clock, more than window + max_resume_wait ({limit:?}); check this host's clock, or raise --max-resume-wait"
    )]
    HighWaterAhead {
        /// The record (Unix ms).
        high_water_ms: u64,
        /// How far ahead of the clock it is.
        ahead: Duration,
        /// window + max_resume_wait.
        limit: Duration,
    },
    /// etcd failed.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

/// What `<prefix>/layout` holds for this configuration: the layout (every
/// field, epoch and tick) and the field the node id goes into.
fn cluster_layout(config: &crate::config::Config) -> Vec<u8> {
    format!("{}; node id in field {}", config.layout, config.node_field).into_bytes()
}

fn keys(cfg: &EtcdConfig, node_id: u64) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{}/node/{node_id}", cfg.prefix).into_bytes(),
        format!("{}/hw/{node_id}", cfg.prefix).into_bytes(),
    )
}

/// The lowest free node id, taken in one transaction with its high-water.
/// A lost race returns the fresh list of held ids in the same round trip;
/// the next try picks at random among the lowest 2^losses free ids, so a
/// herd of nodes starting together spreads out instead of all racing for
/// the same id (n² transactions). Uncontended, the id is the lowest free.
///
/// `layout` must equal `<prefix>/layout`: the first node of a cluster writes
/// it; every take compares it in the same transaction.
async fn take_lowest(
    client: &Client,
    cfg: &EtcdConfig,
    lease: i64,
    max_id: u64,
    holder: &str,
    layout: &[u8],
) -> Result<(u64, u64), AcquireError> {
    let node_prefix = format!("{}/node/", cfg.prefix);
    let layout_key = format!("{}/layout", cfg.prefix).into_bytes();
    let check_layout = |kvs: &[crate::etcd::Kv]| -> Result<(), AcquireError> {
        let recorded = kvs
            .iter()
            .find(|kv| kv.key == layout_key)
            .map_or(&[][..], |kv| &kv.value[..]);
        if recorded == layout {
            return Ok(());
        }
        Err(AcquireError::LayoutMismatch {
            prefix: cfg.prefix.clone(),
            recorded: String::from_utf8_lossy(recorded).into_owned(),
            ours: String::from_utf8_lossy(layout).into_owned(),
        })
    };
    let parse = |kvs: &[crate::etcd::Kv]| -> std::collections::HashSet<u64> {
        kvs.iter()
            .filter_map(|kv| {
                std::str::from_utf8(&kv.key)
                    .ok()?
                    .strip_prefix(&node_prefix)?
                    .parse()
                    .ok()
            })
            .collect()
    };
    // Record the layout if this is the cluster's first node; read the held ids.
    let (created, kvs) = client
        .txn(
            &[Compare::Absent(layout_key.clone())],
            &[
                Op::Put(layout_key.clone(), layout.to_vec(), 0),
                Op::Prefix(node_prefix.clone().into_bytes()),
            ],
            &[
                Op::Get(layout_key.clone()),
                Op::Prefix(node_prefix.clone().into_bytes()),
            ],
        )
        .await?;
    if !created {
        check_layout(&kvs)?;
    }
    let mut held = parse(&kvs);
    // Each lost race means another node took an id: bounded by the id count.
    for losses in 0..=max_id.saturating_mul(2).min(1 << 20) as u32 {
        let spread = 1u64 << losses.min(10);
        let free: Vec<u64> = (0..=max_id)
            .filter(|c| !held.contains(c))
            .take(spread as usize)
            .collect();
        let Some(&candidate) = free.get((jitter(losses) % free.len().max(1) as u64) as usize)
        else {
            break;
        };
        let (node, hw) = keys(cfg, candidate);
        let (ok, kvs) = client
            .txn(
                &[
                    Compare::Absent(node.clone()),
                    Compare::ValueIs(layout_key.clone(), layout.to_vec()),
                ],
                &[
                    Op::Put(node, holder.as_bytes().to_vec(), lease),
                    Op::Get(hw.clone()),
                ],
                &[
                    Op::Prefix(node_prefix.clone().into_bytes()),
                    Op::Get(layout_key.clone()),
                ],
            )
            .await?;
        if ok {
            return read_hw(candidate, &hw, kvs.first());
        }
        // Lost the race for the id, or the layout record changed since.
        check_layout(&kvs)?;
        // Or won it already: a take whose answer was lost (a timeout) and
        // that the client retried on another endpoint may have committed.
        // An id held by our own lease is ours; taking another would hold
        // two until the lease ends.
        let ours = kvs
            .iter()
            .filter(|kv| kv.lease == lease)
            .flat_map(|kv| parse(std::slice::from_ref(kv)))
            .next();
        if let Some(node_id) = ours {
            let (_, hw_key) = keys(cfg, node_id);
            let (_, record) = client.txn(&[], &[Op::Get(hw_key.clone())], &[]).await?;
            return read_hw(node_id, &hw_key, record.first());
        }
        held = parse(&kvs);
        held.insert(candidate);
    }
    Err(AcquireError::Full {
        count: max_id + 1,
        prefix: cfg.prefix.clone(),
    })
}

/// The high-water record of a node id just taken: none means the id was
/// never used under this prefix. Never reads an unreadable record as 0: the
/// caller revokes the lease, which gives the id back.
fn read_hw(
    node_id: u64,
    key: &[u8],
    record: Option<&crate::etcd::Kv>,
) -> Result<(u64, u64), AcquireError> {
    let Some(kv) = record else {
        return Ok((node_id, 0));
    };
    std::str::from_utf8(&kv.value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map(|hw| (node_id, hw))
        .ok_or_else(|| AcquireError::BadHighWater {
            node_id,
            key: String::from_utf8_lossy(key).into_owned(),
            value: String::from_utf8_lossy(&kv.value).into_owned(),
        })
}

async fn read_state(f: &StateFile) -> anyhow::Result<u64> {
    let f = f.clone();
    tokio::task::spawn_blocking(move || {
        f.read()
            .with_context(|| format!("reading state file {}", f.path().display()))
    })
    .await
    .context("state file task")?
}

async fn write_state(f: &StateFile, ms: u64) -> anyhow::Result<()> {
    let f = f.clone();
    tokio::task::spawn_blocking(move || {
        f.write(ms)
            .with_context(|| format!("writing state file {}", f.path().display()))
    })
    .await
    .context("state file task")?
}

/// A random number per process and call (for spreading racing nodes).
fn jitter(salt: u32) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(salt);
    h.write_u128(crate::issuer::now_nanos());
    h.finish()
}
