//! [`Client`], its builder, and the failover loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shardflake::Id;

use crate::error::{AttemptError, ClientError, EndpointFailure, FailureKind};
use crate::{grpc, http};

/// Which API the client speaks. Endpoints are that API's addresses (the
/// service's HTTP port, or its gRPC port).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// HTTP/1.1 + JSON (`GET /v1/id`, `GET /v1/ids?count=N`), keep-alive.
    #[default]
    Http,
    /// gRPC (`shardflake.v1.IdService`), one HTTP/2 channel per endpoint.
    Grpc,
}

/// Settings for a [`Client`]; see [`Client::builder`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    transport: Transport,
    timeout: Duration,
    call_timeout: Option<Duration>,
    backoff: Duration,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        ClientBuilder {
            endpoints: Vec::new(),
            transport: Transport::Http,
            timeout: Duration::from_secs(2),
            call_timeout: None,
            backoff: Duration::from_secs(1),
        }
    }
}

impl ClientBuilder {
    /// The nodes, `http://host:port` (or `host:port`). Several: a call
    /// starts at the next one in turn and fails over to the others.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }
    /// HTTP (default) or gRPC.
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }
    /// How long one request to one endpoint may take, connecting included
    /// (default 2 s). A batch takes about `count / ids per ms` ms of clock
    /// ticks on the node (1,000,000 `snowflake` ids: ~250 ms), so keep this
    /// above what your batches need.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
    /// How long a whole call may take over all endpoints tried (default:
    /// the per-request timeout times the number of endpoints, at most 10 s
    /// and at least the per-request timeout).
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }
    /// How long an endpoint that failed is passed over (tried only after
    /// the others) before it is probed again in turn (default 1 s).
    pub fn backoff(mut self, backoff: Duration) -> Self {
        self.backoff = backoff;
        self
    }
    /// Checks the endpoints and builds. Connects lazily, on first use, so
    /// this needs no runtime and no node needs to be up yet.
    pub fn build(self) -> Result<Client, ClientError> {
        if self.endpoints.is_empty() {
            return Err(ClientError::InvalidConfig("no endpoints".into()));
        }
        if self.timeout.is_zero() {
            return Err(ClientError::InvalidConfig("timeout must be above 0".into()));
        }
        let call_timeout = match self.call_timeout {
            Some(d) if d.is_zero() => {
                return Err(ClientError::InvalidConfig(
                    "call timeout must be above 0".into(),
                ));
            }
            Some(d) => d,
            None => {
                let n = u32::try_from(self.endpoints.len()).unwrap_or(u32::MAX);
                self.timeout
                    .saturating_mul(n)
                    .min(Duration::from_secs(10))
                    .max(self.timeout)
            }
        };
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| {
                let conn = match self.transport {
                    Transport::Http => Conn::Http(http::Node::new(e)?),
                    Transport::Grpc => Conn::Grpc(Box::new(grpc::Node::new(e, self.timeout)?)),
                };
                Ok(Endpoint {
                    name: e.clone(),
                    down_until_ms: AtomicU64::new(0),
                    conn,
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Ok(Client {
            inner: Arc::new(Inner {
                endpoints,
                transport: self.transport,
                timeout: self.timeout,
                call_timeout,
                backoff_ms: u64::try_from(self.backoff.as_millis()).unwrap_or(u64::MAX),
                next: AtomicUsize::new(0),
                base: Instant::now(),
            }),
        })
    }
}

/// A client for one or more id service nodes. Cheap to clone (shared
/// connections); use it from any number of tasks.
///
/// Each call starts at the next endpoint in turn and, on a connection
/// error, a timeout or a "try elsewhere" answer (HTTP 503 `no_lease`,
/// `busy`, `clock_moved_backwards`, …; gRPC Unavailable), tries the next
/// endpoint, each at most once per call, within the call timeout. A node
/// that failed is tried last for [`ClientBuilder::backoff`], then probed
/// in turn by one call (the others keep it last until it answers). While
/// other endpoints are left to try, one attempt takes at most its share of
/// the call timeout left. A refusal (HTTP 4xx such as `invalid_count`) is returned at once.
/// Retrying is safe for ids: ids a node reserved for a request whose answer
/// was lost are skipped, never reissued.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    endpoints: Vec<Endpoint>,
    transport: Transport,
    timeout: Duration,
    call_timeout: Duration,
    backoff_ms: u64,
    next: AtomicUsize,
    base: Instant,
}

#[derive(Debug)]
struct Endpoint {
    name: String,
    /// Milliseconds since `Inner::base` until which this endpoint is tried
    /// last; 0 while healthy.
    down_until_ms: AtomicU64,
    conn: Conn,
}

#[derive(Debug)]
enum Conn {
    Http(http::Node),
    Grpc(Box<grpc::Node>),
}

impl Client {
    /// A builder; at least one endpoint is required.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use shardflake_client::{Client, Transport};
    ///
    /// # async fn demo() -> Result<(), shardflake_client::ClientError> {
    /// let client = Client::builder()
    ///     .endpoints(["http://10.0.0.1:8080", "http://10.0.0.2:8080"])
    ///     .transport(Transport::Http)
    ///     .timeout(Duration::from_secs(1))
    ///     .build()?;
    /// let id = client.next_id().await?;
    /// let batch = client.next_ids(1000).await?; // one contiguous reservation, ascending
    /// assert_eq!(batch.len(), 1000);
    /// # let _ = id;
    /// # Ok(()) }
    /// ```
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// One id.
    pub async fn next_id(&self) -> Result<Id, ClientError> {
        let ids = self.call(None, Request::One).await?;
        // `fetch` checks the count.
        ids.first().copied().ok_or_else(|| ClientError::Malformed {
            endpoint: String::new(),
            detail: "no id".into(),
        })
    }

    /// `count` ids from one node's contiguous reservation, ascending
    /// (`count` from 1 to the service's `--max-batch`; above it the service
    /// refuses with `invalid_count`).
    pub async fn next_ids(&self, count: u64) -> Result<Vec<Id>, ClientError> {
        self.next_ids_from(None, count).await
    }

    /// [`Client::next_ids`] starting at endpoint `start` (mod the number of
    /// endpoints) instead of the next in turn: prefetchers pin one fetcher
    /// per node so every node works at once.
    pub(crate) async fn next_ids_from(
        &self,
        start: Option<usize>,
        count: u64,
    ) -> Result<Vec<Id>, ClientError> {
        if count == 0 {
            return Err(ClientError::InvalidConfig(
                "count must be at least 1".into(),
            ));
        }
        self.call(start, Request::Many(count)).await
    }

    /// The endpoints, as given.
    pub fn endpoints(&self) -> impl Iterator<Item = &str> {
        self.inner.endpoints.iter().map(|e| e.name.as_str())
    }

    /// The transport.
    pub fn transport(&self) -> Transport {
        self.inner.transport
    }

    /// The overall timeout of one call.
    pub fn call_timeout(&self) -> Duration {
        self.inner.call_timeout
    }

    pub(crate) fn endpoint_count(&self) -> usize {
        self.inner.endpoints.len()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.inner.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn call(&self, start: Option<usize>, req: Request) -> Result<Vec<Id>, ClientError> {
        let inner = &*self.inner;
        let n = inner.endpoints.len();
        let start = start.unwrap_or_else(|| inner.next.fetch_add(1, Ordering::Relaxed)) % n;
        let order = plan(&inner.endpoints, start, self.now_ms(), inner.backoff_ms);
        let deadline = Instant::now() + inner.call_timeout;
        let mut failures = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let ep = &inner.endpoints[i];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                failures.extend(order[k..].iter().map(|&j| EndpointFailure {
                    endpoint: inner.endpoints[j].name.clone(),
                    kind: FailureKind::NotTried,
                    message: format!("call timeout {:?} reached", inner.call_timeout),
                }));
                break;
            }
            // While other endpoints are left to try, an attempt gets at
            // most its share of what is left: a hung node never takes the
            // whole call.
            let others = u32::try_from(order.len() - k).unwrap_or(u32::MAX);
            let per = inner.timeout.min(left / others.max(1));
            let outcome = match tokio::time::timeout(per, fetch(ep, req)).await {
                Ok(r) => r,
                Err(_) => Err(AttemptError::Retry(
                    FailureKind::Timeout,
                    format!("no answer within {per:?}"),
                )),
            };
            match outcome {
                Ok(ids) => {
                    ep.down_until_ms.store(0, Ordering::Relaxed);
                    return Ok(ids);
                }
                Err(AttemptError::Fatal(e)) => return Err(e),
                Err(AttemptError::Retry(kind, message)) => {
                    let until = self.now_ms().saturating_add(inner.backoff_ms).max(1);
                    ep.down_until_ms.store(until, Ordering::Relaxed);
                    failures.push(EndpointFailure {
                        endpoint: ep.name.clone(),
                        kind,
                        message,
                    });
                }
            }
        }
        Err(ClientError::AllFailed { failures })
    }
}

