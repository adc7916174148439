//! [`CompareError`]: every way a comparison can fail, each naming the server
//! and what it was doing.

use std::time::Duration;

/// Every error of this crate.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// An option out of range, or a name that is not an identifier.
    #[error("invalid option: {0}")]
    Invalid(String),
    /// The server could not be reached or refused the login.
    #[error("cannot connect to {server} ({url}): {message}")]
    Connect {
        /// `PostgreSQL` or `MariaDB`.
        server: &'static str,
        /// The URL, as given.
        url: String,
        /// The driver's or the server's words.
        message: String,
    },
    /// The sandbox schema exists and was not made by `shardflake compare`.
    #[error(
        "{server}: {kind} {name:?} exists and was not made by shardflake compare; \
         refusing to touch it (pick another name with --schema)"
    )]
    NotOurs {
        /// `PostgreSQL` or `MariaDB`.
        server: &'static str,
        /// `schema` or `database`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// Another `shardflake compare` holds the sandbox.
    #[error(
        "{server}: another shardflake compare is running on {name:?}; \
         wait for it or use --schema with another name"
    )]
    Busy {
        /// `PostgreSQL` or `MariaDB`.
        server: &'static str,
        /// The sandbox's name.
        name: String,
    },
    /// A statement failed.
    #[error("{server}: {what}: {message}")]
    Db {
        /// `PostgreSQL` or `MariaDB`.
        server: &'static str,
        /// What was being done.
        what: String,
        /// The server's words.
        message: String,
    },
    /// A statement did not answer in time.
    #[error("{server}: {what}: no answer within {after:?} (see --timeout)")]
    Timeout {
        /// `PostgreSQL` or `MariaDB`.
        server: &'static str,
        /// What was being done.
        what: String,
        /// The limit.
        after: Duration,
    },
    /// A client-side generator failed (clock far behind, say).
    #[error("generating ids for {scheme}: {message}")]
    Generate {
        /// The scheme.
        scheme: &'static str,
        /// The generator's words.
        message: String,
    },
    /// The chart could not be written.
    #[error("writing the chart {path}: {message}")]
    Chart {
        /// The file.
        path: String,
        /// Why.
        message: String,
    },
}
