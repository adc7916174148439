//! etcd clusters on 127.0.0.1 started by `scripts/etcd.sh` (plain or with
//! TLS and client-certificate auth); keys read and written with the
//! `shardflake-etcd` client, users and auth switched with `etcdctl`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::{repo_root, script_at, start_script_at};

/// An etcd cluster on 127.0.0.1; stopped on drop.
#[derive(Debug)]
pub struct Etcd {
    /// The cluster's directory (pid files, logs, data).
    pub dir: PathBuf,
    /// Client endpoints.
    pub endpoints: Vec<String>,
    /// How this testkit's own clients (and etcdctl) reach a TLS cluster.
    tls: Option<shardflake_etcd::EtcdTls>,
    /// The root credentials once [`Etcd::enable_auth`] ran.
    auth: Option<shardflake_etcd::EtcdAuth>,
    /// The launcher (`scripts/etcd.sh` unless [`Etcd::start_at`] named one).
    script: PathBuf,
    /// [`Etcd::stop`] ran: nothing left for the drop to stop.
    stopped: bool,
}

/// TLS for a test cluster's client URLs (PEM files the test made).
#[derive(Debug, Clone)]
pub struct EtcdTlsFiles {
    /// The CA that signed the members' (and clients') certificates.
    pub ca_file: PathBuf,
    /// The members' certificate (for 127.0.0.1) and key.
    pub server: shardflake_etcd::ClientCert,
    /// When set, members demand a client certificate (`--client-cert-auth`)
    /// signed by the CA; this one is what the testkit's own clients and
    /// etcdctl present.
    pub client_cert: Option<shardflake_etcd::ClientCert>,
}

impl Etcd {
    /// Starts `members` members with `scripts/etcd.sh start`.
    pub fn start(members: usize) -> anyhow::Result<Etcd> {
        Self::start_with(members, None)
    }

    /// Starts `members` members whose auth tokens (once [`Etcd::enable_auth`]
    /// ran) are JWTs instead of simple tokens (`etcd.sh --jwt`). Unlike a
    /// simple token, a JWT carries the auth store's revision: any change to
    /// users or roles makes etcd refuse it.
    pub fn start_jwt(members: usize) -> anyhow::Result<Etcd> {
        Self::launch(&Self::default_script(), None, members, None, true)
    }

    /// Starts `members` members, with https client URLs when `tls` is set.
    pub fn start_with(members: usize, tls: Option<&EtcdTlsFiles>) -> anyhow::Result<Etcd> {
        Self::launch(&Self::default_script(), None, members, tls, false)
    }

    /// Starts `members` members with the launcher `script` (an
    /// `etcd.sh`), in `dir`, with JWT tokens when `jwt` is set (see
    /// [`Etcd::start_jwt`]).
    pub fn start_at(script: &Path, dir: &Path, members: usize, jwt: bool) -> anyhow::Result<Etcd> {
        Self::launch(script, Some(dir), members, None, jwt)
    }

    fn default_script() -> PathBuf {
        repo_root().join("scripts/etcd.sh")
    }

