//! The `uncontended_22bit` comparison, timed in short windows: on a
//! machine other work shares, a window the thread lost its core in is an
//! outlier the median leaves out, where criterion's mean takes it in.
//!
//! ```text
//! cargo run --release -p shardflake --example generator_windows
//! ```
//!
//! 400 rounds; each round times 100,000 calls of each generator in turn
//! (shared `next_id`, `local()`, ferroid's atomic and basic generators, on
//! the same 22-bit sequence), so all four see the same minutes of load.
//! Prints the minimum, first quartile and median time per id.

use std::hint::black_box;
use std::time::Instant;

use ferroid::define_snowflake_id;
use ferroid::generator::{AtomicSnowflakeGenerator, BasicSnowflakeGenerator, SnowflakeGenerator};
use ferroid::time::MonotonicClock as FerroidClock;
use shardflake::{Generator, preset};

define_snowflake_id!(
    /// ferroid's id with the same 22-bit sequence as our layout.
    Ferroid22, u64,
    reserved: 1,
    timestamp: 41,
    machine_id: 0,
    sequence: 22
);

const ROUNDS: usize = 400;
const CALLS: u32 = 100_000;

fn spin(_: u64) {
    std::hint::spin_loop();
}

/// Nanoseconds per call of `call`, over one window.
fn window(mut call: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..CALLS {
        call();
    }
    start.elapsed().as_secs_f64() * 1e9 / f64::from(CALLS)
}

fn main() {
    let layout =
        preset::resolve("time 41 | sequence 22 (epoch 1288834974657 ms)").expect("a valid layout");
    let g = Generator::builder(layout).build().expect("no node field");
    let mut local = g.local(4096);
    let atomic = AtomicSnowflakeGenerator::<Ferroid22, _>::new(0, FerroidClock::default());
    let basic = BasicSnowflakeGenerator::<Ferroid22, _>::new(0, FerroidClock::default());
    let mut times: [Vec<f64>; 4] = Default::default();
    for _ in 0..ROUNDS {
        times[0].push(window(|| {
            black_box(g.next_id().expect("below the cap"));
        }));
        times[1].push(window(|| {
            black_box(local.next_id().expect("below the cap"));
        }));
        times[2].push(window(|| {
            black_box(atomic.try_next_id(spin).expect("infallible"));
        }));
        times[3].push(window(|| {
            black_box(basic.try_next_id(spin).expect("infallible"));
        }));
    }
    let names = [
        "shardflake",
        "shardflake_local",
        "ferroid_atomic",
        "ferroid_basic",
    ];
    for (name, t) in names.iter().zip(times.iter_mut()) {
        t.sort_by(f64::total_cmp);
        println!(
            "{name:17} min {:.2} ns  p25 {:.2} ns  median {:.2} ns",
            t[0],
            t[ROUNDS / 4],
            t[ROUNDS / 2]
        );
    }
}
