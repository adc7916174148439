//! The client and its members: endpoints, TLS settings, lazily made
//! connections, and [`Client::failover`], the one loop every call runs
//! through (member failover, token renewal).

use std::future::Future;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::Status;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::diagnosis::{TlsHint, classify};
use crate::error::EtcdError;
use crate::lease::KeepAliveStream;
use crate::login::{EtcdAuth, Login};
use crate::{lock, random_below};

/// TLS to etcd's `https://` endpoints: the CA that signed the members'
/// certificates and, for members run with `--client-cert-auth`, this
/// client's certificate. PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA certificate(s) the members' certificates must chain to.
    pub ca_file: PathBuf,
    /// Client certificate and key, for mutual TLS.
    pub client_cert: Option<ClientCert>,
}

/// A client certificate and its private key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate (chain).
    pub cert_file: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
}

impl EtcdTls {
    /// Reads and checks the files: the CA file holds at least one
    /// certificate, the client certificate at least one, the key a private
    /// key. Errors name the file.
    pub fn load(&self) -> Result<ClientTlsConfig, EtcdError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let read = |path: &Path, what: &str| {
            std::fs::read(path)
                .map_err(|e| EtcdError::Config(format!("{what} {}: {e}", path.display())))
        };
        let certs = |pem: &[u8], path: &Path, what: &str| {
            let n = CertificateDer::pem_slice_iter(pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| EtcdError::Config(format!("{what} {}: {e}", path.display())))?
                .len();
            if n == 0 {
                return Err(EtcdError::Config(format!(
                    "{what} {}: no PEM certificate in it",
                    path.display()
                )));
            }
            Ok(())
        };
        let ca = read(&self.ca_file, "CA file")?;
        certs(&ca, &self.ca_file, "CA file")?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if let Some(client) = &self.client_cert {
            let cert = read(&client.cert_file, "client certificate")?;
            certs(&cert, &client.cert_file, "client certificate")?;
            let key = read(&client.key_file, "client key")?;
            PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                EtcdError::Config(format!(
                    "client key {}: no PEM private key in it ({e})",
                    client.key_file.display()
                ))
            })?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        Ok(config)
    }
}

/// One member: its URL and connection.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) url: String,
    /// `Err`: the URL or TLS settings are unusable; every call says why.
    pub(crate) endpoint: Result<Endpoint, String>,
    /// Connected lazily; replaced after a failure or a late answer.
    pub(crate) channel: Mutex<Option<Channel>>,
}

/// A client for a list of endpoints.
#[derive(Debug)]
pub struct Client {
    pub(crate) members: Vec<Member>,
    pub(crate) timeout: Duration,
    preferred: AtomicUsize,
    pub(crate) auth: Option<EtcdAuth>,
    /// The token while etcd accepts it, and the logins in flight.
    pub(crate) login: Arc<Mutex<Login>>,
    pub(crate) keep_alive: Mutex<Option<Arc<KeepAliveStream>>>,
    hint: TlsHint,
    /// Some member has answered some call: from then on a closed
    /// connection is an outage, never a refused client certificate.
    pub(crate) answered: AtomicBool,
}

/// One try at one member: what it came to, and the auth token it sent
/// (forgotten if etcd rejected it).
pub(crate) struct Tried<T> {
    pub(crate) outcome: Result<T, Failure>,
    pub(crate) token: Option<AsciiMetadataValue>,
}

impl Client {
    /// A client for plain `http://host:port` endpoints, without
    /// authentication. An endpoint that is not a valid URL fails every call
    /// with [`EtcdError::Config`]; [`Client::connect`] checks them up front.
    pub fn new(endpoints: &[String], timeout: Duration) -> Self {
        Self::build(endpoints, timeout, None, None)
    }

    /// A client with TLS for `https://` endpoints and, optionally,
    /// user/password authentication. Fails on an unusable endpoint URL or
    /// TLS file; nothing is sent to etcd yet.
    pub fn connect(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<&EtcdTls>,
        auth: Option<&EtcdAuth>,
    ) -> Result<Self, EtcdError> {
        let tls = match tls {
            Some(t) => Some((t.load()?, t.client_cert.is_some())),
            None => None,
        };
        let client = Self::build(endpoints, timeout, tls, auth.cloned());
        for m in &client.members {
            if let Err(e) = &m.endpoint {
                return Err(EtcdError::Config(e.clone()));
            }
        }
        Ok(client)
    }

