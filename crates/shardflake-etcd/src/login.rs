//! Logins (`Auth.Authenticate`): at most one in flight per member, run to
//! its end in a task of its own; every call shares the token it got.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tonic::Status;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

use crate::connection::{Client, Failure, MemberFailure};
use crate::diagnosis::{TlsHint, classify};
use crate::error::EtcdError;
use crate::{lock, rpc};
use rpc::auth_client::AuthClient;

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

impl Client {
    /// The auth token to send: the one held, or the answer of the login in
    /// flight on member `idx`, started here if there is none. Waits at most
    /// the request timeout; the login goes on without this caller.
    pub(crate) async fn token(&self, idx: usize) -> Result<Option<AsciiMetadataValue>, Failure> {
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
    pub(crate) fn forget_token(&self, used: Option<&AsciiMetadataValue>) {
        let mut login = lock(&self.login);
        if used.is_some() && login.token.as_ref() == used {
            login.token = None;
        }
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
pub(crate) struct Login {
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
