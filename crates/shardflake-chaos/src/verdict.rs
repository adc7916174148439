//! What the `db` and `tickets` runs share around the checker: their run
//! directory, the clients' logs gathered, and the one-slot verdict.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use shardflake::Layout;

use crate::check::{self, RunFacts, SlotFacts};
use crate::load::Answers;
use crate::record::ConnLog;

/// What a `db` or `tickets` run does.
#[derive(Debug, Clone)]
pub struct ServerRun {
    /// Length of the load, seconds.
    pub seconds: u64,
    /// Seed of the schedule and the request mix.
    pub seed: u64,
    /// Clients, each with its own connections.
    pub clients: usize,
    /// The shardflake binary (`mysql apply`, `tickets init`).
    pub bin: PathBuf,
    /// `scripts/mariadb.sh`.
    pub script: PathBuf,
    /// Time between two faults.
    pub spacing: Duration,
    /// Where the report goes (a temporary directory when `None`).
    pub out: Option<PathBuf>,
}

/// Runs `f` in `out`, or in a temporary directory removed afterwards.
pub fn in_dir(
    out: Option<&Path>,
    name: &str,
    f: impl FnOnce(&Path) -> anyhow::Result<bool>,
) -> anyhow::Result<bool> {
    let dir = out.map_or_else(
        || std::env::temp_dir().join(format!("shardflake-chaos-{name}.{}", std::process::id())),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir)?;
    let result = f(&dir);
    if out.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// What every client of a run brought back: its connection logs and its
/// errors by code.
#[derive(Debug, Default)]
pub struct ClientLog {
    /// One log per connection (or per server, for per-id tickets).
    pub logs: Vec<ConnLog>,
    /// Errors by code.
    pub errors: BTreeMap<String, u64>,
}

impl ClientLog {
    /// Counts one error.
    pub fn error(&mut self, code: String) {
        *self.errors.entry(code).or_default() += 1;
    }

    /// Adds `other`'s logs and errors to these.
    pub fn merge(&mut self, other: ClientLog) {
        self.logs.extend(other.logs);
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
    }
}

/// One slot's run, ready to judge.
pub struct Outcome<'a> {
    /// The slot's name in the table.
    pub name: String,
    /// Server processes started.
    pub processes: u32,
    /// Every client's logs and errors.
    pub clients: ClientLog,
    /// Things that went wrong outside the ids.
    pub incidents: Vec<String>,
    /// Successful answers, for the outage and "came back".
    pub answers: &'a Mutex<Answers>,
    /// Unix ms when the load began.
    pub load_start_unix_ms: u64,
    /// Ms since load start when the last fault was over, and when the load ended.
    pub faults_over_ms: u64,
    /// When the load ended.
    pub end_ms: u64,
}

impl Outcome<'_> {
    /// Checks every id (`layout`: `None` for plain numbers), prints the
    /// table and writes it to `dir/report.md`; `Ok(true)` when all passed.
    pub fn judge(mut self, layout: Option<&Layout>, dir: &Path) -> anyhow::Result<bool> {
        let answers = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .until(self.end_ms);
        let came_back = answers.any && answers.last_ms > self.faults_over_ms;
        if !came_back {
            self.incidents
                .push("no client was answered after the last fault".into());
        }
        let facts = RunFacts {
            load_start_unix_ms: self.load_start_unix_ms,
            seconds: self.end_ms as f64 / 1000.0,
            slots: vec![SlotFacts {
                name: self.name,
                spare: false,
                processes: self.processes,
                longest_outage_ms: answers.longest_gap_ms,
                longest_outage_from_ms: answers.longest_gap_from_ms,
                came_back,
            }],
            errors: self.clients.errors,
            issued: BTreeMap::new(),
            epoch_earlier_ms: BTreeMap::new(),
            incidents: self.incidents,
            fresh_state: Default::default(),
        };
        // No node field: a database server is not a node id's holder.
        let report = check::check(&self.clients.logs, layout, "", &facts);
        let passed = !report.failed() && facts.incidents.is_empty();
        let table = check::table(&report, &facts, passed);
        println!("{table}");
        std::fs::write(dir.join("report.md"), &table)?;
        Ok(passed)
    }
}
