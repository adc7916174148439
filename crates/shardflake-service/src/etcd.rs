//! A small etcd v3 client over etcd's own gRPC API, generated at build time
//! from etcd's `.proto` files (`proto/etcd/`, compiled by protox in
//! `build.rs`: no `protoc`). Only what node-id leasing needs, each call named
//! as in the etcd API reference: `KV.Range`, `KV.Txn`, `Lease.LeaseGrant`,
//! `Lease.LeaseKeepAlive` (one bidirectional stream), `Lease.LeaseRevoke` and
//! `Auth.Authenticate`.
//!
//! **Endpoints** are tried in turn, starting with the last one that
//! answered (at first, one picked at random, so a fleet's connections and
//! keep-alive streams spread over the members, as etcd's own client
//! balances them, instead of all landing on the first endpoint listed),
//! each attempt bounded by the request timeout: a member that is
//! down, has no leader ("etcdserver: no leader", `UNAVAILABLE`) or does not
//! answer in time is skipped, and its connection dropped, so a stopped member
//! cannot hold a later call.
//!
//! **Keep-alive** runs over one `LeaseKeepAlive` stream per client, opened on
//! first use and reopened (on the next member) when it fails or an answer is
//! late. etcd answers the requests of one stream one at a time, in order
//! (etcd's `LeaseServer.leaseKeepAlive` loop), so the n-th answer belongs to
//! the n-th request: each [`Client::keep_alive`] gets the TTL of the answer
//! to *its* request.
//!
//! **Security**: `https://` endpoints are verified against the CA file of
//! [`EtcdTls`] (no system roots), with an optional client certificate for
//! members started with `--client-cert-auth`; rustls via tonic. With
//! [`EtcdAuth`], the client calls `Auth.Authenticate` and sends the token in
//! the `token` metadata header (etcd's "Authentication" guide); a token etcd
//! rejects (expired simple token, changed auth revision) is renewed once and
//! the call repeated.
//!
//! **Logins** are costly at etcd: it checks each password with bcrypt (a
//! login cost the members about 67 ms of CPU here, `docs/BENCHMARKS.md`),
//! so logins queue when a fleet starts together, or when an auth change (a
//! role or user edited) makes etcd refuse every JWT token at once (simple
//! tokens outlive such a change). A client has at most one login in flight
//! per member, and every call shares the token a login got; a login runs
//! to its end in a task of its own, on a connection it makes (which then
//! serves the calls to that member, if they have none yet), so a call
//! that stops waiting for it (its timeout) wastes nothing, and the next
//! call to that member waits for the same login instead of paying etcd for
//! another. A call that waited its timeout for a login whose connection is
//! up fails with [`EtcdError::Busy`], not as unreachable (another member
//! would cost etcd another login); one whose login got no connection goes
//! on to the next member, as any call does.

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};

/// The code generated from etcd's protos (client side only).
#[allow(missing_docs, dead_code, clippy::all, clippy::pedantic)]
mod pb {
    pub mod mvccpb {
        include!(concat!(env!("OUT_DIR"), "/mvccpb.rs"));
    }
    pub mod authpb {
        include!(concat!(env!("OUT_DIR"), "/authpb.rs"));
    }
    pub mod etcdserverpb {
        include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
    }
}

use pb::etcdserverpb as rpc;
use rpc::auth_client::AuthClient;
use rpc::kv_client::KvClient;
use rpc::lease_client::LeaseClient;

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

/// A key-value pair from a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
    /// The revision that created the key: keys created earlier have lower
    /// ones (a total order over the cluster's writes).
    pub create_revision: i64,
    /// The revision of the key's last write.
    pub mod_revision: i64,
}

/// Which cluster answered a read, and at what revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// The cluster's id (a new cluster, or one restored from a snapshot
    /// with other member settings, has another).
    pub cluster_id: u64,
    /// The cluster's revision when it answered.
    pub revision: i64,
}

/// One comparison of a transaction.
#[derive(Debug, Clone)]
pub enum Compare {
    /// The key does not exist (create revision 0).
    Absent(Vec<u8>),
    /// The key is attached to this lease.
    LeaseIs(Vec<u8>, i64),
    /// The key exists and holds exactly this value.
    ValueIs(Vec<u8>, Vec<u8>),
    /// The key's last write was at this revision (0: the key is absent).
    ModRevisionIs(Vec<u8>, i64),
}

