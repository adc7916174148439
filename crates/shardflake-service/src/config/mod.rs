//! Configuration, in two stages.
//!
//! 1. **Raw options** ([`RawConfig`]): every option optional, one struct for
//!    every source: the TOML file, the `SHARDFLAKE_*` environment and the
//!    flags (the CLI's clap arguments, which read the environment, convert
//!    into it). Sources are layered with [`RawConfig::merge`], field by
//!    field, the later source winning: file < environment < flags.
//! 2. **Validation** ([`Config::validate`]): pure, no file, environment or
//!    host reads; defaults filled in, every rule checked once, at start, with
//!    a [`ConfigError`] that says what to change.
//!
//! Host discovery (`node_id_from = "hostname" | "mac" | "ip"`) is its own
//! step between the two: [`RawConfig::host_facts`] reads the host only when
//! the options ask for it, and validation takes the facts as an argument.
//! [`Config::load`] runs both steps.
//!
//! ```toml
//! http = "127.0.0.1:8080"
//! grpc = "127.0.0.1:50051"
//! layout = "snowflake"          # preset or spec
//! node_field = "node"
//! node_id = 3                   # or node_id_from = "hostname" | "mac" | "ip"
//! fields = { datacenter = 1 }   # other fixed node fields
//! state_file = "/var/lib/shardflake/state"
//! resume_after = "now"          # only for a static node's first start (no state file yet)
//! window = "3s"                 # high-water written as now + window
//! max_resume_wait = "1m"        # longest wait for a recorded high-water past window
//! max_batch = 1000000
//! lifetime_warning = "365d"     # warn at start when the layout has less left
//! rollback = "error"            # or "continue:5s", "wait:500ms"
//! tls_cert_file = "/etc/shardflake/tls.crt"   # PEM chain; HTTPS and gRPC over TLS
//! tls_key_file = "/etc/shardflake/tls.key"    # PEM key; both or neither
//! api_token_file = "/etc/shardflake/token"    # `Authorization: Bearer <token>` required
//! tickets = "/etc/shardflake/tickets.toml"    # ticket sequences: GET /v1/tickets/{sequence}
//!
//! [etcd]
//! endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
//! prefix = "/shardflake/prod"
//! # fleet = "<32 hex digits>"  # the fleet's id (etcdctl get /shardflake/prod/fleet); not on its first node
//! lease_ttl = "10s"
//! safety_margin = "2s"
//! # TLS (https:// endpoints) and user/password authentication, all optional:
//! ca_file = "/etc/shardflake/etcd-ca.pem"          # required for https://
//! cert_file = "/etc/shardflake/etcd-client.pem"    # mutual TLS: cert and key together
//! key_file = "/etc/shardflake/etcd-client-key.pem"
//! user = "shardflake"
//! password_file = "/etc/shardflake/etcd-password" # or password = "..."
//! ```
//!
//! The parts: `raw` (the options as read: [`RawConfig`], layering), `validate`
//! (raw to [`Config`], every rule), `error` ([`ConfigError`]); this module
//! holds the validated types.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::etcd::{EtcdAuth, EtcdError, EtcdTls};
use shardflake::{Layout, RollbackPolicy};

mod error;
mod raw;
mod validate;

pub use error::ConfigError;
pub use raw::{RawConfig, RawEtcd};
pub use validate::parse_rollback;

/// Where the node id comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
// Made once at start: the etcd variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum NodeSource {
    /// Fixed for the life of the process.
    Static(u64),
    /// Leased from etcd.
    Etcd(EtcdConfig),
}

/// The etcd side of the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Endpoints, `http://host:port`, tried in turn.
    pub endpoints: Vec<String>,
    /// A node id given with `--node-id` (or `node_id_from`) together with
    /// etcd: the node takes exactly this id in the registry (a static id
    /// reserved there, with its high-water) instead of the lowest free one.
    pub pinned_node_id: Option<u64>,
    /// Key prefix, without a trailing `/`.
    pub prefix: String,
    /// The prefix of the fleet this one replaces with another layout
    /// (`--previous-prefix`, same etcd): the new fleet's first take checks
    /// it is stopped and that the new ids are above every id it made, and
    /// retires it.
    pub previous_prefix: Option<String>,
    /// The fleet id this node belongs to (`--fleet`): it takes an id, with
    /// or without a state file, only where `<prefix>/fleet` holds it, so a
    /// node given another cluster's endpoints is refused there.
    pub fleet: Option<String>,
    /// Lease TTL.
    pub lease_ttl: Duration,
    /// Issuing stops this long before the lease could expire.
    pub safety_margin: Duration,
    /// Timeout of one request.
    pub timeout: Duration,
    /// TLS for `https://` endpoints (required with them).
    pub tls: Option<EtcdTls>,
    /// User/password authentication.
    pub login: Option<EtcdLogin>,
}

