//! `shardflake serve` with a static node id: the HTTP and gRPC APIs, their
//! errors, graceful shutdown and restarts resuming after the state file.

use std::time::Duration;

use shardflake_service::grpc::pb;
use shardflake_testkit::{Http, Serve, ServeOpts, error_code, grpc_client, id_of, snowflake_node};

use crate::shardflake_bin;

fn opts(args: &[&str]) -> ServeOpts {
    ServeOpts {
        args: args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_api_and_errors() -> anyhow::Result<()> {
    let s = Serve::start(
        shardflake_bin(),
        opts(&["--node-id", "5", "--max-batch", "5000", "--workers", "1"]),
    )?;
    assert_eq!(s.ready(Duration::from_secs(10)).await?, 5);
    let mut c = Http::new(&s.http);

    let (st, body) = c.get("/v1/id").await?;
    assert_eq!(st, 200, "{body}");
    assert!(
        body.starts_with("{\"id\":\""),
        "ids are JSON strings: {body}"
    );
    let a = id_of(&body)?;
    assert_eq!(snowflake_node(a), 5);
    let (_, body) = c.get("/v1/id?numbers=true").await?;
    assert!(
        body.starts_with("{\"id\":1") || body.starts_with("{\"id\":2"),
        "{body}"
    );
    let b = id_of(&body)?;
    assert!(b > a);

    // A batch is one contiguous, ascending reservation.
    let (st, body) = c.get("/v1/ids?count=5000").await?;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let ids: Vec<u64> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids.len(), 5000);
    assert!(ids[0] > b && ids.windows(2).all(|w| w[0] < w[1]));
    let (st, body) = c.post("/v1/ids", r#"{"count":3,"numbers":true}"#).await?;
    assert_eq!(st, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body)?["count"],
        3
    );

    for bad in ["0", "-1", "abc", "5001", "1e3", ""] {
        let (st, body) = c.get(&format!("/v1/ids?count={bad}")).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "invalid_count"),
            "count={bad}: {body}"
        );
    }
    let (st, body) = c.get("/v1/ids").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "invalid_count"));
    for bad in [
        r#"{"count":0}"#,
        r#"{"count":-3}"#,
        r#"{"count":"x"}"#,
        r#"{"count":1.5}"#,
        r#"{}"#,
    ] {
        let (st, body) = c.post("/v1/ids", bad).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "invalid_count"),
            "{bad}: {body}"
        );
    }
    let (st, body) = c.post("/v1/ids", "not json").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "invalid_body"));
    let (st, body) = c.post("/v1/ids", &"x".repeat(10_000)).await?;
    assert_eq!((st, error_code(&body).as_str()), (413, "body_too_large"));

    let (st, body) = c.get(&format!("/v1/decode/{a}")).await?;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(v["fields"]["node"], 5);
    assert_eq!(v["layout"], "snowflake");
    let (st, body) = c.get(&format!("/v1/decode/{a:016x}?format=hex")).await?;
    assert_eq!(
        (
            st,
            serde_json::from_str::<serde_json::Value>(&body)?["id"].clone()
        ),
        (200, serde_json::json!(a.to_string()))
    );
    for bad in ["12x", "99999999999999999999", "%FF%FE", "-5"] {
        let (st, body) = c.get(&format!("/v1/decode/{bad}")).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, "malformed_id"),
            "{bad}: {body}"
        );
    }

    for kind in ["uuidv4", "uuidv7", "objectid"] {
        let (st, body) = c.get(&format!("/v1/id?kind={kind}")).await?;
        assert_eq!(st, 200, "{body}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&body)?["kind"],
            kind
        );
    }
    let (st, body) = c.get("/v1/id?kind=nope").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "unknown_kind"));
    let (st, body) = c.get("/v1/shard-id?key=31341").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "no_shard_field"));
    let (st, body) = c.get("/nowhere").await?;
    assert_eq!((st, error_code(&body).as_str()), (404, "not_found"));
    let (st, body) = c.request("DELETE", "/v1/id", Default::default()).await?;
    assert_eq!(
        (st, error_code(&body).as_str()),
        (405, "method_not_allowed")
    );

    let (st, body) = c.get("/v1/info").await?;
    assert_eq!(st, 200);
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        (v["node_id"].as_u64(), v["lease_state"].as_str()),
        (Some(5), Some("static"))
    );
    let (st, body) = c.get("/openapi.json").await?;
    assert_eq!(st, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&body)?["paths"]["/v1/ids"].is_object());
    let (st, body) = c.get("/healthz").await?;
    assert_eq!(st, 200, "{body}");
    let (_, metrics) = c.get("/metrics").await?;
    assert!(
        metrics.contains("shardflake_ids_issued_total 5005"),
        "{metrics}"
    );
    assert!(metrics.contains("shardflake_batches_total 2"), "{metrics}");
    assert!(metrics.contains("shardflake_lease_held 1"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_that_would_be_ignored_or_reinterpreted_are_refused() -> anyhow::Result<()> {
    let s = Serve::start(
        shardflake_bin(),
        opts(&["--node-id", "6", "--workers", "1"]),
    )?;
    s.ready(Duration::from_secs(10)).await?;
    let mut c = Http::new(&s.http);
    for (path, code) in [
        // The first `count` used to win silently.
        ("/v1/ids?count=5&count=999999", "invalid_parameter"),
        ("/v1/ids?count=5&numbers=bogus", "invalid_parameter"),
        ("/v1/ids?count=5&bogus=1", "invalid_parameter"),
        ("/v1/ids?count=%2B5", "invalid_count"),
        ("/v1/ids?count=%205", "invalid_count"),
        (
            "/v1/ids?count=5&numbers=true&format=hex",
            "invalid_parameter",
        ),
        ("/v1/id?numbers=true&format=hex", "invalid_parameter"),
        ("/v1/id?numbers=maybe", "invalid_parameter"),
        ("/v1/id?count=5", "invalid_parameter"),
        ("/v1/id?kind=uuidv4&format=hex", "invalid_parameter"),
        ("/v1/decode/5?format=hex&format=dec", "invalid_parameter"),
        ("/v1/shard-id?key=1&key=2", "invalid_parameter"),
    ] {
        let (st, body) = c.get(path).await?;
        assert_eq!(
            (st, error_code(&body).as_str()),
            (400, code),
            "{path}: {body}"
        );
    }
    for (body, code) in [
        (r#"{"count":5,"extra":1}"#, "invalid_body"),
        (r#"{"count":5,"numbers":"yes"}"#, "invalid_body"),
        (
            r#"{"count":5,"numbers":true,"format":"hex"}"#,
            "invalid_parameter",
        ),
        (r#"{"count":5,"format":"octal"}"#, "invalid_parameter"),
        (r#"{"count":" 5"}"#, "invalid_count"),
    ] {
        let (st, answer) = c.post("/v1/ids", body).await?;
        assert_eq!(
            (st, error_code(&answer).as_str()),
            (400, code),
            "{body}: {answer}"
        );
    }
    // `format` in the body is honoured, as in the query.
    let (st, body) = c.post("/v1/ids", r#"{"count":2,"format":"hex"}"#).await?;
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    for id in v["ids"].as_array().unwrap() {
        let hex = id.as_str().unwrap();
        assert!(
            hex.len() == 16 && u64::from_str_radix(hex, 16).is_ok(),
            "{hex}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_api_and_reflection() -> anyhow::Result<()> {
    let spec = "orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)";
    let s = Serve::start(
        shardflake_bin(),
        opts(&[
            "--layout",
            spec,
            "--node-id",
            "3",
            "--shards",
            "40",
            "--max-batch",
            "100000",
            "--workers",
            "1",
        ]),
    )?;
    s.ready(Duration::from_secs(10)).await?;
    let mut g = grpc_client(&s.grpc).await?;
    let a = g.next_id(pb::NextIdRequest {}).await?.into_inner().id;
    let batch = g
        .next_ids(pb::NextIdsRequest { count: 100_000 })
        .await?
        .into_inner()
        .ids;
    assert_eq!(batch.len(), 100_000);
    assert!(batch[0] > a && batch.windows(2).all(|w| w[0] < w[1]));
    for bad in [0, 100_001] {
        let e = g
            .next_ids(pb::NextIdsRequest { count: bad })
            .await
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.metadata().get("x-error-code").unwrap(), "invalid_count");
    }
    // Instagram's example: user 31341 with 40 shards is shard 21.
    let id = g
        .shard_id(pb::ShardIdRequest { key: 31341 })
        .await?
        .into_inner()
        .id;
    let parts = g
        .decode(pb::DecodeRequest {
            id: id.to_string(),
            format: String::new(),
        })
        .await?
        .into_inner();
    let field = |n: &str| parts.fields.iter().find(|f| f.name == n).map(|f| f.value);
    assert_eq!((field("shard"), field("node")), (Some(31341 % 40), Some(3)));
    let e = g
        .decode(pb::DecodeRequest {
            id: "zz".into(),
            format: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let k = g
        .next_kind(pb::NextKindRequest {
            kind: "uuidv7".into(),
        })
        .await?
        .into_inner();
    assert_eq!(k.value.len(), 36);
    let e = g
        .next_kind(pb::NextKindRequest {
            kind: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.metadata().get("x-error-code").unwrap(), "unknown_kind");
    let info = g.info(pb::InfoRequest {}).await?.into_inner();
    assert_eq!(
        (info.node_id, info.shards, info.layout.as_str()),
        (Some(3), 40, "orders")
    );

    // HTTP shard ids use the same shard generators.
    let mut c = Http::new(&s.http);
    let (st, body) = c.get("/v1/shard-id?key=31341").await?;
    assert_eq!(st, 200, "{body}");
    assert!(id_of(&body)? > id);
    let (st, body) = c.get("/v1/shard-id?key=-4").await?;
    assert_eq!((st, error_code(&body).as_str()), (400, "invalid_key"));

    // Server reflection lists the service (what grpcurl asks first).
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_request::MessageRequest,
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.grpc))?
        .connect()
        .await?;
    let mut r = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = r
        .server_reflection_info(tokio_stream::iter([req]))
        .await?
        .into_inner();
    let reply = stream.message().await?.expect("a reflection reply");
    assert!(
        format!("{reply:?}").contains("shardflake.v1.IdService"),
        "{reply:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_resume_after_the_state_file() -> anyhow::Result<()> {
    let libfaketime = shardflake_testkit::libfaketime()?;
    let dir = shardflake_testkit::tempdir()?;
    // Rounds 1 and 2 run with the wall clock 5 s behind (libfaketime): only
    // the state file's high-water keeps their ids above round 0's (caught:
    // a state file ignored or read as 0).
    let with_dir = |round: usize| ServeOpts {
        args: vec![
            "--workers".into(),
            "1".into(),
            "--window".into(),
            "1s".into(),
        ],
        env: if round == 0 {
            Vec::new()
        } else {
            vec![
                ("LD_PRELOAD".into(), libfaketime.display().to_string()),
                ("FAKETIME".into(), "-5s".into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
            ]
        },
        dir: Some(dir.clone()),
    };
    let mut last = 0;
    for round in 0..3 {
        let mut s =
            tokio::task::block_in_place(|| Serve::start(shardflake_bin(), with_dir(round)))?;
        s.ready(Duration::from_secs(20)).await?;
        let mut c = Http::new(&s.http);
        for _ in 0..200 {
            let (st, body) = c.get("/v1/id").await?;
            assert_eq!(st, 200, "{body}");
            let id = id_of(&body)?;
            assert!(id > last, "round {round}: {id} after {last}");
            last = id;
        }
        if round == 1 {
            s.kill(); // a crash: the successor waits out the recorded window
        } else {
            s.signal(libc::SIGTERM);
            assert!(
                s.exit(Duration::from_secs(15)).await?.success(),
                "{}",
                s.stderr()
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_serves_one_process() -> anyhow::Result<()> {
    let dir = shardflake_testkit::tempdir()?;
    let state = dir.join("state").display().to_string();
    let args = |d: &str| ServeOpts {
        args: vec![
            "--workers".into(),
            "1".into(),
            "--state-file".into(),
            state.clone(),
        ],
        dir: Some(dir.join(d)),
        ..Default::default()
    };
    let a = tokio::task::block_in_place(|| Serve::start(shardflake_bin(), args("a")))?;
    assert_eq!(a.ready(Duration::from_secs(10)).await?, 0);
    // Caught: a second process with the same node id and state file would
    // issue the same ids. It must fail at start, with the reason.
    let why = match tokio::task::block_in_place(|| Serve::start(shardflake_bin(), args("b"))) {
        Ok(mut b) => {
            assert!(!b.exit(Duration::from_secs(10)).await?.success());
            b.stderr()
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(why.contains("in use by another"), "{why}");
    let (st, _) = Http::new(&a.http).get("/v1/id").await?;
    assert_eq!(st, 200, "the first process serves on");
    Ok(())
}

#[test]
fn start_errors_are_clear() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(shardflake_bin())
            .arg("serve")
            .args(args)
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .current_dir(std::env::temp_dir())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--node-id", "1024"]).contains("does not fit"));
    assert!(run(&["--layout", "nope"]).contains("unknown layout"));
    assert!(run(&["--rollback", "maybe"]).contains("rollback"));
    let started = std::time::Instant::now();
    let err = run(&[
        "--etcd",
        "http://127.0.0.1:1",
        "--lease-ttl",
        "2s",
        "--etcd-timeout",
        "200ms",
    ]);
    assert!(err.contains("etcd unreachable"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
}
