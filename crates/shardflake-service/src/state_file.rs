//! The local state file: what this node has been and the Unix millisecond
//! before which every id it issued was stamped, so a restart resumes after
//! it and never reissues a tick, and a restart as something else (another
//! node id, layout or epoch, registry) is refused instead of trusted.
//! Written atomically (temporary file, fsync, rename, fsync of the
//! directory): a crash leaves the old value or the new one, never a torn one.
//!
//! ```text
//! shardflake-state 1
//! high_water_ms 1764100000000
//! node_id 7
//! layout snowflake(...); node id in field node
//! registry static                 (or: etcd cluster=<hex id> prefix=/p)
//! etcd_revision 1234              (leased: the highest etcd revision seen)
//! ```
//!
//! Only `high_water_ms` is required: a line left out is not compared (an
//! operator may write a file by hand, or drop a line to accept a change).
//! The first format, one line `shardflake-high-water-ms <ms>`, still reads.
//!
//! One process per file: [`StateFile::lock`] takes an exclusive `flock` on a
//! sibling `<name>.lock` (the state file itself is replaced on every write)
//! for the life of the process. Two processes sharing a file would share a
//! node id's history, and one could resume below what the other issued.
//! The lock file stays behind: a state file missing beside it was lost
//! (see [`StateLock::ran_before`]).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// What a state file records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Every id issued was stamped at or before this Unix ms.
    pub high_water_ms: u64,
    /// The node id held when it was written.
    pub node_id: Option<u64>,
    /// The layout record ([`crate::registry::Claim::layout_of`]).
    pub layout: Option<String>,
    /// `static`, or `etcd cluster=<hex> prefix=<prefix>`.
    pub registry: Option<String>,
    /// The highest etcd revision seen: etcd answering below it was
    /// restored from a snapshot.
    pub etcd_revision: Option<i64>,
}

/// One file holding one node's state (node id, layout, registry, high-water).
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

/// The first format's only line: `shardflake-high-water-ms <ms>`.
const OLD_HEADER: &str = "shardflake-high-water-ms";
const HEADER: &str = "shardflake-state 1";

impl StateFile {
    /// The file at `path` (created on first write).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateFile { path: path.into() }
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the file records; `None` when there is no file.
    pub fn read(&self) -> io::Result<Option<State>> {
        match fs::read_to_string(&self.path) {
            Ok(text) => parse(&text).map(Some).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is not a shardflake state file (want \"{HEADER}\" and a line \"high_water_ms <unix ms>\")",
                        self.path.display()
                    ),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn lock_path(&self) -> Option<PathBuf> {
        let mut name = self.path.file_name()?.to_os_string();
        name.push(".lock");
        Some(self.path.with_file_name(name))
    }

    /// Locks the file for this process (exclusive, non-blocking) until the
    /// returned guard is dropped; fails at once while another process holds it.
    pub fn lock(&self) -> io::Result<StateLock> {
        let path = self
            .lock_path()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "state file has no name"))?;
        let ran_before = path.exists();
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        // std's lock is flock(2) on Unix: it ends with the process, so a
        // crashed holder never leaves a stale lock behind.
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is in use by another shardflake process (locked: {}); give each process its own --state-file",
                        self.path.display(),
                        path.display()
                    ),
                ));
            }
            Err(fs::TryLockError::Error(err)) => return Err(err),
        }
        Ok(StateLock {
            _file: file,
            ran_before,
        })
    }

    /// Records `state` durably.
    pub fn write(&self, state: &State) -> io::Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = self
            .path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "state file has no name"))?;
        let mut tmp_name = name.to_os_string();
        tmp_name.push(".tmp");
        let tmp = dir.join(tmp_name);
        {
            let mut f = File::create(&tmp)?;
            writeln!(f, "{HEADER}\nhigh_water_ms {}", state.high_water_ms)?;
            if let Some(id) = state.node_id {
                writeln!(f, "node_id {id}")?;
            }
            if let Some(r) = state.etcd_revision {
                writeln!(f, "etcd_revision {r}")?;
            }
            for (key, value) in [("layout", &state.layout), ("registry", &state.registry)] {
                if let Some(v) = value {
                    // One line each: a value never holds a line break.
                    writeln!(f, "{key} {}", v.replace(['\n', '\r'], " "))?;
                }
            }
            f.sync_all()?;
        }
        fs::rename(&tmp, &self.path)?;
        File::open(&dir)?.sync_all()
    }
}

/// Holds a state file's lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    ran_before: bool,
}

impl StateLock {
    /// Whether a process had locked this state file before this one (the
    /// lock file was there): with no state file beside it, it was lost.
    pub fn ran_before(&self) -> bool {
        self.ran_before
    }
}

fn parse(text: &str) -> Option<State> {
    let mut lines = text.lines();
    let first = lines.next()?.trim();
    if let Some(rest) = first.strip_prefix(OLD_HEADER) {
        let ms = rest.trim().parse().ok()?;
        return lines.all(|l| l.trim().is_empty()).then_some(State {
            high_water_ms: ms,
            ..State::default()
        });
    }
    (first == HEADER).then_some(())?;
    let mut state = State::default();
    let mut high_water = None;
    for line in lines.map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        let value = value.trim();
        match key {
            "high_water_ms" => high_water = Some(value.parse().ok()?),
            "node_id" => state.node_id = Some(value.parse().ok()?),
            "layout" => state.layout = Some(value.to_string()),
            "registry" => state.registry = Some(value.to_string()),
            "etcd_revision" => state.etcd_revision = Some(value.parse().ok()?),
            _ => return None,
        }
    }
    state.high_water_ms = high_water?;
    Some(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path().join("state"));
        assert_eq!(f.read().unwrap(), None);
        assert!(!f.lock().unwrap().ran_before());
        let full = State {
            high_water_ms: 1_700_000_000_123,
            node_id: Some(7),
            layout: Some("snowflake(x); node id in field node".into()),
            registry: Some("etcd cluster=ab prefix=/p".into()),
            etcd_revision: Some(12),
        };
        f.write(&full).unwrap();
        assert_eq!(f.read().unwrap(), Some(full));
        let bare = State {
            high_water_ms: 5,
            ..State::default()
        };
        f.write(&bare).unwrap();
        assert_eq!(f.read().unwrap(), Some(bare));
        assert!(!dir.path().join("state.tmp").exists());
        // The first format still reads.
        fs::write(f.path(), "shardflake-high-water-ms 42\n").unwrap();
        assert_eq!(f.read().unwrap().unwrap().high_water_ms, 42);
        assert!(f.lock().unwrap().ran_before());
    }

    #[test]
    fn a_second_lock_fails_until_the_first_is_dropped() {
        // flock locks belong to the open file description, so two opens in
        // one process conflict just as two processes do.
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path().join("state"));
        let held = f.lock().unwrap();
        let err = f.lock().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(err.to_string().contains("in use"), "{err}");
        drop(held);
        f.lock().unwrap();
    }

    #[test]
    fn garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        fs::write(&path, "hello").unwrap();
        assert!(StateFile::new(&path).read().is_err());
    }
}