    fn launch(
        script: &Path,
        dir: Option<&Path>,
        members: usize,
        tls: Option<&EtcdTlsFiles>,
        jwt: bool,
    ) -> anyhow::Result<Etcd> {
        let mut args = vec![
            "start".to_string(),
            "--members".to_string(),
            members.to_string(),
        ];
        if let Some(dir) = dir {
            args.push("--dir".to_string());
            args.push(dir.display().to_string());
        }
        if jwt {
            args.push("--jwt".to_string());
        }
        if let Some(t) = tls {
            let files = shardflake_etcd::EtcdTls {
                ca_file: t.ca_file.clone(),
                client_cert: t.client_cert.clone(),
            };
            files.load().context("test etcd TLS files")?;
            for (flag, path) in [
                ("--ca", &t.ca_file),
                ("--cert", &t.server.cert_file),
                ("--key", &t.server.key_file),
            ] {
                args.push(flag.into());
                args.push(path.display().to_string());
            }
            if t.client_cert.is_some() {
                args.push("--client-cert-auth".into());
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let text = start_script_at(script, &args, &[])?;
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(k))
                .map(str::to_string)
        };
        match (get("DIR="), get("ENDPOINTS=")) {
            (Some(dir), Some(eps)) => Ok(Etcd {
                dir: dir.into(),
                endpoints: eps.split(',').map(str::to_string).collect(),
                tls: tls.map(|t| shardflake_etcd::EtcdTls {
                    ca_file: t.ca_file.clone(),
                    client_cert: t.client_cert.clone(),
                }),
                auth: None,
                script: script.to_path_buf(),
                stopped: false,
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
    /// A client for this cluster (with its TLS files and root credentials).
    /// Its calls wait up to 5 s for a member: a test's observer, it must
    /// not fail where a loaded machine (CI's parallel tests) slows etcd.
    pub fn client(&self) -> shardflake_etcd::Client {
        let timeout = Duration::from_secs(5);
        shardflake_etcd::Client::connect(
            &self.endpoints,
            timeout,
            self.tls.as_ref(),
            self.auth.as_ref(),
        )
        .unwrap_or_else(|e| {
            // The files were checked at start; removed since, every call
            // of a plain client fails and says so.
            eprintln!("test etcd client without TLS or credentials: {e}");
            shardflake_etcd::Client::new(&self.endpoints, timeout)
        })
    }
    /// Turns on etcd's user/password authentication with etcdctl: adds
    /// `root` with `root_password` (root may do everything), then `auth
    /// enable`. The testkit's clients log in as root from then on.
    pub fn enable_auth(&mut self, root_password: &str) -> anyhow::Result<()> {
        self.etcdctl(&[
            "user",
            "add",
            "root",
            "--interactive=false",
            &format!("--new-user-password={root_password}"),
        ])?;
        self.etcdctl(&["auth", "enable"])?;
        self.auth = Some(shardflake_etcd::EtcdAuth {
            user: "root".into(),
            password: root_password.into(),
        });
        Ok(())
    }
    /// Runs etcdctl (API v3) against this cluster with its TLS files.
    pub fn etcdctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = self.etcdctl_at(&self.urls());
        cmd.arg("--dial-timeout=5s");
        let out = cmd.args(args).output().context("running etcdctl")?;
        if !out.status.success() {
            bail!(
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
    /// The value of `key`, if it exists.
    pub async fn get(&self, key: &str) -> anyhow::Result<Option<String>> {
        let kvs = self
            .client()
            .txn(
                &[],
                &[shardflake_etcd::Op::Get(key.as_bytes().to_vec())],
                &[],
            )
            .await?
            .kvs;
        Ok(kvs
            .into_iter()
            .find(|kv| kv.key == key.as_bytes())
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }
    /// Puts `key` = `value` (no lease).
    pub async fn put(&self, key: &str, value: &str) -> anyhow::Result<()> {
        let put = shardflake_etcd::Op::Put(key.as_bytes().to_vec(), value.as_bytes().to_vec(), 0);
        self.client().txn(&[], &[put], &[]).await?;
        Ok(())
    }
    /// The keys under `prefix`, in order.
    pub async fn keys(&self, prefix: &str) -> anyhow::Result<Vec<String>> {
        let kvs = self.client().range_prefix(prefix.as_bytes()).await?;
        Ok(kvs
            .into_iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect())
    }
    /// How many calls of the gRPC `method` (e.g. `Authenticate`) the
    /// members have answered since they started, summed over members and
    /// status codes (etcd's `grpc_server_handled_total`, read from each
    /// member's plain-http metrics port).
    pub async fn handled(&self, method: &str) -> anyhow::Result<u64> {
        let label = format!("grpc_method=\"{method}\"");
        let mut total = 0;
        for i in 0..self.endpoints.len() {
            let args = std::fs::read_to_string(self.dir.join(format!("m{i}.args")))?;
            let url = args
                .lines()
                .skip_while(|l| *l != "--listen-metrics-urls")
                .nth(1)
                .context("member without --listen-metrics-urls")?;
            let addr = url.trim_start_matches("http://");
            let (status, text) = crate::Http::new(addr).get("/metrics").await?;
            if status != 200 {
                bail!("GET {url}/metrics: {status}");
            }
            for line in text.lines() {
                if line.starts_with("grpc_server_handled_total{") && line.contains(&label) {
                    let value = line.rsplit(' ').next().unwrap_or_default();
                    total += value.parse::<f64>().with_context(|| line.to_string())? as u64;
                }
            }
        }
        Ok(total)
    }
    /// What an operator does to roll etcd back to `snapshot` (made with
    /// `etcdctl snapshot save`): every member SIGKILLed, its data directory
    /// replaced by `etcdctl snapshot restore` with the member's own name,
    /// peer URL, cluster and token (the cluster id stays), started again;
    /// returns once it answers (bounded).
    pub fn restore(&self, snapshot: &std::path::Path) -> anyhow::Result<()> {
        let members = self.endpoints.len();
        for i in 0..members {
            self.kill(i)?;
        }
        for i in 0..members {
            let text = std::fs::read_to_string(self.dir.join(format!("m{i}.args")))?;
            let lines: Vec<&str> = text.lines().collect();
            let flag = |name: &str| {
                lines
                    .iter()
                    .position(|l| *l == name)
                    .and_then(|at| lines.get(at + 1))
                    .map(|v| v.to_string())
                    .with_context(|| format!("m{i}.args has no {name}"))
            };
            let data_dir = flag("--data-dir")?;
            let _ = std::fs::remove_dir_all(&data_dir);
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["snapshot", "restore"])
                .arg(snapshot)
                .args(["--name", &flag("--name")?, "--data-dir", &data_dir])
                .args(["--initial-cluster", &flag("--initial-cluster")?])
                .args(["--initial-cluster-token", &flag("--initial-cluster-token")?])
                .args([
                    "--initial-advertise-peer-urls",
                    &flag("--initial-advertise-peer-urls")?,
                ])
                .output()?;
            if !out.status.success() {
                bail!("snapshot restore: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
        for i in 0..members {
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Err(e) = self.script(&["restart", &i.to_string()]) {
                if Instant::now() > deadline {
                    return Err(e);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while let Err(e) = self.etcdctl(&["--command-timeout=2s", "get", "/"]) {
            if Instant::now() > deadline {
                return Err(e.context("etcd did not answer within 30 s of the restore"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }
    /// etcdctl (API v3) for `endpoints`, with this cluster's TLS files and
    /// credentials.
    fn etcdctl_at(&self, endpoints: &str) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"));
        if let Some(tls) = &self.tls {
            cmd.arg(format!("--cacert={}", tls.ca_file.display()));
            if let Some(c) = &tls.client_cert {
                cmd.arg(format!("--cert={}", c.cert_file.display()));
                cmd.arg(format!("--key={}", c.key_file.display()));
            }
        }
        if let Some(auth) = &self.auth {
            cmd.arg(format!("--user={}:{}", auth.user, auth.password));
        }
        cmd
    }
    /// Saves a snapshot of the cluster (from member 0) to `file`
    /// (`etcdctl snapshot save`), for [`Etcd::restore`].
    pub fn snapshot(&self, file: &Path) -> anyhow::Result<()> {
        let out = self
            .etcdctl_at(&self.endpoints[0])
            .args(["snapshot", "save"])
            .arg(file)
            .output()
            .context("running etcdctl")?;
        if !out.status.success() {
            bail!(
                "etcdctl snapshot save: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
    /// SIGKILLs member `i`.
    pub fn kill(&self, i: usize) -> anyhow::Result<()> {
        self.script(&["kill", &i.to_string()]).map(drop)
    }
    /// Starts member `i` again on its data directory.
    pub fn restart(&self, i: usize) -> anyhow::Result<()> {
        self.script(&["restart", &i.to_string()]).map(drop)
    }
    /// The members' client ports.
    pub fn ports(&self) -> anyhow::Result<Vec<u16>> {
        self.endpoints
            .iter()
            .map(|e| {
                e.rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .with_context(|| format!("no port in {e}"))
            })
            .collect()
    }
    /// Stops every member and removes the directory now (the drop does
    /// the same, silently).
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.stopped = true;
        self.script(&["stop"]).map(drop)
    }
    fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        let dir = self.dir.to_string_lossy();
        let mut all = vec![args[0], &dir];
        all.extend(&args[1..]);
        script_at(&self.script, &all, &[])
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = Command::new("bash")
                .arg(&self.script)
                .arg("stop")
                .arg(&self.dir)
                .status();
        }
    }
}