/// The endpoints one call tries, starting from turn `start`: the healthy
/// ones in turn, then those resting after a failure. A half-open breaker:
/// once an endpoint's rest is over, the one call that claims it (pushing its
/// rest on by another backoff) probes it in turn; every other call keeps it
/// last until the probe answers.
fn plan(endpoints: &[Endpoint], start: usize, now: u64, backoff_ms: u64) -> Vec<usize> {
    let n = endpoints.len();
    let mut order: Vec<usize> = Vec::with_capacity(n);
    let mut resting: Vec<usize> = Vec::new();
    for k in 0..n {
        let i = (start + k) % n;
        let until = &endpoints[i].down_until_ms;
        let rest = until.load(Ordering::Relaxed);
        let probe = rest == 0
            || (rest <= now
                && until
                    .compare_exchange(
                        rest,
                        now.saturating_add(backoff_ms).max(1),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    )
                    .is_ok());
        if probe {
            order.push(i);
        } else {
            resting.push(i);
        }
    }
    order.extend(resting);
    order
}

/// What a call asks for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Request {
    One,
    Many(u64),
}

impl Request {
    pub(crate) fn count(self) -> u64 {
        match self {
            Request::One => 1,
            Request::Many(n) => n,
        }
    }
}

async fn fetch(ep: &Endpoint, req: Request) -> Result<Vec<Id>, AttemptError> {
    let ids = match &ep.conn {
        Conn::Http(node) => node.fetch(req).await?,
        Conn::Grpc(node) => node.fetch(req).await?,
    };
    check(&ep.name, req.count(), ids)
}

