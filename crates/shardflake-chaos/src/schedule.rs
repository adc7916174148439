//! The fault schedules: seeded, printed before the run, so a run can be
//! repeated with the same faults at the same offsets.
//!
//! Two shapes. [`plan`] (`run`): each cycle holds every kind of fault
//! once, in a seeded order; faults are `spacing` apart (± a seeded second)
//! after a warm-up, and the last `tail` of the run is quiet so every node
//! can show it came back. [`draw`] (`tickets`, and the other modes next):
//! an operator's faults drawn at random, each kind independently of the
//! last, with random parameters (which server, which backup, which way,
//! how long), so that runs try sequences and combinations nobody listed.

use std::fmt;
use std::time::Duration;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, then a new process on the same state file and ports.
    Kill,
    /// SIGSTOP past the lease TTL, the spare started meanwhile (it takes the
    /// freed node id), SIGCONT, the spare stopped again.
    Stop,
    /// The node's wall clock stepped back 3 s, then forward to the real time
    /// (libfaketime timestamp file); always the faked node.
    Clock,
    /// The etcd leader SIGKILLed, restarted 3 s later.
    EtcdLeader,
    /// SIGTERM (graceful drain), then a new process.
    Term,
    /// The node in the network namespace loses its route to etcd past the
    /// lease TTL while clients still reach it, then gets it back.
    CutFromEtcd,
    /// A role added to etcd's auth store, which voids every JWT token etcd
    /// gave: every node must log in again while it keeps issuing (runs with
    /// `--etcd-auth` only).
    AuthChange,
    /// An operator's mistake: half the fleet restarted under another etcd
    /// prefix (each must be refused by its state file), then restarted
    /// under the right one.
    OtherPrefix,
    /// `etcdctl del --prefix` of the fleet's prefix under load.
    RegistryDeleted,
    /// etcd restored from a snapshot taken a few seconds before, under
    /// load (every member stopped, restored, started again).
    Restore,
    /// `<prefix>/layout` deleted: holders stop and every take is refused
    /// until the operator puts it back (the fault does, then restarts them).
    LayoutDeleted,
    /// The faked node stopped, its state file removed, restarted with its
    /// clock 5 s back (then forward to the real time).
    StateLost,
    /// A second process given a symlink or a hard link (drawn) to a
    /// running node's state file, on ports of its own: it must be refused.
    StateCopy,
    /// Every node stopped, the fleet moved to a new prefix with
    /// `shardflake fleet move`, every node started there on its state
    /// file (the prefix change as the guide says).
    FleetMove,
    /// node0 restarted with a member of another etcd cluster added to its
    /// `--etcd` list: it must be refused (the members disagree), then it
    /// is restarted as it was (runs without `--etcd-auth` only).
    ForeignEndpoint,
    /// A layout change as the guide says: every node stopped, the fleet
    /// started on a new prefix with `--previous-prefix`, a changed layout
    /// and new state files. Drawn from the schedule's jitter: an epoch a
    /// minute earlier with a random start switched (allowed: the fleet
    /// runs there), or an epoch 5-30 s later (its ids would repeat the old
    /// ones': every node must be refused, then restarts as it was).
    LayoutChange,
    /// A snapshot of the fleet's etcd restored into another etcd cluster
    /// while the fleet runs, then records deleted on the copy by hand
    /// (drawn: `<prefix>/cluster`; it and the take stamps; the prefix;
    /// the prefix, then the floor and fleet id put back), then one node
    /// pointed at the copy: it must be refused (a copy, or no fleet id
    /// where its state file names another cluster), then it is restarted
    /// as it was (runs without `--etcd-auth` only).
    CopyElsewhere,
}

