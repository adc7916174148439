//! Test helpers for the shardflake workspace, used only as a
//! dev-dependency: every launcher and helper the integration tests,
//! examples and benchmarks share, written once.
//!
//! - [`etcd`]: etcd clusters (`scripts/etcd.sh`), with member kills and
//!   `etcdctl` reads and writes.
//! - [`pg`]: PostgreSQL servers (`scripts/pg.sh`), with crash and restart.
//! - [`mariadb`]: MariaDB servers (`scripts/mariadb.sh`), with crash,
//!   restart, a libfaketime clock and SQL through the `mariadb` client.
//! - [`serve`]: `shardflake serve` processes, an HTTP/1 client, a gRPC
//!   client and small parsers of the API's answers.
//!
//! The servers are started by the project's scripts, so tests, benchmarks
//! and the README walk-through start them the same way. Each runs on
//! 127.0.0.1 under its own temp dir and is stopped when its guard drops,
//! also when a test fails. Starting fails loudly (an error, never a skip).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};

pub mod etcd;
pub mod mariadb;
pub mod pg;
pub mod serve;

pub use etcd::{Etcd, EtcdTlsFiles};
pub use mariadb::MariaDbServer;
pub use pg::PgServer;
pub use serve::{
    Http, Queued, Serve, ServeOpts, error_code, grpc_client, id_of, ids_until, metric,
    no_duplicates, snowflake_node, take_ids,
};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `bash scripts/<script> ARGS` with extra environment; its stdout,
/// or an error carrying its stderr.
pub(crate) fn script(script: &str, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    script_at(&repo_root().join("scripts").join(script), args, env)
}

/// [`script`] for a script at `path` (the chaos tool takes its launcher's
/// path as an option).
pub(crate) fn script_at(
    path: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<String> {
    let script = path.display();
    let out = Command::new("bash")
        .arg(path)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("running {script}"))?;
    if !out.status.success() {
        bail!(
            "{script} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`script`] for a `start` command: started again (up to 3 times in all)
/// when the server lost the port it picked to another process between the
/// script's probe and its bind, a race no probe can close.
pub(crate) fn start_script(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<String> {
    start_script_at(&repo_root().join("scripts").join(name), args, env)
}

/// [`start_script`] for a script at `path`.
pub(crate) fn start_script_at(
    path: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<String> {
    let mut attempt = 1;
    loop {
        match script_at(path, args, env) {
            Err(e) if attempt < 3 && format!("{e:#}").to_lowercase().contains("already in use") => {
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// A fresh directory under the system temp dir (removed by the OS, not us:
/// logs stay for a failed test's post-mortem).
pub fn tempdir() -> anyhow::Result<PathBuf> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let d = std::env::temp_dir().join(format!(
        "shardflake-test-{}-{}-{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
    ));
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    Ok(d)
}

/// A port nothing listens on now: bound once by us, released, then probed.
pub fn free_port() -> anyhow::Result<u16> {
    for _ in 0..50 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("no free port")?
            .port();
        if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(100))
            .is_err()
        {
            return Ok(port);
        }
    }
    bail!("no free port after 50 tries")
}

/// The installed libfaketime (`LD_PRELOAD` it to shift a program's wall
/// clock), found under the usual library directories, multiarch included.
pub fn libfaketime() -> anyhow::Result<PathBuf> {
    let mut candidates = Vec::new();
    for lib in ["/usr/lib", "/usr/local/lib", "/lib"] {
        candidates.push(PathBuf::from(lib).join("faketime/libfaketime.so.1"));
        // Multiarch: /usr/lib/x86_64-linux-gnu/faketime/..., /usr/lib/aarch64-linux-gnu/...
        if let Ok(entries) = std::fs::read_dir(lib) {
            candidates.extend(
                entries
                    .filter_map(Result::ok)
                    .map(|e| e.path().join("faketime/libfaketime.so.1")),
            );
        }
    }
    candidates.into_iter().find(|p| p.exists()).context(
        "libfaketime.so.1 not found under /usr/lib, /usr/local/lib or /lib (or their \
         multiarch directories): run scripts/install-deps.sh (package libfaketime)",
    )
}
