//! `shardflake compare`: what each id scheme costs on *your* database.
//!
//! The source documents end with a choice (`MISSION.md` §3): `bigserial` or
//! `AUTO_INCREMENT`, ids made inside the database (Instagram's `next_id()`,
//! the MySQL procedure), Snowflake ids from the application, UUIDv4/v7,
//! ObjectId, Flickr's tickets or Leaf's segments. This crate measures each
//! one on a server the user names, in one run, against the server's own
//! counter (run once unmeasured first, so that the first scheme measured
//! does not pay alone for a cold server):
//!
//! - the key's size in bytes;
//! - rows per second inserting N rows from C connections (batches of B rows
//!   per `INSERT`), and the ratio to `bigserial`/`AUTO_INCREMENT` in the same
//!   run;
//! - the table's and the primary key's size after the inserts, and again
//!   after deleting a random ~10% of the rows, vacuuming and inserting as
//!   many new ones (where random keys fill the holes and ordered keys
//!   append);
//! - the generator's own ids per second where the database does not make
//!   the id (in the client, one thread; from the ticket server, C
//!   connections);
//! - whether each connection got its ids in increasing order, and how many
//!   ids repeated (0 except the seed's procedure, whose race is the
//!   documents' trap).
//!
//! # Safe on a real server
//!
//! Everything happens in a schema (PostgreSQL) or database (MariaDB) of its
//! own, `shardflake_compare` by default, marked as made by this tool; a
//! schema of that name without the mark is refused, one left by a killed run
//! is dropped and made anew, and a second run at the same time is refused
//! (an advisory lock). The sandbox is dropped at the end, on an error and on
//! a cancel ([`Options::cancel`], set by the CLI on Ctrl-C; the running
//! batches finish first). Rows, time per scheme and each statement's wait
//! are capped. Nothing outside the sandbox is read or written, and no
//! global setting is changed: a scheme that would need one (MariaDB's event
//! scheduler) is skipped with the reason.
//!
//! # Map of the modules
//!
//! - [`scheme`]: the schemes and what is known of them before measuring.
//! - `ids`: ids made in the client, and the one order every kind is checked in.
//! - `load`: the insert phase both servers share.
//! - `pg`, `mysql`: the sandbox, tables and statements of each server.
//! - [`report`]: the results, as a terminal table, Markdown or JSON.
//! - [`chart`]: the results as SVG bar charts.
//! - [`error`](mod@error): [`CompareError`].

#![warn(missing_docs)]

pub mod chart;
pub mod error;
mod ids;
mod load;
mod mysql;
mod pg;
pub mod report;
pub mod scheme;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub use error::CompareError;
pub use report::{Report, SchemeResult, ServerReport};
pub use scheme::{MadeBy, Scheme, ServerKind};

/// The comment on a PostgreSQL sandbox schema that says this tool made it.
pub const SANDBOX_MARK: &str = "made by shardflake compare; dropped at the end of its run";
/// The table in a MariaDB sandbox database that says this tool made it.
pub const SANDBOX_MARK_TABLE: &str = "made_by_shardflake_compare";

/// The name of the advisory lock (PostgreSQL, hashed with
/// `hashtextextended(name, 0)`) or user lock (MariaDB, `GET_LOCK`) a run
/// holds on its sandbox.
pub fn sandbox_lock(sandbox: &str) -> String {
    format!("sf compare {sandbox}")
}

