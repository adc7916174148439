//! The registry on etcd, over [`crate::etcd::Client`] (built only by
//! [`client`] here).
//!
//! Acquiring is two round trips: the lease grant together with one
//! serializable range over the prefix (layout, held ids, high-waters;
//! possibly stale), then a take. A take is one transaction:
//! `<prefix>/node/<id>` is created attached to the lease only if absent
//! (`create_revision == 0`), only if `<prefix>/layout` still holds this
//! node's layout (or, for the cluster's first node, is still absent, and
//! then the same transaction writes it) and only if `<prefix>/hw/<id>`
//! still holds what was read; the same transaction writes the new holder's
//! first high-water past it.
//! A lost race answers with the fresh list of held ids in the same round
//! trip and queues the node (`<prefix>/queue/<lease>`), so racing nodes
//! then go for distinct free ids (see [`take_lowest`]). Later high-waters
//! are written in a transaction that checks the node key is still attached
//! to our lease, the way TiKV's PD persists a timestamp window in etcd,
//! that the high-water key is still the one this holder last wrote (its
//! mod revision: a record deleted, rewritten or rolled back by a snapshot
//! restore fails it) and that `<prefix>/layout` still holds this node's
//! layout: a holder whose records changed under it stops at its next record
//! at the latest. It stops sooner: it watches the three keys
//! ([`Registry::changed`]), checks them once each time its watch is set up
//! (a restore breaks the watch, and the check finds the records rolled
//! back), and judges each change: only its own high-water records, and
//! the same layout written again, are not a reason to stop. Its own
//! records include one etcd executed whose answer was lost (a timeout):
//! the holder keeps the values it sent since the last answer, and a
//! record holding one of them, met by the watch or by a failed compare
//! (the client's retry), is adopted with its revision.
//!
//! What a take does not trust: an id with no high-water record may have had
//! a holder whose record was deleted (`etcdctl del --prefix`), so the take
//! resumes one window past its clock, past anything such a holder (stopped
//! by its failing record) could have stamped; an id taken before (its
//! `<prefix>/taken/<id>` stamp, written by every take, outside `hw/`) with
//! no high-water record had one deleted by hand, and its holder, killed
//! meanwhile, may have stamped as far ahead as its clock ran: the take
//! waits `max_resume_wait` past its clock, as after a restore; node records without a layout
//! record are refused (the layout was deleted); an id whose previous holder
//! recorded a high-water further ahead than this node may wait is skipped,
//! before anything is written; the etcd cluster id and prefix must match the
//! node's state file; the records must have been written in this etcd
//! cluster (`<prefix>/cluster` and every other record that names its
//! cluster, see `copied_from`: a snapshot restored into another cluster
//! is a copy, refused however young, whichever record is deleted there).
//!
//! **Restores.** An etcd restored from a snapshot hands back the records of
//! the snapshot: a holder that took an id or recorded a high-water after it
//! (and was stopped, or stopped at its next record) is forgotten, and it
//! may have stamped as far ahead as its own clock ran. A take sees a
//! restore two ways: etcd's revision went below one this node remembers
//! (its state file), or, for any node, the cluster's revision is past its
//! raft index ([`Status::restored`]: a restore keeps the snapshot's
//! revision under a new raft log). Each take stamps `<prefix>/taken/<id>`
//! with the [`Status`] it read; in a restored cluster only a record whose
//! stamp [`Status::descends_from`] is believed (taken since the last
//! restore). Any other record, or none, is taken as if its lost holder had
//! stamped up to `max_resume_wait` past this clock: the take waits that
//! out (and a window more, as every take). This holds for hosts whose
//! clocks differ by less than `max_resume_wait`.
//!
//! The gap between revision and raft index fades: every raft entry that
//! makes no revision (a lease grant, a refused start) closes it by one. So
//! the first take that sees a restore records it at `<prefix>/restored`
//! (the status it read); from then on, while the cluster's status
//! descends from that record, a take believes only records whose take
//! read a revision at or after the record's own ([`Trust::StampedAfter`]),
//! however many entries came since. A later restore (a history the record
//! does not descend from) is recorded again. A restore that no take sees
//! before raft entries close its gap is not seen.
//!
//! A restore of a snapshot taken before a `fleet move` or a layout change
//! brings back a place the fleet left, unretired, and nothing left in that
//! cluster tells. So each move and layout change raises the fleet's
//! generation (`<prefix>/generation`, written with the fleet id at the new
//! place), every node's state file records it, and a place holding an
//! older generation than a node remembers is refused
//! ([`AcquireError::GenerationBehind`]). And in a cluster that shows a
//! restore, a take is made only by a node whose state file names this
//! place, its fleet and its generation, until an operator confirms the
//! place (`shardflake fleet confirm`: `<prefix>/confirmed`, believed while
//! etcd's history descends from it); any other node is refused
//! ([`AcquireError::RestoreUnconfirmed`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    AcquireError, Claim, FleetCopied, FleetLeftovers, FleetOverlap, GenerationBehind, Holding,
    LeaseId, PreviousFleet, RecordError, Registry, RegistryError, Renewal, ResumeFrom, keys,
    read_high_water,
};
use crate::config::EtcdConfig;
use crate::etcd::{
    Client, Compare, EtcdError, Event, EventKind, Header, Kv, Op, Status, random_below,
};
use crate::layout_change::LayoutChange;

mod fleet_move;
pub use fleet_move::{Confirmed, MoveError, Moved, confirm_place, move_fleet};

/// Node ids leased from etcd under one prefix.
#[derive(Debug)]
pub struct EtcdRegistry {
    client: Client,
    prefix: String,
    /// What the holding's records must still be: set by a take, moved by
    /// each record.
    held: Mutex<Option<Held>>,
    /// The cluster id etcd answered the last take with.
    cluster_id: Mutex<Option<u64>>,
    /// This node's fleet id: from its state file, else `--fleet`, else its
    /// first take.
    fleet: Mutex<Option<String>>,
    /// Whether the fleet id expected came from the state file or a take
    /// (else `--fleet` alone: a place without it says nothing of where the
    /// fleet's ids were made).
    fleet_known: std::sync::atomic::AtomicBool,
    /// The fleet's generation this node saw last (its state file, then
    /// each take): a place holding an older one is one the fleet left.
    generation: Mutex<u64>,
    /// With several endpoints, one client each: before its first take a
    /// node asks every member which cluster and fleet it answers for.
    members: Vec<(String, std::sync::Arc<Client>)>,
    /// The highest etcd revision seen (and remembered in the state file):
    /// a lower one means etcd was rolled back.
    seen_revision: AtomicI64,
    /// Held while a record is written and while the watch judges a change,
    /// so that a change judged is never our own record still on its way
    /// back (its revision not yet in `held`).
    record_lock: tokio::sync::Mutex<()>,
}

/// The records of the id held, as this holder last wrote them.
#[derive(Debug, Clone)]
struct Held {
    lease: LeaseId,
    layout: Vec<u8>,
    fleet: Vec<u8>,
    hw_revision: i64,
    /// Values of the high-water records sent since the last one etcd
    /// answered (its answer may be lost while it was executed).
    unconfirmed: Vec<Vec<u8>>,
}

/// What one `--etcd` endpoint answered before the first take.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct MemberAnswer {
    endpoint: String,
    cluster: u64,
    member: u64,
    fleet: Option<String>,
}

impl std::fmt::Display for MemberAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (etcd cluster={:x}, member={:x}, fleet {})",
            self.endpoint,
            self.cluster,
            self.member,
            self.fleet.as_deref().unwrap_or("none")
        )
    }
}

impl EtcdRegistry {
    /// A registry on the endpoints and prefix of `cfg`, with its TLS files
    /// and credentials read and checked (nothing is sent yet).
    pub fn new(cfg: &EtcdConfig) -> Result<Self, EtcdError> {
        let members = if cfg.endpoints.len() > 1 {
            cfg.endpoints
                .iter()
                .map(|endpoint| {
                    let one = EtcdConfig {
                        endpoints: vec![endpoint.clone()],
                        ..cfg.clone()
                    };
                    Ok((endpoint.clone(), std::sync::Arc::new(client(&one)?)))
                })
                .collect::<Result<_, EtcdError>>()?
        } else {
            Vec::new()
        };
        Ok(EtcdRegistry {
            members,
            client: client(cfg)?,
            prefix: cfg.prefix.clone(),
            held: Mutex::new(None),
            cluster_id: Mutex::new(None),
            fleet: Mutex::new(cfg.fleet.clone()),
            fleet_known: std::sync::atomic::AtomicBool::new(false),
            generation: Mutex::new(0),
            seen_revision: AtomicI64::new(0),
            record_lock: tokio::sync::Mutex::new(()),
        })
    }
}

/// A client of the etcd of `cfg`, its TLS files and password read (also
/// the ticket high-water store's, `crate::tickets`).
pub(crate) fn client(cfg: &EtcdConfig) -> Result<Client, EtcdError> {
    let auth = cfg.login.as_ref().map(|l| l.read()).transpose()?;
    Client::connect(&cfg.endpoints, cfg.timeout, cfg.tls.as_ref(), auth.as_ref())
}

impl From<EtcdError> for RegistryError {
    fn from(e: EtcdError) -> Self {
        match e {
            EtcdError::Unreachable { .. } => RegistryError::Unreachable(Box::new(e)),
            e if e.needs_operator() => RegistryError::Refused(Box::new(e)),
            other => RegistryError::Failed(Box::new(other)),
        }
    }
}

impl From<EtcdError> for AcquireError {
    fn from(e: EtcdError) -> Self {
        AcquireError::Registry(e.into())
    }
}

