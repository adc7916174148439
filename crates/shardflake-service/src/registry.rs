//! The coordination store behind leased node ids, as the whole operations
//! the lease keeper needs: take the lowest free node id under a new lease
//! (with the high-water its previous holder recorded), renew the lease,
//! record the high-water while still holding, release.
//!
//! Three registries implement [`Registry`]:
//!
//! - [`EtcdRegistry`] (`registry/etcd.rs`): etcd, the production store.
//! - [`MemoryRegistry`] (`registry/memory.rs`): the same semantics in
//!   process, leases timed on tokio's clock, for tests (paused time) and
//!   embedding.
//! - [`StaticRegistry`]: a fixed node id (`--node-id`): nothing to
//!   coordinate, a holding that never expires.
//!
//! The data model, which the etcd and memory registries share: under a
//! prefix, `<prefix>/node/<id>` names the holder of node id `<id>` and is
//! attached to its lease (it disappears when the lease ends);
//! `<prefix>/hw/<id>` holds the last high-water (Unix ms) recorded for the
//! id and is not leased, so it outlives holders and the next holder resumes
//! after it; `<prefix>/layout` holds the layout, node field and fixed node
//! field values of the cluster, written by its first node and checked by
//! every take (nodes with different layouts or fixed fields under one
//! prefix would compose equal ids from different node ids, or from one). On etcd, `<prefix>/queue/<lease>` marks a node that
//! lost a race for an id and is still trying (leased; it only orders racing
//! nodes, see `registry/etcd.rs`), `<prefix>/taken/<id>` the etcd status
//! each take read and the etcd cluster it read it in (every take writes it: an id taken before whose
//! high-water record is gone had it deleted, and is waited out), and `<prefix>/restored` the last snapshot restore a
//! take saw (both judge records after a restore, see `registry/etcd.rs`).
//! Outside every prefix, `shardflake.fleets/<fleet id>` registers each
//! fleet of the cluster (its prefix, layout record and the cluster's id): a take refuses a
//! fleet whose ids another registered fleet could make ([`FLEETS`]).
//! `shardflake fleet move` carries a stopped fleet's records to another
//! prefix or cluster ([`move_fleet`]).

use std::time::Duration;

use crate::config::NodeSource;

mod etcd;
mod memory;

pub(crate) use etcd::client as etcd_client;
pub use etcd::{
    Confirmed, EtcdRegistry, FLEETS, MoveError, Moved, confirm_place, may_share_ids, move_fleet,
};
pub use memory::MemoryRegistry;

/// A lease's id in the store.
pub type LeaseId = i64;

/// What a node asks for when it takes a node id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The largest node id the node field holds.
    pub max_node_id: u64,
    /// The lease TTL asked for (the store may grant less).
    pub ttl: Duration,
    /// What `<prefix>/layout` must hold (see [`Claim::layout_of`]).
    pub layout: Vec<u8>,
    /// The record an earlier version wrote for this layout, without its
    /// fixed fields ([`Claim::earlier_layout_of`]): also accepted.
    pub earlier_layout: Option<Vec<u8>>,
    /// Who holds the id (written as the node key's value, for operators).
    pub holder: String,
    /// The wall clock (Unix ms) when the take is sent, and the high-water
    /// window: a take records `max(previous high-water, now_ms) + window_ms`
    /// as the id's high-water in the same step, so the new holder needs no
    /// separate record before it issues.
    pub now_ms: u64,
    /// See [`Claim::now_ms`].
    pub window_ms: u64,
    /// How far past `now_ms` a recorded high-water may be for the id to be
    /// taken (window + max_resume_wait): an id whose previous holder ran
    /// further ahead is skipped, checked before anything is written.
    pub max_ahead_ms: u64,
    /// Take exactly this id (a static id reserved in the registry), never
    /// another; refused while another holder has it.
    pub pinned: Option<u64>,
    /// The registry the node's state file names ([`Registry::identity`]):
    /// a take in another one is refused before anything is written.
    pub expected_registry: Option<String>,
    /// A layout change: the fleet this one replaces (etcd only).
    pub previous: Option<PreviousFleet>,
}

/// The fleet a new fleet replaces with another layout (`--previous-prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousFleet {
    /// The previous fleet's prefix (same etcd).
    pub prefix: String,
    /// This (the new) fleet's layout, whose ids must be above the previous
    /// fleet's.
    pub layout: shardflake::Layout,
}

impl Claim {
    /// The layout record for a configuration: the layout (every field, epoch
    /// and tick), the field the node id goes into and the value of every
    /// other fixed node field (`--field datacenter=1`): nodes of one
    /// fleet with different fixed fields would each be told apart by
    /// nothing but their node id, which the registry hands out to one.
    pub fn layout_of(config: &crate::config::Config) -> Vec<u8> {
        let mut record = format!("{}; node id in field {}", config.layout, config.node_field);
        if !config.fixed_fields.is_empty() {
            let fixed: Vec<String> = config
                .fixed_fields
                .iter()
                .map(|(name, value)| format!("{name}={value}"))
                .collect();
            record.push_str(&format!("; fixed fields {}", fixed.join(", ")));
        }
        record.into_bytes()
    }

