//! A `serve` in this process, started from config-file lines, for the
//! tests that once ran the `shardflake serve` binary (moved from the CLI
//! crate): it may fail at start, and then its error is what the binary
//! would have printed; [`Node::ready`] says the node id it holds.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use shardflake_service::{Config, Listeners, ServeError};
use shardflake_testkit::Http;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server task, aborted on drop (as the binary was killed).
pub struct Node {
    /// HTTP address.
    pub http: String,
    /// gRPC address.
    pub grpc: String,
    /// Held, not sent: `serve` runs until it fails or the node is dropped.
    _stop: oneshot::Sender<()>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
    /// `serve`'s error in full (`{:#}`), once it returned with one.
    error: String,
    _dir: tempfile::TempDir,
}

/// How `serve` returned.
#[derive(Debug, Clone, Copy)]
pub struct Exit(bool);

impl Exit {
    /// Whether it returned without an error.
    pub fn success(self) -> bool {
        self.0
    }
}

impl Node {
    /// Starts `serve` on 127.0.0.1:0 with a state file of its own and the
    /// config file lines `toml` (top-level keys, then any `[etcd]` table).
    /// A configuration refused is the error; `serve`'s own failures come
    /// from [`Node::exit`].
    pub async fn start(toml: &str) -> anyhow::Result<Node> {
        let dir = tempfile::tempdir()?;
        let text = format!(
            "http = \"127.0.0.1:0\"\ngrpc = \"127.0.0.1:0\"\nstate_file = {:?}\n{}{toml}",
            dir.path().join("state").display().to_string(),
            crate::first_start(toml)
        );
        let config = Config::from_toml(&text)?;
        let listeners = Listeners::bind(&config).await?;
        let (http, grpc) = (listeners.http_addr()?, listeners.grpc_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(shardflake_service::serve(config, listeners, async {
            let _ = stopped.await;
        }));
        Ok(Node {
            http: http.to_string(),
            grpc: grpc.to_string(),
            _stop: stop,
            task: Some(task),
            error: String::new(),
            _dir: dir,
        })
    }

    /// Waits (bounded) until `/readyz` answers 200; returns its node id.
    pub async fn ready(&self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        let mut client = Http::new(&self.http);
        loop {
            if let Ok((200, body)) = client.get("/readyz").await {
                let v: serde_json::Value = serde_json::from_str(&body)?;
                return v["node_id"].as_u64().context("node_id");
            }
            if self.task.as_ref().is_none_or(|t| t.is_finished()) {
                bail!("serve returned before it was ready");
            }
            if Instant::now() > deadline {
                bail!("not ready within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (bounded) for `serve` to return by itself.
    pub async fn exit(&mut self, timeout: Duration) -> anyhow::Result<Exit> {
        let Some(task) = self.task.as_mut() else {
            return Ok(Exit(self.error.is_empty()));
        };
        let returned = tokio::time::timeout(timeout, task)
            .await
            .map_err(|_| anyhow::anyhow!("server still running after {timeout:?}"))?;
        self.task = None;
        match returned? {
            Ok(()) => Ok(Exit(true)),
            Err(e) => {
                self.error = format!("error: {:#}", anyhow::Error::from(e));
                Ok(Exit(false))
            }
        }
    }

    /// What the binary would have printed on stderr when `serve` failed:
    /// its error in full (empty while it runs or after a clean return).
    pub fn stderr(&self) -> String {
        self.error.clone()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