#[async_trait]
impl Registry for EtcdRegistry {
    async fn acquire(&self, claim: &Claim) -> Result<Holding, AcquireError> {
        // Before the first take: the cluster a majority of the listed members
        // answer for, which the take's own answers must come from.
        let verified = if lock(&self.cluster_id).is_none() {
            self.check_members().await?
        } else {
            None
        };
        // The grant and the first read do not depend on each other: one
        // round trip for both.
        // The prefix, then the fleets registered: the take compares that
        // no fleet registered after this read, so a read of the fleets
        // older than the prefix's would fail it for nothing.
        let reads = async {
            let prefix = read_cluster(&self.client, &self.prefix).await;
            let fleets = read_registrations(&self.client, true).await;
            (prefix, fleets)
        };
        let (granted, (read, fleets), status) = tokio::join!(
            self.client.grant(claim.ttl.as_secs()),
            reads,
            self.client.status()
        );
        let (lease, ttl) = granted?;
        let status = status
            .inspect_err(|e| {
                tracing::warn!(error = %e, "etcd did not tell its raft index (Maintenance.Status): a restore from a snapshot is seen only by the revision this node remembers");
            })
            .ok();
        // A member that did not answer the check may answer the take: one
        // of another cluster is refused, as in the check.
        let read = read.and_then(|(kvs, header)| match verified {
            Some(cluster) if cluster != header.cluster_id => {
                Err(another_cluster_answered(cluster, header.cluster_id))
            }
            _ => Ok((kvs, header)),
        });
        let taken = match read.and_then(|read| Ok((read, fleets?))) {
            Ok(((kvs, header), (registered, registered_at))) => {
                // The cluster of this process's first take is its cluster
                // for life: another one (a member of another cluster among
                // the endpoints, failed over to) knows nothing of its ids.
                let first_take = lock(&self.cluster_id).is_none();
                let first = *lock(&self.cluster_id).get_or_insert(header.cluster_id);
                // A state file written on another cluster (a fleet moved
                // here with `fleet move`): the revision it remembers is of
                // another history, and says nothing of this one's.
                let here = format!("etcd cluster={:x} ", header.cluster_id);
                if first_take
                    && claim
                        .expected_registry
                        .as_ref()
                        .is_some_and(|r| r.starts_with("etcd ") && !r.starts_with(&here))
                {
                    self.seen_revision.store(0, Ordering::Relaxed);
                }
                let now = self.identity_of(header.cluster_id);
                let expected_fleet = lock(&self.fleet).clone();
                match &claim.expected_registry {
                    _ if first != header.cluster_id => Err(AcquireError::ClusterChanged {
                        took: self.identity_of(first),
                        now,
                    }),
                    // A state file with a fleet id: the fleet id found
                    // there decides (a moved fleet carries it).
                    Some(recorded) if *recorded != now && expected_fleet.is_none() => {
                        Err(AcquireError::RegistryChanged {
                            recorded: recorded.clone(),
                            now,
                        })
                    }
                    // A state file of another cluster, where this one holds
                    // no fleet id (the old cluster re-created empty): the
                    // fleet's ids were made on the cluster it names, and no
                    // record put back here can stand for them.
                    Some(recorded)
                        if first_take
                            && claim.previous.is_none()
                            && recorded.starts_with("etcd ")
                            && !recorded.starts_with(&here)
                            && !kvs.iter().any(|kv| {
                                kv.key == format!("{}/fleet", self.prefix).as_bytes()
                            })
                            && let Some(expected) = &expected_fleet =>
                    {
                        Err(AcquireError::FleetOnAnotherCluster {
                            prefix: self.prefix.clone(),
                            expected: expected.clone(),
                            clusters: format!("state file: {recorded}, here: {now}"),
                        })
                    }
                    _ => {
                        let seen = self
                            .seen_revision
                            .fetch_max(header.revision, Ordering::Relaxed);
                        // The first read is served by one member, which may
                        // lag: a rollback is believed once a read through the
                        // leader confirms it.
                        let rolled_back = header.revision < seen
                            && self.revision_now().await.is_some_and(|now| now < seen);
                        let marker = self
                            .restore_marker(&kvs, status, rolled_back, header.cluster_id)
                            .await;
                        let trust = if rolled_back {
                            tracing::warn!(
                                revision = header.revision,
                                seen,
                                "etcd's revision went back (restored from a snapshot?): its high-water records are not trusted"
                            );
                            Trust::Nothing
                        } else if let Some(since) = marker {
                            Trust::StampedAfter(since)
                        } else {
                            match status {
                                Some(now) if now.restored() => Trust::StampedSince(now),
                                _ => Trust::All,
                            }
                        };
                        let place = Place::read(&self.prefix, &kvs);
                        let remembered = *lock(&self.generation);
                        let knows_place = expected_fleet.is_some()
                            && place.fleet == expected_fleet
                            && place.generation == remembered
                            && (!first_take
                                || claim.expected_registry.as_deref() == Some(now.as_str()));
                        // A node of a fleet on a place without it is
                        // refused by the take (no fleet id), with the ways
                        // out of that.
                        let fleet_missing = expected_fleet.is_some()
                            && place.fleet.is_none()
                            && claim.previous.is_none();
                        let here_hex = format!("{:x}", header.cluster_id);
                        let fleets: Vec<&str> = [place.fleet.as_deref(), expected_fleet.as_deref()]
                            .into_iter()
                            .flatten()
                            .collect();
                        // Only a node that took here before (its state
                        // file naming this place, or this process)
                        // registers an unregistered fleet id again: a
                        // prefix of a version before the registrations,
                        // or one deleted here by hand.
                        let took_here = expected_fleet.as_deref().filter(|_| {
                            self.fleet_known.load(Ordering::Relaxed)
                                && match claim.expected_registry.as_deref() {
                                    Some(recorded) => recorded == now,
                                    None => !first_take,
                                }
                        });
                        let copy = copy_check(
                            &self.prefix,
                            &kvs,
                            &registered,
                            registered_at,
                            header.cluster_id,
                            &fleets,
                            || {
                                // A node of this fleet whose state file
                                // names another cluster: only a `fleet
                                // move` brings the fleet here, and it
                                // names this cluster at the new place.
                                let recorded =
                                    state_file_cluster(claim.expected_registry.as_deref()?)?;
                                let moved_here =
                                    place.cluster.as_deref() == Some(here_hex.as_str());
                                (recorded != here_hex
                                    && !moved_here
                                    && place.fleet.is_some()
                                    && place.fleet == expected_fleet)
                                    .then(|| (recorded, "this node's state file".to_string()))
                            },
                            took_here,
                        );
                        // A node without a fleet that would start a new
                        // one: only on a prefix with no records at all.
                        // Records without a fleet id are a fleet's
                        // leftovers (a copy, or its fleet id deleted), and
                        // their high-water records may be gone with it. A
                        // node whose state file names this very place ran
                        // here before fleet ids were recorded, and a
                        // layout record without the fixed fields was
                        // written by a version before them (and before
                        // fleet ids), whose nodes recorded no fleet.
                        let layout_key = format!("{}/layout", self.prefix);
                        let earlier_version = kvs.iter().any(|kv| {
                            kv.key == layout_key.as_bytes()
                                && claim.earlier_layout.as_deref() == Some(kv.value.as_slice())
                        });
                        let leftovers = (expected_fleet.is_none()
                            && !earlier_version
                            && claim.previous.is_none()
                            && place.fleet.is_none()
                            && claim.expected_registry.as_deref() != Some(now.as_str())
                            && registered_under(&registered, &self.prefix).is_none())
                        .then(|| leftover_records(&self.prefix, &kvs))
                        .filter(|keys| !keys.is_empty());
                        // A new fleet: the cluster's other fleets are
                        // found by their records too, not only by their
                        // registrations (deleted on a copy), and a copy
                        // is refused whichever prefix a node starts on.
                        let new_fleet = copy.is_ok()
                            && leftovers.is_none()
                            && expected_fleet.is_none()
                            && claim.previous.is_none()
                            && place.fleet.is_none()
                            && registered_under(&registered, &self.prefix).is_none();
                        let copy = match copy {
                            Ok(()) if new_fleet => {
                                self.copy_elsewhere(&registered, registered_at, header.cluster_id)
                                    .await
                            }
                            other => other,
                        };
                        let checked = if let Err(e) = copy {
                            Err(e)
                        } else if let Some(records) = leftovers {
                            Err(AcquireError::FleetLeftovers(Box::new(FleetLeftovers {
                                prefix: self.prefix.clone(),
                                records,
                                here: here_hex.clone(),
                                floor_ms: claim.now_ms.saturating_add(claim.max_ahead_ms),
                            })))
                        } else if let Some(e) = place.behind(
                            remembered,
                            &expected_fleet,
                            claim.expected_registry.as_deref(),
                        ) {
                            Err(e)
                        } else if !matches!(trust, Trust::All)
                            && !knows_place
                            && !fleet_missing
                            && !place.confirmed(status, marker)
                        {
                            Err(AcquireError::RestoreUnconfirmed {
                                prefix: self.prefix.clone(),
                                what: place.describe(),
                            })
                        } else {
                            Ok(())
                        };
                        // A layout change: the new fleet's first takes (no
                        // layout record yet) check the previous fleet and
                        // retire it; later ones find the floor it left.
                        let moved_from = claim.previous.as_ref().map(|p| p.prefix.clone());
                        let fleet = match (checked, &claim.previous) {
                            (Err(e), _) => Err(e),
                            (Ok(()), Some(previous))
                                if !kvs.iter().any(|kv| kv.key == layout_key.as_bytes()) =>
                            {
                                let before = BeforeRetiring {
                                    registered: &registered,
                                    registered_at,
                                    expected: expected_fleet.as_deref(),
                                    cluster_id: header.cluster_id,
                                };
                                retire_previous(&self.client, &self.prefix, previous, claim, before)
                                    .await
                                    .map(|(floor, carried, generation)| Fleet {
                                        cluster_id: header.cluster_id,
                                        expected: expected_fleet,
                                        carried,
                                        generation,
                                        floor: Some(floor),
                                        registered,
                                        registered_at,
                                        read_at: header.revision,
                                        moved_from,
                                    })
                            }
                            (Ok(()), _) => Ok(Fleet {
                                cluster_id: header.cluster_id,
                                expected: expected_fleet,
                                carried: None,
                                generation: place.generation,
                                floor: None,
                                registered,
                                registered_at,
                                read_at: header.revision,
                                moved_from,
                            }),
                        };
                        match fleet {
                            Err(e) => Err(e),
                            Ok(fleet) => {
                                take_lowest(
                                    &self.client,
                                    &self.prefix,
                                    lease,
                                    claim,
                                    kvs,
                                    &trust,
                                    status,
                                    fleet,
                                )
                                .await
                            }
                        }
                    }
                }
            }
            Err(e) => Err(e),
        };
        match taken {
            Ok(taken) => {
                self.fleet_known.store(true, Ordering::Relaxed);
                *lock(&self.fleet) = Some(String::from_utf8_lossy(&taken.fleet).into_owned());
                *lock(&self.generation) = taken.generation;
                *lock(&self.held) = Some(Held {
                    lease,
                    layout: taken.layout,
                    fleet: taken.fleet,
                    hw_revision: taken.hw_revision,
                    unconfirmed: Vec::new(),
                });
                Ok(Holding {
                    node_id: taken.node_id,
                    lease,
                    ttl: Some(Duration::from_secs(ttl).min(claim.ttl)),
                    previous_high_water_ms: taken.previous_ms,
                    recorded_high_water_ms: Some(taken.recorded_ms),
                    resume_from: taken.resume_from,
                })
            }
            Err(e) => {
                let _ = self.client.revoke(lease).await;
                // Expected by `--fleet` alone: nothing says the fleet ever
                // ran here, so no floor to put back is advised.
                Err(match e {
                    AcquireError::FleetMissing {
                        prefix, expected, ..
                    } if !self.fleet_known.load(Ordering::Relaxed) => AcquireError::FleetNotHere {
                        prefix,
                        expected,
                        here: self.identity().unwrap_or_default(),
                    },
                    e => e,
                })
            }
        }
    }

    async fn renew(&self, lease: LeaseId) -> Result<Renewal, RegistryError> {
        match self.client.keep_alive(lease).await? {
            0 => Ok(Renewal::Gone),
            ttl => Ok(Renewal::Alive(Duration::from_secs(ttl))),
        }
    }

    async fn record_high_water(&self, holding: &Holding, unix_ms: u64) -> Result<(), RecordError> {
        let _writing = self.record_lock.lock().await;
        let hw = keys(&self.prefix, holding.node_id).1;
        let value = unix_ms.to_string().into_bytes();
        // Ours from the moment it is sent: etcd may execute it and the
        // answer be lost (a timeout, which the client may retry).
        let Some(mut held) = self.sent(holding.lease, &value) else {
            return Err(RecordError::NotHolder);
        };
        // The fleet's registration is read in the same round trip: one
        // deleted under the running fleet is put back (see
        // `Self::register_again`).
        let registration_key = fleet_registry_key(&held.fleet);
        // A second try only after adopting an earlier record of ours.
        for _ in 0..2 {
            let answer = self
                .client
                .txn(
                    &self.unchanged(holding, &held),
                    &[
                        Op::Put(hw.clone().into_bytes(), value.clone(), 0),
                        Op::Get(registration_key.clone()),
                    ],
                    &self.records_read(holding),
                )
                .await
                .map_err(RegistryError::from)?;
            if answer.succeeded {
                if let Some(h) = lock(&self.held)
                    .as_mut()
                    .filter(|h| h.lease == holding.lease)
                {
                    h.hw_revision = answer.revision;
                    h.unconfirmed.clear();
                }
                self.seen_revision
                    .fetch_max(answer.revision, Ordering::Relaxed);
                if !answer.kvs.iter().any(|kv| kv.key == registration_key) {
                    self.register_again(holding, &held).await;
                }
                return Ok(());
            }
            // What moved may be a record of ours whose answer was lost:
            // this one (its retry found it done), or an earlier one.
            match self.adopt_own_record(holding, &answer.kvs) {
                Some(adopted) if adopted == value => return Ok(()),
                // Adopting cleared what was sent: this one is sent again.
                Some(_) => match self.sent(holding.lease, &value) {
                    Some(now) => held = now,
                    None => break,
                },
                None => break,
            }
        }
        // Our key, our high-water or the layout changed under us
        // (deleted, rewritten, rolled back): nothing here is ours.
        *lock(&self.held) = None;
        Err(RecordError::NotHolder)
    }

    async fn release(&self, lease: LeaseId) -> Result<(), RegistryError> {
        Ok(self.client.revoke(lease).await?)
    }

    fn identity(&self) -> Option<String> {
        lock(&self.cluster_id).map(|id| self.identity_of(id))
    }

    fn fleet(&self) -> Option<String> {
        lock(&self.fleet).clone()
    }

    fn generation(&self) -> Option<u64> {
        lock(&self.fleet).as_ref().map(|_| *lock(&self.generation))
    }

    fn expect_fleet(&self, fleet: String, generation: u64) {
        self.fleet_known.store(true, Ordering::Relaxed);
        *lock(&self.fleet) = Some(fleet);
        *lock(&self.generation) = generation;
    }

    fn revision(&self) -> Option<i64> {
        Some(self.seen_revision.load(Ordering::Relaxed)).filter(|&r| r > 0)
    }

    fn remember_revision(&self, revision: i64) {
        self.seen_revision.fetch_max(revision, Ordering::Relaxed);
    }

    async fn changed(&self, holding: &Holding) -> String {
        let mut backoff = WATCH_RETRY;
        loop {
            match self.watch_records(holding, &mut backoff).await {
                Ok(why) => return why,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "watching this node's records in etcd (each periodic record still checks them)");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(WATCH_RETRY_MAX);
                }
            }
        }
    }
}

/// The first wait before a failed watch of the records is set up again,
/// and the longest (the wait doubles at each failure in a row).
const WATCH_RETRY: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(2);

impl EtcdRegistry {
    /// What the holding's records must still be for it to go on: its node
    /// key on its lease, its high-water as it last wrote it, the layout.
    fn unchanged(&self, holding: &Holding, held: &Held) -> Vec<Compare> {
        let (node, hw) = keys(&self.prefix, holding.node_id);
        vec![
            Compare::LeaseIs(node.into_bytes(), holding.lease),
            Compare::ModRevisionIs(hw.into_bytes(), held.hw_revision),
            Compare::ValueIs(self.layout_key().into_bytes(), held.layout.clone()),
            Compare::ValueIs(self.fleet_key().into_bytes(), held.fleet.clone()),
        ]
    }

