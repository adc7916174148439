//! The processes under test: a 3-member etcd (through `scripts/etcd.sh`),
//! `shardflake serve` nodes with fixed ports and state files, and the
//! network namespace that lets one node lose etcd while clients still
//! reach it.
//!
//! Every pid goes into `DIR/pids/` so `scripts/chaos.sh` can kill whatever
//! is left if this process itself dies.

use std::fs;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tracing::info;

// The launchers and helpers the tests use too, written once.
pub use shardflake_testkit::{Etcd, free_port, libfaketime};

/// Runs a command, failing with its output when it fails.
pub fn sh(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An etcd user and the file holding its password, for the nodes.
pub struct EtcdLogin {
    /// The user (root: may do everything).
    pub user: String,
    /// The password file (`--etcd-password-file`).
    pub password_file: PathBuf,
}

/// Starts the run's etcd: `members` members under `dir`, launched by
/// `script`; with `auth`, with JWT tokens (`etcd.sh --jwt`: they carry the
/// auth store's revision, so the auth-change fault voids them all, where
/// simple tokens would outlive it) and authentication on, and the nodes'
/// login as root.
pub fn start_etcd(
    script: &Path,
    dir: &Path,
    members: usize,
    auth: bool,
) -> anyhow::Result<(Etcd, Option<EtcdLogin>)> {
    let mut etcd = Etcd::start_at(script, dir, members, auth)?;
    if !auth {
        return Ok((etcd, None));
    }
    let password = format!("chaos-{}", std::process::id());
    etcd.enable_auth(&password)?;
    let password_file = dir.with_extension("password");
    std::fs::write(&password_file, &password)?;
    let login = EtcdLogin {
        user: "root".into(),
        password_file,
    };
    Ok((etcd, Some(login)))
}

/// How one node slot's processes are started.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// `node0`, ..., `spare`.
    pub name: String,
    /// The `shardflake` binary.
    pub bin: PathBuf,
    /// HTTP address.
    pub http: SocketAddr,
    /// gRPC address.
    pub grpc: SocketAddr,
    /// `serve` flags beyond the addresses and state file.
    pub args: Vec<String>,
    /// The state file (kept across restarts).
    pub state_file: PathBuf,
    /// The libfaketime timestamp file, for the faked node.
    pub faketime_file: Option<PathBuf>,
    /// The network namespace to run in.
    pub netns: Option<String>,
    /// Where logs and pid files go.
    pub dir: PathBuf,
}

/// One running `shardflake serve` process.
pub struct NodeProc {
    child: Child,
    /// Its number within the slot (0 first).
    pub incarnation: u32,
}

