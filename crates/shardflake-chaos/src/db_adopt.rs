//! `shardflake-chaos db-adopt`: `shardflake pg adopt` under writers and
//! an operator's faults (issue 39), judged by the same checker. One
//! PostgreSQL of `scripts/pg.sh` holds a deployment of two shards (`pg
//! apply`) beside the application's own table, `app.orders` (`bigserial`,
//! [`OLD_ROWS`] rows), whose dump is taken first: the dump from before
//! adoption. Clients insert into it from the start (`INSERT ... RETURNING
//! id`, single rows and bursts of up to 20, 2 ms apart); a second in,
//! `pg adopt --table app.orders` switches it while they write. Then a
//! seeded schedule draws, through the CLI as an operator would:
//!
//! - `adopt-killed`: the default put back on the old sequence by hand,
//!   then `pg adopt` SIGKILLed 0-400 ms into its run, then run again;
//! - `restore-predump`: the dump from before adoption restored over the
//!   adopted table (`pg_restore --clean`, writers stopped), `pg check`
//!   must report it, then `pg adopt` again and the writers back, as
//!   docs/guide/adopting.md §6 says;
//! - `default-back`: the default changed back to the old sequence by hand,
//!   the writers going on for a while, `pg check` must report it, then
//!   `pg adopt` again.
//!
//! A change of the default ends each connection's log (the writers pause
//! for it): its ids go down there by design. Every id answered goes to the
//! checker (no id twice, each connection's ids increasing); at the end
//! `pg check` must pass, and every stored id is read back: none twice, and
//! every id answered since the last restore is there.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::check;
use crate::db::{DbOptions, sleep_until};
use crate::db_pg::{Server, cli, error_code, text};
use crate::load::Answers;
use crate::record::{ConnLog, Protocol, ms_since};
use crate::schedule::{self, Drawn, Kind, Ranges};
use crate::verdict::{ClientLog, Outcome, in_dir};

/// Rows of the table before adoption.
const OLD_ROWS: u64 = 20_000;
/// The adopted table.
const TABLE: &str = "app.orders";
/// Longest a connect or a statement may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before each statement of a client.
const STATEMENT_PAUSE: Duration = Duration::from_millis(2);
/// When the first `pg adopt` runs, after the writers started.
const FIRST_ADOPT: Duration = Duration::from_secs(1);
/// The run's layout (Instagram's, spelled out).
const LAYOUT: &str = "chaos: time 41 | shard 13 | sequence 10 (epoch 1314220021721 ms)";

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The default put back by hand, then `pg adopt` SIGKILLed after the
    /// step's pause, then run again.
    AdoptKilled,
    /// The dump from before adoption restored over the table (writers
    /// stopped), then `pg adopt` again.
    RestorePredump,
    /// The default changed back by hand under the writers, reported by `pg
    /// check`, then `pg adopt` again.
    DefaultBack,
}

impl Fault {
    /// Every kind, the default of `--kinds`.
    pub const ALL: [Fault; 3] = [
        Fault::AdoptKilled,
        Fault::RestorePredump,
        Fault::DefaultBack,
    ];

    /// The name `--kinds` takes.
    pub fn name(self) -> &'static str {
        match self {
            Fault::AdoptKilled => "adopt-killed",
            Fault::RestorePredump => "restore-predump",
            Fault::DefaultBack => "default-back",
        }
    }

    /// The kind `name` names.
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl Kind for Fault {}

/// The seeded schedule: `kinds` drawn at random after the first adopt,
/// the pause 0-400 ms (how far into a run of adopt the SIGKILL comes).
fn schedule(o: &DbOptions, kinds: &[Fault]) -> Vec<Drawn<Fault>> {
    schedule::draw(
        o.seed,
        kinds,
        &Ranges {
            run: Duration::from_secs(o.seconds),
            spacing: o.spacing.max(Duration::from_secs(2)),
            targets: 1,
            backups: 1,
            pause: (Duration::ZERO, Duration::from_millis(400)),
        },
    )
    .into_iter()
    .filter(|d| d.at > FIRST_ADOPT + Duration::from_secs(1))
    .collect()
}