    /// Puts this fleet's registration back where it is missing: deleted
    /// under the running fleet (`etcdctl del --prefix shardflake`), it
    /// would let another fleet whose ids this one makes start beside it,
    /// and only takes write it. Created only if still absent and while
    /// this holder's node key and the fleet id are as it holds them; a
    /// failure is logged and the next record tries again.
    async fn register_again(&self, holding: &Holding, held: &Held) {
        // Known since the take: a registration naming no cluster, or
        // another, would read as a copy's.
        let Some(cluster_id) = *lock(&self.cluster_id) else {
            return;
        };
        let key = fleet_registry_key(&held.fleet);
        let node = keys(&self.prefix, holding.node_id).0;
        let compares = [
            Compare::Absent(key.clone()),
            Compare::LeaseIs(node.into_bytes(), holding.lease),
            Compare::ValueIs(self.fleet_key().into_bytes(), held.fleet.clone()),
        ];
        let put = [Op::Put(
            key.clone(),
            registration(&self.prefix, &held.layout, cluster_id),
            0,
        )];
        let shown = String::from_utf8_lossy(&key).into_owned();
        match self.client.txn(&compares, &put, &[]).await {
            Ok(answer) if answer.succeeded => tracing::warn!(
                "{shown} was missing (deleted under the running fleet?): written back, so that a fleet whose ids this one makes is refused again"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "writing back the missing {shown} (the next record tries again)")
            }
        }
    }

    /// Before the first take: a majority of the members the endpoints
    /// name must answer, and every member that answers must answer for one
    /// cluster and one fleet (an endpoint list mixing two clusters would
    /// let nodes of one fleet take ids in both). Returns that cluster
    /// (`None`: one endpoint).
    ///
    /// The majority is counted over members, not URLs: each answer names
    /// its member (etcd's response header), so one member listed twice
    /// (`127.0.0.1:P` and `localhost:P`) counts once, and it must
    /// outnumber the endpoints that did not answer, each of which may be a
    /// member of its own. Then the members that answered are more than half
    /// of the members the list names, whichever members were down, so two
    /// nodes given one list were both checked by one member: they never
    /// start in two clusters. Fewer answering is retried (unreachable)
    /// until start's deadline.
    async fn check_members(&self) -> Result<Option<u64>, AcquireError> {
        if self.members.is_empty() {
            return Ok(None);
        }
        let key = format!("{}/fleet", self.prefix);
        let mut asked = tokio::task::JoinSet::new();
        for (endpoint, client) in &self.members {
            let (endpoint, client, key) = (endpoint.clone(), client.clone(), key.clone());
            asked.spawn(async move {
                let answer = client.range_prefix_local_header(key.as_bytes()).await;
                (endpoint, answer)
            });
        }
        let mut answers = Vec::new();
        let mut silent = Vec::new();
        while let Some(joined) = asked.join_next().await {
            let Ok((endpoint, answer)) = joined else {
                continue;
            };
            match answer {
                Ok((kvs, header)) => {
                    let fleet = kvs
                        .iter()
                        .find(|kv| kv.key == key.as_bytes())
                        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
                    answers.push(MemberAnswer {
                        endpoint,
                        cluster: header.cluster_id,
                        member: header.member_id,
                        fleet,
                    });
                }
                Err(e) => {
                    tracing::warn!(endpoint, error = %e, "etcd member did not answer which cluster it belongs to");
                    silent.push(endpoint);
                }
            }
        }
        answers.sort();
        silent.sort();
        for (i, a) in answers.iter().enumerate() {
            for b in &answers[i + 1..] {
                let fleets_differ = matches!((&a.fleet, &b.fleet), (Some(x), Some(y)) if x != y);
                if a.cluster != b.cluster || fleets_differ {
                    return Err(AcquireError::MembersDisagree {
                        one: a.to_string(),
                        other: b.to_string(),
                    });
                }
            }
        }
        let mut names: HashMap<u64, Vec<&str>> = HashMap::new();
        for a in &answers {
            names.entry(a.member).or_default().push(&a.endpoint);
        }
        for (member, endpoints) in names.iter().filter(|(_, e)| e.len() > 1) {
            tracing::info!(
                member = format!("{member:x}"),
                endpoints = endpoints.join(", "),
                "one etcd member is listed under several --etcd endpoints: it counts once"
            );
        }
        if names.len() <= silent.len() {
            return Err(AcquireError::Registry(RegistryError::Unreachable(
                format!(
                    "etcd members that answered which etcd cluster and fleet they belong to: {}, through {} of the {} --etcd endpoints (silent: {}): a node takes its first id once the members that answered outnumber the endpoints that did not (one member listed under two names counts once), so that no endpoint of another cluster among them goes unseen. Start it again once they answer, or list only the members of its cluster, each once",
                    names.len(),
                    answers.len(),
                    self.members.len(),
                    silent.join(", ")
                )
                .into(),
            )));
        }
        Ok(answers.first().map(|a| a.cluster))
    }

    fn layout_key(&self) -> String {
        format!("{}/layout", self.prefix)
    }

    /// The holding's records, read when a compare of them fails.
    fn records_read(&self, holding: &Holding) -> Vec<Op> {
        let (node, hw) = keys(&self.prefix, holding.node_id);
        vec![
            Op::Get(node.into_bytes()),
            Op::Get(hw.into_bytes()),
            Op::Get(self.layout_key().into_bytes()),
            Op::Get(self.fleet_key().into_bytes()),
        ]
    }

    fn fleet_key(&self) -> String {
        format!("{}/fleet", self.prefix)
    }

    /// Notes `value` as a record of `lease` sent, its outcome unknown
    /// until etcd answers; the records as held.
    fn sent(&self, lease: LeaseId, value: &[u8]) -> Option<Held> {
        let mut held = lock(&self.held);
        let h = held.as_mut().filter(|h| h.lease == lease)?;
        // Bounded: records whose answers are lost, one after another.
        if h.unconfirmed.len() >= 16 {
            h.unconfirmed.remove(0);
        }
        h.unconfirmed.push(value.to_vec());
        Some(h.clone())
    }

    /// When the records read (`kvs`, from [`Self::records_read`]) are ours
    /// but for a high-water record of ours whose answer was lost, takes
    /// its revision as ours; returns its value.
    fn adopt_own_record(&self, holding: &Holding, kvs: &[Kv]) -> Option<Vec<u8>> {
        let (node, hw) = keys(&self.prefix, holding.node_id);
        let layout = self.layout_key();
        let find = |key: &str| kvs.iter().find(|kv| kv.key == key.as_bytes());
        let held = self.held_by(holding.lease)?;
        let ours = find(&node).is_some_and(|kv| kv.lease == holding.lease)
            && find(&layout).is_some_and(|kv| kv.value == held.layout)
            && find(&self.fleet_key()).is_some_and(|kv| kv.value == held.fleet);
        let record = find(&hw).filter(|_| ours)?;
        self.adopt(holding.lease, &record.value, record.mod_revision)
            .then(|| record.value.clone())
    }

    /// Takes `revision` as this holder's own high-water record when
    /// `value` is a record it sent whose answer it never had. Of the
    /// records sent since the last one answered, each compared the same
    /// revision, so at most one of them was executed: this one.
    fn adopt(&self, lease: LeaseId, value: &[u8], revision: i64) -> bool {
        let mut held = lock(&self.held);
        let Some(h) = held.as_mut().filter(|h| h.lease == lease) else {
            return false;
        };
        if revision <= h.hw_revision || !h.unconfirmed.iter().any(|v| v == value) {
            return false;
        }
        tracing::info!(
            revision,
            "a high-water record whose answer was lost was executed: it is this holder's own"
        );
        h.hw_revision = revision;
        h.unconfirmed.clear();
        self.seen_revision.fetch_max(revision, Ordering::Relaxed);
        true
    }

    /// The records as this holder last wrote them, while `lease` holds.
    fn held_by(&self, lease: LeaseId) -> Option<Held> {
        lock(&self.held).clone().filter(|h| h.lease == lease)
    }

    /// One watch of the holding's records: set up, the records checked
    /// once (what changed before the watch began), then each change
    /// judged. `Ok`: a change not ours, in words; `Err`: the watch failed
    /// (`backoff` is reset once it was set up and checked).
    async fn watch_records(
        &self,
        holding: &Holding,
        backoff: &mut Duration,
    ) -> Result<String, EtcdError> {
        let (node, hw) = keys(&self.prefix, holding.node_id);
        let layout = self.layout_key();
        let mut watch = self
            .client
            .watch(&[
                node.clone().into_bytes(),
                hw.clone().into_bytes(),
                layout.clone().into_bytes(),
            ])
            .await?;
        {
            let _writing = self.record_lock.lock().await;
            let Some(held) = self.held_by(holding.lease) else {
                return Ok("the node id is no longer held by this lease".into());
            };
            let check = self
                .client
                .txn(
                    &self.unchanged(holding, &held),
                    &[],
                    &self.records_read(holding),
                )
                .await?;
            if !check.succeeded && self.adopt_own_record(holding, &check.kvs).is_none() {
                return Ok(format!(
                    "{node}, {hw} or {layout} changed while the watch was down or being set up (deleted, rewritten, or etcd restored from a snapshot)"
                ));
            }
        }
        *backoff = WATCH_RETRY;
        loop {
            let events = watch.changes().await?;
            let _writing = self.record_lock.lock().await;
            for e in &events {
                let Some(held) = self.held_by(holding.lease) else {
                    return Ok("the node id is no longer held by this lease".into());
                };
                if let Some(why) = not_ours(e, &held, [&node, &hw, &layout]) {
                    // A record of ours whose answer was lost comes back
                    // here: its revision is ours from now on.
                    let own = e.kind == EventKind::Put
                        && e.key == hw.as_bytes()
                        && self.adopt(holding.lease, &e.value, e.mod_revision);
                    if !own {
                        return Ok(why);
                    }
                }
            }
        }
    }

    /// The revision of `<prefix>/restored`, the record of the last restore
    /// seen: written when this take sees one that it does not record yet
    /// (etcd's revision past its raft index, or below one this node saw,
    /// in a history the record does not descend from). The gap between
    /// revision and raft index fades (each lease grant is a raft entry and
    /// no revision); the record does not, once a take has seen the gap.
    async fn restore_marker(
        &self,
        kvs: &[Kv],
        status: Option<Status>,
        rolled_back: bool,
        cluster_id: u64,
    ) -> Option<i64> {
        let key = format!("{}/restored", self.prefix);
        let recorded = kvs
            .iter()
            .find(|kv| kv.key == key.as_bytes())
            .map(|kv| (parse_stamp(&kv.value), kv.mod_revision));
        let now = status?;
        // A revision gone back (read again through the leader) is a restore
        // after any record: recorded afresh, past everything it restored.
        let known = !rolled_back
            && recorded.is_some_and(|(then, _)| then.is_some_and(|t| now.descends_from(&t)));
        if !(now.restored() || rolled_back) || known {
            return recorded.map(|(_, revision)| revision);
        }
        let written = self
            .client
            .txn(
                &[],
                &[Op::Put(
                    key.clone().into_bytes(),
                    stamp_text(&now, cluster_id).into_bytes(),
                    0,
                )],
                &[],
            )
            .await;
        match written {
            Ok(answer) => {
                tracing::warn!(
                    revision = now.revision,
                    raft_index = now.raft_index,
                    "etcd was restored from a snapshot: recorded at {key}, so that every later take waits out the records not taken since"
                );
                Some(answer.revision)
            }
            Err(e) => {
                tracing::warn!(error = %e, "recording the restore seen at {key}");
                recorded.map(|(_, revision)| revision)
            }
        }
    }

    /// The cluster's revision from a linearizable read (`None`: no answer).
    async fn revision_now(&self) -> Option<i64> {
        let key = format!("{}/layout", self.prefix);
        self.client
            .range_header(key.as_bytes())
            .await
            .ok()
            .map(|h| h.revision)
    }

    /// [`copy_check`] of every other place in the cluster holding a
    /// fleet's records ([`other_places`]), before a new fleet starts
    /// here: a copy of another cluster is refused under any prefix.
    async fn copy_elsewhere(
        &self,
        registered: &[Kv],
        registered_at: i64,
        cluster_id: u64,
    ) -> Result<(), AcquireError> {
        for place in other_places(&self.client, &self.prefix).await? {
            let kvs = self
                .client
                .range_prefix_local(format!("{place}/").as_bytes())
                .await?;
            // Only a fleet's place: its layout record, or a fleet id (keys
            // of another application may end the same way).
            let (layout, fleet) = (format!("{place}/layout"), format!("{place}/fleet"));
            let a_fleets = kvs.iter().any(|kv| {
                (kv.key == layout.as_bytes()
                    && std::str::from_utf8(&kv.value)
                        .is_ok_and(|v| v.contains("; node id in field")))
                    || (kv.key == fleet.as_bytes()
                        && kv.value.len() == 32
                        && kv.value.iter().all(u8::is_ascii_hexdigit))
            });
            if !a_fleets {
                continue;
            }
            copy_check(
                &place,
                &kvs,
                registered,
                registered_at,
                cluster_id,
                &[],
                || None,
                None,
            )
            .inspect_err(|_| {
                tracing::warn!(prefix = %self.prefix, other = %place, "a new fleet would start beside a copy of another fleet");
            })?;
        }
        Ok(())
    }

    fn identity_of(&self, cluster_id: u64) -> String {
        format!("etcd cluster={cluster_id:x} prefix={}", self.prefix)
    }
}

/// Why a change to a holding's records (`node`, `hw`, `layout` keys) means
/// it is not ours any more; `None` for our own high-water records (their
/// revision is at most the last one we wrote, which `held` has: the record
/// lock is held) and for the same layout written again.
fn not_ours(e: &Event, held: &Held, [node, hw, layout]: [&String; 3]) -> Option<String> {
    let what = match e.kind {
        EventKind::Put => "rewritten",
        EventKind::Delete => "deleted",
    };
    let key = e.key.as_slice();
    if key == hw.as_bytes() {
        let ours = e.kind == EventKind::Put && e.mod_revision <= held.hw_revision;
        (!ours).then(|| format!("{hw} was {what} by another writer"))
    } else if key == node.as_bytes() {
        Some(format!(
            "{node} was {what} (the lease ended, or another writer)"
        ))
    } else if key == layout.as_bytes() {
        let same = e.kind == EventKind::Put && e.value == held.layout;
        (!same).then(|| format!("{layout} was {what}"))
    } else {
        None
    }
}

/// A first take answered by another cluster than the one the endpoints
/// answered the check for.
fn another_cluster_answered(checked: u64, answered: u64) -> AcquireError {
    AcquireError::MembersDisagree {
        one: format!("the members that answered the check (etcd cluster={checked:x})"),
        other: format!("a member that answered the take (etcd cluster={answered:x})"),
    }
}

/// The mutex's value; a panic elsewhere while it was held leaves a value
/// that is still whole (every write is one assignment).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A node id taken: the previous holder's high-water, and the one the take
/// recorded for this holder.
struct Taken {
    node_id: u64,
    previous_ms: u64,
    resume_from: super::ResumeFrom,
    recorded_ms: u64,
    /// The revision the take wrote the high-water at.
    hw_revision: i64,
    /// `<prefix>/layout` as the take compared or wrote it.
    layout: Vec<u8>,
    /// `<prefix>/fleet` as the take compared or wrote it.
    fleet: Vec<u8>,
    /// `<prefix>/generation` as the take compared or wrote it.
    generation: u64,
}

/// A call that failed after etcd answered this take's first read: etcd is
/// there, only slow or busy (a start waits for it as for contention, not
/// the short deadline of an etcd that never answered).
fn after_an_answer(e: EtcdError) -> AcquireError {
    match e {
        EtcdError::Unreachable { .. } => AcquireError::Registry(RegistryError::Failed(Box::new(e))),
        e => e.into(),
    }
}

/// Which high-water records a take believes.
#[derive(Debug, Clone, Copy)]
enum Trust {
    /// etcd was never restored: every record is the last its holder wrote.
    All,
    /// etcd was restored from a snapshot at some time (its status now):
    /// only records taken since the last restore (their stamp descends
    /// from this status).
    StampedSince(Status),
    /// etcd went back below a revision this node saw: no record.
    Nothing,
    /// A restore is recorded at `<prefix>/restored`, written at this
    /// revision: only records whose take read a revision at or after it.
    StampedAfter(i64),
}

impl Trust {
    /// Whether a record stamped `stamp` (its take's status, if any) is the
    /// last its holder wrote.
    fn believes(&self, stamp: Option<&Status>) -> bool {
        match self {
            Trust::All => true,
            Trust::StampedSince(now) => stamp.is_some_and(|then| now.descends_from(then)),
            Trust::Nothing => false,
            Trust::StampedAfter(revision) => stamp.is_some_and(|then| then.revision >= *revision),
        }
    }
}

