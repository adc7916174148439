//! `shardflake-chaos db-pg`: PostgreSQL's in-database ids under what
//! operators do, judged by the same checker. Two servers of
//! `scripts/pg.sh` hold 4 logical shards (`shardflake pg apply`); clients
//! insert rows into each shard (`INSERT ... RETURNING id`, single rows and
//! bursts of up to 20, 2 ms apart), routed by `shardflake pg route`, while a seeded schedule runs,
//! through the `shardflake` CLI as an operator would:
//!
//! - `move-shard` stopped after each of its steps (the hidden failpoint) or
//!   SIGKILLed at a random moment, then run again to finish;
//! - `apply` from an older copy of the topology file (one of the last
//!   [`FILES_KEPT`] versions the run's moves wrote, the start's included);
//! - `apply` and `check` with the file edited: a shard's owner, the schema
//!   prefix, the shard count, the epoch (each must be refused);
//! - `apply` (with or without `--new-server` for it) and `check` with a
//!   server's url edited to reach a new, empty database (both refused);
//! - a shard restored from a dump taken a moment earlier with `pg_restore
//!   --clean`, writers stopped or still writing, then `pg repair`;
//! - `pg repair` while a `move-shard` (with or without `--keep-source`)
//!   runs, then the move run again to finish;
//! - two `move-shard` runs of two shards at once from one file: both
//!   moves must be in the file afterwards;
//! - a crash: a backend of the shard's server SIGKILLed (PostgreSQL ends
//!   every session and recovers), or first `synchronous_commit = off` set
//!   on its database, which `pg check` must report, and put back as it says;
//!   after the crash, `pg repair` (the server refuses ids until then).
//!
//! The faults are drawn from the seed at random (`schedule::draw`): which
//! kind, which shard, which step or way, how many ms into a move.
//!
//! Every id answered goes to the checker (duplicates, order per
//! connection); a command that accepts what it must refuse, or a final
//! `pg check` that fails, is an incident.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::check;
use crate::db::{DbOptions, sleep_until};
use crate::db_load::{Backend, Lane, Mix, Slots, Writers, writer};
use crate::schedule::{self, Drawn, Kind, Ranges};
use crate::verdict::{ClientLog, Outcome, in_dir};

