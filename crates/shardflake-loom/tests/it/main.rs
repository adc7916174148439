//! Model-checks the generator's state machine with loom: every interleaving
//! of concurrent `next_id`, `next_ids` and a clock moving underneath them
//! (up to loom's preemption bound) issues distinct ids, increasing on each
//! thread. Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p shardflake-loom --release
//! ```
//!
//! Without `--cfg loom` this file compiles to nothing.
#![cfg(loom)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use shardflake::{ExhaustedPolicy, Generator, Id, Layout, ManualClock};

const T0: u64 = 1_000;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Two ids per tick, and enough borrowing that no call ever sleeps: the
/// model explores the compare-and-swap races, not timeouts.
fn generator(clock: ManualClock) -> Generator<ManualClock> {
    let layout = Layout::builder("tiny")
        .epoch_ms(0)
        .time(30)
        .node("node", 2)
        .sequence(1)
        .build_at(T0)
        .unwrap();
    Generator::with_clock(layout, clock)
        .node("node", 2)
        .on_exhausted(ExhaustedPolicy::Borrow {
            max_lead: Duration::from_secs(1),
        })
        .build()
        .unwrap()
}

fn check(all: Vec<Vec<Id>>) {
    let mut seen = Vec::new();
    for ids in all {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a thread's ids went down: {ids:?}"
        );
        seen.extend(ids);
    }
    let n = seen.len();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), n, "duplicate id");
}

#[test]
fn concurrent_single_ids_and_batches_never_collide() {
    model(|| {
        let clock = ManualClock::new(T0);
        let g = Arc::new(generator(clock.clone()));
        let singles = {
            let g = g.clone();
            thread::spawn(move || vec![g.next_id().unwrap(), g.next_id().unwrap()])
        };
        let batch = {
            let g = g.clone();
            thread::spawn(move || g.next_ids(3).unwrap().iter().collect::<Vec<_>>())
        };
        // The clock moves while both run.
        clock.advance(1);
        let mine = vec![g.next_id().unwrap()];
        let (singles, batch) = (singles.join().unwrap(), batch.join().unwrap());
        // Linearizable: a call that starts after every other has returned
        // gets an id above all of theirs.
        let after = g.next_id().unwrap();
        let before = singles.iter().chain(&batch).chain(&mine).max().copied();
        assert!(Some(after) > before, "{after:?} not above {before:?}");
        check(vec![singles, batch, mine]);
    });
}

#[test]
fn local_handles_never_collide_with_shared_calls() {
    model(|| {
        let clock = ManualClock::new(T0);
        let g = Arc::new(generator(clock));
        let local = {
            let g = g.clone();
            thread::spawn(move || {
                let mut local = g.local(2);
                vec![
                    local.next_id().unwrap(),
                    local.next_id().unwrap(),
                    local.next_id().unwrap(),
                ]
            })
        };
        let shared = vec![g.next_id().unwrap(), g.next_id().unwrap()];
        check(vec![local.join().unwrap(), shared]);
    });
}