/// `<prefix>/taken/<id>`'s value (also `<prefix>/restored`'s and
/// `<prefix>/confirmed`'s): the status of etcd read by the take, and the
/// etcd cluster it was read in (see [`copied_from`]).
fn stamp_text(status: &Status, cluster_id: u64) -> String {
    format!(
        "revision {} raft_index {} cluster {cluster_id:x}",
        status.revision, status.raft_index
    )
}

/// The etcd cluster id (hex) a stamp names (`None`: a stamp of an earlier
/// version).
fn stamp_cluster(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?;
    let mut words = text.split_whitespace().skip(4);
    match (words.next()?, words.next()?) {
        ("cluster", id) => Some(id),
        _ => None,
    }
}

/// The stamp of a take that could not read etcd's status: believed by no
/// restore check, and still a mark that the id was taken.
const UNKNOWN_STAMP: &str = "taken (etcd status unknown)";

/// [`UNKNOWN_STAMP`] with the cluster it was written in.
fn unknown_stamp(cluster_id: u64) -> String {
    format!("{UNKNOWN_STAMP} cluster {cluster_id:x}")
}

/// A stamp's status (`None`: absent, or not one).
fn parse_stamp(value: &[u8]) -> Option<Status> {
    let text = std::str::from_utf8(value).ok()?;
    let mut words = text.split_whitespace();
    match (words.next()?, words.next()?, words.next()?, words.next()?) {
        ("revision", revision, "raft_index", index) => Some(Status {
            revision: revision.parse().ok()?,
            raft_index: index.parse().ok()?,
        }),
        _ => None,
    }
}

/// The layout record, the held ids and every id's high-water: one range
/// over the prefix, served by the member asked without a round of the
/// cluster (possibly stale: the take's transaction compares all it relies
/// on).
async fn read_cluster(client: &Client, prefix: &str) -> Result<(Vec<Kv>, Header), AcquireError> {
    Ok(client
        .range_prefix_local_header(format!("{prefix}/").as_bytes())
        .await?)
}

/// How a retired prefix's layout record begins: `retired for <successor>:
/// <the record as it was>`. Every take there compares the layout record, so
/// the nodes of the old layout are refused, whatever their version.
const RETIRED: &str = "retired for ";

/// The successor prefix and the record as it was, of a retired prefix's
/// layout record.
fn parse_retired(record: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(record).ok()?;
    let (successor, was) = text.strip_prefix(RETIRED)?.split_once(": ")?;
    Some((successor.to_string(), was.to_string()))
}

/// A layout change: before the new fleet (under `prefix`) records its
/// layout, checks the previous fleet, retires it and returns the new
/// fleet's floor (no id of it at or before this Unix ms).
///
/// Refused while a node of the previous fleet holds or waits for an id, and
/// when the new layout's ids from now on are not all above every id the
/// previous layout could have made until now or its highest high-water.
/// The retirement rewrites the previous layout record, compared unchanged
/// along with every key under the previous prefix, so a node of the
/// previous fleet that started meanwhile fails it.
///
/// Nodes of the new fleet started together race to retire it: the one
/// whose write fails reads again, finds it retired for this prefix (or a
/// node of the previous fleet running: refused) and goes on. Bounded: a
/// prefix still changing after a few reads is refused.
async fn retire_previous(
    client: &Client,
    prefix: &str,
    previous: &PreviousFleet,
    claim: &Claim,
    before: BeforeRetiring<'_>,
) -> Result<(u64, Option<String>, u64), AcquireError> {
    let mut reads = 1;
    loop {
        match retire_previous_once(client, prefix, previous, claim, before).await {
            Err(AcquireError::PreviousChanged { .. }) if reads < 3 => reads += 1,
            done => return done,
        }
    }
}

/// One read, checks and conditional retirement of [`retire_previous`].
async fn retire_previous_once(
    client: &Client,
    prefix: &str,
    previous: &PreviousFleet,
    claim: &Claim,
    before: BeforeRetiring<'_>,
) -> Result<(u64, Option<String>, u64), AcquireError> {
    let old = &previous.prefix;
    let under = format!("{old}/");
    let (kvs, header) = client.range_prefix_header(under.as_bytes()).await?;
    let layout_key = format!("{old}/layout");
    let Some(record) = kvs.iter().find(|kv| kv.key == layout_key.as_bytes()) else {
        return Err(AcquireError::PreviousMissing {
            previous: old.clone(),
        });
    };
    // A copy of another cluster's fleet is carried nowhere: the fleet
    // may run where it was copied from.
    let previous_fleet = kvs
        .iter()
        .find(|kv| kv.key == format!("{old}/fleet").as_bytes())
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
    copy_check(
        old,
        &kvs,
        before.registered,
        before.registered_at,
        header.cluster_id,
        &previous_fleet.as_deref().into_iter().collect::<Vec<_>>(),
        || None,
        None,
    )?;
    let (old_record, retired) = match parse_retired(&record.value) {
        Some((successor, was)) if successor == prefix => (was, true),
        Some((successor, _)) => {
            return Err(AcquireError::PreviousRetired {
                previous: old.clone(),
                successor,
                prefix: prefix.to_string(),
            });
        }
        None => (String::from_utf8_lossy(&record.value).into_owned(), false),
    };
    let live = [format!("{old}/node/"), format!("{old}/queue/")];
    if let Some(kv) = kvs
        .iter()
        .find(|kv| live.iter().any(|p| kv.key.starts_with(p.as_bytes())))
    {
        return Err(AcquireError::PreviousRunning {
            previous: old.clone(),
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            holder: String::from_utf8_lossy(&kv.value).into_owned(),
        });
    }
    let unreadable = |key: &[u8], value: &[u8]| AcquireError::PreviousUnreadable {
        previous: old.clone(),
        key: String::from_utf8_lossy(key).into_owned(),
        value: String::from_utf8_lossy(value).into_owned(),
    };
    let old_layout = old_record
        .split_once("; node id in field")
        .and_then(|(spec, _)| shardflake::preset::resolve(spec).ok())
        .ok_or_else(|| unreadable(&record.key, old_record.as_bytes()))?;
    let hw_prefix = format!("{old}/hw/");
    let mut until_ms = claim.now_ms;
    for kv in kvs
        .iter()
        .filter(|kv| kv.key.starts_with(hw_prefix.as_bytes()))
    {
        let ms = std::str::from_utf8(&kv.value)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| unreadable(&kv.key, &kv.value))?;
        until_ms = until_ms.max(ms);
    }
    let change = LayoutChange::new(&old_layout, until_ms, &previous.layout, claim.now_ms);
    // The same layout (a fleet moved to another prefix): its ids are above
    // once every clock is past the old fleet's highest high-water, which
    // every take of the new fleet waits out (within window +
    // max_resume_wait, as for any record).
    let moved = old_record.as_bytes() == claim.layout
        && change
            .unsafe_until_ms
            .is_some_and(|ms| ms <= claim.now_ms.saturating_add(claim.max_ahead_ms));
    if !change.is_safe() && !moved {
        let advice = match change.latest_epoch_ms {
            Some(epoch) => format!(
                "an epoch at or before {epoch} ms ({}) with these fields and tick would be above",
                shardflake::timestamp::rfc3339_ms(epoch)
            ),
            None => {
                "no epoch with these fields and tick gets above: widen the time field".to_string()
            }
        };
        return Err(AcquireError::BelowPrevious {
            previous: old.clone(),
            detail: format!(
                "its layout {old_record:?} could reach id {} until {}, this layout's smallest id now is {}; {advice} (`shardflake plan --from OLD --to NEW`)",
                change.old_max_id,
                shardflake::timestamp::rfc3339_ms(until_ms),
                change.new_min_id,
            ),
        });
    }
    let carried = kvs
        .iter()
        .find(|kv| kv.key == format!("{old}/fleet").as_bytes())
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
    let floor = change.unsafe_until_ms.unwrap_or(until_ms);
    // What the new fleet's take would refuse, refused before the previous
    // fleet is retired: refused after, the fleet had no place to run
    // (review E5).
    before.check(prefix, old, carried.as_deref(), floor, claim)?;
    if !retired {
        let value = format!("{RETIRED}{prefix}: {old_record}").into_bytes();
        let answer = client
            .txn(
                &[
                    Compare::ValueIs(layout_key.clone().into_bytes(), record.value.clone()),
                    Compare::NoneWrittenAfter(under.into_bytes(), header.revision),
                ],
                &[Op::Put(layout_key.into_bytes(), value, 0)],
                &[],
            )
            .await
            .map_err(after_an_answer)?;
        if !answer.succeeded {
            return Err(AcquireError::PreviousChanged {
                previous: old.clone(),
            });
        }
        tracing::warn!(
            previous = %old,
            "retired the previous fleet's prefix {old}: its nodes are refused there from now on"
        );
    }
    let generation = read_generation(&kvs, old).saturating_add(1);
    Ok((floor, carried, generation))
}

/// What a layout change's first take checks before it retires the
/// previous fleet: whatever the take that follows would refuse.
#[derive(Clone, Copy)]
struct BeforeRetiring<'a> {
    /// The fleets registered in the cluster, as the take read them, and
    /// the revision they were read at.
    registered: &'a [Kv],
    registered_at: i64,
    /// The fleet id of this node's state file.
    expected: Option<&'a str>,
    /// The etcd cluster of the take.
    cluster_id: u64,
}

impl BeforeRetiring<'_> {
    /// Refuses the change (under `prefix`, from `old`) as the take would:
    /// a state file of another fleet than the one carried, a registered
    /// fleet whose ids the new one could make, a floor further ahead of
    /// this clock than the node may wait.
    fn check(
        &self,
        prefix: &str,
        old: &str,
        carried: Option<&str>,
        floor: u64,
        claim: &Claim,
    ) -> Result<(), AcquireError> {
        if let Some(expected) = self.expected
            && carried != Some(expected)
        {
            return Err(AcquireError::FleetMissing {
                prefix: prefix.to_string(),
                expected: expected.to_string(),
                floor_ms: claim.now_ms.saturating_add(claim.max_ahead_ms),
            });
        }
        // A fleet that carries no id (an earlier version's) mints one,
        // which no registration names.
        let fleet = carried.unwrap_or_default().as_bytes();
        check_registered(
            self.registered,
            prefix,
            fleet,
            &claim.layout,
            Some(old),
            self.cluster_id,
        )?;
        let ahead_ms = floor.saturating_sub(claim.now_ms);
        if ahead_ms > claim.max_ahead_ms {
            return Err(AcquireError::HighWaterAhead {
                whose: format!("of the layout change from {old} (its fleet's highest high-water)"),
                high_water_ms: floor,
                ahead: Duration::from_millis(ahead_ms),
                limit: Duration::from_millis(claim.max_ahead_ms),
            });
        }
        Ok(())
    }
}

/// Where an etcd cluster's fleets are registered, one key per fleet id
/// (`<FLEETS><fleet id>` = `prefix <prefix>` and `layout <layout record>`
/// on two lines): every take reads them all and refuses a fleet whose ids
/// a registered fleet under another prefix could make too (two fleets of
/// one layout on one cluster took the same node ids and issued the same
/// ids). Outside every prefix, so a user needs readwrite here as well.
///
/// No leading `/`: every prefix starts with one, so no `etcdctl del
/// --prefix` of a prefix, or of a string a prefix begins with, deletes the
/// registrations (`OLD_FLEETS` began with `/shardflake`).
pub const FLEETS: &str = "shardflake.fleets/";

/// Where earlier versions registered fleets. Still read, and where it
/// holds a fleet its entry is kept in step (their nodes read only this).
pub const OLD_FLEETS: &str = "/shardflake.fleets/";

/// `<FLEETS><fleet id>`.
pub fn fleet_registry_key(fleet: &[u8]) -> Vec<u8> {
    [FLEETS.as_bytes(), fleet].concat()
}

/// The fleet id a registration's key names, in either place.
fn registration_id(key: &[u8]) -> Option<&[u8]> {
    key.strip_prefix(FLEETS.as_bytes())
        .or_else(|| key.strip_prefix(OLD_FLEETS.as_bytes()))
}

/// The registrations in both places (`local`: served by the member asked,
/// possibly stale), and a revision both reads are at or after: what a
/// write compares none written after ([`registrations_unchanged`]).
async fn read_registrations(client: &Client, local: bool) -> Result<(Vec<Kv>, i64), EtcdError> {
    let read = |place: &'static str| async move {
        if local {
            client.range_prefix_local_header(place.as_bytes()).await
        } else {
            client.range_prefix_header(place.as_bytes()).await
        }
    };
    let (new, old) = tokio::join!(read(FLEETS), read(OLD_FLEETS));
    let ((mut kvs, a), (old, b)) = (new?, old?);
    kvs.extend(old);
    Ok((kvs, a.revision.min(b.revision)))
}

/// No registration written, in either place, after `revision`.
fn registrations_unchanged(revision: i64) -> [Compare; 2] {
    [FLEETS, OLD_FLEETS].map(|place| Compare::NoneWrittenAfter(place.as_bytes().to_vec(), revision))
}

/// Each fleet's registration: of the two places, the one written last.
fn latest_registrations(registered: &[Kv]) -> Vec<(&[u8], &Kv)> {
    let mut latest: HashMap<&[u8], &Kv> = HashMap::new();
    for kv in registered {
        let Some(id) = registration_id(&kv.key) else {
            continue;
        };
        let entry = latest.entry(id).or_insert(kv);
        if kv.mod_revision > entry.mod_revision {
            *entry = kv;
        }
    }
    let mut latest: Vec<_> = latest.into_iter().collect();
    latest.sort_by_key(|(id, _)| *id);
    latest
}

/// A registration's value: the fleet's prefix, its layout record and the
/// etcd cluster it registered in (hex; see [`copied_from`]).
fn registration(prefix: &str, layout: &[u8], cluster_id: u64) -> Vec<u8> {
    format!(
        "prefix {prefix}\nlayout {}\n{REGISTERED_IN}{cluster_id:x}",
        String::from_utf8_lossy(layout)
    )
    .into_bytes()
}

/// How a registration's line naming its etcd cluster begins (absent in
/// an earlier version's).
const REGISTERED_IN: &str = "cluster ";

/// The etcd cluster id (hex) a registration names (`None`: an earlier
/// version's).
fn registration_cluster(value: &[u8]) -> Option<&str> {
    std::str::from_utf8(value)
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(REGISTERED_IN))
}

