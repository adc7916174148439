//! The load: for every node slot, a few HTTP and gRPC connections asking for
//! single ids and batches in a seeded mix, each pinned to its node (no
//! failover: a broken connection is closed and a new one opened, so one
//! connection's log is one process's answers).
//!
//! HTTP is hyper's one-connection client (`GET /v1/id`, `GET
//! /v1/ids?count=N&numbers=true`); gRPC is the tonic client generated from
//! the service's proto, over a connector that connects exactly once, so
//! tonic cannot silently reconnect to a restarted process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::record::{ConnLog, Protocol, ms_since};

// The generated `shardflake.v1` types come from the client crate, which,
// like this one, links no service code.
use shardflake_client::pb;

/// Longest a connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Longest a request may take before its connection is given up (a
/// SIGSTOPped node holds requests until SIGCONT).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a refused connect or an error answer, so a node that is down
/// or refusing is not spun on at full speed.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// One node slot as the load sees it.
#[derive(Debug)]
pub struct SlotState {
    /// HTTP address.
    pub http: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// The process now serving this slot; bumped by the run before it
    /// starts a new process (the old one is gone by then).
    pub incarnation: AtomicU32,
    /// Successful answers, for outages.
    pub answers: Mutex<Answers>,
}

/// When a slot last answered, and its longest silence.
#[derive(Debug, Default, Clone, Copy)]
pub struct Answers {
    /// Ms since load start of the last successful answer.
    pub last_ms: u64,
    /// The longest gap between two answers (or from the start), ms.
    pub longest_gap_ms: u64,
    /// When that gap began.
    pub longest_gap_from_ms: u64,
    /// Whether any answer came at all.
    pub any: bool,
}

impl SlotState {
    /// A slot at these addresses, first process 0.
    pub fn new(http: SocketAddr, grpc: SocketAddr) -> Self {
        SlotState {
            http,
            grpc,
            incarnation: AtomicU32::new(0),
            answers: Mutex::new(Answers::default()),
        }
    }

    fn answered(&self, at_ms: u64) {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .answered(at_ms);
    }

    /// The answers so far, with the silence up to `now_ms` counted as a gap.
    pub fn answers_until(&self, now_ms: u64) -> Answers {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .until(now_ms)
    }
}

impl Answers {
    /// A successful answer at `at_ms` (ms since load start).
    pub fn answered(&mut self, at_ms: u64) {
        let gap = at_ms.saturating_sub(self.last_ms);
        if gap > self.longest_gap_ms {
            self.longest_gap_ms = gap;
            self.longest_gap_from_ms = self.last_ms;
        }
        self.last_ms = self.last_ms.max(at_ms);
        self.any = true;
    }

    /// These answers with the silence up to `now_ms` counted as a gap.
    pub fn until(&self, now_ms: u64) -> Answers {
        let mut a = *self;
        let tail = now_ms.saturating_sub(a.last_ms);
        if tail > a.longest_gap_ms {
            a.longest_gap_ms = tail;
            a.longest_gap_from_ms = a.last_ms;
        }
        a
    }
}

/// The request mix.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// Share of requests for a single id (the rest are batches).
    pub single_share: f64,
    /// The large batch size; half of the batches are this big, the others 2..=2000.
    pub big_batch: u64,
}

/// What every load connection shares.
pub struct Load {
    /// When the load began (`received_ms` counts from here).
    pub start: Instant,
    /// Set to stop every connection after its current request.
    pub stop: AtomicBool,
    /// The slots.
    pub slots: Vec<Arc<SlotState>>,
    /// The layout's sequence bits, for the recording's runs.
    pub sequence_mask: u64,
    /// The mix.
    pub mix: Mix,
}

/// What one load task brings back.
#[derive(Debug, Default)]
pub struct Collected {
    /// One log per connection it opened.
    pub logs: Vec<ConnLog>,
    /// Errors by code.
    pub errors: BTreeMap<String, u64>,
}

enum Failure {
    /// The node answered with an error (code): the connection stays.
    Answer(String),
    /// The connection is broken or timed out: open another.
    Connection(String),
}

/// One HTTP/1.1 keep-alive connection.
struct HttpConn {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    authority: String,
}

#[derive(serde::Deserialize)]
struct OneId {
    id: String,
}

#[derive(serde::Deserialize)]
struct ManyIds {
    ids: Vec<u64>,
}

#[derive(serde::Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(serde::Deserialize)]
struct ErrorDetail {
    code: String,
}

impl HttpConn {
    async fn open(addr: SocketAddr) -> anyhow::Result<HttpConn> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .context("connect timed out")??;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // The connection ends when the node goes or the sender is dropped.
            let _ = conn.await;
        });
        Ok(HttpConn {
            sender,
            authority: addr.to_string(),
        })
    }

    async fn get(&mut self, path: &str) -> Result<(u16, Bytes), Failure> {
        let req = hyper::Request::get(path)
            .header(hyper::header::HOST, &self.authority)
            .body(Empty::new())
            .map_err(|e| Failure::Connection(format!("request: {e}")))?;
        let exchange = async {
            self.sender.ready().await?;
            let resp = self.sender.send_request(req).await?;
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, body))
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(Failure::Connection("io".into())),
            Err(_) => Err(Failure::Connection("timeout".into())),
        }
    }

    async fn fetch(&mut self, count: u64) -> Result<Vec<u64>, Failure> {
        let path = if count == 1 {
            "/v1/id".to_string()
        } else {
            format!("/v1/ids?count={count}&numbers=true")
        };
        let (status, body) = self.get(&path).await?;
        if status != 200 {
            let code = serde_json::from_slice::<ErrorBody>(&body)
                .map_or_else(|_| format!("status_{status}"), |b| b.error.code);
            return Err(Failure::Answer(code));
        }
        let bad = |what: &str| Failure::Answer(format!("bad_body_{what}"));
        if count == 1 {
            let one: OneId = serde_json::from_slice(&body).map_err(|_| bad("id"))?;
            Ok(vec![one.id.parse().map_err(|_| bad("id"))?])
        } else {
            let many: ManyIds = serde_json::from_slice(&body).map_err(|_| bad("ids"))?;
            Ok(many.ids)
        }
    }
}