    /// The record earlier versions wrote for this configuration, when it
    /// differs from [`Claim::layout_of`] (they left the fixed fields out).
    pub fn earlier_layout_of(config: &crate::config::Config) -> Option<Vec<u8>> {
        (!config.fixed_fields.is_empty()).then(|| {
            format!("{}; node id in field {}", config.layout, config.node_field).into_bytes()
        })
    }
}

/// A node id held under a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holding {
    /// The node id.
    pub node_id: u64,
    /// The lease it is attached to.
    pub lease: LeaseId,
    /// The TTL granted; `None`: held for the life of the process (a static
    /// node id), never renewed and never fenced.
    pub ttl: Option<Duration>,
    /// The high-water the previous holder recorded (Unix ms; 0: the id was
    /// never used under this prefix).
    pub previous_high_water_ms: u64,
    /// The high-water the take itself recorded for the new holder (see
    /// [`Claim::now_ms`]); `None` when it recorded nothing (a static id).
    pub recorded_high_water_ms: Option<u64>,
    /// What `previous_high_water_ms` stands for (the words of the wait).
    pub resume_from: ResumeFrom,
}

/// What a take resumes past ([`Holding::previous_high_water_ms`]): a
/// previous holder's record, or a bound the take set where no record can
/// be believed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeFrom {
    /// The high-water the id's previous holder recorded.
    Recorded,
    /// No record: one window past this clock (the id was never used
    /// here, or its record was deleted under a holder still running).
    NoRecord,
    /// The id was taken before and its record deleted:
    /// `max_resume_wait` past this clock.
    Deleted,
    /// etcd was restored and the id not recorded since:
    /// `max_resume_wait` past this clock, or the record if later.
    Restored,
    /// The fleet's floor (`<prefix>/floor`: a layout change, a move or a
    /// floor put back).
    Floor,
}

impl ResumeFrom {
    /// The words for the high-water a take of `node_id` resumes past.
    pub fn describe(self, node_id: u64) -> String {
        match self {
            ResumeFrom::Recorded => {
                format!("recorded for node id {node_id} by its previous holder")
            }
            ResumeFrom::NoRecord => format!(
                "set one window past this clock for node id {node_id}, which holds no high-water record here (never used, or its record deleted under a holder that may still run)"
            ),
            ResumeFrom::Deleted => format!(
                "set max_resume_wait past this clock for node id {node_id}, taken before and its high-water record deleted"
            ),
            ResumeFrom::Restored => format!(
                "set max_resume_wait past this clock (or its record, if later) for node id {node_id}: etcd was restored and it was not recorded since"
            ),
            ResumeFrom::Floor => {
                "of the fleet's floor (the floor record under its etcd prefix)".to_string()
            }
        }
    }
}

impl Claim {
    /// What a take records: past the previous holder's high-water and past
    /// now, by the window.
    pub fn first_high_water(&self, previous_ms: u64) -> u64 {
        previous_ms.max(self.now_ms).saturating_add(self.window_ms)
    }
}

/// The answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed: the lease lives this long from when the renewal was sent.
    Alive(Duration),
    /// The lease has ended (expired or revoked): its node id is not ours.
    Gone,
}

/// A store failure. Start tells the two apart: an unreachable store fails
/// start fast, one that answers gets longer (contention).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// No member of the store answered: nothing is known to have happened.
    #[error(transparent)]
    Unreachable(Box<dyn std::error::Error + Send + Sync>),
    /// The store answered with an error or with an answer that does not
    /// read, or took the call and is still at it (a login queued behind
    /// others): it is there, retrying later helps.
    #[error(transparent)]
    Failed(Box<dyn std::error::Error + Send + Sync>),
    /// The store refused this client's settings (TLS files, credentials):
    /// retrying cannot help, the operator must change them.
    #[error(transparent)]
    Refused(Box<dyn std::error::Error + Send + Sync>),
}

/// Why a high-water was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The node id is no longer held by this lease: nothing was written.
    #[error("the node id is no longer held by this lease")]
    NotHolder,
    /// The store failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// A place holding an older generation of a node's fleet than its state
/// file remembers: one the fleet left by a move or a layout change,
/// brought back (an etcd restored from a snapshot taken before).
#[derive(Debug, thiserror::Error)]
#[error(
    "etcd prefix {prefix} holds generation {found} of fleet {fleet}, but this node's state file remembers generation {remembered} (it last ran under [{last_place}]): this place is older than the fleet's last move or layout change (etcd restored from a snapshot taken before it?), and the fleet's ids are made where it went. Start this node where its state file says. If that place was lost too (restored with this one): stop every node of the fleet, then move it from here again, `shardflake fleet move --etcd URLS --etcd-prefix {prefix} --to-prefix NEW_PREFIX --raise 60s` (or start the new layout again with --previous-prefix {prefix}). If this place's records were deleted and put back by hand: etcdctl put {prefix}/generation {remembered}"
)]
pub struct GenerationBehind {
    /// The place.
    pub prefix: String,
    /// The fleet id.
    pub fleet: String,
    /// The generation the place holds.
    pub found: u64,
    /// The generation the state file remembers.
    pub remembered: u64,
    /// The state file's registry line.
    pub last_place: String,
}

