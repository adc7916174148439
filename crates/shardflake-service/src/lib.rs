//! `shardflake serve`: the id service. Many stateless nodes behind a load
//! balancer, none ever issuing an id another issued.
//!
//! # Map of the modules
//!
//! - [`config`]: TOML file + `SHARDFLAKE_*` environment + flags, validated.
//! - [`state_file`]: the local high-water file (atomic writes); a restart
//!   resumes after it.
//! - [`etcd`]: a small client for etcd's v3 JSON gateway (no protoc, no
//!   extra gRPC stack).
//! - [`lease`]: node ids leased from etcd: acquire the lowest free id,
//!   keep-alive, record high-water, fence, re-acquire, revoke.
//! - [`issuer`]: the issuing path and its two fences (lease deadline and
//!   recorded high-water).
//! - [`http`]: the axum HTTP/JSON API, error mapping, limits.
//! - [`grpc`]: the tonic service and server reflection.
//! - [`metrics`]: Prometheus text.
//! - [`error`]: the API error (`{"error":{"code","message"}}`, gRPC codes).
//! - [`shutdown`]: SIGTERM/Ctrl-C and the drain signal.
//! - [`server`]: wires it together.

#![warn(missing_docs)]

pub mod config;
pub mod error;
pub mod etcd;
pub mod grpc;
pub mod http;
pub mod issuer;
pub mod lease;
pub mod metrics;
pub mod server;
pub mod shutdown;
pub mod state_file;

pub use config::{Config, ServeArgs};
pub use server::{Listeners, run_blocking, serve};
