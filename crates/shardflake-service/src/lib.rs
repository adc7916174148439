//! `shardflake serve`: the id service. Many stateless nodes behind a load
//! balancer, none ever issuing an id another issued.
//!
//! # Map of the modules
//!
//! - [`config`]: raw options from the TOML file, `SHARDFLAKE_*` environment
//!   and flags, layered (`config/raw.rs`); host discovery; a pure validation
//!   into [`Config`] (`config/validate.rs`); [`ConfigError`] (`config/error.rs`).
//! - `state_file`: the local high-water file (atomic writes); a restart
//!   resumes after it.
//! - [`etcd`]: the `shardflake-etcd` crate, re-exported: a client for
//!   etcd's own gRPC API (streaming keep-alive, TLS, users).
//! - [`lease`]: the keeper of the node identity: acquire the lowest free
//!   id, keep-alive, record high-water, fence, re-acquire, revoke.
//! - [`registry`]: what the keeper needs of a coordination store, on etcd,
//!   in memory (tests) or for a static node id.
//! - [`issuer`]: the issuing path and its two fences (lease deadline and
//!   recorded high-water).
//! - [`http`]: the axum HTTP/JSON API (router and error mapping, query
//!   parsing, JSON writing, the OpenAPI document), limits.
//! - [`grpc`]: the tonic service and server reflection.
//! - [`tickets`]: ticket sequences (`--tickets`): the etcd high-water
//!   store of the ticket client (`server` connects the client at start).
//! - `counters`: the counters the issuer and the keeper update.
//! - `metrics`: Prometheus text of them.
//! - `auth`: the optional bearer token of the API.
//! - `tls`: TLS (rustls) on the HTTP and gRPC listeners.
//! - `error`: the domain error, the one list of error codes, and the API
//!   error (`{"error":{"code","message"}}`).
//! - `shutdown`: SIGTERM/Ctrl-C and the drain signal.
//! - `server`: wires it together ([`serve`] takes its bound [`Listeners`]
//!   and a shutdown future, so tests run the whole server in-process).

#![warn(missing_docs)]

// The crate's API: the modules below are public; the rest are parts of it,
// re-exported where a caller needs a name.
pub mod config;
pub mod grpc;
pub mod http;
pub mod issuer;
pub mod layout_change;
pub mod lease;
pub mod registry;
pub mod tickets;

mod auth;
mod counters;
mod error;
mod metrics;
mod server;
mod shutdown;
mod state_file;
mod tls;

/// The etcd client (the `shardflake-etcd` crate), at its old path.
pub use shardflake_etcd as etcd;

pub use auth::{ApiToken, TokenFileError};
pub use config::{Config, ConfigError, RawConfig};
pub use error::{ApiError, ErrorKind, IssueError};
pub use server::{Listeners, ServeError, run_blocking, serve, warn_of_lifetime};

/// A layout with less than this left before its end (or its first negative
/// id) is warned of at start and by the `check` commands, unless told
/// otherwise (`lifetime_warning`, `--lifetime-warning`).
pub const LIFETIME_WARNING: std::time::Duration = std::time::Duration::from_secs(365 * 86_400);
pub use state_file::StateFile;
pub use tls::TlsError;