/// A fleet registered in an etcd cluster that could make the ids of a
/// fleet starting under another prefix there.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.describe())]
pub struct FleetOverlap {
    /// The prefix of this start.
    pub prefix: String,
    /// Its layout record.
    pub layout: String,
    /// The registered fleet's id.
    pub other: String,
    /// Its prefix.
    pub other_prefix: String,
    /// Its layout record.
    pub other_layout: String,
    /// Where the registered fleet moved with `fleet move --to-etcd` (its
    /// registration's mark): it makes its ids there, not here.
    pub moved_to: Option<String>,
}

impl FleetOverlap {
    fn describe(&self) -> String {
        let FleetOverlap {
            prefix,
            layout,
            other,
            other_prefix,
            other_layout,
            moved_to,
        } = self;
        let own = "A fleet of its own: the same layout with another value of a fixed field (--field NAME=VALUE)";
        match moved_to {
            Some(to) => format!(
                "etcd prefix {prefix} (layout {layout:?}) would share ids with fleet {other}, which ran in this etcd cluster under {other_prefix} (layout {other_layout:?}) and moved to {to}: it makes its ids there, and nothing in this cluster sees its nodes, so a fleet here whose ids meet its layout's would make them again. A node of that fleet: start it there. {own}. Only if that fleet is gone for good (no node of it runs anywhere, and none will): etcdctl del shardflake.fleets/{other} (and /shardflake.fleets/{other}, where an earlier version registered it)"
            ),
            None => format!(
                "etcd prefix {prefix} (layout {layout:?}) would share ids with fleet {other} registered in this etcd cluster under {other_prefix} (layout {other_layout:?}): two fleets on one etcd cluster take the same node ids unless a fixed field of the same layout tells them apart. If this etcd was restored or copied from another etcd cluster where that fleet may still run: start nothing here (a move, a layout change or a confirmation from a copy is refused too) and start its nodes there. A node of that fleet: use --etcd-prefix {other_prefix} (if its records there were deleted: start a node on {other_prefix}: its refusal says what to put back, the floor first; the fleet id alone is not safe). To move that fleet here: stop its nodes, then `shardflake fleet move --etcd URLS --etcd-prefix {other_prefix} --to-prefix {prefix}`. To replace it with a new layout: --previous-prefix {other_prefix}. {own}"
            ),
        }
    }
}

/// Records of a prefix written in another etcd cluster than the one
/// that answers: a copy (a snapshot restored into this cluster).
#[derive(Debug, thiserror::Error)]
#[error(
    "etcd prefix {prefix} holds records written in etcd cluster={recorded} ({evidence}), but this is etcd cluster={here}: a copy of that cluster (a snapshot restored into another cluster), and the fleet may still run there, making the ids a node here would make. Every record of a fleet names the etcd cluster it was written in ({prefix}/cluster, each {prefix}/taken/<id>, its registration shardflake.fleets/<fleet id>, each node's state file): deleting one, or the prefix, does not make a copy an original, and no fleet id or floor put back here makes it safe while that cluster runs the fleet. Start the fleet's nodes on the cluster the records name (a move, a confirmation or a layout change from this place is refused too). Only if etcd cluster={recorded} runs the fleet no more, for good (every node of it stopped, none started there again): stop every node of the fleet, then `shardflake fleet move --etcd URLS --etcd-prefix {prefix} --to-prefix NEW_PREFIX --copy-of-gone-cluster {recorded} --raise R --max-resume-wait R` here, R at least the fleet's --max-resume-wait (the copy's records may be far behind what its nodes stamped there), and start the nodes on NEW_PREFIX"
)]
pub struct FleetCopied {
    /// The key prefix.
    pub prefix: String,
    /// The cluster id the records name.
    pub recorded: String,
    /// This cluster's id.
    pub here: String,
    /// The record that names it.
    pub evidence: String,
}

