//! The keeper's fencing and high-water logic, in process: the real
//! [`Issuer`], the in-memory registry, paused tokio time, and a wall clock
//! that follows tokio's, so advancing time moves both, as it does for a
//! real process that sleeps or is stopped.

use std::collections::HashSet;
use std::path::Path;

use shardflake::{Clock, Id};
use tempfile::TempDir;

use super::*;
use crate::config::Config;
use crate::error::IssueError;
use crate::registry::MemoryRegistry;

const TTL: Duration = Duration::from_secs(10);
const MARGIN: Duration = Duration::from_secs(2);
/// Renewals every (TTL − margin) / 4.
const RENEW_EVERY: Duration = Duration::from_secs(2);
const STEP: Duration = Duration::from_millis(10);

/// Wall time from a fixed Unix ms, advanced by tokio's clock.
#[derive(Debug)]
struct FollowingClock {
    start: Instant,
    start_ms: u64,
}

impl Clock for FollowingClock {
    fn now_ms(&self) -> u64 {
        self.start_ms + self.start.elapsed().as_millis() as u64
    }
}

/// One node: its issuer, state file directory and shutdown switch.
struct Node {
    issuer: Arc<Issuer>,
    _dir: TempDir,
    shutdown: watch::Sender<bool>,
}

fn config(dir: &Path, window: &str) -> Config {
    let text = format!(
        r#"
state_file = "{}/state"
window = "{window}"
[etcd]
endpoints = ["http://127.0.0.1:9"]
prefix = "/t"
lease_ttl = "{}s"
safety_margin = "{}s"
"#,
        dir.display(),
        TTL.as_secs(),
        MARGIN.as_secs()
    );
    Config::from_toml(&text).unwrap()
}

fn node(window: &str) -> Node {
    let dir = TempDir::new().unwrap();
    let clock = Arc::new(FollowingClock {
        start: Instant::now(),
        start_ms: 1_750_000_000_000,
    });
    Node {
        issuer: Arc::new(Issuer::with_clock(config(dir.path(), window), clock)),
        _dir: dir,
        shutdown: watch::channel(false).0,
    }
}

impl Node {
    async fn start(&self, registry: &MemoryRegistry) -> Keeper {
        Keeper::start(
            self.issuer.clone(),
            Box::new(registry.clone()),
            "test".into(),
            self.shutdown.subscribe(),
        )
        .await
        .unwrap()
        .expect("no shutdown asked")
    }

    /// Runs the keeper as the server does; the task ends when the node is
    /// shut down (drained at once) or the keeper stops it.
    fn run(&self, mut keeper: Keeper) -> tokio::task::JoinHandle<Result<(), KeeperError>> {
        let (shutdown, drained) = (self.shutdown.subscribe(), self.shutdown.subscribe());
        tokio::spawn(async move { keeper.run(shutdown, drained).await })
    }

    fn ms_of(&self, id: Id) -> u64 {
        let layout = self.issuer.layout();
        layout.tick_to_unix_ms(layout.time().extract(id.get()))
    }

    fn node_of(&self, id: Id) -> u64 {
        crate::issuer::node_of(self.issuer.layout(), "node", id).unwrap()
    }

    fn renewals(&self) -> u64 {
        self.issuer.metrics.renewals.load(Ordering::Relaxed)
    }
}

/// Cuts the registry off right after a renewal (`hang`: its calls then
/// take a minute before failing, so the keeper is stuck in one and only
/// the issuer's own fence can refuse) and checks that ids stop at that
/// renewal's send time + TTL − margin: not later, and not much earlier.
async fn fence_closes_at_the_deadline(hang: bool) {
    let registry = MemoryRegistry::new();
    let a = node("60s"); // the high-water fence stays out of the way
    let task = a.run(a.start(&registry).await);
    // The fence is then at that renewal's send time + TTL − margin,
    // within one STEP.
    let seen = a.renewals();
    while a.renewals() == seen {
        tokio::time::sleep(STEP).await;
    }
    registry.set_reachable(false);
    if hang {
        registry.set_answer_delay(Duration::from_secs(60));
    }
    let outage = Instant::now();
    let fence = outage + (TTL - MARGIN);
    let mut first_refusal = None;
    while Instant::now() < outage + TTL + RENEW_EVERY {
        let now = Instant::now();
        match a.issuer.next_id().await {
            Ok(_) => {
                assert!(now < fence, "issued {:?} after the outage", now - outage);
                assert!(first_refusal.is_none(), "issued again after refusing");
            }
            Err(e) => {
                if hang {
                    assert_eq!(e, IssueError::Fenced);
                } else {
                    assert!(
                        matches!(e, IssueError::Fenced | IssueError::NoLease(_)),
                        "{e}"
                    );
                }
                assert!(a.issuer.readiness().is_err());
                first_refusal.get_or_insert(now);
            }
        }
        tokio::time::sleep(STEP).await;
    }
    let refused = first_refusal.expect("never fenced");
    assert!(
        refused >= fence - 2 * STEP,
        "fenced {:?} after the outage, before TTL − margin",
        refused - outage
    );
    a.shutdown.send_replace(true);
    if !hang {
        task.await.unwrap().unwrap();
    }
}

