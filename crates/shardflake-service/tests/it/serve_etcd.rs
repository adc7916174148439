//! `serve` with etcd, in this process (moved from the CLI crate's
//! `serve_etcd.rs`): node ids leased from a real etcd, fenced. Every test
//! starts its own etcd (scripts/etcd.sh) on free ports; the servers run
//! here, aborted on drop. What needs the binary (signals to it, libfaketime,
//! its log lines) stays in `crates/shardflake-cli/tests/it/serve_etcd.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shardflake_testkit::{Etcd, Http, error_code, id_of, snowflake_node, take_ids};

use crate::node::Node;

/// A node on `etcd` under `prefix`; `top`: top-level config lines,
/// `etcd_lines`: more of its `[etcd]` table (the lease TTL is 3 s unless
/// they set one).
async fn node(etcd: &Etcd, prefix: &str, top: &str, etcd_lines: &str) -> anyhow::Result<Node> {
    let ttl = if etcd_lines.contains("lease_ttl") {
        ""
    } else {
        "lease_ttl = \"3s\"\n"
    };
    Node::start(&format!(
        "{top}\n[etcd]\nendpoints = {:?}\nprefix = {prefix:?}\n{ttl}{etcd_lines}",
        etcd.endpoints
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_distinct_ids_and_cluster_full_is_clear() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let a = node(&etcd, "/t/two", "", "").await?;
    let b = node(&etcd, "/t/two", "", "").await?;
    let (na, nb) = (
        a.ready(Duration::from_secs(15)).await?,
        b.ready(Duration::from_secs(15)).await?,
    );
    assert_ne!(na, nb);
    assert_eq!([na.min(nb), na.max(nb)], [0, 1], "lowest free ids");
    let mut ca = Http::new(&a.http);
    assert!(
        take_ids(&mut ca, 10)
            .await?
            .iter()
            .all(|id| snowflake_node(*id) == na)
    );

    // A 1-bit node field holds two nodes; the third is told why it cannot
    // start. Another cluster: a fleet of another layout could share ids
    // with /t/two's, and is refused on its cluster.
    let etcd = Etcd::start(1)?;
    let spec = "tiny: time 41 | node 1 | sequence 12 (epoch 1288834974657 ms)";
    let _x = node(&etcd, "/t/tiny", &format!("layout = {spec:?}"), "").await?;
    let _y = node(&etcd, "/t/tiny", &format!("layout = {spec:?}"), "").await?;
    _x.ready(Duration::from_secs(15)).await?;
    _y.ready(Duration::from_secs(15)).await?;
    let mut z = node(&etcd, "/t/tiny", &format!("layout = {spec:?}"), "").await?;
    let status = z.exit(Duration::from_secs(20)).await?;
    assert!(!status.success());
    assert!(z.stderr().contains("cluster full"), "{}", z.stderr());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_layout_under_one_prefix_is_refused() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let a = node(&etcd, "/t/layout", "", "").await?;
    assert_eq!(a.ready(Duration::from_secs(15)).await?, 0);
    let recorded = etcd.get("/t/layout/layout").await?.unwrap_or_default();
    assert!(
        recorded.contains("snowflake") && recorded.contains("node"),
        "{recorded}"
    );
    // twitter's worker 0 in datacenter 1 composes the same ids as snowflake
    // node 32: the two must not share a prefix (caught: duplicates).
    let mut b = node(
        &etcd,
        "/t/layout",
        "layout = \"twitter\"\nnode_field = \"worker\"\nfields = { datacenter = 1 }",
        "",
    )
    .await?;
    assert!(!b.exit(Duration::from_secs(20)).await?.success());
    assert!(b.stderr().contains("another layout"), "{}", b.stderr());
    // The same layout with the id in another field is refused too.
    let mut c = node(
        &etcd,
        "/t/layout",
        "layout = \"twitter\"\nfields = { worker = 1 }",
        "",
    )
    .await?;
    assert!(!c.exit(Duration::from_secs(20)).await?.success());
    assert!(c.stderr().contains("another layout"), "{}", c.stderr());
    // B and C took no id.
    assert_eq!(etcd.get("/t/layout/node/1").await?, None);
    // The matching layout still joins.
    let d = node(&etcd, "/t/layout", "", "").await?;
    assert_eq!(d.ready(Duration::from_secs(15)).await?, 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unanswered_keep_alives_fence_before_the_ttl() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    // TTL 4 s, margin 0.8 s: no id later than 3.2 s after the last renewal.
    // A window of 5 s keeps the high-water fence out of the way.
    let a = node(
        &etcd,
        "/t/etcdstop",
        "window = \"5s\"",
        "lease_ttl = \"4s\"",
    )
    .await?;
    a.ready(Duration::from_secs(15)).await?;
    let mut c = Http::new(&a.http);
    take_ids(&mut c, 10).await?;
    etcd.signal(0, libc::SIGSTOP)?;
    let stopped = Instant::now();
    // Caught: renewal failures ignored (issuing until the lease is long gone).
    // The fence runs from the last renewal *sent*, before `stopped`, so a
    // request sent 3.2 s after `stopped` must be refused: it is timed from
    // its sending, which the server's check follows, so a slow response on
    // a busy machine cannot fail the test; a 50 ms allowance covers the
    // gap between reading the clock and the request leaving.
    let limit = Duration::from_millis(3200 + 50);
    let (mut id_refused, mut not_ready) = (false, false);
    while !(id_refused && not_ready) {
        let sent = stopped.elapsed();
        let (st, body) = c.get("/v1/id").await?;
        if st == 200 {
            assert!(
                sent < limit,
                "issued an id sent {sent:?} after etcd stopped answering"
            );
        } else {
            assert_eq!(
                (st, error_code(&body).as_str()),
                (503, "no_lease"),
                "{body}"
            );
            id_refused = true;
        }
        let sent = stopped.elapsed();
        let (st, _) = c.get("/readyz").await?;
        assert!(
            st == 503 || sent < limit,
            "ready {sent:?} after etcd stopped answering"
        );
        not_ready |= st == 503;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("fenced {:?} after etcd stopped", stopped.elapsed());
    etcd.signal(0, libc::SIGCONT)?;
    a.ready(Duration::from_secs(20)).await?;
    assert_eq!(take_ids(&mut c, 10).await?.len(), 10);
    Ok(())
}

/// An HTTP/2 proxy in front of one etcd member that forwards every gRPC
/// call (streams included), except that it swallows the answer to the first
/// `KV.Txn` whose request `lose` picks, after etcd has executed it: to the
/// node, a call that timed out, which its client retries on the next
/// endpoint. The flag says whether an answer was lost.
async fn answer_losing_proxy(
    upstream: String,
    lose: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
) -> anyhow::Result<(String, Arc<AtomicBool>)> {
    use http_body_util::combinators::BoxBody;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let lost = Arc::new(AtomicBool::new(false));
    let flag = lost.clone();
    let picks = Arc::new(lose);
    tokio::spawn(async move {
        // Bounded: the test ends long before this many connections.
        for _ in 0..1000 {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            let lost = lost.clone();
            let picks = picks.clone();
            tokio::spawn(async move {
                let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let Ok((send, conn)) = hyper::client::conn::http2::handshake::<
                    _,
                    _,
                    BoxBody<Bytes, hyper::Error>,
                >(TokioExecutor::new(), TokioIo::new(up))
                .await
                else {
                    return;
                };
                tokio::spawn(conn);
                let forward = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let mut send = send.clone();
                        let lost = lost.clone();
                        let picks = picks.clone();
                        async move {
                            let (parts, body) = req.into_parts();
                            let mut lose = false;
                            let body = if parts.uri.path() == "/etcdserverpb.KV/Txn" {
                                // Unary: read the request whole to see its keys.
                                let bytes = body.collect().await?.to_bytes();
                                lose = picks(&bytes) && !lost.swap(true, Ordering::SeqCst);
                                Full::new(bytes).map_err(|never| match never {}).boxed()
                            } else {
                                body.boxed()
                            };
                            let answer = send
                                .send_request(hyper::Request::from_parts(parts, body))
                                .await?;
                            if lose {
                                // etcd has answered, so it executed the
                                // take; the node never hears of it.
                                let _ = answer.into_body().collect().await;
                                let never: std::convert::Infallible = std::future::pending().await;
                                match never {}
                            }
                            Ok::<_, hyper::Error>(answer)
                        }
                    },
                );
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(client), forward)
                    .await;
            });
        }
    });
    Ok((addr, flag))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_whose_answer_was_lost_is_not_taken_twice() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let member = etcd.endpoints[0].trim_start_matches("http://").to_string();
    // The answer to the node's take is lost. The client starts on either
    // endpoint (one picked at random) and retries on the other: both are
    // the proxy, which forwards every later call.
    let (proxy, lost) = answer_losing_proxy(member, |body| holds(body, b"/t/lost/node/")).await?;
    let endpoints = [format!("http://{proxy}"), format!("http://{proxy}")];
    let a = Node::start(&format!(
        "[etcd]\nendpoints = {endpoints:?}\nprefix = \"/t/lost\"\nlease_ttl = \"3s\""
    ))
    .await?;
    let id = a.ready(Duration::from_secs(15)).await?;
    let keys = etcd.keys("/t/lost/node/").await?;
    assert!(lost.load(Ordering::SeqCst), "no take's answer was lost");
    assert_eq!(keys, vec![format!("/t/lost/node/{id}")], "one node, one id");
    // The retry lost the race to the take itself, which queued the node:
    // it left the queue, or the nodes after it would skip an id.
    assert_eq!(etcd.keys("/t/lost/queue/").await?, Vec::<String>::new());
    Ok(())
}

fn holds(body: &[u8], key: &[u8]) -> bool {
    body.windows(key.len()).any(|w| w == key)
}

/// Issue 38, item 6: a high-water record that timed out on the node's side
/// but committed (its answer lost) is the holder's own: neither its
/// client's retry, which finds the record's revision moved, nor its watch,
/// which sees the record arrive, makes it drop its id. With the proxy
/// named once (no retry: the watch judges) and twice (the client retries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_whose_answer_was_lost_is_the_holders_own() -> anyhow::Result<()> {
    for (prefix, copies) in [("/t/own1", 1), ("/t/own2", 2)] {
        // A cluster each: two fleets of one layout never share one.
        let etcd = Etcd::start(1)?;
        let member = etcd.endpoints[0].trim_start_matches("http://").to_string();
        let armed = Arc::new(AtomicBool::new(false));
        let arm = armed.clone();
        let hw = format!("{prefix}/hw/").into_bytes();
        // A record: the id's high-water key compared and written (the
        // watch's check only compares it), and no take's stamp.
        let record = move |body: &[u8]| {
            let named = body.windows(hw.len()).filter(|w| *w == &hw[..]).count();
            arm.load(Ordering::SeqCst) && named >= 2 && !holds(body, b"/taken/")
        };
        let (proxy, lost) = answer_losing_proxy(member.clone(), record).await?;
        let endpoints = vec![format!("http://{proxy}"); copies];
        let a = Node::start(&format!(
            "[etcd]\nendpoints = {endpoints:?}\nprefix = {prefix:?}\nlease_ttl = \"3s\""
        ))
        .await?;
        let id = a.ready(Duration::from_secs(15)).await?;
        armed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lost.load(Ordering::SeqCst) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "{prefix}: no record's answer was lost"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let record_then = etcd.get(&format!("{prefix}/hw/{id}")).await?;
        // Three records (every window/3 = 1 s) after the lost answer.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (_, metrics) = Http::new(&a.http).get("/metrics").await?;
        let losses = metrics
            .lines()
            .find(|l| !l.starts_with('#') && l.contains("lease_losses_total "))
            .and_then(|l| l.split_whitespace().last())
            .unwrap_or_default()
            .to_string();
        assert_eq!(losses, "0", "{prefix}: the holder dropped its id");
        assert_eq!(a.ready(Duration::from_secs(1)).await?, id);
        let record_now = etcd.get(&format!("{prefix}/hw/{id}")).await?;
        assert!(
            record_now > record_then,
            "{prefix}: records went on: {record_then:?} then {record_now:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_nodes_started_together_get_distinct_ids_quickly() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let started = Instant::now();
    let mut nodes = Vec::new();
    for _ in 0..100 {
        nodes.push(
            node(
                &etcd,
                "/t/hundred",
                "window = \"6s\"",
                "lease_ttl = \"10s\"\ntimeout = \"2s\"",
            )
            .await?,
        );
    }
    let mut ids = HashSet::new();
    for n in &nodes {
        ids.insert(n.ready(Duration::from_secs(30)).await?);
    }
    let took = started.elapsed();
    assert_eq!(ids.len(), 100, "every node its own id");
    let highest = ids.iter().max().copied().unwrap_or(0);
    // Racing nodes spread over the lowest free ids (see lease::take_lowest).
    assert!(highest < 256, "ids stay low: highest {highest}");
    eprintln!("100 nodes ready with distinct ids (highest {highest}) in {took:?}");
    // Catches a herd that serialises (every node racing for the same id):
    // that took minutes before take_lowest spread the races.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_under_load_service_continues_without_duplicates() -> anyhow::Result<()>
{
    let etcd = Etcd::start(3)?;
    let lease = "lease_ttl = \"6s\"\ntimeout = \"300ms\"";
    let n1 = node(&etcd, "/t/leader", "", lease).await?;
    let n2 = node(&etcd, "/t/leader", "", lease).await?;
    n1.ready(Duration::from_secs(15)).await?;
    n2.ready(Duration::from_secs(15)).await?;
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for addr in [&n1.http, &n2.http, &n1.http, &n2.http] {
        let (addr, done) = (addr.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Http::new(&addr);
            let mut got = Vec::new();
            let mut errors = 0u64;
            while !done.load(Ordering::Relaxed) {
                match c.get("/v1/id").await {
                    Ok((200, body)) => got.push((Instant::now(), id_of(&body).unwrap())),
                    // Refused while fenced or reconnecting: back off a little
                    // rather than spin on the two shared cores.
                    _ => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            (got, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // etcd.sh calls block: keep them off the async workers the load runs on.
    let leader = tokio::task::block_in_place(|| etcd.leader())?;
    let killed_at = Instant::now();
    tokio::task::block_in_place(|| etcd.kill(leader))?;
    // Bounded (leader() asks for up to 10 s): wait for a new leader, then
    // keep the load on a little longer.
    tokio::task::block_in_place(|| etcd.leader())?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    done.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut after_kill = 0;
    let mut errors = 0;
    for t in tasks {
        let (got, e) = t.await?;
        errors += e;
        for (at, id) in got {
            after_kill += usize::from(at > killed_at + Duration::from_secs(2));
            all.push(id);
        }
    }
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "duplicates");
    assert!(
        after_kill > 100,
        "service continued after the leader was killed ({after_kill} ids)"
    );
    eprintln!(
        "{n} ids, {after_kill} more than 2 s after killing etcd leader m{leader}, {errors} refused"
    );
    n1.ready(Duration::from_secs(1)).await?;
    n2.ready(Duration::from_secs(1)).await?;
    Ok(())
}

/// Issue 38 (F8b): a node whose endpoints list members of two clusters
/// (during a move) took its id on one; that cluster's member went away and
/// the node failed over to the other. It stops there, naming both
/// clusters, instead of taking an id in a cluster whose nodes know nothing
/// of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_fails_over_to_another_cluster_stops() -> anyhow::Result<()> {
    let (one, two) = (Etcd::start(2)?, Etcd::start(1)?);
    let endpoints = [
        one.endpoints[0].clone(),
        one.endpoints[1].clone(),
        two.endpoints[0].clone(),
    ];
    // Both answering, the list is refused at start (the members disagree);
    // the second cluster down then, the node starts on the first (a
    // majority of the endpoints answered the check).
    two.kill(0)?;
    let mut a = Node::start(&format!(
        "[etcd]\nendpoints = {endpoints:?}\nprefix = \"/t/two\"\nlease_ttl = \"3s\""
    ))
    .await?;
    a.ready(Duration::from_secs(15)).await?;
    two.restart(0)?;
    let (gone, other) = (&one, &two);
    gone.kill(0)?;
    gone.kill(1)?;
    let exit = a.exit(Duration::from_secs(20)).await;
    let taken_there = other.keys("/t/two/node/").await?;
    assert!(
        taken_there.is_empty(),
        "took {taken_there:?} in the other cluster"
    );
    let exit = exit?;
    assert!(!exit.success());
    let said = a.stderr();
    assert!(said.contains("another etcd cluster"), "{said}");
    Ok(())
}
