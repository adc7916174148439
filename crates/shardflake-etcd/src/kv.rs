//! `KV.Range` and `KV.Txn`: reads of a key or a prefix with the
//! cluster's header, and transactions of compares and operations.

use crate::connection::Client;
use crate::error::EtcdError;
use crate::{pb, rpc, with_token};
use rpc::kv_client::KvClient;

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

/// Which cluster and member answered a read, and at what revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// The cluster's id (a new cluster, or one restored from a snapshot
    /// with other member settings, has another).
    pub cluster_id: u64,
    /// The id of the member that answered: one member reached under two
    /// names (`127.0.0.1:P`, `localhost:P`) answers with one id.
    pub member_id: u64,
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
    /// No key under this prefix was written after this revision (a key
    /// deleted since is not seen; an empty prefix holds).
    NoneWrittenAfter(Vec<u8>, i64),
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
    /// The id of the cluster that ran it.
    pub cluster_id: u64,
}

impl Client {
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

    /// The keys (no values) from `from` to the end of the keyspace, at most
    /// `limit` of them, in key order; served by the member asked
    /// (`serializable`). To page through a keyspace of unknown size.
    pub async fn keys_from(&self, from: &[u8], limit: i64) -> Result<Vec<Vec<u8>>, EtcdError> {
        let req = rpc::RangeRequest {
            key: from.to_vec(),
            // `\0` as the range end: every key at or after `key`.
            range_end: vec![0],
            keys_only: true,
            serializable: true,
            limit,
            ..Default::default()
        };
        let answer = self.range_request(req).await?;
        Ok(answer.kvs.into_iter().map(|kv| kv.key).collect())
    }

    /// The [`Header`] of a linearizable read of `key` (its value unused).
    pub async fn range_header(&self, key: &[u8]) -> Result<Header, EtcdError> {
        let req = rpc::RangeRequest {
            key: key.to_vec(),
            count_only: true,
            ..Default::default()
        };
        let answer = self.range_request(req).await?;
        Ok(header(answer.header))
    }

    /// [`Client::range_prefix`] (linearizable), with the answer's [`Header`].
    pub async fn range_prefix_header(&self, prefix: &[u8]) -> Result<(Vec<Kv>, Header), EtcdError> {
        self.range_with_header(prefix, false).await
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
        let answer = self.range_request(req).await?;
        Ok((
            answer.kvs.into_iter().map(kv).collect(),
            header(answer.header),
        ))
    }

    /// One `KV.Range` call, with the auth token.
    async fn range_request(&self, req: rpc::RangeRequest) -> Result<rpc::RangeResponse, EtcdError> {
        Ok(self
            .call("KV.Range", |ch, token| {
                let req = with_token(req.clone(), token);
                async move { KvClient::new(ch).range(req).await }
            })
            .await?
            .into_inner())
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
                    Compare::ModRevisionIs(k, r) | Compare::NoneWrittenAfter(k, r) => {
                        (CompareTarget::Mod, k, TargetUnion::ModRevision(*r))
                    }
                };
                match c {
                    // Every key of the range compared (etcd 3.3+): each
                    // was last written before `r + 1`.
                    Compare::NoneWrittenAfter(k, r) => rpc::Compare {
                        result: CompareResult::Less as i32,
                        target: target as i32,
                        key: k.clone(),
                        range_end: prefix_end(k),
                        target_union: Some(TargetUnion::ModRevision(r.saturating_add(1))),
                    },
                    _ => rpc::Compare {
                        result: CompareResult::Equal as i32,
                        target: target as i32,
                        key: key.clone(),
                        target_union: Some(union),
                        ..Default::default()
                    },
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
            cluster_id: answer.header.as_ref().map_or(0, |h| h.cluster_id),
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
}

/// An answer's [`Header`] (zeros where etcd sent none).
fn header(h: Option<rpc::ResponseHeader>) -> Header {
    h.map_or(Header::default(), |h| Header {
        cluster_id: h.cluster_id,
        member_id: h.member_id,
        revision: h.revision,
    })
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

pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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
}
