//! The checker: judges every recorded id without any service code, only the
//! core crate's layout to decode an id's time and node fields.
//!
//! What it checks, and why each is a promise of the service:
//!
//! - **duplicates**, exact over every id of every node: all runs sorted by
//!   their first id; two overlapping runs share an id ("no id twice, ever").
//! - **order per connection**: each connection's ids strictly increase in
//!   arrival order (one connection talks to one process; ARCHITECTURE.md
//!   invariant 2: any id returned before a call starts is smaller).
//! - **order across restarts**: every id of a slot's process k+1 is above
//!   every id of its process k (the same state file: a restart resumes after
//!   the recorded high-water, invariant 3); a process started without its
//!   state file (the state-lost fault) starts the order over.
//! - **lead**: an id's time minus the wall clock when its answer arrived;
//!   more than the limit (1 s) fails.
//! - **hand-overs**: per value of the node field, ids sorted; where the
//!   holder (slot, process) changes, the new holder's first id must be in a
//!   later tick than the old holder's last (fencing, invariant 6). A holder
//!   that comes back after another held the value is counted ("returns").
//! - **metrics**: each process's `shardflake_ids_issued_total` (last scrape)
//!   against what was collected from it; for a process that was scraped at
//!   its end the counter is exact and must be at least what was collected,
//!   for a SIGKILLed one it is only a lower bound.
//!
//! Outages, errors by code and whether each node came back are measured by
//! the load and the run (`load.rs`, `run.rs`) and passed in for the table.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use shardflake::Layout;

use crate::record::ConnLog;

/// The largest lead an id may have over the wall clock at receipt.
pub const MAX_LEAD_MS: i64 = 1000;

/// Examples kept per kind of violation.
const EXAMPLES: usize = 5;

/// What the run measured besides the ids.
#[derive(Debug, Default)]
pub struct RunFacts {
    /// Unix ms when the load began (`received_ms` counts from here).
    pub load_start_unix_ms: u64,
    /// Seconds the load ran.
    pub seconds: f64,
    /// Per slot: its name, whether it is the spare, the longest time without
    /// a successful answer (ms), and whether it answered after its last fault.
    pub slots: Vec<SlotFacts>,
    /// Errors by code (`http:no_lease`, `grpc:connect`, ...).
    pub errors: BTreeMap<String, u64>,
    /// Last scraped `shardflake_ids_issued_total` per (slot, process), and
    /// whether that scrape was at the process's end (exact).
    pub issued: BTreeMap<(usize, u32), (u64, bool)>,
    /// Things that went wrong outside the ids (a process that exited on its
    /// own, a process that did not stop): each fails the run.
    pub incidents: Vec<String>,
    /// (slot, process) started without its state file (the state-lost
    /// fault): the order across restarts starts over there.
    pub fresh_state: std::collections::BTreeSet<(usize, u32)>,
    /// From (slot, process) on, the slot runs a later layout whose epoch is
    /// this many ms earlier (the layout-change fault): its ids' time, read
    /// with the run's first layout, is that much past the id's own.
    pub epoch_earlier_ms: BTreeMap<(usize, u32), i64>,
}

/// One node slot's facts.
#[derive(Debug, Default, Clone)]
pub struct SlotFacts {
    /// `node0`, ..., `spare`.
    pub name: String,
    /// The spare runs only during SIGSTOP faults; it is not required to answer at the end.
    pub spare: bool,
    /// Processes started in this slot.
    pub processes: u32,
    /// The longest stretch without a successful answer, ms, and when it began (ms since load start).
    pub longest_outage_ms: u64,
    /// When that stretch began.
    pub longest_outage_from_ms: u64,
    /// Answered after the last fault of the run was over.
    pub came_back: bool,
}