/// A prefix holding no fleet id but a fleet's records (high-waters,
/// layout, floor...), where the cluster registers no fleet under it: a
/// node without a fleet would start a new one there, resuming past
/// records that may not be all of the old fleet's (a copy, or a fleet id
/// deleted by hand).
#[derive(Debug, thiserror::Error)]
#[error(
    "etcd prefix {prefix} in etcd cluster={here} holds no fleet id, but it holds a fleet's records: {records}; a new fleet starts only on a prefix with no records at all. If this etcd was restored or copied from another etcd cluster (a snapshot restored into a new one, records deleted by hand): it is a copy, the fleet whose records these are may still run on the cluster it was copied from, making the ids a node here would make; put nothing back here and start no node here, start the fleet's nodes on that cluster. If this is the cluster the fleet runs on and its fleet id was deleted here: stop every node of it, put back a floor past every id it stamped: etcdctl put {prefix}/floor {floor_ms} (this host's clock plus the window and --max-resume-wait; if the largest high_water_ms line in the fleet's state files is later, that instead), then its fleet id, the `fleet` line of its nodes' state files: etcdctl put {prefix}/fleet FLEET_ID, and start its nodes with their state files. Only if no id a fleet made under this prefix is kept anywhere, to start a new fleet here: etcdctl del --prefix {prefix}/"
)]
pub struct FleetLeftovers {
    /// The key prefix.
    pub prefix: String,
    /// The records found, a few named, and their count.
    pub records: String,
    /// This cluster's id (hex).
    pub here: String,
    /// The floor to put back, should the fleet id have been deleted here:
    /// this clock plus window and max_resume_wait (Unix ms).
    pub floor_ms: u64,
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
        "etcd prefix {prefix} belongs to a cluster with another layout: it records {recorded:?}, this node has {ours:?}. A node of another fleet: use that fleet's --etcd-prefix. To change this fleet's layout: stop every node under {prefix}, then start the new layout on a new prefix with --previous-prefix {prefix} (`shardflake plan --from OLD --to NEW` says first whether it may); a new prefix without --previous-prefix knows nothing of the ids made here"
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
    /// The id asked for with `--node-id` is held by another node.
    #[error(
        "node id {node_id} is held under {prefix}/node/{node_id} by {holder}: another node runs with this --node-id (two nodes with one id issue the same ids); give each node its own --node-id"
    )]
    PinnedHeld {
        /// The node id.
        node_id: u64,
        /// The key prefix.
        prefix: String,
        /// The holder's record.
        holder: String,
    },
    /// Node records without a layout record: `<prefix>/layout` was deleted.
    #[error(
        "etcd prefix {prefix} holds node records but no {prefix}/layout (deleted?): a node of another layout could join; if the fleet's layout is this node's, restore it with: etcdctl put {prefix}/layout '{ours}'"
    )]
    LayoutMissing {
        /// The key prefix.
        prefix: String,
        /// What this node would record.
        ours: String,
    },
    /// The node's state file was written under another registry (prefix,
    /// etcd cluster, or a static id).
    #[error(
        "this node's state file says it ran under [{recorded}], now it is under [{now}]: nodes under different prefixes or etcd clusters (or a static id beside leased ones) can hold the same node id and issue the same ids. To move a fleet to another prefix: stop every node of it, then start them all with the new --etcd-prefix and --previous-prefix <the old prefix> after deleting the line \"registry ...\" from each state file; to move static ids to etcd keep --node-id and add --etcd (see docs/guide/operations-service.md)"
    )]
    RegistryChanged {
        /// What the state file records.
        recorded: String,
        /// The registry of this start.
        now: String,
    },
    /// etcd answered for another cluster than the one this process took
    /// its first node id in.
    #[error(
        "etcd answered for another etcd cluster [{now}] than the one this node took its node id in [{took}]: the endpoints (--etcd) list members of two clusters, or the cluster was replaced; nodes in two clusters hand out one node id twice. List the members of one cluster"
    )]
    ClusterChanged {
        /// Where this process took its first id.
        took: String,
        /// Who answered now.
        now: String,
    },
    /// The recorded high-water is further ahead of this clock than start may wait.
    #[error(
        "the high-water {high_water_ms} {whose} is {ahead:?} ahead of this host's clock, more than window + max_resume_wait ({limit:?}); either that clock ran ahead or this host's is behind: check both, or raise --max-resume-wait"
    )]
    HighWaterAhead {
        /// Whose record it is: `recorded for node id N by its previous
        /// holder` or `in the state file`.
        whose: String,
        /// The record (Unix ms).
        high_water_ms: u64,
        /// How far ahead of the clock it is.
        ahead: Duration,
        /// window + max_resume_wait.
        limit: Duration,
    },
    /// The prefix records another fleet id than this node's.
    #[error(
        "etcd prefix {prefix} holds fleet {found}, this node belongs to fleet {expected} (its state file, or --fleet): another fleet's place, or another etcd cluster; check --etcd and --etcd-prefix"
    )]
    FleetMismatch {
        /// The key prefix.
        prefix: String,
        /// This node's fleet id.
        expected: String,
        /// The fleet id recorded there.
        found: String,
    },
    /// Two endpoints answer for different clusters or fleets.
    #[error(
        "the --etcd endpoints answer for different etcd clusters or fleets: {one}, but {other}; list the members of one cluster only"
    )]
    MembersDisagree {
        /// One member and what it answered.
        one: String,
        /// Another that disagreed.
        other: String,
    },
    /// The prefix records no fleet id, and this node expects its own by
    /// `--fleet` alone (no state file of the fleet): a place the fleet
    /// never ran at, as far as anything here tells.
    #[error(
        "etcd prefix {prefix} ({here}) holds no fleet id, and this node was started with --fleet {expected} and no state file of that fleet: the fleet's nodes run on another etcd cluster or prefix, and nothing here knows the ids they made. Give this node the --etcd and --etcd-prefix the fleet's nodes run with (a fleet's first node starts without --fleet and mints its id). Do not put the fleet id here by hand; to move the fleet here, stop its nodes, then `shardflake fleet move --etcd OLD_URLS --etcd-prefix OLD_PREFIX --to-etcd URLS --to-prefix {prefix}`; if this is where the fleet ran and its records were deleted, start one of its nodes with its state file: its refusal says what to put back"
    )]
    FleetNotHere {
        /// The key prefix.
        prefix: String,
        /// The etcd cluster and prefix that answered.
        here: String,
        /// The fleet id given with `--fleet`.
        expected: String,
    },
    /// The prefix's records were written in another etcd cluster: a copy
    /// (a snapshot restored into this cluster), whose fleet may run where
    /// it was copied from.
    #[error(transparent)]
    FleetCopied(Box<FleetCopied>),
    /// `--fleet` names another fleet than the node's state file.
    #[error(
        "--fleet {given}, but the state file {path} records fleet {recorded}: it is the file of another fleet's node. Give this node its own state file, or the --fleet its fleet runs with"
    )]
    FleetFlagDiffers {
        /// The fleet id given with `--fleet`.
        given: String,
        /// The fleet id the state file records.
        recorded: String,
        /// The state file.
        path: String,
    },
    /// The prefix records no fleet id, where this node expects its own.
    #[error(
        "etcd prefix {prefix} holds no fleet id, and this node belongs to fleet {expected} (its state file): an empty place knows nothing of the ids the fleet made. If this etcd was restored or copied from another etcd cluster where the fleet may still run: put nothing back here and start none of its nodes here (both would hand out the fleet's ids); start them on that cluster, and only once none runs there for good, move the fleet from that cluster or start a new one. To move the fleet there (another prefix or another etcd cluster): stop every node of it, then `shardflake fleet move --etcd OLD_URLS --etcd-prefix OLD_PREFIX --to-etcd URLS --to-prefix {prefix}`, and start them there. If this prefix was deleted under the fleet in this cluster (its high-water records with it): stop every node of it, then put back a floor past every id it stamped before its fleet id: etcdctl put {prefix}/floor {floor_ms} (this host's clock plus the window and --max-resume-wait, the clock difference the fleet's nodes allow between their hosts; if the largest high_water_ms line in the fleet's state files is later, that instead), then etcdctl put {prefix}/fleet {expected} (after a `fleet move` or a layout change, with the generation the fleet's state files record, `generation N`: etcdctl put {prefix}/generation N; its nodes are refused by a lower one); the fleet id alone is not enough: a node would resume one window past its own clock, under another node's id"
    )]
    FleetMissing {
        /// The key prefix.
        prefix: String,
        /// This node's fleet id.
        expected: String,
        /// The floor to put back, should the prefix have been deleted:
        /// this clock plus window and max_resume_wait (Unix ms).
        floor_ms: u64,
    },
    /// The prefix records no fleet id, but the cluster registers a fleet
    /// under it since before this take read the prefix: the prefix's
    /// records were deleted (`etcdctl del --prefix`), its high-waters with
    /// them, and a new fleet here would make that fleet's ids again.
    #[error(
        "etcd prefix {prefix} holds no fleet id, but fleet {fleet} is registered in this etcd cluster under it (shardflake.fleets/{fleet}): its records there were deleted (etcdctl del --prefix?), their high-water records with them, and a new fleet started here would make its ids again. If this etcd was restored or copied from another etcd cluster where that fleet may still run: put nothing back here and start no fleet here (both would hand out its ids); start its nodes on that cluster, and only once none runs there for good, move the fleet from that cluster or start a new one. If it was deleted in this cluster: stop every node of that fleet, then put back a floor past every id it stamped before its fleet id: etcdctl put {prefix}/floor {floor_ms} (this host's clock plus the window and --max-resume-wait, the clock difference the fleet's nodes allow between their hosts; if the largest high_water_ms line in the fleet's state files is later, that instead), then etcdctl put {prefix}/fleet {fleet} (after a `fleet move` or a layout change, with the generation the fleet's state files record, `generation N`: etcdctl put {prefix}/generation N; its nodes are refused by a lower one), and start its nodes. Only if no id that fleet ever made is kept anywhere, to start a new fleet here: etcdctl del shardflake.fleets/{fleet}, then etcdctl del /shardflake.fleets/{fleet} (where an earlier version registered it)"
    )]
    FleetDeleted {
        /// The key prefix.
        prefix: String,
        /// The fleet registered under it.
        fleet: String,
        /// The floor to put back: this clock plus window and
        /// max_resume_wait (Unix ms).
        floor_ms: u64,
    },
    /// The prefix holds no fleet id but a fleet's records, and the
    /// cluster registers no fleet under it.
    #[error(transparent)]
    FleetLeftovers(Box<FleetLeftovers>),
    /// The prefix holds a fleet id this etcd cluster does not register:
    /// a fleet's registration is written with its fleet id (or by `fleet
    /// move`), so the fleet id came here without it, most likely in a
    /// copy of another cluster whose records were deleted by hand.
    #[error(
        "etcd prefix {prefix} holds fleet {fleet}, but this etcd cluster={here} does not register it (shardflake.fleets/{fleet} is missing): a fleet's registration is written in the same transaction as its fleet id, or by `shardflake fleet move` at the place it moves to, so this fleet id came here without one. If this etcd was restored or copied from another etcd cluster (a snapshot restored into a new one, records deleted by hand): it is a copy, the fleet may still run on the cluster it was copied from, making the ids a node here would make; put nothing back here and start no node here, start the fleet's nodes on that cluster. Only if this is the cluster the fleet runs on and its registration alone was deleted here: start one node of the fleet with its own state file, as that node wrote it when it ran on this cluster (never edited by hand: an edited file proves nothing): its take registers the fleet again, then start the others. A node whose state file names another etcd cluster than this one is refused here: that means this etcd is a copy"
    )]
    FleetUnregistered {
        /// The key prefix.
        prefix: String,
        /// The fleet id the prefix holds.
        fleet: String,
        /// This cluster's id (hex).
        here: String,
    },
    /// The prefix records no fleet id, and this node's state file names a
    /// registry on another etcd cluster: the fleet's ids were made there.
    #[error(
        "etcd prefix {prefix} holds no fleet id, and this node belongs to fleet {expected}, whose state file names another etcd cluster than this one ({clusters}): this cluster knows nothing of the ids the fleet made there. Start this node on the cluster its state file names, or move the fleet here: stop every node of it, then `shardflake fleet move --etcd OLD_URLS --etcd-prefix OLD_PREFIX --to-etcd URLS --to-prefix {prefix}`, and start them here"
    )]
    FleetOnAnotherCluster {
        /// The key prefix.
        prefix: String,
        /// This node's fleet id.
        expected: String,
        /// `state file: <registry>, here: <registry>`.
        clusters: String,
    },
    /// The prefix records no fleet id, and the cluster registers the
    /// fleet that ran under it as moved to another cluster (`fleet move
    /// --to-etcd`): its ids are made there now.
    #[error(
        "etcd prefix {prefix} holds no fleet id, and fleet {fleet}, which ran under it, moved to {to} (shardflake.fleets/{fleet}, written by `shardflake fleet move`): its ids are made there now, and a fleet started here again would make them twice; start nodes there. Only if that fleet is gone for good and no id it made is kept anywhere, to start a new fleet here: etcdctl del shardflake.fleets/{fleet}"
    )]
    FleetMovedAway {
        /// The key prefix.
        prefix: String,
        /// The fleet that moved.
        fleet: String,
        /// Where it went: the prefix and the cluster.
        to: String,
    },
    /// This fleet is registered in the cluster under another prefix.
    #[error(
        "fleet {fleet} is registered in this etcd cluster under {registered} (shardflake.fleets/{fleet}), not {prefix}: one fleet runs in one place. If this etcd was restored or copied from another etcd cluster where the fleet may still run: start nothing here (a move from a copy is refused too) and start its nodes there. Otherwise, start this node with --etcd-prefix {registered}; to move the fleet: stop every node of it, then `shardflake fleet move --etcd URLS --etcd-prefix {registered} --to-prefix {prefix}`"
    )]
    FleetElsewhere {
        /// This node's fleet id.
        fleet: String,
        /// Where the cluster registers it.
        registered: String,
        /// The prefix of this start.
        prefix: String,
    },
    /// Another fleet registered in the cluster could make this fleet's ids.
    #[error(transparent)]
    FleetOverlaps(Box<FleetOverlap>),
    /// The place holds an older generation of this node's fleet than its
    /// state file remembers.
    #[error(transparent)]
    GenerationBehind(Box<GenerationBehind>),
    /// etcd was restored from a snapshot, and this node cannot tell that
    /// the place is still its fleet's (no state file of it).
    #[error(
        "etcd under {prefix} was restored from a snapshot ({prefix}/restored, or its revision past its raft index), and this node has no state file of this place ({what}) to tell that its fleet did not leave it after the snapshot was taken: a snapshot of before a `shardflake fleet move` or a layout change (--previous-prefix) brings back a place the fleet left, whose ids it makes elsewhere. If the snapshot is newer than the fleet's last move and layout change, or the fleet never had any: `shardflake fleet confirm --etcd URLS --etcd-prefix {prefix}`, then start this node again; otherwise start it where the fleet runs now. If this cluster is a copy (a snapshot restored into a second cluster): never confirm a copy while the cluster it was copied from runs, for both would hand out the fleet's ids; to move a fleet to another cluster use `shardflake fleet move`"
    )]
    RestoreUnconfirmed {
        /// The place.
        prefix: String,
        /// What the place holds: its fleet and generation, or no fleet.
        what: String,
    },
    /// The prefix was retired by a layout change: its fleet runs elsewhere.
    #[error(
        "etcd prefix {prefix} is retired: its fleet moved or changed its layout and runs under {successor} now; start this node there, with the fleet's layout (its ids here could repeat the fleet's)"
    )]
    Retired {
        /// The retired prefix.
        prefix: String,
        /// The prefix of the fleet that replaced it.
        successor: String,
    },
    /// `--previous-prefix` holds no fleet.
    #[error(
        "--previous-prefix {previous} holds no layout record: no fleet to replace there (check the prefix; a brand-new fleet takes no --previous-prefix)"
    )]
    PreviousMissing {
        /// The previous prefix.
        previous: String,
    },
    /// `--previous-prefix` was already replaced by another fleet.
    #[error(
        "--previous-prefix {previous} was retired for {successor}, not for this fleet's {prefix}: a retired fleet is replaced once; name {successor} as the previous prefix"
    )]
    PreviousRetired {
        /// The previous prefix.
        previous: String,
        /// The prefix that replaced it.
        successor: String,
        /// This fleet's prefix.
        prefix: String,
    },
    /// A node of the previous fleet still holds an id (or is queued for one).
    #[error(
        "--previous-prefix {previous} still has a node: {key} (held by {holder:?}); stop every node of the previous fleet first, then start this one. After an etcd restore it may be a lease the restore brought back, its process gone: it ends with its TTL (`etcdctl lease timetolive`); start this one again after it"
    )]
    PreviousRunning {
        /// The previous prefix.
        previous: String,
        /// The key found.
        key: String,
        /// Its value (the holder).
        holder: String,
    },
    /// The previous prefix's records changed while they were checked.
    #[error(
        "--previous-prefix {previous} changed while this node checked it (a node of the previous fleet started?); stop every node of the previous fleet, then start this one again"
    )]
    PreviousChanged {
        /// The previous prefix.
        previous: String,
    },
    /// The previous fleet's layout record does not read as a layout, or a
    /// high-water there not as Unix ms.
    #[error("--previous-prefix {previous}: {key} holds {value:?}, which this node cannot read")]
    PreviousUnreadable {
        /// The previous prefix.
        previous: String,
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// The new layout's ids from now on are not above every id the previous
    /// fleet made.
    #[error(
        "this layout's ids from now on are not above every id the fleet under {previous} made: {detail}"
    )]
    BelowPrevious {
        /// The previous prefix.
        previous: String,
        /// The ids compared, and what would do.
        detail: String,
    },
    /// The lease ended before the id could be used: it expired while the
    /// node waited for its clock to pass the high-water, or another holder
    /// took the id.
    #[error("the lease ended before the node id could be used")]
    LeaseLost,
    /// The node id builds no generator (it does not fit the layout).
    #[error(transparent)]
    BadNodeId(crate::error::IssueError),
    /// The local state file could not be written.
    #[error("writing the state file: {0}")]
    StateFile(std::io::Error),
    /// The store failed.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl AcquireError {
    /// Retrying cannot help: the operator must act (a record or a clock to
    /// fix, another prefix or layout). Start and re-acquisition both stop.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            AcquireError::LayoutMismatch { .. }
                | AcquireError::LayoutMissing { .. }
                | AcquireError::Retired { .. }
                | AcquireError::GenerationBehind(_)
                | AcquireError::RestoreUnconfirmed { .. }
                | AcquireError::FleetMismatch { .. }
                | AcquireError::MembersDisagree { .. }
                | AcquireError::FleetMissing { .. }
                | AcquireError::FleetNotHere { .. }
                | AcquireError::FleetCopied(_)
                | AcquireError::FleetFlagDiffers { .. }
                | AcquireError::FleetDeleted { .. }
                | AcquireError::FleetMovedAway { .. }
                | AcquireError::FleetOnAnotherCluster { .. }
                | AcquireError::FleetUnregistered { .. }
                | AcquireError::FleetLeftovers(_)
                | AcquireError::FleetElsewhere { .. }
                | AcquireError::FleetOverlaps(_)
                | AcquireError::PreviousMissing { .. }
                | AcquireError::PreviousRetired { .. }
                | AcquireError::PreviousRunning { .. }
                | AcquireError::PreviousChanged { .. }
                | AcquireError::PreviousUnreadable { .. }
                | AcquireError::BelowPrevious { .. }
                | AcquireError::PinnedHeld { .. }
                | AcquireError::RegistryChanged { .. }
                | AcquireError::ClusterChanged { .. }
                | AcquireError::BadHighWater { .. }
                | AcquireError::HighWaterAhead { .. }
                | AcquireError::BadNodeId(_)
                | AcquireError::Registry(RegistryError::Refused(_))
        )
    }

    /// The store did not answer at all.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, AcquireError::Registry(RegistryError::Unreachable(_)))
    }
}

