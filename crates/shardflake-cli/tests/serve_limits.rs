//! What a client can make a `shardflake serve` process hold, end to end:
//! slow headers and slow bodies (slowloris) are cut off by timeouts, and
//! batches above 65,536 ids are built at most two at a time (then 503 `busy`).

use std::time::{Duration, Instant};

use shardflake_service::grpc::pb;
use shardflake_service::testkit::{Http, Serve, ServeOpts, error_code, grpc_client, metric};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_shardflake");

/// The server's header and body read timeouts (10 s each) plus slack for a
/// loaded machine.
const READ_LIMIT: Duration = Duration::from_secs(16);

fn serve(args: &[&str]) -> anyhow::Result<Serve> {
    Serve::start(
        BIN,
        ServeOpts {
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
    )
}

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
    let s = serve(&["--node-id", "1", "--workers", "1"])?;
    s.ready(Duration::from_secs(10)).await?;
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
    let s = serve(&["--node-id", "1", "--layout", spec, "--max-batch", "100000"])?;
    s.ready(Duration::from_secs(10)).await?;
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