/// The checker's findings.
#[derive(Debug, Default)]
pub struct Report {
    /// Ids collected, all connections.
    pub ids: u64,
    /// Ids per protocol.
    pub ids_by_protocol: BTreeMap<&'static str, u64>,
    /// Runs (the recording's size).
    pub runs: u64,
    /// Connections recorded.
    pub connections: usize,
    /// Ids seen more than once (counted per extra occurrence).
    pub duplicates: u64,
    /// A few duplicated ids with who returned them.
    pub duplicate_examples: Vec<String>,
    /// Ids not above their connection's previous id.
    pub order_violations: u64,
    /// A few of them.
    pub order_examples: Vec<String>,
    /// Processes whose ids were not all above the slot's previous process.
    pub restart_order_violations: u64,
    /// A few of them.
    pub restart_order_examples: Vec<String>,
    /// The largest lead (id time minus receipt), ms; negative when every id lagged.
    pub max_lead_ms: i64,
    /// Whether the ids carry a time to lead by (not ticket numbers).
    pub lead_judged: bool,
    /// Ids (runs) whose lead exceeded [`MAX_LEAD_MS`].
    pub lead_violations: u64,
    /// A few of them.
    pub lead_examples: Vec<String>,
    /// Changes of holder of a node-field value.
    pub hand_overs: u64,
    /// Hand-overs where the new holder started in the old holder's last tick or before.
    pub hand_over_violations: u64,
    /// A few of them.
    pub hand_over_examples: Vec<String>,
    /// A holder that held a value again after another had it.
    pub holder_returns: u64,
    /// Distinct node-field values seen.
    pub node_values: usize,
    /// Collected per (slot, process).
    pub collected: BTreeMap<(usize, u32), u64>,
    /// Processes whose exact final counter is below what was collected from them.
    pub metric_violations: u64,
    /// A few of them.
    pub metric_examples: Vec<String>,
}

impl Report {
    /// Failures that make the run fail (beside the run's own facts).
    pub fn failed(&self) -> bool {
        self.duplicates > 0
            || self.order_violations > 0
            || self.restart_order_violations > 0
            || self.lead_violations > 0
            || self.hand_over_violations > 0
            || self.metric_violations > 0
    }
}

fn push_example(list: &mut Vec<String>, text: impl FnOnce() -> String) {
    if list.len() < EXAMPLES {
        list.push(text());
    }
}

