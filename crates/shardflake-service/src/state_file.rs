//! The local state file: what this node has been and the Unix millisecond
//! before which every id it issued was stamped, so a restart resumes after
//! it and never reissues a tick, and a restart as something else (another
//! node id, layout or epoch, registry, another node's file) is refused
//! instead of trusted. Written atomically (temporary file, fsync, rename,
//! fsync of the directory): a crash leaves the old value or the new one,
//! never a torn one.
//!
//! ```text
//! shardflake-state 1
//! high_water_ms 1764100000000
//! node_id 7
//! path /var/lib/shardflake/shardflake.state   (the file it was written as)
//! layout snowflake(...); node id in field node
//! registry static                 (or: etcd cluster=<hex id> prefix=/p)
//! etcd_revision 1234              (leased: the highest etcd revision seen)
//! fleet 3f…(32 hex digits)        (leased: the fleet id `<prefix>/fleet` holds)
//! generation 1                    (leased: moves and layout changes of the fleet)
//! ```
//!
//! Only `high_water_ms` is required: a line left out is not compared (an
//! operator may write a file by hand, or drop a line to accept a change),
//! but for a static node's `path` line: the keeper refuses a static node's
//! file without it unless `--resume-after` is given (a copy with the line
//! deleted would give two static nodes one history).
//! The first format, one line `shardflake-high-water-ms <ms>`, still reads.
//! An empty file reads as no file (the lock creates one).
//!
//! One process per file, whatever path names it: [`StateFile::lock`] takes
//! an exclusive `flock` on the state file itself (its inode, so a symlink
//! or a hard link to it meets the same lock) for the life of the process,
//! and each write locks the new file before it replaces the old one, so
//! the file at the path is always locked. A hard link made before a write
//! names the replaced file, its own inode: the `path` line catches it (and
//! a copy), as a file written for another path; a static node's file must
//! have one. Two processes sharing a
//! file would share a node id's history, and one could resume below what
//! the other issued.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What a state file records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Every id issued was stamped at or before this Unix ms.
    pub high_water_ms: u64,
    /// The node id held when it was written.
    pub node_id: Option<u64>,
    /// The canonical path it was written as: read under another, it is a
    /// copy or a link of another node's file.
    pub path: Option<String>,
    /// The layout record ([`crate::registry::Claim::layout_of`]).
    pub layout: Option<String>,
    /// `static`, or `etcd cluster=<hex> prefix=<prefix>`.
    pub registry: Option<String>,
    /// The highest etcd revision seen: etcd answering below it was
    /// restored from a snapshot.
    pub etcd_revision: Option<i64>,
    /// The fleet id etcd recorded (`<prefix>/fleet`): a place holding
    /// another, or none, is not this node's fleet.
    pub fleet: Option<String>,
    /// The fleet's generation (`<prefix>/generation`, absent 0): raised by
    /// each `fleet move` and layout change. A place holding an older one
    /// is one the fleet left (an etcd restored from a snapshot taken
    /// before the move).
    pub generation: Option<u64>,
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
            // The lock creates the file: empty, nothing was recorded.
            Ok(text) if text.trim().is_empty() => Ok(None),
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

    /// Locks the file itself for this process (exclusive, non-blocking)
    /// until the returned guard is dropped; fails at once while another
    /// process holds it, under whatever path. Creates an empty file when
    /// there is none (a lock needs an inode).
    pub fn lock(&self) -> io::Result<StateLock> {
        // The file at the path may be replaced between our open and our
        // lock (its holder writing): then the lock is on a file no longer
        // there, and we try again.
        for _ in 0..100 {
            // Read-only is enough for flock; created empty when missing.
            let file = match File::open(&self.path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .append(true)
                    .open(&self.path)?,
                opened => opened?,
            };
            // std's lock is flock(2) on Unix: it ends with the process, so
            // a crashed holder never leaves a stale lock behind.
            match file.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        format!(
                            "{} is in use by another shardflake process (the file, under this path or another: a symlink or a hard link); give each process its own --state-file",
                            self.path.display(),
                        ),
                    ));
                }
                Err(fs::TryLockError::Error(err)) => return Err(err),
            }
            if same_file(&file, &self.path)? {
                let canonical = fs::canonicalize(&self.path)?;
                return Ok(StateLock {
                    file: Mutex::new(file),
                    state_file: self.clone(),
                    canonical,
                });
            }
        }
        Err(io::Error::other(format!(
            "{} kept being replaced while it was being locked: another process writes it",
            self.path.display()
        )))
    }

    /// Writes `state` to a temporary file beside the state file, locked
    /// and synced, and renames it over the state file; returns it, still
    /// locked. The directory is synced too.
    fn replace_with(&self, state: &State) -> io::Result<File> {
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
        let mut f = File::create(&tmp)?;
        writeln!(f, "{HEADER}\nhigh_water_ms {}", state.high_water_ms)?;
        if let Some(id) = state.node_id {
            writeln!(f, "node_id {id}")?;
        }
        if let Some(r) = state.etcd_revision {
            writeln!(f, "etcd_revision {r}")?;
        }
        if let Some(g) = state.generation {
            writeln!(f, "generation {g}")?;
        }
        for (key, value) in [
            ("path", &state.path),
            ("layout", &state.layout),
            ("registry", &state.registry),
            ("fleet", &state.fleet),
        ] {
            if let Some(v) = value {
                // One line each: a value never holds a line break.
                writeln!(f, "{key} {}", v.replace(['\n', '\r'], " "))?;
            }
        }
        f.sync_all()?;
        // Locked before it takes the path: the file there is always ours.
        f.try_lock().map_err(io::Error::from)?;
        fs::rename(&tmp, &self.path)?;
        File::open(&dir)?.sync_all()?;
        Ok(f)
    }
}

