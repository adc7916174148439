//! A small etcd v3 client over etcd's own gRPC API, generated at build time
//! from etcd's `.proto` files (`proto/`, compiled by protox in `build.rs`:
//! no `protoc`). Only what node-id leasing needs, each call named
//! as in the etcd API reference: `KV.Range`, `KV.Txn`, `Lease.LeaseGrant`,
//! `Lease.LeaseKeepAlive` (one bidirectional stream), `Lease.LeaseRevoke`,
//! `Watch.Watch`, `Maintenance.Status` and `Auth.Authenticate`.
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
//!
//! # Map of the modules
//!
//! - `connection`: [`Client`], its members and their connections, TLS
//!   settings ([`EtcdTls`], [`ClientCert`]), and the one loop every call
//!   runs through: member failover and token renewal.
//! - `kv`: `KV.Range` and `KV.Txn` ([`Kv`], [`Header`], [`Compare`],
//!   [`Op`], [`TxnAnswer`]).
//! - `lease`: `Lease.LeaseGrant`, `Lease.LeaseRevoke`, and the
//!   `Lease.LeaseKeepAlive` stream.
//! - `login`: `Auth.Authenticate` ([`EtcdAuth`]), at most one login in
//!   flight per member, the shared token.
//! - `watch`: `Watch.Watch`, the changes to a few keys ([`Watch`],
//!   [`Event`]).
//! - `maintenance`: `Maintenance.Status` ([`Status`]): whether the cluster
//!   was ever restored from a snapshot.
//! - `diagnosis`: what a failed call means (next member, renew the token,
//!   or final) and TLS failures in words, with the setting to check.
//! - `error`: [`EtcdError`].

#![warn(missing_docs)]

use std::sync::{Mutex, MutexGuard};

use tonic::Request;
use tonic::metadata::AsciiMetadataValue;

mod connection;
mod diagnosis;
mod error;
mod kv;
mod lease;
mod login;
mod maintenance;
mod watch;

pub use connection::{Client, ClientCert, EtcdTls};
pub use error::EtcdError;
pub use kv::{Compare, Header, Kv, Op, TxnAnswer};
pub use login::EtcdAuth;
pub use maintenance::Status;
pub use watch::{Event, EventKind, Watch};

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

/// A number in `0..n` (0 when `n` is 0), different at each call and in
/// each process: for spreading load over etcd (a client's first member, a
/// racing take's candidate id). Each `RandomState` has fresh keys.
pub fn random_below(n: usize) -> usize {
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

/// A request carrying the auth token, if there is one.
pub(crate) fn with_token<T>(message: T, token: Option<AsciiMetadataValue>) -> Request<T> {
    let mut req = Request::new(message);
    if let Some(t) = token {
        // etcd reads the token from this metadata key (rpctypes.TokenFieldNameGRPC).
        req.metadata_mut().insert("token", t);
    }
    req
}
