//! What a client can make a server hold, over real connections to a
//! server running in this process: slow headers and slow bodies
//! (slowloris) are cut off by timeouts, and batches above 65,536 ids are
//! built at most two at a time (then 503 `busy`).

use std::time::{Duration, Instant};

use shardflake_service::grpc::pb;
use shardflake_testkit::{Http, error_code, grpc_client, metric};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Server;

/// The server's header and body read timeouts (10 s each) plus slack for a
/// loaded machine.
const READ_LIMIT: Duration = Duration::from_secs(16);

/// Writes `prefix`, then sends nothing more; returns what the server wrote
/// until it closed the connection, or an error if it kept it past `limit`.
async fn trickle(addr: &str, prefix: &str, limit: Duration) -> anyhow::Result<String> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.write_all(prefix.as_bytes()).await?;
    let mut got = Vec::new();
    match tokio::time::timeout(limit, tcp.read_to_end(&mut got)).await {
        // A reset is a close too.
        Ok(_) => Ok(String::from_utf8_lossy(&got).into_owned()),
        Err(_) => anyhow::bail!(
            "connection still open after {limit:?} (got {:?})",
            String::from_utf8_lossy(&got)
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_slow_bodies_are_cut_off() -> anyhow::Result<()> {
    let s = Server::start("node_id = 1\nworkers = 1").await?;
    let started = Instant::now();
    // Caught: no header read timeout (axum::serve has none): the connection
    // stays open and `trickle` fails at READ_LIMIT.
    let headers = trickle(&s.http, "GET /v1/id HTTP/1.1\r\nHost: t\r\n", READ_LIMIT);
    // Caught: a body read without a timeout (the handler waits forever).
    let body = trickle(
        &s.http,
        "POST /v1/ids HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n{\"count\"",
        READ_LIMIT,
    );
    let (headers, body) = tokio::join!(headers, body);
    headers?;
    let body = body?;
    assert!(body.starts_with("HTTP/1.1 408"), "{body}");
    assert!(body.contains("body_timeout"), "{body}");
    eprintln!("both cut off within {:?}", started.elapsed());
    // The server itself is unharmed.
    let (st, _) = Http::new(&s.http).get("/v1/id").await?;
    assert_eq!(st, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_large_batch_at_once_is_busy() -> anyhow::Result<()> {
    // 8 ids per ms: a batch of 80,000 ids waits 10 s for its ticks (and the
    // next one 10 s more), so two hold both permits well past the 5 s a
    // third waits for one.
    let spec = "slow: time 41 | node 10 | sequence 3 (epoch 1288834974657 ms)";
    let s = Server::start(&format!(
        "node_id = 1\nlayout = {spec:?}\nmax_batch = 100000"
    ))
    .await?;
    let big = |addr: String| {
        tokio::spawn(async move { Http::new(&addr).get("/v1/ids?count=80000").await })
    };
    let holders = [big(s.http.clone()), big(s.http.clone())];
    let mut c = Http::new(&s.http);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = c.get("/metrics").await?;
        if metric(&m, "shardflake_batches_in_flight") == Some(2.0) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "two batches never in flight: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Caught: a missing bound (a third batch of 70,000 ids would be built,
    // and answered after the other two instead of 503).
    let started = Instant::now();
    let mut grpc = grpc_client(&s.grpc).await?;
    let mut third = Http::new(&s.http);
    let (http, grpc) = tokio::join!(
        third.get("/v1/ids?count=70000"),
        grpc.next_ids(pb::NextIdsRequest { count: 70_000 }),
    );
    let (st, body) = http?;
    assert_eq!((st, error_code(&body).as_str()), (503, "busy"), "{body}");
    let e = grpc.expect_err("a third large batch over gRPC");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(e.metadata().get("x-error-code").unwrap(), "busy");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "waited {:?}",
        started.elapsed()
    );
    for h in holders {
        h.abort();
    }
    Ok(())
}

/// Single ids over HTTP and gRPC until `stop`; returns them.
fn single_id_traffic(
    s: &Server,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<u64>>> {
    use std::sync::atomic::Ordering;
    let (http, grpc) = (s.http.clone(), s.grpc.clone());
    tokio::spawn(async move {
        let mut c = Http::new(&http);
        let mut g = grpc_client(&grpc).await?;
        let mut ids = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let (st, body) = c.get("/v1/id").await?;
            anyhow::ensure!(st == 200, "single id over HTTP: {st} {body}");
            ids.push(shardflake_testkit::id_of(&body)?);
            ids.push(g.next_id(pb::NextIdRequest {}).await?.into_inner().id);
        }
        Ok(ids)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_complete_while_single_ids_keep_flowing() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    // The default --max-batch (1,000,000 ids: 245 ticks of `snowflake`).
    let s = Server::start("node_id = 2").await?;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let traffic = [
        single_id_traffic(&s, stop.clone()),
        single_id_traffic(&s, stop.clone()),
    ];
    let mut http = Http::new(&s.http);
    let mut grpc = grpc_client(&s.grpc)
        .await?
        .max_decoding_message_size(32 << 20);
    let mut all = Vec::new();
    for (over_grpc, count) in [
        (false, 65_536u64),
        (true, 65_536),
        (false, 1_000_000),
        (true, 1_000_000),
        (false, 100_000),
    ] {
        let started = Instant::now();
        // A hang shows as this timeout (it was: no answer while traffic lasted).
        let ids: Vec<u64> = tokio::time::timeout(Duration::from_secs(30), async {
            if over_grpc {
                let reply = grpc.next_ids(pb::NextIdsRequest { count }).await?;
                anyhow::Ok(reply.into_inner().ids)
            } else {
                let (st, body) = http.get(&format!("/v1/ids?count={count}")).await?;
                anyhow::ensure!(st == 200, "{st} {}", &body[..body.len().min(300)]);
                let v: serde_json::Value = serde_json::from_str(&body)?;
                Ok(v["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_str().unwrap().parse().unwrap())
                    .collect())
            }
        })
        .await
        .map_err(|_| {
            anyhow::anyhow!("batch of {count} not answered within 30 s under traffic")
        })??;
        assert_eq!(ids.len() as u64, count);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        eprintln!(
            "batch of {count} over {} answered in {:?} under single-id traffic",
            if over_grpc { "gRPC" } else { "HTTP" },
            started.elapsed()
        );
        all.extend(ids);
    }
    stop.store(true, Ordering::Relaxed);
    let mut singles = 0;
    for t in traffic {
        let ids = t.await??;
        assert!(ids.len() > 10, "single ids flowed the whole time");
        singles += ids.len();
        all.extend(ids);
    }
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "an id was issued twice");
    let (_, m) = http.get("/metrics").await?;
    eprintln!(
        "{singles} single ids meanwhile; sequence exhaustions counted: {:?}",
        metric(&m, "shardflake_sequence_exhaustions_total")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_batch_stops_its_work() -> anyhow::Result<()> {
    // 8 ids per ms: 80,000 ids need 10 s of ticks, so a batch whose client
    // left but is still worked on shows in the gauge long after.
    let spec = "slow: time 41 | node 10 | sequence 3 (epoch 1288834974657 ms)";
    let s = Server::start(&format!(
        "node_id = 1\nlayout = {spec:?}\nmax_batch = 100000"
    ))
    .await?;
    let abandoned = [
        shardflake_testkit::Queued::send(&s.http, "/v1/ids?count=80000").await?,
        shardflake_testkit::Queued::send(&s.http, "/v1/ids?count=80000").await?,
    ];
    let mut c = Http::new(&s.http);
    let in_flight = |m: &str| metric(m, "shardflake_batches_in_flight");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = c.get("/metrics").await?;
        if in_flight(&m) == Some(2.0) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "two batches never in flight: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The clients hang up: their batches stop with them (and free their
    // permits), not 10 and 20 s later when their ticks have come.
    drop(abandoned);
    let hung_up = Instant::now();
    loop {
        let (_, m) = c.get("/metrics").await?;
        if in_flight(&m) == Some(0.0) {
            break;
        }
        anyhow::ensure!(
            hung_up.elapsed() < Duration::from_secs(5),
            "abandoned batches still worked on after {:?}: {m}",
            hung_up.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "abandoned batches stopped {:?} after their clients left",
        hung_up.elapsed()
    );
    Ok(())
}
