//! Throw-away PostgreSQL servers on 127.0.0.1 started by `scripts/pg.sh`
//! (trust auth, fsync off, synchronous_commit on, max_connections 200, a
//! free port; as root the script runs PostgreSQL as user postgres), which a
//! test can crash (SIGKILL) and restart on the same data and port; stopped
//! and removed when the guard drops.

use std::path::PathBuf;

use anyhow::Context;

use crate::{script, start_script};

/// A running PostgreSQL server, stopped and deleted on drop.
#[derive(Debug)]
pub struct PgServer {
    dir: PathBuf,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl PgServer {
    /// Starts one server with the script's settings.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// [`PgServer::start`] with extra server settings (`-c name=value`,
    /// which win over the script's).
    pub fn start_with(settings: &[(&str, &str)]) -> anyhow::Result<Self> {
        let opts: Vec<String> = settings
            .iter()
            .map(|(k, v)| format!("-c {k}={v}"))
            .collect();
        let out = start_script("pg.sh", &["start", "1"], &[("PG_OPTS", &opts.join(" "))])?;
        let dir = out
            .lines()
            .find_map(|l| l.strip_prefix("dir "))
            .with_context(|| format!("pg.sh printed no dir: {out}"))?;
        // From here on, drop removes the server even if parsing fails.
        let mut server = PgServer {
            dir: dir.into(),
            port: 0,
        };
        server.port = out
            .lines()
            .find_map(|l| l.strip_prefix("postgres://postgres@127.0.0.1:"))
            .and_then(|rest| rest.split('/').next())
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("pg.sh printed no URL: {out}"))?;
        Ok(server)
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Path of a PostgreSQL client program (`pgbench`, `psql`).
    pub fn program(&self, name: &str) -> anyhow::Result<PathBuf> {
        Ok(PathBuf::from(script("pg.sh", &["bindir"], &[])?.trim()).join(name))
    }

    /// Stops the server now (immediate mode), keeping the guard.
    pub fn stop(&self) {
        let _ = script("pg.sh", &["halt", &self.dir.to_string_lossy()], &[]);
    }

    /// SIGKILLs the server (a crash: the postmaster, then its children; WAL
    /// recovery at the next start) and waits until none of its processes is
    /// alive and its port is free. It loses no commit (the script's
    /// `synchronous_commit = on`) unless the server was started with
    /// `start_with(&[("synchronous_commit", "off")])`.
    pub fn kill(&self) -> anyhow::Result<()> {
        script("pg.sh", &["kill", &self.dir.to_string_lossy()], &[]).map(drop)
    }

    /// Starts it again on the same data, port and settings (after
    /// [`Self::kill`] or [`Self::stop`]) and waits until it accepts
    /// connections.
    pub fn restart(&self) -> anyhow::Result<()> {
        script("pg.sh", &["restart", &self.dir.to_string_lossy()], &[]).map(drop)
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = script("pg.sh", &["stop", &self.dir.to_string_lossy()], &[]);
    }
}