/// Whether `file` is the file `path` names now (device and inode).
fn same_file(file: &File, path: &Path) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let held = file.metadata()?;
    match fs::metadata(path) {
        Ok(now) => Ok(now.dev() == held.dev() && now.ino() == held.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Holds a state file's lock; released when dropped (or when the process
/// ends). Every write of the file goes through it, so that the lock moves
/// to each new file.
#[derive(Debug)]
pub struct StateLock {
    file: Mutex<File>,
    state_file: StateFile,
    canonical: PathBuf,
}

impl StateLock {
    /// The state file locked.
    pub fn state_file(&self) -> &StateFile {
        &self.state_file
    }

    /// The state file's canonical path (symlinks resolved), as the `path`
    /// line records it.
    pub fn canonical_path(&self) -> String {
        self.canonical.display().to_string()
    }

    /// Records `state` durably, with this file's canonical path, and moves
    /// the lock to the new file.
    pub fn write(&self, state: &State) -> io::Result<()> {
        let state = State {
            path: Some(self.canonical_path()),
            ..state.clone()
        };
        // Held across the write: two writes never interleave their renames.
        let mut held = self.file.lock().unwrap_or_else(|e| e.into_inner());
        *held = self.state_file.replace_with(&state)?;
        Ok(())
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
            "path" => state.path = Some(value.to_string()),
            "layout" => state.layout = Some(value.to_string()),
            "registry" => state.registry = Some(value.to_string()),
            "etcd_revision" => state.etcd_revision = Some(value.parse().ok()?),
            "fleet" => state.fleet = Some(value.to_string()),
            "generation" => state.generation = Some(value.parse().ok()?),
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
        let lock = f.lock().unwrap();
        // The lock's empty file reads as none.
        assert_eq!(f.read().unwrap(), None);
        let full = State {
            high_water_ms: 1_700_000_000_123,
            node_id: Some(7),
            path: Some(lock.canonical_path()),
            layout: Some("snowflake(x); node id in field node".into()),
            registry: Some("etcd cluster=ab prefix=/p".into()),
            etcd_revision: Some(12),
            fleet: Some("0123456789abcdef0123456789abcdef".into()),
            generation: Some(2),
        };
        lock.write(&full).unwrap();
        assert_eq!(f.read().unwrap(), Some(full));
        let bare = State {
            high_water_ms: 5,
            ..State::default()
        };
        lock.write(&bare).unwrap();
        let path = Some(lock.canonical_path());
        assert_eq!(f.read().unwrap(), Some(State { path, ..bare }));
        assert!(!dir.path().join("state.tmp").exists());
        // The first format still reads.
        fs::write(f.path(), "shardflake-high-water-ms 42\n").unwrap();
        assert_eq!(f.read().unwrap().unwrap().high_water_ms, 42);
    }

    #[test]
    fn a_second_lock_fails_under_any_path_until_the_first_is_dropped() {
        // flock locks belong to the open file description, so two opens in
        // one process conflict just as two processes do.
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path().join("state"));
        let held = f.lock().unwrap();
        let symlink = dir.path().join("symlink");
        std::os::unix::fs::symlink(f.path(), &symlink).unwrap();
        let hard = dir.path().join("hard");
        fs::hard_link(f.path(), &hard).unwrap();
        for path in [f.path(), &symlink, &hard] {
            let err = StateFile::new(path).lock().unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
            assert!(err.to_string().contains("in use"), "{err}");
        }
        // Each write moves the lock to the new file.
        held.write(&State::default()).unwrap();
        held.write(&State::default()).unwrap();
        let err = f.lock().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        let err = StateFile::new(&symlink).lock().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
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
