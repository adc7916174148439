//! A small gRPC load generator for `scripts/bench-serve.sh`:
//! `grpc_load HOST:PORT SECONDS CONCURRENCY BATCH` prints requests/s, ids/s
//! and p50/p99 latency. BATCH 1 calls NextId, larger calls NextIds.
//!
//! Every client connects before the clock starts; a call counts only if it
//! finished inside the measured window, and rates divide by that window.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use shardflake_service::grpc::pb;
use shardflake_testkit::grpc_client;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: grpc_load HOST:PORT SECONDS CONCURRENCY BATCH";
    anyhow::ensure!(args.len() == 5, usage);
    let (addr, secs, conc, batch) = (
        args[1].clone(),
        args[2].parse::<u64>().context(usage)?,
        args[3].parse::<usize>().context(usage)?,
        args[4].parse::<u64>().context(usage)?,
    );
    anyhow::ensure!(secs > 0 && conc > 0 && batch > 0, usage);
    let mut clients = Vec::with_capacity(conc);
    for _ in 0..conc {
        clients.push(grpc_client(&addr).await?);
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for mut g in clients {
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut ids) = (Vec::new(), 0u64);
            loop {
                let t = Instant::now();
                let n = if batch == 1 {
                    g.next_id(pb::NextIdRequest {}).await?;
                    1
                } else {
                    g.next_ids(pb::NextIdsRequest { count: batch })
                        .await?
                        .into_inner()
                        .ids
                        .len() as u64
                };
                let done = Instant::now();
                if done > end {
                    break; // finished outside the window: not counted
                }
                lat.push(done - t);
                ids += n;
            }
            anyhow::Ok((lat, ids))
        }));
    }
    let (mut lat, mut ids) = (Vec::new(), 0);
    for t in tasks {
        let (l, n) = t.await??;
        lat.extend(l);
        ids += n;
    }
    if lat.is_empty() {
        bail!("no call finished within {secs} s");
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    let window = (end - start).as_secs_f64();
    println!(
        "requests/s {:.0}  ids/s {:.0}  p50 {:?}  p99 {:?}",
        lat.len() as f64 / window,
        ids as f64 / window,
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}
