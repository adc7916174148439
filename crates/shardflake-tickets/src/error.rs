//! Typed errors with stable codes ([`TicketError::code`]) for the service
//! to map once to HTTP and gRPC statuses.

use crate::config::ConfigError;

/// Why one server could not answer one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFailure {
    /// The server's name.
    pub server: String,
    /// What went wrong (an error's message, or its breaker state).
    pub reason: String,
}

/// Every error of this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// A bad configuration file.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No sequence of that name in the configuration.
    #[error("unknown sequence {0:?}")]
    UnknownSequence(String),
    /// A count of 0 or above the limit.
    #[error("count must be in 1..={max}, not {count}")]
    BadCount {
        /// The count asked for.
        count: usize,
        /// The largest count allowed.
        max: usize,
    },
    /// No server could answer within the timeout.
    #[error("{}: {}", unavailable(.sequence), list(.failures))]
    Unavailable {
        /// The sequence (empty: at the client's start, none asked for yet).
        sequence: String,
        /// Each server's reason.
        failures: Vec<ServerFailure>,
    },
    /// The sequence reached its maximum; it never wraps and never widens.
    #[error("sequence {sequence:?} is exhausted: no id above {max} fits in it")]
    Exhausted {
        /// The sequence.
        sequence: String,
        /// Its largest id.
        max: u64,
    },
    /// A server's counter is at or below ids it already handed out (restored
    /// from a backup, a lagging replica promoted): refused until
    /// `shardflake tickets repair`.
    #[error(
        "server {server:?} is behind its high-water for sequence {sequence:?}: it could hand out ids from {counter} on, but ids up to {high_water} were already handed out; run `shardflake tickets repair`"
    )]
    BehindHighWater {
        /// The server.
        server: String,
        /// The sequence.
        sequence: String,
        /// The largest id the server's counter says it handed out.
        counter: u64,
        /// The largest id it is known to have handed out.
        high_water: u64,
    },
    /// A server answered an id (or a block) at or below one it answered this
    /// client before: it went back (restored under a running client). The
    /// answer is never handed out; the server is refused until a fresh
    /// session has checked it against the marks again (and raised it past
    /// them).
    #[error(
        "server {server:?} went back on sequence {sequence:?}: it answered {answer}, at or below {seen} which it answered before (restored from a backup?); refused until its marks are checked again"
    )]
    WentBack {
        /// The server.
        server: String,
        /// The sequence.
        sequence: String,
        /// Its answer now (an id, or a segment row).
        answer: i64,
        /// The largest answer seen from it before.
        seen: i64,
    },
    /// The table or sequence a server counts a sequence with was recreated
    /// since the client last checked it against the marks (a dump loaded
    /// into the running server drops and creates it), or its counter row
    /// is one its guard does not vouch for (moved while the guard was
    /// dropped, or the guard made anew): its counter may be
    /// behind ids other clients handed out. The answer is never handed
    /// out; the server is checked against the marks again (and raised past
    /// them) before it is used.
    #[error(
        "server {server:?}: the table or sequence of {sequence:?} was recreated or changed outside its guard since it was last checked (a dump loaded into the running server, the guard dropped and made again?); its answer is not used, and the server is checked against its high-water marks again"
    )]
    Recreated {
        /// The server.
        server: String,
        /// The sequence.
        sequence: String,
    },
    /// Too few places holding a server's marks answered (its peers, etcd:
    /// a read's quorum, `high_water::Quorum`) and the
    /// client's own marks cannot stand in (it has none, another server is
    /// up, or the server's tables are not the ones it last checked): the
    /// server could have been restored behind ids already handed out, so
    /// it is not used.
    #[error(
        "server {server:?}: too few of the places holding its high-water marks answered ({reason}) and this client's own marks cannot vouch for it (they cover only the ids it handed out itself, from the tables it checked), so it could hand out ids again; bring a peer (or etcd) back, or set `[failover] allow_without_marks = true` to let availability win"
    )]
    NoHighWater {
        /// The server.
        server: String,
        /// Why each place did not answer.
        reason: String,
    },
    /// The server answers for a residue class with an identity that held
    /// the class before and was taken over since (a copy of it on another
    /// host or port, a promoted standby, by the server now answering):
    /// two servers answering for one class would hand out ids twice.
    #[error("{0}")]
    Superseded(Box<Superseded>),
    /// A sequence's lattice (increment, offset, mode, bits, chunk) in the
    /// file differs from the one `init` recorded on the server, the server
    /// was reshaped after the session opened (its lattice version is
    /// another), or a reshape is under way: taken as is, the file would
    /// hand out ids twice.
    #[error("server {server:?}{}: {change}", of_sequence(sequence))]
    LatticeChanged {
        /// The server.
        server: String,
        /// The sequence (empty: every sequence of the server).
        sequence: String,
        /// What differs, and what to do.
        change: String,
    },
    /// A server whose schema or settings contradict the configuration (an id
    /// outside its residue, a sequence with another increment, a missing
    /// table, a table without its guard, a segment row off the server's
    /// lattice).
    #[error("server {server:?} is misconfigured: {message}")]
    Misconfigured {
        /// The server.
        server: String,
        /// What is wrong.
        message: String,
    },
    /// A database error.
    #[error("server {server:?}: {context}: {message}")]
    Database {
        /// The server.
        server: String,
        /// What was being done.
        context: String,
        /// The driver's message.
        message: String,
    },
    /// A server did not answer in time.
    #[error("server {server:?} did not answer within {ms} ms ({context}; the limit is {setting})")]
    Timeout {
        /// The server (the place that did not answer).
        server: String,
        /// What was being done.
        context: String,
        /// The timeout.
        ms: u64,
        /// The setting that bounds it, as the file names it
        /// (`[failover] marks_timeout_ms`, ...).
        setting: &'static str,
    },
}

