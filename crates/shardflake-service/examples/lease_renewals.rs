//! Lease renewals per second a 3-member etcd sustains, through this crate's
//! etcd client (one `Lease.LeaseKeepAlive` stream per client) and, on the
//! same cluster in the same run, through a copy of the former JSON-gateway
//! client's keep-alive (one unary `POST /v3/lease/keepalive` at a time on
//! one HTTP/1 connection per client, as it was).
//!
//! `cargo run --release -p shardflake-service --example
//! lease_renewals -- [LEASES] [SECONDS] [CLIENTS]` (defaults 100, 10, 1):
//! LEASES leases, each renewed back to back by its own task, spread over
//! CLIENTS clients, for SECONDS each way; prints answers per second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use shardflake_service::etcd::Client;
use shardflake_testkit::Etcd;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .context("usage: lease_renewals [LEASES] [SECONDS] [CLIENTS]")
        })
        .collect::<anyhow::Result<_>>()?;
    let leases = *args.first().unwrap_or(&100) as usize;
    let secs = *args.get(1).unwrap_or(&10);
    let clients = (*args.get(2).unwrap_or(&1) as usize).max(1);
    let etcd = tokio::task::block_in_place(|| Etcd::start(3))?;
    let window = Duration::from_secs(secs);

    let grpc: Vec<Arc<Client>> = (0..clients)
        .map(|_| Arc::new(Client::new(&etcd.endpoints, Duration::from_secs(2))))
        .collect();
    let mut ids = Vec::with_capacity(leases);
    for _ in 0..leases {
        ids.push(grpc[0].grant(60).await?.0);
    }

    let stream_rate = renewals(&ids, window, |i| {
        let client = grpc[i % clients].clone();
        move |id| {
            let client = client.clone();
            async move { matches!(client.keep_alive(id).await, Ok(ttl) if ttl > 0) }
        }
    })
    .await?;

    let json: Vec<Arc<old_json::Client>> = (0..clients)
        .map(|i| {
            Arc::new(old_json::Client::new(
                &etcd.endpoints[i % etcd.endpoints.len()],
            ))
        })
        .collect();
    let json_rate = renewals(&ids, window, |i| {
        let client = json[i % clients].clone();
        move |id| {
            let client = client.clone();
            async move { matches!(client.keep_alive(id).await, Ok(ttl) if ttl > 0) }
        }
    })
    .await?;

    for id in ids {
        grpc[0].revoke(id).await?;
    }
    println!(
        "etcd members=3 leases={leases} clients={clients} seconds={secs}\n\
         grpc stream keep-alive: {stream_rate:.0} renewals/s\n\
         json gateway unary keep-alive (former client): {json_rate:.0} renewals/s"
    );
    Ok(())
}

/// Answers per second: each lease renewed back to back by its own task for
/// `window`; `renewer(i)` makes lease i's renewal call, which says whether
/// etcd answered the lease alive.
async fn renewals<M, R, Fut>(ids: &[i64], window: Duration, renewer: M) -> anyhow::Result<f64>
where
    M: Fn(usize) -> R,
    R: Fn(i64) -> Fut + Send + 'static,
    Fut: Future<Output = bool> + Send,
{
    let count = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + window;
    let tasks: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let (renew, count) = (renewer(i), count.clone());
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    if renew(id).await {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    Ok(count.load(Ordering::Relaxed) as f64 / window.as_secs_f64())
}

/// The former client's keep-alive, kept only for this comparison: JSON over
/// etcd's grpc-gateway, one request at a time on one HTTP/1 connection.
mod old_json {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::rt::TokioIo;
    use serde_json::Value;

    type Conn = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

    pub struct Client {
        hostport: String,
        conn: tokio::sync::Mutex<Option<Conn>>,
    }

    impl Client {
        pub fn new(endpoint: &str) -> Self {
            Client {
                hostport: endpoint.trim_start_matches("http://").to_string(),
                conn: tokio::sync::Mutex::new(None),
            }
        }

        pub async fn keep_alive(&self, lease: i64) -> anyhow::Result<u64> {
            let mut slot = self.conn.lock().await;
            if slot.as_ref().is_none_or(|c| c.is_closed()) {
                let stream = tokio::net::TcpStream::connect(&self.hostport).await?;
                stream.set_nodelay(true)?;
                let (send, conn) =
                    hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                *slot = Some(send);
            }
            let Some(send) = slot.as_mut() else {
                anyhow::bail!("no connection");
            };
            send.ready().await?;
            let body = serde_json::json!({ "ID": lease.to_string() }).to_string();
            let req = hyper::Request::post("/v3/lease/keepalive")
                .header("host", &self.hostport)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))?;
            let resp = send.send_request(req).await?;
            let bytes = resp.into_body().collect().await?.to_bytes();
            // The gateway streams: the first JSON object is the answer.
            let first: Value = serde_json::Deserializer::from_slice(&bytes)
                .into_iter::<Value>()
                .next()
                .transpose()?
                .unwrap_or(Value::Null);
            let result = first.get("result").unwrap_or(&first);
            Ok(match result.get("TTL") {
                Some(Value::String(s)) => s.parse()?,
                Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
                _ => 0,
            })
        }
    }
}
