//! A small gRPC load generator for `scripts/bench-serve.sh`:
//! `grpc_load HOST:PORT SECONDS CONCURRENCY BATCH` prints requests/s, ids/s
//! and p50/p99 latency. BATCH 1 calls NextId, larger calls NextIds.

use std::time::{Duration, Instant};

use shardflake_service::grpc::pb;
use shardflake_service::testkit::grpc_client;

#[tokio::main(flavor = "multi_thread", worker_threads = 1)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(
        args.len() == 5,
        "usage: grpc_load HOST:PORT SECONDS CONCURRENCY BATCH"
    );
    let (addr, secs, conc, batch) = (
        args[1].clone(),
        args[2].parse::<u64>()?,
        args[3].parse::<usize>()?,
        args[4].parse::<u64>()?,
    );
    let end = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..conc {
        let addr = addr.clone();
        tasks.push(tokio::spawn(async move {
            let mut g = grpc_client(&addr).await?;
            let (mut lat, mut ids) = (Vec::new(), 0u64);
            while Instant::now() < end {
                let t = Instant::now();
                if batch == 1 {
                    g.next_id(pb::NextIdRequest {}).await?;
                    ids += 1;
                } else {
                    ids += g
                        .next_ids(pb::NextIdsRequest { count: batch })
                        .await?
                        .into_inner()
                        .ids
                        .len() as u64;
                }
                lat.push(t.elapsed());
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
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!(
        "requests/s {:.0}  ids/s {:.0}  p50 {:?}  p99 {:?}",
        lat.len() as f64 / secs as f64,
        ids as f64 / secs as f64,
        pct(0.5),
        pct(0.99)
    );
    Ok(())
}