fn of_sequence(sequence: &str) -> String {
    match sequence {
        "" => String::new(),
        s => format!(", sequence {s:?}"),
    }
}

fn unavailable(sequence: &str) -> String {
    match sequence {
        "" => "no ticket server could be used".into(),
        _ => format!("no ticket server could answer for sequence {sequence:?}"),
    }
}

fn list(failures: &[ServerFailure]) -> String {
    if failures.is_empty() {
        return "no server was tried before the deadline".into();
    }
    failures
        .iter()
        .map(|f| format!("{}: {}", f.server, f.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

impl TicketError {
    /// A place's final answer, not a failure to retry or to count as a
    /// place down: the class was taken over by another identity
    /// (`superseded`), or the place's lattice is not the client's
    /// (`lattice_changed`). One such refusal refuses a mark write or a
    /// takeover, whatever the other places answered.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            TicketError::Superseded(_) | TicketError::LatticeChanged { .. }
        )
    }

    /// A stable, machine-readable code: `bad_config`, `unknown_sequence`,
    /// `bad_count`, `unavailable`, `exhausted`, `behind_high_water`,
    /// `went_back`, `recreated`, `no_high_water`, `lattice_changed`, `misconfigured`,
    /// `database`, `timeout`.
    pub fn code(&self) -> &'static str {
        match self {
            TicketError::Config(_) => "bad_config",
            TicketError::UnknownSequence(_) => "unknown_sequence",
            TicketError::BadCount { .. } => "bad_count",
            TicketError::Unavailable { .. } => "unavailable",
            TicketError::Exhausted { .. } => "exhausted",
            TicketError::BehindHighWater { .. } => "behind_high_water",
            TicketError::WentBack { .. } => "went_back",
            TicketError::Recreated { .. } => "recreated",
            TicketError::NoHighWater { .. } => "no_high_water",
            TicketError::Superseded(_) => "superseded",
            TicketError::LatticeChanged { .. } => "lattice_changed",
            TicketError::Misconfigured { .. } => "misconfigured",
            TicketError::Database { .. } => "database",
            TicketError::Timeout { .. } => "timeout",
        }
    }

    /// The server (or place) the error names, where it names one.
    pub(crate) fn server(&self) -> Option<&str> {
        match self {
            TicketError::Misconfigured { server, .. }
            | TicketError::LatticeChanged { server, .. }
            | TicketError::Database { server, .. }
            | TicketError::Timeout { server, .. }
            | TicketError::NoHighWater { server, .. } => Some(server),
            _ => None,
        }
    }

    /// This error as said of `server` (an `init` line, where one server's
    /// refusal refuses the whole run): as it is where it names `server`,
    /// else naming `server` and the server it came from.
    pub(crate) fn said_of(&self, server: &str) -> TicketError {
        match self.server() {
            Some(named) if named == server => self.clone(),
            _ => TicketError::db(
                server,
                "init",
                format!("refused on every server, because {self}"),
            ),
        }
    }

    pub(crate) fn db(server: &str, context: &str, message: impl ToString) -> TicketError {
        // mysql_async's error and the I/O error inside it each say
        // "Input/output error: ": once is enough.
        const TWICE: &str = "Input/output error: Input/output error: ";
        TicketError::Database {
            server: server.to_string(),
            context: context.to_string(),
            message: message
                .to_string()
                .replacen(TWICE, "Input/output error: ", 1),
        }
    }

    pub(crate) fn lattice_changed(
        server: &str,
        sequence: &str,
        recorded: &dyn std::fmt::Display,
        file: &dyn std::fmt::Display,
    ) -> TicketError {
        TicketError::LatticeChanged {
            server: server.to_string(),
            sequence: sequence.to_string(),
            change: format!(
                "the file says {file}, but it was initialised with {recorded}; changing this hands out ids twice. To change it safely run `shardflake tickets reshape --config NEW_FILE` (it raises every server past every mark and counter, then records the new lattice), or put the file back"
            ),
        }
    }

    /// The lattice `recorded` on the server was recorded by `tickets
    /// reshape` (its version raised to `version`), and the client's `file`
    /// differs: the client runs on a file of before that reshape, whoever
    /// ran it. The way out is the reshape's file, never a reshape back:
    /// two operators each reshaping to their own file would undo each
    /// other's, every time the other's clients were refused.
    pub(crate) fn lattice_reshaped(
        server: &str,
        sequence: &str,
        recorded: &dyn std::fmt::Display,
        file: &dyn std::fmt::Display,
        version: i64,
    ) -> TicketError {
        TicketError::LatticeChanged {
            server: server.to_string(),
            sequence: sequence.to_string(),
            change: format!(
                "the servers' lattice was changed by `shardflake tickets reshape` to {recorded} (lattice version {version}, the current one), and this client's file says {file}: it runs on a file of before that reshape (or one edited since), and would hand out ids twice. Run it with the file that reshape was given, whose lattice is {recorded}. Do not reshape back to this file to get past this refusal: that undoes the reshape of version {version}, and its clients are then refused in turn; a reshape is a planned change, made once every client's file says its lattice"
            ),
        }
    }

    /// `server` records lattice version `own` and another lattice than the
    /// file's, while `other` records the file's at `current`, a higher
    /// one: `server` went back to before the reshape to `current` (its own
    /// dump of before it loaded), not the file. The way out is that
    /// reshape again with this file.
    pub(crate) fn went_back_before_reshape(
        server: &str,
        own: i64,
        other: &str,
        current: i64,
    ) -> TicketError {
        TicketError::LatticeChanged {
            server: server.to_string(),
            sequence: String::new(),
            change: format!(
                "it records lattice version {own} and another lattice than this file's, while server {other} records this file's at version {current}: {server} went back to before the reshape to version {current} (its own dump of before it loaded?); run `shardflake tickets reshape --config FILE` again with this file (it raises {server} past every mark and counter and records this lattice), not a reshape back, and no other file"
            ),
        }
    }

    /// A record `init` writes (`what`) is not on `server`. While a dump
    /// is loaded each table is recreated empty before its rows, so this is
    /// most often a restore under way and clears by itself: the message
    /// says so before it names `init`, which only a server never
    /// initialised, or initialised by an older shardflake, needs.
    pub(crate) fn missing_record(server: &str, what: &str) -> TicketError {
        TicketError::misconfigured(
            server,
            format!(
                "{what} missing: a restore in progress (a dump recreates each table empty before its rows), or not recorded by `init` (never run, or run by an older shardflake); if it stays, run `shardflake tickets init`"
            ),
        )
    }

    pub(crate) fn misconfigured(server: &str, message: impl Into<String>) -> TicketError {
        TicketError::Misconfigured {
            server: server.to_string(),
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_lists_every_server() {
        let e = TicketError::Unavailable {
            sequence: "photos".into(),
            failures: vec![
                ServerFailure {
                    server: "a".into(),
                    reason: "connection refused".into(),
                },
                ServerFailure {
                    server: "b".into(),
                    reason: "down".into(),
                },
            ],
        };
        assert_eq!(e.code(), "unavailable");
        assert_eq!(
            e.to_string(),
            "no ticket server could answer for sequence \"photos\": a: connection refused; b: down"
        );
        // At the client's start no sequence is asked for: none is named.
        let e = TicketError::Unavailable {
            sequence: String::new(),
            failures: vec![ServerFailure {
                server: "a".into(),
                reason: "down".into(),
            }],
        };
        assert_eq!(e.to_string(), "no ticket server could be used: a: down");
    }

    /// The driver's error and the I/O error inside it each said
    /// "Input/output error: " (a review saw it doubled on every server
    /// down).
    #[test]
    fn a_connection_refused_says_input_output_error_once() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let driver = mysql_async::Error::Io(mysql_async::IoError::Io(refused));
        let e = TicketError::db("t1", "connect", driver);
        assert_eq!(
            e.to_string(),
            "server \"t1\": connect: Input/output error: connection refused"
        );
    }

    /// One server's refusal of a whole `init` run, said on every server's
    /// line: each line names its own server, and the one refusing.
    #[test]
    fn an_init_refusal_is_said_of_each_server_by_its_name() {
        let e = TicketError::misconfigured("t2", "records another place");
        assert_eq!(e.said_of("t2"), e);
        assert_eq!(
            e.said_of("t1").to_string(),
            "server \"t1\": init: refused on every server, because server \"t2\" is misconfigured: records another place"
        );
    }
}

/// A server refused as [`TicketError::Superseded`] (boxed: the error stays
/// small).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "server {server:?} answers for residue class {class} as {identity}, which {holder} took the class over from: two live servers for one class would hand out ids twice, so this one is refused. Retire one: stop this one and point every file at the other; or, to make this one the holder again, stop the other and run `shardflake tickets takeover --server {server}` with this file"
)]
pub struct Superseded {
    /// The server, as the file names it.
    pub server: String,
    /// The class ([`crate::ResidueClass::key`]).
    pub class: String,
    /// The identity it answers with.
    pub identity: String,
    /// The identity that holds the class now.
    pub holder: String,
}