type GrpcClient = pb::id_service_client::IdServiceClient<tonic::transport::Channel>;

async fn open_grpc(addr: SocketAddr) -> anyhow::Result<GrpcClient> {
    let used = Arc::new(AtomicBool::new(false));
    // Connects once; a later reconnect attempt by tonic fails, so a new
    // process is only ever reached through a new log.
    let connector = tower::service_fn(move |_uri: hyper::Uri| {
        let used = used.clone();
        async move {
            if used.swap(true, Ordering::SeqCst) {
                return Err(std::io::Error::other("one connection per channel"));
            }
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(TokioIo::new(stream))
        }
    });
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT);
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, channel.connect_with_connector(connector))
        .await
        .context("connect timed out")??;
    Ok(GrpcClient::new(channel).max_decoding_message_size(256 << 20))
}

async fn grpc_fetch(client: &mut GrpcClient, count: u64) -> Result<Vec<u64>, Failure> {
    let answer = if count == 1 {
        client
            .next_id(pb::NextIdRequest {})
            .await
            .map(|r| vec![r.into_inner().id])
    } else {
        client
            .next_ids(pb::NextIdsRequest { count })
            .await
            .map(|r| r.into_inner().ids)
    };
    answer.map_err(|s| {
        match s
            .metadata()
            .get("x-error-code")
            .and_then(|v| v.to_str().ok())
        {
            // The service's own refusal: the connection is fine.
            Some(code) => Failure::Answer(code.to_string()),
            None => Failure::Connection(format!("{:?}", s.code()).to_lowercase()),
        }
    })
}

enum Conn {
    Http(HttpConn),
    Grpc(GrpcClient),
}

impl Conn {
    async fn fetch(&mut self, count: u64) -> Result<Vec<u64>, Failure> {
        match self {
            Conn::Http(c) => c.fetch(count).await,
            Conn::Grpc(c) => grpc_fetch(c, count).await,
        }
    }
}

/// Runs one connection's worth of load on `slot` until `load.stop`: opens a
/// connection, asks until it breaks, opens another. `seed` picks the mix.
pub async fn connection_loop(
    load: Arc<Load>,
    slot: usize,
    protocol: Protocol,
    seed: u64,
) -> Collected {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = Collected::default();
    let state = load.slots[slot].clone();
    let count_error = |out: &mut Collected, code: &str| {
        *out.errors
            .entry(format!("{}:{code}", protocol.name()))
            .or_default() += 1;
    };
    while !load.stop.load(Ordering::Relaxed) {
        let opened = match protocol {
            Protocol::Http => HttpConn::open(state.http).await.map(Conn::Http),
            Protocol::Grpc => open_grpc(state.grpc).await.map(Conn::Grpc),
            // Databases' and ticket clients' logs are `db.rs`'s and
            // `tickets.rs`'s, never a node's.
            Protocol::MariaDb | Protocol::Postgres | Protocol::Tickets => {
                Err(anyhow::anyhow!("a node speaks HTTP or gRPC"))
            }
        };
        let mut conn = match opened {
            Ok(c) => c,
            Err(_) => {
                count_error(&mut out, "connect");
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        // Read after connecting: the process that accepted is this one or later.
        let incarnation = state.incarnation.load(Ordering::SeqCst);
        let mut log = ConnLog::new(slot, incarnation, protocol, load.sequence_mask);
        while !load.stop.load(Ordering::Relaxed) {
            let count = if rng.f64() < load.mix.single_share {
                1
            } else if rng.bool() {
                load.mix.big_batch
            } else {
                rng.u64(2..=2000)
            };
            match conn.fetch(count).await {
                Ok(ids) => {
                    let at = ms_since(load.start);
                    log.record(&ids, at);
                    state.answered(u64::from(at));
                }
                Err(Failure::Answer(code)) => {
                    count_error(&mut out, &code);
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(Failure::Connection(kind)) => {
                    count_error(&mut out, &kind);
                    break;
                }
            }
        }
        if !log.runs.is_empty() {
            out.logs.push(log);
        }
    }
    out
}

/// One GET on a fresh connection (readiness, `/metrics`, `/v1/info`), within a second.
pub async fn get_once(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Bytes)> {
    let work = async {
        let mut conn = HttpConn::open(addr).await?;
        conn.get(path)
            .await
            .map_err(|_| anyhow::anyhow!("GET {path} on {addr} failed"))
    };
    tokio::time::timeout(CONNECT_TIMEOUT, work)
        .await
        .with_context(|| format!("GET {path} on {addr} timed out"))?
}

/// `GET path` answered 200, parsed as JSON.
pub async fn get_json(addr: SocketAddr, path: &str) -> anyhow::Result<serde_json::Value> {
    let (status, body) = get_once(addr, path).await?;
    anyhow::ensure!(status == 200, "GET {path} on {addr}: {status}");
    Ok(serde_json::from_slice(&body)?)
}