    fn build(
        endpoints: &[String],
        timeout: Duration,
        tls: Option<(ClientTlsConfig, bool)>,
        auth: Option<EtcdAuth>,
    ) -> Self {
        let hint = TlsHint {
            has_client_cert: tls.as_ref().is_some_and(|(_, client_cert)| *client_cert),
            tls: tls.is_some(),
            never_answered: true,
        };
        let members = endpoints
            .iter()
            .map(|url| {
                let endpoint = Endpoint::from_shared(url.trim_end_matches('/').to_string())
                    .map_err(|e| format!("endpoint {url:?}: {e}"))
                    .and_then(|e| {
                        let e = e.connect_timeout(timeout).tcp_nodelay(true);
                        match (&tls, url.starts_with("https://")) {
                            (Some((tls, _)), true) => e
                                .tls_config(tls.clone())
                                .map_err(|err| format!("endpoint {url}: TLS settings: {err}")),
                            (None, true) => {
                                Err(format!("endpoint {url}: https needs a CA file (--etcd-ca)"))
                            }
                            (_, false) => Ok(e),
                        }
                    });
                Member {
                    url: url.clone(),
                    endpoint,
                    channel: Mutex::new(None),
                }
            })
            .collect();
        Client {
            members,
            timeout,
            preferred: AtomicUsize::new(random_below(endpoints.len())),
            auth,
            login: Arc::default(),
            keep_alive: Mutex::new(None),
            hint,
            answered: AtomicBool::new(false),
        }
    }