/// The coordination operations of the lease keeper; see the module docs.
#[async_trait::async_trait]
pub trait Registry: Send + Sync + std::fmt::Debug {
    /// Grants a lease and takes the lowest free node id under it, checking
    /// the layout record (writing it for the cluster's first node), reading
    /// the id's recorded high-water and recording the new holder's first
    /// one past it ([`Claim::first_high_water`]), in one step. On failure no
    /// lease is left behind (best effort: it would expire anyway).
    async fn acquire(&self, claim: &Claim) -> Result<Holding, AcquireError>;

    /// Keeps the lease alive.
    async fn renew(&self, lease: LeaseId) -> Result<Renewal, RegistryError>;

    /// Records `unix_ms` as the id's high-water, only while `holding` still
    /// holds it.
    async fn record_high_water(&self, holding: &Holding, unix_ms: u64) -> Result<(), RecordError>;

    /// Revokes the lease, freeing its node id at once.
    async fn release(&self, lease: LeaseId) -> Result<(), RegistryError>;

    /// Resolves when the records of `holding` change other than by this
    /// node's own writes (its node key or high-water deleted or rewritten,
    /// the layout record deleted or changed, the store rolled back), with
    /// what changed: the keeper then stops issuing at once instead of at
    /// its next record. Never, by default (a store nobody else writes to).
    /// It keeps trying while the store does not answer; the periodic
    /// record checks the same records meanwhile.
    async fn changed(&self, _holding: &Holding) -> String {
        std::future::pending().await
    }

