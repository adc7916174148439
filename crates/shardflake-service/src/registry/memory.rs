//! The registry in process: the etcd registry's semantics (see the parent
//! module) on a map behind a mutex, leases timed on tokio's clock. Under
//! paused time (`tokio::time::pause`) a test decides when leases expire;
//! expiry is applied on every operation, as etcd would have applied it by
//! then. Clones share one store, as nodes share one etcd.
//!
//! Faults a test can inject: the whole store unreachable, answers that
//! take a while (a store that hangs, or a request timeout), high-water
//! records failing alone, a lease ended early (expired or deleted by an
//! operator), a corrupt high-water record, another layout record.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{
    AcquireError, Claim, Holding, LeaseId, RecordError, Registry, RegistryError, Renewal, keys,
    read_high_water,
};

/// The prefix shown in messages (the memory store has one namespace).
const PREFIX: &str = "memory:";

/// An in-process registry; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct MemoryRegistry {
    store: Arc<Mutex<Store>>,
}

#[derive(Debug, Default)]
struct Store {
    layout: Option<Vec<u8>>,
    /// Node id → the lease holding it.
    nodes: BTreeMap<u64, LeaseId>,
    /// Node id → its high-water record, as written (not leased).
    high_waters: HashMap<u64, Vec<u8>>,
    /// Live leases: TTL and expiry.
    leases: HashMap<LeaseId, (Duration, Instant)>,
    last_lease: LeaseId,
    unreachable: bool,
    failing_records: bool,
    answer_delay: Duration,
}

/// The error of an injected outage.
#[derive(Debug, thiserror::Error)]
#[error("in-memory registry unreachable (an injected outage)")]
struct Outage;

/// The error of an injected high-water record failure.
#[derive(Debug, thiserror::Error)]
#[error("in-memory registry refused the high-water record (an injected failure)")]
struct RecordRefused;

impl Store {
    /// Ends the leases whose TTL has passed, with their node ids.
    fn expire(&mut self) -> Result<(), RegistryError> {
        if self.unreachable {
            return Err(RegistryError::Unreachable(Box::new(Outage)));
        }
        let now = Instant::now();
        self.leases.retain(|_, (_, expires)| *expires > now);
        let leases = &self.leases;
        self.nodes.retain(|_, lease| leases.contains_key(lease));
        Ok(())
    }

    fn revoke(&mut self, lease: LeaseId) {
        self.leases.remove(&lease);
        self.nodes.retain(|_, l| *l != lease);
    }

    fn take(&mut self, claim: &Claim, lease: LeaseId) -> Result<(u64, u64, u64), AcquireError> {
        match &self.layout {
            None => self.layout = Some(claim.layout.clone()),
            Some(recorded) if *recorded != claim.layout => {
                return Err(AcquireError::LayoutMismatch {
                    prefix: PREFIX.to_string(),
                    recorded: String::from_utf8_lossy(recorded).into_owned(),
                    ours: String::from_utf8_lossy(&claim.layout).into_owned(),
                });
            }
            Some(_) => {}
        }
        let node_id = (0..=claim.max_node_id)
            .find(|id| !self.nodes.contains_key(id))
            .ok_or_else(|| AcquireError::Full {
                count: claim.max_node_id + 1,
                prefix: PREFIX.to_string(),
            })?;
        let (_, hw_key) = keys(PREFIX, node_id);
        let hw = read_high_water(
            node_id,
            &hw_key,
            self.high_waters.get(&node_id).map(Vec::as_slice),
        )?;
        self.nodes.insert(node_id, lease);
        // As the etcd take: the new holder's first high-water in the same step.
        let first = claim.first_high_water(hw);
        self.high_waters
            .insert(node_id, first.to_string().into_bytes());
        Ok((node_id, hw, first))
    }
}

impl MemoryRegistry {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn store(&self) -> MutexGuard<'_, Store> {
        // A panic elsewhere while holding the lock leaves a consistent map.
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every operation fail as unreachable (`false`), or answer again.
    pub fn set_reachable(&self, reachable: bool) {
        self.store().unreachable = !reachable;
    }

    /// Makes every operation take `delay` (tokio time) before it is
    /// applied: a store that hangs until a request times out.
    pub fn set_answer_delay(&self, delay: Duration) {
        self.store().answer_delay = delay;
    }

