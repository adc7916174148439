//! What a failed call means: the next member, a token to renew, or a
//! final error; TLS failures in words, with the setting most likely at
//! fault.

use tonic::{Code, Status};

use crate::connection::{Failure, MemberFailure};
use crate::error::EtcdError;

/// What the TLS failure hints need to know about the settings.
#[derive(Debug, Clone)]
pub(crate) struct TlsHint {
    pub(crate) has_client_cert: bool,
    /// TLS is configured (https endpoints).
    pub(crate) tls: bool,
    /// No member has answered this client yet.
    pub(crate) never_answered: bool,
}

/// The connection ended under the call: closed, reset, or a broken pipe.
fn closed_under_us(status: &Status) -> bool {
    let chain = error_chain(status).to_lowercase();
    ["connection closed", "broken pipe", "connection reset"]
        .iter()
        .any(|m| chain.contains(m))
}

/// Sorts a failed call: a local (transport) failure or an overloaded,
/// leaderless member moves on to the next member; token trouble renews the
/// token; anything else etcd says is final.
pub(crate) fn classify(status: &Status, authenticated: bool, hint: &TlsHint) -> Failure {
    if let Some(tls) = find_tls_error(status) {
        return Failure::Member(MemberFailure {
            reason: tls_reason(&tls, hint),
            refused: false,
            tls: true,
        });
    }
    // A TLS 1.3 member refuses a missing client certificate after the
    // client's side of the handshake is done: the refusal is an alert on
    // the next read, or, when the close wins the race (the member resets
    // the connection and the alert is lost), just a closed connection, or a
    // broken pipe when the client was still writing its request.
    // Before etcd has ever answered this client, over TLS without a client
    // certificate, that is the likely cause; once it has answered, a
    // closed connection is an outage and stays retryable.
    if hint.tls && !hint.has_client_cert && hint.never_answered && closed_under_us(status) {
        return Failure::Member(MemberFailure {
            reason: "the member closed the connection after the TLS handshake: etcd requires a client certificate (--client-cert-auth)? set --etcd-cert and --etcd-key".into(),
            refused: false,
            tls: true,
        });
    }
    // A status with a source was made here, from a transport error; one
    // etcd sent has none.
    if std::error::Error::source(status).is_some() {
        return Failure::Member(MemberFailure {
            reason: error_chain(status),
            refused: connection_refused(status),
            tls: false,
        });
    }
    let msg = status.message();
    match status.code() {
        // etcdserver: no leader, leader changed, request timed out, too many requests.
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Cancelled => {
            Failure::Member(MemberFailure::late(format!("{:?}: {msg}", status.code())))
        }
        // etcd's token errors (rpctypes ErrInvalidAuthToken, ErrAuthOldRevision),
        // the ones clientv3 renews its token on.
        _ if msg.contains("invalid auth token")
            || msg.contains("revision of auth store is old") =>
        {
            Failure::TokenRejected(msg.to_string())
        }
        _ if msg.contains("user name is empty") && !authenticated => {
            Failure::Fatal(EtcdError::Auth(
                "etcd requires authentication: set --etcd-user and --etcd-password-file".into(),
            ))
        }
        _ if msg.contains("user name is empty") => Failure::TokenRejected(msg.to_string()),
        // Without a token etcd checks the client certificate's common name
        // as the user, if there is one.
        Code::PermissionDenied if !authenticated => Failure::Fatal(EtcdError::Auth(format!(
            "{msg} (no --etcd-user set: set --etcd-user and --etcd-password-file, or grant the client certificate's common name a role)"
        ))),
        // A role that does not cover the prefix: a node reads the whole
        // prefix and writes node, high-water, layout and queue keys under it.
        Code::PermissionDenied => Failure::Fatal(EtcdError::Auth(format!(
            "{msg} (the user's role must allow readwrite on the whole --etcd-prefix and on the fleets' registry, shardflake.fleets/ and, where earlier versions registered fleets, /shardflake.fleets/: etcdctl role grant-permission ROLE readwrite PREFIX/ --prefix=true, and the same for shardflake.fleets/ and /shardflake.fleets/)"
        ))),
        Code::Unauthenticated => Failure::Fatal(EtcdError::Auth(msg.to_string())),
        _ if msg.contains("authentication failed")
            || msg.contains("authentication is not enabled") =>
        {
            Failure::Fatal(EtcdError::Auth(msg.to_string()))
        }
        code => Failure::Fatal(EtcdError::Server(format!("{code:?}: {msg}"))),
    }
}

/// Every error in the chain, `: `-separated (tonic's own message is short).
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !text.contains(&s) {
            text.push_str(": ");
            text.push_str(&s);
        }
        source = next_source(e);
    }
    text
}

/// The next error down the chain. `io::Error::source` skips the error it
/// wraps (rustls puts its own inside one), so look through it.
fn next_source<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a (dyn std::error::Error + 'static)> {
    if let Some(io) = e.downcast_ref::<std::io::Error>()
        && let Some(inner) = io.get_ref()
    {
        return Some(inner);
    }
    e.source()
}

