//! Errors, in two layers (as axum's `examples/error-handling` has them):
//!
//! - [`IssueError`]: the domain's one error: what went wrong issuing, in the
//!   issuer's own terms (no lease, fenced, busy, the clock, bad input). It
//!   names no transport status.
//! - [`ApiError`]: what an HTTP client receives, a stable code, a message
//!   and a status, rendered as `{"error":{"code","message"}}`. The HTTP
//!   adapter maps an [`IssueError`] to it once (`http.rs`); the gRPC adapter
//!   maps an [`IssueError`] to a `tonic::Status` once (`grpc.rs`), with the
//!   same code in the `x-error-code` metadata.
//!
//! A call without the API's bearer token is not the domain's business: it
//! is [`crate::auth::Unauthorized`], code `unauthorized`, mapped the same
//! way once per transport (HTTP 401, gRPC `Unauthenticated`).

use std::fmt;

use shardflake::GenerateError;
use shardflake_tickets::TicketError;

/// Why the issuer could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// No node id is held (acquiring, lost, stopped).
    #[error("this node holds no node id right now ({0}); retry on another node")]
    NoLease(&'static str),
    /// The lease could not be renewed before its deadline: nothing is issued
    /// until it is (or a new id is taken).
    #[error("this node could not renew its lease in time (fenced); retry on another node")]
    Fenced,
    /// The clock is past the last durably recorded high-water time.
    #[error("the clock is past the last recorded high-water time; waiting for the record")]
    HighWaterNotRecorded,
    /// Too many large batches are being made at once.
    #[error("{at_once} batches of over {over} ids are being made; retry, or ask for fewer ids")]
    Busy {
        /// Large batches allowed at once.
        at_once: usize,
        /// The size above which a batch counts as large.
        over: u64,
    },
    /// The generator refused (the clock behind, stalled, before the epoch,
    /// or the layout's end reached).
    #[error(transparent)]
    Clock(GenerateError),
    /// A count outside `1..=max`, or not a whole number.
    #[error("count must be a whole number from 1 to {max}, got {text:?}")]
    InvalidCount {
        /// The count as given.
        text: String,
        /// The largest batch allowed.
        max: u64,
    },
    /// An id kind the service does not make.
    #[error("{0}")]
    UnknownKind(String),
    /// A sharding key that is not a whole number.
    #[error("key must be a non-negative whole number, got {0:?}")]
    InvalidKey(String),
    /// A shard id was asked of a layout without a shard field.
    #[error(
        "layout {0} has no shard field besides the node field; use a layout with a `shard` field"
    )]
    NoShardField(String),
    /// Text that is not an id of the layout.
    #[error("{0}")]
    MalformedId(String),
    /// A parameter with a value the operation does not take.
    #[error("{0}")]
    InvalidParameter(String),
    /// The node id held does not fit the layout (a configuration error).
    #[error("the node id does not fit the layout: {0}")]
    BadNodeId(String),
    /// Tickets were asked of a node started without `--tickets`.
    #[error("this node serves no ticket sequences (start it with --tickets FILE)")]
    NoTickets,
    /// The ticket servers' answer: unknown sequence, none could answer,
    /// exhausted, ... (its own stable code).
    #[error(transparent)]
    Tickets(TicketError),
}

impl IssueError {
    /// The stable, machine-readable code clients see.
    pub fn code(&self) -> &'static str {
        match self {
            IssueError::NoLease("waiting_for_clock") => "waiting_for_clock",
            IssueError::NoLease(_) | IssueError::Fenced => "no_lease",
            IssueError::HighWaterNotRecorded => "high_water_not_recorded",
            IssueError::Busy { .. } => "busy",
            IssueError::Clock(e) => match e {
                GenerateError::ClockMovedBackwards { .. } => "clock_moved_backwards",
                GenerateError::ClockStalled { .. } => "clock_stalled",
                GenerateError::BeforeEpoch { .. } => "clock_before_epoch",
                GenerateError::EpochExhausted { .. } => "epoch_exhausted",
                GenerateError::InvalidCount { .. } => "invalid_count",
            },
            IssueError::InvalidCount { .. } => "invalid_count",
            IssueError::UnknownKind(_) => "unknown_kind",
            IssueError::InvalidKey(_) => "invalid_key",
            IssueError::NoShardField(_) => "no_shard_field",
            IssueError::MalformedId(_) => "malformed_id",
            IssueError::InvalidParameter(_) => "invalid_parameter",
            IssueError::BadNodeId(_) => "bad_node_id",
            IssueError::NoTickets => "unknown_sequence",
            IssueError::Tickets(e) => match e {
                TicketError::BadCount { .. } => "invalid_count",
                e => e.code(),
            },
        }
    }

    /// What kind of failure it is, for the transports to map.
    pub fn kind(&self) -> ErrorKind {
        match self {
            IssueError::InvalidCount { .. }
            | IssueError::UnknownKind(_)
            | IssueError::InvalidKey(_)
            | IssueError::NoShardField(_)
            | IssueError::MalformedId(_)
            | IssueError::InvalidParameter(_)
            | IssueError::Clock(GenerateError::InvalidCount { .. }) => ErrorKind::BadInput,
            IssueError::Clock(GenerateError::EpochExhausted { .. }) | IssueError::BadNodeId(_) => {
                ErrorKind::Broken
            }
            IssueError::NoTickets | IssueError::Tickets(TicketError::UnknownSequence(_)) => {
                ErrorKind::NotFound
            }
            IssueError::Tickets(TicketError::BadCount { .. } | TicketError::Config(_)) => {
                ErrorKind::BadInput
            }
            // Like the layout's end: no retry helps until an operator acts.
            IssueError::Tickets(TicketError::Exhausted { .. }) => ErrorKind::Broken,
            _ => ErrorKind::Unavailable,
        }
    }
}

