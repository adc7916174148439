//! The layout's random start: each tick's sequence begins at a random value
//! (never reused within the tick, never wrapping past its top), so `id % N`
//! does not pile up on a few residues when few ids share a tick.

use std::collections::{BTreeMap, HashSet};
use std::thread;

use shardflake::{Generator, Id, LayoutError, ManualClock, preset};

const T0: u64 = 1_700_000_000_000;

/// Twitter's layout (the sequence in the low 12 bits), with a random start
/// of `bits` bits, or none.
fn snowflake_spec(bits: u32) -> String {
    let start = if bits > 0 {
        format!(", random start {bits} bits")
    } else {
        String::new()
    };
    format!(
        "time 41 | node 10 | sequence 12 (epoch {}{start})",
        preset::TWITTER_EPOCH_MS
    )
}

/// `id % 16` of `count` ids made at `per_second` ids per second (the manual
/// clock moved on between them, as that rate would).
fn residues(bits: u32, per_second: u64, count: u64) -> [u64; 16] {
    let clock = ManualClock::new(T0);
    let g = Generator::with_clock(
        preset::resolve(&snowflake_spec(bits)).unwrap(),
        clock.clone(),
    )
    .node("node", 5)
    .build()
    .unwrap();
    let mut histogram = [0; 16];
    for i in 0..count {
        // The clock of the i-th id: i / per_second seconds after T0.
        clock.set(T0 + i * 1_000 / per_second);
        histogram[(g.next_id().unwrap().get() % 16) as usize] += 1;
    }
    histogram
}

#[test]
fn random_start_spreads_id_mod_16_at_ten_ids_a_second() {
    // One id per tick: without a random start every id is ≡ 0 (mod 16).
    let before = residues(0, 10, 1_600);
    assert_eq!(before[0], 1_600, "{before:?}");
    // With it, each residue gets about 100 (binomial, sd 9.7: 50..150 is
    // over five standard deviations).
    let after = residues(4, 10, 1_600);
    assert!(after.iter().all(|&n| (50..=150).contains(&n)), "{after:?}");
}

#[test]
fn random_start_round_trips_in_the_spec_and_is_bounded_by_the_sequence() {
    let layout = preset::resolve(&snowflake_spec(4)).unwrap();
    assert_eq!(layout.random_start_bits(), 4);
    assert!(
        layout.to_string().contains("random start 4 bits"),
        "{layout}"
    );
    assert_eq!(preset::resolve(&layout.to_string()).unwrap(), layout);
    assert_eq!(
        preset::resolve(&snowflake_spec(12))
            .unwrap()
            .random_start_bits(),
        12
    );
    assert_eq!(
        preset::resolve(&snowflake_spec(13)),
        Err(LayoutError::RandomStartTooWide {
            bits: 13,
            sequence_bits: 12
        })
    );
    assert!(matches!(
        preset::resolve("time 41 | sequence 12 (random start many bits)"),
        Err(LayoutError::Spec { .. })
    ));
}

/// Two threads at the cap of a 16-ids-per-tick sequence (one on shared
/// calls, one on a local handle), on the real clock: no id twice, each
/// thread's ids increasing (so no tick's sequence wraps back below where it
/// was), and every tick starting at a random point within the start's
/// width.
#[test]
fn random_start_never_repeats_within_a_tick_under_two_threads_at_the_cap() {
    let layout = preset::resolve(&format!(
        "time 41 | sequence 4 (epoch {}, random start 3 bits)",
        preset::TWITTER_EPOCH_MS
    ))
    .unwrap();
    let g = Generator::builder(layout.clone()).build().unwrap();
    const PER_THREAD: usize = 4_000;
    let per_thread: Vec<Vec<Id>> = thread::scope(|s| {
        let shared = s.spawn(|| (0..PER_THREAD).map(|_| g.next_id().unwrap()).collect());
        let local = s.spawn(|| {
            let mut local = g.local(4);
            (0..PER_THREAD).map(|_| local.next_id().unwrap()).collect()
        });
        vec![shared.join().unwrap(), local.join().unwrap()]
    });
    assert!(g.stats().exhaustions > 0, "the threads must reach the cap");
    let mut seen = HashSet::new();
    let mut ticks: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for ids in &per_thread {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a thread's ids went down"
        );
        for &id in ids {
            assert!(seen.insert(id), "duplicate id {id}");
            let parts = id.decode(&layout).unwrap();
            ticks.entry(parts.tick).or_default().push(parts.sequence);
        }
    }
    // Each tick's first id is at its start, below 2^3; over hundreds of
    // ticks every start shows up.
    let starts: HashSet<u64> = ticks.values().map(|s| *s.iter().min().unwrap()).collect();
    assert_eq!(starts, (0..8).collect(), "{} ticks", ticks.len());
}
