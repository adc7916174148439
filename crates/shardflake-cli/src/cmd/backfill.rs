//! `shardflake gen --at TIME` and `gen --times FILE`: ids for rows from the
//! past through [`shardflake::Backfill`], with its per-tick counters kept in
//! a state file so that a second run never repeats the first one's ids.
//!
//! The state file (`--backfill-state`, default `./shardflake-backfill.state`)
//! names the layout and node values it was written for, then one line per
//! tick used: `TICK NEXT_SEQUENCE`. A run reads it, makes every id in
//! memory (refusing the whole input if one row is refused: nothing is
//! issued), writes the new state (a temporary file, synced, renamed over
//! the old one) and only then prints the ids. A run stopped after the write
//! and before the printing loses those ids, never repeats them.
//!
//! Two runs on one state file at once are refused: each holds an exclusive
//! lock on `STATE.lock` (`flock`, released when the process ends).

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use shardflake::timestamp::parse_time;
use shardflake::{Backfill, Clock, Format, Id, Layout, NodeBits, SystemClock};

const HEADER: &str = "shardflake backfill state v1";

/// A backfill's state file, locked for as long as this value lives.
pub struct State {
    path: PathBuf,
    _lock: File,
}

impl State {
    /// Locks `path` for this process, or says who holds it.
    pub fn lock(path: &Path) -> anyhow::Result<State> {
        let lock_path = with_suffix(path, ".lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .with_context(|| format!("opening {}", lock_path.display()))?;
        if lock.try_lock().is_err() {
            bail!(
                "another backfill is running on {} (it holds {}): wait for it to end, or run this one on another reserved node id with its own --backfill-state",
                path.display(),
                lock_path.display()
            );
        }
        Ok(State {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    /// A backfill for `layout` and `nodes` at `now_ms`, with the counters
    /// of every earlier run on this file.
    pub fn load(&self, layout: &Layout, nodes: NodeBits, now_ms: u64) -> anyhow::Result<Backfill> {
        let mut backfill = Backfill::new(layout.clone(), nodes, now_ms);
        let file = match File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(backfill),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.path.display())),
        };
        let mut lines = BufReader::new(file).lines();
        let mut header =
            || -> anyhow::Result<String> { Ok(lines.next().transpose()?.unwrap_or_default()) };
        let (version, layout_line, nodes_line) = (header()?, header()?, header()?);
        let expected = (format!("layout {layout}"), format!("nodes {}", nodes.get()));
        if version != HEADER
            || (layout_line.as_str(), nodes_line.as_str())
                != (expected.0.as_str(), expected.1.as_str())
        {
            bail!(
                "{} is the state of another backfill ({layout_line:?}, {nodes_line:?}); this one is {:?}, {:?}: give it its own --backfill-state",
                self.path.display(),
                expected.0,
                expected.1
            );
        }
        for (n, line) in lines.enumerate() {
            let line = line.with_context(|| format!("reading {}", self.path.display()))?;
            let counter = line
                .split_once(' ')
                .and_then(|(t, s)| Some((t.parse().ok()?, s.parse().ok()?)));
            let Some((tick, next)) = counter else {
                bail!(
                    "{} line {}: {line:?} is not \"TICK NEXT\"; the file is damaged: restore it from a copy (without it a backfill would repeat ids)",
                    self.path.display(),
                    n + 4
                );
            };
            backfill.restore(tick, next)?;
        }
        Ok(backfill)
    }

    /// Writes `backfill`'s counters: a synced temporary file renamed over
    /// the state, so a crash leaves the old state or the new one.
    pub fn save(&self, backfill: &Backfill) -> anyhow::Result<()> {
        let tmp = with_suffix(&self.path, ".tmp");
        let write = || -> std::io::Result<()> {
            let mut out = std::io::BufWriter::new(File::create(&tmp)?);
            writeln!(out, "{HEADER}")?;
            writeln!(out, "layout {}", backfill.layout())?;
            writeln!(out, "nodes {}", backfill.nodes().get())?;
            let mut used: Vec<(u64, u64)> = backfill.used().collect();
            used.sort_unstable();
            for (tick, next) in used {
                writeln!(out, "{tick} {next}")?;
            }
            out.into_inner()?.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty());
            File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
        };
        write().with_context(|| format!("writing {}", self.path.display()))
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Where the rows' times come from.
pub enum Times<'a> {
    /// `--at TIME`, `count` ids.
    At(&'a str, u64),
    /// `--times FILE` (`-`: stdin), one time per line.
    File(&'a Path),
}

/// Makes the ids, saves the state, then prints them one per line.
pub fn run(
    layout: &Layout,
    nodes: NodeBits,
    state: &Path,
    times: Times<'_>,
    format: Format,
) -> anyhow::Result<()> {
    let state = State::lock(state)?;
    let now = SystemClock.now_ms_precise();
    let mut backfill = state.load(layout, nodes, now)?;
    let mut ids = Vec::new();
    let mut issue = |text: &str, line: Option<usize>| -> anyhow::Result<()> {
        let at = |l: Option<usize>| l.map(|l| format!("line {l}: ")).unwrap_or_default();
        let Some(t) = parse_time(text, now) else {
            bail!(
                "{}{text:?} is not a time: use RFC 3339, Unix ms, or -7d / now-1h; nothing was issued",
                at(line)
            );
        };
        let id: Id = backfill
            .id_at(t)
            .with_context(|| format!("{}{text:?}; nothing was issued", at(line)))?;
        ids.push(id);
        Ok(())
    };
    match times {
        Times::At(text, count) => {
            for _ in 0..count {
                issue(text, None)?;
            }
        }
        Times::File(path) => {
            let reader: Box<dyn BufRead> = if path == Path::new("-") {
                Box::new(std::io::stdin().lock())
            } else {
                let file =
                    File::open(path).with_context(|| format!("reading {}", path.display()))?;
                Box::new(BufReader::new(file))
            };
            for (n, line) in reader.lines().enumerate() {
                let line = line.with_context(|| format!("reading {}", path.display()))?;
                issue(&line, Some(n + 1))?;
            }
        }
    }
    state.save(&backfill)?;
    tracing::debug!(ids = ids.len(), state = %state.path.display(), "backfill state saved");
    super::with_stdout(|out| {
        for id in ids {
            writeln!(out, "{}", format.format(id))?;
        }
        Ok(())
    })
}
