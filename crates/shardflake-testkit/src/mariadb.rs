//! Throw-away MariaDB servers on 127.0.0.1 started by `scripts/mariadb.sh`
//! (root over TCP without a password, database `app` created), which a test
//! can crash (SIGKILL) and restart on the same data and port, or query
//! through the `mariadb` client; stopped and removed when the guard drops.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

use crate::{script, start_script};

/// A running MariaDB server, stopped and deleted on drop.
#[derive(Debug)]
pub struct MariaDbServer {
    dir: PathBuf,
    url: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl MariaDbServer {
    /// A server for tests that neither crash it nor need its event
    /// scheduler: InnoDB flushes its log once a second, events do not run.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(
            "--innodb-flush-log-at-trx-commit=0 --event-scheduler=OFF",
            None,
        )
    }

    /// A server with the script's settings (InnoDB log written at every
    /// commit, so a SIGKILL loses no committed transaction; event scheduler
    /// on) and extra server options `opts` (which win). With `faketime`,
    /// the server runs under libfaketime and reads its clock offset from
    /// that file ("-10s", "+1d", "+0"; created with "+0" if missing).
    pub fn start_with(opts: &str, faketime: Option<&Path>) -> anyhow::Result<Self> {
        let faketime = faketime.map(|f| f.to_string_lossy().into_owned());
        let mut env = vec![("MARIADB_OPTS", opts)];
        if let Some(f) = &faketime {
            env.push(("MARIADB_FAKETIME_FILE", f));
        }
        let out = start_script("mariadb.sh", &["start"], &env)?;
        let dir = out
            .lines()
            .find_map(|l| l.strip_prefix("dir "))
            .with_context(|| format!("mariadb.sh printed no dir: {out}"))?;
        // From here on, drop removes the server even if parsing fails.
        let mut server = MariaDbServer {
            dir: dir.into(),
            url: String::new(),
            port: 0,
        };
        server.url = out
            .lines()
            .next()
            .filter(|l| l.starts_with("mysql://"))
            .with_context(|| format!("mariadb.sh printed no URL: {out}"))?
            .to_string();
        server.port = server
            .url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("no port in {}", server.url))?;
        Ok(server)
    }

    /// `mysql://root@127.0.0.1:PORT/app` (database `app`, created at start).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// SIGKILLs the server (a crash: InnoDB recovers at the next start) and
    /// waits until it is dead and its port is free.
    pub fn kill(&self) -> anyhow::Result<()> {
        self.run("kill").map(drop)
    }

    /// Starts it again on the same data and port (after [`Self::kill`]).
    pub fn restart(&self) -> anyhow::Result<()> {
        self.run("restart").map(drop)
    }

    /// The server's process id.
    pub fn pid(&self) -> anyhow::Result<u32> {
        self.run("pid")?.trim().parse().context("mariadb.sh pid")
    }

    /// Runs `sql` (one or more statements, or a client command such as
    /// `source FILE`) in database `app` through the `mariadb` client as
    /// root over TCP; its output in batch mode without column names (tab
    /// between columns, a line per row), trimmed.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        let out = Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-B"])
            .arg(format!("-P{}", self.port))
            .args(["app", "-e", sql])
            .output()
            .context("running the mariadb client")?;
        if !out.status.success() {
            bail!("{sql}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Loads a dump (or any SQL file) into database `app` through the
    /// `mariadb` client's standard input, which fails on the first
    /// statement that fails (the client's `source` command, as `sql`
    /// would run it, exits 0 past a failed statement). The error carries
    /// the client's message.
    pub fn load(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let out = Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
            .arg(format!("-P{}", self.port))
            .arg("app")
            .stdin(file)
            .output()
            .context("running the mariadb client")?;
        if !out.status.success() {
            bail!(
                "loading {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn run(&self, what: &str) -> anyhow::Result<String> {
        script("mariadb.sh", &[what, &self.dir.to_string_lossy()], &[])
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        let _ = self.run("stop");
    }
}
