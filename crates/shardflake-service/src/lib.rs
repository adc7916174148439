//! `shardflake serve`: the id service. Many stateless nodes behind a load
//! balancer, none ever issuing an id another issued.
//!
//! # Map of the modules
//!
//! - [`config`]: raw options from the TOML file, `SHARDFLAKE_*` environment
//!   and flags, layered; host discovery; a pure validation into [`Config`].
//! - [`state_file`]: the local high-water file (atomic writes); a restart
//!   resumes after it.
//! - [`etcd`]: a small client for etcd's v3 JSON gateway (no protoc, no
//!   extra gRPC stack).
//! - [`lease`]: the keeper of the node identity: acquire the lowest free
//!   id, keep-alive, record high-water, fence, re-acquire, revoke.
//! - [`registry`]: what the keeper needs of a coordination store, on etcd,
//!   in memory (tests) or for a static node id.
//! - [`issuer`]: the issuing path and its two fences (lease deadline and
//!   recorded high-water).
//! - [`http`]: the axum HTTP/JSON API, error mapping, limits.
//! - [`grpc`]: the tonic service and server reflection.
//! - [`metrics`]: Prometheus text.
//! - [`auth`]: the optional bearer token of the API.
//! - [`tls`]: TLS (rustls) on the HTTP and gRPC listeners.
//! - [`error`]: the API error (`{"error":{"code","message"}}`, gRPC codes).
//! - [`shutdown`]: SIGTERM/Ctrl-C and the drain signal.
//! - [`server`]: wires it together.
//! - `testkit` (feature `testkit`): etcd clusters, server processes and
//!   clients for process-level tests.

#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod error;
pub mod etcd;
pub mod grpc;
pub mod http;
pub mod issuer;
pub mod lease;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod shutdown;
pub mod state_file;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod tls;

pub use config::{Config, ConfigError, RawConfig};
pub use server::{ServeError, run_blocking, serve};