fn find_tls_error(status: &Status) -> Option<rustls::Error> {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.clone());
        }
        // An alert after the handshake (TLS 1.3 servers refuse a client
        // certificate that way) reaches us as text inside an io::Error.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
            && let Some(alert) = io.to_string().strip_prefix("received fatal alert: ")
            && let Some(alert) = (0..=u8::MAX)
                .map(rustls::AlertDescription::from)
                .find(|a| format!("{a:?}") == alert)
        {
            return Some(rustls::Error::AlertReceived(alert));
        }
        source = next_source(e);
    }
    None
}

fn connection_refused(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = next_source(e);
    }
    false
}

/// A TLS failure in words, with the setting most likely at fault.
fn tls_reason(err: &rustls::Error, hint: &TlsHint) -> String {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let advice = match err {
        E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => {
            "the member's certificate is not signed by the CA in --etcd-ca"
        }
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
            "the member's certificate does not name this endpoint's host"
        }
        E::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "the member's certificate has expired"
        }
        E::AlertReceived(A::CertificateRequired | A::HandshakeFailure | A::BadCertificate)
            if !hint.has_client_cert =>
        {
            "etcd requires a client certificate (--client-cert-auth): set --etcd-cert and --etcd-key"
        }
        E::AlertReceived(
            A::BadCertificate | A::UnknownCA | A::CertificateUnknown | A::DecryptError,
        ) => "etcd refused this client's certificate: is it signed by etcd's --trusted-ca-file?",
        E::InvalidMessage(_) => "no TLS at this endpoint: is it an http:// port?",
        _ => "check --etcd-ca, --etcd-cert and --etcd-key",
    };
    format!("{err} ({advice})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_answers_are_sorted_into_retry_renew_or_final() {
        let hint = TlsHint {
            has_client_cert: false,
            tls: true,
            never_answered: true,
        };
        let sort = |s: Status, auth: bool| match classify(&s, auth, &hint) {
            Failure::Member(_) => "next member",
            Failure::TokenRejected(_) => "renew token",
            Failure::Busy(_) => "busy",
            Failure::Fatal(EtcdError::Auth(_)) => "auth",
            Failure::Fatal(EtcdError::Server(_)) => "server",
            Failure::Fatal(_) => "other",
        };
        assert_eq!(
            sort(Status::unavailable("etcdserver: no leader"), false),
            "next member"
        );
        assert_eq!(
            sort(Status::unavailable("etcdserver: request timed out"), false),
            "next member"
        );
        assert_eq!(
            sort(
                Status::unauthenticated("etcdserver: invalid auth token"),
                true
            ),
            "renew token"
        );
        assert_eq!(
            sort(
                Status::invalid_argument("etcdserver: revision of auth store is old"),
                true
            ),
            "renew token"
        );
        assert_eq!(
            sort(
                Status::invalid_argument("etcdserver: user name is empty"),
                false
            ),
            "auth"
        );
        assert_eq!(
            sort(
                Status::invalid_argument(
                    "etcdserver: authentication failed, invalid user ID or password"
                ),
                true
            ),
            "auth"
        );
        assert_eq!(
            sort(
                Status::permission_denied("etcdserver: permission denied"),
                true
            ),
            "auth"
        );
        assert_eq!(
            sort(
                Status::invalid_argument("etcdserver: key is not provided"),
                false
            ),
            "server"
        );
    }

    /// A connection closed right after the handshake is a refused client
    /// certificate only before etcd ever answered; afterwards it is an
    /// outage, retried, never a reason to stop the node.
    #[test]
    fn a_closed_connection_is_tls_only_before_the_first_answer() {
        for how in [
            "connection closed",
            "stream closed because of a broken pipe",
            "Connection reset by peer (os error 104)",
        ] {
            let closed = || Status::from_error(Box::new(std::io::Error::other(how)));
            let is_tls = |never_answered| {
                let hint = TlsHint {
                    has_client_cert: false,
                    tls: true,
                    never_answered,
                };
                matches!(classify(&closed(), false, &hint), Failure::Member(m) if m.tls)
            };
            assert!(is_tls(true), "{how}");
            assert!(!is_tls(false), "{how}");
        }
    }

    #[test]
    fn tls_failures_name_the_setting() {
        use rustls::{AlertDescription, CertificateError, Error};
        let without = TlsHint {
            has_client_cert: false,
            tls: true,
            never_answered: true,
        };
        let with = TlsHint {
            has_client_cert: true,
            tls: true,
            never_answered: true,
        };
        let unknown_ca = Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(tls_reason(&unknown_ca, &without).contains("--etcd-ca"));
        let required = Error::AlertReceived(AlertDescription::CertificateRequired);
        assert!(tls_reason(&required, &without).contains("--etcd-cert"));
        let refused = Error::AlertReceived(AlertDescription::BadCertificate);
        assert!(tls_reason(&refused, &with).contains("refused this client's certificate"));
    }
}
