//! Ids for rows from the past: a million rows in random time order get
//! distinct ids that decode to their rows' ticks and sort by them, while a
//! live generator makes ids on another node id.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use proptest::prelude::*;
use shardflake::{Backfill, Clock, Generator, Id, Layout, SystemClock, preset};

const ROWS: usize = 1_000_000;

/// splitmix64: the rows' times, reproducible from a seed.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `ROWS` times drawn at random from `window_ms` ms ending a minute before
/// `now`: in no order, many rows sharing a tick.
fn row_times(seed: u64, now: u64, window_ms: u64) -> Vec<u64> {
    let mut state = seed;
    let end = now - 60_000;
    (0..ROWS)
        .map(|_| end - 1 - next_random(&mut state) % window_ms)
        .collect()
}

/// Backfills `times` on node values `node`, checking each id against its
/// row: its tick, its node values; then no duplicate, and ids sorted by
/// their rows' ticks.
fn backfill_and_check(layout: &Layout, field: &str, node: u64, now: u64, times: &[u64]) -> Vec<Id> {
    let nodes = layout.nodes(&[(field, node)]).unwrap();
    let mut backfill = Backfill::new(layout.clone(), nodes, now);
    let mut rows: Vec<(u64, Id)> = Vec::with_capacity(times.len());
    for &t in times {
        let id = backfill.id_at(t).unwrap();
        let parts = id.decode(layout).unwrap();
        assert_eq!(
            parts.tick,
            layout.unix_ms_to_tick(t).unwrap(),
            "{id} at {t}"
        );
        assert_eq!(parts.field(field), Some(node));
        rows.push((parts.tick, id));
    }
    let distinct: HashSet<Id> = rows.iter().map(|(_, id)| *id).collect();
    assert_eq!(distinct.len(), rows.len(), "a backfill id repeated");
    rows.sort_by_key(|(_, id)| *id);
    assert!(
        rows.windows(2).all(|w| w[0].0 <= w[1].0),
        "ids out of their rows' time order"
    );
    rows.into_iter().map(|(_, id)| id).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4))]
    #[test]
    fn a_million_rows_in_random_order_get_distinct_ids_of_their_ticks(
        seed in any::<u64>(),
        sony in any::<bool>(),
        spread in 0u64..1000,
    ) {
        let (layout, field) = if sony {
            (preset::by_name("sonyflake").unwrap(), "machine")
        } else {
            (preset::by_name("snowflake").unwrap(), "node")
        };
        // At least twice the ticks a million rows fill, so none overflows;
        // up to a thousand times that (a few rows per tick).
        let min_ticks = 2 * ROWS as u64 / layout.ids_per_tick() + 1;
        let window = min_ticks * layout.tick_ms() * (1 + spread);
        let now = SystemClock.now_ms();
        backfill_and_check(&layout, field, 1, now, &row_times(seed, now, window));
    }
}

#[test]
fn a_backfill_beside_a_live_node_never_makes_a_live_id() {
    let layout = preset::by_name("snowflake").unwrap();
    let live = Generator::builder(layout.clone())
        .node("node", 1)
        .build()
        .unwrap();
    let now = SystemClock.now_ms();
    // A day of rows; the live node runs on node 1, the backfill on 1023.
    let times = row_times(0x5eed, now, 86_400_000);
    let done = AtomicBool::new(false);
    let (backfilled, live_ids) = thread::scope(|s| {
        let live_ids = s.spawn(|| {
            let mut ids = Vec::new();
            while !done.load(Ordering::Relaxed) || ids.len() < 10_000 {
                ids.push(live.next_id().unwrap());
            }
            ids
        });
        let backfilled = backfill_and_check(&layout, "node", 1023, now, &times);
        done.store(true, Ordering::Relaxed);
        (backfilled, live_ids.join().unwrap())
    });
    let live_set: HashSet<Id> = live_ids.iter().copied().collect();
    assert_eq!(live_set.len(), live_ids.len());
    assert!(backfilled.iter().all(|id| !live_set.contains(id)));
    // Every backfilled id is older than every live one: they sort as rows of
    // the past should.
    assert!(backfilled.iter().max() < live_ids.iter().min());
}
