//! Wires the parts together: serve health at once on the listeners the
//! caller bound, acquire the node identity, serve ids until the shutdown
//! future resolves (SIGTERM or Ctrl-C for the binary), then drain in-flight
//! requests, record the final high-water, revoke the lease and return.
//! The caller binds, so tests run the server in-process on port 0.

use std::future::Future;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::config::{Config, ServeArgs};
use crate::issuer::Issuer;
use crate::lease::Keeper;
use crate::shutdown::{self, Shutdown};
use crate::{grpc, http};

/// How long in-flight requests may take to finish after SIGTERM.
const DRAIN: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's headers (slowloris).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// `shardflake serve`: loads the configuration, runs a multi-threaded
/// runtime and serves until SIGTERM or Ctrl-C.
pub fn run_blocking(args: &ServeArgs) -> anyhow::Result<()> {
    let config = Config::load(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.workers)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        let listeners = Listeners::bind(&config).await?;
        let (http_addr, grpc_addr) = (listeners.http_addr()?, listeners.grpc_addr()?);
        {
            // Tests and scripts read this line for the ports (port 0 picks free ones).
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "shardflake serve: http={http_addr} grpc={grpc_addr}");
            let _ = out.flush();
        }
        let signals = async {
            match shutdown::signal().await {
                Ok(sig) => tracing::info!(signal = %sig, "draining"),
                Err(e) => tracing::error!(error = %e, "cannot watch signals"),
            }
        };
        serve(config, listeners, signals).await
    })
}

/// The bound HTTP and gRPC listeners a server answers on.
#[derive(Debug)]
pub struct Listeners {
    /// The HTTP/JSON API, health and metrics.
    pub http: TcpListener,
    /// The gRPC API.
    pub grpc: TcpListener,
}

impl Listeners {
    /// Binds the addresses `config` names (port 0 picks a free one).
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let http = TcpListener::bind(config.http)
            .await
            .with_context(|| format!("binding HTTP {}", config.http))?;
        let grpc = TcpListener::bind(config.grpc)
            .await
            .with_context(|| format!("binding gRPC {}", config.grpc))?;
        Ok(Listeners { http, grpc })
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

/// Serves with `config` on `listeners` until `shutdown` resolves, then
/// drains and releases the node identity.
pub async fn serve(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (http_addr, grpc_addr) = (listeners.http_addr()?, listeners.grpc_addr()?);
    let Listeners {
        http: http_listener,
        grpc: grpc_listener,
    } = listeners;
    let issuer = Arc::new(Issuer::new(config));
    let stop = shutdown;
    let shutdown = Arc::new(Shutdown::new());
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            stop.await;
            shutdown.trigger();
        });
    }

    let app = http::router(issuer.clone());
    let http_server = tokio::spawn(serve_http(http_listener, app, shutdown.subscribe()));
    let routes = grpc::routes(issuer.clone())?;
    let grpc_server = tokio::spawn(
        tonic::transport::Server::builder()
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
    let mut stop_rx = shutdown.subscribe();
    let started = tokio::select! {
        k = Keeper::start(issuer.clone(), holder) => Some(k),
        _ = stop_rx.wait_for(|v| *v) => None,
    };
    let mut keeper = match started {
        Some(Ok(k)) => k,
        Some(Err(e)) => {
            shutdown.trigger();
            let _ = tokio::time::timeout(DRAIN, http_server).await;
            let _ = tokio::time::timeout(DRAIN, grpc_server).await;
            return Err(e);
        }
        None => {
            let _ = tokio::time::timeout(DRAIN, http_server).await;
            let _ = tokio::time::timeout(DRAIN, grpc_server).await;
            return Ok(());
        }
    };
    let node = issuer.active().map(|a| a.node_id);
    tracing::info!(layout = issuer.layout().name(), node_id = node, "ready");

    // The keeper renews the lease until the drain ends: in-flight requests
    // may still issue ids after SIGTERM, and a lease that ran out under them
    // would refuse them (and could not be revoked).
    let drained = Shutdown::new();
    let keeper_task = {
        let (shutdown_rx, drained_rx) = (shutdown.subscribe(), drained.subscribe());
        tokio::spawn(async move {
            keeper.run(shutdown_rx, drained_rx).await;
            keeper
        })
    };
    shutdown::wait(shutdown.subscribe()).await;
    let deadline = tokio::time::Instant::now() + DRAIN;
    let http_result = tokio::time::timeout_at(deadline, http_server).await;
    let grpc_result = tokio::time::timeout_at(deadline, grpc_server).await;
    drained.trigger();
    let mut keeper = keeper_task.await.context("lease keeper task")?;
    keeper.stop().await;
    match http_result {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(anyhow::Error::new(e).context("HTTP server")),
        Ok(Err(e)) => return Err(anyhow::Error::new(e).context("HTTP server task")),
        Err(_) => tracing::warn!(drain = ?DRAIN, "HTTP requests still running after the drain"),
    }
    match grpc_result {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(anyhow::Error::new(e).context("gRPC server")),
        Ok(Err(e)) => return Err(anyhow::Error::new(e).context("gRPC server task")),
        Err(_) => tracing::warn!(drain = ?DRAIN, "gRPC requests still running after the drain"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Serves HTTP/1 on `listener` until `shutdown`, then waits for the open
/// connections' in-flight requests. (Not `axum::serve`: it has no header
/// read timeout, so a client trickling headers would hold a connection
/// forever.)
async fn serve_http(
    listener: TcpListener,
    app: axum::Router,
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
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
