//! The client's typed errors.

use std::fmt;
use std::time::Duration;

/// What went wrong with a call. Cloneable, so a prefetch buffer can hand the
/// same fetch error to every caller waiting on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No endpoint answered: each one tried failed (connection error,
    /// timeout, or a retryable status such as 503) or the call's overall
    /// deadline passed first. One entry per endpoint, in the order tried.
    #[error("all {} endpoint(s) failed: {}", .failures.len(), Failures(.failures))]
    AllFailed {
        /// Each endpoint's last failure in this call.
        failures: Vec<EndpointFailure>,
    },
    /// The service refused the request (HTTP 4xx, gRPC InvalidArgument, …).
    /// Never retried: another node would refuse it too.
    #[error("{endpoint} refused the request ({status}): {code}: {message}")]
    Rejected {
        /// The endpoint that answered.
        endpoint: String,
        /// `HTTP 400`, `gRPC InvalidArgument`, ….
        status: String,
        /// The service's stable error code (`invalid_count`, …), from the
        /// `{"error":{"code"}}` body or the gRPC `x-error-code` metadata.
        code: String,
        /// The service's message.
        message: String,
    },
    /// An answer that is not what the service sends (wrong count, ids not
    /// ascending, unparseable body). Not retried: it points at a wrong
    /// address or a version mismatch, not an outage.
    #[error("malformed answer from {endpoint}: {detail}")]
    Malformed {
        /// The endpoint that answered.
        endpoint: String,
        /// What was wrong.
        detail: String,
    },
    /// An endpoint the builder could not use.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A setting or argument out of range (no endpoints, count 0, …).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A prefetch buffer had no id for the caller within the wait.
    #[error("no id within {0:?}")]
    Timeout(Duration),
}

/// One endpoint's failure within a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointFailure {
    /// The endpoint.
    pub endpoint: String,
    /// The kind of failure.
    pub kind: FailureKind,
    /// Details for people.
    pub message: String,
}

/// Why an endpoint was passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// Connecting, sending or reading failed (refused, reset, closed).
    Connection,
    /// No answer within the per-request timeout.
    Timeout,
    /// The node answered that it cannot issue now (HTTP 5xx/408/429 or gRPC
    /// Unavailable, …), with the service's error code (`no_lease`, `busy`, …).
    Unavailable {
        /// The service's error code, empty when the answer had none.
        code: String,
    },
    /// Not tried: the call's overall deadline passed first.
    NotTried,
}

impl fmt::Display for EndpointFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            FailureKind::Connection => "connection",
            FailureKind::Timeout => "timeout",
            FailureKind::Unavailable { .. } => "unavailable",
            FailureKind::NotTried => "not tried",
        };
        write!(f, "{} ({kind}): {}", self.endpoint, self.message)
    }
}

struct Failures<'a>(&'a [EndpointFailure]);

impl fmt::Display for Failures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// One attempt's outcome inside the failover loop.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// Try the next endpoint.
    Retry(FailureKind, String),
    /// Stop: return this to the caller.
    Fatal(ClientError),
}