/// One operation of a transaction.
#[derive(Debug, Clone)]
pub enum Op {
    /// Put `key` = `value`, attached to a lease when non-zero.
    Put(Vec<u8>, Vec<u8>, i64),
    /// Read one key.
    Get(Vec<u8>),
    /// Read every key under a prefix.
    Prefix(Vec<u8>),
    /// Count the keys under a prefix (`count_only`: no keys sent back).
    Count(Vec<u8>),
    /// Read the keys (not their values) under a prefix that were created
    /// before a revision.
    KeysCreatedBefore(Vec<u8>, i64),
    /// Delete one key (nothing if it does not exist).
    Delete(Vec<u8>),
}

/// What a transaction (`KV.Txn`) answered.
#[derive(Debug, Clone, Default)]
pub struct TxnAnswer {
    /// Every compare held: the success ops ran (else the failure ops).
    pub succeeded: bool,
    /// The keys read by the `Get`, `Prefix` and `KeysCreatedBefore` ops
    /// that ran, in order.
    pub kvs: Vec<Kv>,
    /// What each `Count` op that ran counted, in order.
    pub counts: Vec<i64>,
    /// The cluster's revision after the transaction (a put that ran was
    /// written at it).
    pub revision: i64,
}

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

/// etcd user/password authentication (`etcdctl auth enable`).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdAuth {
    /// The etcd user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
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
struct Member {
    url: String,
    /// `Err`: the URL or TLS settings are unusable; every call says why.
    endpoint: Result<Endpoint, String>,
    /// Connected lazily; replaced after a failure or a late answer.
    channel: Mutex<Option<Channel>>,
}

/// A client for a list of endpoints.
#[derive(Debug)]
pub struct Client {
    members: Vec<Member>,
    timeout: Duration,
    preferred: AtomicUsize,
    auth: Option<EtcdAuth>,
    /// The token while etcd accepts it, and the logins in flight.
    login: Arc<Mutex<Login>>,
    keep_alive: Mutex<Option<Arc<KeepAliveStream>>>,
    hint: TlsHint,
    /// Some member has answered some call: from then on a closed
    /// connection is an outage, never a refused client certificate.
    answered: AtomicBool,
}

/// A number in `0..n` (0 when `n` is 0), different at each call and in
/// each process: for spreading load over etcd (a client's first member, a
/// racing take's candidate id). Each `RandomState` has fresh keys.
pub(crate) fn random_below(n: usize) -> usize {
    use std::hash::{BuildHasher, Hasher};
    let h = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (h % n.max(1) as u64) as usize
}

