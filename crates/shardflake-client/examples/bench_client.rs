//! Measures the client against running `shardflake serve` nodes (see
//! `scripts/bench-client.sh`, which starts two and runs this):
//!
//! - sustained ids/s through a prefetching client (one fetcher per node),
//!   against the nodes' combined cap and against the batch endpoint driven
//!   directly (one task per node calling `next_ids` in a loop), HTTP and
//!   gRPC;
//! - the per-call cost of handing out an id from the buffer (a tight loop
//!   over ids already fetched);
//! - single-id latency without prefetch, HTTP and gRPC.
//!
//! `bench_client --http H1,H2 --grpc G1,G2 [--secs 5] [--batch 100000]
//! [--cap-per-node 4096000]`

use std::hint::black_box;
use std::time::{Duration, Instant};

use shardflake_client::{Client, Id, Prefetch, Transport};

struct Args {
    http: Vec<String>,
    grpc: Vec<String>,
    secs: u64,
    batch: u64,
    cap: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        http: Vec::new(),
        grpc: Vec::new(),
        secs: 5,
        batch: 100_000,
        cap: 4_096_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let list = || value.split(',').map(|s| format!("http://{s}")).collect();
        let num = || value.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--http" => a.http = list(),
            "--grpc" => a.grpc = list(),
            "--secs" => a.secs = num()?,
            "--batch" => a.batch = num()?,
            "--cap-per-node" => a.cap = num()?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.http.is_empty() || a.http.len() != a.grpc.len() {
        return Err("--http and --grpc: the same number of nodes".into());
    }
    Ok(a)
}

fn client(eps: &[String], t: Transport) -> Client {
    Client::builder()
        .endpoints(eps.iter().cloned())
        .transport(t)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client")
}

/// One task per node calling `next_ids(batch)` back to back: ids/s.
async fn direct(eps: &[String], t: Transport, batch: u64, secs: u64) -> f64 {
    let began = Instant::now();
    let end = began + Duration::from_secs(secs);
    let tasks: Vec<_> = eps
        .iter()
        .map(|e| {
            let c = client(std::slice::from_ref(e), t);
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < end {
                    n += c.next_ids(batch).await.expect("batch").len() as u64;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task");
    }
    total as f64 / began.elapsed().as_secs_f64()
}

/// One consumer taking ids from a prefetching client (one fetcher per
/// node) as fast as it can: ids/s, and the share of calls that had to wait.
async fn prefetched(eps: &[String], t: Transport, batch: u64, secs: u64) -> (f64, f64) {
    let c = client(eps, t);
    let buffer = c
        .prefetching(batch)
        .fetchers(eps.len())
        .start()
        .expect("prefetch");
    // Warm up: first batches in.
    buffer.next_id().await.expect("first id");
    let began = Instant::now();
    let end = began + Duration::from_secs(secs);
    let (mut n, mut waited) = (0u64, 0u64);
    loop {
        // Check the clock every 4096 ids, not every id.
        for _ in 0..4096 {
            match buffer.try_next() {
                Some(id) => {
                    black_box(id);
                }
                None => {
                    waited += 1;
                    black_box(buffer.next_id().await.expect("next_id"));
                }
            }
        }
        n += 4096;
        if Instant::now() >= end {
            break;
        }
    }
    (
        n as f64 / began.elapsed().as_secs_f64(),
        waited as f64 / n as f64,
    )
}

/// Nanoseconds per `try_next` over `n` ids already fetched.
fn per_call(ids: Vec<Id>) -> f64 {
    let n = ids.len();
    let buffer = Prefetch::from_ids(ids);
    let began = Instant::now();
    for _ in 0..n {
        black_box(buffer.try_next());
    }
    began.elapsed().as_nanos() as f64 / n as f64
}

/// Sequential single ids for `secs`: (calls, p50, p99, mean) in µs.
async fn latency(eps: &[String], t: Transport, secs: u64) -> (usize, f64, f64, f64) {
    let c = client(eps, t);
    for _ in 0..100 {
        c.next_id().await.expect("warm-up id");
    }
    let end = Instant::now() + Duration::from_secs(secs);
    let mut us = Vec::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        black_box(c.next_id().await.expect("id"));
        us.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() as f64 * q) as usize).min(us.len() - 1)];
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    (us.len(), at(0.5), at(0.99), mean)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bench_client: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let nodes = a.http.len() as u64;
        let cap = (a.cap * nodes) as f64;
        println!(
            "{} nodes, combined cap {:.0} ids/s; batch {}; {} s per run",
            nodes, cap, a.batch, a.secs
        );
        for (name, t, eps) in [
            ("http", Transport::Http, &a.http),
            ("grpc", Transport::Grpc, &a.grpc),
        ] {
            let d = direct(eps, t, a.batch, a.secs).await;
            let (p, waited) = prefetched(eps, t, a.batch, a.secs).await;
            println!(
                "{name}: batch endpoint direct {d:>10.0} ids/s ({:.1}% of cap) | prefetch {p:>10.0} ids/s ({:.1}% of cap, {:.2}x direct; {:.4}% of calls waited)",
                d / cap * 100.0,
                p / cap * 100.0,
                p / d,
                waited * 100.0
            );
        }
        let c = client(&a.http, Transport::Http);
        let mut ids = Vec::new();
        for _ in 0..10 {
            ids.extend(c.next_ids(a.batch).await.expect("batch"));
        }
        let n = ids.len();
        println!("buffer: {:.1} ns per try_next ({} ids fetched, one thread)", per_call(ids), n);
        for (name, t, eps) in [
            ("http", Transport::Http, &a.http),
            ("grpc", Transport::Grpc, &a.grpc),
        ] {
            let (calls, p50, p99, mean) = latency(eps, t, a.secs.min(3)).await;
            println!(
                "{name}: single id, no prefetch, one task: p50 {p50:.0} us, p99 {p99:.0} us, mean {mean:.0} us ({calls} calls)"
            );
        }
    });
}