/// Logical shards of the run.
const SHARDS: u64 = 4;
/// Longest a connect or a statement may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before each statement of a client.
const STATEMENT_PAUSE: Duration = Duration::from_millis(2);
/// Versions of the topology file kept for an `apply` from an old one.
const FILES_KEPT: usize = 4;
/// The steps of a move (`shardflake pg move-shard --stop-after`).
const STEPS: [&str; 5] = ["recorded", "copied", "fenced", "live", "switched"];

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// `move-shard` stopped after step `STEPS[variant]`, then run again.
    MoveStopped,
    /// `move-shard` SIGKILLed after the pause, then run again.
    MoveKilled,
    /// `apply` with an older version of the file (the step's `backup`: 0
    /// the newest kept).
    StaleApply,
    /// The file edited: a shard put on the other server.
    EditOwner,
    /// The file edited: another schema prefix.
    EditPrefix,
    /// The file edited: twice the shards.
    EditCount,
    /// The file edited: the epoch 10 s later.
    EditEpoch,
    /// The url of the shard's server edited to reach a new, empty database
    /// on the same PostgreSQL; variant 1: that server also named new (`pg
    /// apply --new-server`). Both must be refused.
    EditUrl,
    /// A shard restored from a dump with its writers stopped, then repaired.
    RestoreStopped,
    /// A shard restored from a dump under its writers, then repaired.
    RestoreLive,
    /// `pg repair` the pause after a `move-shard` began (variant 1: with
    /// `--keep-source`), then the move run again to finish.
    RepairDuringMove,
    /// Two `move-shard` runs at once: the shard and the one `1 + variant`
    /// after it.
    TwoMoves,
    /// A backend of the shard's server SIGKILLed: the server ends every
    /// session and recovers. Variant 1: `synchronous_commit = off` set on
    /// its database first (`ALTER DATABASE`), which `pg check` must report,
    /// then put back (what check says to do) before the crash: a crash
    /// while it is off can lose acknowledged ids, which check refuses
    /// rather than makes safe.
    Crash,
    /// The shard's server fails over: a standby of it (`pg_basebackup
    /// -R`), left to lag for a moment, the primary SIGKILLed, the standby
    /// promoted, the file pointed at it and `pg repair` (as the guide
    /// says); then the old primary restarted beside it, whose inserts and
    /// a repair or apply through a file still reaching it are refused.
    /// Once per server (a promoted standby is not failed over again).
    Failover,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 14] = [
        Fault::MoveStopped,
        Fault::MoveKilled,
        Fault::StaleApply,
        Fault::EditOwner,
        Fault::EditPrefix,
        Fault::EditCount,
        Fault::EditEpoch,
        Fault::EditUrl,
        Fault::RestoreStopped,
        Fault::RestoreLive,
        Fault::RepairDuringMove,
        Fault::TwoMoves,
        Fault::Crash,
        Fault::Failover,
    ];

    /// The name `--kinds` takes.
    pub fn name(self) -> &'static str {
        match self {
            Fault::MoveStopped => "move-stopped",
            Fault::MoveKilled => "move-killed",
            Fault::StaleApply => "older-file-apply",
            Fault::EditOwner => "edit-owner",
            Fault::EditPrefix => "edit-prefix",
            Fault::EditCount => "edit-count",
            Fault::EditEpoch => "edit-epoch",
            Fault::EditUrl => "edit-url",
            Fault::RestoreStopped => "restore-stopped",
            Fault::RestoreLive => "restore-live",
            Fault::RepairDuringMove => "repair-during-move",
            Fault::TwoMoves => "two-moves",
            Fault::Crash => "crash",
            Fault::Failover => "failover",
        }
    }

    /// The kind `name` names.
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl Kind for Fault {
    fn variants(self) -> usize {
        match self {
            Fault::MoveStopped => STEPS.len(),
            Fault::EditUrl | Fault::RepairDuringMove | Fault::Crash => 2,
            Fault::TwoMoves => SHARDS as usize - 1,
            _ => 1,
        }
    }
}

/// One step of the schedule: its target is the shard.
type Step = Drawn<Fault>;

/// The seeded schedule: `kinds` drawn at random, the pause 0-400 ms (how
/// far into a move a SIGKILL or a repair comes).
fn schedule(o: &DbOptions, kinds: &[Fault]) -> Vec<Step> {
    schedule::draw(
        o.seed,
        kinds,
        &Ranges {
            run: Duration::from_secs(o.seconds),
            spacing: o.spacing.max(Duration::from_secs(2)),
            targets: SHARDS as usize,
            backups: FILES_KEPT,
            pause: (Duration::ZERO, Duration::from_millis(400)),
        },
    )
}