/// What the clients share with the fault thread.
struct Shared {
    start: Instant,
    stop: AtomicBool,
    /// The writers wait (a change of the default, a restore).
    paused: AtomicBool,
    /// Statements under way: a pause waits for them to end.
    in_flight: AtomicU32,
    /// Bumped at each change of the default: a connection's log ends
    /// there.
    generation: AtomicU32,
    /// Restores so far: ids answered before the last one may be gone.
    restores: AtomicU32,
    /// Every id answered, with the restores before it.
    answered: Mutex<Vec<(u32, u64)>>,
    answers: Mutex<Answers>,
    url: String,
}

/// One client: a connection at a time; a log per connection and
/// generation.
async fn client(shared: Arc<Shared>, slot: usize, seed: u64) -> ClientLog {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = ClientLog::default();
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let generation = shared.generation.load(Ordering::SeqCst);
        let conn = tokio::time::timeout(
            TIMEOUT,
            tokio_postgres::connect(&shared.url, tokio_postgres::NoTls),
        )
        .await;
        let client = match conn {
            Ok(Ok((c, connection))) => {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                c
            }
            _ => {
                out.error("pg:connect".into());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // A slot per client and generation: the checker orders a slot's
        // logs, and a default put back makes ids go down by design. Plain
        // numbers before adoption: no sequence field to follow.
        let mut log = ConnLog::new(generation as usize * 1000 + slot, 0, Protocol::Postgres, 0);
        while !shared.stop.load(Ordering::Relaxed)
            && !shared.paused.load(Ordering::SeqCst)
            && shared.generation.load(Ordering::SeqCst) == generation
        {
            let rows: i64 = if rng.f64() < 0.6 { 1 } else { rng.i64(2..=20) };
            tokio::time::sleep(STATEMENT_PAUSE).await;
            let sql = format!(
                "INSERT INTO {TABLE} (user_id, body) SELECT g, 'chaos' FROM generate_series(1, $1::bigint) g RETURNING id"
            );
            // Counted before the pause is looked at: a pause that begins
            // after the look waits for this statement.
            shared.in_flight.fetch_add(1, Ordering::SeqCst);
            if shared.paused.load(Ordering::SeqCst) {
                shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                break;
            }
            let restores = shared.restores.load(Ordering::SeqCst);
            let answer = tokio::time::timeout(TIMEOUT, client.query(&sql, &[&rows])).await;
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            match answer {
                Ok(Ok(r)) => {
                    let ids: Vec<u64> = r.iter().map(|r| r.get::<_, i64>(0) as u64).collect();
                    let at = ms_since(shared.start);
                    log.record(&ids, at);
                    shared
                        .answered
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(ids.iter().map(|&id| (restores, id)));
                    shared
                        .answers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .answered(u64::from(at));
                }
                Ok(Err(e)) => {
                    out.error(error_code(&e));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    break;
                }
                Err(_) => {
                    out.error("pg:timeout".into());
                    break;
                }
            }
        }
        out.logs.push(log);
    }
    out
}

/// One run; `Ok(true)` when every check passed.
pub fn run(o: &DbOptions, pg_script: &Path, kinds: &[Fault]) -> anyhow::Result<bool> {
    in_dir(o.out.as_deref(), "db-adopt", |dir| {
        run_in(o, pg_script, kinds, dir)
    })
}

fn run_in(o: &DbOptions, pg_script: &Path, kinds: &[Fault], dir: &Path) -> anyhow::Result<bool> {
    let plan = schedule(o, kinds);
    println!("seed {}; schedule:", o.seed);
    for step in &plan {
        println!(
            "  +{:.1} s {:?} ({} ms)",
            step.at.as_secs_f64(),
            step.kind,
            step.pause.as_millis()
        );
    }
    let server = Server::start(pg_script)?;
    let topology = dir.join("topology.toml");
    std::fs::write(
        &topology,
        format!(
            "layout = \"{LAYOUT}\"\nshards = 2\nschema_prefix = \"shard\"\n\n\
             [[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-1\"\n",
            server.url
        ),
    )?;
    let t = topology.to_string_lossy().to_string();
    let applied = cli(&o.bin, &["pg", "apply", "-t", &t])?;
    if !applied.status.success() {
        bail!("shardflake pg apply: {}", text(&applied));
    }
    let bindir = Command::new("bash").arg(pg_script).arg("bindir").output()?;
    let bindir = PathBuf::from(String::from_utf8_lossy(&bindir.stdout).trim());
    let ops = Ops {
        bin: o.bin.clone(),
        bindir,
        url: server.url.clone(),
        topology: t,
        predump: dir.join("orders-before-adoption.dump"),
    };
    ops.psql(&format!(
        "CREATE SCHEMA app; CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, user_id bigint NOT NULL, body text); \
         INSERT INTO {TABLE} (user_id, body) SELECT g, 'old' FROM generate_series(1, {OLD_ROWS}) g"
    ))?;
    ops.pg(
        "pg_dump",
        &[
            "-d",
            &ops.url,
            "-Fc",
            "-t",
            TABLE,
            "-f",
            &ops.predump.to_string_lossy(),
        ],
    )?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        paused: AtomicBool::new(false),
        in_flight: AtomicU32::new(0),
        generation: AtomicU32::new(0),
        restores: AtomicU32::new(0),
        answered: Mutex::new(Vec::new()),
        answers: Mutex::new(Answers::default()),
        url: server.url.clone(),
    });
    let load_start_unix_ms = check::unix_ms_now();
    let clients: Vec<_> = (0..o.clients)
        .map(|i| rt.spawn(client(shared.clone(), i, o.seed.wrapping_add(i as u64 + 1))))
        .collect();

    let mut incidents = Vec::new();
    sleep_until(shared.start + FIRST_ADOPT);
    if let Err(e) = ops.adopt() {
        incidents.push(format!("the first pg adopt under the writers: {e:#}"));
    }
    let mut done = std::collections::BTreeMap::<&str, u32>::new();
    for step in &plan {
        sleep_until(shared.start + step.at);
        let result = fault_once(&ops, &shared, step);
        let when = ms_since(shared.start);
        match result {
            Ok(()) => {
                *done.entry(step.kind.name()).or_default() += 1;
                println!("+{:.1} s {:?} done", f64::from(when) / 1000.0, step.kind);
            }
            Err(e) => incidents.push(format!("{:?} at +{when} ms: {e:#}", step.kind)),
        }
        // Whatever happened, the writers go on.
        shared.paused.store(false, Ordering::SeqCst);
    }
    let faults_over_ms = u64::from(ms_since(shared.start));
    sleep_until(shared.start + Duration::from_secs(o.seconds));
    shared.stop.store(true, Ordering::SeqCst);
    let end_ms = u64::from(ms_since(shared.start));
    let mut all = ClientLog::default();
    for c in clients {
        all.merge(rt.block_on(c)?);
    }
    let checked = cli(&o.bin, &["pg", "check", "-t", &ops.topology])?;
    if !checked.status.success() {
        incidents.push(format!("the final pg check failed: {}", text(&checked)));
    }
    // Every stored id, read back apart from the clients.
    let stored: Vec<u64> = ops
        .psql(&format!("SELECT id FROM {TABLE}"))?
        .lines()
        .map(|l| l.trim().parse::<i64>().map(|v| v as u64))
        .collect::<Result<_, _>>()
        .context("reading the stored ids")?;
    let distinct: HashSet<u64> = stored.iter().copied().collect();
    if distinct.len() != stored.len() {
        incidents.push(format!(
            "{} ids stored twice",
            stored.len() - distinct.len()
        ));
    }
    let restores = shared.restores.load(Ordering::SeqCst);
    let answered = shared
        .answered
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let kept: Vec<u64> = answered
        .iter()
        .filter(|(r, _)| *r == restores)
        .map(|&(_, id)| id)
        .collect();
    let lost = kept.iter().filter(|id| !distinct.contains(id)).count();
    if lost > 0 {
        incidents.push(format!(
            "{lost} ids answered since the last restore are not stored"
        ));
    }
    println!(
        "\nfaults done: {done:?}; {} ids answered, {} stored ({} answered since the last restore, {lost} of them missing); final pg check: {}\n",
        answered.len(),
        stored.len(),
        kept.len(),
        text(&checked)
    );
    Outcome {
        name: "postgresql adopt".into(),
        processes: 1,
        clients: all,
        incidents,
        answers: &shared.answers,
        load_start_unix_ms,
        faults_over_ms,
        end_ms,
    }
    // Old ids are plain numbers: judged without a layout.
    .judge(None, dir)
}