    /// Which registry this is, as the state file records it: `static`, or
    /// `etcd cluster=<id> prefix=<prefix>` (known after the first take).
    fn identity(&self) -> Option<String>;

    /// The highest store revision seen (etcd), for the state file.
    fn revision(&self) -> Option<i64> {
        None
    }

    /// A revision seen before this process (from the state file): a store
    /// answering below it was rolled back, and its records are not trusted.
    fn remember_revision(&self, _revision: i64) {}

    /// The fleet id of the last take (etcd), for the state file.
    fn fleet(&self) -> Option<String> {
        None
    }

    /// The fleet's generation at the last take (etcd), for the state file.
    fn generation(&self) -> Option<u64> {
        None
    }

    /// The fleet id this node belongs to and the fleet's generation it
    /// saw last (from the state file): a take where another fleet id, or
    /// none, or an older generation is recorded is refused.
    fn expect_fleet(&self, _fleet: String, _generation: u64) {}
}

/// The registry a configuration names: etcd, or a static node id. Fails
/// on etcd settings that cannot work (an endpoint URL, a TLS or password
/// file), before anything is sent.
pub fn for_node_source(node: &NodeSource) -> Result<Box<dyn Registry>, crate::etcd::EtcdError> {
    Ok(match node {
        NodeSource::Static(id) => Box::new(StaticRegistry { node_id: *id }),
        NodeSource::Etcd(cfg) => Box::new(EtcdRegistry::new(cfg)?),
    })
}