/// The service answers exactly `count` ascending ids; anything else is
/// malformed (a wrong address, or a proxy mangling the body).
fn check(endpoint: &str, count: u64, ids: Vec<Id>) -> Result<Vec<Id>, AttemptError> {
    let malformed = |detail: String| {
        AttemptError::Fatal(ClientError::Malformed {
            endpoint: endpoint.to_string(),
            detail,
        })
    };
    if ids.len() as u64 != count {
        return Err(malformed(format!(
            "asked for {count} ids, got {}",
            ids.len()
        )));
    }
    if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
        return Err(malformed(format!(
            "ids not ascending: {} then {}",
            w[0].get(),
            w[1].get()
        )));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_refuses_bad_settings() {
        assert!(matches!(
            Client::builder().build(),
            Err(ClientError::InvalidConfig(_))
        ));
        assert!(matches!(
            Client::builder()
                .endpoints(["localhost:1"])
                .timeout(Duration::ZERO)
                .build(),
            Err(ClientError::InvalidConfig(_))
        ));
        for bad in [
            "https://x:1",
            "http://",
            "ftp://x",
            "http://x:1/path",
            "http://x:99999",
        ] {
            for t in [Transport::Http, Transport::Grpc] {
                let r = Client::builder().endpoints([bad]).transport(t).build();
                assert!(
                    matches!(r, Err(ClientError::InvalidEndpoint { .. })),
                    "{bad} {t:?}: {r:?}"
                );
            }
        }
        let c = Client::builder()
            .endpoints(["127.0.0.1:1", "http://[::1]:2/"])
            .build()
            .unwrap();
        assert_eq!(c.call_timeout(), Duration::from_secs(4));
    }

    #[test]
    fn answers_are_checked() {
        let ok = check("e", 3, vec![Id(1), Id(2), Id(5)]);
        assert!(ok.is_ok());
        for bad in [
            vec![Id(1), Id(2)],
            vec![Id(1), Id(1), Id(2)],
            vec![Id(3), Id(2), Id(4)],
        ] {
            assert!(matches!(
                check("e", bad.len().max(3) as u64, bad),
                Err(AttemptError::Fatal(ClientError::Malformed { .. }))
            ));
        }
    }

    #[test]
    fn a_rested_endpoint_is_probed_by_one_call_only() {
        let c = Client::builder()
            .endpoints(["127.0.0.1:1", "127.0.0.1:2"])
            .build()
            .unwrap();
        let eps = &c.inner.endpoints;
        assert_eq!(plan(eps, 0, 10, 1000), [0, 1]);
        // The first failed at 10: resting until 1010, tried last.
        eps[0].down_until_ms.store(1010, Ordering::Relaxed);
        assert_eq!(plan(eps, 0, 500, 1000), [1, 0]);
        // Rest over: one call probes it in turn, the next ones do not.
        assert_eq!(plan(eps, 0, 1010, 1000), [0, 1]);
        assert_eq!(plan(eps, 0, 1011, 1000), [1, 0]);
        assert_eq!(plan(eps, 0, 1500, 1000), [1, 0]);
        // The probe failed (rest pushed on) or answered (0): in turn again.
        eps[0].down_until_ms.store(0, Ordering::Relaxed);
        assert_eq!(plan(eps, 0, 1600, 1000), [0, 1]);
    }

    #[tokio::test]
    async fn all_down_is_a_typed_error_within_the_call_timeout() {
        // Ports nothing listens on: bind, note the port, close.
        let mut eps = Vec::new();
        for _ in 0..2 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            eps.push(format!("http://{}", l.local_addr().unwrap()));
        }
        for t in [Transport::Http, Transport::Grpc] {
            let c = Client::builder()
                .endpoints(eps.clone())
                .transport(t)
                .timeout(Duration::from_millis(500))
                .build()
                .unwrap();
            let began = Instant::now();
            match c.next_id().await {
                Err(ClientError::AllFailed { failures }) => {
                    assert_eq!(failures.len(), 2, "{failures:?}");
                }
                other => panic!("{t:?}: {other:?}"),
            }
            assert!(began.elapsed() < Duration::from_secs(2));
            assert!(matches!(
                c.next_ids(0).await,
                Err(ClientError::InvalidConfig(_))
            ));
        }
    }
}
