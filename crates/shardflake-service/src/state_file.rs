//! The local high-water file: the Unix millisecond before which every id this
//! host issued was stamped, so a restart resumes after it and never reissues
//! a tick. Written atomically (temporary file, fsync, rename, fsync of the
//! directory): a crash leaves the old value or the new one, never a torn one.
//!
//! One process per file: [`StateFile::lock`] takes an exclusive `flock` on a
//! sibling `<name>.lock` (the state file itself is replaced on every write)
//! for the life of the process. Two processes sharing a file would share a
//! node id's history, and one could resume below what the other issued.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// One file holding one high-water time.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

const HEADER: &str = "shardflake-high-water-ms";

impl StateFile {
    /// The file at `path` (created on first write).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        StateFile { path: path.into() }
    }

    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recorded high-water, or 0 when there is no file yet.
    pub fn read(&self) -> io::Result<u64> {
        match fs::read_to_string(&self.path) {
            Ok(text) => parse(&text).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} is not a shardflake state file (want \"{HEADER} <ms>\")",
                        self.path.display()
                    ),
                )
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Locks the file for this process (exclusive, non-blocking) until the
    /// returned guard is dropped; fails at once while another process holds it.
    pub fn lock(&self) -> io::Result<StateLock> {
        let mut name = self
            .path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "state file has no name"))?
            .to_os_string();
        name.push(".lock");
        let path = self.path.with_file_name(name);
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
        Ok(StateLock { _file: file })
    }

    /// Records `unix_ms` durably.
    pub fn write(&self, unix_ms: u64) -> io::Result<()> {
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
            writeln!(f, "{HEADER} {unix_ms}")?;
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
}

fn parse(text: &str) -> Option<u64> {
    let mut words = text.split_ascii_whitespace();
    (words.next()? == HEADER).then_some(())?;
    let ms = words.next()?.parse().ok()?;
    words.next().is_none().then_some(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path().join("state"));
        assert_eq!(f.read().unwrap(), 0);
        f.write(1_700_000_000_123).unwrap();
        assert_eq!(f.read().unwrap(), 1_700_000_000_123);
        f.write(5).unwrap();
        assert_eq!(f.read().unwrap(), 5);
        assert!(!dir.path().join("state.tmp").exists());
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