impl Fault {
    /// Every kind, in a fixed order.
    pub const ALL: [Fault; 17] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Clock,
        Fault::EtcdLeader,
        Fault::Term,
        Fault::CutFromEtcd,
        Fault::AuthChange,
        Fault::OtherPrefix,
        Fault::RegistryDeleted,
        Fault::Restore,
        Fault::LayoutDeleted,
        Fault::StateLost,
        Fault::StateCopy,
        Fault::FleetMove,
        Fault::ForeignEndpoint,
        Fault::LayoutChange,
        Fault::CopyElsewhere,
    ];

    /// The name printed in the schedule.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "sigkill+restart",
            Fault::Stop => "sigstop+sigcont",
            Fault::Clock => "clock-back+forward",
            Fault::EtcdLeader => "etcd-leader-kill",
            Fault::Term => "sigterm+restart",
            Fault::CutFromEtcd => "cut-from-etcd",
            Fault::AuthChange => "etcd-auth-change",
            Fault::OtherPrefix => "half-on-other-prefix",
            Fault::RegistryDeleted => "registry-deleted",
            Fault::Restore => "etcd-snapshot-restore",
            Fault::LayoutDeleted => "layout-key-deleted",
            Fault::StateLost => "state-lost+clock-back",
            Fault::StateCopy => "state-file-copy",
            Fault::FleetMove => "fleet-move",
            Fault::ForeignEndpoint => "other-cluster-endpoint",
            Fault::LayoutChange => "layout-change",
            Fault::CopyElsewhere => "copy-in-other-cluster",
        }
    }
}

/// One planned fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// When, from the start of the load.
    pub at: Duration,
    /// What.
    pub fault: Fault,
    /// The node slot it hits (unused for the etcd leader).
    pub slot: usize,
}

impl fmt::Display for Planned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match self.fault {
            Fault::EtcdLeader => "etcd leader".to_string(),
            Fault::AuthChange
            | Fault::RegistryDeleted
            | Fault::LayoutDeleted
            | Fault::FleetMove
            | Fault::LayoutChange => "every node".to_string(),
            Fault::Restore => "etcd".to_string(),
            Fault::OtherPrefix => "half the nodes".to_string(),
            _ => format!("node{}", self.slot),
        };
        write!(
            f,
            "+{:>7.1}s  {:<20} {target}",
            self.at.as_secs_f64(),
            self.fault.name()
        )
    }
}

/// Shape of a schedule.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Length of the run.
    pub run: Duration,
    /// Time between two faults.
    pub spacing: Duration,
    /// No fault before this.
    pub warm_up: Duration,
    /// No fault in the last stretch this long.
    pub tail: Duration,
    /// Nodes (not counting the spare).
    pub nodes: usize,
    /// The node whose clock is faked.
    pub clock_slot: usize,
    /// The node in the network namespace, if any.
    pub netns_slot: Option<usize>,
    /// etcd runs with authentication (JWT tokens).
    pub auth: bool,
}

impl Shape {
    /// The kinds of fault this shape can hold.
    pub fn faults(&self) -> Vec<Fault> {
        Fault::ALL
            .into_iter()
            .filter(|f| match f {
                Fault::CutFromEtcd => self.netns_slot.is_some(),
                Fault::AuthChange => self.auth,
                // The other cluster has no users: a node logging in is not
                // answered there, and not refused.
                Fault::ForeignEndpoint | Fault::CopyElsewhere => !self.auth,
                _ => true,
            })
            .collect()
    }
}

/// The schedule for `seed`.
pub fn plan(seed: u64, shape: &Shape) -> Vec<Planned> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Vec::new();
    let mut cycle: Vec<Fault> = Vec::new();
    let mut at = shape.warm_up;
    let last = shape.run.saturating_sub(shape.tail + shape.spacing);
    let mut first = true;
    while at <= last {
        if cycle.is_empty() {
            cycle = shape.faults();
            rng.shuffle(&mut cycle);
            // The first fault of a run is a restore: the short runs (CI's
            // 60 s) hold it whatever the seed.
            if first && let Some(i) = cycle.iter().position(|f| *f == Fault::Restore) {
                let restore = cycle.remove(i);
                cycle.push(restore);
            }
            first = false;
        }
        let fault = cycle.pop().unwrap_or(Fault::Kill);
        let slot = match fault {
            Fault::Clock | Fault::StateLost => shape.clock_slot,
            Fault::CutFromEtcd => shape.netns_slot.unwrap_or(0),
            Fault::EtcdLeader
            | Fault::AuthChange
            | Fault::OtherPrefix
            | Fault::RegistryDeleted
            | Fault::Restore
            | Fault::LayoutDeleted
            | Fault::FleetMove
            | Fault::LayoutChange
            | Fault::ForeignEndpoint => 0,
            _ => rng.usize(0..shape.nodes.max(1)),
        };
        let jitter = Duration::from_millis(rng.u64(0..=1000));
        out.push(Planned {
            at: at + jitter,
            fault,
            slot,
        });
        at += shape.spacing;
    }
    out
}

