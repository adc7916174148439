//! The service's error: a stable code, a message, and the HTTP status and
//! gRPC code it maps to. Rendered as `{"error":{"code","message"}}`.

use std::fmt;

use shardflake::GenerateError;

/// An error answered to a client.
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
    /// 503: no node id is held, so nothing may be issued.
    pub fn no_lease() -> Self {
        Self::new(
            503,
            "no_lease",
            "this node holds no node id right now (acquiring or fenced); retry on another node",
        )
    }
    /// The invalid-count error for `count` text.
    pub fn invalid_count(text: &str, max: u64) -> Self {
        Self::bad_request(
            "invalid_count",
            format!("count must be a whole number from 1 to {max}, got {text:?}"),
        )
    }
    /// The gRPC status code.
    pub fn grpc_code(&self) -> tonic::Code {
        match self.status {
            400 => tonic::Code::InvalidArgument,
            404 => tonic::Code::NotFound,
            413 => tonic::Code::ResourceExhausted,
            503 => tonic::Code::Unavailable,
            _ => tonic::Code::Internal,
        }
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

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let mut status = tonic::Status::new(e.grpc_code(), e.message.clone());
        if let Ok(v) = e.code.parse() {
            status.metadata_mut().insert("x-error-code", v);
        }
        status
    }
}

impl From<GenerateError> for ApiError {
    fn from(e: GenerateError) -> Self {
        let code = match e {
            GenerateError::ClockMovedBackwards { .. } => "clock_moved_backwards",
            GenerateError::ClockStalled { .. } => "clock_stalled",
            GenerateError::BeforeEpoch { .. } => "clock_before_epoch",
            GenerateError::EpochExhausted { .. } => "epoch_exhausted",
            GenerateError::InvalidCount { .. } => "invalid_count",
        };
        let status = match e {
            GenerateError::InvalidCount { .. } => 400,
            GenerateError::EpochExhausted { .. } => 500,
            _ => 503,
        };
        ApiError::new(status, code, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_and_codes() {
        let e = ApiError::invalid_count("-1", 10);
        let v: serde_json::Value = serde_json::from_str(&e.to_json()).unwrap();
        assert_eq!(v["error"]["code"], "invalid_count");
        assert_eq!(e.grpc_code(), tonic::Code::InvalidArgument);
        assert_eq!(ApiError::no_lease().grpc_code(), tonic::Code::Unavailable);
        let g: ApiError = GenerateError::ClockMovedBackwards { behind_ms: 5 }.into();
        assert_eq!((g.status, g.code), (503, "clock_moved_backwards"));
    }
}
