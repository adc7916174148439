//! `shardflake-chaos tickets`: Flickr's ticket servers and Leaf-style
//! segments, judged by the same checker. Two MariaDB servers from
//! `scripts/mariadb.sh` (odd and even: `auto-increment-increment = 2`,
//! offsets 1 and 2), the schema made by `shardflake tickets init`, clients
//! (each its own `TicketClient`, as separate processes would be) asking for
//! single ids and batches while a seeded schedule does, to one server at a
//! time, what a crash or an operator does ([`Fault`]): SIGKILL and restart,
//! SIGSTOP and SIGCONT, a restore from the dump taken one fault earlier
//! (after a restart, and into the running server), the counters' rows of
//! one fault earlier loaded in place (refused by the tables' guard where
//! they would set a row back), and clients started on
//! an edited file (a server removed, one added, the offsets swapped), whose
//! ids (if any) the checker sees with the others'.
//!
//! What each mode promises, and so what is checked: no id twice, ever
//! (duplicates, exact); in segment mode one client's ids increase; in
//! per-id mode the ids one client got from one server increase (a
//! server's ids are the residue class of its offset, so the checker keeps
//! one log per client and server). Errors by code are counted: with one
//! server down the other carries the load, so callers should see none.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use shardflake_tickets::{Config, TicketClient};

use crate::check;
use crate::cluster::free_port;
use crate::db::{Server, sleep_until};
use crate::load::Answers;
use crate::record::{ConnLog, Protocol, ms_since};
use crate::verdict::{ClientLog, Outcome, ServerRun, in_dir};

/// The sequence the run draws from.
const SEQUENCE: &str = "chaos";

/// What a `tickets` run does.
#[derive(Debug, Clone)]
pub struct TicketsOptions {
    /// Length, seed, clients, binaries, spacing, output.
    pub run: ServerRun,
    /// Segment mode (Leaf) instead of per-id (Flickr).
    pub segment: bool,
}

/// What one fault does to one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The dump taken one fault earlier loaded into the running server,
    /// under the clients' open sessions.
    RestoreLive,
    /// SIGKILL, restart, and the dump taken one fault earlier loaded.
    RestoreStopped,
    /// The counters' rows of one fault earlier loaded into the running
    /// server in place (a data-only dump written as `REPLACE`): the tables'
    /// guard must refuse what would set a row back.
    RestoreInPlace,
    /// SIGSTOP for the pause, then SIGCONT: a hung peer.
    Stop,
    /// SIGKILL, restart after the pause.
    Kill,
    /// For the pause, a client on the file with the offsets swapped.
    Swapped,
    /// For the pause, a client on the file with this server left out (the
    /// increment falls to 1).
    Removed,
    /// For the pause, a client on the file with a third server added (the
    /// increment rises to 3).
    Added,
}

/// The kinds in the order a run cycles through them: a short run sees the
/// restores first.
const KINDS: [Fault; 8] = [
    Fault::RestoreLive,
    Fault::RestoreStopped,
    Fault::RestoreInPlace,
    Fault::Stop,
    Fault::Kill,
    Fault::Swapped,
    Fault::Removed,
    Fault::Added,
];

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fault::RestoreLive => "restore live from the last dump",
            Fault::RestoreStopped => "SIGKILL, restart, restore the last dump",
            Fault::RestoreInPlace => "the last counters' rows loaded in place",
            Fault::Stop => "SIGSTOP",
            Fault::Kill => "SIGKILL",
            Fault::Swapped => "a client on the file with the offsets swapped",
            Fault::Removed => "a client on the file without this server",
            Fault::Added => "a client on the file with a third server added",
        })
    }
}

/// One step of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// After the load began.
    pub at: Duration,
    /// What.
    pub fault: Fault,
    /// To which server (0 or 1).
    pub server: usize,
    /// How long it lasts (down, stopped, or the edited client's run).
    pub pause: Duration,
}

/// The seeded schedule: every kind in turn, on a random server.
fn schedule(o: &TicketsOptions) -> Vec<Step> {
    let mut rng = fastrand::Rng::with_seed(o.run.seed);
    let spacing = o.run.spacing.max(Duration::from_secs(2));
    let mut at = spacing / 2;
    let mut plan = Vec::new();
    // Faults stop a spacing before the end, so both servers are seen back.
    while at + spacing <= Duration::from_secs(o.run.seconds) {
        let pause = Duration::from_millis(rng.u64(200..=spacing.as_millis() as u64 / 2));
        plan.push(Step {
            at,
            fault: KINDS[plan.len() % KINDS.len()],
            server: rng.usize(0..2),
            pause,
        });
        at += spacing + Duration::from_millis(rng.u64(0..=spacing.as_millis() as u64 / 2));
    }
    plan
}