/// The operator's tools.
struct Ops {
    bin: PathBuf,
    bindir: PathBuf,
    url: String,
    topology: String,
    predump: PathBuf,
}

impl Ops {
    fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let out = Command::new(self.bindir.join("psql"))
            .args(["-d", &self.url, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()?;
        if !out.status.success() {
            bail!("psql {sql}: {}", text(&out));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn pg(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new(self.bindir.join(program))
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!("{program}: {}", text(&out));
        }
        Ok(())
    }

    fn adopt_args(&self) -> [&str; 5] {
        ["pg", "adopt", "--table", TABLE, "-t"]
    }

    /// `pg adopt`, which must succeed.
    fn adopt(&self) -> anyhow::Result<()> {
        let mut args = self.adopt_args().to_vec();
        args.push(&self.topology);
        let out = cli(&self.bin, &args)?;
        if !out.status.success() {
            bail!("pg adopt: {}", text(&out));
        }
        Ok(())
    }

    /// `pg check`, which must report the table as no longer adopted.
    fn check_reports_it(&self, what: &str) -> anyhow::Result<()> {
        let out = cli(&self.bin, &["pg", "check", "-t", &self.topology])?;
        let said = text(&out);
        if out.status.success() || !said.contains("app.orders") {
            bail!("pg check after {what} did not report app.orders: {said}");
        }
        Ok(())
    }

    /// The old sequence pg adopt kept (the record's).
    fn old_sequence(&self) -> anyhow::Result<String> {
        let seq = self.psql(&format!(
            "SELECT old_sequence FROM shardflake.adopted WHERE tbl = '{TABLE}'"
        ))?;
        if seq.is_empty() {
            bail!("no old sequence recorded for {TABLE}");
        }
        Ok(seq)
    }
}

/// Pauses the writers and waits for their statements under way to end
/// (bounded).
fn pause(shared: &Shared) {
    shared.paused.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + 2 * TIMEOUT;
    while shared.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Changes the table's default with the writers paused (their
/// connections' logs end there).
fn set_default(ops: &Ops, shared: &Shared, default: &str) -> anyhow::Result<()> {
    pause(shared);
    shared.generation.fetch_add(1, Ordering::SeqCst);
    let r = ops.psql(&format!(
        "ALTER TABLE {TABLE} ALTER COLUMN id SET DEFAULT {default}"
    ));
    shared.paused.store(false, Ordering::SeqCst);
    r.map(drop)
}

/// Runs one fault and the operator's way out of it; `Err` is an incident.
fn fault_once(ops: &Ops, shared: &Shared, step: &Drawn<Fault>) -> anyhow::Result<()> {
    match step.kind {
        Fault::AdoptKilled => {
            let seq = ops.old_sequence()?;
            set_default(ops, shared, &format!("nextval('{seq}'::regclass)"))?;
            let mut args = ops.adopt_args().to_vec();
            args.push(&ops.topology);
            let mut child = Command::new(&ops.bin)
                .args(&args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("running shardflake pg adopt")?;
            std::thread::sleep(step.pause);
            // SIGKILL, however far it got.
            let _ = child.kill();
            let _ = child.wait();
            ops.adopt()
        }
        Fault::RestorePredump => {
            pause(shared);
            shared.generation.fetch_add(1, Ordering::SeqCst);
            shared.restores.fetch_add(1, Ordering::SeqCst);
            let restored = ops.pg(
                "pg_restore",
                &["--clean", "-d", &ops.url, &ops.predump.to_string_lossy()],
            );
            let seen = ops.check_reports_it("the restore");
            let adopted = ops.adopt();
            shared.paused.store(false, Ordering::SeqCst);
            restored?;
            seen?;
            adopted
        }
        Fault::DefaultBack => {
            let seq = ops.old_sequence()?;
            set_default(ops, shared, &format!("nextval('{seq}'::regclass)"))?;
            // The application writes a while on the old sequence.
            std::thread::sleep(Duration::from_millis(300));
            let seen = ops.check_reports_it("the default changed back");
            let adopted = ops.adopt();
            seen?;
            adopted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_seeded_after_the_first_adopt_and_names_parse() {
        let o = DbOptions {
            seconds: 60,
            seed: 7,
            clients: 4,
            bin: PathBuf::from("shardflake"),
            script: PathBuf::from("scripts/mariadb.sh"),
            spacing: Duration::from_secs(3),
            out: None,
        };
        let plan = schedule(&o, &Fault::ALL);
        assert_eq!(plan, schedule(&o, &Fault::ALL));
        assert!(plan.iter().all(|d| d.at > FIRST_ADOPT));
        for k in Fault::ALL {
            assert_eq!(Fault::parse(k.name()), Some(k));
            assert!(plan.iter().any(|d| d.kind == k), "{k:?}");
        }
    }
}
