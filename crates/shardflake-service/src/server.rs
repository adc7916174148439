//! Wires the parts together: on listeners the caller bound, serve health at
//! once, acquire the node identity, serve ids until the shutdown future
//! resolves, then drain in-flight requests, record the final high-water,
//! revoke the lease and return.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use shardflake_tickets::{TicketClient, TicketError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use crate::auth::{ApiToken, TokenFileError};
use crate::config::{Config, ConfigError, NodeSource, RawConfig};
use crate::issuer::Issuer;
use crate::lease::{Keeper, KeeperError};
use crate::shutdown::{self, Shutdown};
use crate::tls::{self, ListenerTls, TlsError};
use crate::{grpc, http};

/// Why `shardflake serve` stopped or could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The tokio runtime could not start.
    #[error("starting the runtime: {0}")]
    Runtime(std::io::Error),
    /// A listen address could not be bound.
    #[error("binding {transport} {addr}: {error}")]
    Bind {
        /// `HTTP` or `gRPC`.
        transport: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The bind failure (address in use, not local, permissions).
        error: std::io::Error,
    },
    /// The TLS certificate or key cannot serve.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The API token file gives no token.
    #[error(transparent)]
    ApiToken(#[from] TokenFileError),
    /// The gRPC server could not be set up (reflection, TLS).
    #[error("setting up the gRPC server: {0}")]
    GrpcSetup(Box<dyn std::error::Error + Send + Sync>),
    /// The node identity could not be acquired or kept (state file, etcd,
    /// high-water), as the lease keeper reports it.
    #[error(transparent)]
    Keeper(#[from] KeeperError),
    /// The etcd settings cannot work (an endpoint URL, a TLS file, the
    /// password file).
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    /// The tickets file is malformed (its servers are not needed to start).
    #[error("tickets: {0}")]
    Tickets(#[from] TicketError),
    /// The HTTP server failed.
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Grpc(tonic::transport::Error),
    /// A server or keeper task panicked or was cancelled.
    #[error("{task} task: {error}")]
    Task {
        /// Which task.
        task: &'static str,
        /// What became of it.
        error: tokio::task::JoinError,
    },
}

/// How long in-flight requests may take to finish after SIGTERM.
const DRAIN: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's headers (slowloris).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// `shardflake serve`: validates the layered options ([`Config::load`]),
/// binds the configured addresses, and serves on a multi-threaded runtime
/// until SIGTERM or Ctrl-C.
pub fn run_blocking(raw: RawConfig) -> Result<(), ServeError> {
    let config = Config::load(raw)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.workers)
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(async {
        let listeners = Listeners::bind(&config).await?;
        serve(config, listeners, signals()).await
    })
}

/// Resolves on SIGTERM or Ctrl-C (logged), or at once when the signals
/// cannot be watched.
async fn signals() {
    match shutdown::signal().await {
        Ok(sig) => tracing::info!(signal = %sig, "draining"),
        Err(e) => tracing::error!(error = %e, "cannot watch signals"),
    }
}

/// The bound HTTP and gRPC listeners a server answers on. Tests bind port
/// 0 and read the addresses back before serving.
#[derive(Debug)]
pub struct Listeners {
    /// The HTTP/JSON API, health and metrics.
    pub http: TcpListener,
    /// The gRPC API.
    pub grpc: TcpListener,
}

impl Listeners {
    /// Binds the addresses `config` names (port 0 picks a free one).
    pub async fn bind(config: &Config) -> Result<Listeners, ServeError> {
        let bind = |transport, addr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| ServeError::Bind {
                    transport,
                    addr,
                    error,
                })
        };
        Ok(Listeners {
            http: bind("HTTP", config.http).await?,
            grpc: bind("gRPC", config.grpc).await?,
        })
    }
    /// The HTTP listener's address.
    pub fn http_addr(&self) -> std::io::Result<SocketAddr> {
        self.http.local_addr()
    }
    /// The gRPC listener's address.
    pub fn grpc_addr(&self) -> std::io::Result<SocketAddr> {
        self.grpc.local_addr()
    }
}

