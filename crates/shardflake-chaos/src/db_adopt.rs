//! `shardflake-chaos db-adopt`: `shardflake pg adopt` or `shardflake
//! mysql adopt` under writers and an operator's faults (issue 39), judged
//! by the same checker. One server holds the application's own table,
//! populated with [`OLD_ROWS`] rows, whose dump is taken first (the dump
//! from before adoption): on PostgreSQL (`scripts/pg.sh`) `app.orders`, a
//! `bigserial`, beside a deployment of two shards (`pg apply`); on MariaDB
//! (`scripts/mariadb.sh`, `--backend mariadb`) `orders`, an
//! `AUTO_INCREMENT`. Clients insert into it from the start (the writers
//! of `db_load`: `INSERT ... RETURNING id`, single rows and bursts of up
//! to 20, 2 ms apart); a second in, adopt switches it while they write.
//! Then a seeded schedule draws, through the CLI as an operator would:
//!
//! - `adopt-killed`: the old way of making ids put back by hand (the
//!   default on the old sequence; on MariaDB the trigger dropped and
//!   `AUTO_INCREMENT` set back), then adopt SIGKILLed a drawn time into
//!   its run (0-400 ms on PostgreSQL, 0-3 s on MariaDB, whose adopt waits
//!   for its clock event), then run again;
//! - `restore-predump`: the dump from before adoption restored over the
//!   adopted table (`pg_restore --clean`, or the dump loaded with the
//!   `mariadb` client; writers stopped), check must report it, then adopt
//!   again and the writers back, as docs/guide/adopting.md says;
//! - `default-back`: the same put back by hand under the writers (on
//!   MariaDB the guard's `CHECK` dropped too, so the writers' inserts take
//!   `AUTO_INCREMENT` ids again), left a while, check must report it, then
//!   adopt again.
//!
//! A change of the default ends each connection's log (the writers pause
//! for it): its ids go down there by design. Every id answered goes to the
//! checker (no id twice, each connection's ids increasing); at the end
//! check must pass, and every stored id is read back: none twice, and
//! every id answered since the last restore is there.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::check;
use crate::db::{self, DbOptions, sleep_until};
use crate::db_load::{Backend, Lane, Mix, Slots, Writers, writer};
use crate::db_pg::{self, cli, text};
use crate::schedule::{self, Drawn, Kind, Ranges};
use crate::verdict::{ClientLog, Outcome, in_dir};

/// Rows of the table before adoption.
const OLD_ROWS: u64 = 20_000;
/// Longest a connect or a statement may take.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before each statement of a client.
const STATEMENT_PAUSE: Duration = Duration::from_millis(2);
/// When the first adopt runs, after the writers started.
const FIRST_ADOPT: Duration = Duration::from_secs(1);
/// The PostgreSQL run's layout (Instagram's, spelled out).
const LAYOUT: &str = "chaos: time 41 | shard 13 | sequence 10 (epoch 1314220021721 ms)";
/// The writers' only lane.
const LANE: usize = 0;

/// One fault of the schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The old way of making ids put back by hand, then adopt SIGKILLed
    /// after the step's pause, then run again.
    AdoptKilled,
    /// The dump from before adoption restored over the table (writers
    /// stopped), then adopt again.
    RestorePredump,
    /// The old way of making ids put back by hand under the writers,
    /// reported by check, then adopt again.
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

/// How long into a run of adopt its SIGKILL may come: MariaDB's adopt
/// waits for its clock event to run (about a second) before the switch.
fn kill_within(backend: Backend) -> Duration {
    match backend {
        Backend::Postgres => Duration::from_millis(400),
        Backend::MariaDb => Duration::from_millis(3000),
    }
}

/// The seeded schedule: `kinds` drawn at random after the first adopt,
/// the pause up to [`kill_within`] (how far into a run of adopt the
/// SIGKILL comes).
fn schedule(o: &DbOptions, backend: Backend, kinds: &[Fault]) -> Vec<Drawn<Fault>> {
    schedule::draw(
        o.seed,
        kinds,
        &Ranges {
            run: Duration::from_secs(o.seconds),
            spacing: o.spacing.max(Duration::from_secs(2)),
            targets: 1,
            backups: 1,
            pause: (Duration::ZERO, kill_within(backend)),
        },
    )
    .into_iter()
    .filter(|d| d.at > FIRST_ADOPT + Duration::from_secs(1))
    .collect()
}

/// One run; `Ok(true)` when every check passed.
pub fn run(
    o: &DbOptions,
    backend: Backend,
    pg_script: &Path,
    kinds: &[Fault],
) -> anyhow::Result<bool> {
    let name = match backend {
        Backend::Postgres => "db-adopt",
        Backend::MariaDb => "db-adopt-mariadb",
    };
    in_dir(o.out.as_deref(), name, |dir| {
        run_in(o, backend, pg_script, kinds, dir)
    })
}

