//! The per-call cost of handing out a prefetched id (no network: a buffer
//! filled up front). `cargo bench -p shardflake-client --bench buffer`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use shardflake_client::{Id, Prefetch};

fn buffer(c: &mut Criterion) {
    const N: u64 = 1 << 20;
    let mut p = Prefetch::from_ids((0..N).map(Id).collect());
    let mut left = N;
    c.bench_function("prefetch try_next", |b| {
        b.iter(|| {
            if left == 0 {
                p = Prefetch::from_ids((0..N).map(Id).collect());
                left = N;
            }
            left -= 1;
            black_box(p.try_next())
        })
    });
}

criterion_group!(benches, buffer);
criterion_main!(benches);
