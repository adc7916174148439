//! Generator throughput against the peer crates `ferroid` and
//! `snowflake_me`, in one run so that the ratios hold on a noisy machine.
//!
//! ```text
//! cargo bench -p shardflake --bench generator
//! ```
//!
//! Groups (results and ratios in docs/BENCHMARKS.md):
//! - `uncontended_16bit`: one thread, `next_id`, time 41 | node 6 | sequence 16.
//! - `uncontended_22bit`: the same on a 22-bit sequence, whose cap no thread
//!   reaches, so the time is the generator's own cost.
//! - `saturated_12bit`: one thread, `next_id`, Twitter's 12-bit sequence, whose
//!   cap is 4.096 million ids per second: the time per id shows how close to
//!   the cap each generator runs.
//! - `batch_1000`: `next_ids(1000)` and reading every id, on a 22-bit sequence.
//! - `shared_threads`: one generator shared by 1 and 2 threads on a 22-bit
//!   sequence; time per id over all threads.

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ferroid::define_snowflake_id;
use ferroid::generator::{AtomicSnowflakeGenerator, BasicSnowflakeGenerator, SnowflakeGenerator};
use ferroid::id::SnowflakeTwitterId;
use ferroid::time::MonotonicClock as FerroidClock;
use shardflake::{Generator, Layout, preset};

define_snowflake_id!(
    /// ferroid's id with the same 16-bit sequence as our layout.
    Ferroid16, u64,
    reserved: 1,
    timestamp: 41,
    machine_id: 6,
    sequence: 16
);

define_snowflake_id!(
    /// ferroid's id with the same 22-bit sequence as our wide layout.
    Ferroid22, u64,
    reserved: 1,
    timestamp: 41,
    machine_id: 0,
    sequence: 22
);

fn layout(spec: &str) -> Layout {
    preset::resolve(spec).unwrap()
}

fn ours(layout: Layout) -> Generator {
    let mut b = Generator::builder(layout.clone());
    for f in layout.node_fields() {
        b = b.node(f.name(), 1);
    }
    b.build().unwrap()
}

/// snowflake_me insists on 63 bits: time 41, the sequence, and the rest
/// split between data center and machine.
fn snowflake_me(bits_sequence: u8) -> snowflake_me::Snowflake {
    let one = || Ok(1u16);
    let node = 22 - bits_sequence;
    snowflake_me::Snowflake::builder()
        .bit_len_sequence(bits_sequence)
        .bit_len_time(41)
        .bit_len_data_center_id(node / 2)
        .bit_len_machine_id(node - node / 2)
        .machine_id(&one)
        .data_center_id(&one)
        .finalize()
        .unwrap()
}

fn spin(_: u64) {
    std::hint::spin_loop();
}

fn uncontended_16bit(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended_16bit");
    group.throughput(Throughput::Elements(1));
    let g = ours(layout(
        "time 41 | node 6 | sequence 16 (epoch 1288834974657 ms)",
    ));
    group.bench_function("shardflake", |b| b.iter(|| black_box(g.next_id().unwrap())));
    let f = AtomicSnowflakeGenerator::<Ferroid16, _>::new(1, FerroidClock::default());
    group.bench_function("ferroid_atomic", |b| {
        b.iter(|| black_box(f.try_next_id(spin).unwrap()))
    });
    let f = BasicSnowflakeGenerator::<Ferroid16, _>::new(1, FerroidClock::default());
    group.bench_function("ferroid_basic", |b| {
        b.iter(|| black_box(f.try_next_id(spin).unwrap()))
    });
    let s = snowflake_me(16);
    group.bench_function("snowflake_me", |b| {
        b.iter(|| black_box(s.next_id().unwrap()))
    });
    group.finish();
}

