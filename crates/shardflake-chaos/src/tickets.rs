//! `shardflake-chaos tickets`: Flickr's ticket servers and Leaf-style
//! segments, judged by the same checker. MariaDB servers from
//! `scripts/mariadb.sh` (two at the start, offsets 1 and 2 of increment 2),
//! the schema made by `shardflake tickets init`, clients (each its own
//! `TicketClient`, as separate processes would be) asking for single ids
//! and batches, while an operator's faults ([`Fault`]), drawn as a seeded
//! random sequence by [`schedule::draw`], hit one server or the whole
//! fleet: crashes (SIGKILL, SIGSTOP), restores from one of the backups
//! kept (each server's last [`KEPT`], taken after every fault), counters
//! lowered in place, a restore without triggers, a peer's backup loaded, a
//! server replaced under a new name, a reshape with the old clients left
//! running, a failover to a lagging copy with the old server restarted,
//! and clients started on an edited file. The fleet changes as the run
//! goes (servers replaced, added, removed): each fault takes its target
//! (`target % servers`) from the fleet as it is then.
//!
//! What each mode promises, and so what is checked: no id twice, ever
//! (duplicates, exact); in segment mode one client's ids increase; in
//! per-id mode the ids one client got from one server increase (a
//! server's ids are the residue class of its offset, so the checker keeps
//! one log per client and residue). A refusal is fine (errors are counted
//! by code); a duplicate fails the run.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use shardflake_tickets::{Config, TicketClient};
use tokio::task::JoinHandle;

use crate::check;
use crate::cluster::free_port;
use crate::db::{Server, sleep_until};
use crate::load::Answers;
use crate::record::{ConnLog, Protocol, ms_since};
use crate::schedule::{self, Drawn, Kind, Ranges};
use crate::verdict::{ClientLog, Outcome, ServerRun, in_dir};

/// The sequence the run draws from.
const SEQUENCE: &str = "chaos";
/// Backups kept per server: a fault loads one of the last this many.
pub const KEPT: usize = 4;
/// How long a client waits after a failed call before the next one.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// At most this many servers at once (the fleet grows by reshapes).
const MAX_SERVERS: usize = 3;

/// What a `tickets` run does.
#[derive(Debug, Clone)]
pub struct TicketsOptions {
    /// Length, seed, clients, binaries, spacing, output.
    pub run: ServerRun,
    /// Segment mode (Leaf) instead of per-id (Flickr).
    pub segment: bool,
    /// The kinds the run draws from (all, unless narrowed).
    pub kinds: Vec<Fault>,
    /// The fleet stays at exactly two servers (`--pair`): a reshape
    /// swaps their offsets, never adds or removes one. With two servers a
    /// mark needs the peer, so this measures how long clients wait while
    /// one of a pair is down.
    pub pair: bool,
}

/// An operator's fault (or a crash); its target is a server of the fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL, restart after the pause.
    Kill,
    /// SIGSTOP for the pause, then SIGCONT: a hung server.
    Stop,
    /// A backup (a dump that recreates the tables) loaded into the running
    /// server, under the clients' open sessions.
    RestoreLive,
    /// SIGKILL, restart, a backup loaded.
    RestoreStopped,
    /// A counter lowered in place: a backup's rows loaded as `REPLACE`
    /// (variant 0); lowered by a statement, `ALTER TABLE … AUTO_INCREMENT`
    /// per id, an `UPDATE` of the segment row (1); the table emptied, then
    /// lowered (2).
    Lowered,
    /// A dump made now with `--skip-triggers`, loaded into the running
    /// server after the pause (the guard gone), then `tickets init`.
    SkipTriggers,
    /// Every other server killed (variant 0) or SIGSTOPped (1), a backup
    /// loaded into the target meanwhile, the others back after the pause.
    PeerDown,
    /// Another server's backup loaded into the target: its counters'
    /// tables recreated (variant 0), or their rows as `REPLACE` (1).
    PeerBackup,
    /// The target dies; a fresh, empty server under a new name takes its
    /// offset, `tickets init`, every client switched to the new file.
    ReplacedNewName,
    /// `tickets reshape` to a new file: offsets swapped (variant 0), a
    /// server added or the target removed (1); new clients on the new
    /// file, the old clients left running for the pause.
    Reshape,
    /// A copy of the target (a lagging standby) on another port: made from
    /// a backup (variant 0, new table identities), or a copy of its data
    /// directory taken the pause before (variant 1: the same server and
    /// table identities, as a physical replica has); the target killed,
    /// the file pointed at the copy under the same name, every client
    /// switched; the old server restarted and a client on the old file run
    /// for the pause beside the new ones.
    Failover,
    /// For the pause, a client on an edited file: offsets swapped (variant
    /// 0), the target left out (1), a server added (2), the target renamed
    /// (3), the increment raised (4).
    EditedFile,
    /// The counter's whole guard dropped, its row set back (per id: about
    /// halved, in its residue class; segment: to where it was the pause
    /// before), the guard put back by `tickets init`, between two answers
    /// of the running clients.
    GuardReplaced,
}

