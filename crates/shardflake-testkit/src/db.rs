//! Throw-away PostgreSQL and MariaDB servers on 127.0.0.1 for tests,
//! examples and benchmarks: each in its own temp dir, on a free port probed
//! before use, stopped and removed when the guard drops (also on panic).
//! Starting fails loudly (an error, never a skip) when a server cannot start.
//!
//! PostgreSQL refuses to run as root, so as root `initdb` and `pg_ctl` run
//! through `runuser -u postgres`. MariaDB runs as root with `--user=root`;
//! `--no-defaults` comes first so `/etc/mysql` is ignored.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A failure to start a server.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

fn is_root() -> bool {
    // SAFETY-free: read our uid from /proc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// A port nothing listens on now: bound once by us, released, then probed.
pub fn free_port() -> Result<u16, StartError> {
    for _ in 0..50 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| StartError(format!("no free port: {e}")))?
            .port();
        if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(100))
            .is_err()
        {
            return Ok(port);
        }
    }
    Err(StartError("no free port after 50 tries".into()))
}

fn temp_dir(prefix: &str) -> Result<PathBuf, StartError> {
    let base = std::env::temp_dir();
    for i in 0..1000u32 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = base.join(format!("{prefix}-{}-{nanos}-{i}", std::process::id()));
        if std::fs::create_dir(&p).is_ok() {
            return Ok(p);
        }
    }
    Err(StartError("cannot create a temp dir".into()))
}

fn run(cmd: &mut Command, what: &str) -> Result<(), StartError> {
    let out = cmd
        .output()
        .map_err(|e| StartError(format!("{what}: cannot run {:?}: {e}", cmd.get_program())))?;
    if !out.status.success() {
        return Err(StartError(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(())
}

/// The newest installed PostgreSQL's bin directory.
pub fn pg_bindir() -> Result<PathBuf, StartError> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| {
            StartError("PostgreSQL is not installed (run scripts/install-deps.sh)".into())
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, p)| p.join("pg_ctl").exists())
        .collect();
    dirs.sort();
    dirs.pop()
        .map(|(_, p)| p)
        .ok_or_else(|| StartError("no PostgreSQL with pg_ctl under /usr/lib/postgresql".into()))
}

/// A running PostgreSQL server, stopped and deleted on drop.
#[derive(Debug)]
pub struct PgServer {
    dir: PathBuf,
    data: PathBuf,
    bin: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PgServer {
    /// initdb + start (fsync off, max_connections 200, trust auth).
    pub fn start() -> Result<Self, StartError> {
        Self::start_with(&[])
    }

    /// [`PgServer::start`] with extra server settings (`-c name=value`).
    pub fn start_with(settings: &[(&str, &str)]) -> Result<Self, StartError> {
        let bin = pg_bindir()?;
        let dir = temp_dir("shardflake-pg")?;
        let root = is_root();
        let data = dir.join("data");
        let mut server = PgServer {
            dir: dir.clone(),
            data: data.clone(),
            bin: bin.clone(),
            port: 0,
        };
        set_mode(&dir, 0o755)?;
        if root {
            run(
                Command::new("chown").arg("postgres").arg(&dir),
                "chown postgres",
            )?;
        }
        run(
            as_postgres(root, &bin.join("initdb"))
                .arg("-D")
                .arg(&data)
                .args(["--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync"]),
            "initdb",
        )?;
        let port = free_port()?;
        server.port = port;
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            data.display()
        ) + &settings
            .iter()
            .map(|(k, v)| format!(" -c {k}={v}"))
            .collect::<String>();
        run(
            as_postgres(root, &bin.join("pg_ctl"))
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("server.log"))
                .args(["-w", "-t", "60", "-o", &opts, "start"]),
            "pg_ctl start",
        )
        .map_err(|e| {
            let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
            StartError(format!("{e}\n{log}"))
        })?;
        Ok(server)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Path of a PostgreSQL client program (`pgbench`, `psql`).
    pub fn program(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// Stops the server now (immediate mode), keeping the guard.
    pub fn stop(&self) {
        let _ = as_postgres(is_root(), &self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port != 0 {
            self.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn as_postgres(root: bool, program: &Path) -> Command {
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn set_mode(p: &Path, mode: u32) -> Result<(), StartError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(|e| StartError(format!("chmod {}: {e}", p.display())))
}

/// A running MariaDB server, killed and deleted on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    dir: PathBuf,
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl MariaDbServer {
    /// mariadb-install-db + mariadbd; waits until it accepts TCP connections
    /// and creates database `app`.
    pub fn start() -> Result<Self, StartError> {
        let dir = temp_dir("shardflake-mariadb")?;
        let mut server = MariaDbServer {
            dir: dir.clone(),
            child: None,
            port: 0,
        };
        let data = dir.join("data");
        let root = is_root();
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if root {
            install.arg("--user=root");
        }
        run(
            &mut install,
            "mariadb-install-db (run scripts/install-deps.sh if missing)",
        )?;
        let port = free_port()?;
        server.port = port;
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
            .args([
                "--skip-log-bin",
                "--innodb-flush-log-at-trx-commit=0",
                "--innodb-buffer-pool-size=256M",
                "--max-connections=500",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(dir.join("server.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        if root {
            cmd.arg("--user=root");
        }
        let child = cmd
            .spawn()
            .map_err(|e| StartError(format!("cannot start mariadbd: {e}")))?;
        server.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(c) = server.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                return Err(StartError(format!("mariadbd exited ({status}):\n{log}")));
            }
            if TcpStream::connect_timeout(
                &([127, 0, 0, 1], port).into(),
                Duration::from_millis(200),
            )
            .is_ok()
            {
                // Listening: create the `app` database the URL names.
                run(
                    Command::new("mariadb")
                        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
                        .arg(format!("-P{port}"))
                        .args(["-e", "CREATE DATABASE IF NOT EXISTS app"]),
                    "mariadb client",
                )?;
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(StartError("mariadbd did not listen within 60 s".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `mysql://root@127.0.0.1:PORT/app` (database `app`, created at start).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/app", self.port)
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
