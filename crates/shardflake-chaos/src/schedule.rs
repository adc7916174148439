//! The fault schedule: seeded, printed before the run, so a run can be
//! repeated with the same faults at the same offsets.
//!
//! Each cycle holds every kind of fault once, in a seeded order; faults are
//! `spacing` apart (± a seeded second) after a warm-up, and the last
//! `tail` of the run is quiet so every node can show it came back.

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
}

impl Fault {
    /// Every kind, in a fixed order.
    pub const ALL: [Fault; 7] = [
        Fault::Kill,
        Fault::Stop,
        Fault::Clock,
        Fault::EtcdLeader,
        Fault::Term,
        Fault::CutFromEtcd,
        Fault::AuthChange,
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
            Fault::AuthChange => "every node".to_string(),
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
    while at <= last {
        if cycle.is_empty() {
            cycle = shape.faults();
            rng.shuffle(&mut cycle);
        }
        let fault = cycle.pop().unwrap_or(Fault::Kill);
        let slot = match fault {
            Fault::Clock => shape.clock_slot,
            Fault::CutFromEtcd => shape.netns_slot.unwrap_or(0),
            Fault::EtcdLeader | Fault::AuthChange => 0,
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn sixty_seconds_hold_every_fault_once_and_the_same_seed_the_same_plan() {
        let p = plan(7, &shape(60));
        assert_eq!(p, plan(7, &shape(60)));
        assert_ne!(p, plan(8, &shape(60)));
        for f in shape(60).faults() {
            assert_eq!(
                p.iter().filter(|x| x.fault == f).count(),
                1,
                "{f:?} in {p:?}"
            );
        }
        let end = p.last().map(|x| x.at).unwrap_or_default();
        assert!(
            end + Duration::from_secs(16) <= Duration::from_secs(61),
            "{p:?}"
        );
        assert!(p.iter().all(|x| x.slot < 3));
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
