//! etcd clusters on 127.0.0.1 started by `scripts/etcd.sh`; keys read and
//! written with `etcdctl`, so the tests check the service's etcd client
//! against a tool that shares no code with it.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{script, start_script};

/// An etcd cluster on 127.0.0.1; stopped on drop.
#[derive(Debug)]
pub struct Etcd {
    /// The cluster's directory (pid files, logs, data).
    pub dir: PathBuf,
    /// Client endpoints.
    pub endpoints: Vec<String>,
}

impl Etcd {
    /// Starts `members` members with `scripts/etcd.sh start`.
    pub fn start(members: usize) -> anyhow::Result<Etcd> {
        let text = start_script(
            "etcd.sh",
            &["start", "--members", &members.to_string()],
            &[],
        )?;
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::to_string)
        };
        match (get("DIR="), get("ENDPOINTS=")) {
            (Some(dir), Some(eps)) => Ok(Etcd {
                dir: dir.into(),
                endpoints: eps.split(',').map(str::to_string).collect(),
            }),
            _ => bail!("etcd did not start: {text}"),
        }
    }
    /// Endpoints joined by commas, for `--etcd`.
    pub fn urls(&self) -> String {
        self.endpoints.join(",")
    }
    /// The index of the current leader (asks for up to 10 s).
    pub fn leader(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.script(&["leader"]) {
                Ok(out) => return out.trim().parse().context("leader index"),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    /// Sends `sig` to member `i` (SIGSTOP/SIGCONT to make it unresponsive).
    pub fn signal(&self, i: usize, sig: i32) -> anyhow::Result<()> {
        let pid: i32 = std::fs::read_to_string(self.dir.join(format!("m{i}.pid")))?
            .trim()
            .parse()
            .context("member pid")?;
        // SAFETY: kill(2) on a member this cluster started.
        if unsafe { libc::kill(pid, sig) } != 0 {
            bail!("kill m{i}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }
    /// The value of `key`, if it exists.
    pub async fn get(&self, key: &str) -> anyhow::Result<Option<String>> {
        let out = self.etcdctl(&["get", key]).await?;
        // `etcdctl get` prints the key and the value, each followed by a
        // newline; nothing when the key is absent.
        if out.is_empty() {
            return Ok(None);
        }
        match out.strip_prefix(key).and_then(|r| r.strip_prefix('\n')) {
            Some(value) => Ok(Some(value.strip_suffix('\n').unwrap_or(value).to_string())),
            None => bail!("etcdctl get {key}: unexpected output {out:?}"),
        }
    }
    /// The keys under `prefix`, in order.
    pub async fn keys(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let out = self
            .etcdctl(&["get", "--prefix", "--keys-only", prefix])
            .await?;
        Ok(out
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }
    /// Puts `key` = `value` (no lease).
    pub async fn put(&self, key: &str, value: &str) -> anyhow::Result<()> {
        self.etcdctl(&["put", key, value]).await.map(drop)
    }
    /// SIGKILLs member `i`.
    pub fn kill(&self, i: usize) -> anyhow::Result<()> {
        self.script(&["kill", &i.to_string()]).map(drop)
    }
    fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        let dir = self.dir.to_string_lossy();
        let mut all = vec![args[0], &dir];
        all.extend(&args[1..]);
        script("etcd.sh", &all, &[])
    }
    async fn etcdctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.urls()))
            .args(["--dial-timeout=2s", "--command-timeout=5s"])
            .args(args)
            .output()
            .await
            .context("running etcdctl (run scripts/install-deps.sh)")?;
        if !out.status.success() {
            bail!("etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(crate::repo_root().join("scripts/etcd.sh"))
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}
