//! `shardflake serve` processes (killed on drop, also when a test fails),
//! an HTTP/1 client, a gRPC client and small parsers of the API's answers.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;

use shardflake_proto::id_service_client::IdServiceClient;

use crate::tempdir;

/// A `shardflake serve` process; SIGKILLed on drop.
#[derive(Debug)]
pub struct Serve {
    child: Child,
    /// Its working directory (state file, logs).
    pub dir: PathBuf,
    /// HTTP address.
    pub http: String,
    /// gRPC address.
    pub grpc: String,
    exited: Option<std::process::ExitStatus>,
}

/// How to start a server.
#[derive(Debug, Clone, Default)]
pub struct ServeOpts {
    /// Extra flags after `serve`.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Working directory (a fresh one under the system temp dir when `None`).
    pub dir: Option<PathBuf>,
}

impl Serve {
    /// Starts `bin serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 ARGS` and
    /// waits (bounded) until it prints its ports.
    pub fn start(bin: &str, opts: ServeOpts) -> anyhow::Result<Serve> {
        let dir = match opts.dir {
            Some(d) => d,
            None => tempdir()?,
        };
        std::fs::create_dir_all(&dir)?;
        let stdout = std::fs::File::create(dir.join("stdout.log"))?;
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("stderr.log"))?;
        let child = Command::new(bin)
            .args(["serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(&opts.args)
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawning {bin}"))?;
        let mut s = Serve {
            child,
            dir,
            http: String::new(),
            grpc: String::new(),
            exited: None,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(s.dir.join("stdout.log")).unwrap_or_default();
            if let Some(line) = text
                .lines()
                .find(|l| l.starts_with("shardflake serve: http="))
            {
                for word in line.split_whitespace() {
                    if let Some(a) = word.strip_prefix("http=") {
                        s.http = a.to_string();
                    }
                    if let Some(a) = word.strip_prefix("grpc=") {
                        s.grpc = a.to_string();
                    }
                }
                return Ok(s);
            }
            if let Some(status) = s.child.try_wait()? {
                bail!("server exited with {status}: {}", s.stderr());
            }
            if Instant::now() > deadline {
                bail!("server printed no address in 20 s: {}", s.stderr());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr.log")).unwrap_or_default()
    }
    /// Sends a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
    /// Waits (bounded) for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                self.exited = Some(st);
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!("server still running after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    /// Waits (bounded) for the process to exit, without blocking the runtime.
    pub async fn exit(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                self.exited = Some(st);
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!("server still running after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            self.exited = self.child.wait().ok();
        }
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
            if Instant::now() > deadline {
                bail!("not ready within {timeout:?}: {}", self.stderr());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A keep-alive HTTP/1 client for one server; reconnects after errors.
#[derive(Debug)]
pub struct Http {
    addr: String,
    send: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Http {
    /// A client for `host:port`.
    pub fn new(addr: &str) -> Self {
        Http {
            addr: addr.to_string(),
            send: None,
        }
    }
    /// GET; `(status, body)`.
    pub async fn get(&mut self, path: &str) -> anyhow::Result<(u16, String)> {
        self.request("GET", path, Bytes::new()).await
    }
    /// POST with a body.
    pub async fn post(&mut self, path: &str, body: &str) -> anyhow::Result<(u16, String)> {
        self.request("POST", path, Bytes::from(body.to_string()))
            .await
    }
    /// Any method.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<(u16, String)> {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            self.request_inner(method, path, body),
        )
        .await;
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                self.send = None;
                Err(e)
            }
            Err(_) => {
                self.send = None;
                bail!("no answer in 10 s")
            }
        }
    }
    async fn request_inner(
        &mut self,
        method: &str,
        path: &str,
        body: Bytes,
    ) -> anyhow::Result<(u16, String)> {
        if self.send.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = tokio::net::TcpStream::connect(&self.addr).await?;
            stream.set_nodelay(true)?;
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.send = Some(send);
        }
        let send = self.send.as_mut().context("no connection")?;
        send.ready().await?;
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.addr)
            .header("content-type", "application/json")
            .body(Full::new(body))?;
        let resp = send.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// A request written to a server's socket before it is read: the kernel
/// accepts the connection and buffers the bytes even while the server is
/// stopped (SIGSTOP), so the server finds it waiting when it wakes.
#[derive(Debug)]
pub struct Queued(tokio::net::TcpStream);

impl Queued {
    /// Connects to `addr` and writes `GET path` (`Connection: close`).
    pub async fn send(addr: &str, path: &str) -> anyhow::Result<Queued> {
        use tokio::io::AsyncWriteExt;
        let mut stream =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
                .context("connect timed out")??;
        let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await?;
        Ok(Queued(stream))
    }
    /// Reads the answer (bounded): `(status, body)`.
    pub async fn response(mut self, timeout: Duration) -> anyhow::Result<(u16, String)> {
        use tokio::io::AsyncReadExt;
        let mut raw = Vec::new();
        tokio::time::timeout(timeout, self.0.read_to_end(&mut raw))
            .await
            .context("no answer in time")??;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("status line of {head:?}"))?;
        Ok((status, body.to_string()))
    }
}

/// The value of a metric in Prometheus text (`name value` lines).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
}

/// A gRPC client for `host:port`.
pub async fn grpc_client(addr: &str) -> anyhow::Result<IdServiceClient<tonic::transport::Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await?;
    Ok(IdServiceClient::new(channel).max_decoding_message_size(64 << 20))
}

/// `n` ids; a 503 (fenced while etcd is slow on a loaded machine) is retried
/// for a bounded time: these tests check which ids come out, not uptime.
pub async fn take_ids(c: &mut Http, n: usize) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        let (st, body) = c.get("/v1/id").await?;
        match st {
            200 => out.push(id_of(&body)?),
            503 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => bail!("{st} {body}"),
        }
    }
    Ok(out)
}