impl Fault {
    /// Every kind.
    pub const ALL: [Fault; 13] = [
        Fault::Kill,
        Fault::Stop,
        Fault::RestoreLive,
        Fault::RestoreStopped,
        Fault::Lowered,
        Fault::SkipTriggers,
        Fault::PeerDown,
        Fault::PeerBackup,
        Fault::ReplacedNewName,
        Fault::Reshape,
        Fault::Failover,
        Fault::EditedFile,
        Fault::GuardReplaced,
    ];

    /// The name `--kinds` takes.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Stop => "stop",
            Fault::RestoreLive => "restore-live",
            Fault::RestoreStopped => "restore-stopped",
            Fault::Lowered => "lowered",
            Fault::SkipTriggers => "skip-triggers",
            Fault::PeerDown => "peer-down",
            Fault::PeerBackup => "peer-backup",
            Fault::ReplacedNewName => "replaced-new-name",
            Fault::Reshape => "reshape",
            Fault::Failover => "failover",
            Fault::EditedFile => "edited-file",
            Fault::GuardReplaced => "guard-replaced",
        }
    }

    /// The kind `name` names.
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    /// Whether it uses a backup (printed with the schedule).
    fn uses_backup(self, variant: usize) -> bool {
        match self {
            Fault::RestoreLive | Fault::RestoreStopped | Fault::PeerDown | Fault::PeerBackup => {
                true
            }
            Fault::Failover | Fault::Lowered => variant == 0,
            _ => false,
        }
    }

    /// What it does, in words, for the schedule.
    fn describe(self, variant: usize) -> &'static str {
        match (self, variant) {
            (Fault::Kill, _) => "SIGKILL, restart",
            (Fault::Stop, _) => "SIGSTOP, SIGCONT",
            (Fault::RestoreLive, _) => "a backup loaded live",
            (Fault::RestoreStopped, _) => "SIGKILL, restart, a backup loaded",
            (Fault::Lowered, 0) => "a backup's counter rows loaded in place (REPLACE)",
            (Fault::Lowered, 1) => "the counter lowered by a statement",
            (Fault::Lowered, _) => "the counter's table emptied, then lowered",
            (Fault::SkipTriggers, _) => "a --skip-triggers dump loaded, then tickets init",
            (Fault::PeerDown, 0) => "a backup loaded while every peer is down",
            (Fault::PeerDown, _) => "a backup loaded while every peer is SIGSTOPped",
            (Fault::PeerBackup, 0) => "a peer's backup of the counters' tables loaded",
            (Fault::PeerBackup, _) => "a peer's backup of the counters' rows loaded in place",
            (Fault::ReplacedNewName, _) => "replaced by an empty server under a new name",
            (Fault::Reshape, 0) => "reshape: offsets swapped, old clients left running",
            (Fault::Reshape, _) => "reshape: a server added or removed, old clients left running",
            (Fault::Failover, 0) => "failover to a copy from a backup, the old server restarted",
            (Fault::Failover, _) => {
                "failover to a datadir copy of the pause before, the old server restarted"
            }
            (Fault::EditedFile, 0) => "a client on the file with offsets swapped",
            (Fault::EditedFile, 1) => "a client on the file without this server",
            (Fault::EditedFile, 2) => "a client on the file with a server added",
            (Fault::EditedFile, 3) => "a client on the file with this server renamed",
            (Fault::EditedFile, _) => "a client on the file with the increment raised",
            (Fault::GuardReplaced, _) => {
                "the guard dropped, the row set back, the guard put back by tickets init"
            }
        }
    }
}

impl Kind for Fault {
    fn variants(self) -> usize {
        match self {
            Fault::Lowered => 3,
            Fault::PeerDown | Fault::PeerBackup | Fault::Reshape | Fault::Failover => 2,
            Fault::EditedFile => 5,
            _ => 1,
        }
    }
}

/// One step of the schedule.
pub type Step = Drawn<Fault>;

/// The seeded schedule.
fn schedule(o: &TicketsOptions) -> Vec<Step> {
    let spacing = o.run.spacing.max(Duration::from_secs(2));
    schedule::draw(
        o.run.seed,
        &o.kinds,
        &Ranges {
            run: Duration::from_secs(o.run.seconds),
            spacing,
            targets: MAX_SERVERS,
            backups: KEPT,
            pause: (Duration::from_millis(200), spacing / 2),
        },
    )
}

/// A server of the fleet: its name and offset in the file.
struct Member {
    name: String,
    offset: u64,
    server: Server,
}

/// One backup of a server: when, and three dumps of it.
struct Backup {
    taken_ms: u32,
    /// The whole `app` database (what `mariadb-dump` gives by default).
    full: Vec<u8>,
    /// The counters' tables only (recreated, with their triggers).
    counters: Vec<u8>,
    /// The counters' rows only, as `REPLACE` (what loads in place).
    rows: Vec<u8>,
}

/// The counters' tables of database `app`: the segment rows and the
/// per-id tables.
fn counter_tables(server: &Server) -> anyhow::Result<Vec<String>> {
    let tables = sql(
        server,
        "SELECT GROUP_CONCAT(TABLE_NAME SEPARATOR ' ') FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'app' AND (TABLE_NAME = 'shardflake_ticket_segments' OR TABLE_NAME LIKE 'tickets\\_%')",
    )?;
    Ok(tables.split_whitespace().map(str::to_string).collect())
}