    fn endpoint_list(&self) -> String {
        self.members
            .iter()
            .map(|m| m.url.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The member's channel, connecting lazily (needs the tokio runtime).
    pub(crate) fn channel(&self, idx: usize) -> Result<Channel, Failure> {
        let member = &self.members[idx];
        let endpoint = member
            .endpoint
            .as_ref()
            .map_err(|e| Failure::Fatal(EtcdError::Config(e.clone())))?;
        Ok(lock(&member.channel)
            .get_or_insert_with(|| endpoint.connect_lazy())
            .clone())
    }

    /// Drops a member's connection after a failure: the next call connects
    /// afresh instead of queueing behind a stalled one.
    pub(crate) fn reset(&self, idx: usize) {
        *lock(&self.members[idx].channel) = None;
    }

    /// Runs `try_member` on the members in turn, from the last one that
    /// answered, until one answers: a member that cannot serve is left (its
    /// connection dropped, and `drop_member` run) for the next; a rejected
    /// token is forgotten (after `drop_member`) and the member tried again,
    /// once; anything else etcd says is final.
    pub(crate) async fn failover<T, F, Fut>(
        &self,
        rpc: &'static str,
        mut try_member: F,
        drop_member: impl Fn(),
    ) -> Result<T, EtcdError>
    where
        F: FnMut(usize) -> Fut,
        Fut: Future<Output = Tried<T>>,
    {
        let n = self.members.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Failures::default();
        for i in 0..n {
            let idx = (start + i) % n;
            let mut renewed_token = false;
            loop {
                let Tried { outcome, token } = try_member(idx).await;
                match outcome {
                    Ok(v) => {
                        self.preferred.store(idx, Ordering::Relaxed);
                        self.answered.store(true, Ordering::Relaxed);
                        return Ok(v);
                    }
                    Err(Failure::TokenRejected(msg)) if !renewed_token => {
                        tracing::debug!(rpc, reason = %msg, "etcd rejected the auth token; renewing it");
                        drop_member();
                        self.forget_token(token.as_ref());
                        renewed_token = true;
                    }
                    Err(Failure::TokenRejected(msg)) => return Err(EtcdError::Auth(msg)),
                    Err(Failure::Fatal(e)) => return Err(e),
                    // The member is there, at the login: another member
                    // would cost etcd one more.
                    Err(Failure::Busy(msg)) => return Err(EtcdError::Busy(msg)),
                    Err(Failure::Member(m)) => {
                        drop_member();
                        self.reset(idx);
                        failures.add(&self.members[idx].url, m);
                        break;
                    }
                }
            }
        }
        Err(failures.into_error(self.endpoint_list()))
    }

    /// `attempt` within the request timeout; no answer in time is the
    /// member's failure.
    pub(crate) async fn within<T>(
        &self,
        attempt: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        tokio::time::timeout(self.timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(Failure::Member(MemberFailure::late(format!(
                    "no answer within {:?}",
                    self.timeout
                ))))
            })
    }

    /// Runs `rpc` on the first member that answers, each try within the
    /// timeout; a rejected token is renewed once per member.
    pub(crate) async fn call<T, F, Fut>(&self, rpc: &'static str, f: F) -> Result<T, EtcdError>
    where
        F: Fn(Channel, Option<AsciiMetadataValue>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let hint = &self.hint();
        let f = &f;
        let try_member = |idx| async move {
            let started = std::time::Instant::now();
            // The login has its own bound (inside `token`).
            let token = self.token(idx).await;
            let used = token.as_ref().ok().cloned().flatten();
            let outcome = match token {
                Err(failure) => Err(failure),
                Ok(token) => {
                    self.within(async {
                        let channel = self.channel(idx)?;
                        f(channel, token)
                            .await
                            .map_err(|s| classify(&s, self.auth.is_some(), hint))
                    })
                    .await
                }
            };
            if started.elapsed() > self.timeout / 2 {
                tracing::warn!(rpc, endpoint = %self.members[idx].url, took = ?started.elapsed(), "slow etcd call");
            }
            Tried {
                outcome,
                token: used,
            }
        };
        self.failover(rpc, try_member, || {}).await
    }

    /// What a failure's wording needs to know about the settings, now.
    pub(crate) fn hint(&self) -> TlsHint {
        TlsHint {
            never_answered: !self.answered.load(Ordering::Relaxed),
            ..self.hint.clone()
        }
    }
}

/// What one try at one member came to.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// This member cannot serve now: try the next one.
    Member(MemberFailure),
    /// etcd rejected the auth token: renew it and try again.
    TokenRejected(String),
    /// The login this call waits for is in flight and has its connection:
    /// another member would cost etcd another login.
    Busy(String),
    /// Another member would say the same: give up.
    Fatal(EtcdError),
}

#[derive(Debug, Clone)]
pub(crate) struct MemberFailure {
    pub(crate) reason: String,
    /// Nothing listening (connection refused).
    pub(crate) refused: bool,
    /// The TLS handshake failed.
    pub(crate) tls: bool,
}

impl MemberFailure {
    pub(crate) fn late(reason: String) -> Self {
        MemberFailure {
            reason,
            refused: false,
            tls: false,
        }
    }
}

/// The member failures of one call, summed up into its error.
#[derive(Debug)]
struct Failures {
    last: String,
    refused: bool,
    tls: Option<String>,
}

impl Default for Failures {
    fn default() -> Self {
        Failures {
            last: "no endpoints".into(),
            refused: true,
            tls: None,
        }
    }
}

impl Failures {
    fn add(&mut self, url: &str, f: MemberFailure) {
        self.refused &= f.refused;
        if f.tls {
            self.tls = Some(format!("{url}: {}", f.reason));
        }
        self.last = format!("{url}: {}", f.reason);
    }

    fn into_error(self, endpoints: String) -> EtcdError {
        match self.tls {
            Some(reason) => EtcdError::Tls { endpoints, reason },
            None => EtcdError::Unreachable {
                endpoints,
                last: self.last,
                refused: self.refused,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unusable_settings_fail_up_front() {
        let https = vec!["https://127.0.0.1:2379".to_string()];
        let err = Client::connect(&https, Duration::from_secs(1), None, None).unwrap_err();
        assert!(
            matches!(&err, EtcdError::Config(m) if m.contains("--etcd-ca")),
            "{err}"
        );
        let missing = EtcdTls {
            ca_file: "/nonexistent/ca.pem".into(),
            client_cert: None,
        };
        let err =
            Client::connect(&https, Duration::from_secs(1), Some(&missing), None).unwrap_err();
        assert!(matches!(&err, EtcdError::Config(m) if m.contains("/nonexistent/ca.pem")));
        // `new` cannot fail: the bad URL fails each call instead.
        let bad = Client::new(&["http://[::1".to_string()], Duration::from_secs(1));
        assert!(matches!(bad.grant(5).await, Err(EtcdError::Config(_))));
    }
}