/// The JSON string or number under `"id"`.
pub fn id_of(body: &str) -> anyhow::Result<u64> {
    let v: serde_json::Value = serde_json::from_str(body).with_context(|| body.to_string())?;
    match &v["id"] {
        serde_json::Value::String(s) => Ok(s.parse()?),
        serde_json::Value::Number(n) => n.as_u64().context("id"),
        _ => bail!("no id in {body}"),
    }
}

/// The `"error"."code"` of an error body.
pub fn error_code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The snowflake node field (bits 12..22) of an id.
pub fn snowflake_node(id: u64) -> u64 {
    (id >> 12) & 0x3ff
}

/// Batches of 500 ids from the node at `http` until `stop`, or until the
/// node goes away; a refusal (503 while it waits or re-acquires) is retried.
pub fn ids_until(
    http: &str,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<Vec<u64>> {
    let (addr, stop) = (http.to_owned(), stop.clone());
    tokio::spawn(async move {
        let mut c = Http::new(&addr);
        let mut ids = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match c.get("/v1/ids?count=500").await {
                Ok((200, body)) => {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    for id in v["ids"].as_array().unwrap() {
                        ids.push(id.as_str().unwrap().parse().unwrap());
                    }
                }
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
                Err(_) => break,
            }
        }
        ids
    })
}

/// Every id the loads of [`ids_until`] collected, checked for duplicates:
/// how many there were.
pub async fn no_duplicates(loads: Vec<tokio::task::JoinHandle<Vec<u64>>>) -> anyhow::Result<usize> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut duplicates = 0;
    for l in loads {
        for id in l.await? {
            total += 1;
            if !seen.insert(id) {
                duplicates += 1;
            }
        }
    }
    anyhow::ensure!(duplicates == 0, "{duplicates} duplicates in {total} ids");
    anyhow::ensure!(total > 0, "no ids collected");
    Ok(total)
}
