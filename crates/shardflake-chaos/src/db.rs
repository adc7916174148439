//! `shardflake-chaos db`: ids made inside the database, judged by the same
//! checker. A MariaDB server started by `scripts/mariadb.sh` gets the
//! one-statement ids (`shardflake mysql apply`: a sequence, a `BEFORE
//! INSERT` trigger and the clock event), and client connections insert rows
//! with `INSERT ... RETURNING id` (single rows and multi-row bursts) while a
//! seeded schedule (kinds drawn at random) SIGKILLs and restarts the server
//! and steps its clock back
//! (libfaketime, through the script's timestamp file), and restores a dump
//! of the database taken a moment earlier: the whole database with the
//! writers stopped, the sequence alone under the writers, or the whole
//! database while no clock event loop runs (its inserts are refused until
//! `shardflake mysql repair`, which the run then does), or the whole
//! database dumped after the loop was stopped and restored under the
//! writers (no id is made while no loop runs: nothing to repair).
//!
//! Besides the checker's verdicts (duplicates, order per connection, order
//! across restarts, lead), every id a client was answered after the last
//! whole-database restore must be a row of the table at the end: an
//! acknowledged insert survives the crash.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use mysql_async::prelude::Queryable as _;

use crate::check;
use crate::db_load::{Backend, Lane, Mix, Slots, Writers, writer};
use crate::verdict::{ClientLog, Outcome, ServerRun, in_dir};

/// The layout `shardflake mysql apply` installs by default.
const LAYOUT: &str = "mysql-procedure";
/// Longest a connect or a statement may take before the connection is given up.
const TIMEOUT: Duration = Duration::from_secs(3);
/// How far back a clock fault steps the server's clock.
const CLOCK_STEP: &str = "-3s";

/// What a `db` run does.
pub type DbOptions = ServerRun;

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, then start again on the same data and port.
    Kill,
    /// The server's clock 3 s back for a while, then right again.
    ClockBack,
    /// The database dumped, then restored with the writers stopped.
    RestoreStopped,
    /// The sequence dumped, then restored under the writers.
    RestoreLive,
    /// The database dumped, then restored with the writers stopped and no
    /// clock event loop running (scheduler off, loop killed); the scheduler
    /// on again, the writers resumed (refused), then `mysql repair`.
    RestoreNoLoop,
    /// The clock event's loop stopped, then the database dumped, the
    /// writers going on (refused: no id is made while no loop runs), the
    /// dump restored under them 0-400 ms later, the scheduler on again; no
    /// repair (issue 37, C: before, writers that ran ahead of the clock
    /// had their ids made again by the restore).
    RestoreAfterStop,
    /// The sequence dumped while the clock event's loop runs under the
    /// writers, then at once the loop stopped, the dump restored and the
    /// scheduler on again (a fresh loop within about a second of the
    /// dump); `mysql repair` only where `mysql check` asks for it (a
    /// high-water that saw the dump). Before a starting loop waited past
    /// every id made, ids drawn after the dump were made again.
    RestoreRestart,
}

impl crate::schedule::Kind for Fault {}

impl Fault {
    /// The kinds drawn by default: a kind named twice is drawn twice as
    /// often (kills).
    pub const DEFAULT: [Fault; 8] = [
        Fault::Kill,
        Fault::Kill,
        Fault::ClockBack,
        Fault::RestoreStopped,
        Fault::RestoreLive,
        Fault::RestoreNoLoop,
        Fault::RestoreAfterStop,
        Fault::RestoreRestart,
    ];

    /// The name `--kinds` takes.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::ClockBack => "clock-back",
            Fault::RestoreStopped => "restore-stopped",
            Fault::RestoreLive => "restore-live",
            Fault::RestoreNoLoop => "restore-no-loop",
            Fault::RestoreAfterStop => "restore-after-stop",
            Fault::RestoreRestart => "restore-restart",
        }
    }

    /// The kind `name` names.
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::DEFAULT.into_iter().find(|f| f.name() == name)
    }
}

