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
//!
//! Every code a client can see is a [`Code`], listed once below; the
//! OpenAPI document's list of codes is made from [`Code::ALL`].

use std::fmt;
use std::time::Duration;

use shardflake::{GenerateError, TimeRangeError};
use shardflake_tickets::TicketError;

/// Why the issuer could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// No node id is held (acquiring, lost, stopped).
    #[error("this node holds no node id right now ({0}); retry on another node")]
    NoLease(&'static str),
    /// A node id is held, but the clock has not yet passed its recorded
    /// high-water (state file or registry): nothing is issued until it has.
    #[error("this node waits for its clock to pass its recorded high-water; retry on another node")]
    WaitingForClock,
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
    /// A span of time with no ids in the layout (`/v1/range`): outside its
    /// life, empty, or a layout with a field above time.
    #[error(transparent)]
    TimeRange(TimeRangeError),
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
    /// A request body that is not the JSON the operation takes.
    #[error("{0}")]
    InvalidBody(String),
    /// A request body over the configured limit.
    #[error("request body over {max} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    /// A request body not received within the time allowed.
    #[error("request body not received within {0:?}")]
    BodyTimeout(Duration),
    /// A path no route answers.
    #[error("no such route; see /openapi.json")]
    NoRoute,
    /// A method the route does not take.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// Plain HTTP sent to the HTTPS port.
    #[error("this port serves HTTPS (TLS); use https://")]
    TlsRequired,
    /// The server failed making the answer (a task that did not finish).
    #[error("{0}")]
    Internal(String),
}

