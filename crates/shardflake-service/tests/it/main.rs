//! The service's integration tests, in-process: HTTP through the axum
//! `Router` with `tower::ServiceExt::oneshot` (no socket), and the whole
//! server (`serve`) on 127.0.0.1:0 listeners with a shutdown future, for
//! gRPC and for what needs real connections (timeouts, hang-ups).
//! `node.rs` runs `serve` from config lines for the tests moved from the
//! CLI crate (`serve_etcd.rs`, `serve_etcd_tls.rs`, `serve_operator.rs`,
//! `serve_tls.rs`). What needs a process
//! of its own (signals to it, libfaketime, restarts, its log lines, flag
//! parsing) is tested in the CLI crate.

mod etcd_login;
mod http_api;
mod limits;
mod node;
mod registry;
mod serve_etcd;
mod serve_etcd_tls;
mod serve_operator;
mod serve_tls;
mod server;
mod tickets;
mod time_range;

use std::sync::Arc;

use anyhow::Context;
use axum::body::Body;
use http_body_util::BodyExt;
use shardflake_service::Config;
use shardflake_service::Listeners;
use shardflake_service::config::NodeSource;
use shardflake_service::issuer::Issuer;
use shardflake_service::lease::Keeper;
use shardflake_service::registry::StaticRegistry;
use tower::ServiceExt;

/// A configuration from TOML lines (the config file's keys), listening on
/// 127.0.0.1:0 with its state file under `dir`.
pub fn config(dir: &tempfile::TempDir, toml: &str) -> anyhow::Result<Config> {
    let text = format!(
        "http = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\nstate_file = {:?}\n{}{toml}",
        dir.path().join("state").display().to_string(),
        first_start(toml)
    );
    Ok(Config::from_toml(&text)?)
}

/// A node id given in `toml` starts without a state file: its first start
/// says so (`resume_after = "now"`), as an operator's must.
pub fn first_start(toml: &str) -> &'static str {
    if toml.contains("node_id") {
        "resume_after = \"now\"\n"
    } else {
        ""
    }
}

/// An issuer holding a static node id, published the way `serve` does it
/// (through the keeper's static path), and its HTTP router.
pub struct App {
    /// The issuer behind the router.
    pub issuer: Arc<Issuer>,
    router: axum::Router,
    _keeper: Keeper,
    _dir: tempfile::TempDir,
}

impl App {
    /// `toml`: config file lines; a node id is required. The high-water
    /// window is 10 minutes: no keeper runs to advance it.
    pub async fn new(toml: &str) -> anyhow::Result<App> {
        let dir = tempfile::tempdir()?;
        let config = config(&dir, &format!("window = \"10m\"\n{toml}"))?;
        let issuer = Arc::new(Issuer::new(config));
        let node = match issuer.config.node {
            NodeSource::Static(id) => id,
            NodeSource::Etcd(_) => anyhow::bail!("App needs a static node id"),
        };
        // The keeper's static path: the state file's high-water, then published.
        let (_shutdown, never) = tokio::sync::watch::channel(false);
        let keeper = Keeper::start(
            issuer.clone(),
            Box::new(StaticRegistry { node_id: node }),
            "test".into(),
            never,
        )
        .await?
        .context("not shut down")?;
        Ok(App {
            router: shardflake_service::http::router(issuer.clone()),
            issuer,
            _keeper: keeper,
            _dir: dir,
        })
    }
    /// GET; `(status, body)`.
    pub async fn get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        self.request("GET", path, "").await
    }
    /// POST with a JSON body.
    pub async fn post(&self, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
        self.request("POST", path, body).await
    }
    /// Any method, through the router alone.
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: &str,
    ) -> anyhow::Result<(u16, String)> {
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))?;
        let resp = self.router.clone().oneshot(req).await?;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }
}

/// A whole server running in this process on 127.0.0.1:0; shut down (and
/// awaited) by [`Server::stop`], aborted on drop.
pub struct Server {
    /// HTTP address.
    pub http: String,
    /// gRPC address.
    pub grpc: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), shardflake_service::ServeError>>,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts `serve` with config file lines `toml` (a node id is required)
    /// and waits (bounded) until it is ready.
    pub async fn start(toml: &str) -> anyhow::Result<Server> {
        let dir = tempfile::tempdir()?;
        let config = config(&dir, toml)?;
        let listeners = Listeners::bind(&config).await?;
        let (http, grpc) = (listeners.http_addr()?, listeners.grpc_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(shardflake_service::serve(config, listeners, async {
            let _ = stopped.await;
        }));
        let mut server = Server {
            http: http.to_string(),
            grpc: grpc.to_string(),
            stop: Some(stop),
            task,
            _dir: dir,
        };
        server.ready().await?;
        Ok(server)
    }
    /// Waits (bounded) for `/readyz`; an error of `serve` returning first
    /// is the error.
    async fn ready(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut c = shardflake_testkit::Http::new(&self.http);
        loop {
            if self.task.is_finished() {
                (&mut self.task).await??;
                anyhow::bail!("serve returned before it was ready");
            }
            if let Ok((200, _)) = c.get("/readyz").await {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "not ready within 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    /// Resolves the shutdown future and waits for `serve` to return.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        Ok((&mut self.task).await??)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}