/// The generators' own cost: a 22-bit sequence (4.2 billion ids per second)
/// is a cap no single thread reaches.
fn uncontended_22bit(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended_22bit");
    group.throughput(Throughput::Elements(1));
    let g = ours(layout("time 41 | sequence 22 (epoch 1288834974657 ms)"));
    group.bench_function("shardflake", |b| b.iter(|| black_box(g.next_id().unwrap())));
    let mut local = g.local(4096);
    group.bench_function("shardflake_local", |b| {
        b.iter(|| black_box(local.next_id().unwrap()))
    });
    let f = AtomicSnowflakeGenerator::<Ferroid22, _>::new(0, FerroidClock::default());
    group.bench_function("ferroid_atomic", |b| {
        b.iter(|| black_box(f.try_next_id(spin).unwrap()))
    });
    let f = BasicSnowflakeGenerator::<Ferroid22, _>::new(0, FerroidClock::default());
    group.bench_function("ferroid_basic", |b| {
        b.iter(|| black_box(f.try_next_id(spin).unwrap()))
    });
    group.finish();
}

fn saturated_12bit(c: &mut Criterion) {
    let mut group = c.benchmark_group("saturated_12bit");
    group.throughput(Throughput::Elements(1));
    let g = ours(preset::by_name("snowflake").unwrap());
    group.bench_function("shardflake", |b| b.iter(|| black_box(g.next_id().unwrap())));
    let f = AtomicSnowflakeGenerator::<SnowflakeTwitterId, _>::new(1, FerroidClock::default());
    group.bench_function("ferroid_atomic", |b| {
        b.iter(|| black_box(f.try_next_id(spin).unwrap()))
    });
    let s = snowflake_me(12);
    group.bench_function("snowflake_me", |b| {
        b.iter(|| black_box(s.next_id().unwrap()))
    });
    group.finish();
}

fn batch_1000(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_1000");
    group.throughput(Throughput::Elements(1000));
    let g = ours(layout("time 41 | sequence 22 (epoch 1288834974657 ms)"));
    group.bench_function("shardflake_next_ids", |b| {
        b.iter(|| {
            for id in g.next_ids(1000).unwrap() {
                black_box(id);
            }
        })
    });
    group.bench_function("shardflake_next_id_x1000", |b| {
        b.iter(|| {
            for _ in 0..1000 {
                black_box(g.next_id().unwrap());
            }
        })
    });
    let f = AtomicSnowflakeGenerator::<Ferroid22, _>::new(0, FerroidClock::default());
    group.bench_function("ferroid_atomic_x1000", |b| {
        b.iter(|| {
            for _ in 0..1000 {
                black_box(f.try_next_id(spin).unwrap());
            }
        })
    });
    let s = snowflake_me(16);
    group.bench_function("snowflake_me_next_ids", |b| {
        b.iter(|| black_box(s.next_ids(1000).unwrap()))
    });
    group.finish();
}

/// `threads` threads each make `iters / threads` ids from one shared
/// generator, through per-thread state made by `init` on the thread; the
/// time is the slowest thread's, from a common start.
fn on_threads<S>(
    threads: usize,
    iters: u64,
    init: impl Fn() -> S + Sync,
    next: impl Fn(&mut S) + Sync,
) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut state = init();
                    barrier.wait();
                    let start = Instant::now();
                    for _ in 0..per_thread {
                        next(&mut state);
                    }
                    start.elapsed()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .max()
            .unwrap()
    })
}

fn shared_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("shared_threads");
    group.throughput(Throughput::Elements(1));
    let wide = "time 41 | sequence 22 (epoch 1288834974657 ms)";
    for threads in [1, 2] {
        let g = ours(layout(wide));
        group.bench_function(BenchmarkId::new("shardflake", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(
                    threads,
                    iters,
                    || (),
                    |_| {
                        black_box(g.next_id().unwrap());
                    },
                )
            })
        });
        let g = ours(layout(wide));
        // Each thread's handle lives on its own stack, as in real use.
        group.bench_function(BenchmarkId::new("shardflake_local", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(
                    threads,
                    iters,
                    || g.local(4096),
                    |local| {
                        black_box(local.next_id().unwrap());
                    },
                )
            })
        });
        let f = AtomicSnowflakeGenerator::<Ferroid22, _>::new(0, FerroidClock::default());
        group.bench_function(BenchmarkId::new("ferroid_atomic", threads), |b| {
            b.iter_custom(|iters| {
                on_threads(
                    threads,
                    iters,
                    || (),
                    |_| {
                        black_box(f.try_next_id(spin).unwrap());
                    },
                )
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = uncontended_16bit, uncontended_22bit, saturated_12bit, batch_1000, shared_threads
}
criterion_main!(benches);