/// Logs a warning when `layout` has less than `threshold` left before its
/// ids stop fitting a signed `bigint` (its end, or its first negative id);
/// returns whether it did.
pub fn warn_of_lifetime(layout: &shardflake::Layout, threshold: Duration, now_ms: u64) -> bool {
    let left_ms = layout.lifetime_left_ms(now_ms);
    if left_ms >= threshold.as_millis() {
        return false;
    }
    let ends = shardflake::timestamp::rfc3339_ms(
        u64::try_from(layout.lifetime_end_ms()).unwrap_or(u64::MAX),
    );
    tracing::warn!(
        layout = layout.name(),
        days_left = (left_ms / 86_400_000) as u64,
        ends = %ends,
        "layout {} runs out (or turns negative as a signed bigint) at {ends}, in {} days: plan a layout change now (shardflake plan --from OLD --to NEW)",
        layout.name(),
        left_ms / 86_400_000,
    );
    true
}

/// Serves with `config` on `listeners` until `shutdown` resolves (or the
/// lease keeper must stop the node), then drains in-flight requests,
/// records the final high-water and releases the node identity.
pub async fn serve(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    warn_of_lifetime(
        &config.layout,
        config.lifetime_warning,
        shardflake::Clock::now_ms(&shardflake::SystemClock),
    );
    // Files first: a bad certificate or token fails before anything is served.
    let tls = config.tls.as_ref().map(ListenerTls::read).transpose()?;
    let token = config
        .api_token_file
        .as_deref()
        .map(ApiToken::read)
        .transpose()?;
    let registry = crate::registry::for_node_source(&config.node)?;
    // Then the ticket servers: a bad file fails the start; servers that
    // cannot be used now do not (the node's ids never depend on them).
    let tickets = match &config.tickets {
        Some(path) => Some(connect_tickets(path, &config.node).await?),
        None => None,
    };
    let addr = |transport, listener: &TcpListener, addr| {
        listener.local_addr().map_err(|error| ServeError::Bind {
            transport,
            addr,
            error,
        })
    };
    let http_addr = addr("HTTP", &listeners.http, config.http)?;
    let grpc_addr = addr("gRPC", &listeners.grpc, config.grpc)?;
    let Listeners {
        http: http_listener,
        grpc: grpc_listener,
    } = listeners;
    // Before the address line: a refused lock is the only thing printed.
    let state_lock = crate::state_file::StateFile::new(config.state_file.clone())
        .lock()
        .map_err(|e| ServeError::Keeper(KeeperError::Lock(e)))?;
    // Which node this is: static:<id>, etcd:<prefix> or, with --node-id,
    // etcd:<prefix>:<id>.
    let node = match &config.node {
        NodeSource::Static(id) => format!("static:{id}"),
        NodeSource::Etcd(e) => match e.pinned_node_id {
            Some(id) => format!("etcd:{}:{id}", e.prefix),
            None => format!("etcd:{}", e.prefix),
        },
    };
    {
        // Tests and scripts read this line for the ports (port 0 picks free ones).
        let mut out = std::io::stdout().lock();
        let _ = writeln!(
            out,
            "shardflake serve: http={http_addr} grpc={grpc_addr} node={node}"
        );
        let _ = out.flush();
    }
    log_node_origin(&config);

    let mut issuer = Issuer::new(config);
    if let Some(tickets) = tickets {
        issuer = issuer.with_tickets(tickets);
    }
    let issuer = Arc::new(issuer);
    let stop = shutdown;
    let shutdown = Arc::new(Shutdown::new());
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            stop.await;
            shutdown.trigger();
        });
    }

    let app = http::router_with_token(issuer.clone(), token.clone());
    let http_server = tokio::spawn(serve_http(
        http_listener,
        app,
        tls.as_ref().map(|t| t.http.clone()),
        shutdown.subscribe(),
    ));
    let routes = grpc::routes_with_token(issuer.clone(), token)
        .map_err(|e| ServeError::GrpcSetup(e.into()))?;
    let mut grpc_builder = tonic::transport::Server::builder();
    if let Some(tls) = &tls {
        grpc_builder = grpc_builder
            .tls_config(tls.grpc.clone())
            .map_err(|e| ServeError::GrpcSetup(e.into()))?;
    }
    let grpc_server = tokio::spawn(
        grpc_builder
            .add_routes(routes)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
                shutdown::wait(shutdown.subscribe()),
            ),
    );

    let holder = serde_json::json!({
        "pid": std::process::id(),
        "host": shardflake_host::hostname(),
        "http": http_addr.to_string(),
        "grpc": grpc_addr.to_string(),
    })
    .to_string();
    // Shutdown during the first acquisition ends it with any lease taken
    // so far revoked (the keeper watches `shutdown` itself).
    let started = Keeper::start_locked(
        issuer.clone(),
        registry,
        holder,
        state_lock,
        shutdown.subscribe(),
    )
    .await;
    let mut keeper = match started {
        Ok(Some(k)) => k,
        Err(e) => {
            shutdown.trigger();
            let _ = tokio::time::timeout(DRAIN, http_server).await;
            let _ = tokio::time::timeout(DRAIN, grpc_server).await;
            close_tickets(&issuer).await;
            return Err(ServeError::Keeper(e));
        }
        Ok(None) => {
            let _ = tokio::time::timeout(DRAIN, http_server).await;
            let _ = tokio::time::timeout(DRAIN, grpc_server).await;
            close_tickets(&issuer).await;
            return Ok(());
        }
    };
    let node = issuer.active().map(|a| a.node_id);
    tracing::info!(layout = issuer.layout().name(), node_id = node, "ready");

    // The keeper renews the lease until the drain ends: in-flight requests
    // may still issue ids after SIGTERM, and a lease that ran out under them
    // would refuse them (and could not be revoked).
    let drained = Shutdown::new();
    let mut keeper_task = {
        let (shutdown_rx, drained_rx) = (shutdown.subscribe(), drained.subscribe());
        tokio::spawn(async move {
            let result = keeper.run(shutdown_rx, drained_rx).await;
            (keeper, result)
        })
    };
    // The keeper ends early only when the node must stop (a corrupt record
    // or another layout found on re-acquiring): shut down with its error.
    let stopped_early = tokio::select! {
        _ = shutdown::wait(shutdown.subscribe()) => None,
        done = &mut keeper_task => Some(done),
    };
    if let Some(done) = stopped_early {
        shutdown.trigger();
        let (mut keeper, result) = done.map_err(|error| ServeError::Task {
            task: "lease keeper",
            error,
        })?;
        let deadline = tokio::time::Instant::now() + DRAIN;
        let _ = tokio::time::timeout_at(deadline, http_server).await;
        let _ = tokio::time::timeout_at(deadline, grpc_server).await;
        close_tickets(&issuer).await;
        keeper.stop().await;
        result?;
        return Ok(());
    }
    let deadline = tokio::time::Instant::now() + DRAIN;
    let http_result = tokio::time::timeout_at(deadline, http_server).await;
    let grpc_result = tokio::time::timeout_at(deadline, grpc_server).await;
    close_tickets(&issuer).await;
    drained.trigger();
    let (mut keeper, result) = keeper_task.await.map_err(|error| ServeError::Task {
        task: "lease keeper",
        error,
    })?;
    keeper.stop().await;
    result?;
    match http_result {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(ServeError::Http(e)),
        Ok(Err(error)) => {
            return Err(ServeError::Task {
                task: "HTTP server",
                error,
            });
        }
        Err(_) => tracing::warn!(drain = ?DRAIN, "HTTP requests still running after the drain"),
    }
    match grpc_result {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(ServeError::Grpc(e)),
        Ok(Err(error)) => {
            return Err(ServeError::Task {
                task: "gRPC server",
                error,
            });
        }
        Err(_) => tracing::warn!(drain = ?DRAIN, "gRPC requests still running after the drain"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// After the drain: the unused tails of the ticket segments go back to
/// their servers (compare-and-set) and the high-water marks are written.
/// Says where a static node id came from when an operator could miss it:
/// node 0 by default (every host left so is node 0), or an id derived from
/// the host (a few bits of an address: hosts can collide); a given id,
/// that nothing checks it against other nodes.
fn log_node_origin(config: &Config) {
    let id = match &config.node {
        NodeSource::Static(id) => *id,
        NodeSource::Etcd(e) => {
            if e.prefix == crate::config::DEFAULT_ETCD_PREFIX {
                tracing::warn!(
                    prefix = %e.prefix,
                    "etcd prefix {}: the default, shared by every node started without --etcd-prefix on this etcd (a fleet beside another there hands out its ids twice); name the fleet's prefix with --etcd-prefix",
                    e.prefix
                );
            } else {
                tracing::info!(prefix = %e.prefix, "etcd prefix {}", e.prefix);
            }
            return;
        }
    };
    let bits = config
        .layout
        .field(&config.node_field)
        .map_or(0, |f| f.bits());
    match config.node_origin {
        "default" => tracing::warn!(
            node_id = id,
            "no --node-id, --node-id-from or --etcd: this is static node 0 by default; every host started so is node 0 and they issue the same ids"
        ),
        "ip" => tracing::warn!(
            node_id = id,
            bits,
            "node id from the host's IP address: its low {bits} bits only; hosts whose addresses agree in those bits get the same node id"
        ),
        "mac" => tracing::warn!(
            node_id = id,
            bits,
            "node id from a hash of the host's MAC addresses, kept to {bits} bits: two hosts can hash to the same node id"
        ),
        // Given: said once, since nothing can check it later.
        _ => tracing::info!(
            node_id = id,
            "static node {id}: no registry checks that no other node runs as {id} (two would issue the same ids); --node-id {id} with --etcd has etcd refuse a second holder"
        ),
    }
}

async fn close_tickets(issuer: &Issuer) {
    if let Some(tickets) = issuer.tickets() {
        let report = tickets.shutdown().await;
        tracing::info!(skipped_ids = report.skipped_ids, "ticket segments closed");
    }
}

/// Serves HTTP/1 on `listener` (over TLS when `tls` is given) until
/// `shutdown`, then waits for the open connections' in-flight requests.
/// (Not `axum::serve`: it has no header read timeout, so a client trickling
/// headers would hold a connection forever.)
async fn serve_http(
    listener: TcpListener,
    app: axum::Router,
    tls: Option<TlsAcceptor>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(shutdown::wait(shutdown));
    loop {
        let tcp = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accepting an HTTP connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (app, watcher) = (app.clone(), graceful.watcher());
        match &tls {
            None => {
                tokio::spawn(serve_connection(tcp, app, watcher));
            }
            Some(acceptor) => {
                // The handshake runs in the connection's task, bounded, so a
                // slow client holds only itself up.
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match handshake(&acceptor, tcp).await {
                        Ok(stream) => serve_connection(stream, app, watcher).await,
                        Err(e) => tracing::debug!(error = %e, "TLS handshake"),
                    }
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Reads the tickets file and connects to its servers with the marks of
/// [`crate::tickets::high_water_store`]. Only a bad file is an error: a
/// server that cannot be used now (stalled, down, refused) is probed in the
/// background, and its ticket calls answer `unavailable` meanwhile.
async fn connect_tickets(path: &Path, node: &NodeSource) -> Result<TicketClient, ServeError> {
    let config = shardflake_tickets::Config::load(path).map_err(TicketError::from)?;
    let store = crate::tickets::high_water_store(&config, node)?;
    let client = TicketClient::start_with_store(config, store).await;
    for m in client.metrics().into_iter().filter(|m| m.state != "up") {
        tracing::warn!(server = %m.name, state = m.state, reason = m.reason.as_deref().unwrap_or(""),
            "ticket server not usable at start: serving without it, probing it in the background");
    }
    Ok(client)
}

/// The server side of a TLS handshake, within [`tls::HANDSHAKE_TIMEOUT`].
/// A client speaking plain HTTP gets a plain 400 `tls_required` saying so,
/// rather than a closed connection.
async fn handshake(
    acceptor: &TlsAcceptor,
    mut tcp: TcpStream,
) -> std::io::Result<tokio_rustls::server::TlsStream<TcpStream>> {
    let within = async {
        // A TLS connection opens with a handshake record (content type 22).
        let mut first = [0u8; 1];
        if tcp.peek(&mut first).await? == 1 && first[0] != 22 {
            let refusal = crate::error::ApiError::from(crate::error::IssueError::TlsRequired);
            let status = axum::http::StatusCode::from_u16(refusal.status)
                .unwrap_or(axum::http::StatusCode::BAD_REQUEST);
            let body = refusal.to_json();
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            tcp.write_all(response.as_bytes()).await?;
            let _ = tcp.shutdown().await;
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "plain HTTP on the HTTPS port",
            ));
        }
        acceptor.accept(tcp).await
    };
    tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, within)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake"))?
}

/// Serves HTTP/1 on one connection until it closes or the drain ends it.
async fn serve_connection<Io>(io: Io, app: axum::Router, watcher: Watcher)
where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    let _ = watcher.watch(conn).await;
}