/// A kind of operator fault that [`draw`] can pick.
pub trait Kind: Copy {
    /// How many ways the kind can be done; the drawn `variant` is below it
    /// (which field of the file, lowered how, the peer killed or stopped).
    fn variants(self) -> usize {
        1
    }
}

/// The ranges [`draw`] picks each fault's parameters from.
#[derive(Debug, Clone)]
pub struct Ranges {
    /// Length of the run.
    pub run: Duration,
    /// Least time between two faults; each gap adds up to half of it more.
    pub spacing: Duration,
    /// `target` is below this: a mode maps it onto what is there when the
    /// fault comes (`target % servers`), so the draw needs no model of it.
    pub targets: usize,
    /// `backup` is below this: 0 the newest backup kept, 1 the one before…
    pub backups: usize,
    /// Shortest and longest `pause` (down, stopped, an old client's run).
    pub pause: (Duration, Duration),
}

/// One drawn fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drawn<K> {
    /// After the load began.
    pub at: Duration,
    /// What.
    pub kind: K,
    /// Which server or node (reduced by the mode, see [`Ranges::targets`]).
    pub target: usize,
    /// Which backup: 0 the newest kept.
    pub backup: usize,
    /// Which way ([`Kind::variants`]).
    pub variant: usize,
    /// How long.
    pub pause: Duration,
}