fn backup(server: &Server, taken_ms: u32) -> anyhow::Result<Backup> {
    let tables = counter_tables(server)?;
    let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
    Ok(Backup {
        taken_ms,
        full: mariadb_dump(server, &[], &[])?,
        counters: mariadb_dump(server, &[], &tables)?,
        rows: mariadb_dump(
            server,
            &["--no-create-info", "--replace", "--skip-triggers"],
            &tables,
        )?,
    })
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
        .arg(format!("-P{}", server.port()?))
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

/// What a load refused by the tables' guard says.
const GUARD_REFUSAL: &str = "never set back in place";

/// What a live load says when a client's ticket went into a per-id table
/// between the dump's `CREATE TABLE` and its rows.
const STUB_TAKEN: &str = "for key 'stub'";

/// Loads `dump` into the running server: what happened, in words. A load
/// the tables' guard refuses is an outcome; a load a client's ticket
/// aborted halfway is loaded again, as an operator would (at most three
/// tries; the ids are judged as ever); any other failure an error.
fn load_or_refused(server: &Server, dump: &[u8]) -> anyhow::Result<&'static str> {
    for _ in 0..3 {
        match server.load(dump) {
            Ok(()) => return Ok("loaded"),
            Err(e) if format!("{e:#}").contains(GUARD_REFUSAL) => {
                return Ok("refused by the tables' guard");
            }
            Err(e) if format!("{e:#}").contains(STUB_TAKEN) => {
                println!("  load aborted by a client's ticket (1062 on stub): loading again");
            }
            Err(e) => return Err(e),
        }
    }
    bail!("the load was aborted three times by clients' tickets (1062 on stub)")
}

/// Runs `sql` on the server with the `mariadb` client; its output, trimmed.
fn sql(server: &Server, sql: &str) -> anyhow::Result<String> {
    Ok(server.sql(sql)?.trim().to_string())
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

/// A server of a tickets file: name, URL, offset.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: String,
    url: String,
    offset: u64,
}

/// The file with these servers, increment `increment`, one 64-bit
/// sequence in the run's mode.
fn toml(entries: &[Entry], increment: u64, segment: bool) -> String {
    let mut t = format!("increment = {increment}\n");
    for e in entries {
        t += &format!(
            "\n[[servers]]\nname = \"{}\"\nkind = \"mariadb\"\nurl = \"{}\"\noffset = {}\n",
            e.name, e.url, e.offset
        );
    }
    let mode = if segment { "segment" } else { "per-id" };
    t += &format!("\n[[sequences]]\nname = \"{SEQUENCE}\"\nbits = 64\nmode = \"{mode}\"\n");
    t
}

/// `mariadb.sh start` options for a server at `offset` of `increment`
/// (the client sets both on its own sessions too).
fn server_options(increment: u64, offset: u64) -> String {
    format!("--auto-increment-increment={increment} --auto-increment-offset={offset}")
}

/// A file's servers in one line: `t1=:PORT/1 t2=:PORT/2 of 2`.
fn describe(file: &str) -> String {
    match Config::parse(file) {
        Ok(c) => {
            let servers: Vec<String> = c
                .servers
                .iter()
                .map(|s| {
                    let port = s.url.rsplit(':').next().unwrap_or("");
                    format!("{}=:{}/{}", s.name, port.trim_end_matches("/app"), s.offset)
                })
                .collect();
            format!("{} of {}", servers.join(" "), c.increment)
        }
        Err(e) => format!("(refused: {e})"),
    }
}

struct Shared {
    start: Instant,
    stop: AtomicBool,
    answers: Mutex<Answers>,
}