/// The seeded schedule: (seconds after the load began, fault), `kinds`
/// drawn at random (`schedule::draw`; a kind listed twice, twice as often).
fn schedule(o: &DbOptions, kinds: &[Fault]) -> Vec<(Duration, Fault)> {
    let ranges = crate::schedule::Ranges {
        run: Duration::from_secs(o.seconds),
        spacing: o.spacing.max(Duration::from_secs(1)),
        targets: 1,
        backups: 1,
        pause: (Duration::ZERO, Duration::ZERO),
    };
    crate::schedule::draw(o.seed, kinds, &ranges)
        .into_iter()
        .map(|d| (d.at, d.kind))
        .collect()
}

/// A MariaDB server of `scripts/mariadb.sh` (its clock under a libfaketime
/// timestamp file when one is given); stopped and removed on drop.
pub struct Server {
    script: PathBuf,
    dir: String,
    /// `mysql://root@127.0.0.1:PORT/app`.
    pub url: String,
    clock: Option<PathBuf>,
}

impl Server {
    /// Starts a server with extra options (`MARIADB_OPTS`) and, when
    /// `clock` is given, its clock offset read from that file ("+0" now).
    pub fn start(script: &Path, options: &str, clock: Option<&Path>) -> anyhow::Result<Server> {
        let mut cmd = Command::new("bash");
        cmd.arg(script).arg("start").env("MARIADB_OPTS", options);
        if let Some(clock) = clock {
            std::fs::write(clock, "+0")?;
            cmd.env("MARIADB_FAKETIME_FILE", clock);
        }
        let out = cmd.output().context("running scripts/mariadb.sh start")?;
        if !out.status.success() {
            bail!(
                "mariadb.sh start: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let url = text.lines().find(|l| l.starts_with("mysql://"));
        let dir = text.lines().find_map(|l| l.strip_prefix("dir "));
        match (url, dir) {
            (Some(url), Some(dir)) => Ok(Server {
                script: script.to_path_buf(),
                dir: dir.to_string(),
                url: url.to_string(),
                clock: clock.map(Path::to_path_buf),
            }),
            _ => bail!("mariadb.sh start printed no URL and dir: {text}"),
        }
    }

    /// A copy of its data directory as it is now, taken under SIGSTOP (so
    /// crash-consistent, as a SIGKILL leaves it), into a new directory that
    /// [`Server::start_copy`] starts later: the same `@@server_uuid` and
    /// InnoDB table ids, as a physical replica or a restored datadir has.
    pub fn snapshot(&self) -> anyhow::Result<PathBuf> {
        let pid = std::fs::read_to_string(Path::new(&self.dir).join("server.pid"))?;
        let pid = pid.trim();
        let copy = PathBuf::from(format!("{}-copy", self.dir.trim_end_matches('/')));
        let _ = std::fs::remove_dir_all(&copy);
        std::fs::create_dir_all(copy.join("tmp"))?;
        let signal = |s: &str| Command::new("kill").args([s, pid]).status();
        if !signal("-STOP")?.success() {
            bail!("kill -STOP {pid}");
        }
        let copied = Command::new("cp")
            .arg("-a")
            .arg(Path::new(&self.dir).join("data"))
            .arg(copy.join("data"))
            .status();
        signal("-CONT")?;
        if !copied?.success() {
            bail!("copying {}/data", self.dir);
        }
        std::fs::copy(Path::new(&self.dir).join("opts"), copy.join("opts"))?;
        Ok(copy)
    }

    /// Starts a [`Server::snapshot`] on a free port of its own.
    pub fn start_copy(&self, copy: &Path) -> anyhow::Result<Server> {
        std::fs::write(copy.join("port"), crate::cluster::free_port()?.to_string())?;
        // No process yet: `restart` finds none alive and launches.
        std::fs::write(copy.join("server.pid"), "0")?;
        // Owned from here: dropped on a failed start, it is stopped and removed.
        let mut server = Server {
            script: self.script.clone(),
            dir: copy.to_string_lossy().into_owned(),
            url: String::new(),
            clock: None,
        };
        let out = Command::new("bash")
            .arg(&self.script)
            .arg("restart")
            .arg(copy)
            .output()
            .context("running scripts/mariadb.sh restart")?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().find(|l| l.starts_with("mysql://")) {
            Some(url) if out.status.success() => {
                server.url = url.to_string();
                Ok(server)
            }
            _ => bail!(
                "mariadb.sh restart of a copy: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }

    /// SIGKILLs the server and waits until it is dead.
    pub fn kill(&self) -> anyhow::Result<()> {
        self.script("kill")
    }

    /// Starts it again on the same data and port.
    pub fn restart(&self) -> anyhow::Result<()> {
        self.script("restart")
    }

    fn script(&self, command: &str) -> anyhow::Result<()> {
        let out = Command::new("bash")
            .arg(&self.script)
            .args([command, &self.dir])
            .output()
            .with_context(|| format!("running scripts/mariadb.sh {command}"))?;
        if !out.status.success() {
            bail!(
                "mariadb.sh {command}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Dumps the database (or one table or sequence of it) into `dir`.
    pub(crate) fn dump(&self, dir: &Path, only: Option<&str>) -> anyhow::Result<PathBuf> {
        let port = self.port()?;
        let mut cmd = Command::new("mariadb-dump");
        cmd.args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
            .arg(format!("-P{port}"))
            .args(["--triggers", "--routines", "--events", "app"]);
        if let Some(only) = only {
            cmd.arg(only);
        }
        let out = cmd.output().context("running mariadb-dump")?;
        if !out.status.success() {
            bail!(
                "mariadb-dump: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let path = dir.join("dump.sql");
        std::fs::write(&path, &out.stdout)?;
        Ok(path)
    }

    /// Runs a dump into the database, as `mariadb app < dump` does.
    pub(crate) fn restore(&self, dump: &Path) -> anyhow::Result<()> {
        self.load(&std::fs::read(dump)?).context("restoring")
    }

    /// Runs `sql` (a dump) into database `app` through the client's
    /// standard input: a failed statement fails the load (the client's
    /// `source` reports it and exits 0).
    pub fn load(&self, sql: &[u8]) -> anyhow::Result<()> {
        use std::io::Write as _;
        let port = self.port()?;
        let mut child = Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
            .arg(format!("-P{port}"))
            .arg("app")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("running mariadb")?;
        let written = child
            .stdin
            .take()
            .context("the client's standard input")?
            .write_all(sql);
        let out = child.wait_with_output().context("running mariadb")?;
        if !out.status.success() {
            bail!(
                "loading a dump: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        written.context("writing the dump to the client")?;
        Ok(())
    }

    /// Runs SQL in database `app` with the `mariadb` client.
    pub fn sql(&self, sql: &str) -> anyhow::Result<String> {
        let port = self.port()?;
        let out = Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root", "-N", "-B"])
            .arg(format!("-P{port}"))
            .args(["app", "-e", sql])
            .output()
            .context("running mariadb")?;
        if !out.status.success() {
            bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Turns the event scheduler off and ends the clock event's loop (the
    /// connection holding its lock), waiting up to 5 s until none holds it.
    fn stop_clock_loop(&self) -> anyhow::Result<()> {
        const HOLDER: &str =
            "SELECT IS_USED_LOCK(CONCAT('shardflake ', MD5(CONCAT(DATABASE(), '.posts_id_seq'))))";
        self.sql("SET GLOBAL event_scheduler = OFF")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let holder = self.sql(HOLDER)?;
            let holder = holder.trim();
            if holder == "NULL" || holder.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the clock loop (connection {holder}) did not end");
            }
            let _ = self.sql(&format!("KILL CONNECTION {holder}"));
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The port of its URL.
    pub fn port(&self) -> anyhow::Result<&str> {
        self.url
            .rsplit_once(':')
            .and_then(|(_, rest)| rest.split('/').next())
            .context("no port in the server's URL")
    }

    fn set_clock(&self, offset: &str) -> anyhow::Result<()> {
        let clock = self
            .clock
            .as_ref()
            .context("this server's clock is not faked")?;
        Ok(std::fs::write(clock, offset)?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.script("stop");
    }
}

/// Every id in the table at the end.
async fn ids_in_table(url: &str) -> anyhow::Result<HashSet<u64>> {
    let mut c = mysql_async::Conn::from_url(url).await?;
    let ids: Vec<u64> = c.query("SELECT id FROM posts").await?;
    Ok(ids.into_iter().collect())
}

/// One run; `Ok(true)` when every check passed.
pub fn run(o: &DbOptions, kinds: &[Fault]) -> anyhow::Result<bool> {
    in_dir(o.out.as_deref(), "db", |dir| run_in(o, kinds, dir))
}

fn run_in(o: &DbOptions, kinds: &[Fault], dir: &Path) -> anyhow::Result<bool> {
    let layout = shardflake::preset::resolve(LAYOUT).context("the mysql-procedure layout")?;
    let plan = schedule(o, kinds);
    println!("seed {}; schedule:", o.seed);
    for (at, fault) in &plan {
        println!("  +{:.1} s {fault:?}", at.as_secs_f64());
    }
    let server = Server::start(&o.script, "", Some(&dir.join("clock")))?;
    let apply = Command::new(&o.bin)
        .args(["mysql", "apply", "--url", &server.url])
        .output()
        .context("running shardflake mysql apply")?;
    if !apply.status.success() {
        bail!(
            "shardflake mysql apply: {}",
            String::from_utf8_lossy(&apply.stderr).trim()
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let seq = layout.sequence();
    let sequence_mask = seq.max() << seq.shift();
    let writers = Writers::new(1, false);
    let load_start_unix_ms = check::unix_ms_now();
    let clients: Vec<_> = (0..o.clients)
        .map(|i| {
            let url = server.url.clone();
            let lane = Lane {
                lane: 0,
                backend: Backend::MariaDb,
                table: "posts".into(),
                url: Box::new(move || Ok(url.clone())),
                slots: Slots::Incarnation(0),
                sequence_mask,
                mix: Mix {
                    max_rows: 200,
                    pause: Duration::ZERO,
                    timeout: TIMEOUT,
                },
            };
            rt.spawn(writer(
                writers.clone(),
                lane,
                o.seed.wrapping_add(i as u64 + 1),
            ))
        })
        .collect();

    let mut incidents = Vec::new();
    let mut kills = 0u32;
    // Rows answered before a whole-database restore are gone with it.
    let mut restored_ms = 0u32;
    for (at, fault) in &plan {
        sleep_until(writers.start + *at);
        let result = match fault {
            Fault::Kill => (|| {
                server.kill()?;
                // The old process is dead: connections from now on reach the next.
                writers.next_generation();
                kills += 1;
                server.restart()
            })(),
            Fault::ClockBack => (|| {
                server.set_clock(CLOCK_STEP)?;
                std::thread::sleep(o.spacing / 3);
                server.set_clock("+0")
            })(),
            Fault::RestoreStopped | Fault::RestoreLive => (|| {
                let whole = *fault == Fault::RestoreStopped;
                let dump = server.dump(dir, if whole { None } else { Some("posts_id_seq") })?;
                // An earlier dump: older than the trigger's 1 s tolerance.
                std::thread::sleep((o.spacing / 4).max(Duration::from_millis(1300)));
                if whole {
                    writers.pause(0, 2 * TIMEOUT);
                }
                let restored = server.restore(&dump);
                if whole {
                    restored_ms = writers.now_ms();
                }
                writers.resume(0);
                restored
            })(),
            Fault::RestoreNoLoop => (|| {
                let dump = server.dump(dir, None)?;
                std::thread::sleep((o.spacing / 4).max(Duration::from_millis(1300)));
                writers.pause(0, 2 * TIMEOUT);
                let restored = server
                    .stop_clock_loop()
                    .and_then(|()| server.restore(&dump))
                    .and_then(|()| server.sql("SET GLOBAL event_scheduler = ON").map(drop));
                restored_ms = writers.now_ms();
                writers.resume(0);
                restored?;
                // The writers are refused until the operator repairs.
                std::thread::sleep(o.spacing / 4);
                let repair = Command::new(&o.bin)
                    .args(["mysql", "repair", "--url", &server.url])
                    .output()
                    .context("running shardflake mysql repair")?;
                if !repair.status.success() {
                    bail!(
                        "shardflake mysql repair: {}",
                        String::from_utf8_lossy(&repair.stderr).trim()
                    );
                }
                Ok(())
            })(),
            Fault::RestoreAfterStop => (|| {
                // With no loop, no id is handed out: a dump taken now must
                // hold every one, however soon it is restored.
                let after = Duration::from_millis(
                    fastrand::Rng::with_seed(o.seed ^ at.as_millis() as u64).u64(0..400),
                );
                let restored = server
                    .stop_clock_loop()
                    .and_then(|()| server.dump(dir, None))
                    .and_then(|dump| {
                        std::thread::sleep(after);
                        server.restore(&dump)
                    });
                restored_ms = writers.now_ms();
                let on = server.sql("SET GLOBAL event_scheduler = ON");
                restored?;
                on.map(drop)
            })(),
            Fault::RestoreRestart => (|| {
                let dump = server.dump(dir, Some("posts_id_seq"))?;
                let restored = server
                    .stop_clock_loop()
                    .and_then(|()| server.restore(&dump));
                let on = server.sql("SET GLOBAL event_scheduler = ON");
                restored?;
                on?;
                // What the operator does next: check, and repair where
                // check asks for it.
                std::thread::sleep(Duration::from_secs(3));
                let check = Command::new(&o.bin)
                    .args(["mysql", "check", "--url", &server.url])
                    .output()
                    .context("running shardflake mysql check")?;
                if String::from_utf8_lossy(&check.stdout).contains("mysql repair") {
                    let repair = Command::new(&o.bin)
                        .args(["mysql", "repair", "--url", &server.url])
                        .output()
                        .context("running shardflake mysql repair")?;
                    if !repair.status.success() {
                        bail!(
                            "shardflake mysql repair: {}",
                            String::from_utf8_lossy(&repair.stderr).trim()
                        );
                    }
                    println!("  restore-restart: check asked for repair; repaired");
                }
                Ok(())
            })(),
        };
        let when = writers.now_ms();
        match result {
            Ok(()) => println!("+{:.1} s {fault:?} done", f64::from(when) / 1000.0),
            Err(e) => incidents.push(format!("{fault:?} at +{when} ms: {e:#}")),
        }
    }
    let faults_over_ms = u64::from(writers.now_ms());
    sleep_until(writers.start + Duration::from_secs(o.seconds));
    writers.stop();
    let end_ms = u64::from(writers.now_ms());
    let mut all = ClientLog::default();
    for c in clients {
        all.merge(rt.block_on(c)?);
    }

    // Every id answered is a row: an acknowledged insert survives a crash.
    let in_table = rt.block_on(ids_in_table(&server.url))?;
    let mut lost = 0u64;
    for log in &all.logs {
        for r in log.runs.iter().filter(|r| r.received_ms > restored_ms) {
            lost += (r.start..=r.last())
                .filter(|id| !in_table.contains(id))
                .count() as u64;
        }
    }
    if lost > 0 {
        incidents.push(format!(
            "{lost} ids answered to a client are not in the table"
        ));
    }
    drop(server);
    println!(
        "\n{} rows in the table, every answered id among them: {}\n",
        in_table.len(),
        lost == 0
    );
    Outcome {
        name: "mariadb".into(),
        processes: kills + 1,
        clients: all,
        incidents,
        answers: &writers.answers,
        load_start_unix_ms,
        faults_over_ms,
        end_ms,
    }
    .judge(Some(&layout), dir)
}

pub fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seconds: u64, seed: u64) -> DbOptions {
        DbOptions {
            seconds,
            seed,
            clients: 8,
            bin: "shardflake".into(),
            script: "scripts/mariadb.sh".into(),
            spacing: Duration::from_secs(6),
            out: None,
        }
    }

    #[test]
    fn the_schedule_is_seeded_spaced_and_ends_a_spacing_early() {
        let a = schedule(&options(60, 7), &Fault::DEFAULT);
        assert_eq!(a, schedule(&options(60, 7), &Fault::DEFAULT));
        assert_ne!(a, schedule(&options(60, 8), &Fault::DEFAULT));
        for k in Fault::DEFAULT {
            assert_eq!(Fault::parse(k.name()), Some(k));
        }
        let only = schedule(&options(60, 7), &[Fault::RestoreNoLoop]);
        assert!(only.iter().all(|(_, f)| *f == Fault::RestoreNoLoop));
        assert!(a.len() >= 4, "{a:?}");
        assert!(
            a.windows(2)
                .all(|w| w[1].0 >= w[0].0 + Duration::from_secs(6))
        );
        assert!(
            a.iter()
                .all(|(at, _)| *at + Duration::from_secs(6) <= Duration::from_secs(60))
        );
        assert!(a.iter().any(|(_, f)| *f == Fault::Kill));
    }
}
