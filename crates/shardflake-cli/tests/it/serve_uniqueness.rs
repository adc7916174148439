//! Several `shardflake serve --etcd` processes under concurrent HTTP and
//! gRPC load (single ids and batches), restarted mid-load (SIGTERM and
//! SIGKILL): every id collected is unique, each client sees its ids in
//! order, and every holder of a node id issues above its predecessors.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shardflake_service::grpc::pb;
use shardflake_testkit::{Etcd, Http, Serve, ServeOpts, grpc_client, id_of, snowflake_node};
use tokio::task::JoinHandle;

use crate::shardflake_bin;

fn start(etcd: &Etcd) -> anyhow::Result<Serve> {
    let args = [
        "--etcd",
        &etcd.urls(),
        "--etcd-prefix",
        "/t/uniq",
        "--lease-ttl",
        "3s",
        "--workers",
        "1",
    ];
    let opts = ServeOpts {
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    // Waits (blocking) for the ports line: off the async workers.
    tokio::task::block_in_place(|| Serve::start(shardflake_bin(), opts))
}

/// One client's ids, in the order it received them (each request waits for
/// the previous answer), tagged with the server incarnation.
type Seen = Vec<(usize, u64)>;

fn http_client(
    addr: String,
    incarnation: usize,
    batch: u64,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Seen> {
    tokio::spawn(async move {
        let mut c = Http::new(&addr);
        let mut seen = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let path = if batch == 1 {
                "/v1/id".to_string()
            } else {
                format!("/v1/ids?count={batch}")
            };
            match c.get(&path).await {
                Ok((200, body)) if batch == 1 => seen.push((incarnation, id_of(&body).unwrap())),
                Ok((200, body)) => {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    for id in v["ids"].as_array().unwrap() {
                        seen.push((incarnation, id.as_str().unwrap().parse().unwrap()));
                    }
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                Err(_) => break, // the server went away: this client is done
            }
        }
        seen
    })
}

fn grpc_load(
    addr: String,
    incarnation: usize,
    batch: u64,
    stop: Arc<AtomicBool>,
) -> JoinHandle<Seen> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let Ok(mut g) = grpc_client(&addr).await else {
            return seen;
        };
        while !stop.load(Ordering::Relaxed) {
            let r = if batch == 1 {
                g.next_id(pb::NextIdRequest {})
                    .await
                    .map(|r| vec![r.into_inner().id])
            } else {
                g.next_ids(pb::NextIdsRequest { count: batch })
                    .await
                    .map(|r| r.into_inner().ids)
            };
            match r {
                Ok(ids) => seen.extend(ids.into_iter().map(|id| (incarnation, id))),
                Err(s)
                    if s.code() == tonic::Code::Unavailable
                        && s.metadata().get("x-error-code").is_some() =>
                {
                    tokio::time::sleep(Duration::from_millis(5)).await
                }
                Err(_) => break,
            }
        }
        seen
    })
}

fn load(s: &Serve, incarnation: usize, stop: &Arc<AtomicBool>) -> Vec<JoinHandle<Seen>> {
    vec![
        http_client(s.http.clone(), incarnation, 1, stop.clone()),
        http_client(s.http.clone(), incarnation, 1000, stop.clone()),
        grpc_load(s.grpc.clone(), incarnation, 1, stop.clone()),
        grpc_load(s.grpc.clone(), incarnation, 5000, stop.clone()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_servers_http_and_grpc_with_restarts_no_duplicates() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let mut servers: Vec<Serve> = (0..3).map(|_| start(&etcd)).collect::<Result<_, _>>()?;
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    let mut incarnation = 0;
    for s in &servers {
        s.ready(Duration::from_secs(15)).await?;
        let stop = Arc::new(AtomicBool::new(false));
        tasks.extend(load(s, incarnation, &stop));
        stops.push(stop);
        incarnation += 1;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // Restart server 0 gracefully and server 1 by SIGKILL, under load.
    for (i, graceful) in [(0, true), (1, false)] {
        stops[i].store(true, Ordering::Relaxed);
        if graceful {
            servers[i].signal(libc::SIGTERM);
            assert!(
                servers[i].exit(Duration::from_secs(15)).await?.success(),
                "{}",
                servers[i].stderr()
            );
        } else {
            servers[i].kill();
        }
        servers[i] = start(&etcd)?;
        servers[i].ready(Duration::from_secs(15)).await?;
        let stop = Arc::new(AtomicBool::new(false));
        tasks.extend(load(&servers[i], incarnation, &stop));
        stops[i] = stop;
        incarnation += 1;
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    for s in &stops {
        s.store(true, Ordering::Relaxed);
    }

    let mut all = Vec::new();
    let mut per_incarnation: HashMap<usize, (u64, u64, u64)> = HashMap::new(); // node, min, max
    for t in tasks {
        let seen = t.await?;
        for w in seen.windows(2) {
            assert!(w[0].1 < w[1].1, "a client saw {} after {}", w[1].1, w[0].1);
        }
        for (inc, id) in seen {
            let e = per_incarnation
                .entry(inc)
                .or_insert((snowflake_node(id), u64::MAX, 0));
            assert_eq!(e.0, snowflake_node(id), "one incarnation, one node id");
            e.1 = e.1.min(id);
            e.2 = e.2.max(id);
            all.push(id);
        }
    }
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "duplicate ids");
    // A later holder of a node id issues only above every earlier holder.
    let mut incs: Vec<_> = per_incarnation.into_iter().collect();
    incs.sort();
    for (i, (inc, (node, min, _))) in incs.iter().enumerate() {
        for (earlier, (n2, _, max2)) in &incs[..i] {
            if n2 == node {
                assert!(
                    min > max2,
                    "incarnation {inc} (node {node}) issued {min} <= {max2} of incarnation {earlier}"
                );
            }
        }
    }
    assert!(incs.len() == 5, "every incarnation issued ids: {incs:?}");
    eprintln!("{n} unique ids from {} server incarnations", incs.len());
    Ok(())
}