/// Checks every id in `logs`; `node_field` names the field node ids go into.
/// Without a layout (plain integers: ticket servers) there is no time to
/// lead and no node field: duplicates and order are judged.
pub fn check(
    logs: &[ConnLog],
    layout: Option<&Layout>,
    node_field: &str,
    facts: &RunFacts,
) -> Report {
    let mut r = Report {
        connections: logs.len(),
        max_lead_ms: i64::MIN,
        lead_judged: layout.is_some(),
        ..Report::default()
    };
    // Without the node field (not in this layout) there are no hand-overs to judge.
    let node = layout.and_then(|l| l.field(node_field));
    let id_ms = |id: u64| layout.map(|l| l.tick_to_unix_ms(l.time().extract(id)) as i64);
    let start_ms = facts.load_start_unix_ms as i64;

    // Per connection: order and lead, and per-process id ranges.
    let mut ranges: BTreeMap<(usize, u32), (u64, u64)> = BTreeMap::new();
    for log in logs {
        r.ids += log.ids;
        r.runs += log.runs.len() as u64;
        *r.ids_by_protocol.entry(log.protocol.name()).or_default() += log.ids;
        *r.collected.entry((log.slot, log.incarnation)).or_default() += log.ids;
        let mut previous: Option<u64> = None;
        let earlier_ms = facts
            .epoch_earlier_ms
            .range(..=(log.slot, log.incarnation))
            .next_back()
            .filter(|((slot, _), _)| *slot == log.slot)
            .map_or(0, |(_, ms)| *ms);
        for run in &log.runs {
            if let Some(p) = previous.filter(|&p| run.start <= p) {
                r.order_violations += 1;
                push_example(&mut r.order_examples, || {
                    format!(
                        "slot {} process {} {}: {} after {}",
                        log.slot,
                        log.incarnation,
                        log.protocol.name(),
                        run.start,
                        p
                    )
                });
            }
            previous = Some(run.last());
            // Every id of a run is in the same tick.
            let lead = id_ms(run.start)
                .map(|ms| ms - earlier_ms - (start_ms + i64::from(run.received_ms)));
            if let Some(lead) = lead {
                r.max_lead_ms = r.max_lead_ms.max(lead);
            }
            if let Some(lead) = lead.filter(|&l| l > MAX_LEAD_MS) {
                r.lead_violations += 1;
                push_example(&mut r.lead_examples, || {
                    format!(
                        "slot {} {}: id {} stamped {} ms ahead of its receipt",
                        log.slot,
                        log.protocol.name(),
                        run.start,
                        lead
                    )
                });
            }
            let range = ranges
                .entry((log.slot, log.incarnation))
                .or_insert((run.start, run.last()));
            range.0 = range.0.min(run.start);
            range.1 = range.1.max(run.last());
        }
    }

    // Across restarts of one slot: process k+1 entirely above process k.
    let mut by_slot: BTreeMap<usize, Vec<(u32, u64, u64)>> = BTreeMap::new();
    for (&(slot, inc), &(lo, hi)) in &ranges {
        by_slot.entry(slot).or_default().push((inc, lo, hi));
    }
    for (slot, procs) in &by_slot {
        // A process with no ids leaves no range; compare each with the highest before it.
        let mut highest_before: Option<(u32, u64)> = None;
        for &(inc, lo, hi) in procs {
            if facts.fresh_state.contains(&(*slot, inc)) {
                highest_before = None;
            }
            if let Some((prev_inc, prev_hi)) = highest_before.filter(|&(_, h)| lo <= h) {
                r.restart_order_violations += 1;
                push_example(&mut r.restart_order_examples, || {
                    format!(
                        "slot {slot}: process {inc} issued {lo}, not above process {prev_inc}'s {prev_hi}"
                    )
                });
            }
            if highest_before.is_none_or(|(_, h)| hi > h) {
                highest_before = Some((inc, hi));
            }
        }
    }

    // Every run, sorted by first id: duplicates and hand-overs.
    let mut all: Vec<(u64, u32, u32)> = Vec::with_capacity(r.runs as usize);
    for (i, log) in logs.iter().enumerate() {
        all.extend(log.runs.iter().map(|run| (run.start, run.len, i as u32)));
    }
    all.sort_unstable();
    // Holder of a node value: (slot, process); last id and holder per value.
    let mut holders: HashMap<u64, ((usize, u32), u64)> = HashMap::new();
    let mut held_before: HashMap<u64, Vec<(usize, u32)>> = HashMap::new();
    let mut covered_to: Option<(u64, u32)> = None; // highest id so far, and its connection
    for &(start, len, conn) in &all {
        let last = start + u64::from(len) - 1;
        if let Some((top, top_conn)) = covered_to.filter(|&(top, _)| start <= top) {
            let overlap = top.min(last) - start + 1;
            r.duplicates += overlap;
            push_example(&mut r.duplicate_examples, || {
                let (a, b) = (&logs[top_conn as usize], &logs[conn as usize]);
                format!(
                    "id {start} ({overlap} ids from it): slot {} process {} {} and slot {} process {} {}",
                    a.slot,
                    a.incarnation,
                    a.protocol.name(),
                    b.slot,
                    b.incarnation,
                    b.protocol.name()
                )
            });
        }
        if covered_to.is_none_or(|(top, _)| last > top) {
            covered_to = Some((last, conn));
        }

        let (Some(node), Some(layout)) = (node, layout) else {
            continue;
        };
        let time = layout.time();
        let log = &logs[conn as usize];
        let holder = (log.slot, log.incarnation);
        let value = node.extract(start);
        match holders.get_mut(&value) {
            Some((h, last_of_holder)) if *h == holder => *last_of_holder = last,
            Some((h, last_of_holder)) => {
                r.hand_overs += 1;
                if time.extract(start) <= time.extract(*last_of_holder) {
                    r.hand_over_violations += 1;
                    let (old, old_last) = (*h, *last_of_holder);
                    push_example(&mut r.hand_over_examples, || {
                        format!(
                            "{node_field} {value}: slot {} process {} began at {start} in the tick of slot {} process {}'s {old_last}",
                            holder.0, holder.1, old.0, old.1
                        )
                    });
                }
                let seen = held_before.entry(value).or_default();
                if seen.contains(&holder) {
                    r.holder_returns += 1;
                }
                seen.push(*h);
                *h = holder;
                *last_of_holder = last;
            }
            None => {
                holders.insert(value, (holder, last));
            }
        }
    }
    r.node_values = holders.len();
    if r.max_lead_ms == i64::MIN {
        r.max_lead_ms = 0;
    }

    for (&key, &collected) in &r.collected {
        if let Some(&(issued, true)) = facts.issued.get(&key)
            && issued < collected
        {
            r.metric_violations += 1;
            push_example(&mut r.metric_examples, || {
                format!(
                    "slot {} process {}: counter {issued} < {collected} collected",
                    key.0, key.1
                )
            });
        }
    }
    r
}

/// Unix ms now.
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn verdict(ok: bool) -> &'static str {
    if ok { "ok" } else { "FAIL" }
}