/// Locks a mutex whose data stays consistent even if a holder panicked
/// (every critical section here is a single assignment or queue step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
    fn channel(&self, idx: usize) -> Result<Channel, Failure> {
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
    fn reset(&self, idx: usize) {
        *lock(&self.members[idx].channel) = None;
    }

    /// The auth token to send: the one held, or the answer of the login in
    /// flight on member `idx`, started here if there is none. Waits at most
    /// the request timeout; the login goes on without this caller.
    async fn token(&self, idx: usize) -> Result<Option<AsciiMetadataValue>, Failure> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let pending = {
            let mut login = lock(&self.login);
            if let Some(token) = &login.token {
                return Ok(Some(token.clone()));
            }
            match login.pending.get(&idx) {
                Some(pending) => pending.clone(),
                None => {
                    let endpoint = self.members[idx]
                        .endpoint
                        .clone()
                        .map_err(|e| Failure::Fatal(EtcdError::Config(e)))?;
                    let (tx, rx) = watch::channel(None);
                    let pending = Pending {
                        connected: Arc::default(),
                        answer: rx,
                    };
                    login.pending.insert(idx, pending.clone());
                    tokio::spawn(log_in(
                        LoginAt {
                            endpoint,
                            member: idx,
                            auth: auth.clone(),
                            hint: self.hint(),
                            limit: self.timeout * LOGIN_LIMIT,
                        },
                        Arc::clone(&self.login),
                        pending.connected.clone(),
                        tx,
                    ));
                    pending
                }
            }
        };
        let mut answer = pending.answer.clone();
        let waited = tokio::time::timeout(self.timeout, answer.wait_for(Option::is_some))
            .await
            .map(|answered| answered.ok().and_then(|done| done.clone()));
        match waited {
            Ok(Some(Ok((token, channel)))) => {
                // The login's connection serves the calls too, if the
                // member has none yet: one connection, not two, at start.
                lock(&self.members[idx].channel).get_or_insert(channel);
                self.answered.store(true, Ordering::Relaxed);
                Ok(Some(token))
            }
            Ok(Some(Err(failure))) => Err(failure),
            // The login's task ended without an answer (its runtime shut
            // down): the next call logs in afresh.
            Ok(None) => {
                lock(&self.login).settle(idx, &pending.answer);
                Err(Failure::Member(MemberFailure::late(
                    "the login ended without an answer".into(),
                )))
            }
            // The member took the connection and is at the login (or
            // stalled: then the login's own limit ends it).
            Err(_) if pending.connected.load(Ordering::Relaxed) => Err(Failure::Busy(format!(
                "no answer yet to the login of user {:?} (etcd checks each password with \
                 bcrypt, and logins queue while many clients log in together)",
                auth.user
            ))),
            // No connection within the timeout: the next member.
            Err(_) => Err(Failure::Member(MemberFailure::late(format!(
                "no connection for the login within {:?}",
                self.timeout
            )))),
        }
    }

    /// Forgets the token `used` after etcd refused it; a newer token (another
    /// call logged in since) stays.
    fn forget_token(&self, used: Option<&AsciiMetadataValue>) {
        let mut login = lock(&self.login);
        if used.is_some() && login.token.as_ref() == used {
            login.token = None;
        }
    }

    /// Runs `rpc` on the first member that answers, each try within the
    /// timeout; a rejected token is renewed once per member.
    async fn call<T, F, Fut>(&self, rpc: &'static str, f: F) -> Result<T, EtcdError>
    where
        F: Fn(Channel, Option<AsciiMetadataValue>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let n = self.members.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Failures::default();
        let hint = self.hint();
        for i in 0..n {
            let idx = (start + i) % n;
            let mut renewed_token = false;
            loop {
                let started = std::time::Instant::now();
                // The login has its own bound (inside `token`).
                let token = self.token(idx).await;
                let used = token.as_ref().ok().cloned().flatten();
                let outcome = match token {
                    Err(failure) => Ok(Err(failure)),
                    Ok(token) => {
                        let attempt = async {
                            let channel = self.channel(idx)?;
                            f(channel, token)
                                .await
                                .map_err(|s| classify(&s, self.auth.is_some(), &hint))
                        };
                        tokio::time::timeout(self.timeout, attempt).await
                    }
                };
                if started.elapsed() > self.timeout / 2 {
                    tracing::warn!(rpc, endpoint = %self.members[idx].url, took = ?started.elapsed(), "slow etcd call");
                }
                match outcome {
                    Ok(Ok(v)) => {
                        self.preferred.store(idx, Ordering::Relaxed);
                        self.answered.store(true, Ordering::Relaxed);
                        return Ok(v);
                    }
                    Ok(Err(Failure::TokenRejected(msg))) if !renewed_token => {
                        tracing::debug!(rpc, reason = %msg, "etcd rejected the auth token; renewing it");
                        self.forget_token(used.as_ref());
                        renewed_token = true;
                    }
                    Ok(Err(Failure::TokenRejected(msg))) => {
                        return Err(EtcdError::Auth(msg));
                    }
                    Ok(Err(Failure::Fatal(e))) => return Err(e),
                    // The member is there, at the login: another member
                    // would cost etcd one more.
                    Ok(Err(Failure::Busy(msg))) => return Err(EtcdError::Busy(msg)),
                    Ok(Err(Failure::Member(m))) => {
                        self.reset(idx);
                        failures.add(&self.members[idx].url, m);
                        break;
                    }
                    Err(_) => {
                        self.reset(idx);
                        failures.add(
                            &self.members[idx].url,
                            MemberFailure::late(format!("no answer within {:?}", self.timeout)),
                        );
                        break;
                    }
                }
            }
        }
        Err(failures.into_error(self.endpoint_list()))
    }

    /// Keys from `prefix` to its end (`KV.Range`), a linearizable read.
    pub async fn range_prefix(&self, prefix: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        self.range(prefix, false).await
    }

    /// [`Client::range_prefix`] served by the member asked from its own
    /// state (`serializable`): no round of the cluster, possibly stale. For
    /// reads a transaction's compare checks again.
    pub async fn range_prefix_local(&self, prefix: &[u8]) -> Result<Vec<Kv>, EtcdError> {
        self.range(prefix, true).await
    }

    async fn range(&self, prefix: &[u8], serializable: bool) -> Result<Vec<Kv>, EtcdError> {
        Ok(self.range_with_header(prefix, serializable).await?.0)
    }

    /// The [`Header`] of a linearizable read of `key` (its value unused).
    pub async fn range_header(&self, key: &[u8]) -> Result<Header, EtcdError> {
        let req = rpc::RangeRequest {
            key: key.to_vec(),
            count_only: true,
            ..Default::default()
        };
        let answer = self
            .call("KV.Range", |ch, token| {
                let req = with_token(req.clone(), token);
                async move { KvClient::new(ch).range(req).await }
            })
            .await?
            .into_inner();
        Ok(answer.header.map_or(Header::default(), |h| Header {
            cluster_id: h.cluster_id,
            revision: h.revision,
        }))
    }

    /// [`Client::range_prefix_local`], with the answer's [`Header`].
    pub async fn range_prefix_local_header(
        &self,
        prefix: &[u8],
    ) -> Result<(Vec<Kv>, Header), EtcdError> {
        self.range_with_header(prefix, true).await
    }

    async fn range_with_header(
        &self,
        prefix: &[u8],
        serializable: bool,
    ) -> Result<(Vec<Kv>, Header), EtcdError> {
        let req = rpc::RangeRequest {
            key: prefix.to_vec(),
            range_end: prefix_end(prefix),
            serializable,
            ..Default::default()
        };
        let answer = self
            .call("KV.Range", |ch, token| {
                let req = with_token(req.clone(), token);
                async move { KvClient::new(ch).range(req).await }
            })
            .await?
            .into_inner();
        let header = answer.header.map_or(Header::default(), |h| Header {
            cluster_id: h.cluster_id,
            revision: h.revision,
        });
        Ok((answer.kvs.into_iter().map(kv).collect(), header))
    }

    /// Runs a transaction (`KV.Txn`): the success ops if every compare
    /// holds, else the failure ops, in order (a read sees the writes before
    /// it in the same transaction).
    pub async fn txn(
        &self,
        compare: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> Result<TxnAnswer, EtcdError> {
        use rpc::compare::{CompareResult, CompareTarget, TargetUnion};
        let compare = compare
            .iter()
            .map(|c| {
                let (target, key, union) = match c {
                    Compare::Absent(k) => {
                        (CompareTarget::Create, k, TargetUnion::CreateRevision(0))
                    }
                    Compare::LeaseIs(k, l) => (CompareTarget::Lease, k, TargetUnion::Lease(*l)),
                    Compare::ValueIs(k, v) => {
                        (CompareTarget::Value, k, TargetUnion::Value(v.clone()))
                    }
                    Compare::ModRevisionIs(k, r) => {
                        (CompareTarget::Mod, k, TargetUnion::ModRevision(*r))
                    }
                };
                rpc::Compare {
                    result: CompareResult::Equal as i32,
                    target: target as i32,
                    key: key.clone(),
                    target_union: Some(union),
                    ..Default::default()
                }
            })
            .collect();
        let ops = |ops: &[Op]| -> Vec<rpc::RequestOp> {
            use rpc::request_op::Request as R;
            ops.iter()
                .map(|o| {
                    let request = match o {
                        Op::Put(k, v, l) => R::RequestPut(rpc::PutRequest {
                            key: k.clone(),
                            value: v.clone(),
                            lease: *l,
                            ..Default::default()
                        }),
                        Op::Get(k) => R::RequestRange(rpc::RangeRequest {
                            key: k.clone(),
                            ..Default::default()
                        }),
                        Op::Prefix(k) => R::RequestRange(rpc::RangeRequest {
                            key: k.clone(),
                            range_end: prefix_end(k),
                            ..Default::default()
                        }),
                        Op::Count(k) => R::RequestRange(rpc::RangeRequest {
                            key: k.clone(),
                            range_end: prefix_end(k),
                            count_only: true,
                            ..Default::default()
                        }),
                        // etcd filters on create revision after the range:
                        // the keys are filtered, the answer's `count` is
                        // not (etcd 3.4.23, three keys, the filter keeping
                        // one: `kvs` held one, `count` said 3, with or
                        // without `count_only`), so these are counted here.
                        Op::KeysCreatedBefore(k, revision) => R::RequestRange(rpc::RangeRequest {
                            key: k.clone(),
                            range_end: prefix_end(k),
                            keys_only: true,
                            max_create_revision: revision.saturating_sub(1).max(1),
                            ..Default::default()
                        }),
                        Op::Delete(k) => R::RequestDeleteRange(rpc::DeleteRangeRequest {
                            key: k.clone(),
                            ..Default::default()
                        }),
                    };
                    rpc::RequestOp {
                        request: Some(request),
                    }
                })
                .collect()
        };
        let req = rpc::TxnRequest {
            compare,
            success: ops(success),
            failure: ops(failure),
        };
        let answer = self
            .call("KV.Txn", |ch, token| {
                let req = with_token(req.clone(), token);
                async move { KvClient::new(ch).txn(req).await }
            })
            .await?
            .into_inner();
        let ran = if answer.succeeded { success } else { failure };
        let mut out = TxnAnswer {
            succeeded: answer.succeeded,
            revision: answer.header.as_ref().map_or(0, |h| h.revision),
            ..TxnAnswer::default()
        };
        for (op, r) in ran.iter().zip(answer.responses) {
            if let Some(rpc::response_op::Response::ResponseRange(range)) = r.response {
                match op {
                    Op::Count(_) => out.counts.push(range.count),
                    _ => out.kvs.extend(range.kvs.into_iter().map(kv)),
                }
            }
        }
        Ok(out)
    }

    /// Grants a lease (`Lease.LeaseGrant`); returns its id and TTL in seconds.
    pub async fn grant(&self, ttl_s: u64) -> Result<(i64, u64), EtcdError> {
        let ttl = i64::try_from(ttl_s)
            .map_err(|_| EtcdError::Config(format!("lease TTL {ttl_s} s out of range")))?;
        let answer = self
            .call("Lease.LeaseGrant", |ch, token| {
                let req = with_token(
                    rpc::LeaseGrantRequest {
                        ttl,
                        ..Default::default()
                    },
                    token,
                );
                async move { LeaseClient::new(ch).lease_grant(req).await }
            })
            .await?
            .into_inner();
        if !answer.error.is_empty() {
            return Err(EtcdError::Server(answer.error));
        }
        let ttl = u64::try_from(answer.ttl)
            .map_err(|_| EtcdError::Protocol(format!("lease TTL {}", answer.ttl)))?;
        Ok((answer.id, ttl))
    }

    /// Revokes a lease, deleting its keys (`Lease.LeaseRevoke`).
    pub async fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        self.call("Lease.LeaseRevoke", |ch, token| {
            let req = with_token(rpc::LeaseRevokeRequest { id: lease }, token);
            async move { LeaseClient::new(ch).lease_revoke(req).await }
        })
        .await
        .map(drop)
    }

    /// Renews a lease over the client's `Lease.LeaseKeepAlive` stream;
    /// returns the TTL etcd granted, 0 when the lease is gone. Each member
    /// gets one try within the timeout, as for the other calls.
    pub async fn keep_alive(&self, lease: i64) -> Result<u64, EtcdError> {
        let n = self.members.len();
        let start = self.preferred.load(Ordering::Relaxed);
        let mut failures = Failures::default();
        let hint = self.hint();
        for i in 0..n {
            let idx = (start + i) % n;
            let mut renewed_token = false;
            loop {
                // A new stream needs a token (the login has its own bound).
                let stream = match self.open_keep_alive(idx) {
                    Some(stream) => Ok(stream),
                    None => self.token(idx).await.and_then(|token| {
                        let channel = self.channel(idx)?;
                        Ok(self.new_keep_alive(idx, channel, token, &hint))
                    }),
                };
                let outcome = match stream {
                    Err(failure) => Ok(Err(failure)),
                    Ok(stream) => {
                        let attempt = async {
                            match stream.send(lease)?.await {
                                Ok(result) => result,
                                // The stream ended without a word for this request.
                                Err(_) => Err(Failure::Member(MemberFailure::late(
                                    "keep-alive stream closed".into(),
                                ))),
                            }
                        };
                        tokio::time::timeout(self.timeout, attempt).await
                    }
                };
                match outcome {
                    Ok(Ok(ttl)) => {
                        self.preferred.store(idx, Ordering::Relaxed);
                        self.answered.store(true, Ordering::Relaxed);
                        return u64::try_from(ttl)
                            .map_err(|_| EtcdError::Protocol(format!("keep-alive TTL {ttl}")));
                    }
                    Ok(Err(Failure::TokenRejected(msg))) if !renewed_token => {
                        tracing::debug!(reason = %msg, "etcd rejected the auth token; renewing it");
                        let used = lock(&self.keep_alive)
                            .as_ref()
                            .and_then(|s| s.token.clone());
                        self.close_keep_alive();
                        self.forget_token(used.as_ref());
                        renewed_token = true;
                    }
                    Ok(Err(Failure::TokenRejected(msg))) => return Err(EtcdError::Auth(msg)),
                    Ok(Err(Failure::Fatal(e))) => return Err(e),
                    Ok(Err(Failure::Busy(msg))) => return Err(EtcdError::Busy(msg)),
                    Ok(Err(Failure::Member(m))) => {
                        self.close_keep_alive();
                        self.reset(idx);
                        failures.add(&self.members[idx].url, m);
                        break;
                    }
                    Err(_) => {
                        // A late answer would still match its request, but
                        // a member this slow is better left: start afresh.
                        self.close_keep_alive();
                        self.reset(idx);
                        failures.add(
                            &self.members[idx].url,
                            MemberFailure::late(format!("no answer within {:?}", self.timeout)),
                        );
                        break;
                    }
                }
            }
        }
        Err(failures.into_error(self.endpoint_list()))
    }

    /// The open keep-alive stream to member `idx`, if there is one.
    fn open_keep_alive(&self, idx: usize) -> Option<Arc<KeepAliveStream>> {
        lock(&self.keep_alive)
            .as_ref()
            .filter(|s| s.member == idx && !s.requests.is_closed())
            .cloned()
    }

    /// Opens a keep-alive stream to member `idx`, closing the one before.
    fn new_keep_alive(
        &self,
        idx: usize,
        channel: Channel,
        token: Option<AsciiMetadataValue>,
        hint: &TlsHint,
    ) -> Arc<KeepAliveStream> {
        let stream = KeepAliveStream::open(idx, channel, token, self.auth.is_some(), hint.clone());
        if let Some(old) = lock(&self.keep_alive).replace(stream.clone()) {
            old.close();
        }
        stream
    }

    /// What a failure's wording needs to know about the settings, now.
    fn hint(&self) -> TlsHint {
        TlsHint {
            never_answered: !self.answered.load(Ordering::Relaxed),
            ..self.hint.clone()
        }
    }

    fn close_keep_alive(&self) {
        if let Some(old) = lock(&self.keep_alive).take() {
            old.close();
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close_keep_alive();
    }
}

/// How long a login may take, in request timeouts. Logins queue at etcd
/// behind other clients' bcrypt checks (about 67 ms of etcd's CPU each,
/// measured here), so a login needs far longer than a read when a fleet
/// logs in together; the bound ends a login whose member stalled. The cost:
/// a member that took the connection and then stalls while a client logs
/// in holds that client's calls for up to this long before the next member
/// is tried (a member that is down, or takes no connection, is passed over
/// after one timeout); a client holding a token is not affected.
const LOGIN_LIMIT: u32 = 10;

/// A client's login: the token while etcd accepts it, and at most one
/// login in flight per member (a failure is then the member's own).
#[derive(Debug, Default)]
struct Login {
    token: Option<AsciiMetadataValue>,
    pending: std::collections::HashMap<usize, Pending>,
}

impl Login {
    /// Forgets member `member`'s login in flight if it is the one whose
    /// answer comes on `answer`.
    fn settle(&mut self, member: usize, answer: &watch::Receiver<Option<LoginAnswer>>) {
        if self
            .pending
            .get(&member)
            .is_some_and(|p| p.answer.same_channel(answer))
        {
            self.pending.remove(&member);
        }
    }
}

/// A login in flight.
#[derive(Debug, Clone)]
struct Pending {
    /// Its connection to the member is up.
    connected: Arc<AtomicBool>,
    /// Its answer, once there.
    answer: watch::Receiver<Option<LoginAnswer>>,
}

/// The token, and the connection the login made.
type LoginAnswer = Result<(AsciiMetadataValue, Channel), Failure>;

/// Where and as whom a login goes.
struct LoginAt {
    endpoint: Endpoint,
    member: usize,
    auth: EtcdAuth,
    hint: TlsHint,
    limit: Duration,
}

/// `Auth.Authenticate` on a connection it makes to the member, run to its
/// end (at most `at.limit`) whoever still waits for it; keeps the token,
/// then tells the waiters (the connection goes with the token).
async fn log_in(
    at: LoginAt,
    login: Arc<Mutex<Login>>,
    connected: Arc<AtomicBool>,
    answer: watch::Sender<Option<LoginAnswer>>,
) {
    let LoginAt {
        endpoint,
        member,
        auth,
        hint,
        limit,
    } = at;
    let started = std::time::Instant::now();
    let attempt = async {
        // Connecting on its own (bounded by the endpoint's connect timeout)
        // tells a member that took the connection from one that did not.
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| classify(&Status::from_error(Box::new(e)), true, &hint))?;
        connected.store(true, Ordering::Relaxed);
        let request = rpc::AuthenticateRequest {
            name: auth.user.clone(),
            password: auth.password.clone(),
        };
        let reply = AuthClient::new(channel.clone())
            .authenticate(request)
            .await
            .map_err(|status| match classify(&status, true, &hint) {
                // Whatever etcd says to an Authenticate is about the credentials.
                Failure::TokenRejected(msg)
                | Failure::Fatal(EtcdError::Server(msg) | EtcdError::Auth(msg)) => {
                    Failure::Fatal(EtcdError::Auth(format!("user {:?}: {msg}", auth.user)))
                }
                other => other,
            })?;
        let token = AsciiMetadataValue::try_from(reply.into_inner().token)
            .map_err(|e| Failure::Fatal(EtcdError::Protocol(format!("auth token: {e}"))))?;
        Ok((token, channel))
    };
    let result = match tokio::time::timeout(limit, attempt).await {
        Ok(result) => result,
        Err(_) => Err(Failure::Member(MemberFailure::late(format!(
            "no answer to the login within {limit:?}"
        )))),
    };
    match &result {
        Ok(_) => {
            tracing::debug!(user = %auth.user, member, took = ?started.elapsed(), "logged in to etcd")
        }
        Err(e) => {
            tracing::debug!(user = %auth.user, member, took = ?started.elapsed(), error = ?e, "etcd login failed")
        }
    }
    {
        let mut login = lock(&login);
        login.settle(member, &answer.subscribe());
        if let Ok((token, _)) = &result {
            login.token = Some(token.clone());
        }
    }
    let _ = answer.send(Some(result));
}

