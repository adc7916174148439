//! `id % 16` with and without the layout's random start, and what the
//! random start costs in capacity.
//!
//! ```text
//! cargo run --release -p shardflake --example id_mod_skew [TICKS]
//! ```
//!
//! 1. Histograms of `id % 16` for 16,000 ids made at 10, 1,000 and 100,000
//!    ids/s on Twitter's layout (`time 41 | node 10 | sequence 12`, the
//!    sequence in the low bits), without a random start and with one of 4
//!    bits. A manual clock moves by the time between two ids at that rate,
//!    so the figures are the generator's, not this machine's.
//! 2. The capacity the random start costs: ids per tick of a generator kept
//!    at its cap for TICKS ticks (default 10,000), on the manual clock (so
//!    the machine's load does not enter), with random starts of 0, 4, 8 and
//!    12 bits, against the sequence's 4,096.

use shardflake::wait::{Attempt, Step};
use shardflake::{Clock, Generator, Layout, ManualClock, preset};

const T0: u64 = 1_700_000_000_000;

fn layout(random_start_bits: u32) -> Layout {
    let start = match random_start_bits {
        0 => String::new(),
        bits => format!(", random start {bits} bits"),
    };
    preset::resolve(&format!(
        "time 41 | node 10 | sequence 12 (epoch {}{start})",
        preset::TWITTER_EPOCH_MS
    ))
    .expect("a valid layout")
}

fn histogram(random_start_bits: u32, per_second: u64, count: u64) -> [u64; 16] {
    let clock = ManualClock::new(T0);
    let g = Generator::with_clock(layout(random_start_bits), clock.clone())
        .node("node", 5)
        .build()
        .expect("node 5 fits");
    let mut counts = [0; 16];
    for i in 0..count {
        clock.set(T0 + i * 1_000 / per_second);
        let id = g.next_id().expect("the manual clock never goes back");
        counts[(id.get() % 16) as usize] += 1;
    }
    counts
}

fn print_histogram(counts: &[u64; 16]) {
    let total: u64 = counts.iter().sum();
    let widest = counts.iter().copied().max().unwrap_or(1).max(1);
    for (residue, &n) in counts.iter().enumerate() {
        let bar = "#".repeat((n * 40).div_ceil(widest) as usize);
        println!(
            "    {residue:>2} {:>5.1}% {bar}",
            100.0 * n as f64 / total as f64
        );
    }
}

/// Ids per tick of a generator kept at its cap for `ticks` ticks: every
/// call is made before the clock moves on, and the clock moves on only when
/// the tick is used up (the call asks to wait).
fn ids_per_tick_at_the_cap(random_start_bits: u32, ticks: u64) -> f64 {
    let clock = ManualClock::new(T0);
    let g = Generator::with_clock(layout(random_start_bits), clock.clone())
        .node("node", 5)
        .build()
        .expect("node 5 fits");
    let mut attempt = Attempt::new();
    let mut ids = 0u64;
    // The first tick is the one the generator was built in.
    while clock.now_ms() < T0 + ticks {
        match g
            .try_next_ids(1, &mut attempt)
            .expect("the clock never goes back")
        {
            Step::Ready(_) => {
                ids += 1;
                attempt = Attempt::new();
            }
            Step::Wait(_) => clock.advance(1),
        }
    }
    ids as f64 / ticks as f64
}

fn main() {
    let ticks: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    for per_second in [10, 1_000, 100_000] {
        for bits in [0, 4] {
            let label = match bits {
                0 => "no random start".to_string(),
                bits => format!("random start {bits} bits"),
            };
            println!("id % 16 at {per_second} ids/s, {label}:");
            print_histogram(&histogram(bits, per_second, 16_000));
        }
    }
    let cap = layout(0).ids_per_tick() as f64;
    println!("\nCapacity at the cap, {ticks} ticks of 1 ms each:");
    println!("random start | ids per tick (ids/s = 1000 x) | of the sequence | expected");
    for bits in [0, 4, 8, 12] {
        let per_tick = ids_per_tick_at_the_cap(bits, ticks);
        // A tick holds 4096 - start ids; the start is uniform below 2^bits.
        let expected = cap - ((1u64 << bits) - 1) as f64 / 2.0;
        println!(
            "{bits:>2} bits | {per_tick:.1} | {:.2}% | {expected:.1}",
            100.0 * per_tick / cap
        );
    }
}