/// The table printed at the end of a run; `passed` is the overall verdict.
pub fn table(r: &Report, facts: &RunFacts, passed: bool) -> String {
    let mut t = String::new();
    let rate = r.ids as f64 / facts.seconds.max(0.001);
    let protocols: Vec<String> = r
        .ids_by_protocol
        .iter()
        .map(|(p, n)| format!("{p} {n}"))
        .collect();
    let _ = writeln!(t, "| check | result | verdict |");
    let _ = writeln!(t, "|---|---|---|");
    let _ = writeln!(
        t,
        "| ids collected | {} in {:.0} s ({:.2} M/s; {}), {} runs, {} connections | |",
        r.ids,
        facts.seconds,
        rate / 1e6,
        protocols.join(", "),
        r.runs,
        r.connections
    );
    let _ = writeln!(
        t,
        "| duplicates (exact, all nodes) | {} | {} |",
        r.duplicates,
        verdict(r.duplicates == 0)
    );
    let _ = writeln!(
        t,
        "| order per connection | {} violations | {} |",
        r.order_violations,
        verdict(r.order_violations == 0)
    );
    let _ = writeln!(
        t,
        "| order across restarts (same state file) | {} violations | {} |",
        r.restart_order_violations,
        verdict(r.restart_order_violations == 0)
    );
    if r.lead_judged {
        let _ = writeln!(
            t,
            "| max lead (id time - wall clock at receipt) | {} ms (limit {MAX_LEAD_MS} ms), {} over | {} |",
            r.max_lead_ms,
            r.lead_violations,
            verdict(r.lead_violations == 0)
        );
    } else {
        let _ = writeln!(t, "| max lead | n/a: the ids carry no time | |");
    }
    let _ = writeln!(
        t,
        "| node-id hand-overs | {} over {} values, {} returns, {} new holder not after old | {} |",
        r.hand_overs,
        r.node_values,
        r.holder_returns,
        r.hand_over_violations,
        verdict(r.hand_over_violations == 0)
    );
    let issued_sum: u64 = facts.issued.values().map(|&(n, _)| n).sum();
    let exact = facts.issued.values().filter(|&&(_, e)| e).count();
    let _ = writeln!(
        t,
        "| ids_issued_total (sum of last scrapes) | at least {issued_sum} ({exact} of {} processes scraped at their end), collected {} | {} |",
        facts.issued.len(),
        r.ids,
        verdict(r.metric_violations == 0)
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "| node | processes | collected | issued (last scrape) | longest outage | came back |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|");
    // One row for a whole run (db, tickets): its logs may use slots as
    // client numbers.
    let one = facts.slots.len() == 1;
    for (slot, s) in facts.slots.iter().enumerate() {
        let collected: u64 = r
            .collected
            .iter()
            .filter(|((sl, _), _)| *sl == slot || one)
            .map(|(_, n)| n)
            .sum();
        let issued: u64 = facts
            .issued
            .iter()
            .filter(|((sl, _), _)| *sl == slot)
            .map(|(_, (n, _))| n)
            .sum();
        let back = if s.spare {
            "(spare)"
        } else {
            verdict(s.came_back)
        };
        let _ = writeln!(
            t,
            "| {} | {} | {collected} | ≥ {issued} | {:.2} s from +{:.1} s | {back} |",
            s.name,
            s.processes,
            s.longest_outage_ms as f64 / 1000.0,
            s.longest_outage_from_ms as f64 / 1000.0,
        );
    }
    let _ = writeln!(t);
    let errors: Vec<String> = facts
        .errors
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect();
    let _ = writeln!(
        t,
        "errors by code: {}",
        if errors.is_empty() {
            "none".to_string()
        } else {
            errors.join(", ")
        }
    );
    for (title, list) in [
        ("duplicate", &r.duplicate_examples),
        ("order", &r.order_examples),
        ("restart order", &r.restart_order_examples),
        ("lead", &r.lead_examples),
        ("hand-over", &r.hand_over_examples),
        ("metrics", &r.metric_examples),
        ("incident", &facts.incidents),
    ] {
        for e in list {
            let _ = writeln!(t, "{title}: {e}");
        }
    }
    let _ = writeln!(t, "result: {}", if passed { "PASS" } else { "FAIL" });
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Protocol;

    fn layout() -> Layout {
        shardflake::preset::resolve("snowflake").expect("preset")
    }

    /// An id of the snowflake layout at `ms` after its epoch.
    fn id(layout: &Layout, unix_ms: u64, node: u64, seq: u64) -> u64 {
        let nodes = layout.nodes(&[("node", node)]).expect("node");
        layout.compose(unix_ms, &nodes, seq).expect("id").0
    }

    fn log(slot: usize, inc: u32, ids: &[u64], received_ms: u32) -> ConnLog {
        let mut l = ConnLog::new(slot, inc, Protocol::Grpc, layout().sequence().max());
        l.record(ids, received_ms);
        l
    }

    fn facts(start: u64) -> RunFacts {
        RunFacts {
            load_start_unix_ms: start,
            seconds: 1.0,
            ..RunFacts::default()
        }
    }

    const T: u64 = 1_800_000_000_000;

    #[test]
    fn a_clean_recording_passes() {
        let l = layout();
        let a = log(
            0,
            0,
            &[id(&l, T, 1, 0), id(&l, T, 1, 1), id(&l, T + 1, 1, 0)],
            5,
        );
        let b = log(1, 0, &[id(&l, T, 2, 0), id(&l, T + 2, 2, 7)], 5);
        let r = check(&[a, b], Some(&l), "node", &facts(T));
        assert!(!r.failed(), "{r:?}");
        assert_eq!((r.ids, r.duplicates, r.hand_overs), (5, 0, 0));
        assert_eq!(r.max_lead_ms, 2 - 5);
    }

    #[test]
    fn finds_a_duplicate_across_nodes_and_an_order_violation() {
        let l = layout();
        let shared = id(&l, T, 3, 9);
        let a = log(0, 0, &[shared, shared + 1], 0);
        let b = log(1, 0, &[id(&l, T + 5, 3, 0), shared], 0);
        let r = check(&[a, b], Some(&l), "node", &facts(T));
        assert_eq!(r.duplicates, 1, "{r:?}");
        assert_eq!(r.order_violations, 1, "{r:?}");
        // Two holders of node 3 in the same tick: a failed hand-over.
        assert!(r.hand_over_violations >= 1, "{r:?}");
        assert!(r.failed());
    }

    #[test]
    fn finds_lead_and_a_restart_below_its_predecessor() {
        let l = layout();
        let early = log(0, 0, &[id(&l, T + 1500, 1, 0)], 0);
        let late = log(0, 1, &[id(&l, T + 1000, 1, 0)], 2000);
        let r = check(&[early, late], Some(&l), "node", &facts(T));
        assert_eq!(r.lead_violations, 1, "{r:?}");
        assert_eq!(r.max_lead_ms, 1500);
        assert_eq!(r.restart_order_violations, 1, "{r:?}");
    }

    #[test]
    fn a_clean_hand_over_is_counted_and_passes() {
        let l = layout();
        let old = log(0, 0, &[id(&l, T, 4, 0), id(&l, T + 1, 4, 0)], 10);
        let new = log(3, 0, &[id(&l, T + 2, 4, 0)], 10);
        let r = check(&[old, new], Some(&l), "node", &facts(T));
        assert_eq!((r.hand_overs, r.hand_over_violations), (1, 0), "{r:?}");
        assert!(!r.failed());
    }

    #[test]
    fn an_exact_counter_below_the_collected_ids_fails() {
        let l = layout();
        let a = log(0, 0, &[id(&l, T, 1, 0), id(&l, T, 1, 1)], 0);
        let mut f = facts(T);
        f.issued.insert((0, 0), (1, true));
        assert_eq!(check(&[a], Some(&l), "node", &f).metric_violations, 1);
        let a = log(0, 0, &[id(&l, T, 1, 0), id(&l, T, 1, 1)], 0);
        f.issued.insert((0, 0), (1, false)); // SIGKILLed: only a lower bound
        assert_eq!(check(&[a], Some(&l), "node", &f).metric_violations, 0);
    }

    #[test]
    fn plain_numbers_are_judged_for_duplicates_and_order_only() {
        // Ticket numbers: no layout, no time, no node field.
        let mut a = ConnLog::new(0, 0, Protocol::MariaDb, u64::MAX);
        a.record(&[1, 3, 5, 7], 10);
        let mut b = ConnLog::new(1, 0, Protocol::MariaDb, u64::MAX);
        b.record(&[2, 4, 6, 5], 10);
        let r = check(&[a, b], None, "", &facts(T));
        assert_eq!((r.duplicates, r.order_violations), (1, 1));
        assert_eq!((r.lead_violations, r.hand_overs), (0, 0));
        assert!(!r.lead_judged && r.failed());
    }
}