/// The most rows a run may insert per scheme.
pub const MAX_ROWS: u64 = 100_000_000;
/// The most connections.
pub const MAX_CLIENTS: usize = 256;
/// The most rows per `INSERT`.
pub const MAX_BATCH: usize = 1000;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Rows to insert per scheme.
    pub rows: u64,
    /// Connections inserting at once.
    pub clients: usize,
    /// Rows per `INSERT` statement.
    pub batch: usize,
    /// Longest insert phase per scheme; fewer rows are inserted if it runs out.
    pub seconds: u64,
    /// Longest wait for any one statement.
    pub timeout: Duration,
    /// The sandbox schema (PostgreSQL) or database (MariaDB).
    pub schema: String,
    /// Only these schemes (plus the baseline); all that fit when empty.
    pub only: Vec<Scheme>,
    /// Ids per block of the segment scheme.
    pub segment_step: u64,
    /// Set to stop: running batches finish, then the sandbox is dropped.
    pub cancel: Arc<AtomicBool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rows: 1_000_000,
            clients: 8,
            batch: 100,
            seconds: 60,
            timeout: Duration::from_secs(60),
            schema: "shardflake_compare".into(),
            only: Vec::new(),
            segment_step: 1000,
            cancel: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Options {
    /// Checks every limit and the sandbox's name.
    pub fn validate(&self) -> Result<(), CompareError> {
        let bad = |m: String| Err(CompareError::Invalid(m));
        if !(1..=MAX_ROWS).contains(&self.rows) {
            return bad(format!("--rows {} is outside 1..={MAX_ROWS}", self.rows));
        }
        if !(1..=MAX_CLIENTS).contains(&self.clients) {
            return bad(format!(
                "--clients {} is outside 1..={MAX_CLIENTS}",
                self.clients
            ));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return bad(format!("--batch {} is outside 1..={MAX_BATCH}", self.batch));
        }
        if !(1..=86_400).contains(&self.seconds) {
            return bad(format!("--seconds {} is outside 1..=86400", self.seconds));
        }
        if self.timeout.is_zero() {
            return bad("--timeout must be above zero".into());
        }
        if !(1..=1_000_000).contains(&self.segment_step) {
            return bad(format!(
                "--segment-step {} is outside 1..=1000000",
                self.segment_step
            ));
        }
        let s = &self.schema;
        let ident = !s.is_empty()
            && s.len() <= 48
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ident {
            return bad(format!(
                "--schema {s:?}: use 1 to 48 of a-z, 0-9 and _, not starting with a digit"
            ));
        }
        Ok(())
    }

    fn wants(&self, s: Scheme) -> bool {
        self.only.is_empty() || s.is_baseline() || self.only.contains(&s)
    }

    /// The options of the unmeasured warm-up run of `kind`'s baseline (at
    /// most [`WARM_UP_ROWS`] rows), and its result to throw away.
    fn warm_up(&self, kind: ServerKind) -> (Options, SchemeResult) {
        let baseline = Scheme::for_server(kind)[0];
        let opts = Options {
            rows: self.rows.min(WARM_UP_ROWS),
            ..self.clone()
        };
        (opts, SchemeResult::new(baseline, kind))
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Where a run reports what it is doing (the CLI draws a progress bar).
pub trait Progress: Send + Sync {
    /// A scheme starts: `rows` to insert.
    fn start(&self, _server: ServerKind, _label: &str, _rows: u64) {}
    /// `n` more rows inserted.
    fn rows(&self, _n: u64) {}
    /// A phase with no row count (sizes, churn, dropping the sandbox).
    fn phase(&self, _what: &str) {}
    /// The scheme is done.
    fn finish(&self) {}
}

/// Rows of the unmeasured warm-up run before the first measured scheme.
pub const WARM_UP_ROWS: u64 = 200_000;

fn silent() -> Arc<dyn Progress> {
    Arc::new(Silent)
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;
impl Progress for Silent {}

/// Compares every scheme that fits on the PostgreSQL server at `url`.
pub async fn postgres(
    url: &str,
    opts: &Options,
    progress: Arc<dyn Progress>,
) -> Result<ServerReport, CompareError> {
    opts.validate()?;
    pg::run(url, opts, progress).await
}

/// Compares every scheme that fits on the MariaDB (or MySQL) server at
/// `url` (the URL's database, if any, is not used).
pub async fn mariadb(
    url: &str,
    opts: &Options,
    progress: Arc<dyn Progress>,
) -> Result<ServerReport, CompareError> {
    opts.validate()?;
    mysql::run(url, opts, progress).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_out_of_range_are_refused() {
        assert!(Options::default().validate().is_ok());
        let bad = [
            Options {
                rows: 0,
                ..Options::default()
            },
            Options {
                rows: MAX_ROWS + 1,
                ..Options::default()
            },
            Options {
                clients: 0,
                ..Options::default()
            },
            Options {
                batch: MAX_BATCH + 1,
                ..Options::default()
            },
            Options {
                seconds: 0,
                ..Options::default()
            },
            Options {
                timeout: Duration::ZERO,
                ..Options::default()
            },
            Options {
                segment_step: 0,
                ..Options::default()
            },
            Options {
                schema: "Bad-Name".into(),
                ..Options::default()
            },
            Options {
                schema: "1abc".into(),
                ..Options::default()
            },
            Options {
                schema: "public; drop".into(),
                ..Options::default()
            },
            Options {
                schema: String::new(),
                ..Options::default()
            },
        ];
        for o in bad {
            assert!(
                matches!(o.validate(), Err(CompareError::Invalid(_))),
                "{o:?}"
            );
        }
    }

    #[test]
    fn every_scheme_has_a_name_that_parses_back() {
        for s in Scheme::ALL {
            assert_eq!(Scheme::from_name(s.name()), Some(s));
        }
        assert_eq!(Scheme::from_name("nope"), None);
        for kind in [ServerKind::Postgres, ServerKind::Mariadb] {
            let schemes = Scheme::for_server(kind);
            assert!(schemes[0].is_baseline());
            assert_eq!(schemes.iter().filter(|s| s.is_baseline()).count(), 1);
        }
    }
}