/// An etcd user and where its password is (read when the client is built,
/// not while validating).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdLogin {
    /// The etcd user.
    pub user: String,
    /// The password.
    pub password: Secret,
}

/// A secret given inline or as a file to read. Its `Debug` never shows an
/// inline value.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    /// The value itself.
    Inline(String),
    /// A file holding it (a trailing newline is ignored).
    File(PathBuf),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Inline(<redacted>)"),
            Secret::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

impl std::fmt::Debug for EtcdLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLogin")
            .field("user", &self.user)
            .field("password", &self.password)
            .finish()
    }
}

impl EtcdLogin {
    /// The credentials, the password file read.
    pub fn read(&self) -> Result<EtcdAuth, EtcdError> {
        let password = match &self.password {
            Secret::Inline(p) => p.clone(),
            Secret::File(path) => std::fs::read_to_string(path)
                .map_err(|e| {
                    EtcdError::Config(format!(
                        "reading the etcd password file {}: {e}",
                        path.display()
                    ))
                })?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        };
        if password.is_empty() {
            return Err(EtcdError::Config("the etcd password is empty".into()));
        }
        Ok(EtcdAuth {
            user: self.user.clone(),
            password,
        })
    }
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// HTTP listen address.
    pub http: SocketAddr,
    /// gRPC listen address.
    pub grpc: SocketAddr,
    /// The layout.
    pub layout: Layout,
    /// The field holding the node id.
    pub node_field: String,
    /// Static or leased node id.
    pub node: NodeSource,
    /// Where the node id comes from, for the start-up log: `default` (no
    /// option: node 0), `node_id`, `hostname`, `mac`, `ip` or `etcd`.
    pub node_origin: &'static str,
    /// Other node fields with fixed values.
    pub fixed_fields: Vec<(String, u64)>,
    /// The field set per request from a sharding key, if the layout has one.
    pub shard_field: Option<String>,
    /// Number of logical shards.
    pub shards: u64,
    /// Local high-water file.
    pub state_file: PathBuf,
    /// Where to resume when the state file is missing (a static node with
    /// a node id given refuses to start without it: it cannot know whether
    /// it issued ids before).
    pub resume_after: Option<ResumeAfter>,
    /// High-water window.
    pub window: Duration,
    /// How much further than `window` ahead of the clock a recorded
    /// high-water may be before start gives up instead of waiting.
    pub max_resume_wait: Duration,
    /// Largest batch.
    pub max_batch: u64,
    /// A start with less than this left of the layout's life
    /// ([`shardflake::Layout::lifetime_end_ms`]) logs a warning.
    pub lifetime_warning: Duration,
    /// Largest request body.
    pub max_body: usize,
    /// Clock rollback policy.
    pub rollback: RollbackPolicy,
    /// Borrowing lead on exhaustion (zero: wait).
    pub borrow: Duration,
    /// Runtime worker threads.
    pub workers: usize,
    /// Serve both listeners over TLS with this certificate and key.
    pub tls: Option<TlsFiles>,
    /// Require the bearer token in this file on the id endpoints.
    pub api_token_file: Option<PathBuf>,
    /// Serve the ticket sequences of this TOML file (read and connected at
    /// start by `serve`).
    pub tickets: Option<PathBuf>,
}

/// `resume_after`: the time before which a node without a state file
/// issued nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeAfter {
    /// The clock at start: the node never issued an id (its first start).
    Now,
    /// A Unix ms after every id the node issued.
    UnixMs(u64),
}

/// The PEM files of the listeners' TLS identity (read at start by `serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The etcd prefix of a node given none: said at start, since every node
/// started so joins one fleet.
pub const DEFAULT_ETCD_PREFIX: &str = "/shardflake/default";

/// Largest batch the service accepts whatever the configuration says.
pub const MAX_BATCH_LIMIT: u64 = 10_000_000;

/// The longest clock rollback `wait:` may wait out: each request that meets
/// the rollback is held that long (on a timer, not a thread), and clients
/// and load balancers give up on a request long before minutes.
pub const MAX_ROLLBACK_WAIT: Duration = Duration::from_secs(5);

impl Config {
    /// The largest node id the node field holds.
    pub fn max_node_id(&self) -> u64 {
        self.layout.field(&self.node_field).map_or(0, |f| f.max())
    }
}

#[cfg(test)]
mod tests;