/// The three things a client must know about a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is wrong; retrying it will not help.
    BadInput,
    /// The request names something this node does not have (a ticket
    /// sequence).
    NotFound,
    /// This node cannot answer now; retry (on another node if there is one).
    Unavailable,
    /// This node cannot answer until an operator acts (configuration, the
    /// layout's end of life).
    Broken,
}

impl From<GenerateError> for IssueError {
    fn from(e: GenerateError) -> Self {
        match e {
            GenerateError::InvalidCount { requested, max } => IssueError::InvalidCount {
                text: requested.to_string(),
                max,
            },
            e => IssueError::Clock(e),
        }
    }
}

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// Stable machine-readable code (`invalid_count`, `no_lease`, ...).
    pub code: &'static str,
    /// What happened, for people.
    pub message: String,
    /// HTTP status.
    pub status: u16,
}

impl ApiError {
    /// A new error.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            status,
        }
    }
    /// 400 with a code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(400, code, message)
    }
    /// The JSON body.
    pub fn to_json(&self) -> String {
        serde_json::json!({ "error": { "code": self.code, "message": self.message } }).to_string()
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_the_documented_ones() {
        let cases = [
            (
                IssueError::NoLease("acquiring"),
                "no_lease",
                ErrorKind::Unavailable,
            ),
            (IssueError::Fenced, "no_lease", ErrorKind::Unavailable),
            (
                IssueError::HighWaterNotRecorded,
                "high_water_not_recorded",
                ErrorKind::Unavailable,
            ),
            (
                IssueError::Busy {
                    at_once: 2,
                    over: 65_536,
                },
                "busy",
                ErrorKind::Unavailable,
            ),
            (
                GenerateError::ClockMovedBackwards { behind_ms: 5 }.into(),
                "clock_moved_backwards",
                ErrorKind::Unavailable,
            ),
            (
                GenerateError::ClockStalled { waited_ms: 5 }.into(),
                "clock_stalled",
                ErrorKind::Unavailable,
            ),
            (
                GenerateError::InvalidCount {
                    requested: 0,
                    max: 9,
                }
                .into(),
                "invalid_count",
                ErrorKind::BadInput,
            ),
            (
                IssueError::MalformedId("x".into()),
                "malformed_id",
                ErrorKind::BadInput,
            ),
            (
                IssueError::BadNodeId("x".into()),
                "bad_node_id",
                ErrorKind::Broken,
            ),
            (
                IssueError::NoTickets,
                "unknown_sequence",
                ErrorKind::NotFound,
            ),
            (
                IssueError::Tickets(TicketError::UnknownSequence("x".into())),
                "unknown_sequence",
                ErrorKind::NotFound,
            ),
            (
                IssueError::Tickets(TicketError::BadCount { count: 0, max: 9 }),
                "invalid_count",
                ErrorKind::BadInput,
            ),
            (
                IssueError::Tickets(TicketError::Unavailable {
                    sequence: "x".into(),
                    failures: vec![],
                }),
                "unavailable",
                ErrorKind::Unavailable,
            ),
            (
                IssueError::Tickets(TicketError::Exhausted {
                    sequence: "x".into(),
                    max: 9,
                }),
                "exhausted",
                ErrorKind::Broken,
            ),
        ];
        for (e, code, kind) in cases {
            assert_eq!((e.code(), e.kind()), (code, kind), "{e:?}");
        }
        let e = ApiError::bad_request("invalid_count", "no");
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_count");
    }
}