/// A fixed node id: always granted, never expiring, nothing recorded
/// (the keeper's state file is the whole record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticRegistry {
    /// The node id.
    pub node_id: u64,
}

#[async_trait::async_trait]
impl Registry for StaticRegistry {
    async fn acquire(&self, _claim: &Claim) -> Result<Holding, AcquireError> {
        Ok(Holding {
            node_id: self.node_id,
            lease: 0,
            ttl: None,
            previous_high_water_ms: 0,
            recorded_high_water_ms: None,
            resume_from: ResumeFrom::NoRecord,
        })
    }
    async fn renew(&self, _lease: LeaseId) -> Result<Renewal, RegistryError> {
        Ok(Renewal::Alive(Duration::MAX))
    }
    async fn record_high_water(&self, _: &Holding, _: u64) -> Result<(), RecordError> {
        Ok(())
    }
    async fn release(&self, _lease: LeaseId) -> Result<(), RegistryError> {
        Ok(())
    }
    fn identity(&self) -> Option<String> {
        Some(STATIC.to_string())
    }
}

/// The state file's registry line of a static node id.
pub const STATIC: &str = "static";

/// The high-water record of a node id just taken: none means the id was
/// never used under this prefix. Never reads an unreadable record as 0: the
/// caller gives the id back.
fn read_high_water(node_id: u64, key: &str, record: Option<&[u8]>) -> Result<u64, AcquireError> {
    let Some(value) = record else {
        return Ok(0);
    };
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| AcquireError::BadHighWater {
            node_id,
            key: key.to_string(),
            value: String::from_utf8_lossy(value).into_owned(),
        })
}

/// `<prefix>/node/<id>` and `<prefix>/hw/<id>`.
fn keys(prefix: &str, node_id: u64) -> (String, String) {
    (
        format!("{prefix}/node/{node_id}"),
        format!("{prefix}/hw/{node_id}"),
    )
}