/// Draws `kinds` as a seeded random sequence (each fault picks any kind,
/// whatever came before) with random parameters in `ranges`. The first
/// fault comes half a spacing in, the last a spacing before the end, so
/// the run is seen to come back. The same seed, kinds and ranges give the
/// same faults.
pub fn draw<K: Kind>(seed: u64, kinds: &[K], ranges: &Ranges) -> Vec<Drawn<K>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let spacing = ranges.spacing.max(Duration::from_millis(100));
    let (shortest, longest) = ranges.pause;
    let longest = longest.max(shortest);
    let mut at = spacing / 2;
    let mut out = Vec::new();
    if kinds.is_empty() {
        return out;
    }
    while at + spacing <= ranges.run {
        let kind = kinds[rng.usize(0..kinds.len())];
        out.push(Drawn {
            at,
            kind,
            target: rng.usize(0..ranges.targets.max(1)),
            backup: rng.usize(0..ranges.backups.max(1)),
            variant: rng.usize(0..kind.variants().max(1)),
            pause: Duration::from_millis(
                rng.u64(shortest.as_millis() as u64..=longest.as_millis() as u64),
            ),
        });
        at += spacing + Duration::from_millis(rng.u64(0..=spacing.as_millis() as u64 / 2));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Op {
        A,
        B,
        C,
    }

    impl Kind for Op {
        fn variants(self) -> usize {
            match self {
                Op::A => 1,
                Op::B => 3,
                Op::C => 5,
            }
        }
    }

    fn ranges(run: u64) -> Ranges {
        Ranges {
            run: Duration::from_secs(run),
            spacing: Duration::from_secs(4),
            targets: 3,
            backups: 4,
            pause: (Duration::from_millis(200), Duration::from_secs(2)),
        }
    }

    #[test]
    fn a_draw_is_seeded_and_its_parameters_in_range() {
        let kinds = [Op::A, Op::B, Op::C];
        let a = draw(5, &kinds, &ranges(300));
        assert_eq!(a, draw(5, &kinds, &ranges(300)));
        assert_ne!(a, draw(6, &kinds, &ranges(300)));
        assert!(a.len() >= 50, "{}", a.len());
        for (i, d) in a.iter().enumerate() {
            assert!(d.target < 3 && d.backup < 4, "{d:?}");
            assert!(d.variant < d.kind.variants(), "{d:?}");
            assert!(
                d.pause >= Duration::from_millis(200) && d.pause <= Duration::from_secs(2),
                "{d:?}"
            );
            assert!(d.at + Duration::from_secs(4) <= Duration::from_secs(300));
            if i > 0 {
                assert!(d.at >= a[i - 1].at + Duration::from_secs(4), "{a:?}");
            }
        }
    }

    #[test]
    fn every_kind_every_variant_and_every_parameter_is_reachable() {
        let kinds = [Op::A, Op::B, Op::C];
        let a = draw(11, &kinds, &ranges(600));
        for k in kinds {
            for v in 0..k.variants() {
                assert!(
                    a.iter().any(|d| d.kind == k && d.variant == v),
                    "{k:?} variant {v} never drawn"
                );
            }
        }
        for t in 0..3 {
            assert!(a.iter().any(|d| d.target == t), "target {t}");
        }
        for b in 0..4 {
            assert!(a.iter().any(|d| d.backup == b), "backup {b}");
        }
    }

    #[test]
    fn a_draw_is_not_a_cycle() {
        // Somewhere a kind comes twice before another has come once: the
        // sequence is not every kind in turn.
        let kinds = [Op::A, Op::B, Op::C];
        let a = draw(3, &kinds, &ranges(300));
        let repeated = a.windows(2).any(|w| w[0].kind == w[1].kind);
        assert!(repeated, "{a:?}");
        let orders: std::collections::HashSet<Vec<Op>> = (0..10)
            .map(|seed| {
                draw(seed, &kinds, &ranges(60))
                    .iter()
                    .map(|d| d.kind)
                    .collect()
            })
            .collect();
        assert!(orders.len() > 5, "{orders:?}");
    }

    #[test]
    fn no_kind_draws_nothing_and_a_short_run_draws_little() {
        assert!(draw::<Op>(1, &[], &ranges(300)).is_empty());
        assert!(draw(1, &[Op::A], &ranges(5)).is_empty());
        assert_eq!(draw(1, &[Op::A], &ranges(6)).len(), 1);
    }

    fn shape(run: u64) -> Shape {
        Shape {
            run: Duration::from_secs(run),
            spacing: Duration::from_secs(8),
            warm_up: Duration::from_secs(3),
            tail: Duration::from_secs(8),
            nodes: 3,
            clock_slot: 0,
            netns_slot: Some(2),
            auth: false,
        }
    }

    #[test]
    fn a_cycle_holds_every_fault_once_and_the_same_seed_the_same_plan() {
        // 15 kinds without auth, one every 8 s: a cycle needs 123 s.
        let p = plan(7, &shape(140));
        assert_eq!(p, plan(7, &shape(140)));
        assert_ne!(p, plan(8, &shape(140)));
        let kinds = shape(140).faults();
        for f in &kinds {
            let first_cycle = &p[..kinds.len()];
            assert_eq!(
                first_cycle.iter().filter(|x| x.fault == *f).count(),
                1,
                "{f:?} in {p:?}"
            );
        }
        let end = p.last().map(|x| x.at).unwrap_or_default();
        assert!(
            end + Duration::from_secs(16) <= Duration::from_secs(141),
            "{p:?}"
        );
        assert!(p.iter().all(|x| x.slot < 3));
    }

    #[test]
    fn every_run_starts_with_a_restore() {
        for seed in 0..20 {
            assert_eq!(
                plan(seed, &shape(60))[0].fault,
                Fault::Restore,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn an_auth_change_is_planned_only_with_auth() {
        assert!(
            plan(1, &shape(120))
                .iter()
                .all(|x| x.fault != Fault::AuthChange)
        );
        let mut s = shape(120);
        s.auth = true;
        assert!(plan(1, &s).iter().any(|x| x.fault == Fault::AuthChange));
    }

    #[test]
    fn without_a_namespace_no_cut_is_planned() {
        let mut s = shape(120);
        s.netns_slot = None;
        assert!(plan(1, &s).iter().all(|x| x.fault != Fault::CutFromEtcd));
    }
}
