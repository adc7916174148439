//! `Watch.Watch`: the changes to a few keys, as etcd commits them, over
//! one stream to one member.

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;

use crate::connection::{Client, Failure, MemberFailure, Tried};
use crate::diagnosis::classify;
use crate::error::EtcdError;
use crate::{rpc, with_token};
use rpc::watch_client::WatchClient;

/// One change to a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// A put or a delete.
    pub kind: EventKind,
    /// The key.
    pub key: Vec<u8>,
    /// The value put (empty for a delete).
    pub value: Vec<u8>,
    /// The revision of the change.
    pub mod_revision: i64,
}

/// What a change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// The key was written.
    Put,
    /// The key was deleted (also when its lease ended).
    Delete,
}

/// A watch on some keys, from the revision it was created at; dropped, it
/// ends. It reports changes until its stream fails (a member stopped, a
/// restore): then open a new one.
#[derive(Debug)]
pub struct Watch {
    responses: Streaming<rpc::WatchResponse>,
    /// Kept open: etcd ends the stream when the client's side closes.
    _requests: mpsc::UnboundedSender<rpc::WatchRequest>,
    revision: i64,
}

impl Watch {
    /// The cluster's revision when the watch was created: every change
    /// after it is reported.
    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// The next changes (at least one), waiting as long as it takes; an
    /// error when the stream fails or ends, or etcd cancels the watch.
    pub async fn changes(&mut self) -> Result<Vec<Event>, EtcdError> {
        loop {
            let answer = self
                .responses
                .message()
                .await
                .map_err(|s| EtcdError::Server(format!("watch stream: {s}")))?
                .ok_or_else(|| EtcdError::Server("etcd ended the watch stream".into()))?;
            if answer.canceled || answer.compact_revision > 0 {
                return Err(EtcdError::Server(format!(
                    "etcd canceled the watch: {} (compacted at {})",
                    answer.cancel_reason, answer.compact_revision
                )));
            }
            let events: Vec<Event> = answer.events.into_iter().filter_map(event).collect();
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }
}

fn event(e: crate::pb::mvccpb::Event) -> Option<Event> {
    use crate::pb::mvccpb::event::EventType;
    let kv = e.kv?;
    let kind = match EventType::try_from(e.r#type).ok()? {
        EventType::Put => EventKind::Put,
        EventType::Delete => EventKind::Delete,
    };
    Some(Event {
        kind,
        key: kv.key,
        value: kv.value,
        mod_revision: kv.mod_revision,
    })
}

impl Client {
    /// Watches `keys` (each one key, not a prefix) from now: created on the
    /// first member that answers, as any call; returns once etcd has
    /// confirmed every one (within the request timeout).
    pub async fn watch(&self, keys: &[Vec<u8>]) -> Result<Watch, EtcdError> {
        let hint = &self.hint();
        let try_member = |idx| async move {
            let token = self.token(idx).await;
            let used = token.as_ref().ok().cloned().flatten();
            let outcome = match token {
                Err(failure) => Err(failure),
                Ok(token) => {
                    self.within(async {
                        let channel = self.channel(idx)?;
                        let (requests, outgoing) = mpsc::unbounded_channel();
                        for (i, key) in keys.iter().enumerate() {
                            let create = rpc::WatchCreateRequest {
                                key: key.clone(),
                                watch_id: i as i64 + 1,
                                ..Default::default()
                            };
                            let request = rpc::WatchRequest {
                                request_union: Some(
                                    rpc::watch_request::RequestUnion::CreateRequest(create),
                                ),
                            };
                            // The receiver is right here: this cannot fail.
                            let _ = requests.send(request);
                        }
                        let request =
                            with_token(UnboundedReceiverStream::new(outgoing), token.clone());
                        let fail = |s: tonic::Status| classify(&s, self.auth.is_some(), hint);
                        let mut responses = WatchClient::new(channel)
                            .watch(request)
                            .await
                            .map_err(fail)?
                            .into_inner();
                        let mut created = 0;
                        let mut revision = 0;
                        while created < keys.len() {
                            let answer =
                                responses.message().await.map_err(fail)?.ok_or_else(|| {
                                    Failure::Member(MemberFailure::late(
                                        "etcd ended the watch stream".into(),
                                    ))
                                })?;
                            if answer.canceled {
                                return Err(Failure::Fatal(EtcdError::Server(format!(
                                    "etcd refused the watch: {}",
                                    answer.cancel_reason
                                ))));
                            }
                            if answer.created {
                                created += 1;
                                revision = answer.header.map_or(revision, |h| h.revision);
                            }
                        }
                        Ok(Watch {
                            responses,
                            _requests: requests,
                            revision,
                        })
                    })
                    .await
                }
            };
            Tried {
                outcome,
                token: used,
            }
        };
        self.failover("Watch.Watch", try_member, || {}).await
    }
}