// Caught: renewal answers ignored (the fence never moves: refused early).
#[tokio::test(start_paused = true)]
async fn failing_renewals_fence_the_issuer_before_the_ttl_never_after() {
    fence_closes_at_the_deadline(false).await;
}

// Caught: a broken lease fence (the issuer's check removed: the keeper,
// stuck in a renewal, cannot withdraw the identity, and ids flow on).
#[tokio::test(start_paused = true)]
async fn a_hanging_registry_fences_the_issuer_by_itself() {
    fence_closes_at_the_deadline(true).await;
}

// Caught: a broken lease fence (with the check removed the next id is
// issued, since nothing else has run to withdraw the identity).
#[tokio::test(start_paused = true)]
async fn a_process_paused_past_its_lease_refuses_before_any_task_runs() {
    let registry = MemoryRegistry::new();
    let a = node("60s");
    let before = Instant::now();
    // Never run: no background task can withdraw the identity.
    let _keeper = a.start(&registry).await;
    let after = Instant::now();
    a.issuer.next_id().await.unwrap();
    tokio::time::advance((before + TTL - MARGIN - STEP) - Instant::now()).await;
    a.issuer.next_id().await.unwrap();
    // Woken at the deadline: wall and monotonic time have both moved.
    tokio::time::advance((after + TTL - MARGIN) - Instant::now()).await;
    assert_eq!(a.issuer.next_id().await, Err(IssueError::Fenced));
    assert_eq!(a.issuer.readiness(), Err(IssueError::Fenced));
    tokio::time::advance(TTL).await;
    assert_eq!(a.issuer.next_id().await, Err(IssueError::Fenced));
}

