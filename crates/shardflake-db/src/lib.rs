//! Ids made inside the database, Instagram style: every logical shard is a
//! PostgreSQL schema whose `next_id()` is the id column's default, thousands
//! of logical shards live on a few physical servers, and the application
//! routes by key. Plus the MariaDB/MySQL stored-procedure variant.
//!
//! # Two backends, one shape
//!
//! - [`pg`]: PostgreSQL. `topology` (the TOML file), `sql` (generated
//!   SQL), `catalog` (the deployment's records on its servers), `apply`,
//!   `check`, `repair`, `move_shard`, and `route` (key → shard → server).
//! - [`mysql`]: MariaDB/MySQL. `sql` (generated SQL), `installed` (what a
//!   server has), `apply`, `check`, `repair`; the `generate_post_id`
//!   procedure (the seed's and ours, race-free) and calling it from Rust
//!   with mysql_async.
//!
//! This file holds what both share: the error type, the name of the
//! layout field that holds the shard, and how far a server's clock may be
//! from the clock of the host that runs the commands (a failover's
//! catch-up rests on it).

#![warn(missing_docs)]

pub mod mysql;
pub mod pg;

/// The MariaDB/MySQL client this crate uses.
pub use mysql_async;
/// The PostgreSQL client this crate uses (for rows and parameters).
pub use tokio_postgres;

use pg::{TopologyError, sql};

/// How far, in milliseconds, a server's clock may be from the clock of
/// the host that runs `apply`, `check` and `repair` (both backends). A
/// promoted standby or replica knows nothing of the ids its old primary
/// made after the last change it received, except that each is at most
/// the old primary's clock plus the lead a draw may run ahead of it:
/// `repair` puts its sequences past its own clock plus that lead, plus
/// this bound and the measured difference, which is past every such id if
/// the old primary's clock was within this bound of this host's when it
/// died (what `check` reports otherwise).
pub const CLOCK_BOUND_MS: u64 = 500;

/// Why a server's clock is too far from this host's ([`CLOCK_BOUND_MS`]),
/// given its offset (positive: the server is ahead) and the uncertainty of
/// the reading, both in milliseconds; `repair` is the command refused.
pub fn clock_problem(offset: i64, uncertainty: i64, repair: &str) -> Option<String> {
    (offset.unsigned_abs() > CLOCK_BOUND_MS).then(|| {
        format!(
            "its clock is {:.3} s {} this host's (read within {uncertainty} ms; the bound is {CLOCK_BOUND_MS} ms): after a failover its sequences cannot be put past the old primary's ids by its own clock, and {repair} refuses it; correct the clock (NTP) of whichever is wrong, then run the command again",
            offset.unsigned_abs() as f64 / 1000.0,
            if offset < 0 { "behind" } else { "ahead of" }
        )
    })
}

/// This host's clock, in Unix milliseconds.
pub(crate) fn host_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Name of the layout field that holds the logical shard (both backends).
pub const SHARD_FIELD: &str = "shard";