/// Declares [`Code`] and its text once, so the list cannot drift.
macro_rules! codes {
    ($($(#[doc = $doc:literal])* $name:ident = $text:literal,)*) => {
        /// A stable, machine-readable error code, as clients see it (HTTP
        /// `error.code`, gRPC `x-error-code`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Code {
            $($(#[doc = $doc])* $name,)*
        }

        impl Code {
            /// Every code, in the order the OpenAPI document lists them.
            pub(crate) const ALL: &'static [Code] = &[$(Code::$name,)*];

            /// The code as text.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Code::$name => $text,)*
                }
            }
        }
    };
}

codes! {
    /// A count outside `1..=max`.
    InvalidCount = "invalid_count",
    /// A request body that is not the JSON asked for.
    InvalidBody = "invalid_body",
    /// A request body over the configured limit.
    BodyTooLarge = "body_too_large",
    /// A request body not received in time.
    BodyTimeout = "body_timeout",
    /// Text that is not an id of the layout.
    MalformedId = "malformed_id",
    /// An id kind the service does not make.
    UnknownKind = "unknown_kind",
    /// A sharding key that is not a whole number.
    InvalidKey = "invalid_key",
    /// A shard id asked of a layout without a shard field.
    NoShardField = "no_shard_field",
    /// An unknown, repeated or bad query parameter.
    InvalidParameter = "invalid_parameter",
    /// A time before the layout's epoch or at or after its end of life.
    TimeOutOfRange = "time_out_of_range",
    /// A span of time that is empty (from not before to), or a layout
    /// whose ids of a span are not one range.
    InvalidSpan = "invalid_span",
    /// No node id held, or fenced.
    NoLease = "no_lease",
    /// The node waits for the clock to pass a recorded high-water.
    WaitingForClock = "waiting_for_clock",
    /// Too many large batches at once.
    Busy = "busy",
    /// The clock went back.
    ClockMovedBackwards = "clock_moved_backwards",
    /// The clock stands still.
    ClockStalled = "clock_stalled",
    /// The clock is before the layout's epoch.
    ClockBeforeEpoch = "clock_before_epoch",
    /// The layout's time field is used up.
    EpochExhausted = "epoch_exhausted",
    /// The clock is past the last recorded high-water time.
    HighWaterNotRecorded = "high_water_not_recorded",
    /// The node id held does not fit the layout.
    BadNodeId = "bad_node_id",
    /// No such route.
    NotFound = "not_found",
    /// The route does not take this method.
    MethodNotAllowed = "method_not_allowed",
    /// The API's bearer token is missing or wrong.
    Unauthorized = "unauthorized",
    /// Plain HTTP on the HTTPS port.
    TlsRequired = "tls_required",
    /// A failure of the server itself.
    Internal = "internal",
    /// A ticket sequence this node does not serve.
    UnknownSequence = "unknown_sequence",
    /// No ticket server could answer.
    Unavailable = "unavailable",
    /// A ticket sequence reached its end.
    Exhausted = "exhausted",
    /// The ticket servers' configuration is refused.
    BadConfig = "bad_config",
    /// A ticket server is behind its recorded high-water.
    BehindHighWater = "behind_high_water",
    /// A ticket server's counter went back.
    WentBack = "went_back",
    /// A ticket server's table or sequence was recreated under a client.
    Recreated = "recreated",
    /// No ticket high-water could be read.
    NoHighWater = "no_high_water",
    /// A ticket server's residue class was taken over by another server.
    Superseded = "superseded",
    /// The ticket servers' lattice changed.
    LatticeChanged = "lattice_changed",
    /// A ticket server is set up differently from the file.
    Misconfigured = "misconfigured",
    /// A ticket server's database failed.
    Database = "database",
    /// A ticket server did not answer in time.
    Timeout = "timeout",
}

impl IssueError {
    /// A `format` that is not one of the text forms (one wording for both
    /// transports).
    pub(crate) fn unknown_format(given: &str) -> IssueError {
        IssueError::InvalidParameter(format!(
            "format must be dec, hex, base32 or base62, got {given:?}"
        ))
    }

    /// The stable, machine-readable code clients see.
    pub fn code(&self) -> &'static str {
        self.error_code().as_str()
    }

    /// The code, as one of the list of [`Code`]s.
    pub(crate) fn error_code(&self) -> Code {
        match self {
            IssueError::WaitingForClock => Code::WaitingForClock,
            IssueError::NoLease(_) | IssueError::Fenced => Code::NoLease,
            IssueError::HighWaterNotRecorded => Code::HighWaterNotRecorded,
            IssueError::Busy { .. } => Code::Busy,
            IssueError::Clock(e) => match e {
                GenerateError::ClockMovedBackwards { .. } => Code::ClockMovedBackwards,
                GenerateError::ClockStalled { .. } => Code::ClockStalled,
                GenerateError::BeforeEpoch { .. } => Code::ClockBeforeEpoch,
                GenerateError::EpochExhausted { .. } => Code::EpochExhausted,
                GenerateError::InvalidCount { .. } => Code::InvalidCount,
            },
            IssueError::InvalidCount { .. } => Code::InvalidCount,
            IssueError::UnknownKind(_) => Code::UnknownKind,
            IssueError::InvalidKey(_) => Code::InvalidKey,
            IssueError::NoShardField(_) => Code::NoShardField,
            IssueError::MalformedId(_) => Code::MalformedId,
            IssueError::InvalidParameter(_) => Code::InvalidParameter,
            IssueError::TimeRange(e) => match e {
                TimeRangeError::BeforeEpoch { .. } | TimeRangeError::AfterEndOfLife { .. } => {
                    Code::TimeOutOfRange
                }
                TimeRangeError::NotBefore { .. } | TimeRangeError::FieldAboveTime { .. } => {
                    Code::InvalidSpan
                }
            },
            IssueError::BadNodeId(_) => Code::BadNodeId,
            IssueError::NoTickets => Code::UnknownSequence,
            IssueError::Tickets(e) => match e {
                TicketError::Config(_) => Code::BadConfig,
                TicketError::UnknownSequence(_) => Code::UnknownSequence,
                TicketError::BadCount { .. } => Code::InvalidCount,
                TicketError::Unavailable { .. } => Code::Unavailable,
                TicketError::Exhausted { .. } => Code::Exhausted,
                TicketError::BehindHighWater { .. } => Code::BehindHighWater,
                TicketError::WentBack { .. } => Code::WentBack,
                TicketError::Recreated { .. } => Code::Recreated,
                TicketError::NoHighWater { .. } => Code::NoHighWater,
                TicketError::Superseded(_) => Code::Superseded,
                TicketError::LatticeChanged { .. } => Code::LatticeChanged,
                TicketError::Misconfigured { .. } => Code::Misconfigured,
                TicketError::Database { .. } => Code::Database,
                TicketError::Timeout { .. } => Code::Timeout,
            },
            IssueError::InvalidBody(_) => Code::InvalidBody,
            IssueError::BodyTooLarge { .. } => Code::BodyTooLarge,
            IssueError::BodyTimeout(_) => Code::BodyTimeout,
            IssueError::NoRoute => Code::NotFound,
            IssueError::MethodNotAllowed => Code::MethodNotAllowed,
            IssueError::TlsRequired => Code::TlsRequired,
            IssueError::Internal(_) => Code::Internal,
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
            | IssueError::TimeRange(_)
            | IssueError::InvalidBody(_)
            | IssueError::BodyTooLarge { .. }
            | IssueError::BodyTimeout(_)
            | IssueError::MethodNotAllowed
            | IssueError::TlsRequired
            | IssueError::Clock(GenerateError::InvalidCount { .. }) => ErrorKind::BadInput,
            IssueError::Clock(GenerateError::EpochExhausted { .. })
            | IssueError::BadNodeId(_)
            | IssueError::Internal(_) => ErrorKind::Broken,
            IssueError::NoTickets
            | IssueError::NoRoute
            | IssueError::Tickets(TicketError::UnknownSequence(_)) => ErrorKind::NotFound,
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

/// The ticket client's refusals; a count out of range reads as the
/// service's own (one wording for every count).
impl From<TicketError> for IssueError {
    fn from(e: TicketError) -> Self {
        match e {
            TicketError::BadCount { count, max } => IssueError::InvalidCount {
                text: count.to_string(),
                max: max as u64,
            },
            e => IssueError::Tickets(e),
        }
    }
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
                IssueError::WaitingForClock,
                "waiting_for_clock",
                ErrorKind::Unavailable,
            ),
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

    #[test]
    fn codes_are_listed_once_and_tickets_keep_theirs() {
        let mut texts: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        texts.sort_unstable();
        texts.dedup();
        assert_eq!(texts.len(), Code::ALL.len());
        for e in [
            TicketError::UnknownSequence("x".into()),
            TicketError::Exhausted {
                sequence: "x".into(),
                max: 9,
            },
        ] {
            assert_eq!(IssueError::from(e.clone()).code(), e.code());
        }
        // One wording for a count out of range, whoever refuses it.
        let e = IssueError::from(TicketError::BadCount { count: 0, max: 9 });
        assert_eq!(
            e,
            IssueError::InvalidCount {
                text: "0".into(),
                max: 9
            }
        );
    }
}