/// A registration's prefix and layout record (`None`: it does not read).
fn parse_registration(value: &[u8]) -> Option<(String, String)> {
    let mut lines = std::str::from_utf8(value).ok()?.lines();
    let prefix = lines.next()?.strip_prefix("prefix ")?;
    let layout = lines.next()?.strip_prefix("layout ")?;
    Some((prefix.to_string(), layout.to_string()))
}

/// How the third line of a registration `fleet move --to-etcd` leaves in
/// the cluster the fleet left begins: `moved to <prefix> on etcd
/// cluster=<id> (<endpoints>)`. It outlives a delete of the old prefix,
/// so a node started there is told where the fleet went.
const MOVED_TO: &str = "moved to ";

/// A registration marked as moved to `to` (another cluster).
fn moved_registration(prefix: &str, layout: &[u8], cluster_id: u64, to: &str) -> Vec<u8> {
    let mut value = registration(prefix, layout, cluster_id);
    value.extend_from_slice(format!("\n{MOVED_TO}{to}").as_bytes());
    value
}

/// Where a registration says its fleet moved (`None`: it did not).
fn registration_moved_to(value: &[u8]) -> Option<String> {
    std::str::from_utf8(value)
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(MOVED_TO))
        .map(str::to_string)
}

/// Whether fleets with these two layout records may make one id. Only the
/// same layout with a fixed field that both fix to different values
/// (`--field datacenter=1` and `=2`) keeps two fleets' ids apart: ids of
/// different layouts meet at some time (an epoch 15 s later makes the ids
/// of 15 s before), and are not compared.
pub fn may_share_ids(a: &str, b: &str) -> bool {
    let parts = |record: &str| -> (String, HashMap<String, String>) {
        let (spec, rest) = record
            .split_once("; node id in field")
            .unwrap_or((record, ""));
        let fixed = rest
            .split_once("; fixed fields ")
            .map(|(_, f)| {
                f.split(", ")
                    .filter_map(|nv| nv.split_once('='))
                    .map(|(n, v)| (n.to_string(), v.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        (spec.to_string(), fixed)
    };
    let ((spec_a, fixed_a), (spec_b, fixed_b)) = (parts(a), parts(b));
    let told_apart = spec_a == spec_b
        && fixed_a
            .iter()
            .any(|(name, v)| fixed_b.get(name).is_some_and(|w| w != v));
    !told_apart
}

/// Checks fleet `fleet` with `layout` under `prefix` against the fleets
/// registered in the cluster (`registered`: the keys under [`FLEETS`] and
/// [`OLD_FLEETS`]); returns the registrations to write (key, value): under
/// [`FLEETS`] where it does not hold it as it is, and under
/// [`OLD_FLEETS`] where an earlier version's entry for it differs.
/// `moved_from`: the prefix a move or layout change carries this fleet
/// from, whose registration it takes over.
///
/// Refused: this fleet registered under another prefix (one fleet, one
/// place), and any other fleet under another prefix whose ids this one
/// could make. Another fleet registered under this prefix was here
/// before (the prefix's keys deleted, or this read older than its fleet
/// key): the take compares the fleet key, as for any take on a prefix.
#[allow(clippy::type_complexity)] // (key, value) pairs, read at once
fn check_registered(
    registered: &[Kv],
    prefix: &str,
    fleet: &[u8],
    layout: &[u8],
    moved_from: Option<&str>,
    cluster_id: u64,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>, AcquireError> {
    let ours = String::from_utf8_lossy(fleet).into_owned();
    let layout_text = String::from_utf8_lossy(layout).into_owned();
    for (id, kv) in latest_registrations(registered) {
        let (their_prefix, their_layout) = parse_registration(&kv.value).unwrap_or_else(|| {
            (
                "(unreadable)".to_string(),
                String::from_utf8_lossy(&kv.value).into_owned(),
            )
        });
        if id == fleet {
            if their_prefix != prefix && moved_from != Some(their_prefix.as_str()) {
                return Err(AcquireError::FleetElsewhere {
                    fleet: ours,
                    registered: their_prefix,
                    prefix: prefix.to_string(),
                });
            }
        } else if their_prefix != prefix
            && moved_from != Some(their_prefix.as_str())
            && may_share_ids(&layout_text, &their_layout)
        {
            return Err(AcquireError::FleetOverlaps(Box::new(FleetOverlap {
                prefix: prefix.to_string(),
                layout: layout_text,
                other: String::from_utf8_lossy(id).into_owned(),
                other_prefix: their_prefix,
                other_layout: their_layout,
                moved_to: registration_moved_to(&kv.value),
            })));
        }
    }
    let wanted = registration(prefix, layout, cluster_id);
    let holds = |key: &[u8]| {
        registered
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| kv.value.as_slice())
    };
    let mut writes = Vec::new();
    let key = fleet_registry_key(fleet);
    if holds(&key) != Some(&wanted[..]) {
        writes.push((key, wanted.clone()));
    }
    let old_key = [OLD_FLEETS.as_bytes(), fleet].concat();
    if holds(&old_key).is_some_and(|v| v != wanted) {
        writes.push((old_key, wanted));
    }
    Ok(writes)
}

/// The fleet registered under `prefix` (its id, the revision its
/// registration was last written at, and where it moved to another
/// cluster, if it did; the earliest, if several), among the
/// registrations `registered`.
///
/// A registration is written in the same transaction as the fleet id it
/// names, and rewritten only by a take that compares that fleet id, so
/// where a read of the prefix at a revision at or after the registration's
/// finds no fleet id, the fleet id was deleted since. A registration newer
/// than that read may be a fleet another node has just started here.
fn registered_under(registered: &[Kv], prefix: &str) -> Option<(String, i64, Option<String>)> {
    latest_registrations(registered)
        .into_iter()
        .filter_map(|(id, kv)| {
            let (their_prefix, _) = parse_registration(&kv.value)?;
            (their_prefix == prefix).then(|| {
                (
                    String::from_utf8_lossy(id).into_owned(),
                    kv.mod_revision,
                    registration_moved_to(&kv.value),
                )
            })
        })
        .min_by_key(|(_, at, _)| *at)
}

/// `<prefix>/generation` among `kvs` (absent, or not a number: 0).
fn read_generation(kvs: &[Kv], prefix: &str) -> u64 {
    let key = format!("{prefix}/generation");
    kvs.iter()
        .find(|kv| kv.key == key.as_bytes())
        .and_then(|kv| std::str::from_utf8(&kv.value).ok())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What a place holds of its fleet, from a take's first read.
struct Place {
    prefix: String,
    fleet: Option<String>,
    generation: u64,
    retired: bool,
    /// `<prefix>/cluster`: the etcd cluster id (hex) the fleet's records
    /// were written in (its first take, or the `fleet move` that brought
    /// it); absent for a fleet of an earlier version until its next take.
    cluster: Option<String>,
    /// `<prefix>/confirmed`: the status of etcd when an operator confirmed
    /// the place after a restore (`shardflake fleet confirm`), and the
    /// revision it was written at.
    confirmed: Option<(Option<Status>, i64)>,
}

impl Place {
    fn read(prefix: &str, kvs: &[Kv]) -> Place {
        let find = |name: &str| {
            let key = format!("{prefix}/{name}");
            kvs.iter().find(|kv| kv.key == key.as_bytes())
        };
        Place {
            prefix: prefix.to_string(),
            fleet: find("fleet").map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
            generation: read_generation(kvs, prefix),
            retired: find("layout").is_some_and(|kv| parse_retired(&kv.value).is_some()),
            cluster: find(CLUSTER).map(|kv| String::from_utf8_lossy(&kv.value).into_owned()),
            confirmed: find(CONFIRMED).map(|kv| (parse_stamp(&kv.value), kv.mod_revision)),
        }
    }

    /// The refusal of a node whose state file remembers a later
    /// generation of the fleet this place holds (a retired place is
    /// refused by the take, naming where the fleet went).
    fn behind(
        &self,
        remembered: u64,
        expected: &Option<String>,
        last_place: Option<&str>,
    ) -> Option<AcquireError> {
        let fleet = self
            .fleet
            .as_ref()
            .filter(|f| Some(*f) == expected.as_ref())?;
        (!self.retired && self.generation < remembered).then(|| {
            AcquireError::GenerationBehind(Box::new(GenerationBehind {
                prefix: self.prefix.clone(),
                fleet: fleet.clone(),
                found: self.generation,
                remembered,
                last_place: last_place.unwrap_or("not recorded").to_string(),
            }))
        })
    }

    /// Whether an operator confirmed this place since the last restore:
    /// the confirmation was written at or after the restore's record
    /// (`marker`, rewritten by the first take that sees a later restore),
    /// or etcd's history now descends from the confirmation's (no restore
    /// since; a member that lags the one that answered the confirmation
    /// may not show it yet).
    fn confirmed(&self, status: Option<Status>, marker: Option<i64>) -> bool {
        let Some((stamp, at)) = &self.confirmed else {
            return false;
        };
        marker.is_some_and(|m| *at >= m)
            || matches!((stamp, status), (Some(then), Some(now)) if now.descends_from(then))
    }

    fn describe(&self) -> String {
        match &self.fleet {
            Some(f) => format!("it holds fleet {f}, generation {}", self.generation),
            None => "it holds no fleet yet".into(),
        }
    }
}

/// `<prefix>/<CONFIRMED>`: an operator's word that a restored place is
/// still its fleet's (`shardflake fleet confirm`).
const CONFIRMED: &str = "confirmed";

/// `<prefix>/<CLUSTER>`: the etcd cluster id (hex) the fleet's records
/// were written in. A take in another cluster is refused
/// ([`AcquireError::FleetCopied`]): the records are a copy (a snapshot
/// restored into another cluster), and the fleet may run where they were
/// copied from. A copy of a fleet's first seconds holds fewer revisions
/// than the copy's new raft log has entries, so [`Status::restored`]
/// cannot see it; this record can. Written by a take that finds none, and
/// by `fleet move` at the new place.
pub(crate) const CLUSTER: &str = "cluster";

/// Where the records of `prefix` (`kvs`, a read of the prefix, and
/// `registered`, the cluster's registrations) say they were written in
/// another etcd cluster than `here`: that cluster (hex) and the record
/// that names it. Each record a take reads or writes to decide names its
/// cluster: `<prefix>/cluster`, every `<prefix>/taken/<id>` stamp,
/// `<prefix>/restored` and `<prefix>/confirmed`, and the registration of
/// the fleet under `prefix` or of `fleets` (the place's and the node's).
/// So a copy (a snapshot restored into another cluster) is told by any
/// one of them: deleting one (`etcdctl del <prefix>/cluster`, or the whole
/// prefix, which leaves the registrations) does not make it an original.
/// Records of an earlier version, which name no cluster, tell nothing.
fn copied_from(
    prefix: &str,
    kvs: &[Kv],
    registered: &[Kv],
    here: u64,
    fleets: &[&str],
) -> Option<(String, String)> {
    let here = format!("{here:x}");
    let cluster_key = format!("{prefix}/{CLUSTER}");
    if let Some(kv) = kvs.iter().find(|kv| kv.key == cluster_key.as_bytes())
        && kv.value != here.as_bytes()
    {
        let recorded = String::from_utf8_lossy(&kv.value).into_owned();
        return Some((recorded, format!("its {cluster_key}")));
    }
    let stamped = [
        format!("{prefix}/taken/"),
        format!("{prefix}/restored"),
        format!("{prefix}/{CONFIRMED}"),
    ];
    let elsewhere = |named: Option<&str>| named.filter(|c| *c != here).map(str::to_string);
    for kv in kvs {
        let is_stamp = stamped.iter().any(|k| kv.key.starts_with(k.as_bytes()));
        if is_stamp && let Some(recorded) = elsewhere(stamp_cluster(&kv.value)) {
            return Some((recorded, String::from_utf8_lossy(&kv.key).into_owned()));
        }
    }
    for (id, kv) in latest_registrations(registered) {
        let ours = fleets.iter().any(|f| f.as_bytes() == id)
            || parse_registration(&kv.value).is_some_and(|(p, _)| p == prefix);
        if ours && let Some(recorded) = elsewhere(registration_cluster(&kv.value)) {
            return Some((recorded, String::from_utf8_lossy(&kv.key).into_owned()));
        }
    }
    None
}

/// The fleet id `<prefix>/fleet` holds where the cluster's registrations
/// (`registered`, read at revision `registered_at`) hold none for it. A
/// fleet id is written with its registration (a fleet's first take, `fleet
/// move`), so one without is a copy whose registration was deleted (or
/// one deleted here by hand, or a prefix of a version before 24f4003).
/// A read of the registrations older than the fleet id (a lagging member)
/// tells nothing.
fn unregistered(prefix: &str, kvs: &[Kv], registered: &[Kv], registered_at: i64) -> Option<String> {
    let key = format!("{prefix}/fleet");
    let fleet = kvs.iter().find(|kv| kv.key == key.as_bytes())?;
    let known = latest_registrations(registered)
        .iter()
        .any(|(id, _)| *id == fleet.value.as_slice());
    (!known && registered_at >= fleet.mod_revision)
        .then(|| String::from_utf8_lossy(&fleet.value).into_owned())
}

/// The keys under `prefix` a fleet leaves (all but the queue keys of
/// nodes waiting to take, which go with their leases, the restore and
/// confirmation records, and the ticket servers' marks under
/// `<prefix>/tickets/`, which `serve --tickets` writes with or without a
/// fleet), at most a few named, and how many in all: `<key>, <key>, ...
/// (N records)`; empty where there are none.
fn leftover_records(prefix: &str, kvs: &[Kv]) -> String {
    let queue = format!("{prefix}/queue/");
    let tickets = format!("{prefix}/tickets/");
    // etcd's own state as a take or `fleet confirm` saw it, written before
    // any fleet id (a restore seen, a confirmation of an empty prefix);
    // [`copied_from`] refuses one naming another cluster.
    let status = [
        format!("{prefix}/restored"),
        format!("{prefix}/{CONFIRMED}"),
    ];
    let keys: Vec<String> = kvs
        .iter()
        .filter(|kv| {
            !kv.key.starts_with(queue.as_bytes())
                && !kv.key.starts_with(tickets.as_bytes())
                && !status.iter().any(|k| kv.key == k.as_bytes())
        })
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    match keys.len() {
        0 => String::new(),
        n => {
            let named: Vec<&str> = keys.iter().take(4).map(String::as_str).collect();
            format!("{} ({n} records)", named.join(", "))
        }
    }
}

/// How many keys [`other_places`] reads at most: a cluster with more is
/// searched that far (logged), so a new fleet's first take stays bounded.
const PLACES_SCAN_LIMIT: usize = 100_000;
/// How many other fleets' places [`other_places`] returns at most.
const PLACES_LIMIT: usize = 64;

/// The prefixes other than `prefix` that hold a fleet's records (a key
/// ending `/fleet`, `/cluster` or `/layout`), found by a keys-only read of
/// the whole keyspace, in pages, at most [`PLACES_SCAN_LIMIT`] keys.
/// A registration names a fleet's prefix, but one deleted (a copy's, by
/// hand) leaves its records unnamed: a new fleet finds them here.
async fn other_places(client: &Client, prefix: &str) -> Result<Vec<String>, AcquireError> {
    const PAGE: usize = 2_000;
    let mut places: Vec<String> = Vec::new();
    let mut from = vec![0u8];
    let mut read = 0;
    loop {
        let keys = match client.keys_from(&from, PAGE as i64).await {
            // A user allowed only its prefix and the registrations sees no
            // other place; the registrations are all it can check.
            Err(EtcdError::Auth(error)) => {
                tracing::warn!(%error, "etcd lets this user read only its prefix: a new fleet looks for other fleets by their registrations alone");
                break;
            }
            keys => keys?,
        };
        read += keys.len();
        for key in &keys {
            let Ok(key) = std::str::from_utf8(key) else {
                continue;
            };
            let place = ["/fleet", "/cluster", "/layout"]
                .iter()
                .find_map(|suffix| key.strip_suffix(suffix));
            if let Some(place) = place
                && place != prefix
                && !place.is_empty()
                && !places.iter().any(|p| p == place)
            {
                places.push(place.to_string());
            }
        }
        let Some(last) = keys.last() else { break };
        if keys.len() < PAGE || places.len() >= PLACES_LIMIT {
            break;
        }
        if read >= PLACES_SCAN_LIMIT {
            tracing::warn!(
                read,
                "a new fleet's first take looked for other fleets' records in the first {read} keys of etcd only"
            );
            break;
        }
        from = last.clone();
        from.push(0);
    }
    places.truncate(PLACES_LIMIT);
    Ok(places)
}

/// The copy check every command that reads a fleet's place to take,
/// carry, retire or confirm it runs (a take, `--previous-prefix`, `fleet
/// move`, `fleet confirm`): `prefix`'s records (`kvs`, read in cluster
/// `here`, with the cluster's registrations `registered`, read at
/// `registered_at`) are refused where any names another cluster
/// ([`copied_from`]; `fleets`: the fleet ids the caller knows), where the
/// caller's own evidence tells (`also`: a take's state file), and where
/// the prefix holds a fleet id the cluster does not register
/// ([`unregistered`]), but for `took_here`: the fleet id the caller's own
/// state file (or process) took at this very place, whose take registers
/// it again.
#[allow(clippy::too_many_arguments)] // one check, its inputs read at once
fn copy_check(
    prefix: &str,
    kvs: &[Kv],
    registered: &[Kv],
    registered_at: i64,
    here: u64,
    fleets: &[&str],
    also: impl FnOnce() -> Option<(String, String)>,
    took_here: Option<&str>,
) -> Result<(), AcquireError> {
    if let Some((recorded, evidence)) =
        copied_from(prefix, kvs, registered, here, fleets).or_else(also)
    {
        return Err(AcquireError::FleetCopied(Box::new(FleetCopied {
            prefix: prefix.to_string(),
            recorded,
            here: format!("{here:x}"),
            evidence,
        })));
    }
    match unregistered(prefix, kvs, registered, registered_at) {
        Some(fleet) if Some(fleet.as_str()) != took_here => Err(AcquireError::FleetUnregistered {
            prefix: prefix.to_string(),
            fleet,
            here: format!("{here:x}"),
        }),
        _ => Ok(()),
    }
}

/// The etcd cluster id (hex) a state file's registry line names
/// (`etcd cluster=<id> prefix=<prefix>`; `None`: a static one).
fn state_file_cluster(registry: &str) -> Option<String> {
    let rest = registry.strip_prefix("etcd cluster=")?;
    rest.split_whitespace().next().map(str::to_string)
}

/// What a take knows of its fleet besides the claim.
struct Fleet {
    /// The cluster the take's first read was answered by: a take
    /// answered by another (an endpoint of another cluster, failed over
    /// to) is refused.
    cluster_id: u64,
    /// The fleet id this node belongs to (its state file, or an earlier
    /// take of this process).
    expected: Option<String>,
    /// A fleet replacing another (`--previous-prefix`): the previous
    /// fleet's id, carried over.
    carried: Option<String>,
    /// The fleet's generation at this place: as read, or, for a fleet
    /// replacing another, the previous fleet's plus one (written with the
    /// carried fleet id).
    generation: u64,
    /// A fleet replacing another: no id of it at or before this Unix ms.
    floor: Option<u64>,
    /// The fleets registered in the cluster (the keys under [`FLEETS`] and
    /// [`OLD_FLEETS`]), read at or after this revision.
    registered: Vec<Kv>,
    registered_at: i64,
    /// The revision the take's view of the prefix (its fleet id) was
    /// read at: the first read's, then each failed take's.
    read_at: i64,
    /// The prefix of the fleet this one replaces (`--previous-prefix`).
    moved_from: Option<String>,
}

/// A new fleet id: 128 random bits, hex.
fn mint_fleet_id(lease: LeaseId) -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u64| {
        // Keys drawn from the OS's randomness for each process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_i64(lease);
        h.write_u128(nanos);
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// The lowest free node id, taken in one transaction that also records its
/// first high-water. Uncontended, the id is the lowest free.
///
/// **Racing nodes queue.** Nodes starting together all read the same free
/// ids and go for the same lowest one; one wins. A node that loses writes
/// `<prefix>/queue/<lease>`, attached to its lease, in the failing
/// transaction itself (no extra round trip) and counts the keys queued
/// before its own (lower create revision). With `k` nodes ahead it goes
/// for the `k`-th lowest free id, which no node ahead of it is going for.
/// As each node ahead takes its id (the take deletes its queue key), the
/// count ahead and the free ids below ours both shrink by one, so the
/// choice holds: a herd of n takes its ids with about one lost race per
/// node, where picking at random among the lowest free ids needed about
/// log(n) rounds. A newcomer stands behind every node queued in its first
/// read. The queue only chooses which id to try; the compares alone keep
/// ids unique. A queue key whose node died waiting goes with its lease
/// (until then, nodes behind it skip one free id).
///
/// The transaction compares the id's high-water with the value read
/// (absent, or exactly those bytes), so the record it writes,
/// [`Claim::first_high_water`] of that value, is past whatever the previous
/// holder recorded: a record that changed since fails the take like a
/// lost race. `claim.layout` must equal `<prefix>/layout`: every take
/// compares it in the same transaction, and a take that read no layout
/// record (the cluster's first node, or a herd starting together on an
/// empty prefix) writes it there, compared absent, so a herd does not spend
/// a raft write per node on the record before racing for ids.
#[allow(clippy::too_many_arguments)] // one call site, each a part of the take
async fn take_lowest(
    client: &Client,
    prefix: &str,
    lease: LeaseId,
    claim: &Claim,
    mut kvs: Vec<Kv>,
    trust: &Trust,
    status: Option<Status>,
    mut fleet: Fleet,
) -> Result<Taken, AcquireError> {
    let floor = fleet.floor;
    let max_id = claim.max_node_id;
    let layout = &claim.layout[..];
    let node_prefix = format!("{prefix}/node/");
    let hw_prefix = format!("{prefix}/hw/");
    let stamp_prefix = format!("{prefix}/taken/");
    let queue_prefix = format!("{prefix}/queue/");
    let queue_key = format!("{queue_prefix}{lease:x}").into_bytes();
    let layout_key = format!("{prefix}/layout").into_bytes();
    let floor_key = format!("{prefix}/floor").into_bytes();
    // A fleet that replaced another layout: no id of it at or before this
    // Unix ms (`{prefix}/floor`, written with its layout record).
    let read_floor = |kvs: &[Kv]| -> Result<u64, AcquireError> {
        kvs.iter()
            .find(|kv| kv.key == floor_key)
            .map_or(Ok(0), |kv| {
                let key = String::from_utf8_lossy(&floor_key).into_owned();
                read_high_water(0, &key, Some(&kv.value))
            })
    };
    let mut floor_ms = floor.unwrap_or(0).max(read_floor(&kvs)?);
    let fleet_key = format!("{prefix}/fleet").into_bytes();
    let generation_key = format!("{prefix}/generation").into_bytes();
    let cluster_key = format!("{prefix}/{CLUSTER}").into_bytes();
    let read_fleet = |kvs: &[Kv]| {
        kvs.iter()
            .find(|kv| kv.key == fleet_key)
            .map(|kv| kv.value.clone())
    };
    let mut recorded_fleet = read_fleet(&kvs);
    // The fleet id this take writes where none is recorded: the previous
    // fleet's, or a new one.
    let new_fleet = fleet
        .carried
        .clone()
        .unwrap_or_else(|| mint_fleet_id(lease))
        .into_bytes();
    // A node that belongs to a fleet takes an id only where its fleet id
    // is recorded, or where a move (`--previous-prefix`) carries it.
    let (expected_fleet, carried_fleet) = (fleet.expected.clone(), fleet.carried.clone());
    let check_fleet = |recorded: &Option<Vec<u8>>| -> Result<(), AcquireError> {
        let Some(expected) = &expected_fleet else {
            return Ok(());
        };
        match recorded {
            Some(found) if found == expected.as_bytes() => Ok(()),
            Some(found) => Err(AcquireError::FleetMismatch {
                prefix: prefix.to_string(),
                expected: expected.clone(),
                found: String::from_utf8_lossy(found).into_owned(),
            }),
            None if carried_fleet.as_deref() == Some(expected.as_str()) => Ok(()),
            None => Err(AcquireError::FleetMissing {
                prefix: prefix.to_string(),
                expected: expected.clone(),
                floor_ms: claim.now_ms.saturating_add(claim.max_ahead_ms),
            }),
        }
    };
    // A place its fleet left for another cluster (`fleet move --to-etcd`
    // marks its registration here): whatever was deleted since, its ids
    // are made there, with or without a state file.
    if recorded_fleet.is_none()
        && fleet.carried.is_none()
        && let Some((moved, _, Some(to))) = registered_under(&fleet.registered, prefix)
    {
        return Err(AcquireError::FleetMovedAway {
            prefix: prefix.to_string(),
            fleet: moved,
            to,
        });
    }
    check_fleet(&recorded_fleet)?;
    // Whether a layout record has been seen; once one has, its absence
    // means it was deleted since, a mismatch like another layout.
    let mut seen_layout = false;
    // The record as found, when it is this node's: `None` while absent.
    let mut check_layout = |kvs: &[Kv]| -> Result<Option<Vec<u8>>, AcquireError> {
        let recorded = kvs.iter().find(|kv| kv.key == layout_key);
        let recorded = match recorded {
            // Node records without a layout record: it was deleted (every
            // take that creates a node key finds or writes the layout).
            None if !seen_layout
                && kvs.iter().any(|kv| {
                    kv.key.starts_with(node_prefix.as_bytes())
                        || kv.key.starts_with(hw_prefix.as_bytes())
                }) =>
            {
                return Err(AcquireError::LayoutMissing {
                    prefix: prefix.to_string(),
                    ours: String::from_utf8_lossy(layout).into_owned(),
                });
            }
            None if !seen_layout => return Ok(None),
            None => &[][..],
            Some(kv) => &kv.value[..],
        };
        if recorded == layout {
            seen_layout = true;
            return Ok(Some(recorded.to_vec()));
        }
        if let Some((successor, _)) = parse_retired(recorded) {
            return Err(AcquireError::Retired {
                prefix: prefix.to_string(),
                successor,
            });
        }
        // Written by an earlier version, which left the fixed fields out:
        // this node's layout as far as it can tell. The fleet's nodes keep
        // comparing the record as it is.
        if claim.earlier_layout.as_deref() == Some(recorded) {
            if !seen_layout {
                tracing::warn!(
                    record = %String::from_utf8_lossy(recorded),
                    "{prefix}/layout was written by an earlier version and names no fixed fields: a node with other fixed field values is not refused. Once every node of the fleet runs this version: etcdctl put {prefix}/layout '{}'",
                    String::from_utf8_lossy(layout)
                );
            }
            seen_layout = true;
            return Ok(Some(recorded.to_vec()));
        }
        Err(AcquireError::LayoutMismatch {
            prefix: prefix.to_string(),
            recorded: String::from_utf8_lossy(recorded).into_owned(),
            ours: String::from_utf8_lossy(layout).into_owned(),
        })
    };
    let ids_under = |kvs: &[Kv], under: &str| -> HashMap<u64, Vec<u8>> {
        kvs.iter()
            .filter_map(|kv| {
                let id = std::str::from_utf8(&kv.key)
                    .ok()?
                    .strip_prefix(under)?
                    .parse()
                    .ok()?;
                Some((id, kv.value.clone()))
            })
            .collect()
    };
    // Queue keys among `kvs`: never our own (the first read comes before
    // we queue; later reads ask only for the keys created before ours).
    let queued = |kvs: &[Kv]| {
        kvs.iter()
            .filter(|kv| kv.key.starts_with(queue_prefix.as_bytes()))
            .count()
    };
    let mut layout_present = check_layout(&kvs)?;
    // Every id's record as first read; a record that changed since (its id
    // taken and given back meanwhile) fails the compare below, and the
    // failed take reads it afresh. Lost races return the held ids only,
    // so a herd's answers stay small.
    let mut high_waters = ids_under(&kvs, &hw_prefix);
    let mut stamps = ids_under(&kvs, &stamp_prefix);
    // What each take sent, to know a committed take whose answer was lost.
    let mut sent: HashMap<u64, Taken> = HashMap::new();
    // Nodes queued ahead of this one; once it has queued, its key's create
    // revision.
    let mut ahead = queued(&kvs);
    let mut queued_at: Option<i64> = None;
    // Ids whose previous holder recorded a high-water further ahead than
    // this node may wait: never written to, never taken (the lowest is
    // named if no other id is left).
    let mut too_far: HashSet<u64> = HashSet::new();
    let mut first_too_far: Option<AcquireError> = None;
    // Each lost race means another node took an id: bounded by the id count.
    for losses in 0..=max_id.saturating_mul(2).min(1 << 20) as u32 {
        // A take that would start a new fleet where the cluster registers
        // one: refused when the prefix was read after the registration (its
        // fleet id deleted since); otherwise the take compares the
        // registrations unchanged since that read, and a failed one reads
        // both again in one transaction.
        let mut registrations_at = fleet.registered_at;
        if recorded_fleet.is_none()
            && fleet.carried.is_none()
            && let Some((registered, at, _)) = registered_under(&fleet.registered, prefix)
        {
            if at <= fleet.read_at {
                tracing::warn!(
                    fleet = %registered,
                    registered_at = at,
                    read_at = fleet.read_at,
                    "{prefix} holds no fleet id, and its fleet was registered before the prefix was read: deleted"
                );
                return Err(AcquireError::FleetDeleted {
                    prefix: prefix.to_string(),
                    fleet: registered,
                    floor_ms: claim.now_ms.saturating_add(claim.max_ahead_ms),
                });
            }
            registrations_at = fleet.read_at;
        }
        let held = ids_under(&kvs, &node_prefix);
        let candidate = match claim.pinned {
            Some(id) => match held.get(&id) {
                Some(holder) => {
                    return Err(AcquireError::PinnedHeld {
                        node_id: id,
                        prefix: prefix.to_string(),
                        holder: String::from_utf8_lossy(holder).into_owned(),
                    });
                }
                _ => id,
            },
            None => {
                let free: Vec<u64> = (0..=max_id)
                    .filter(|c| {
                        !held.contains_key(c) && !sent.contains_key(c) && !too_far.contains(c)
                    })
                    .take(ahead.saturating_add(1))
                    .collect();
                // The free id no node ahead is going for; with fewer free
                // ids than nodes ahead (some may have died waiting), any.
                match free.get(ahead) {
                    Some(&id) => id,
                    None if free.is_empty() => break,
                    None => free[random_below(free.len())],
                }
            }
        };
        let (node, hw) = keys(prefix, candidate);
        let stamp_key = format!("{stamp_prefix}{candidate}");
        let seen = high_waters.get(&candidate);
        let stamp = stamps.get(&candidate).and_then(|v| parse_stamp(v));
        let recorded = read_high_water(candidate, &hw, seen.map(Vec::as_slice))?;
        // Taken before (every take stamps the id, outside `hw/`) and no
        // high-water record: deleted by hand (`etcdctl del --prefix
        // <prefix>/hw/`). Its last holder, killed, or stopped by its
        // failing record, may have stamped as far ahead as its clock ran.
        let hw_deleted = seen.is_none() && stamps.contains_key(&candidate);
        let (previous_ms, resume_from) = if hw_deleted {
            let skew_ms = claim.max_ahead_ms.saturating_sub(claim.window_ms);
            tracing::warn!(
                node_id = candidate,
                "{hw} is missing, but node id {candidate} was taken before ({stamp_key}): its record was deleted, and its last holder may have stamped up to max_resume_wait ({skew_ms} ms) past this clock; waiting that out"
            );
            (claim.now_ms.saturating_add(skew_ms), ResumeFrom::Deleted)
        } else if !trust.believes(stamp.as_ref()) {
            // etcd was restored: the record (or its absence) may be older
            // than what a lost holder stamped since, with its own clock:
            // up to `max_resume_wait` past ours.
            let skew_ms = claim.max_ahead_ms.saturating_sub(claim.window_ms);
            let lost = claim.now_ms.saturating_add(skew_ms);
            tracing::warn!(
                node_id = candidate,
                recorded_ms = recorded,
                "etcd was restored from a snapshot and {hw} was not recorded since: node id {candidate}'s last holder may have stamped up to max_resume_wait ({skew_ms} ms) past this clock; waiting that out"
            );
            (recorded.max(lost), ResumeFrom::Restored)
        } else if recorded == 0 {
            // No record: the id was never used here, or its record was
            // deleted under a holder that may still run until its next
            // record fails. Such a holder stamped at most one window past
            // its clock: resume past ours by as much.
            (
                claim.now_ms.saturating_add(claim.window_ms),
                ResumeFrom::NoRecord,
            )
        } else {
            (recorded, ResumeFrom::Recorded)
        };
        // Past every id of the fleet this one replaced.
        if floor_ms > previous_ms && floor_ms > claim.now_ms {
            tracing::warn!(
                node_id = candidate,
                floor_ms,
                wait_ms = floor_ms - claim.now_ms,
                "{prefix}/floor is ahead of this clock: no id of this fleet is stamped at or before it (a layout change, a `fleet move` or a floor put back after a delete wrote it, past every id the fleet may have made before), so this node waits until its clock passes it"
            );
        }
        let resume_from = if floor_ms > previous_ms {
            ResumeFrom::Floor
        } else {
            resume_from
        };
        let previous_ms = previous_ms.max(floor_ms);
        // Checked before anything is written: a refused take leaves the
        // record as it was.
        let ahead_ms = previous_ms.saturating_sub(claim.now_ms);
        if ahead_ms > claim.max_ahead_ms {
            let e = AcquireError::HighWaterAhead {
                whose: match resume_from {
                    ResumeFrom::Recorded => {
                        format!("recorded in {hw} by node id {candidate}'s previous holder")
                    }
                    other => other.describe(candidate),
                },
                high_water_ms: previous_ms,
                ahead: Duration::from_millis(ahead_ms),
                limit: Duration::from_millis(claim.max_ahead_ms),
            };
            if claim.pinned.is_some() {
                return Err(e);
            }
            tracing::warn!(
                node_id = candidate,
                high_water_ms = previous_ms,
                ahead_ms,
                "skipping node id {candidate}: its previous holder's high-water is further ahead of this clock than this node may wait"
            );
            too_far.insert(candidate);
            first_too_far.get_or_insert(e);
            continue;
        }
        let recorded_ms = claim.first_high_water(previous_ms);
        let hw_unchanged = match seen {
            None => Compare::Absent(hw.clone().into_bytes()),
            Some(v) => Compare::ValueIs(hw.clone().into_bytes(), v.clone()),
        };
        let mut compares = vec![Compare::Absent(node.clone().into_bytes()), hw_unchanged];
        let mut success = vec![
            Op::Put(node.into_bytes(), claim.holder.as_bytes().to_vec(), lease),
            Op::Put(
                hw.clone().into_bytes(),
                recorded_ms.to_string().into_bytes(),
                0,
            ),
        ];
        // The take's stamp: this record is believed after a later restore
        // only while etcd's history still descends from this status. Written
        // by every take (with no status when etcd did not tell it): it says
        // the id was held, so a high-water record deleted later is not read
        // as an id never used.
        success.push(Op::Put(
            stamp_key.clone().into_bytes(),
            status.as_ref().map_or_else(
                || unknown_stamp(fleet.cluster_id).into_bytes(),
                |s| stamp_text(s, fleet.cluster_id).into_bytes(),
            ),
            0,
        ));
        match &layout_present {
            Some(recorded) => {
                compares.push(Compare::ValueIs(layout_key.clone(), recorded.clone()));
            }
            None => {
                compares.push(Compare::Absent(layout_key.clone()));
                success.push(Op::Put(layout_key.clone(), layout.to_vec(), 0));
                if let Some(floor) = floor {
                    success.push(Op::Put(
                        floor_key.clone(),
                        floor.to_string().into_bytes(),
                        0,
                    ));
                }
            }
        }
        match &recorded_fleet {
            Some(recorded) => {
                compares.push(Compare::ValueIs(fleet_key.clone(), recorded.clone()));
            }
            None => {
                compares.push(Compare::Absent(fleet_key.clone()));
                success.push(Op::Put(fleet_key.clone(), new_fleet.clone(), 0));
                // Written with the fleet id, never apart: a fleet carried
                // here by a layout change is one generation on.
                if fleet.generation > 0 {
                    success.push(Op::Put(
                        generation_key.clone(),
                        fleet.generation.to_string().into_bytes(),
                        0,
                    ));
                }
            }
        }
        // The cluster the fleet's records are in, once (a copy of them in
        // another cluster is then refused).
        if !kvs.iter().any(|kv| kv.key == cluster_key) {
            success.push(Op::Put(
                cluster_key.clone(),
                format!("{:x}", fleet.cluster_id).into_bytes(),
                0,
            ));
        }
        // The cluster's fleets as read: none registered since, and this
        // one registered (or its registration brought up to date) with
        // the take.
        let fleet_id = recorded_fleet.as_ref().unwrap_or(&new_fleet);
        let layout_recorded = layout_present.as_deref().unwrap_or(layout);
        let registration = check_registered(
            &fleet.registered,
            prefix,
            fleet_id,
            layout_recorded,
            fleet.moved_from.as_deref(),
            fleet.cluster_id,
        )?;
        compares.extend(registrations_unchanged(registrations_at));
        for (key, value) in registration {
            success.push(Op::Put(key, value, 0));
        }
        let mut failure = match queued_at {
            // Queued: a take leaves the queue; a loss counts who is ahead.
            Some(revision) => {
                success.push(Op::Delete(queue_key.clone()));
                vec![Op::KeysCreatedBefore(
                    queue_prefix.clone().into_bytes(),
                    revision,
                )]
            }
            // Not yet: a loss joins the queue, counted before our key is
            // written (every key there queued before ours).
            None => vec![
                Op::Count(queue_prefix.clone().into_bytes()),
                Op::Put(queue_key.clone(), Vec::new(), lease),
                Op::Get(queue_key.clone()),
            ],
        };
        failure.extend([
            Op::Get(layout_key.clone()),
            Op::Get(floor_key.clone()),
            Op::Get(fleet_key.clone()),
            Op::Get(generation_key.clone()),
            Op::Prefix(node_prefix.clone().into_bytes()),
            Op::Get(hw.clone().into_bytes()),
            Op::Get(stamp_key.clone().into_bytes()),
            Op::Prefix(FLEETS.as_bytes().to_vec()),
            Op::Prefix(OLD_FLEETS.as_bytes().to_vec()),
        ]);
        let answer = client
            .txn(&compares, &success, &failure)
            .await
            .map_err(after_an_answer)?;
        if answer.cluster_id != 0 && answer.cluster_id != fleet.cluster_id {
            return Err(another_cluster_answered(
                fleet.cluster_id,
                answer.cluster_id,
            ));
        }
        let taken = Taken {
            node_id: candidate,
            previous_ms,
            resume_from,
            recorded_ms,
            hw_revision: answer.revision,
            layout: layout_present.clone().unwrap_or_else(|| layout.to_vec()),
            fleet: recorded_fleet.clone().unwrap_or_else(|| new_fleet.clone()),
            generation: fleet.generation,
        };
        if answer.succeeded {
            // How many rounds a herd needed: each lost race is one more
            // raft write before this node is ready.
            tracing::debug!(node_id = candidate, lost_races = losses, "took a node id");
            return Ok(taken);
        }
        sent.insert(candidate, taken);
        let fresh = answer.kvs;
        match queued_at {
            Some(_) => ahead = queued(&fresh),
            None => {
                ahead = answer.counts.first().map_or(0, |&n| n.max(0) as usize);
                queued_at = fresh
                    .iter()
                    .find(|kv| kv.key == queue_key)
                    .map(|kv| kv.create_revision);
            }
        }
        // Lost the race for the id, or the layout record or the id's
        // high-water changed since (or another node wrote the layout record).
        layout_present = check_layout(&fresh)?;
        floor_ms = floor_ms.max(read_floor(&fresh)?);
        recorded_fleet = read_fleet(&fresh);
        check_fleet(&recorded_fleet)?;
        if recorded_fleet.is_some() {
            fleet.generation = read_generation(&fresh, prefix);
        }
        fleet.registered = fresh
            .iter()
            .filter(|kv| registration_id(&kv.key).is_some())
            .cloned()
            .collect();
        fleet.registered_at = answer.revision;
        fleet.read_at = answer.revision;
        match fresh.iter().find(|kv| kv.key == hw.as_bytes()) {
            Some(kv) => high_waters.insert(candidate, kv.value.clone()),
            None => high_waters.remove(&candidate),
        };
        match fresh.iter().find(|kv| kv.key == stamp_key.as_bytes()) {
            Some(kv) => stamps.insert(candidate, kv.value.clone()),
            None => stamps.remove(&candidate),
        };
        // Or won it already: a take whose answer was lost (a timeout) and
        // that the client retried on another endpoint may have committed.
        // An id held by our own lease is ours; taking another would hold
        // two until the lease ends.
        let ours = fresh
            .iter()
            .filter(|kv| kv.lease == lease)
            .flat_map(|kv| ids_under(std::slice::from_ref(kv), &node_prefix).into_keys())
            .next();
        if let Some(node_id) = ours {
            // The retry queued us behind our own take: leave the queue, or
            // the nodes behind skip an id while we live (best effort: the
            // key goes with the lease anyway).
            tracing::debug!(
                node_id,
                lost_races = losses,
                "took a node id; the answer was lost"
            );
            if fresh.iter().any(|kv| kv.key == queue_key) {
                let _ = client.txn(&[], &[Op::Delete(queue_key.clone())], &[]).await;
            }
            let mut taken = sent.remove(&node_id).ok_or_else(|| {
                AcquireError::Registry(RegistryError::Failed(
                    format!(
                        "{node_prefix}{node_id} is held by this lease, which never asked for it"
                    )
                    .into(),
                ))
            })?;
            // The record our take wrote, if this answer read it (else the
            // first record fails, and the node takes an id afresh).
            let hw_key = keys(prefix, node_id).1;
            taken.hw_revision = fresh
                .iter()
                .find(|kv| kv.key == hw_key.as_bytes())
                .map_or(0, |kv| kv.mod_revision);
            return Ok(taken);
        }
        kvs = fresh;
    }
    Err(first_too_far.unwrap_or(AcquireError::Full {
        count: max_id + 1,
        prefix: prefix.to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Which changes to a holding's records stop it: all but its own
    /// high-water records and the same layout written again.
    #[test]
    fn only_our_own_records_and_the_same_layout_pass() {
        let held = Held {
            lease: 7,
            layout: b"L".to_vec(),
            fleet: b"F".to_vec(),
            hw_revision: 10,
            unconfirmed: Vec::new(),
        };
        let (node, hw, layout) = (
            "/p/node/0".to_string(),
            "/p/hw/0".to_string(),
            "/p/layout".to_string(),
        );
        let change = |kind, key: &str, value: &[u8], mod_revision| {
            let e = Event {
                kind,
                key: key.as_bytes().to_vec(),
                value: value.to_vec(),
                mod_revision,
            };
            not_ours(&e, &held, [&node, &hw, &layout])
        };
        use EventKind::{Delete, Put};
        assert_eq!(change(Put, &hw, b"1", 10), None, "our last record");
        assert_eq!(change(Put, &hw, b"1", 9), None, "an earlier record of ours");
        assert!(change(Put, &hw, b"1", 11).is_some(), "a record not ours");
        assert!(change(Delete, &hw, b"", 11).is_some());
        assert!(change(Delete, &node, b"", 11).is_some());
        assert!(change(Put, &node, b"other", 11).is_some());
        assert_eq!(change(Put, &layout, b"L", 11), None, "the same layout");
        assert!(change(Put, &layout, b"M", 11).is_some());
        assert!(change(Delete, &layout, b"", 11).is_some());
        assert_eq!(change(Delete, "/p/hw/1", b"", 11), None, "another id's");
    }

    /// Only the same layout with a fixed field fixed to different values
    /// tells two fleets apart; a registration that does not read is
    /// taken as one that may share ids.
    #[test]
    fn fleets_are_told_apart_only_by_a_fixed_field_of_one_layout() {
        let dc =
            |n: u8| format!("L; node id in field worker; fixed fields datacenter={n}, region=1");
        assert!(!may_share_ids(&dc(1), &dc(2)));
        assert!(may_share_ids(&dc(1), &dc(1)));
        assert!(may_share_ids(
            "L; node id in field node",
            "L; node id in field node"
        ));
        assert!(may_share_ids(
            "L; node id in field node",
            "M; node id in field node"
        ));
        // One side does not fix the field: its nodes may take that value.
        assert!(may_share_ids(&dc(1), "L; node id in field worker"));
        let reg = |fleet: &str, prefix: &str, layout: &str| Kv {
            key: fleet_registry_key(fleet.as_bytes()),
            value: registration(prefix, layout.as_bytes(), 1),
            lease: 0,
            create_revision: 1,
            mod_revision: 1,
        };
        let ours = dc(1);
        let check = |registered: &[Kv], prefix: &str, moved_from: Option<&str>| {
            check_registered(registered, prefix, b"F", ours.as_bytes(), moved_from, 1)
        };
        // Not registered yet: registered with the take; then nothing to write.
        assert_eq!(
            check(&[], "/a", None).unwrap(),
            vec![(
                fleet_registry_key(b"F"),
                registration("/a", ours.as_bytes(), 1)
            )]
        );
        assert_eq!(check(&[reg("F", "/a", &ours)], "/a", None).unwrap(), vec![]);
        // An earlier version's registration: read, written where this
        // version reads it, and kept in step where it differs.
        let old = |fleet: &str, prefix: &str, layout: &str, revision: i64| Kv {
            key: [OLD_FLEETS.as_bytes(), fleet.as_bytes()].concat(),
            mod_revision: revision,
            ..reg(fleet, prefix, layout)
        };
        assert_eq!(
            check(&[old("F", "/a", &ours, 1)], "/a", None).unwrap(),
            vec![(
                fleet_registry_key(b"F"),
                registration("/a", ours.as_bytes(), 1)
            )]
        );
        assert!(matches!(
            check(&[old("G", "/b", &ours, 1)], "/a", None),
            Err(AcquireError::FleetOverlaps(_))
        ));
        let moved = check(&[old("F", "/old", &ours, 1)], "/a", Some("/old")).unwrap();
        assert_eq!(moved.len(), 2, "both places: {moved:?}");
        // Of the two places, the one written last.
        assert!(matches!(
            check(
                &[old("F", "/b", &ours, 5), reg("F", "/a", &ours)],
                "/a",
                None
            ),
            Err(AcquireError::FleetElsewhere { .. })
        ));
        assert!(
            check(
                &[old("F", "/b", &ours, 0), reg("F", "/a", &ours)],
                "/a",
                None
            )
            .is_ok()
        );
        // Registered under another prefix: refused unless moved from it.
        let elsewhere = [reg("F", "/old", &ours)];
        assert!(matches!(
            check(&elsewhere, "/a", None),
            Err(AcquireError::FleetElsewhere { .. })
        ));
        assert!(!check(&elsewhere, "/a", Some("/old")).unwrap().is_empty());
        // Another fleet: refused where it may share ids, under another prefix.
        assert!(matches!(
            check(&[reg("G", "/b", &ours)], "/a", None),
            Err(AcquireError::FleetOverlaps(_))
        ));
        assert!(check(&[reg("G", "/b", &dc(2))], "/a", None).is_ok());
        assert!(check(&[reg("G", "/a", &ours)], "/a", None).is_ok());
        let unreadable = Kv {
            key: fleet_registry_key(b"G"),
            value: b"garbage".to_vec(),
            lease: 0,
            create_revision: 1,
            mod_revision: 1,
        };
        assert!(check(&[unreadable], "/a", None).is_err());
    }

    /// The fleet registered under a prefix, and when: a fresh take refuses
    /// it only where its read of the prefix is at or after that revision.
    #[test]
    fn a_fleet_registered_under_a_prefix_is_found_with_its_revision() {
        let reg = |fleet: &str, prefix: &str, revision: i64| Kv {
            key: fleet_registry_key(fleet.as_bytes()),
            value: registration(prefix, b"L; node id in field node", 1),
            lease: 0,
            create_revision: revision,
            mod_revision: revision,
        };
        let registered = [reg("F", "/a", 7), reg("G", "/b", 3), reg("H", "/a", 9)];
        assert_eq!(
            registered_under(&registered, "/a"),
            Some(("F".to_string(), 7, None))
        );
        assert_eq!(
            registered_under(&registered, "/b"),
            Some(("G".into(), 3, None))
        );
        let moved = Kv {
            value: moved_registration("/b", b"L; node id in field node", 1, "/b on etcd cluster=2"),
            ..reg("G", "/b", 3)
        };
        assert_eq!(
            registered_under(std::slice::from_ref(&moved), "/b"),
            Some(("G".into(), 3, Some("/b on etcd cluster=2".into())))
        );
        assert_eq!(
            parse_registration(&moved.value),
            Some(("/b".into(), "L; node id in field node".into()))
        );
        assert_eq!(registered_under(&registered, "/c"), None);
        assert_eq!(
            registered_under(&registered, "/a/x"),
            None,
            "another prefix"
        );
    }

    #[test]
    fn a_place_older_than_remembered_is_refused_and_a_confirmation_lasts_until_a_restore() {
        let kv = |name: &str, value: &str, revision: i64| Kv {
            key: format!("/p/{name}").into_bytes(),
            value: value.as_bytes().to_vec(),
            lease: 0,
            create_revision: revision,
            mod_revision: revision,
        };
        let fleet = Some("F".to_string());
        let moved = [kv("fleet", "F", 5), kv("generation", "1", 5)];
        let old = Place::read("/p", &[kv("fleet", "F", 5)]);
        assert_eq!(old.generation, 0);
        let err = old.behind(1, &fleet, Some("etcd cluster=b prefix=/p"));
        assert!(
            err.is_some_and(|e| e.to_string().contains("holds generation 0 of fleet F")),
            "an older generation of this fleet is refused"
        );
        assert!(old.behind(0, &fleet, None).is_none());
        assert!(
            old.behind(1, &Some("G".into()), None).is_none(),
            "another fleet: FleetMismatch"
        );
        let new = Place::read("/p", &moved);
        assert_eq!(new.generation, 1);
        assert!(
            new.behind(0, &fleet, None).is_none(),
            "a moved fleet's node goes on"
        );
        let retired = Place::read(
            "/p",
            &[kv("fleet", "F", 5), kv("layout", "retired for /q: x", 6)],
        );
        assert!(
            retired.behind(1, &fleet, None).is_none(),
            "refused as retired"
        );

        // Confirmed at revision 40, status (40, 50); the restore recorded
        // at 30: believed. A restore recorded after it (at 45): only while
        // the history descends from the confirmation's status.
        let stamp = "revision 40 raft_index 50";
        let place = Place::read("/p", &[kv("confirmed", stamp, 40)]);
        let same = Status {
            revision: 60,
            raft_index: 70,
        };
        let restored = Status {
            revision: 60,
            raft_index: 12,
        };
        assert!(place.confirmed(Some(restored), Some(30)));
        assert!(place.confirmed(Some(same), Some(45)));
        assert!(!place.confirmed(Some(restored), Some(45)));
        assert!(!place.confirmed(None, Some(45)));
        assert!(!Place::read("/p", &moved).confirmed(Some(same), Some(30)));
    }

    #[test]
    fn a_stamp_reads_back_and_only_this_history_believes_it() {
        let then = Status {
            revision: 201,
            raft_index: 205,
        };
        let read = parse_stamp(stamp_text(&then, 0xab).as_bytes());
        assert_eq!(read, Some(then));
        assert_eq!(parse_stamp(b"revision x raft_index 1"), None);
        assert_eq!(parse_stamp(b"201"), None);
        let later = Status {
            revision: 251,
            raft_index: 255,
        };
        // Restored from a snapshot at revision 201, then 20 writes.
        let restored = Status {
            revision: 221,
            raft_index: 24,
        };
        assert!(Trust::All.believes(None));
        assert!(Trust::StampedSince(later).believes(read.as_ref()));
        assert!(!Trust::StampedSince(restored).believes(read.as_ref()));
        assert!(!Trust::StampedSince(later).believes(None));
        assert!(!Trust::Nothing.believes(read.as_ref()));
        // A restore recorded at revision 230: only takes that read 230 or
        // later, however many raft entries came since.
        assert!(!Trust::StampedAfter(230).believes(read.as_ref()));
        assert!(Trust::StampedAfter(230).believes(Some(&Status {
            revision: 230,
            raft_index: 10_030
        })));
        assert!(!Trust::StampedAfter(230).believes(None));
    }

    /// Review E4: a copy of a fleet's records in another etcd cluster is
    /// told by any record that names the cluster it was written in, so
    /// deleting `<prefix>/cluster` (or the prefix) leaves it a copy.
    #[test]
    fn any_record_naming_another_cluster_tells_a_copy() {
        let kv = |key: &str, value: &str| Kv {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            lease: 0,
            create_revision: 1,
            mod_revision: 1,
        };
        let status = Status {
            revision: 7,
            raft_index: 9,
        };
        let stamp = stamp_text(&status, 0xa);
        assert_eq!(parse_stamp(stamp.as_bytes()), Some(status));
        assert_eq!(stamp_cluster(stamp.as_bytes()), Some("a"));
        assert_eq!(stamp_cluster(unknown_stamp(0xa).as_bytes()), Some("a"));
        assert_eq!(stamp_cluster(b"revision 7 raft_index 9"), None);
        let layout = b"L; node id in field node";
        let reg = |fleet: &str, prefix: &str, cluster: u64| Kv {
            key: fleet_registry_key(fleet.as_bytes()),
            value: registration(prefix, layout, cluster),
            lease: 0,
            create_revision: 1,
            mod_revision: 1,
        };
        assert_eq!(
            parse_registration(&reg("F", "/p", 0xa).value),
            Some(("/p".into(), String::from_utf8_lossy(layout).into_owned()))
        );
        let copied =
            |kvs: &[Kv], registered: &[Kv]| copied_from("/p", kvs, registered, 0xb, &["F"]);
        // Written here, or by an earlier version (no cluster named).
        let own = [
            kv("/p/cluster", "b"),
            kv("/p/taken/0", &stamp_text(&status, 0xb)),
            kv("/p/taken/1", "revision 7 raft_index 9"),
        ];
        assert_eq!(copied(&own, &[reg("F", "/p", 0xb)]), None);
        let earlier = Kv {
            value: b"prefix /p\nlayout L; node id in field node".to_vec(),
            ..reg("F", "/p", 0xa)
        };
        assert_eq!(copied(&[], &[earlier]), None);
        // Each record alone tells.
        assert_eq!(
            copied(&[kv("/p/cluster", "a")], &[]),
            Some(("a".into(), "its /p/cluster".into()))
        );
        assert_eq!(
            copied(&[kv("/p/taken/3", &stamp)], &[]),
            Some(("a".into(), "/p/taken/3".into()))
        );
        assert_eq!(
            copied(&[kv("/p/restored", &stamp)], &[]),
            Some(("a".into(), "/p/restored".into()))
        );
        assert_eq!(
            copied(&[], &[reg("F", "/elsewhere", 0xa)]),
            Some(("a".into(), "shardflake.fleets/F".into()))
        );
        assert_eq!(
            copied(&[], &[reg("G", "/p", 0xa)]),
            Some(("a".into(), "shardflake.fleets/G".into()))
        );
        // Another fleet under another prefix, copied too, is not this one.
        assert_eq!(copied(&[], &[reg("G", "/q", 0xa)]), None);
        assert_eq!(
            state_file_cluster("etcd cluster=a1 prefix=/p"),
            Some("a1".into())
        );
        assert_eq!(state_file_cluster("static"), None);
    }

    #[test]
    fn a_fleet_id_without_its_registration_is_told() {
        let kv = |key: &[u8], value: &[u8], mod_revision: i64| Kv {
            key: key.to_vec(),
            value: value.to_vec(),
            lease: 0,
            create_revision: mod_revision,
            mod_revision,
        };
        let fleet = [kv(b"/p/fleet", b"F", 5)];
        let registered = |id: &str| kv(&fleet_registry_key(id.as_bytes()), b"prefix /p", 5);
        let old_place = kv(format!("{OLD_FLEETS}F").as_bytes(), b"prefix /p", 5);
        assert_eq!(unregistered("/p", &fleet, &[registered("F")], 9), None);
        assert_eq!(unregistered("/p", &fleet, &[old_place], 9), None);
        assert_eq!(unregistered("/p", &[], &[], 9), None);
        assert_eq!(
            unregistered("/p", &fleet, &[registered("G")], 9),
            Some("F".into())
        );
        assert_eq!(unregistered("/p", &fleet, &[], 5), Some("F".into()));
        // Registrations read from a member behind the fleet id's write.
        assert_eq!(unregistered("/p", &fleet, &[], 4), None);
    }
}