// Caught: a broken high-water bound (the issuer's check against the durable
// high-water removed: ids are stamped past the last record).
#[tokio::test(start_paused = true)]
async fn no_id_is_stamped_past_the_recorded_high_water_even_while_records_fail() {
    let registry = MemoryRegistry::new();
    let a = node("3s");
    let task = a.run(a.start(&registry).await);
    let check = |id: Id| {
        let recorded = registry.high_water(a.node_of(id)).unwrap();
        assert!(
            a.ms_of(id) <= recorded,
            "id at {} past the record {recorded}",
            a.ms_of(id)
        );
    };
    for _ in 0..200 {
        check(a.issuer.next_id().await.unwrap());
        tokio::time::sleep(STEP).await;
    }
    registry.fail_high_water_records(true);
    let (mut issued, mut refused) = (0, 0);
    for _ in 0..1000 {
        match a.issuer.next_id().await {
            Ok(id) => {
                check(id);
                issued += 1;
            }
            Err(e) => {
                assert_eq!(e, IssueError::HighWaterNotRecorded);
                refused += 1;
            }
        }
        tokio::time::sleep(STEP).await;
    }
    assert!(
        issued > 0 && refused > 0,
        "{issued} issued, {refused} refused"
    );
    assert!(a.issuer.metrics.high_water_failures.load(Ordering::Relaxed) > 0);
    // Recording again: issuing resumes, under the new record.
    registry.fail_high_water_records(false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..100 {
        check(a.issuer.next_id().await.unwrap());
        tokio::time::sleep(STEP).await;
    }
    a.shutdown.send_replace(true);
    task.await.unwrap().unwrap();
}

// Caught: a successor that does not wait past the recorded high-water (its
// ids would not all sort after the previous holder's), and a keeper that
// ignores a lost lease (no re-acquisition under another id).
#[tokio::test(start_paused = true)]
async fn a_lost_lease_withdraws_reacquires_and_the_next_holder_resumes_after_its_high_water() {
    let registry = MemoryRegistry::new();
    let a = node("3s");
    let b = node("3s");
    let task = a.run(a.start(&registry).await);
    let mut from_a = Vec::new();
    for _ in 0..100 {
        from_a.push(a.issuer.next_id().await.unwrap());
        tokio::time::sleep(STEP).await;
    }
    // A's lease ends behind its back (expired, or deleted by an operator),
    // right after a record: A notices only at its next record or renewal.
    let writes = a.issuer.metrics.high_water_writes.load(Ordering::Relaxed);
    while a.issuer.metrics.high_water_writes.load(Ordering::Relaxed) == writes {
        from_a.push(a.issuer.next_id().await.unwrap());
        tokio::time::sleep(STEP).await;
    }
    registry.end_lease_of(0).unwrap();
    // A keeps issuing under its old id until it notices; B takes id 0 meanwhile.
    let b_start = {
        let (issuer, registry, rx) = (b.issuer.clone(), registry.clone(), b.shutdown.subscribe());
        tokio::spawn(async move { Keeper::start(issuer, Box::new(registry), "b".into(), rx).await })
    };
    // Both issue at every step: B's ids must sort after A's under node id
    // 0 even while A has not noticed yet.
    let mut from_b = Vec::new();
    let mut refused = 0;
    while !(b_start.is_finished() && a.issuer.active().is_some_and(|x| x.node_id == 1)) {
        match a.issuer.next_id().await {
            Ok(id) => from_a.push(id),
            Err(_) => refused += 1,
        }
        if let Ok(id) = b.issuer.next_id().await {
            from_b.push(id);
        }
        tokio::time::sleep(STEP).await;
    }
    let b_keeper = b_start.await.unwrap().unwrap().unwrap();
    assert!(refused > 0, "A never withdrew");
    assert_eq!(a.issuer.metrics.losses.load(Ordering::Relaxed), 1);
    for _ in 0..100 {
        from_a.push(a.issuer.next_id().await.unwrap());
        from_b.push(b.issuer.next_id().await.unwrap());
        tokio::time::sleep(STEP).await;
    }
    assert!(from_b.iter().all(|id| b.node_of(*id) == 0));
    let a_last_on_0 = from_a
        .iter()
        .filter(|id| a.node_of(**id) == 0)
        .max()
        .unwrap();
    assert!(
        from_b.iter().all(|id| id > a_last_on_0),
        "B's first id {} not after A's last {a_last_on_0} under node id 0",
        from_b[0]
    );
    assert_eq!(
        a.node_of(*from_a.last().unwrap()),
        1,
        "A re-acquired another id"
    );
    let all: HashSet<Id> = from_a.iter().chain(&from_b).copied().collect();
    assert_eq!(all.len(), from_a.len() + from_b.len(), "an id issued twice");
    a.shutdown.send_replace(true);
    task.await.unwrap().unwrap();
    drop(b_keeper);
}

/// Takes the node id away from A with `lose` and checks that A withdraws
/// within `within`.
async fn withdraws_when(lose: impl FnOnce(&MemoryRegistry), within: Duration) {
    let registry = MemoryRegistry::new();
    let a = node("3s");
    let task = a.run(a.start(&registry).await);
    tokio::time::sleep(Duration::from_millis(100)).await;
    lose(&registry);
    let lost = Instant::now();
    while a.issuer.metrics.losses.load(Ordering::Relaxed) == 0 {
        assert!(lost.elapsed() <= within, "not withdrawn within {within:?}");
        a.issuer.next_id().await.unwrap();
        tokio::time::sleep(STEP).await;
    }
    a.shutdown.send_replace(true);
    task.await.unwrap().unwrap();
}

// Caught: a renewal answered "gone" taken for a success (records fail
// here, so only the renewal can tell).
#[tokio::test(start_paused = true)]
async fn a_renewal_answered_gone_withdraws_the_node_id() {
    let lose = |r: &MemoryRegistry| {
        r.fail_high_water_records(true);
        r.end_lease_of(0).unwrap();
    };
    withdraws_when(lose, RENEW_EVERY + Duration::from_millis(250)).await;
}

// Caught: a record refused for not holding the id taken for a passing
// failure (the lease itself lives on here, so only the record can tell).
#[tokio::test(start_paused = true)]
async fn a_record_refused_for_another_holder_withdraws_the_node_id() {
    let lose = |r: &MemoryRegistry| r.delete_node_key(0);
    withdraws_when(lose, Duration::from_millis(1000 + 250)).await;
}

/// Ends A's lease, breaks the registry with `corrupt`, and returns the
/// error `run` stops with.
async fn reacquire_after(corrupt: impl FnOnce(&MemoryRegistry)) -> KeeperError {
    let registry = MemoryRegistry::new();
    let a = node("3s");
    let task = a.run(a.start(&registry).await);
    tokio::time::sleep(Duration::from_secs(1)).await;
    registry.end_lease_of(0).unwrap();
    corrupt(&registry);
    let stopped = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the keeper retried instead of stopping")
        .unwrap();
    assert!(a.issuer.active().is_none());
    assert_eq!(registry.live_leases(), 0, "the refused id's lease was kept");
    stopped.unwrap_err()
}

// Caught: a keeper that retries every re-acquisition error (today's
// behaviour before this test: the same id, forever).
#[tokio::test(start_paused = true)]
async fn a_corrupt_high_water_found_on_reacquire_stops_the_node() {
    let e = reacquire_after(|r| r.set_high_water_record(0, b"garbage")).await;
    assert!(
        matches!(e, KeeperError::Reacquire(AcquireError::BadHighWater { .. })),
        "{e:?}"
    );
    let shown = format!("{}: {}", e, std::error::Error::source(&e).unwrap());
    assert!(shown.contains("not a Unix ms high-water"), "{shown}");
}

#[tokio::test(start_paused = true)]
async fn a_layout_mismatch_found_on_reacquire_stops_the_node() {
    let e = reacquire_after(|r| r.set_layout_record(b"another layout")).await;
    assert!(
        matches!(
            e,
            KeeperError::Reacquire(AcquireError::LayoutMismatch { .. })
        ),
        "{e:?}"
    );
}

// Caught: an interrupted first acquisition that keeps its lease (the id
// stays held until the TTL ends).
#[tokio::test(start_paused = true)]
async fn shutdown_during_the_first_acquisition_revokes_the_lease() {
    let registry = MemoryRegistry::new();
    let a = node("3s");
    // Id 0's previous holder recorded a high-water 2 s ahead: start waits.
    let ahead = a.issuer.clock().now_ms() + 2_000;
    registry.set_high_water_record(0, ahead.to_string().as_bytes());
    let began = Instant::now();
    let start = tokio::spawn(Keeper::start(
        a.issuer.clone(),
        Box::new(registry.clone()),
        "a".into(),
        a.shutdown.subscribe(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(registry.holder(0).is_some(), "not waiting under a lease");
    a.shutdown.send_replace(true);
    let started = start.await.unwrap().unwrap();
    assert!(started.is_none());
    assert!(
        began.elapsed() < Duration::from_secs(1),
        "waited out the high-water"
    );
    assert_eq!(registry.holder(0), None);
    assert_eq!(registry.live_leases(), 0);
    assert!(a.issuer.active().is_none());
}

#[tokio::test(start_paused = true)]
async fn start_gives_up_on_an_unreachable_registry_after_its_deadline() {
    let registry = MemoryRegistry::new();
    registry.set_reachable(false);
    let a = node("3s");
    let began = Instant::now();
    let e = Keeper::start(
        a.issuer.clone(),
        Box::new(registry),
        "a".into(),
        a.shutdown.subscribe(),
    )
    .await
    .unwrap_err();
    // Five request timeouts (1 s by default here), at least 10 s.
    assert!(matches!(e, KeeperError::NoNodeId { .. }), "{e:?}");
    assert!(e.to_string().contains("no node id within 10s"), "{e}");
    let took = began.elapsed();
    assert!(
        took >= Duration::from_secs(10) && took < Duration::from_secs(11),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn stop_records_the_final_high_water_and_revokes() {
    let registry = MemoryRegistry::new();
    let a = node("3s");
    let mut keeper = a.start(&registry).await;
    let mut last = None;
    for _ in 0..10 {
        last = Some(a.issuer.next_id().await.unwrap());
        tokio::time::sleep(STEP).await;
    }
    keeper.stop().await;
    let last_ms = a.ms_of(last.unwrap());
    let recorded = registry.high_water(0).unwrap();
    assert!(
        recorded >= last_ms && recorded < last_ms + 1_000,
        "{recorded} vs {last_ms}"
    );
    assert_eq!(registry.live_leases(), 0);
    assert_eq!(
        a.issuer.next_id().await,
        Err(IssueError::NoLease("stopped"))
    );
}
