//! The whole server in this process (mini-redis style: `serve` takes its
//! listeners and a shutdown future): the gRPC API and reflection, and a
//! clean return when the shutdown future resolves.

use std::time::Duration;

use shardflake_service::grpc::pb;
use shardflake_testkit::{Http, error_code, grpc_client, id_of};

use crate::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_api_and_reflection() -> anyhow::Result<()> {
    let spec = "orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)";
    let s = Server::start(&format!(
        "layout = {spec:?}\nnode_id = 3\nshards = 40\nmax_batch = 100000\nworkers = 1"
    ))
    .await?;
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
    s.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_returns_when_the_shutdown_future_resolves() -> anyhow::Result<()> {
    let s = Server::start("node_id = 4\nworkers = 1").await?;
    let http = s.http.clone();
    let (st, body) = Http::new(&http).get("/v1/id").await?;
    assert_eq!(st, 200, "{body}");
    // Caught: a server that ignores the future (this times out) or fails
    // while draining.
    tokio::time::timeout(Duration::from_secs(15), s.stop()).await??;
    // The listeners are closed with it.
    assert!(tokio::net::TcpStream::connect(&http).await.is_err());
    Ok(())
}