/// A PostgreSQL server of `scripts/pg.sh`, stopped on drop.
pub(crate) struct Server {
    script: PathBuf,
    dir: String,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn start(script: &Path) -> anyhow::Result<Server> {
        let out = Command::new("bash")
            .arg(script)
            .args(["start", "1"])
            .output()
            .context("running scripts/pg.sh start")?;
        if !out.status.success() {
            bail!(
                "pg.sh start: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let url = text.lines().find(|l| l.starts_with("postgres://"));
        let dir = text.lines().find_map(|l| l.strip_prefix("dir "));
        match (url, dir) {
            (Some(url), Some(dir)) => Ok(Server {
                script: script.to_path_buf(),
                dir: dir.to_string(),
                url: url.to_string(),
            }),
            _ => bail!("pg.sh start printed no URL and dir: {text}"),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(&self.script)
            .args(["stop", &self.dir])
            .output();
    }
}

fn topology(a: &Server, b: &Server, epoch_ms: u64) -> String {
    format!(
        "layout = \"chaos: time 41 | shard 13 | sequence 10 (epoch {epoch_ms} ms)\"\nshards = {SHARDS}\nschema_prefix = \"shard\"\n\n\
         [[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-1\"\n\n\
         [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"2-3\"\n\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, user_id bigint NOT NULL, body text)\"\n",
        a.url, b.url
    )
}

/// The Instagram epoch: the run's layout is Instagram's, spelled out so
/// that an edit can move its epoch.
const EPOCH_MS: u64 = 1_314_220_021_721;

/// What the fault thread needs.
struct Shared {
    /// The writers; a lane per shard (a restore with writers stopped
    /// pauses its shard's), a generation per restore (a restore and repair
    /// jumps a shard's ids ahead).
    writers: Arc<Writers>,
    topology: PathBuf,
    bin: PathBuf,
    /// `scripts/pg.sh`, and each first server's URL and its directory.
    script: PathBuf,
    primaries: Vec<(String, String)>,
    /// Data directories of the standbys a failover started (stopped at
    /// the end).
    standbys: Mutex<Vec<PathBuf>>,
}

/// `program` run as user postgres when this runs as root (PostgreSQL
/// refuses root), as `scripts/pg.sh` does.
fn as_postgres(program: &Path) -> Command {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// Runs `cmd`; an error with its output unless it succeeds.
fn run_ok(cmd: &mut Command, what: &str) -> anyhow::Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!("{what}: {}", text(&out));
    }
    Ok(())
}

pub(crate) fn cli(bin: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Command::new(bin)
        .args(args)
        .env_remove("SHARDFLAKE_TOPOLOGY")
        .env_remove("SHARDFLAKE_MOVE_STOP_AFTER")
        .output()
        .with_context(|| format!("running shardflake {args:?}"))
}

pub(crate) fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
    .trim()
    .to_string()
}

/// The URL of the server the file puts `shard` on (`pg route`: keys are
/// routed by key mod shards).
fn route(bin: &Path, topology: &Path, shard: u64) -> anyhow::Result<String> {
    let t = topology.to_string_lossy().to_string();
    let out = cli(bin, &["pg", "route", &shard.to_string(), "-t", &t])?;
    let s = String::from_utf8_lossy(&out.stdout);
    s.rsplit_once('(')
        .and_then(|(_, rest)| rest.split(')').next())
        .map(str::to_string)
        .with_context(|| format!("pg route printed {:?}", text(&out)))
}

/// One run; `Ok(true)` when every check passed.
pub fn run(o: &DbOptions, pg_script: &Path, kinds: &[Fault]) -> anyhow::Result<bool> {
    in_dir(o.out.as_deref(), "db-pg", |dir| {
        run_in(o, pg_script, kinds, dir)
    })
}

fn run_in(o: &DbOptions, pg_script: &Path, kinds: &[Fault], dir: &Path) -> anyhow::Result<bool> {
    let plan = schedule(o, kinds);
    println!("seed {}; schedule:", o.seed);
    for step in &plan {
        println!(
            "  +{:.1} s {:?} {} (shard {}, {} ms, older file {})",
            step.at.as_secs_f64(),
            step.kind,
            step.variant,
            step.target,
            step.pause.as_millis(),
            step.backup + 1
        );
    }
    let (a, b) = (Server::start(pg_script)?, Server::start(pg_script)?);
    let path = dir.join("topology.toml");
    let start_text = topology(&a, &b, EPOCH_MS);
    std::fs::write(&path, &start_text)?;
    let stale = dir.join("stale.toml");
    // The file's versions, newest first: what an app host's deploy may still have.
    let mut versions = std::collections::VecDeque::from([start_text.clone()]);
    let t = path.to_string_lossy().to_string();
    let applied = cli(&o.bin, &["pg", "apply", "-t", &t])?;
    if !applied.status.success() {
        bail!("shardflake pg apply: {}", text(&applied));
    }
    let layout = shardflake::preset::resolve(&format!(
        "chaos: time 41 | shard 13 | sequence 10 (epoch {EPOCH_MS} ms)"
    ))?;
    let bindir = Command::new("bash").arg(pg_script).arg("bindir").output()?;
    let bindir = PathBuf::from(String::from_utf8_lossy(&bindir.stdout).trim());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let seq = layout.sequence();
    let writers = Writers::new(SHARDS as usize, false);
    let shared = Shared {
        writers: writers.clone(),
        topology: path.clone(),
        bin: o.bin.clone(),
        script: pg_script.to_path_buf(),
        primaries: vec![
            (a.url.clone(), a.dir.clone()),
            (b.url.clone(), b.dir.clone()),
        ],
        standbys: Mutex::new(Vec::new()),
    };
    let load_start_unix_ms = check::unix_ms_now();
    let clients: Vec<_> = (0..o.clients)
        .map(|i| {
            let shard = i as u64 % SHARDS;
            let (bin, topology) = (o.bin.clone(), path.clone());
            let lane = Lane {
                lane: shard as usize,
                backend: Backend::Postgres,
                table: format!("shard{shard}.posts"),
                // Routed again for each connection: on SF001 (moved) or a
                // broken connection the writer follows the file.
                url: Box::new(move || route(&bin, &topology, shard)),
                slots: Slots::Incarnation(shard as usize),
                sequence_mask: seq.max() << seq.shift(),
                // Small bursts and a short pause: the shards grow slowly
                // enough that moves and dumps of them keep to the schedule.
                mix: Mix {
                    max_rows: 20,
                    pause: STATEMENT_PAUSE,
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
    let mut restores = 0u32;
    for step in &plan {
        sleep_until(writers.start + step.at);
        let (fault, shard) = (step.kind, step.target as u64 % SHARDS);
        let current = std::fs::read_to_string(&path)?;
        if versions.front() != Some(&current) {
            versions.push_front(current);
            versions.truncate(FILES_KEPT);
        }
        // The step's older file: one before the current, or the oldest kept.
        let older = &versions[(step.backup + 1).min(versions.len() - 1)];
        std::fs::write(&stale, older)?;
        let result = fault_once(o, &shared, &bindir, dir, step, &stale);
        let when = writers.now_ms();
        match result {
            Ok(()) => println!(
                "+{:.1} s {fault:?} {} (shard {shard}) done",
                f64::from(when) / 1000.0,
                step.variant
            ),
            Err(e) => incidents.push(format!("{fault:?} (shard {shard}) at +{when} ms: {e:#}")),
        }
        if matches!(fault, Fault::RestoreStopped | Fault::RestoreLive) {
            restores += 1;
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
    let checked = cli(&o.bin, &["pg", "check", "-t", &t])?;
    for data in shared.standbys.lock().unwrap().iter() {
        let _ = as_postgres(&bindir.join("pg_ctl"))
            .arg("-D")
            .arg(data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
    if !checked.status.success() {
        incidents.push(format!("the final pg check failed: {}", text(&checked)));
    }
    println!(
        "\n{restores} restores; final pg check: {}\n",
        text(&checked)
    );
    Outcome {
        name: "postgresql".into(),
        processes: 2,
        clients: all,
        incidents,
        answers: &writers.answers,
        load_start_unix_ms,
        faults_over_ms,
        end_ms,
    }
    .judge(Some(&layout), dir)
}

/// Runs one fault and the operator's way out of it; `Err` is an incident.
fn fault_once(
    o: &DbOptions,
    shared: &Shared,
    bindir: &Path,
    dir: &Path,
    step: &Step,
    stale: &Path,
) -> anyhow::Result<()> {
    let (fault, shard) = (step.kind, step.target as u64 % SHARDS);
    let t = shared.topology.to_string_lossy().to_string();
    let s = shard.to_string();
    let (owner_url, other) = owner_and_other(shared, shard)?;
    let current = std::fs::read_to_string(&shared.topology)?;
    let refused = |args: &[&str], what: &str| -> anyhow::Result<()> {
        let out = cli(&o.bin, args)?;
        if out.status.success() {
            bail!("{what} was accepted: {}", text(&out));
        }
        Ok(())
    };
    let finish_shard = |shard: &str, to: &str, what: &str| -> anyhow::Result<()> {
        let out = cli(&o.bin, &["pg", "move-shard", shard, "--to", to, "-t", &t])?;
        let said = text(&out);
        if !out.status.success() && !said.contains("already on") {
            bail!("{what}: the move of shard {shard} could not be finished: {said}");
        }
        Ok(())
    };
    let finish = |what: &str| finish_shard(&s, other, what);
    let move_shard = |shard: &str, to: &str, keep_source: bool| {
        let mut cmd = Command::new(&o.bin);
        cmd.args(["pg", "move-shard", shard, "--to", to, "-t", &t])
            .env_remove("SHARDFLAKE_MOVE_STOP_AFTER")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if keep_source {
            cmd.arg("--keep-source");
        }
        cmd.spawn().context("running shardflake pg move-shard")
    };
    let psql = |sql: &str| -> anyhow::Result<String> {
        let out = Command::new(bindir.join("psql"))
            .args(["-d", &owner_url, "-At", "-c", sql])
            .output()?;
        if !out.status.success() {
            bail!("psql {sql}: {}", text(&out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    match fault {
        Fault::Failover => {
            let Some((_, pgdir)) = shared.primaries.iter().find(|(url, _)| *url == owner_url)
            else {
                println!("  failover: {owner_url} is a promoted standby already; skipped");
                return Ok(());
            };
            let n = shared.standbys.lock().unwrap().len();
            // Under pg.sh's directory, which user postgres may enter.
            let data = PathBuf::from(format!("{pgdir}/standby{n}"));
            let data_s = data.to_string_lossy().to_string();
            let port = crate::cluster::free_port()?;
            run_ok(
                as_postgres(&bindir.join("pg_basebackup")).args([
                    "-d", &owner_url, "-D", &data_s, "-R", "-X", "stream", "-c", "fast",
                ]),
                "pg_basebackup",
            )?;
            run_ok(
                as_postgres(&bindir.join("pg_ctl")).args([
                    "-D",
                    &data_s,
                    "-l",
                    &format!("{data_s}.log"),
                    "-w",
                    "-t",
                    "60",
                    "-o",
                    &format!(
                        "-p {port} -k {data_s} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=on -c full_page_writes=off -c max_connections=200"
                    ),
                    "start",
                ]),
                "starting the standby",
            )?;
            shared.standbys.lock().unwrap().push(data.clone());
            // However far it lags: the repair is what must cover it.
            std::thread::sleep(Duration::from_millis(300) + step.pause);
            run_ok(
                Command::new("bash")
                    .arg(&shared.script)
                    .args(["kill", pgdir]),
                "pg.sh kill (the primary dies)",
            )?;
            run_ok(
                as_postgres(&bindir.join("pg_ctl")).args(["-D", &data_s, "-w", "promote"]),
                "pg_ctl promote",
            )?;
            let promoted = format!("postgres://postgres@127.0.0.1:{port}/postgres");
            // The operator points the file at it, then repairs.
            let old_file = dir.join("before-failover.toml");
            std::fs::write(&old_file, &current)?;
            std::fs::write(
                &shared.topology,
                current.replace(
                    &format!("url = \"{owner_url}\""),
                    &format!("url = \"{promoted}\""),
                ),
            )?;
            let repaired = cli(&o.bin, &["pg", "repair", "-t", &t])?;
            if !repaired.status.success() {
                bail!("pg repair after the promotion: {}", text(&repaired));
            }
            // The old primary restarted beside it (split brain).
            run_ok(
                Command::new("bash")
                    .arg(&shared.script)
                    .args(["restart", pgdir]),
                "pg.sh restart (the old primary back)",
            )?;
            if let Ok(id) = psql(&format!(
                "INSERT INTO shard{shard}.posts (user_id) VALUES ({shard}) RETURNING id"
            )) {
                bail!("the old primary, restarted, made id {id}");
            }
            let f = old_file.to_string_lossy().to_string();
            refused(
                &["pg", "repair", "-t", &f],
                "repair through a file reaching the old primary",
            )?;
            refused(
                &["pg", "apply", "-t", &f],
                "apply through a file reaching the old primary",
            )
        }
        Fault::Crash => {
            if step.variant == 1 {
                // The database's setting: the server's command line sets
                // it on, which ALTER SYSTEM cannot override.
                let db = psql("SELECT quote_ident(current_database())")?;
                psql(&format!("ALTER DATABASE {db} SET synchronous_commit = off"))?;
                let seen = cli(&o.bin, &["pg", "check", "-t", &t])?;
                psql(&format!("ALTER DATABASE {db} RESET synchronous_commit"))?;
                if seen.status.success() || !text(&seen).contains("synchronous_commit") {
                    bail!(
                        "check with synchronous_commit = off did not report it: {}",
                        text(&seen)
                    );
                }
            }
            let backend = psql(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY pid LIMIT 1",
            )?;
            if backend.is_empty() {
                bail!("no client backend to crash on {owner_url}");
            }
            let killed = Command::new("kill").args(["-KILL", &backend]).status()?;
            if !killed.success() {
                bail!("kill -KILL {backend}");
            }
            // The server is back once it answers again (recovery), bounded.
            let deadline = Instant::now() + Duration::from_secs(30);
            while psql("SELECT 1").is_err() {
                if Instant::now() > deadline {
                    bail!("{owner_url} did not come back within 30 s of the crash");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // A crash ends the run next_id was vouched for: inserts are
            // refused (SF005) until the operator's `pg repair`.
            let repaired = cli(&o.bin, &["pg", "repair", "-t", &t])?;
            if !repaired.status.success() {
                bail!("pg repair after the crash: {}", text(&repaired));
            }
            Ok(())
        }
        Fault::RepairDuringMove => {
            let child = move_shard(&s, other, step.variant == 1)?;
            std::thread::sleep(step.pause);
            // A refusal is fine; what it did is judged by the ids, the
            // move finished after it and the final check.
            let repaired = cli(&o.bin, &["pg", "repair", "-t", &t])?;
            let moved = child.wait_with_output()?;
            println!(
                "  repair during a move of shard {s}: repair {}, move {}",
                if repaired.status.success() {
                    "ok"
                } else {
                    "refused"
                },
                if moved.status.success() {
                    "ok"
                } else {
                    "refused"
                }
            );
            finish("after a repair during the move")
        }
        Fault::TwoMoves => {
            let second = (shard + 1 + step.variant as u64) % SHARDS;
            let (_, other2) = owner_and_other(shared, second)?;
            let s2 = second.to_string();
            let first = move_shard(&s, other, false)?;
            let then = move_shard(&s2, other2, false)?;
            let (a, b) = (first.wait_with_output()?, then.wait_with_output()?);
            let said = |o: &Output| if o.status.success() { "ok" } else { "refused" };
            println!(
                "  two moves at once: shard {s} to {other} {}, shard {s2} to {other2} {}",
                said(&a),
                said(&b)
            );
            // Each move that said it was done must still be in the file.
            for (shard, to, out) in [(shard, other, &a), (second, other2, &b)] {
                if out.status.success() {
                    let (_, now_other) = owner_and_other(shared, shard)?;
                    if now_other == to {
                        bail!(
                            "two moves at once: shard {shard}'s move to {to} said done, but the file puts it back: {}",
                            text(out)
                        );
                    }
                }
            }
            finish("after two moves at once")?;
            finish_shard(&s2, other2, "after two moves at once")
        }
        Fault::MoveStopped => {
            let step = step.variant;
            let out = Command::new(&o.bin)
                .args(["pg", "move-shard", &s, "--to", other, "-t", &t])
                .env("SHARDFLAKE_MOVE_STOP_AFTER", STEPS[step])
                .output()?;
            if out.status.success() {
                bail!("move-shard --stop-after {} did not stop", STEPS[step]);
            }
            if step < 4 {
                refused(&["pg", "check", "-t", &t], "check during a stopped move")?;
                refused(&["pg", "apply", "-t", &t], "apply during a stopped move")?;
            }
            finish("after a stop")
        }
        Fault::MoveKilled => {
            let mut child = move_shard(&s, other, false)?;
            std::thread::sleep(step.pause);
            let _ = child.kill();
            child.wait()?;
            finish("after a SIGKILL")
        }
        Fault::StaleApply => {
            if std::fs::read_to_string(stale)? == current {
                return Ok(());
            }
            refused(
                &["pg", "apply", "-t", &stale.to_string_lossy()],
                "apply with an older version of the file",
            )
        }
        Fault::EditOwner | Fault::EditPrefix | Fault::EditCount | Fault::EditEpoch => {
            let edited = match fault {
                // Every shard on the other server: the shard lists swapped.
                Fault::EditOwner => swap_lists(&current),
                Fault::EditPrefix => {
                    current.replace("schema_prefix = \"shard\"", "schema_prefix = \"s\"")
                }
                Fault::EditCount => {
                    let doubled = current.replace(
                        &format!("shards = {SHARDS}\n"),
                        &format!("shards = {}\n", SHARDS * 2),
                    );
                    add_to_last_list(&doubled, &format!("{}-{}", SHARDS, SHARDS * 2 - 1))
                }
                _ => current.replace(
                    &format!("epoch {EPOCH_MS} ms"),
                    &format!("epoch {} ms", EPOCH_MS + 10_000),
                ),
            };
            let file = dir.join("edited.toml");
            std::fs::write(&file, edited)?;
            let f = file.to_string_lossy().to_string();
            refused(
                &["pg", "apply", "-t", &f],
                &format!("apply with the file edited ({fault:?})"),
            )?;
            refused(
                &["pg", "check", "-t", &f],
                &format!("check with the file edited ({fault:?})"),
            )
        }
        Fault::EditUrl => {
            let named_new = step.variant == 1;
            let owner = if other == "a" { "b" } else { "a" };
            let (base, _) = owner_url
                .rsplit_once('/')
                .context("a server url without a database")?;
            let database = format!("chaos_empty_{}", shared.writers.generation());
            let out = Command::new(bindir.join("psql"))
                .args([
                    "-d",
                    &owner_url,
                    "-c",
                    &format!("CREATE DATABASE {database}"),
                ])
                .output()?;
            if !out.status.success() && !text(&out).contains("already exists") {
                bail!("psql: {}", text(&out));
            }
            let edited = current.replace(
                &format!("url = \"{owner_url}\""),
                &format!("url = \"{base}/{database}\""),
            );
            let file = dir.join("edited.toml");
            std::fs::write(&file, edited)?;
            let f = file.to_string_lossy().to_string();
            let mut apply = vec!["pg", "apply", "-t", &f];
            if named_new {
                apply.extend(["--new-server", owner]);
            }
            refused(
                &apply,
                &format!("apply with {owner}'s url edited ({fault:?})"),
            )?;
            refused(
                &["pg", "check", "-t", &f],
                &format!("check with {owner}'s url edited"),
            )
        }
        Fault::RestoreStopped | Fault::RestoreLive => {
            let dump = dir.join(format!("shard{shard}.dump"));
            let pg = |program: &str, args: &[&str]| -> anyhow::Result<()> {
                let out = Command::new(bindir.join(program)).args(args).output()?;
                if !out.status.success() {
                    bail!("{program}: {}", text(&out));
                }
                Ok(())
            };
            let schema = format!("shard{shard}");
            let d = dump.to_string_lossy().to_string();
            pg(
                "pg_dump",
                &["-d", &owner_url, "-Fc", "-n", &schema, "-f", &d],
            )?;
            // Ids go on past the dump for a while.
            std::thread::sleep(o.spacing / 4);
            let stopped = fault == Fault::RestoreStopped;
            if stopped {
                shared.writers.pause(shard as usize, 2 * TIMEOUT);
            }
            let restored = pg("pg_restore", &["--clean", "-d", &owner_url, &d]);
            shared.writers.restored();
            let seen = cli(&o.bin, &["pg", "check", "-t", &t])?;
            let repaired = cli(&o.bin, &["pg", "repair", "--shard", &s, "-t", &t])?;
            shared.writers.resume(shard as usize);
            restored?;
            if seen.status.success() {
                bail!("check after a restore said ok: {}", text(&seen));
            }
            if !repaired.status.success() {
                bail!("pg repair: {}", text(&repaired));
            }
            Ok(())
        }
    }
}

/// The url of the server the file puts `shard` on, and the name of the
/// other server (`a` or `b`).
fn owner_and_other(shared: &Shared, shard: u64) -> anyhow::Result<(String, &'static str)> {
    let owner_url = route(&shared.bin, &shared.topology, shard)?;
    let current = std::fs::read_to_string(&shared.topology)?;
    if !current.contains(&format!("url = \"{owner_url}\"\nshards")) {
        bail!("the file names no server with url {owner_url}")
    }
    // Whichever of a and b does not hold it.
    let owner_is_a = current
        .split("[[servers]]")
        .nth(1)
        .is_some_and(|a| a.contains(&owner_url));
    Ok((owner_url, if owner_is_a { "b" } else { "a" }))
}

/// The file with the two servers' shard lists swapped.
fn swap_lists(text: &str) -> String {
    let lists: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("shards = \""))
        .collect();
    if lists.len() != 2 {
        return text.to_string();
    }
    text.replace(lists[0], "@@A@@")
        .replace(lists[1], lists[0])
        .replace("@@A@@", lists[1])
}

/// The file with `more` added to the last server's shard list.
fn add_to_last_list(text: &str, more: &str) -> String {
    let Some(last) = text.lines().rfind(|l| l.starts_with("shards = \"")) else {
        return text.to_string();
    };
    let held = last.trim_start_matches("shards = \"").trim_end_matches('"');
    let grown = if held.is_empty() {
        format!("shards = \"{more}\"")
    } else {
        format!("shards = \"{held},{more}\"")
    };
    text.replace(last, &grown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_has_every_kind_and_the_edits_are_valid_shapes() {
        let o = DbOptions {
            seconds: 300,
            seed: 3,
            clients: 8,
            bin: "shardflake".into(),
            script: "scripts/mariadb.sh".into(),
            spacing: Duration::from_secs(6),
            out: None,
        };
        let plan = schedule(&o, &Fault::ALL);
        assert_eq!(plan, schedule(&o, &Fault::ALL));
        for k in Fault::ALL {
            assert_eq!(Fault::parse(k.name()), Some(k));
        }
        let only = schedule(&o, &[Fault::Crash]);
        assert!(!only.is_empty() && only.iter().all(|d| d.kind == Fault::Crash));
        let many: Vec<Step> = (0..5)
            .flat_map(|seed| schedule(&DbOptions { seed, ..o.clone() }, &Fault::ALL))
            .collect();
        for kind in Fault::ALL {
            for v in 0..kind.variants() {
                assert!(
                    many.iter().any(|d| d.kind == kind && d.variant == v),
                    "{kind:?} variant {v} missing"
                );
            }
        }
        assert!(plan.iter().all(|d| d.pause <= Duration::from_millis(400)));
        let text = "shards = 4\n[[servers]]\nshards = \"0-1\"\n[[servers]]\nshards = \"2-3\"\n";
        assert_eq!(
            swap_lists(text),
            "shards = 4\n[[servers]]\nshards = \"2-3\"\n[[servers]]\nshards = \"0-1\"\n"
        );
        assert!(add_to_last_list(text, "4-7").ends_with("shards = \"2-3,4-7\"\n"));
    }
}
