//! Many threads × many ids from one generator: every id distinct, every
//! thread's ids increasing, and in the shared mode, every id larger than any
//! id returned before its call started (checked through a published maximum).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use shardflake::{ExhaustedPolicy, Generator, Id, Layout, preset};

const THREADS: usize = 4;
const PER_THREAD: usize = 100_000;

fn snowflake() -> Generator {
    Generator::builder(preset::by_name("snowflake").unwrap())
        .node("node", 3)
        .build()
        .unwrap()
}

/// Runs `work(thread index)` on `THREADS` threads; returns each thread's ids.
fn on_threads(work: impl Fn(usize) -> Vec<Id> + Sync) -> Vec<Vec<Id>> {
    thread::scope(|s| {
        let work = &work;
        let workers: Vec<_> = (0..THREADS).map(|t| s.spawn(move || work(t))).collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    })
}

fn assert_unique(per_thread: &[Vec<Id>]) {
    let mut seen = HashSet::with_capacity(per_thread.iter().map(Vec::len).sum());
    for ids in per_thread {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a thread's ids went down"
        );
        for id in ids {
            assert!(seen.insert(*id), "duplicate id {id}");
        }
    }
}

#[test]
fn shared_next_id_is_unique_and_linearizable() {
    let g = snowflake();
    // Highest id any call has returned so far.
    let published = AtomicU64::new(0);
    let per_thread = on_threads(|_| {
        (0..PER_THREAD)
            .map(|_| {
                let before = published.load(Ordering::SeqCst);
                let id = g.next_id().unwrap();
                assert!(
                    id.get() > before,
                    "{id} not above {before}, returned earlier"
                );
                published.fetch_max(id.get(), Ordering::SeqCst);
                id
            })
            .collect()
    });
    assert_unique(&per_thread);
}

#[test]
fn mixed_batches_and_single_ids_never_overlap() {
    let g = snowflake();
    let per_thread = on_threads(|t| {
        let mut ids = Vec::with_capacity(PER_THREAD);
        while ids.len() < PER_THREAD {
            if t % 2 == 0 {
                ids.extend(g.next_ids(1 + (ids.len() as u64 % 5000)).unwrap());
            } else {
                ids.push(g.next_id().unwrap());
            }
        }
        ids
    });
    assert_unique(&per_thread);
}

#[test]
fn local_handles_are_unique_and_increase_per_thread() {
    let g = snowflake();
    let per_thread = on_threads(|_| {
        let mut local = g.local(256);
        (0..PER_THREAD).map(|_| local.next_id().unwrap()).collect()
    });
    assert_unique(&per_thread);
    // Every id carries the tick it was made in: none ahead of the clock.
    let newest = per_thread
        .iter()
        .filter_map(|ids| ids.last())
        .max()
        .unwrap();
    let parts = newest.decode(g.layout()).unwrap();
    assert!(parts.unix_ms <= shardflake::Clock::now_ms_precise(g.clock()));
}

#[test]
fn saturated_small_sequence_with_borrowing_stays_unique() {
    // 16 ids per ms: every thread exhausts ticks constantly and borrows.
    let layout = Layout::builder("small")
        .epoch_ms(preset::TWITTER_EPOCH_MS)
        .time(41)
        .node("node", 4)
        .sequence(4)
        .build()
        .unwrap();
    let g = Generator::builder(layout)
        .node("node", 9)
        .on_exhausted(ExhaustedPolicy::Borrow {
            max_lead: Duration::from_millis(2),
        })
        .build()
        .unwrap();
    let per_thread = on_threads(|_| (0..2_000).map(|_| g.next_id().unwrap()).collect());
    assert_unique(&per_thread);
    assert!(
        g.stats().exhaustions > 0,
        "the test must exhaust the sequence"
    );
}

/// Batches spanning many ticks while single ids keep flowing the whole time,
/// shared or local: every batch completes (the generator's own bound, its
/// ticks plus the stall timeout, turns a hang into an error), no id is
/// handed out ahead of the clock, and no id is repeated.
fn batches_complete_under_single_id_traffic(local: bool) {
    let g = snowflake();
    // Set once the batches are done; the single-id threads stop then, or at
    // this deadline if the batches never finish (a hang, reported below).
    let done = std::sync::atomic::AtomicBool::new(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let singles = |_| {
        let mut ids = Vec::new();
        let mut handle = g.local(64);
        while !done.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
            for _ in 0..64 {
                ids.push(if local {
                    handle.next_id().unwrap()
                } else {
                    g.next_id().unwrap()
                });
            }
        }
        ids
    };
    let (batches, per_thread) = thread::scope(|s| {
        let workers: Vec<_> = (0..2).map(|t| s.spawn(move || singles(t))).collect();
        let batcher = s.spawn(|| {
            let mut batches = Vec::new();
            for count in [65_536, 1 << 20, 65_536, 100_000, 1 << 20, 65_536] {
                let batch = g.next_ids(count).unwrap();
                let now = shardflake::Clock::now_ms_precise(g.clock());
                let last = batch.last().decode(g.layout()).unwrap().unix_ms;
                assert!(
                    last <= now,
                    "batch stamped {last}, ahead of the clock {now}"
                );
                assert_eq!(batch.len(), count);
                batches.push(batch);
            }
            done.store(true, Ordering::Relaxed);
            batches
        });
        let batches = batcher.join().unwrap();
        let singles: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        (batches, singles)
    });
    assert!(
        std::time::Instant::now() < deadline,
        "the batches did not finish while single ids kept flowing"
    );
    assert!(per_thread.iter().all(|ids| !ids.is_empty()));
    let mut all: Vec<Id> = per_thread.iter().flatten().copied().collect();
    for ids in &per_thread {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a thread's ids went down"
        );
    }
    all.extend(batches.iter().flat_map(|b| b.iter()));
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "an id was issued twice");
}

#[test]
fn batches_complete_while_shared_single_ids_keep_flowing() {
    batches_complete_under_single_id_traffic(false);
}

#[test]
fn batches_complete_while_local_single_ids_keep_flowing() {
    batches_complete_under_single_id_traffic(true);
}