/// One client: single ids and batches of 2..=500 in a seeded mix, logged
/// per residue of the file's increment in per-id mode (one log per server
/// of its file) and as one log in segment mode, each log under the
/// client's `number` (the checker's "slot": the run prints which file
/// each number ran on); it runs until the run ends, `group` is set, or
/// `until`.
async fn client(
    config: Config,
    shared: Arc<Shared>,
    number: usize,
    seed: u64,
    segment: bool,
    group: Arc<AtomicBool>,
    until: Option<Instant>,
) -> ClientLog {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = ClientLog::default();
    let increment = config.increment.max(1);
    let client = match TicketClient::connect(config).await {
        Ok(c) => c,
        Err(e) => {
            out.error(format!("connect:{}", e.code()));
            return out;
        }
    };
    // Ticket numbers: every bit may differ within a run of consecutive ids.
    let mut logs: Vec<ConnLog> = (0..if segment { 1 } else { increment })
        .map(|_| ConnLog::new(number, 0, Protocol::Tickets, u64::MAX))
        .collect();
    while !shared.stop.load(Ordering::Relaxed)
        && !group.load(Ordering::Relaxed)
        && until.is_none_or(|t| Instant::now() < t)
    {
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
                        // A server's ids are the residue class of its offset.
                        logs[(id % increment) as usize].record(&[id], at);
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
                // A caller backs off before it asks again; a refusal comes
                // back at once, and the loop would only spin and log.
                tokio::time::sleep(ERROR_BACKOFF).await;
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

/// A run under way: the fleet as it is now, its backups, the clients.
struct Fleet<'a> {
    o: &'a TicketsOptions,
    dir: &'a Path,
    rt: tokio::runtime::Runtime,
    shared: Arc<Shared>,
    members: Vec<Member>,
    /// Every server's last [`KEPT`] backups by name, newest first.
    backups: HashMap<String, VecDeque<Backup>>,
    /// The file every main client runs on now.
    file: String,
    /// Set to stop the main clients of `file`.
    group: Arc<AtomicBool>,
    clients: Vec<JoinHandle<ClientLog>>,
    /// Server names given so far (`t1`, `t2`, ...).
    named: usize,
    /// Server processes started.
    processes: u32,
    /// Clients started (their seeds).
    started: u64,
    /// When the last `tickets reshape` succeeded (ms from the start; 0:
    /// none yet). A backup taken before it brings the old lattice back.
    reshaped_ms: u32,
}

impl Fleet<'_> {
    fn entries(&self) -> Vec<Entry> {
        self.members
            .iter()
            .map(|m| Entry {
                name: m.name.clone(),
                url: m.server.url.clone(),
                offset: m.offset,
            })
            .collect()
    }

    fn increment(&self) -> u64 {
        self.members.len() as u64
    }

    fn new_name(&mut self) -> String {
        self.named += 1;
        format!("t{}", self.named)
    }

    fn start_server(&mut self, increment: u64, offset: u64) -> anyhow::Result<Server> {
        self.processes += 1;
        Server::start(&self.o.run.script, &server_options(increment, offset), None)
    }

    /// Runs `shardflake tickets SUBCOMMAND` on `file`: `Ok(None)` when it
    /// succeeded, `Ok(Some(why))` when it refused.
    fn tool(&self, subcommand: &str, file: &str) -> anyhow::Result<Option<String>> {
        let path = self.dir.join(format!("tickets-{subcommand}.toml"));
        std::fs::write(&path, file)?;
        let out = Command::new(&self.o.run.bin)
            .args(["tickets", subcommand, "--config"])
            .arg(&path)
            .output()
            .with_context(|| format!("running shardflake tickets {subcommand}"))?;
        if out.status.success() {
            return Ok(None);
        }
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(Some(said.trim().replace('\n', " | ")))
    }

    /// Starts a client on `file` until `group` is set or `until`.
    fn spawn(&mut self, file: &str, group: Arc<AtomicBool>, until: Option<Instant>) {
        self.started += 1;
        let seed = self.o.run.seed.wrapping_add(self.started);
        match Config::parse(file) {
            Ok(config) => self.clients.push(self.rt.spawn(client(
                config,
                self.shared.clone(),
                self.started as usize,
                seed,
                self.o.segment,
                group,
                until,
            ))),
            // An edited file the library refuses to parse: a refusal too.
            Err(e) => {
                tracing::warn!(error = %e, "an edited tickets file was refused");
                let mut log = ClientLog::default();
                log.error("connect:bad_config".into());
                self.clients.push(self.rt.spawn(async move { log }));
            }
        }
    }

    /// Every main client switched to `file`: the new ones started, the
    /// flag that stops the old ones returned (not set).
    fn switch(&mut self, file: String) -> Arc<AtomicBool> {
        let group = Arc::new(AtomicBool::new(false));
        let first = self.started + 1;
        for _ in 0..self.o.run.clients {
            self.spawn(&file, group.clone(), None);
        }
        println!(
            "+{:.1} s: clients {first}..={} on the file {}",
            f64::from(ms_since(self.shared.start)) / 1000.0,
            self.started,
            describe(&file)
        );
        self.file = file;
        std::mem::replace(&mut self.group, group)
    }

    /// A client on `file` for `pause`, the fault thread waiting meanwhile.
    fn edited_client(&mut self, file: &str, pause: Duration) {
        self.spawn(
            file,
            Arc::new(AtomicBool::new(false)),
            Some(Instant::now() + pause),
        );
        println!(
            "+{:.1} s: client {} on the file {}",
            f64::from(ms_since(self.shared.start)) / 1000.0,
            self.started,
            describe(file)
        );
        std::thread::sleep(pause);
    }

    /// Backup `k` of server `name` (0 the newest; the oldest kept when
    /// fewer are), and how old it is.
    fn backup(&self, name: &str, k: usize) -> anyhow::Result<(&Backup, u32)> {
        let kept = self
            .backups
            .get(name)
            .filter(|b| !b.is_empty())
            .with_context(|| format!("no backup of {name}"))?;
        let b = &kept[k.min(kept.len() - 1)];
        Ok((b, ms_since(self.shared.start).saturating_sub(b.taken_ms)))
    }

    /// A new backup of every server, the oldest beyond [`KEPT`] dropped.
    fn back_up(&mut self) -> Vec<String> {
        let now = ms_since(self.shared.start);
        let mut failed = Vec::new();
        for m in &self.members {
            match backup(&m.server, now) {
                Ok(b) => {
                    let kept = self.backups.entry(m.name.clone()).or_default();
                    kept.push_front(b);
                    kept.truncate(KEPT);
                }
                Err(e) => failed.push(format!("backup of {} at +{now} ms: {e:#}", m.name)),
            }
        }
        failed
    }

    /// Does `step` to the fleet: what happened, in words. A server given
    /// back its own backup of before the last reshape records the old
    /// lattice again and refuses every client of the current file: the
    /// operator then runs that reshape again with the current file, as
    /// tickets-restores.md says.
    fn fault(&mut self, step: &Step) -> anyhow::Result<String> {
        let restores_own_backup = match step.kind {
            Fault::RestoreLive | Fault::RestoreStopped | Fault::PeerDown => true,
            Fault::Failover => step.variant == 0,
            _ => false,
        };
        let before_reshape = restores_own_backup && {
            let name = &self.members[step.target % self.members.len()].name;
            self.backup(name, step.backup)
                .is_ok_and(|(b, _)| b.taken_ms < self.reshaped_ms)
        };
        let said = self.fault_only(step)?;
        if !before_reshape {
            return Ok(said);
        }
        let again = self.tool("reshape", &self.file.clone())?;
        Ok(format!(
            "{said}; the backup predates the reshape at +{:.1} s: tickets reshape with the current file: {}",
            f64::from(self.reshaped_ms) / 1000.0,
            again.as_deref().unwrap_or("ok")
        ))
    }

    /// [`Self::fault`] without the operator's step after it.
    fn fault_only(&mut self, step: &Step) -> anyhow::Result<String> {
        let t = step.target % self.members.len();
        let name = self.members[t].name.clone();
        let peer = (t + 1) % self.members.len();
        let backup_of = |fleet: &Self, of: &str| -> anyhow::Result<String> {
            let (_, age) = fleet.backup(of, step.backup)?;
            Ok(format!(
                "{of}'s backup of {:.1} s ago",
                f64::from(age) / 1000.0
            ))
        };
        Ok(match step.kind {
            Fault::Kill => {
                let s = &self.members[t].server;
                s.kill()?;
                std::thread::sleep(step.pause);
                s.restart()?;
                self.processes += 1;
                format!("{name} killed and restarted")
            }
            Fault::Stop => {
                let pid = pid(&self.members[t].server)?;
                signal(&pid, "STOP")?;
                std::thread::sleep(step.pause);
                signal(&pid, "CONT")?;
                format!("{name} stopped and continued")
            }
            Fault::RestoreLive => {
                let said = backup_of(self, &name)?;
                let (b, _) = self.backup(&name, step.backup)?;
                let done = load_or_refused(&self.members[t].server, &b.full)?;
                format!("{said} into the running {name}: {done}")
            }
            Fault::RestoreStopped => {
                let said = backup_of(self, &name)?;
                let s = &self.members[t].server;
                s.kill()?;
                s.restart()?;
                self.processes += 1;
                let (b, _) = self.backup(&name, step.backup)?;
                let done = load_or_refused(&self.members[t].server, &b.full)?;
                format!("{name} killed, restarted, {said} loaded: {done}")
            }
            Fault::Lowered => self.lowered(t, step)?,
            Fault::GuardReplaced => self.guard_replaced(t, step.pause)?,
            Fault::SkipTriggers => {
                let s = &self.members[t].server;
                let tables = counter_tables(s)?;
                let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
                let dump = mariadb_dump(s, &["--skip-triggers"], &tables)?;
                std::thread::sleep(step.pause);
                let done = load_or_refused(s, &dump)?;
                let init = self.tool("init", &self.file.clone())?;
                format!(
                    "{name}: a --skip-triggers dump of {:.1} s ago {done}; tickets init: {}",
                    step.pause.as_secs_f64(),
                    init.as_deref().unwrap_or("ok")
                )
            }
            Fault::PeerDown => {
                let said = backup_of(self, &name)?;
                let stop = step.variant == 1;
                let peers: Vec<usize> = (0..self.members.len()).filter(|i| *i != t).collect();
                // Read before any is stopped: a stopped server answers nothing.
                let pids = peers
                    .iter()
                    .map(|i| pid(&self.members[*i].server))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                for (i, pid) in peers.iter().zip(&pids) {
                    if stop {
                        signal(pid, "STOP")?;
                    } else {
                        self.members[*i].server.kill()?;
                    }
                }
                let (b, _) = self.backup(&name, step.backup)?;
                let done = load_or_refused(&self.members[t].server, &b.full);
                std::thread::sleep(step.pause);
                for (i, pid) in peers.iter().zip(&pids) {
                    if stop {
                        signal(pid, "CONT")?;
                    } else {
                        self.members[*i].server.restart()?;
                        self.processes += 1;
                    }
                }
                format!(
                    "every peer of {name} {}; {said} loaded: {}",
                    if stop { "stopped" } else { "killed" },
                    done?
                )
            }
            Fault::PeerBackup => {
                let other = self.members[peer].name.clone();
                let said = backup_of(self, &other)?;
                let (b, _) = self.backup(&other, step.backup)?;
                let dump = if step.variant == 0 {
                    &b.counters
                } else {
                    &b.rows
                };
                let done = load_or_refused(&self.members[t].server, dump)?;
                format!("{said} loaded into {name}: {done}")
            }
            Fault::ReplacedNewName => self.replaced(t)?,
            Fault::Reshape => self.reshape(t, peer, step)?,
            Fault::Failover => self.failover(t, step)?,
            Fault::EditedFile => {
                let mut e = self.entries();
                let mut increment = self.increment();
                let unused;
                match step.variant {
                    0 => (e[t].offset, e[peer].offset) = (e[peer].offset, e[t].offset),
                    1 => {
                        e.remove(t);
                        for (i, x) in e.iter_mut().enumerate() {
                            x.offset = i as u64 + 1;
                        }
                        increment -= 1;
                    }
                    2 => {
                        unused = format!("mysql://root@127.0.0.1:{}/app", free_port()?);
                        increment += 1;
                        e.push(Entry {
                            name: "extra".into(),
                            url: unused,
                            offset: increment,
                        });
                    }
                    3 => e[t].name = format!("{name}x"),
                    _ => increment += 1,
                }
                let file = toml(&e, increment, self.o.segment);
                self.edited_client(&file, step.pause);
                format!(
                    "a client on an edited file ({})",
                    step.kind.describe(step.variant)
                )
            }
        })
    }

    /// [`Fault::Lowered`] on member `t`.
    fn lowered(&mut self, t: usize, step: &Step) -> anyhow::Result<String> {
        let name = self.members[t].name.clone();
        let table = format!("tickets_{SEQUENCE}");
        let segments = "shardflake_ticket_segments";
        let s = &self.members[t].server;
        let statement = |sql_text: &str| -> anyhow::Result<&'static str> {
            match sql(s, sql_text) {
                Ok(_) => Ok("done"),
                Err(e) if format!("{e:#}").contains(GUARD_REFUSAL) => {
                    Ok("refused by the tables' guard")
                }
                Err(e) => Err(e),
            }
        };
        Ok(match (step.variant, self.o.segment) {
            (0, _) => {
                let (b, age) = self.backup(&name, step.backup)?;
                let done = load_or_refused(s, &b.rows)?;
                format!(
                    "{name}: the counters' rows of {:.1} s ago loaded in place: {done}",
                    f64::from(age) / 1000.0
                )
            }
            (1, false) => {
                let done = statement(&format!("ALTER TABLE {table} AUTO_INCREMENT = 1"))?;
                format!("{name}: ALTER TABLE {table} AUTO_INCREMENT = 1: {done}")
            }
            (1, true) => {
                let done = statement(&format!(
                    "UPDATE {segments} SET max_id = max_id DIV 2 WHERE sequence_name = '{SEQUENCE}'"
                ))?;
                format!("{name}: its segment row halved by UPDATE: {done}")
            }
            (_, false) => {
                let done = statement(&format!(
                    "DELETE FROM {table}; ALTER TABLE {table} AUTO_INCREMENT = 1"
                ))?;
                format!("{name}: {table} emptied, then AUTO_INCREMENT = 1: {done}")
            }
            (_, true) => {
                let (b, age) = self.backup(&name, step.backup)?;
                let deleted = statement(&format!(
                    "DELETE FROM {segments} WHERE sequence_name = '{SEQUENCE}'"
                ))?;
                let done = load_or_refused(s, &b.rows)?;
                format!(
                    "{name}: its segment row deleted ({deleted}), the row of {:.1} s ago loaded: {done}",
                    f64::from(age) / 1000.0
                )
            }
        })
    }

    /// [`Fault::GuardReplaced`] on member `t`, the row set back to where
    /// it was `pause` before (segment) or about halved (per id).
    fn guard_replaced(&mut self, t: usize, pause: Duration) -> anyhow::Result<String> {
        let name = self.members[t].name.clone();
        let (table, row, column, key) = match self.o.segment {
            true => (
                "shardflake_ticket_segments".to_string(),
                "max_id",
                "max_id",
                format!("sequence_name = '{SEQUENCE}'"),
            ),
            false => (
                format!("tickets_{SEQUENCE}"),
                "id",
                "id",
                "stub = 'a'".to_string(),
            ),
        };
        let increment = self.increment();
        let s = &self.members[t].server;
        let before = sql(s, &format!("SELECT {row} FROM {table} WHERE {key}"))?;
        std::thread::sleep(pause);
        let triggers = sql(
            s,
            &format!(
                "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = '{table}'"
            ),
        )?;
        for trigger in triggers.split_whitespace() {
            sql(s, &format!("DROP TRIGGER {trigger}"))?;
        }
        let set = match self.o.segment {
            // Where it was: on the server's lattice.
            true => before,
            // About halved, in the server's residue class.
            false => format!("{column} - {increment} * ({column} DIV {})", 2 * increment),
        };
        let now = sql(
            s,
            &format!(
                "UPDATE {table} SET {column} = {set} WHERE {key}; SELECT {row} FROM {table} WHERE {key}"
            ),
        )?;
        let init = self.tool("init", &self.file.clone())?;
        Ok(format!(
            "{name}: the guard of {table} dropped, its row set back to {now}, tickets init: {}",
            init.as_deref().unwrap_or("ok")
        ))
    }

    /// [`Fault::ReplacedNewName`] on member `t`.
    fn replaced(&mut self, t: usize) -> anyhow::Result<String> {
        let old = self.members[t].name.clone();
        self.members[t].server.kill()?;
        let offset = self.members[t].offset;
        let server = self.start_server(self.increment(), offset)?;
        let name = self.new_name();
        let dead = std::mem::replace(
            &mut self.members[t],
            Member {
                name: name.clone(),
                offset,
                server,
            },
        );
        drop(dead);
        let file = toml(&self.entries(), self.increment(), self.o.segment);
        let init = self.tool("init", &file)?;
        let old_group = self.switch(file);
        old_group.store(true, Ordering::SeqCst);
        Ok(format!(
            "{old} dead, replaced by an empty server named {name}; tickets init: {}; every client switched",
            init.as_deref().unwrap_or("ok")
        ))
    }

    /// [`Fault::Reshape`] on member `t` (and `peer`).
    fn reshape(&mut self, t: usize, peer: usize, step: &Step) -> anyhow::Result<String> {
        let mut e = self.entries();
        let mut added = None;
        let mut removed = None;
        let what;
        if step.variant == 0 || self.o.pair {
            (e[t].offset, e[peer].offset) = (e[peer].offset, e[t].offset);
            what = format!("offsets of {} and {} swapped", e[t].name, e[peer].name);
        } else if self.members.len() < MAX_SERVERS {
            let increment = self.increment() + 1;
            let server = self.start_server(increment, increment)?;
            let name = self.new_name();
            e.push(Entry {
                name: name.clone(),
                url: server.url.clone(),
                offset: increment,
            });
            added = Some(Member {
                name: name.clone(),
                offset: increment,
                server,
            });
            what = format!("{name} added");
        } else {
            what = format!("{} removed", e[t].name);
            e.remove(t);
            removed = Some(t);
        }
        if removed.is_some() || added.is_some() {
            for (i, x) in e.iter_mut().enumerate() {
                x.offset = i as u64 + 1;
            }
        }
        let file = toml(&e, e.len() as u64, self.o.segment);
        // A new server's tables (init refuses the others' changed lattice).
        let init = match added {
            Some(_) => self.tool("init", &file)?,
            None => None,
        };
        if let Some(why) = self.tool("reshape", &file)? {
            return Ok(format!(
                "reshape ({what}) refused: {why}; init: {}",
                init.as_deref().unwrap_or("ok")
            ));
        }
        // The fleet as the new file has it; a removed server is stopped
        // only once the old clients, which still use it, are.
        let gone = removed.map(|i| self.members.remove(i));
        if let Some(m) = added {
            self.members.push(m);
        }
        for (m, x) in self.members.iter_mut().zip(&e) {
            m.offset = x.offset;
        }
        self.reshaped_ms = ms_since(self.shared.start);
        let old_group = self.switch(file);
        std::thread::sleep(step.pause);
        old_group.store(true, Ordering::SeqCst);
        drop(gone);
        Ok(format!(
            "reshape: {what}; the old clients ran {:.1} s more",
            step.pause.as_secs_f64()
        ))
    }

    /// [`Fault::Failover`] on member `t`.
    fn failover(&mut self, t: usize, step: &Step) -> anyhow::Result<String> {
        let name = self.members[t].name.clone();
        let (copy, from) = if step.variant == 0 {
            let (b, age) = self.backup(&name, step.backup)?;
            let full = b.full.clone();
            let copy = self.start_server(self.increment(), self.members[t].offset)?;
            copy.load(&full)?;
            (
                copy,
                format!(
                    "a copy from its backup of {:.1} s ago",
                    f64::from(age) / 1000.0
                ),
            )
        } else {
            let snapshot = self.members[t].server.snapshot()?;
            std::thread::sleep(step.pause);
            self.processes += 1;
            let copy = self.members[t].server.start_copy(&snapshot)?;
            (
                copy,
                format!(
                    "a copy of its data directory of {:.1} s ago",
                    step.pause.as_secs_f64()
                ),
            )
        };
        let old_file = self.file.clone();
        self.members[t].server.kill()?;
        let old = std::mem::replace(&mut self.members[t].server, copy);
        let file = toml(&self.entries(), self.increment(), self.o.segment);
        let old_group = self.switch(file);
        old_group.store(true, Ordering::SeqCst);
        // The old server back, a client still on the old file beside it.
        old.restart()?;
        self.processes += 1;
        self.edited_client(&old_file, step.pause);
        drop(old);
        Ok(format!(
            "{name} failed over to {from}; the old {name} restarted with a client on the old file for {:.1} s",
            step.pause.as_secs_f64()
        ))
    }
}

