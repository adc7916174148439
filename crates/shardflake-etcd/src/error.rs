//! What went wrong talking to etcd: the crate's one error.

/// What went wrong talking to etcd.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered.
    #[error("etcd unreachable at {endpoints}: {last}")]
    Unreachable {
        /// The endpoints tried.
        endpoints: String,
        /// The last failure.
        last: String,
        /// Every endpoint refused the connection (nothing listening), as
        /// opposed to a slow answer.
        refused: bool,
    },
    /// No endpoint answered, and the TLS handshake failed with at least one
    /// (wrong CA, missing or refused client certificate, TLS against a
    /// plain-text port).
    #[error("TLS with etcd failed at {endpoints}: {reason}")]
    Tls {
        /// The endpoints tried.
        endpoints: String,
        /// The handshake failure, with a hint at the setting to check.
        reason: String,
    },
    /// etcd refused the credentials: wrong user or password, permission
    /// denied, or authentication required but not configured.
    #[error("etcd authentication failed: {0}")]
    Auth(String),
    /// The client's own settings are unusable (an endpoint URL, a
    /// certificate or key file).
    #[error("etcd client settings: {0}")]
    Config(String),
    /// etcd answered with an error.
    #[error("etcd error: {0}")]
    Server(String),
    /// An answer that does not read as expected.
    #[error("unexpected etcd answer: {0}")]
    Protocol(String),
    /// etcd took the call but has not answered it in time: a login queued
    /// behind others' password checks. Retrying later helps.
    #[error("etcd busy: {0}")]
    Busy(String),
}

impl EtcdError {
    /// A failure retrying cannot fix: the operator must change a setting
    /// (TLS files, credentials, endpoint URLs).
    pub fn needs_operator(&self) -> bool {
        matches!(
            self,
            EtcdError::Tls { .. } | EtcdError::Auth(_) | EtcdError::Config(_)
        )
    }
}