    /// Waits out the injected answer delay, then locks the store.
    async fn answer(&self) -> MutexGuard<'_, Store> {
        let delay = self.store().answer_delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.store()
    }

    /// Makes high-water records fail (while renewals still succeed).
    pub fn fail_high_water_records(&self, failing: bool) {
        self.store().failing_records = failing;
    }

    /// Ends the lease holding `node_id` now (expired, or deleted by an
    /// operator); returns it.
    pub fn end_lease_of(&self, node_id: u64) -> Option<LeaseId> {
        let mut store = self.store();
        let lease = *store.nodes.get(&node_id)?;
        store.revoke(lease);
        Some(lease)
    }

    /// Deletes the node key of `node_id`, leaving its lease alive (an
    /// operator's mistake, or another holder's take in between).
    pub fn delete_node_key(&self, node_id: u64) {
        self.store().nodes.remove(&node_id);
    }

    /// Overwrites the high-water record of `node_id` (a corrupt one too).
    pub fn set_high_water_record(&self, node_id: u64, value: &[u8]) {
        self.store().high_waters.insert(node_id, value.to_vec());
    }

    /// The high-water recorded for `node_id`, if it reads as a number.
    pub fn high_water(&self, node_id: u64) -> Option<u64> {
        let store = self.store();
        std::str::from_utf8(store.high_waters.get(&node_id)?)
            .ok()?
            .parse()
            .ok()
    }

    /// Overwrites the layout record.
    pub fn set_layout_record(&self, value: &[u8]) {
        self.store().layout = Some(value.to_vec());
    }

    /// The lease holding `node_id` now, if any (expiry applied).
    pub fn holder(&self, node_id: u64) -> Option<LeaseId> {
        let mut store = self.store();
        let now = Instant::now();
        store.leases.retain(|_, (_, expires)| *expires > now);
        let lease = *store.nodes.get(&node_id)?;
        store.leases.contains_key(&lease).then_some(lease)
    }

    /// Leases alive now.
    pub fn live_leases(&self) -> usize {
        let now = Instant::now();
        let store = self.store();
        store.leases.values().filter(|(_, e)| *e > now).count()
    }
}

#[async_trait]
impl Registry for MemoryRegistry {
    async fn acquire(&self, claim: &Claim) -> Result<Holding, AcquireError> {
        let mut store = self.answer().await;
        store.expire()?;
        store.last_lease += 1;
        let lease = store.last_lease;
        store
            .leases
            .insert(lease, (claim.ttl, Instant::now() + claim.ttl));
        match store.take(claim, lease) {
            Ok((node_id, previous_high_water_ms, first)) => Ok(Holding {
                node_id,
                lease,
                ttl: Some(claim.ttl),
                previous_high_water_ms,
                recorded_high_water_ms: Some(first),
                resume_from: if previous_high_water_ms == 0 {
                    super::ResumeFrom::NoRecord
                } else {
                    super::ResumeFrom::Recorded
                },
            }),
            Err(e) => {
                store.revoke(lease);
                Err(e)
            }
        }
    }

    async fn renew(&self, lease: LeaseId) -> Result<Renewal, RegistryError> {
        let mut store = self.answer().await;
        store.expire()?;
        Ok(match store.leases.get_mut(&lease) {
            Some((ttl, expires)) => {
                *expires = Instant::now() + *ttl;
                Renewal::Alive(*ttl)
            }
            None => Renewal::Gone,
        })
    }

    async fn record_high_water(&self, holding: &Holding, unix_ms: u64) -> Result<(), RecordError> {
        let mut store = self.answer().await;
        store.expire()?;
        if store.failing_records {
            return Err(RegistryError::Failed(Box::new(RecordRefused)).into());
        }
        if store.nodes.get(&holding.node_id) != Some(&holding.lease) {
            return Err(RecordError::NotHolder);
        }
        store
            .high_waters
            .insert(holding.node_id, unix_ms.to_string().into_bytes());
        Ok(())
    }

    async fn release(&self, lease: LeaseId) -> Result<(), RegistryError> {
        let mut store = self.answer().await;
        store.expire()?;
        store.revoke(lease);
        Ok(())
    }

    fn identity(&self) -> Option<String> {
        Some("memory".into())
    }
}