fn run_in(
    o: &DbOptions,
    backend: Backend,
    pg_script: &Path,
    kinds: &[Fault],
    dir: &Path,
) -> anyhow::Result<bool> {
    let plan = schedule(o, backend, kinds);
    println!("seed {}; schedule:", o.seed);
    for step in &plan {
        println!(
            "  +{:.1} s {:?} ({} ms)",
            step.at.as_secs_f64(),
            step.kind,
            step.pause.as_millis()
        );
    }
    let ops = match backend {
        Backend::Postgres => Ops::Postgres(PgOps::start(o, pg_script, dir)?),
        Backend::MariaDb => Ops::MariaDb(MariaDbOps::start(o, dir)?),
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let writers = Writers::new(1, true);
    let load_start_unix_ms = check::unix_ms_now();
    let clients: Vec<_> = (0..o.clients)
        .map(|i| {
            let url = ops.url().to_string();
            let lane = Lane {
                lane: LANE,
                backend,
                table: ops.table().into(),
                url: Box::new(move || Ok(url.clone())),
                // A slot per client and generation: a default put back
                // makes ids go down by design; old ids are plain numbers.
                slots: Slots::PerGeneration(i),
                sequence_mask: 0,
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
    sleep_until(writers.start + FIRST_ADOPT);
    let began = std::time::Instant::now();
    match ops.adopt() {
        Ok(()) => println!(
            "+{:.1} s the first adopt under the writers took {} ms",
            f64::from(writers.now_ms()) / 1000.0,
            began.elapsed().as_millis()
        ),
        Err(e) => incidents.push(format!("the first adopt under the writers: {e:#}")),
    }
    let mut done = std::collections::BTreeMap::<&str, u32>::new();
    for step in &plan {
        sleep_until(writers.start + step.at);
        let result = fault_once(&ops, &writers, step);
        let when = writers.now_ms();
        match result {
            Ok(()) => {
                *done.entry(step.kind.name()).or_default() += 1;
                println!("+{:.1} s {:?} done", f64::from(when) / 1000.0, step.kind);
            }
            Err(e) => incidents.push(format!("{:?} at +{when} ms: {e:#}", step.kind)),
        }
        // Whatever happened, the writers go on.
        writers.resume(LANE);
    }
    let faults_over_ms = u64::from(writers.now_ms());
    sleep_until(writers.start + Duration::from_secs(o.seconds));
    writers.stop();
    let end_ms = u64::from(writers.now_ms());
    let mut all = ClientLog::default();
    for c in clients {
        all.merge(rt.block_on(c)?);
    }
    let checked = cli(&o.bin, &ops.check_args())?;
    if !checked.status.success() {
        incidents.push(format!("the final check failed: {}", text(&checked)));
    }
    // Every stored id, read back apart from the clients.
    let stored = ops.stored_ids()?;
    let distinct: HashSet<u64> = stored.iter().copied().collect();
    if distinct.len() != stored.len() {
        incidents.push(format!(
            "{} ids stored twice",
            stored.len() - distinct.len()
        ));
    }
    let restores = writers.restores();
    let answered = writers.answered();
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
        "\nfaults done: {done:?}; {} ids answered, {} stored ({} answered since the last restore, {lost} of them missing); final check: {}\n",
        answered.len(),
        stored.len(),
        kept.len(),
        text(&checked)
    );
    Outcome {
        name: format!("{} adopt", backend.name()),
        processes: 1,
        clients: all,
        incidents,
        answers: &writers.answers,
        load_start_unix_ms,
        faults_over_ms,
        end_ms,
    }
    // Old ids are plain numbers: judged without a layout.
    .judge(None, dir)
}

/// The operator's tools on one backend.
enum Ops {
    Postgres(PgOps),
    MariaDb(MariaDbOps),
}

/// A PostgreSQL of `scripts/pg.sh`, the topology file, its tools.
struct PgOps {
    bin: PathBuf,
    bindir: PathBuf,
    topology: String,
    predump: PathBuf,
    /// Stopped on drop.
    server: db_pg::Server,
}

/// A MariaDB of `scripts/mariadb.sh`.
struct MariaDbOps {
    bin: PathBuf,
    predump: PathBuf,
    /// Stopped and removed on drop.
    server: db::Server,
}

/// The adopted table on PostgreSQL.
const PG_TABLE: &str = "app.orders";
/// The adopted table on MariaDB (in the URL's database, `app`).
const MARIADB_TABLE: &str = "orders";

impl PgOps {
    /// The server, a deployment of two shards beside the populated table,
    /// the table's dump.
    fn start(o: &DbOptions, pg_script: &Path, dir: &Path) -> anyhow::Result<PgOps> {
        let server = db_pg::Server::start(pg_script)?;
        let topology = dir.join("topology.toml");
        std::fs::write(
            &topology,
            format!(
                "layout = \"{LAYOUT}\"\nshards = 2\nschema_prefix = \"shard\"\n\n\
                 [[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-1\"\n",
                server.url
            ),
        )?;
        let topology = topology.to_string_lossy().to_string();
        let applied = cli(&o.bin, &["pg", "apply", "-t", &topology])?;
        if !applied.status.success() {
            bail!("shardflake pg apply: {}", text(&applied));
        }
        let bindir = Command::new("bash").arg(pg_script).arg("bindir").output()?;
        let ops = PgOps {
            bin: o.bin.clone(),
            bindir: PathBuf::from(String::from_utf8_lossy(&bindir.stdout).trim()),
            topology,
            predump: dir.join("orders-before-adoption.dump"),
            server,
        };
        ops.psql(&format!(
            "CREATE SCHEMA app; CREATE TABLE {PG_TABLE} (id bigserial PRIMARY KEY, user_id bigint NOT NULL, body text); \
             INSERT INTO {PG_TABLE} (user_id, body) SELECT g, 'old' FROM generate_series(1, {OLD_ROWS}) g"
        ))?;
        ops.pg(
            "pg_dump",
            &[
                "-d",
                &ops.server.url,
                "-Fc",
                "-t",
                PG_TABLE,
                "-f",
                &ops.predump.to_string_lossy(),
            ],
        )?;
        Ok(ops)
    }

    fn psql(&self, sql: &str) -> anyhow::Result<String> {
        let out = Command::new(self.bindir.join("psql"))
            .args([
                "-d",
                &self.server.url,
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
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

    /// The old sequence pg adopt kept (the record's).
    fn old_sequence(&self) -> anyhow::Result<String> {
        let seq = self.psql(&format!(
            "SELECT old_sequence FROM shardflake.adopted WHERE tbl = '{PG_TABLE}'"
        ))?;
        if seq.is_empty() {
            bail!("no old sequence recorded for {PG_TABLE}");
        }
        Ok(seq)
    }
}

impl MariaDbOps {
    /// The server with the populated table, and the table's dump.
    fn start(o: &DbOptions, dir: &Path) -> anyhow::Result<MariaDbOps> {
        let server = db::Server::start(&o.script, "", None)?;
        server.sql(&format!(
            "CREATE TABLE {MARIADB_TABLE} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT); \
             INSERT INTO {MARIADB_TABLE} (user_id, body) SELECT seq, 'old' FROM seq_1_to_{OLD_ROWS}"
        ))?;
        let predump = dir.join("orders-before-adoption.sql");
        std::fs::rename(server.dump(dir, Some(MARIADB_TABLE))?, &predump)?;
        Ok(MariaDbOps {
            bin: o.bin.clone(),
            predump,
            server,
        })
    }
}

impl Ops {
    fn url(&self) -> &str {
        match self {
            Ops::Postgres(p) => &p.server.url,
            Ops::MariaDb(m) => &m.server.url,
        }
    }

    fn bin(&self) -> &Path {
        match self {
            Ops::Postgres(p) => &p.bin,
            Ops::MariaDb(m) => &m.bin,
        }
    }

    /// The table the writers insert into.
    fn table(&self) -> &'static str {
        match self {
            Ops::Postgres(_) => PG_TABLE,
            Ops::MariaDb(_) => MARIADB_TABLE,
        }
    }

    fn adopt_args(&self) -> Vec<&str> {
        match self {
            Ops::Postgres(p) => vec!["pg", "adopt", "--table", PG_TABLE, "-t", &p.topology],
            Ops::MariaDb(m) => vec![
                "mysql",
                "adopt",
                "--table",
                MARIADB_TABLE,
                "--url",
                &m.server.url,
            ],
        }
    }

    fn check_args(&self) -> Vec<&str> {
        match self {
            Ops::Postgres(p) => vec!["pg", "check", "-t", &p.topology],
            Ops::MariaDb(m) => vec![
                "mysql",
                "check",
                "--table",
                MARIADB_TABLE,
                "--url",
                &m.server.url,
            ],
        }
    }

    /// Adopt, which must succeed.
    fn adopt(&self) -> anyhow::Result<()> {
        let out = cli(self.bin(), &self.adopt_args())?;
        if !out.status.success() {
            bail!("adopt: {}", text(&out));
        }
        Ok(())
    }

    /// Check, which must report the table as no longer adopted.
    fn check_reports_it(&self, what: &str) -> anyhow::Result<()> {
        let out = cli(self.bin(), &self.check_args())?;
        let said = text(&out);
        if out.status.success() || !said.contains("orders") {
            bail!("check after {what} did not report the table: {said}");
        }
        Ok(())
    }

    /// The old way of making ids put back by hand: on PostgreSQL the
    /// default on the kept sequence (fenced by adopt: inserts fail); on
    /// MariaDB the trigger dropped and `AUTO_INCREMENT` set back (the
    /// guard column refuses inserts without the trigger), and with
    /// `whole_way` the guard's `CHECK` dropped too: inserts take
    /// `AUTO_INCREMENT` ids again.
    fn put_back(&self, whole_way: bool) -> anyhow::Result<()> {
        match self {
            Ops::Postgres(p) => {
                let seq = p.old_sequence()?;
                p.psql(&format!(
                    "ALTER TABLE {PG_TABLE} ALTER COLUMN id SET DEFAULT nextval('{seq}'::regclass)"
                ))
                .map(drop)
            }
            Ops::MariaDb(m) => {
                let check = if whole_way {
                    format!(
                        "ALTER TABLE {MARIADB_TABLE} DROP CONSTRAINT IF EXISTS id_made_by_trigger; "
                    )
                } else {
                    String::new()
                };
                m.server
                    .sql(&format!(
                        "DROP TRIGGER IF EXISTS {MARIADB_TABLE}_id; {check}ALTER TABLE {MARIADB_TABLE} AUTO_INCREMENT = 1"
                    ))
                    .map(drop)
            }
        }
    }

    /// The dump from before adoption restored over the table.
    fn restore_predump(&self) -> anyhow::Result<()> {
        match self {
            Ops::Postgres(p) => p.pg(
                "pg_restore",
                &["--clean", "-d", &p.server.url, &p.predump.to_string_lossy()],
            ),
            Ops::MariaDb(m) => m.server.restore(&m.predump),
        }
    }

    /// Every id stored in the table.
    fn stored_ids(&self) -> anyhow::Result<Vec<u64>> {
        let sql = format!("SELECT id FROM {}", self.table());
        let text = match self {
            Ops::Postgres(p) => p.psql(&sql)?,
            Ops::MariaDb(m) => m.server.sql(&sql)?,
        };
        text.lines()
            .map(|l| l.trim().parse::<i64>().map(|v| v as u64))
            .collect::<Result<_, _>>()
            .context("reading the stored ids")
    }
}

/// Puts the old way back with the writers paused (their connections'
/// logs end there).
fn put_back(ops: &Ops, writers: &Writers, whole_way: bool) -> anyhow::Result<()> {
    writers.pause(LANE, 2 * TIMEOUT);
    writers.next_generation();
    let r = ops.put_back(whole_way);
    writers.resume(LANE);
    r
}

/// Runs one fault and the operator's way out of it; `Err` is an incident.
fn fault_once(ops: &Ops, writers: &Writers, step: &Drawn<Fault>) -> anyhow::Result<()> {
    match step.kind {
        Fault::AdoptKilled => {
            put_back(ops, writers, false)?;
            let mut child = Command::new(ops.bin())
                .args(ops.adopt_args())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("running shardflake adopt")?;
            std::thread::sleep(step.pause);
            // SIGKILL, however far it got.
            let _ = child.kill();
            let _ = child.wait();
            ops.adopt()
        }
        Fault::RestorePredump => {
            // Each part timed: a step that outlasts the run is an incident
            // ("no client was answered after the last fault"), and its log
            // must say which part took the time.
            let t = Instant::now();
            writers.pause(LANE, 2 * TIMEOUT);
            let paused = t.elapsed();
            writers.restored();
            let restored = ops.restore_predump();
            let loaded = t.elapsed();
            let seen = ops.check_reports_it("the restore");
            let checked = t.elapsed();
            let adopted = ops.adopt();
            writers.resume(LANE);
            println!(
                "  restore-predump: writers paused after {} ms, dump loaded at {} ms, checked at {} ms, adopted at {} ms",
                paused.as_millis(),
                loaded.as_millis(),
                checked.as_millis(),
                t.elapsed().as_millis()
            );
            restored?;
            seen?;
            adopted
        }
        Fault::DefaultBack => {
            put_back(ops, writers, true)?;
            // The application writes a while with the old way back.
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
        for backend in [Backend::Postgres, Backend::MariaDb] {
            let plan = schedule(&o, backend, &Fault::ALL);
            assert_eq!(plan, schedule(&o, backend, &Fault::ALL));
            assert!(plan.iter().all(|d| d.at > FIRST_ADOPT));
            assert!(plan.iter().all(|d| d.pause <= kill_within(backend)));
            for k in Fault::ALL {
                assert_eq!(Fault::parse(k.name()), Some(k));
                assert!(plan.iter().any(|d| d.kind == k), "{k:?}");
            }
        }
    }
}