/// Every error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad topology file.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// SQL generation refused the layout.
    #[error(transparent)]
    Sql(#[from] sql::SqlError),
    /// An id that does not decode.
    #[error(transparent)]
    Id(#[from] shardflake::IdError),
    /// A server could not be reached.
    #[error(
        "cannot connect to server {server:?} ({url}): {}",
        connect_message(source.as_ref())
    )]
    Connect {
        /// Server name.
        server: String,
        /// Its URL.
        url: String,
        /// The socket's, the driver's or the server's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A server stopped answering while a command ran
    /// (`pg::liveness`): the command gave up on it there.
    #[error(
        "server {server:?}: {context}: {why}; the command stopped here: what it committed before stays, its open transactions roll back (on {server:?} when it runs again). Once {server:?} answers, run the same command again (`shardflake pg check` says what is left and the command that finishes it){}",
        if server.ends_with("(old copy)") { "; if the old copy is gone for good, give `--old-copy-gone` instead of `--old-url`" } else { "" }
    )]
    Unresponsive {
        /// Server name.
        server: String,
        /// What the command was doing.
        context: String,
        /// What was seen.
        why: String,
    },
    /// A statement failed.
    #[error("server {server:?}: {context}: {}", pg_message(source))]
    Postgres {
        /// Server name.
        server: String,
        /// What was being done.
        context: String,
        /// The driver's or the server's error.
        source: tokio_postgres::Error,
    },
    /// A deployment that does not match the topology, where that is fatal.
    #[error("server {server:?}: {message}")]
    Conflict {
        /// Server name.
        server: String,
        /// What is wrong.
        message: String,
    },
    /// What the servers record contradicts the topology file (or each
    /// other): nothing was changed. Each problem says what to do instead.
    #[error("refusing to {what}; nothing was changed:\n  {}", problems.join("\n  "))]
    Refused {
        /// The command refused.
        what: String,
        /// Each problem, naming its server and shard.
        problems: Vec<String>,
    },
    /// `pg adopt` or `mysql adopt` switched some tables, then stopped at
    /// one: those it switched stay switched (each committed on its own);
    /// the one it stopped at and those after it are unchanged. Running the
    /// same adopt again finishes them.
    #[error(
        "{command} stopped at {stopped_at}: {problem}\n  switched, and they stay switched:\n    {}\n  not changed: {stopped_at}{}\n  run the same {command} again to finish",
        switched.join("\n    "),
        not_reached.iter().map(|t| format!(", {t}")).collect::<String>()
    )]
    AdoptStopped {
        /// `pg adopt` or `mysql adopt`.
        command: &'static str,
        /// The tables switched, as `pg adopt` prints each.
        switched: Vec<String>,
        /// The table it stopped at (`server: schema.table.column`).
        stopped_at: String,
        /// Why.
        problem: String,
        /// The tables planned after it, not reached.
        not_reached: Vec<String>,
    },
    /// A shard move that could not be completed.
    #[error("moving shard {shard}: {message}")]
    Move {
        /// Shard.
        shard: u64,
        /// What failed.
        message: String,
    },
    /// MariaDB/MySQL: a refusal or a finding of ours (no driver error
    /// under it, so the message is printed once).
    #[error("mysql: {context}: {message}")]
    MysqlRefused {
        /// What was being done.
        context: String,
        /// Why it was refused.
        message: String,
    },
    /// MariaDB/MySQL: the sequence would have to go past the layout's last
    /// value, where it hands out nothing: the layout's ids are used up, or
    /// an id stored in the table sits at its end. The message names the
    /// row, if one, and the way out.
    #[error("mysql: {context}: {message}")]
    MysqlExhausted {
        /// What was being done.
        context: String,
        /// What is at the end, and what to do.
        message: String,
    },
    /// MariaDB/MySQL failure.
    #[error("mysql: {context}: {source}")]
    Mysql {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: mysql_async::Error,
    },
    /// Writing the topology file.
    #[error("writing topology {path}: {source}")]
    Io {
        /// File.
        path: String,
        /// The I/O error that stopped it.
        source: std::io::Error,
    },
}

impl Error {
    /// A MariaDB/MySQL failure while doing `context`, for `map_err`.
    pub fn mysql(context: &str) -> impl FnOnce(mysql_async::Error) -> Error + '_ {
        move |source| Error::Mysql {
            context: context.to_string(),
            source,
        }
    }

    /// A MariaDB/MySQL step refused while doing `context`.
    pub fn mysql_refused(context: &str, message: impl Into<String>) -> Error {
        Error::MysqlRefused {
            context: context.to_string(),
            message: message.into(),
        }
    }
}

/// Why a connection failed: the server's own words where it answered
/// (an unknown role, a database that does not exist), else the driver's
/// (whose text already holds its cause).
fn connect_message(e: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    match e.downcast_ref::<tokio_postgres::Error>() {
        Some(e) if e.as_db_error().is_some() => pg_message(e),
        _ => e.to_string(),
    }
}

/// The server's message and SQLSTATE, not just "db error".
pub fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) if db.code().code() == "2200H" => format!(
            "{} (SQLSTATE 2200H): a shard sequence at its MAXVALUE means the layout's ids are used up (time past its limit, see SQLSTATE {SQLSTATE_TIME_LIMIT}), or that the statement was running while its shard moved to another server (the old copy's sequences are fenced): reload the topology and retry",
            db.message()
        ),
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut s = e.to_string();
            let mut src = std::error::Error::source(e);
            while let Some(inner) = src {
                s.push_str(": ");
                s.push_str(&inner.to_string());
                src = inner.source();
            }
            s
        }
    }
}

/// SQLSTATE raised by a shard's tables and `next_id` after the shard moved
/// away: reload the topology and retry.
pub const SQLSTATE_MOVED: &str = "SF001";
/// SQLSTATE raised by `next_id` when the id would be negative or past the
/// layout's end.
pub const SQLSTATE_TIME_LIMIT: &str = "SF002";

/// SQLSTATE raised by a shard's `next_id` whose sequence is not the one it
/// was made for: the shard was restored from a dump; `pg repair` it.
pub const SQLSTATE_RESTORED: &str = "SF003";
/// SQLSTATE raised by `next_id` when the shard's sequence runs more than
/// twice [`sql::AHEAD_MS`] ahead of the server clock (the clock stepped back).
pub const SQLSTATE_AHEAD: &str = "SF004";
/// SQLSTATE raised by `next_id` on a server that restarted or replayed WAL
/// (a crash, a promoted standby, a base backup restored) since `pg apply`
/// or `pg repair` last vouched for it: `pg repair` it, unless it is an old
/// primary a standby was promoted in place of.
pub const SQLSTATE_RESTARTED: &str = "SF005";

/// Whether a PostgreSQL error says the shard moved.
pub fn is_moved(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|d| d.code().code() == SQLSTATE_MOVED)
}