/// One `Lease.LeaseKeepAlive` stream: requests go out through `requests`; a
/// reader task hands each answer to the oldest waiting caller.
#[derive(Debug)]
struct KeepAliveStream {
    member: usize,
    /// The auth token the stream was opened with.
    token: Option<AsciiMetadataValue>,
    requests: mpsc::UnboundedSender<rpc::LeaseKeepAliveRequest>,
    waiting: Arc<Mutex<VecDeque<Waiter>>>,
    reader: tokio::task::AbortHandle,
}

/// A caller waiting for the answer about `lease`.
type Waiter = (i64, oneshot::Sender<Result<i64, Failure>>);

impl KeepAliveStream {
    fn open(
        member: usize,
        channel: Channel,
        token: Option<AsciiMetadataValue>,
        authenticated: bool,
        hint: TlsHint,
    ) -> Arc<Self> {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let waiting: Arc<Mutex<VecDeque<Waiter>>> = Arc::default();
        let queue = waiting.clone();
        let sent_token = token.clone();
        let reader = tokio::spawn(async move {
            let request = with_token(
                tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing),
                sent_token,
            );
            let failure = match read_answers(channel, request, &queue).await {
                Ok(()) => Failure::Member(MemberFailure::late("etcd ended the stream".into())),
                Err(ReadError::Status(s)) => classify(&s, authenticated, &hint),
                Err(ReadError::Failure(f)) => f,
            };
            for (_, waiter) in lock(&queue).drain(..) {
                let _ = waiter.send(Err(failure.clone()));
            }
        })
        .abort_handle();
        Arc::new(KeepAliveStream {
            member,
            token,
            requests,
            waiting,
            reader,
        })
    }

    /// Queues a keep-alive for `lease`; the receiver gets its answer's TTL.
    fn send(&self, lease: i64) -> Result<oneshot::Receiver<Result<i64, Failure>>, Failure> {
        let (tx, rx) = oneshot::channel();
        // Queue and send under one lock, so the queue's order is the
        // stream's order.
        let mut waiting = lock(&self.waiting);
        self.requests
            .send(rpc::LeaseKeepAliveRequest { id: lease })
            .map_err(|_| Failure::Member(MemberFailure::late("keep-alive stream closed".into())))?;
        waiting.push_back((lease, tx));
        Ok(rx)
    }

    fn close(&self) {
        self.reader.abort();
    }
}