/// The port of a `mysql://root@127.0.0.1:PORT/app` URL.
fn port(url: &str) -> anyhow::Result<&str> {
    url.rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .context("no port in the server's URL")
}

/// `mariadb-dump` of the `app` database, consistent without locks.
fn dump(server: &Server) -> anyhow::Result<Vec<u8>> {
    mariadb_dump(server, &[], &[])
}

/// The counters' tables of the `app` database (the segment rows and the
/// per-id tables) as a data-only dump of `REPLACE`s: what loads in place.
fn dump_in_place(server: &Server) -> anyhow::Result<Vec<u8>> {
    let tables = sql(
        server,
        "SELECT GROUP_CONCAT(TABLE_NAME SEPARATOR ' ') FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'app' AND (TABLE_NAME = 'shardflake_ticket_segments' OR TABLE_NAME LIKE 'tickets\\_%')",
    )?;
    let tables: Vec<&str> = tables.split_whitespace().collect();
    mariadb_dump(
        server,
        &["--no-create-info", "--replace", "--skip-triggers"],
        &tables,
    )
}

/// `mariadb-dump --single-transaction` of `tables` (all when empty) of
/// database `app`, with `options`.
fn mariadb_dump(server: &Server, options: &[&str], tables: &[&str]) -> anyhow::Result<Vec<u8>> {
    let out = Command::new("mariadb-dump")
        .args([
            "--no-defaults",
            "--single-transaction",
            "-h",
            "127.0.0.1",
            "-u",
            "root",
        ])
        .args(options)
        .arg(format!("-P{}", port(&server.url)?))
        .arg("app")
        .args(tables)
        .output()
        .context("running mariadb-dump")?;
    if !out.status.success() {
        bail!(
            "mariadb-dump: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Loads `rows` (from [`dump_in_place`]) into the running server: what
/// happened, in words; an error only for a failure other than the guard's
/// refusal.
fn load_in_place(server: &Server, rows: &[u8], dir: &Path) -> anyhow::Result<&'static str> {
    let path: PathBuf = dir.join("in-place.sql");
    std::fs::write(&path, rows)?;
    // From standard input: `source` reports a failed statement but exits 0.
    let out = Command::new("mariadb")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", port(&server.url)?))
        .arg("app")
        .stdin(std::fs::File::open(&path)?)
        .output()
        .context("running mariadb")?;
    let said = String::from_utf8_lossy(&out.stderr);
    match (
        out.status.success(),
        said.contains("never set back in place"),
    ) {
        (true, _) => Ok("loaded (nothing set back: the checker judges)"),
        (false, true) => Ok("refused by the tables' guard"),
        (false, false) => bail!("loading the rows: {}", said.trim()),
    }
}

/// Runs `sql` on the server with the `mariadb` client.
fn sql(server: &Server, sql: &str) -> anyhow::Result<String> {
    let out = Command::new("mariadb")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-B"])
        .arg(format!("-P{}", port(&server.url)?))
        .args(["app", "-e", sql])
        .output()
        .context("running mariadb")?;
    if !out.status.success() {
        bail!("{sql}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Loads a dump into the running server.
fn restore(server: &Server, dump: &[u8], dir: &Path) -> anyhow::Result<()> {
    let path: PathBuf = dir.join("restore.sql");
    std::fs::write(&path, dump)?;
    sql(server, &format!("source {}", path.display()))?;
    Ok(())
}

/// The server's process id (read before it is stopped: a stopped server
/// answers no query).
fn pid(server: &Server) -> anyhow::Result<String> {
    let pid_file = sql(server, "SELECT @@pid_file")?;
    let pid = std::fs::read_to_string(&pid_file).with_context(|| format!("reading {pid_file}"))?;
    Ok(pid.trim().to_string())
}

/// Sends `signal` (`STOP`, `CONT`) to process `pid`.
fn signal(pid: &str, signal: &str) -> anyhow::Result<()> {
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), pid])
        .status()?
        .success();
    if !ok {
        bail!("kill -{signal} {pid}");
    }
    Ok(())
}

/// The configuration: the pair, one 64-bit sequence in the run's mode.
fn config_toml(servers: &[Server], segment: bool) -> String {
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    edited_toml(&urls, &[1, 2], segment)
}

/// The file with these servers (`t1`, `t2`, ... in order) at these offsets.
fn edited_toml(urls: &[&str], offsets: &[u64], segment: bool) -> String {
    let mut t = format!("increment = {}\n", urls.len());
    for (i, (url, offset)) in urls.iter().zip(offsets).enumerate() {
        t += &format!(
            "\n[[servers]]\nname = \"t{}\"\nkind = \"mariadb\"\nurl = \"{url}\"\noffset = {offset}\n",
            i + 1,
        );
    }
    let mode = if segment { "segment" } else { "per-id" };
    t += &format!("\n[[sequences]]\nname = \"{SEQUENCE}\"\nbits = 64\nmode = \"{mode}\"\n");
    t
}

struct Shared {
    start: Instant,
    stop: AtomicBool,
    answers: Mutex<Answers>,
}

/// One client: single ids and batches of 2..=500 in a seeded mix, logged
/// per server in per-id mode (the residue of the id) and as one log in
/// segment mode.
async fn client(
    config: Config,
    shared: Arc<Shared>,
    seed: u64,
    segment: bool,
    until: Option<Instant>,
) -> ClientLog {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = ClientLog::default();
    let client = match TicketClient::connect(config).await {
        Ok(c) => c,
        Err(e) => {
            *out.errors
                .entry(format!("connect:{}", e.code()))
                .or_default() += 1;
            return out;
        }
    };
    // Ticket numbers: every bit may differ within a run of consecutive ids.
    let mut logs: Vec<ConnLog> = (0..if segment { 1 } else { 2 })
        .map(|_| ConnLog::new(0, 0, Protocol::Tickets, u64::MAX))
        .collect();
    while !shared.stop.load(Ordering::Relaxed) && until.is_none_or(|t| Instant::now() < t) {
        let count = if rng.f64() < 0.5 {
            1
        } else {
            rng.usize(2..=500)
        };
        match client.next_n(SEQUENCE, count).await {
            Ok(ids) => {
                let at = ms_since(shared.start);
                if segment {
                    logs[0].record(&ids, at);
                } else {
                    for id in ids {
                        // Offsets 1 and 2 of increment 2: odd ids are t1's
                        // (a client on an edited file that got ids at all
                        // logs them the same way).
                        logs[usize::from(id % 2 == 0)].record(&[id], at);
                    }
                }
                shared
                    .answers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .answered(u64::from(at));
            }
            Err(e) => {
                tracing::warn!(error = %e, "a ticket call failed");
                out.error(e.code().to_string());
            }
        }
    }
    client.shutdown().await;
    out.logs = logs;
    out
}

/// One run; `Ok(true)` when every check passed.
pub fn run(o: &TicketsOptions) -> anyhow::Result<bool> {
    in_dir(o.run.out.as_deref(), "tickets", |dir| run_in(o, dir))
}

fn run_in(o: &TicketsOptions, dir: &Path) -> anyhow::Result<bool> {
    let plan = schedule(o);
    println!("seed {}; schedule:", o.run.seed);
    for step in &plan {
        println!(
            "  +{:.1} s t{}: {} ({:.1} s)",
            step.at.as_secs_f64(),
            step.server + 1,
            step.fault,
            step.pause.as_secs_f64()
        );
    }
    let servers = (1..=2)
        .map(|offset| {
            Server::start(
                &o.run.script,
                &format!("--auto-increment-increment=2 --auto-increment-offset={offset}"),
                None,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let toml = config_toml(&servers, o.segment);
    let path = dir.join("tickets.toml");
    std::fs::write(&path, &toml)?;
    let init = Command::new(&o.run.bin)
        .args(["tickets", "init", "--config"])
        .arg(&path)
        .output()
        .context("running shardflake tickets init")?;
    if !init.status.success() {
        bail!(
            "shardflake tickets init: {}",
            String::from_utf8_lossy(&init.stderr).trim()
        );
    }
    let config = Config::parse(&toml)?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let load_start_unix_ms = check::unix_ms_now();
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        answers: Mutex::new(Answers::default()),
    });
    let mut clients: Vec<_> = (0..o.run.clients)
        .map(|i| {
            rt.spawn(client(
                config.clone(),
                shared.clone(),
                o.run.seed.wrapping_add(i as u64 + 1),
                o.segment,
                None,
            ))
        })
        .collect();

    let mut incidents = Vec::new();
    // Each server's dump from one fault earlier (the first: as the load began).
    let mut dumps = servers
        .iter()
        .map(dump)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut rows = servers
        .iter()
        .map(dump_in_place)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let urls: Vec<&str> = servers.iter().map(|s| s.url.as_str()).collect();
    let unused = format!("mysql://root@127.0.0.1:{}/app", free_port()?);
    for (k, step) in plan.iter().enumerate() {
        sleep_until(shared.start + step.at);
        let s = &servers[step.server];
        let mut edited = |toml: String| -> anyhow::Result<()> {
            let config = Config::parse(&toml)?;
            clients.push(rt.spawn(client(
                config,
                shared.clone(),
                o.run.seed.wrapping_add(1000 + k as u64),
                o.segment,
                Some(Instant::now() + step.pause),
            )));
            std::thread::sleep(step.pause);
            Ok(())
        };
        let mut outcome = "done";
        let result = match step.fault {
            Fault::RestoreInPlace => {
                load_in_place(s, &rows[step.server], dir).map(|said| outcome = said)
            }
            Fault::Kill => s.kill().and_then(|()| {
                std::thread::sleep(step.pause);
                s.restart()
            }),
            Fault::Stop => pid(s).and_then(|pid| {
                signal(&pid, "STOP")?;
                std::thread::sleep(step.pause);
                signal(&pid, "CONT")
            }),
            Fault::RestoreStopped => s
                .kill()
                .and_then(|()| s.restart())
                .and_then(|()| restore(s, &dumps[step.server], dir)),
            Fault::RestoreLive => restore(s, &dumps[step.server], dir),
            Fault::Swapped => edited(edited_toml(&urls, &[2, 1], o.segment)),
            Fault::Removed => edited(edited_toml(&[urls[1 - step.server]], &[1], o.segment)),
            Fault::Added => edited(edited_toml(
                &[urls[0], urls[1], &unused],
                &[1, 2, 3],
                o.segment,
            )),
        };
        let when = ms_since(shared.start);
        match result {
            Ok(()) => println!(
                "+{:.1} s t{}: {} {outcome}",
                f64::from(when) / 1000.0,
                step.server + 1,
                step.fault
            ),
            Err(e) => incidents.push(format!(
                "{} on t{} at +{when} ms: {e:#}",
                step.fault,
                step.server + 1
            )),
        }
        for (i, server) in servers.iter().enumerate() {
            match dump(server).and_then(|d| Ok((d, dump_in_place(server)?))) {
                Ok((d, r)) => (dumps[i], rows[i]) = (d, r),
                Err(e) => incidents.push(format!("dump of t{} at +{when} ms: {e:#}", i + 1)),
            }
        }
    }
    let faults_over_ms = u64::from(ms_since(shared.start));
    sleep_until(shared.start + Duration::from_secs(o.run.seconds));
    shared.stop.store(true, Ordering::SeqCst);
    let end_ms = u64::from(ms_since(shared.start));
    let mut all = ClientLog::default();
    for c in clients {
        all.merge(rt.block_on(c)?);
    }
    drop(servers);
    Outcome {
        name: format!(
            "tickets ({}, 2 servers)",
            if o.segment { "segment" } else { "per-id" }
        ),
        processes: 2 + plan
            .iter()
            .filter(|s| matches!(s.fault, Fault::Kill | Fault::RestoreStopped))
            .count() as u32,
        clients: all,
        incidents,
        answers: &shared.answers,
        load_start_unix_ms,
        faults_over_ms,
        end_ms,
    }
    .judge(None, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64) -> TicketsOptions {
        TicketsOptions {
            run: ServerRun {
                seconds: 90,
                seed,
                clients: 8,
                bin: "shardflake".into(),
                script: "scripts/mariadb.sh".into(),
                spacing: Duration::from_secs(6),
                out: None,
            },
            segment: true,
        }
    }

    #[test]
    fn the_schedule_is_seeded_and_has_every_kind_within_the_run() {
        let a = schedule(&options(3));
        assert_eq!(a, schedule(&options(3)));
        assert!(a.len() >= KINDS.len(), "{a:?}");
        for kind in KINDS {
            assert!(a.iter().any(|s| s.fault == kind), "{kind:?} missing: {a:?}");
        }
        assert_eq!(a[0].fault, Fault::RestoreLive);
        for s in &a {
            assert!(s.server < 2);
            assert!(s.pause >= Duration::from_millis(200) && s.pause <= Duration::from_secs(3));
            assert!(s.at + Duration::from_secs(6) <= Duration::from_secs(90));
        }
    }
}
