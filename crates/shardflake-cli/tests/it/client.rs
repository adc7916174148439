//! `shardflake-client` against real `shardflake serve` processes (static
//! node ids, free ports): failover when a node is SIGKILLed mid-run (no
//! error reaches the caller, no duplicate id), the typed error when every
//! node is down, refusals not retried, and prefetch buffers (unique across
//! clients, increasing per client).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shardflake_client::{Client, ClientError, Id, Transport};
use shardflake_testkit::{Serve, ServeOpts, snowflake_node};

use crate::shardflake_bin;

/// Starts `shardflake serve --node-id N` (plus `extra`) and waits until it
/// is ready.
async fn serve(node: u64, extra: &[&str]) -> Serve {
    let mut args = vec![
        "--node-id".to_string(),
        node.to_string(),
        "--resume-after".to_string(),
        "now".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let opts = ServeOpts {
        args,
        ..Default::default()
    };
    let s =
        tokio::task::block_in_place(|| Serve::start(shardflake_bin(), opts)).expect("start server");
    assert_eq!(s.ready(Duration::from_secs(20)).await.expect("ready"), node);
    s
}

fn endpoints(servers: &[&Serve], transport: Transport) -> Vec<String> {
    servers
        .iter()
        .map(|s| match transport {
            Transport::Http => format!("http://{}", s.http),
            Transport::Grpc => format!("http://{}", s.grpc),
        })
        .collect()
}

/// Polls (bounded) until `cond` holds.
async fn until(what: &str, timeout: Duration, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Three nodes, eight tasks taking single ids and batches of 100 through
/// one client; node 2 is SIGKILLed once every node has issued ids, and the
/// run goes on until the survivors issued as many again and the client's
/// backoff has expired (the dead node is probed again). No call may fail,
/// no id may repeat, and after the kill only nodes 1 and 3 issue.
async fn failover(transport: Transport) {
    let s1 = serve(1, &[]).await;
    let mut s2 = serve(2, &[]).await;
    let s3 = serve(3, &[]).await;
    let client = Client::builder()
        .endpoints(endpoints(&[&s1, &s2, &s3], transport))
        .transport(transport)
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicBool::new(false));
    let total = Arc::new(AtomicU64::new(0));
    let after_kill = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let (client, stop, killed) = (client.clone(), stop.clone(), killed.clone());
        let (total, after_kill) = (total.clone(), after_kill.clone());
        tasks.push(tokio::spawn(async move {
            // (id, issued after the kill was complete) per id; errors.
            let mut ids: Vec<(u64, bool)> = Vec::new();
            let mut errors: Vec<ClientError> = Vec::new();
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let was_killed = killed.load(Ordering::Acquire);
                let got = if (t + k).is_multiple_of(2) {
                    client.next_id().await.map(|id| vec![id])
                } else {
                    client.next_ids(100).await
                };
                match got {
                    Ok(batch) => {
                        total.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        if was_killed {
                            after_kill.fetch_add(batch.len() as u64, Ordering::Relaxed);
                        }
                        ids.extend(batch.iter().map(|id| (id.get(), was_killed)));
                    }
                    Err(e) => errors.push(e),
                }
            }
            (ids, errors)
        }));
    }
    until("ids before the kill", Duration::from_secs(30), || {
        total.load(Ordering::Relaxed) >= 30_000
    })
    .await;
    tokio::task::block_in_place(|| s2.kill());
    killed.store(true, Ordering::Release);
    // Past the client's 1 s backoff too, so the dead node is probed again.
    let kill_time = Instant::now();
    until("ids after the kill", Duration::from_secs(30), || {
        after_kill.load(Ordering::Relaxed) >= 30_000
            && kill_time.elapsed() > Duration::from_millis(1500)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut all = HashSet::new();
    let mut nodes_before = HashSet::new();
    let mut nodes_after = HashSet::new();
    for t in tasks {
        let (ids, errors) = t.await.unwrap();
        assert!(
            errors.is_empty(),
            "{transport:?}: errors reached the caller: {errors:?}"
        );
        for (id, after) in ids {
            assert!(all.insert(id), "{transport:?}: duplicate id {id}");
            if after {
                nodes_after.insert(snowflake_node(id));
            } else {
                nodes_before.insert(snowflake_node(id));
            }
        }
    }
    assert_eq!(nodes_before, HashSet::from([1, 2, 3]), "{transport:?}");
    assert_eq!(nodes_after, HashSet::from([1, 3]), "{transport:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_failover_when_a_node_is_killed_mid_run() {
    failover(Transport::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_failover_when_a_node_is_killed_mid_run() {
    failover(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_down_is_a_typed_error_within_the_timeout() {
    let mut s1 = serve(1, &[]).await;
    let mut s2 = serve(2, &[]).await;
    let eps = [
        endpoints(&[&s1, &s2], Transport::Http),
        endpoints(&[&s1, &s2], Transport::Grpc),
    ];
    tokio::task::block_in_place(|| {
        s1.kill();
        s2.kill();
    });
    for (transport, eps) in [Transport::Http, Transport::Grpc].into_iter().zip(eps) {
        let client = Client::builder()
            .endpoints(eps.clone())
            .transport(transport)
            .timeout(Duration::from_millis(500))
            .call_timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        for _ in 0..3 {
            let began = Instant::now();
            match client.next_id().await {
                Err(ClientError::AllFailed { failures }) => {
                    let mut tried: Vec<_> = failures.iter().map(|f| f.endpoint.clone()).collect();
                    tried.sort();
                    let mut want = eps.clone();
                    want.sort();
                    assert_eq!(tried, want, "{transport:?}: {failures:?}");
                }
                other => panic!("{transport:?}: expected AllFailed, got {other:?}"),
            }
            assert!(
                began.elapsed() < Duration::from_millis(1500),
                "{transport:?}: took {:?}",
                began.elapsed()
            );
        }
        // A prefetch buffer hands the same typed error to its caller.
        let buffer = client.prefetching(1000).start().unwrap();
        let began = Instant::now();
        assert!(
            matches!(buffer.next_id().await, Err(ClientError::AllFailed { .. })),
            "{transport:?}"
        );
        assert!(began.elapsed() < Duration::from_secs(2));
    }
}

/// The first endpoint allows batches of 10, the second 1000: a batch of 11
/// is refused by the first with `invalid_count`, and since a refusal is not
/// retried, the second (which would answer) is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_returned_with_its_code_and_not_retried() {
    let strict = serve(1, &["--max-batch", "10"]).await;
    let lenient = serve(2, &["--max-batch", "1000"]).await;
    for transport in [Transport::Http, Transport::Grpc] {
        let eps = endpoints(&[&strict, &lenient], transport);
        let client = Client::builder()
            .endpoints(eps.clone())
            .transport(transport)
            .build()
            .unwrap();
        // Round-robin start: two calls, so one starts at each endpoint; a
        // call starting at the lenient node succeeds.
        let mut refused = 0;
        for _ in 0..2 {
            match client.next_ids(11).await {
                Err(ClientError::Rejected { endpoint, code, .. }) => {
                    assert_eq!(endpoint, eps[0], "{transport:?}");
                    assert_eq!(code, "invalid_count", "{transport:?}");
                    refused += 1;
                }
                Ok(ids) => {
                    assert_eq!(ids.len(), 11);
                    assert!(ids.iter().all(|id| snowflake_node(id.get()) == 2));
                }
                Err(e) => panic!("{transport:?}: {e}"),
            }
        }
        assert_eq!(refused, 1, "{transport:?}");
        assert_eq!(client.next_ids(10).await.unwrap().len(), 10);
    }
}

/// Two prefetching clients (one fetcher each, so each hands out increasing
/// ids) on two nodes, one over HTTP and one over gRPC, listing the nodes in
/// opposite order; node 1 is killed mid-run. Every id is unique across both
/// clients, each client's ids increase, and no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_ids_unique_across_clients_and_increasing_per_client() {
    let mut s1 = serve(1, &[]).await;
    let s2 = serve(2, &[]).await;
    let http = Client::builder()
        .endpoints(endpoints(&[&s1, &s2], Transport::Http))
        .build()
        .unwrap();
    let grpc = Client::builder()
        .endpoints(endpoints(&[&s2, &s1], Transport::Grpc))
        .transport(Transport::Grpc)
        .build()
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for client in [http, grpc] {
        let buffer = client.prefetching(5000).low_water(2000).start().unwrap();
        let (stop, taken) = (stop.clone(), taken.clone());
        tasks.push(tokio::spawn(async move {
            let mut ids: Vec<Id> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let id = match buffer.try_next() {
                    Some(id) => id,
                    None => buffer.next_id().await.expect("prefetch next_id"),
                };
                ids.push(id);
                if ids.len().is_multiple_of(1000) {
                    taken.fetch_add(1000, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
            ids
        }));
    }
    until("ids before the kill", Duration::from_secs(30), || {
        taken.load(Ordering::Relaxed) >= 200_000
    })
    .await;
    tokio::task::block_in_place(|| s1.kill());
    let at_kill = taken.load(Ordering::Relaxed);
    let kill_time = Instant::now();
    until("ids after the kill", Duration::from_secs(30), || {
        taken.load(Ordering::Relaxed) >= at_kill + 200_000
            && kill_time.elapsed() > Duration::from_millis(1500)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut all = HashSet::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let ids = t.await.unwrap();
        assert!(ids.len() > 1000, "client {i}: {} ids", ids.len());
        for w in ids.windows(2) {
            assert!(
                w[0] < w[1],
                "client {i}: {} then {}",
                w[0].get(),
                w[1].get()
            );
        }
        for id in ids {
            assert!(all.insert(id.get()), "duplicate id {}", id.get());
        }
    }
}

/// Several fetchers (one per node): batches from both nodes interleave, and
/// ids stay unique.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_with_one_fetcher_per_node_uses_both_nodes() {
    let s1 = serve(1, &[]).await;
    let s2 = serve(2, &[]).await;
    for transport in [Transport::Http, Transport::Grpc] {
        let client = Client::builder()
            .endpoints(endpoints(&[&s1, &s2], transport))
            .transport(transport)
            .build()
            .unwrap();
        let buffer = client.prefetching(10_000).fetchers(2).start().unwrap();
        let mut seen = HashSet::new();
        let mut nodes = HashSet::new();
        while seen.len() < 300_000 {
            let id = match buffer.try_next() {
                Some(id) => id,
                None => buffer.next_id().await.unwrap(),
            };
            nodes.insert(snowflake_node(id.get()));
            assert!(
                seen.insert(id.get()),
                "{transport:?}: duplicate {}",
                id.get()
            );
        }
        assert_eq!(nodes, HashSet::from([1, 2]), "{transport:?}");
    }
}