fn run_in(o: &TicketsOptions, dir: &Path) -> anyhow::Result<bool> {
    let plan = schedule(o);
    println!(
        "seed {}; kinds {}; schedule (server #k is the k-th server, modulo the servers then):",
        o.run.seed,
        o.kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(",")
    );
    for step in &plan {
        let backup = if step.kind.uses_backup(step.variant) {
            format!(", backup {}", step.backup)
        } else {
            String::new()
        };
        println!(
            "  +{:.1} s server #{}: {} ({:.1} s{backup})",
            step.at.as_secs_f64(),
            step.target,
            step.kind.describe(step.variant),
            step.pause.as_secs_f64()
        );
    }
    let members = (1..=2)
        .map(|offset| {
            Ok(Member {
                name: format!("t{offset}"),
                offset,
                server: Server::start(&o.run.script, &server_options(2, offset), None)?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut fleet = Fleet {
        o,
        dir,
        rt,
        shared: Arc::new(Shared {
            start: Instant::now(),
            stop: AtomicBool::new(false),
            answers: Mutex::new(Answers::default()),
        }),
        members,
        backups: HashMap::new(),
        file: String::new(),
        group: Arc::new(AtomicBool::new(false)),
        clients: Vec::new(),
        named: 2,
        processes: 2,
        started: 0,
        reshaped_ms: 0,
    };
    let file = toml(&fleet.entries(), 2, o.segment);
    if let Some(why) = fleet.tool("init", &file)? {
        bail!("shardflake tickets init: {why}");
    }
    let mut incidents = fleet.back_up();
    // The load, and the schedule's clock, begin with the first backups in hand.
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        answers: Mutex::new(Answers::default()),
    });
    fleet.shared = shared.clone();
    for b in fleet.backups.values_mut().flatten() {
        b.taken_ms = 0;
    }
    let load_start_unix_ms = check::unix_ms_now();
    fleet.switch(file);

    for step in &plan {
        sleep_until(shared.start + step.at);
        let result = fleet.fault(step);
        let when = ms_since(shared.start);
        match result {
            Ok(said) => println!(
                "+{:.1} s {}: {said}",
                f64::from(when) / 1000.0,
                step.kind.name()
            ),
            Err(e) => incidents.push(format!("{} at +{when} ms: {e:#}", step.kind.name())),
        }
        incidents.extend(fleet.back_up());
    }
    let faults_over_ms = u64::from(ms_since(shared.start));
    // Slow faults (a server started, a dump loaded) may run past the
    // planned end: the load goes on a spacing after the last, so that it
    // is seen to come back.
    sleep_until(
        (shared.start + Duration::from_secs(o.run.seconds)).max(Instant::now() + o.run.spacing),
    );
    shared.stop.store(true, Ordering::SeqCst);
    let end_ms = u64::from(ms_since(shared.start));
    let mut all = ClientLog::default();
    for c in std::mem::take(&mut fleet.clients) {
        all.merge(fleet.rt.block_on(c)?);
    }
    let servers = fleet.processes;
    drop(fleet);
    Outcome {
        name: format!(
            "tickets ({}, {})",
            if o.segment { "segment" } else { "per-id" },
            if o.pair {
                "exactly 2 servers"
            } else {
                "2 or more servers"
            }
        ),
        processes: servers,
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

    fn options(seed: u64, kinds: &[Fault]) -> TicketsOptions {
        TicketsOptions {
            run: ServerRun {
                seconds: 300,
                seed,
                clients: 8,
                bin: "shardflake".into(),
                script: "scripts/mariadb.sh".into(),
                spacing: Duration::from_secs(6),
                out: None,
            },
            segment: true,
            kinds: kinds.to_vec(),
            pair: false,
        }
    }

    #[test]
    fn the_schedule_is_seeded_and_draws_every_kind_and_variant() {
        let a = schedule(&options(3, &Fault::ALL));
        assert_eq!(a, schedule(&options(3, &Fault::ALL)));
        assert_ne!(a, schedule(&options(4, &Fault::ALL)));
        let long: Vec<Step> = (0..4)
            .flat_map(|seed| schedule(&options(seed, &Fault::ALL)))
            .collect();
        for kind in Fault::ALL {
            for v in 0..kind.variants() {
                assert!(
                    long.iter().any(|s| s.kind == kind && s.variant == v),
                    "{kind:?} variant {v} never drawn"
                );
            }
        }
        for s in &a {
            assert!(s.target < MAX_SERVERS && s.backup < KEPT, "{s:?}");
            assert!(s.pause >= Duration::from_millis(200) && s.pause <= Duration::from_secs(3));
            assert!(s.at + Duration::from_secs(6) <= Duration::from_secs(300));
        }
    }

    #[test]
    fn kinds_are_narrowed_by_name() {
        for k in Fault::ALL {
            assert_eq!(Fault::parse(k.name()), Some(k));
        }
        assert_eq!(Fault::parse("no-such"), None);
        let only = schedule(&options(1, &[Fault::Failover, Fault::Kill]));
        assert!(!only.is_empty());
        assert!(
            only.iter()
                .all(|s| matches!(s.kind, Fault::Failover | Fault::Kill))
        );
    }

    #[test]
    fn an_edited_file_names_its_servers_and_offsets() {
        let e = [
            Entry {
                name: "t1".into(),
                url: "mysql://root@127.0.0.1:1/app".into(),
                offset: 2,
            },
            Entry {
                name: "t3".into(),
                url: "mysql://root@127.0.0.1:2/app".into(),
                offset: 1,
            },
        ];
        let config = Config::parse(&toml(&e, 2, false)).expect("a valid file");
        assert_eq!(config.increment, 2);
        assert_eq!(config.servers[1].name, "t3");
        assert_eq!(config.servers[0].offset, 2);
    }
}