enum ReadError {
    Status(Status),
    Failure(Failure),
}

async fn read_answers(
    channel: Channel,
    request: Request<tokio_stream::wrappers::UnboundedReceiverStream<rpc::LeaseKeepAliveRequest>>,
    queue: &Mutex<VecDeque<Waiter>>,
) -> Result<(), ReadError> {
    let mut answers = LeaseClient::new(channel)
        .lease_keep_alive(request)
        .await
        .map_err(ReadError::Status)?
        .into_inner();
    while let Some(answer) = answers.message().await.map_err(ReadError::Status)? {
        let Some((lease, waiter)) = lock(queue).pop_front() else {
            return Err(ReadError::Failure(Failure::Fatal(EtcdError::Protocol(
                format!(
                    "keep-alive answer for lease {:x} nobody asked for",
                    answer.id
                ),
            ))));
        };
        if answer.id != lease {
            let failure = Failure::Fatal(EtcdError::Protocol(format!(
                "keep-alive for lease {lease:x} answered for lease {:x}",
                answer.id
            )));
            let _ = waiter.send(Err(failure.clone()));
            return Err(ReadError::Failure(failure));
        }
        // The caller may have given up (timeout): nobody to tell.
        let _ = waiter.send(Ok(answer.ttl));
    }
    Ok(())
}

