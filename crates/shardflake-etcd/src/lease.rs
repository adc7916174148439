//! Leases: `Lease.LeaseGrant`, `Lease.LeaseRevoke`, and renewals over one
//! `Lease.LeaseKeepAlive` stream per client.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::connection::{Client, Failure, MemberFailure, Tried};
use crate::diagnosis::{TlsHint, classify};
use crate::error::EtcdError;
use crate::{lock, rpc, with_token};
use rpc::lease_client::LeaseClient;

impl Client {
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
        let hint = &self.hint();
        let try_member = |idx| async move {
            // A new stream needs a token (the login has its own bound).
            let stream = match self.open_keep_alive(idx) {
                Some(stream) => Ok(stream),
                None => self.token(idx).await.and_then(|token| {
                    let channel = self.channel(idx)?;
                    Ok(self.new_keep_alive(idx, channel, token, hint))
                }),
            };
            match stream {
                Err(failure) => Tried {
                    outcome: Err(failure),
                    token: None,
                },
                Ok(stream) => {
                    let outcome = self
                        .within(async {
                            match stream.send(lease)?.await {
                                Ok(result) => result,
                                // The stream ended without a word for this request.
                                Err(_) => Err(Failure::Member(MemberFailure::late(
                                    "keep-alive stream closed".into(),
                                ))),
                            }
                        })
                        .await;
                    Tried {
                        outcome,
                        token: stream.token.clone(),
                    }
                }
            }
        };
        // A late answer would still match its request, but a member this
        // slow is better left: a failed member's stream is closed, and so
        // is one whose token etcd rejected.
        let ttl = self
            .failover("Lease.LeaseKeepAlive", try_member, || {
                self.close_keep_alive()
            })
            .await?;
        u64::try_from(ttl).map_err(|_| EtcdError::Protocol(format!("keep-alive TTL {ttl}")))
    }

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

    pub(crate) fn close_keep_alive(&self) {
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

/// One `Lease.LeaseKeepAlive` stream: requests go out through `requests`; a
/// reader task hands each answer to the oldest waiting caller.
#[derive(Debug)]
pub(crate) struct KeepAliveStream {
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