impl NodeSpec {
    /// Starts process `incarnation` of this slot.
    pub fn spawn(&self, incarnation: u32) -> anyhow::Result<NodeProc> {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        cmd.arg("serve")
            .arg("--http")
            .arg(self.http.to_string())
            .arg("--grpc")
            .arg(self.grpc.to_string())
            .arg("--state-file")
            .arg(&self.state_file)
            .args(&self.args)
            .env_remove("LD_PRELOAD");
        if let Some(stamp) = &self.faketime_file {
            cmd.env("LD_PRELOAD", libfaketime()?)
                .env("FAKETIME_TIMESTAMP_FILE", stamp)
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let log = fs::File::create(self.dir.join(format!("{}.{incarnation}.log", self.name)))?;
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", self.bin.display()))?;
        let pids = self.dir.join("pids");
        fs::create_dir_all(&pids)?;
        fs::write(
            pids.join(format!("{}.{incarnation}.pid", self.name)),
            child.id().to_string(),
        )?;
        info!(node = %self.name, incarnation, pid = child.id(), "started");
        Ok(NodeProc { child, incarnation })
    }
}

impl NodeProc {
    /// Sends `signal` (libc number).
    pub fn signal(&self, signal: i32) -> anyhow::Result<()> {
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: kill(2) with a pid we started and have not reaped.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The exit status if it has exited (reaps it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `limit` for it to exit; SIGKILLs it after that. Returns
    /// whether it exited by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

/// A network namespace holding one node, joined to the host by a veth pair:
/// clients reach the node at `node_addr` (host side `client_addr`), the
/// node reaches etcd at `etcd_addr` (a second host-side address, where the
/// run forwards to the members on 127.0.0.1). Cutting etcd off deletes the
/// namespace's route to `etcd_addr` only, so clients keep reaching the node.
pub struct Netns {
    /// The namespace's name.
    pub name: String,
    host_if: String,
    ns_if: String,
    /// The node's address inside the namespace.
    pub node_addr: Ipv4Addr,
    /// The host-side address clients use.
    pub client_addr: Ipv4Addr,
    /// The host-side address the node reaches etcd at.
    pub etcd_addr: Ipv4Addr,
}

impl Netns {
    /// Creates the namespace `sfchaos<tag>` with addresses 10.213.`tag`.1-3.
    pub fn create(tag: u8) -> anyhow::Result<Netns> {
        let name = format!("sfchaos{tag}");
        let n = Netns {
            host_if: format!("sfc{tag}h"),
            ns_if: format!("sfc{tag}n"),
            node_addr: Ipv4Addr::new(10, 213, tag, 2),
            client_addr: Ipv4Addr::new(10, 213, tag, 1),
            etcd_addr: Ipv4Addr::new(10, 213, tag, 3),
            name,
        };
        if let Err(e) = n.set_up() {
            n.remove();
            return Err(e);
        }
        Ok(n)
    }

    fn ns(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut all = vec!["netns", "exec", &self.name, "ip"];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    fn set_up(&self) -> anyhow::Result<()> {
        let (h, n) = (self.host_if.as_str(), self.ns_if.as_str());
        let (node, client, etcd) = (
            format!("{}/32", self.node_addr),
            format!("{}/32", self.client_addr),
            format!("{}/32", self.etcd_addr),
        );
        sh("ip", &["netns", "add", &self.name])?;
        sh("ip", &["link", "add", h, "type", "veth", "peer", "name", n])?;
        sh("ip", &["link", "set", n, "netns", &self.name])?;
        // Host side: two addresses, a route to the node that answers from the client one.
        sh("ip", &["addr", "add", &client, "dev", h])?;
        sh("ip", &["addr", "add", &etcd, "dev", h])?;
        sh("ip", &["link", "set", h, "up"])?;
        sh(
            "ip",
            &[
                "route",
                "add",
                &node,
                "dev",
                h,
                "src",
                &self.client_addr.to_string(),
            ],
        )?;
        // Namespace side: the node's address and one route per host address.
        self.ns(&["link", "set", "lo", "up"])?;
        self.ns(&["addr", "add", &node, "dev", n])?;
        self.ns(&["link", "set", n, "up"])?;
        self.ns(&["route", "add", &client, "dev", n])?;
        self.restore_etcd_route()?;
        Ok(())
    }

    /// Deletes the namespace's route to etcd.
    pub fn cut_etcd_route(&self) -> anyhow::Result<()> {
        self.ns(&[
            "route",
            "del",
            &format!("{}/32", self.etcd_addr),
            "dev",
            &self.ns_if,
        ])
        .map(drop)
    }

    /// Adds the namespace's route to etcd back.
    pub fn restore_etcd_route(&self) -> anyhow::Result<()> {
        self.ns(&[
            "route",
            "add",
            &format!("{}/32", self.etcd_addr),
            "dev",
            &self.ns_if,
        ])
        .map(drop)
    }

    /// Removes the veth pair and the namespace (best effort).
    pub fn remove(&self) {
        let _ = sh("ip", &["link", "del", &self.host_if]);
        let _ = sh("ip", &["netns", "del", &self.name]);
    }
}

/// Forwards TCP from `listen` to `to` for as long as the runtime runs: how
/// the node in the namespace reaches the etcd members on 127.0.0.1.
pub async fn forward(listen: SocketAddr, to: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("bind {listen}"))?;
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let _ = inbound.set_nodelay(true);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok(())
}

/// `addr:port` as a socket address.
pub fn at(addr: impl Into<IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(addr.into(), port)
}