fn with_token<T>(message: T, token: Option<AsciiMetadataValue>) -> Request<T> {
    let mut req = Request::new(message);
    if let Some(t) = token {
        // etcd reads the token from this metadata key (rpctypes.TokenFieldNameGRPC).
        req.metadata_mut().insert("token", t);
    }
    req
}

fn kv(kv: pb::mvccpb::KeyValue) -> Kv {
    Kv {
        key: kv.key,
        value: kv.value,
        lease: kv.lease,
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
    }
}

/// What one try at one member came to.
#[derive(Debug, Clone)]
enum Failure {
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
struct MemberFailure {
    reason: String,
    /// Nothing listening (connection refused).
    refused: bool,
    /// The TLS handshake failed.
    tls: bool,
}

impl MemberFailure {
    fn late(reason: String) -> Self {
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

/// What the TLS failure hints need to know about the settings.
#[derive(Debug, Clone)]
struct TlsHint {
    has_client_cert: bool,
    /// TLS is configured (https endpoints).
    tls: bool,
    /// No member has answered this client yet.
    never_answered: bool,
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
fn classify(status: &Status, authenticated: bool, hint: &TlsHint) -> Failure {
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
            "{msg} (the user's role must allow readwrite on the whole --etcd-prefix: etcdctl role grant-permission ROLE readwrite PREFIX/ --prefix=true)"
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

fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(&[b'a', 0xff]), b"b".to_vec());
        assert_eq!(prefix_end(&[0xff]), vec![0]);
    }

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
