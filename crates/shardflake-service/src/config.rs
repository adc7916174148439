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
//! window = "3s"                 # high-water written as now + window
//! max_resume_wait = "1m"        # longest wait for a recorded high-water past window
//! max_batch = 1000000
//! rollback = "error"            # or "continue:5s", "wait:500ms"
//! tls_cert_file = "/etc/shardflake/tls.crt"   # PEM chain; HTTPS and gRPC over TLS
//! tls_key_file = "/etc/shardflake/tls.key"    # PEM key; both or neither
//! api_token_file = "/etc/shardflake/token"    # `Authorization: Bearer <token>` required
//! tickets = "/etc/shardflake/tickets.toml"    # ticket sequences: GET /v1/tickets/{sequence}
//!
//! [etcd]
//! endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
//! prefix = "/shardflake/prod"
//! lease_ttl = "10s"
//! safety_margin = "2s"
//! # TLS (https:// endpoints) and user/password authentication, all optional:
//! ca_file = "/etc/shardflake/etcd-ca.pem"          # required for https://
//! cert_file = "/etc/shardflake/etcd-client.pem"    # mutual TLS: cert and key together
//! key_file = "/etc/shardflake/etcd-client-key.pem"
//! user = "shardflake"
//! password_file = "/etc/shardflake/etcd-password" # or password = "..."
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::etcd::{ClientCert, EtcdAuth, EtcdError, EtcdTls};
use serde::Deserialize;
use shardflake::node::NodeIdSource;
use shardflake::{FieldKind, Layout, LayoutError, NodeIdError, RollbackPolicy, preset};
use shardflake_host::HostInfo;

/// One source of options (the file, the environment or the flags); every
/// option optional. Durations in the file are text like `"3s"`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// HTTP listen address.
    pub http: Option<SocketAddr>,
    /// gRPC listen address.
    pub grpc: Option<SocketAddr>,
    /// A preset name or a layout spec.
    pub layout: Option<String>,
    /// The node field the node id goes into.
    pub node_field: Option<String>,
    /// A static node id.
    pub node_id: Option<u64>,
    /// A static node id from the host: `hostname`, `mac` or `ip`.
    pub node_id_from: Option<String>,
    /// Other fixed node fields; merged name by name.
    pub fields: Option<BTreeMap<String, u64>>,
    /// Local high-water state file.
    pub state_file: Option<PathBuf>,
    /// High-water window.
    #[serde(default, deserialize_with = "duration_text")]
    pub window: Option<Duration>,
    /// Longest wait past the window for a recorded high-water at start.
    #[serde(default, deserialize_with = "duration_text")]
    pub max_resume_wait: Option<Duration>,
    /// Largest batch one request may ask for.
    pub max_batch: Option<u64>,
    /// Largest request body in bytes.
    pub max_body: Option<usize>,
    /// Clock rollback policy: `error`, `wait:DURATION`, `continue:DURATION`.
    pub rollback: Option<String>,
    /// Borrowing lead on sequence exhaustion.
    #[serde(default, deserialize_with = "duration_text")]
    pub borrow: Option<Duration>,
    /// Logical shards for ids by sharding key.
    pub shards: Option<u64>,
    /// Runtime worker threads.
    pub workers: Option<usize>,
    /// PEM certificate chain served on both listeners (with `tls_key_file`).
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of that certificate.
    pub tls_key_file: Option<PathBuf>,
    /// A file holding the bearer token the id endpoints require.
    pub api_token_file: Option<PathBuf>,
    /// The ticket servers' TOML file (`shardflake_tickets::Config`): serve
    /// its sequences at `GET /v1/tickets/{sequence}`.
    pub tickets: Option<PathBuf>,
    /// The `[etcd]` table.
    #[serde(default)]
    pub etcd: RawEtcd,
}

/// The `[etcd]` table of [`RawConfig`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEtcd {
    /// Endpoints, `http://host:port` or `https://host:port`; none (or
    /// empty): a static node id.
    pub endpoints: Option<Vec<String>>,
    /// Key prefix of this id cluster.
    pub prefix: Option<String>,
    /// Lease TTL.
    #[serde(default, deserialize_with = "duration_text")]
    pub lease_ttl: Option<Duration>,
    /// Issuing stops this long before the lease could expire.
    #[serde(default, deserialize_with = "duration_text")]
    pub safety_margin: Option<Duration>,
    /// Timeout of one etcd request.
    #[serde(default, deserialize_with = "duration_text")]
    pub timeout: Option<Duration>,
    /// CA certificate (PEM) the `https://` endpoints are verified against.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key_file: Option<PathBuf>,
    /// etcd user, for user/password authentication.
    pub user: Option<String>,
    /// File holding the user's password (a trailing newline is ignored).
    pub password_file: Option<PathBuf>,
    /// The user's password, inline (prefer `password_file`).
    pub password: Option<String>,
}

/// A duration written as text (`"3s"`, `"500ms"`, `"1m"`).
fn duration_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map(Some)
        .map_err(|_| serde::de::Error::custom(format!("{text:?}: not a duration like \"3s\"")))
}

impl RawConfig {
    /// Parses the TOML text of a configuration file.
    pub fn from_toml(text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Toml {
            origin: "config".into(),
            error: e.to_string(),
        })
    }

    /// Reads and parses a configuration file.
    pub fn from_file(path: &Path) -> Result<RawConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::ReadFile {
            path: path.to_owned(),
            error: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Toml {
            origin: format!("config file {}", path.display()),
            error: e.to_string(),
        })
    }

    /// `over` layered on `self`: each option `over` gives wins, the rest
    /// stay; fixed `fields` merge name by name; the `[etcd]` table merges
    /// option by option.
    pub fn merge(self, over: RawConfig) -> RawConfig {
        let fields = match (self.fields, over.fields) {
            (Some(mut base), Some(over)) => {
                base.extend(over);
                Some(base)
            }
            (base, over) => over.or(base),
        };
        RawConfig {
            http: over.http.or(self.http),
            grpc: over.grpc.or(self.grpc),
            layout: over.layout.or(self.layout),
            node_field: over.node_field.or(self.node_field),
            node_id: over.node_id.or(self.node_id),
            node_id_from: over.node_id_from.or(self.node_id_from),
            fields,
            state_file: over.state_file.or(self.state_file),
            window: over.window.or(self.window),
            max_resume_wait: over.max_resume_wait.or(self.max_resume_wait),
            max_batch: over.max_batch.or(self.max_batch),
            max_body: over.max_body.or(self.max_body),
            rollback: over.rollback.or(self.rollback),
            borrow: over.borrow.or(self.borrow),
            shards: over.shards.or(self.shards),
            workers: over.workers.or(self.workers),
            tls_cert_file: over.tls_cert_file.or(self.tls_cert_file),
            tls_key_file: over.tls_key_file.or(self.tls_key_file),
            api_token_file: over.api_token_file.or(self.api_token_file),
            tickets: over.tickets.or(self.tickets),
            etcd: self.etcd.merge(over.etcd),
        }
    }

    /// The host step: the facts `node_id_from` needs, read from this host
    /// only when it is given (nothing is read otherwise).
    pub fn host_facts(&self) -> HostInfo {
        if self.node_id_from.is_some() {
            HostInfo::read()
        } else {
            HostInfo {
                hostname: String::new(),
                macs: Vec::new(),
                ip: None,
            }
        }
    }
}

impl RawEtcd {
    /// `over` layered on `self`, option by option.
    pub fn merge(self, over: RawEtcd) -> RawEtcd {
        RawEtcd {
            endpoints: over.endpoints.or(self.endpoints),
            prefix: over.prefix.or(self.prefix),
            lease_ttl: over.lease_ttl.or(self.lease_ttl),
            safety_margin: over.safety_margin.or(self.safety_margin),
            timeout: over.timeout.or(self.timeout),
            ca_file: over.ca_file.or(self.ca_file),
            cert_file: over.cert_file.or(self.cert_file),
            key_file: over.key_file.or(self.key_file),
            user: over.user.or(self.user),
            password_file: over.password_file.or(self.password_file),
            password: over.password.or(self.password),
        }
    }
}

/// A configuration that cannot be used, saying what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading config file {}: {error}", path.display())]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The read failure, as text (the error stays `Clone` and `Eq`).
        error: String,
    },
    /// The file is not valid TOML, or has an unknown key or a bad value.
    #[error("{origin}: {error}")]
    Toml {
        /// Which text (`config file PATH`).
        origin: String,
        /// The parser's message, with the line.
        error: String,
    },
    /// Not a preset name nor a valid spec.
    #[error("layout {spec:?}: {error}")]
    Layout {
        /// What was given.
        spec: String,
        /// Why it is refused.
        error: LayoutError,
    },
    /// The layout has no field to hold a node id.
    #[error("layout {0} has no node field")]
    NoNodeField(String),
    /// `node_field` names no node field of the layout.
    #[error(
        "node field {field:?} is not a node field of layout {layout} (node fields: {node_fields})"
    )]
    NotANodeField {
        /// What was given.
        field: String,
        /// The layout's name.
        layout: String,
        /// Its node fields, comma-separated.
        node_fields: String,
    },
    /// Another node field of the layout has no fixed value.
    #[error("layout {layout} has node field {field:?}: give it a value with --field {field}=N")]
    FieldWithoutValue {
        /// The layout's name.
        layout: String,
        /// The field.
        field: String,
    },
    /// A value was given for the shard field, which each request's key sets.
    #[error(
        "--field {field}: layout {layout} sets {field} per request from the key (/v1/shard-id?key=K); it cannot be fixed"
    )]
    FixedShardField {
        /// The field.
        field: String,
        /// The layout's name.
        layout: String,
    },
    /// A fixed value for a field that is not another node field.
    #[error("--field {field}: not another node field of {layout}")]
    NotAnotherNodeField {
        /// The field.
        field: String,
        /// The layout's name.
        layout: String,
    },
    /// A fixed value that does not fit its field.
    #[error("--field {field}={value}: the field holds 0..={max}")]
    FieldValueTooLarge {
        /// The field.
        field: String,
        /// The value given.
        value: u64,
        /// The largest it holds.
        max: u64,
    },
    /// More logical shards than the shard field holds, or none.
    #[error("shards = {shards}: the shard field holds 1..={max} shards")]
    Shards {
        /// What was given.
        shards: u64,
        /// The most the field holds.
        max: u64,
    },
    /// etcd options without etcd endpoints: the node would run as a static
    /// node id (0 unless one is given) without a word.
    #[error(
        "{0} given without etcd endpoints: set --etcd (SHARDFLAKE_ETCD, [etcd] endpoints) for a leased node id, or remove them for a static one"
    )]
    EtcdOptionsWithoutEndpoints(String),
    /// An endpoint that is not `http://host:port` or `https://host:port`.
    #[error("etcd endpoint {0:?}: write http://host:port or https://host:port")]
    EtcdEndpoint(String),
    /// TLS files or credentials for etcd that do not go together.
    #[error("{0}")]
    EtcdSecurity(&'static str),
    /// A lease TTL etcd cannot grant, or too short to renew in.
    #[error("lease TTL {0:?}: use whole seconds, at least 2s")]
    LeaseTtl(Duration),
    /// A safety margin that leaves too little of the lease.
    #[error("safety margin {margin:?} must be at most half the lease TTL {ttl:?}")]
    SafetyMargin {
        /// The margin.
        margin: Duration,
        /// The lease TTL.
        ttl: Duration,
    },
    /// An etcd request timeout that leaves too few tries in a lease.
    #[error("etcd timeout {0:?} must be above 0 and at most a quarter of TTL - margin")]
    EtcdTimeout(Duration),
    /// An empty etcd prefix.
    #[error("etcd prefix must not be empty or /")]
    EtcdPrefix,
    /// An unknown host source.
    #[error("node_id_from {0:?}: use hostname, mac or ip")]
    NodeIdFrom(String),
    /// The host gave no usable node id.
    #[error("node id from {from}: {error}")]
    HostNodeId {
        /// The source (`hostname`, `mac`, `ip`).
        from: String,
        /// Why it gave none.
        error: NodeIdError,
    },
    /// A static node id wider than the node field.
    #[error("node id {id} does not fit node field {field:?} ({bits} bits: 0..={max})")]
    NodeIdTooLarge {
        /// The id.
        id: u64,
        /// The node field.
        field: String,
        /// Its width.
        bits: u32,
        /// The largest id it holds.
        max: u64,
    },
    /// A high-water window out of range.
    #[error("window {0:?}: use 100ms to 10m")]
    Window(Duration),
    /// A window too short for three tries at recording the high-water.
    #[error("window {window:?} must be at least 3 times the etcd timeout {timeout:?}")]
    WindowBelowEtcdTimeouts {
        /// The window.
        window: Duration,
        /// The etcd request timeout.
        timeout: Duration,
    },
    /// A largest batch out of range.
    #[error("max_batch {0}: use 1..={MAX_BATCH_LIMIT}")]
    MaxBatch(u64),
    /// A largest body out of range.
    #[error("max_body {0}: use 64..=1048576 bytes")]
    MaxBody(usize),
    /// Not `error`, `wait:DURATION` or `continue:DURATION`.
    #[error("rollback {0:?}: use error, wait:DURATION or continue:DURATION")]
    Rollback(String),
    /// A rollback policy without a readable duration.
    #[error("rollback {text:?}: write {policy}:DURATION, e.g. {policy}:5s")]
    RollbackDuration {
        /// What was given.
        text: String,
        /// `wait` or `continue`.
        policy: String,
    },
    /// `wait:` longer than a request may be held.
    #[error(
        "rollback {0:?}: a request waits at most {MAX_ROLLBACK_WAIT:?} for the clock; use continue:DURATION or error for longer steps"
    )]
    RollbackWaitTooLong(String),
    /// Leads ahead of the clock that reach past the recorded window.
    #[error(
        "borrow {borrow:?} plus rollback continue:{ride:?} must be below the window {window:?} (raise --window)"
    )]
    LeadPastWindow {
        /// The borrowing lead.
        borrow: Duration,
        /// The rollback ridden through.
        ride: Duration,
        /// The window.
        window: Duration,
    },
    /// A worker count out of range.
    #[error("workers {0}: use 1..=1024")]
    Workers(usize),
    /// A certificate without its key, or a key without its certificate.
    #[error("{given} is set but {missing} is not: give both (--tls-cert and --tls-key) or neither")]
    TlsHalf {
        /// The option given.
        given: &'static str,
        /// The option missing.
        missing: &'static str,
    },
}

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
    /// High-water window.
    pub window: Duration,
    /// How much further than `window` ahead of the clock a recorded
    /// high-water may be before start gives up instead of waiting.
    pub max_resume_wait: Duration,
    /// Largest batch.
    pub max_batch: u64,
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

/// The PEM files of the listeners' TLS identity (read at start by `serve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Largest batch the service accepts whatever the configuration says.
pub const MAX_BATCH_LIMIT: u64 = 10_000_000;

impl Config {
    /// Both stages: the host step (read only if `node_id_from` asks for
    /// it), then [`Config::validate`].
    pub fn load(raw: RawConfig) -> Result<Config, ConfigError> {
        let host = raw.host_facts();
        Self::validate(raw, &host)
    }

    /// TOML text as the only source, through both stages (tests and
    /// embedding).
    pub fn from_toml(toml_text: &str) -> Result<Config, ConfigError> {
        Self::load(RawConfig::from_toml(toml_text)?)
    }

    /// The second stage: defaults filled in and every rule checked. Pure:
    /// the host's facts come in `host` (see [`RawConfig::host_facts`]).
    pub fn validate(raw: RawConfig, host: &HostInfo) -> Result<Config, ConfigError> {
        let spec = raw.layout.unwrap_or_else(|| "snowflake".into());
        let layout = preset::resolve(&spec).map_err(|error| ConfigError::Layout {
            spec: spec.clone(),
            error,
        })?;
        let node_fields: Vec<&str> = layout
            .fields()
            .iter()
            .filter(|f| f.kind() == FieldKind::Node)
            .map(|f| f.name())
            .collect();
        let node_field = match raw.node_field {
            Some(f) => f,
            None if node_fields.contains(&"node") => "node".into(),
            None => node_fields
                .first()
                .map(|s| s.to_string())
                .ok_or_else(|| ConfigError::NoNodeField(layout.name().to_string()))?,
        };
        let width = match layout.field(&node_field) {
            Some(f) if f.kind() == FieldKind::Node => f.bits(),
            _ => {
                return Err(ConfigError::NotANodeField {
                    field: node_field,
                    layout: layout.name().to_string(),
                    node_fields: node_fields.join(", "),
                });
            }
        };

        let fixed = raw.fields.unwrap_or_default();
        let shard_field =
            (node_field != "shard" && node_fields.contains(&"shard")).then(|| "shard".to_string());
        for name in &node_fields {
            if *name == node_field || Some(*name) == shard_field.as_deref() {
                continue;
            }
            if !fixed.contains_key(*name) {
                return Err(ConfigError::FieldWithoutValue {
                    layout: layout.name().to_string(),
                    field: name.to_string(),
                });
            }
        }
        for (name, value) in &fixed {
            if Some(name.as_str()) == shard_field.as_deref() {
                return Err(ConfigError::FixedShardField {
                    field: name.clone(),
                    layout: layout.name().to_string(),
                });
            }
            let field = layout
                .field(name)
                .filter(|f| f.kind() == FieldKind::Node && *name != node_field)
                .ok_or_else(|| ConfigError::NotAnotherNodeField {
                    field: name.clone(),
                    layout: layout.name().to_string(),
                })?;
            if *value > field.max() {
                return Err(ConfigError::FieldValueTooLarge {
                    field: name.clone(),
                    value: *value,
                    max: field.max(),
                });
            }
        }
        let shard_max = shard_field
            .as_deref()
            .and_then(|f| layout.field(f))
            .map_or(0, |f| f.max());
        let shards = raw.shards.unwrap_or(shard_max + 1);
        if shard_field.is_some() && (shards == 0 || shards > shard_max + 1) {
            return Err(ConfigError::Shards {
                shards,
                max: shard_max + 1,
            });
        }

        let endpoints = raw.etcd.endpoints.clone().unwrap_or_default();
        if endpoints.is_empty() {
            let e = &raw.etcd;
            let given: Vec<&str> = [
                (e.prefix.is_some(), "etcd prefix"),
                (e.lease_ttl.is_some(), "lease TTL"),
                (e.safety_margin.is_some(), "safety margin"),
                (e.timeout.is_some(), "etcd timeout"),
                (e.ca_file.is_some(), "etcd CA file"),
                (e.cert_file.is_some(), "etcd client certificate"),
                (e.key_file.is_some(), "etcd client key"),
                (e.user.is_some(), "etcd user"),
                (
                    e.password_file.is_some() || e.password.is_some(),
                    "etcd password",
                ),
            ]
            .into_iter()
            .filter_map(|(set, name)| set.then_some(name))
            .collect();
            if !given.is_empty() {
                return Err(ConfigError::EtcdOptionsWithoutEndpoints(given.join(", ")));
            }
        }
        let (id, node_origin) = match (raw.node_id, raw.node_id_from.as_deref()) {
            (Some(id), _) => (Some(id), "node_id"),
            (None, None) => (
                None,
                if endpoints.is_empty() {
                    "default"
                } else {
                    "etcd"
                },
            ),
            (None, Some(from)) => {
                let (source, origin) = match from {
                    "hostname" | "host-ordinal" | "ordinal" => {
                        (NodeIdSource::HostOrdinal, "hostname")
                    }
                    "mac" | "mac-hash" => (NodeIdSource::MacHash, "mac"),
                    "ip" => (NodeIdSource::Ip, "ip"),
                    other => return Err(ConfigError::NodeIdFrom(other.to_string())),
                };
                let id = host
                    .node_id(&layout, &node_field, &source)
                    .map_err(|error| ConfigError::HostNodeId {
                        from: from.to_string(),
                        error,
                    })?;
                (Some(id), origin)
            }
        };
        if let Some(id) = id
            && width < 64
            && id >> width != 0
        {
            return Err(ConfigError::NodeIdTooLarge {
                id,
                field: node_field,
                bits: width,
                max: (1u64 << width) - 1,
            });
        }
        let node = if !endpoints.is_empty() {
            let mut etcd = validate_etcd(endpoints, raw.etcd)?;
            etcd.pinned_node_id = id;
            NodeSource::Etcd(etcd)
        } else {
            NodeSource::Static(id.unwrap_or(0))
        };

        let window = raw.window.unwrap_or(Duration::from_secs(3));
        if window < Duration::from_millis(100) || window > Duration::from_secs(600) {
            return Err(ConfigError::Window(window));
        }
        if let NodeSource::Etcd(e) = &node {
            // Three tries at recording the high-water fit in one window.
            if window < e.timeout * 3 {
                return Err(ConfigError::WindowBelowEtcdTimeouts {
                    window,
                    timeout: e.timeout,
                });
            }
        }
        let max_resume_wait = raw.max_resume_wait.unwrap_or(Duration::from_secs(60));
        let max_batch = raw.max_batch.unwrap_or(1_000_000);
        if max_batch == 0 || max_batch > MAX_BATCH_LIMIT {
            return Err(ConfigError::MaxBatch(max_batch));
        }
        let max_body = raw.max_body.unwrap_or(4096);
        if !(64..=1 << 20).contains(&max_body) {
            return Err(ConfigError::MaxBody(max_body));
        }
        let rollback = parse_rollback(raw.rollback.as_deref().unwrap_or("error"))?;
        let borrow = raw.borrow.unwrap_or(Duration::ZERO);
        // Ids stamped ahead of the clock (borrowed, or riding out a rollback)
        // must stay within the recorded window. The generator adds the two
        // leads (a borrowed tick and a rollback ridden through look alike to
        // it), so their sum is what must fit.
        let ride = match rollback {
            RollbackPolicy::Continue { max } => max,
            _ => Duration::ZERO,
        };
        if borrow.saturating_add(ride) >= window {
            return Err(ConfigError::LeadPastWindow {
                borrow,
                ride,
                window,
            });
        }
        let workers = raw
            .workers
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        if workers == 0 || workers > 1024 {
            return Err(ConfigError::Workers(workers));
        }
        let tls = match (raw.tls_cert_file, raw.tls_key_file) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::TlsHalf {
                    given: "tls_cert_file",
                    missing: "tls_key_file",
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::TlsHalf {
                    given: "tls_key_file",
                    missing: "tls_cert_file",
                });
            }
        };
        Ok(Config {
            http: raw
                .http
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
            grpc: raw
                .grpc
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 50051))),
            layout,
            node_field,
            node,
            node_origin,
            fixed_fields: fixed.into_iter().collect(),
            shard_field,
            shards,
            state_file: raw
                .state_file
                .unwrap_or_else(|| PathBuf::from("shardflake.state")),
            window,
            max_resume_wait,
            max_batch,
            max_body,
            rollback,
            borrow,
            workers,
            tls,
            api_token_file: raw.api_token_file,
            tickets: raw.tickets,
        })
    }

    /// The largest node id the node field holds.
    pub fn max_node_id(&self) -> u64 {
        self.layout.field(&self.node_field).map_or(0, |f| f.max())
    }
}

/// The `[etcd]` options, defaults filled in and checked against each other.
fn validate_etcd(endpoints: Vec<String>, raw: RawEtcd) -> Result<EtcdConfig, ConfigError> {
    if let Some(e) = endpoints
        .iter()
        .find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
    {
        return Err(ConfigError::EtcdEndpoint(e.clone()));
    }
    let https = endpoints.iter().any(|e| e.starts_with("https://"));
    let tls = etcd_tls(https, raw.ca_file, raw.cert_file, raw.key_file)?;
    let login = etcd_login(raw.user, raw.password_file, raw.password)?;
    let lease_ttl = raw.lease_ttl.unwrap_or(Duration::from_secs(10));
    if lease_ttl < Duration::from_secs(2) || lease_ttl.subsec_nanos() != 0 {
        return Err(ConfigError::LeaseTtl(lease_ttl));
    }
    let default_margin = (lease_ttl / 5).max(Duration::from_millis(500));
    let safety_margin = raw.safety_margin.unwrap_or(default_margin);
    if safety_margin * 2 > lease_ttl {
        return Err(ConfigError::SafetyMargin {
            margin: safety_margin,
            ttl: lease_ttl,
        });
    }
    let default_timeout = ((lease_ttl - safety_margin) / 4).min(Duration::from_secs(1));
    let timeout = raw.timeout.unwrap_or(default_timeout);
    if timeout.is_zero() || timeout * 4 > lease_ttl - safety_margin {
        return Err(ConfigError::EtcdTimeout(timeout));
    }
    let prefix = raw.prefix.unwrap_or_else(|| "/shardflake/default".into());
    let prefix = prefix.trim_end_matches('/').to_string();
    if prefix.is_empty() {
        return Err(ConfigError::EtcdPrefix);
    }
    Ok(EtcdConfig {
        endpoints,
        pinned_node_id: None,
        prefix,
        lease_ttl,
        safety_margin,
        timeout,
        tls,
        login,
    })
}

/// The TLS files for etcd, checked against each other: https endpoints need
/// a CA, a client certificate comes with its key. (The files are read when
/// the client is built.)
fn etcd_tls(
    https: bool,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
) -> Result<Option<EtcdTls>, ConfigError> {
    use ConfigError::EtcdSecurity;
    Ok(match (ca_file, cert_file, key_file) {
        (None, None, None) if https => {
            return Err(EtcdSecurity(
                "https:// etcd endpoints need the CA that signed etcd's certificates: --etcd-ca FILE",
            ));
        }
        (None, None, None) => None,
        _ if !https => {
            return Err(EtcdSecurity(
                "--etcd-ca, --etcd-cert and --etcd-key apply to https:// etcd endpoints; none is https://",
            ));
        }
        (None, _, _) => {
            return Err(EtcdSecurity(
                "--etcd-cert and --etcd-key need --etcd-ca (the CA that signed etcd's certificates)",
            ));
        }
        (Some(ca_file), Some(cert_file), Some(key_file)) => Some(EtcdTls {
            ca_file,
            client_cert: Some(ClientCert {
                cert_file,
                key_file,
            }),
        }),
        (Some(ca_file), None, None) => Some(EtcdTls {
            ca_file,
            client_cert: None,
        }),
        (Some(_), _, _) => {
            return Err(EtcdSecurity(
                "--etcd-cert and --etcd-key come together (mutual TLS)",
            ));
        }
    })
}

/// The etcd user and its one password source.
fn etcd_login(
    user: Option<String>,
    password_file: Option<PathBuf>,
    password: Option<String>,
) -> Result<Option<EtcdLogin>, ConfigError> {
    use ConfigError::EtcdSecurity;
    let password = match (password_file, password) {
        (Some(_), Some(_)) => {
            return Err(EtcdSecurity(
                "[etcd] give password_file or password, not both",
            ));
        }
        (Some(path), None) => Some(Secret::File(path)),
        (None, Some(p)) => Some(Secret::Inline(p)),
        (None, None) => None,
    };
    match (user, password) {
        (Some(user), _) if user.is_empty() => Err(EtcdSecurity("the etcd user must not be empty")),
        (Some(user), Some(password)) => Ok(Some(EtcdLogin { user, password })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(EtcdSecurity(
            "--etcd-user needs a password: --etcd-password-file FILE",
        )),
        (None, Some(_)) => Err(EtcdSecurity(
            "an etcd password needs its user: --etcd-user NAME",
        )),
    }
}

/// The longest clock rollback `wait:` may wait out: each request that meets
/// the rollback is held that long (on a timer, not a thread), and clients
/// and load balancers give up on a request long before minutes.
pub const MAX_ROLLBACK_WAIT: Duration = Duration::from_secs(5);

/// `error`, `wait:DURATION` (at most [`MAX_ROLLBACK_WAIT`]) or `continue:DURATION`.
pub fn parse_rollback(text: &str) -> Result<RollbackPolicy, ConfigError> {
    let (name, arg) = text.split_once(':').unwrap_or((text, ""));
    let max = || {
        humantime::parse_duration(arg.trim()).map_err(|_| ConfigError::RollbackDuration {
            text: text.to_string(),
            policy: name.to_string(),
        })
    };
    Ok(match name.trim() {
        "error" if arg.is_empty() => RollbackPolicy::Error,
        "wait" => {
            let max = max()?;
            if max > MAX_ROLLBACK_WAIT {
                return Err(ConfigError::RollbackWaitTooLong(text.to_string()));
            }
            RollbackPolicy::Wait { max }
        }
        "continue" => RollbackPolicy::Continue { max: max()? },
        _ => return Err(ConfigError::Rollback(text.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_host() -> HostInfo {
        HostInfo {
            hostname: String::new(),
            macs: Vec::new(),
            ip: None,
        }
    }

    /// `over` layered on the TOML text, validated.
    fn load(over: RawConfig, toml: &str) -> Result<Config, ConfigError> {
        Config::validate(RawConfig::from_toml(toml)?.merge(over), &no_host())
    }

    fn err(over: RawConfig, toml: &str) -> String {
        load(over, toml).unwrap_err().to_string()
    }

    #[test]
    fn embedded_default() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.http.to_string(), "127.0.0.1:8080");
        assert_eq!(c.layout.name(), "snowflake");
        assert_eq!(c.node, NodeSource::Static(0));
        assert_eq!(c.node_field, "node");
        assert_eq!(c.shard_field, None);
        assert_eq!(c.rollback, RollbackPolicy::Error);
        assert_eq!((c.tls, c.api_token_file), (None, None));
    }

    #[test]
    fn flags_override_the_file() {
        let args = RawConfig {
            node_id: Some(9),
            max_batch: Some(10),
            ..Default::default()
        };
        let c = load(args, "node_id = 3\nmax_batch = 5\nwindow = \"2s\"").unwrap();
        assert_eq!(c.node, NodeSource::Static(9));
        assert_eq!(c.max_batch, 10);
        assert_eq!(c.window, Duration::from_secs(2));
    }

    #[test]
    fn merge_is_field_by_field_file_then_env_then_flags() {
        let file = RawConfig::from_toml(
            "layout = \"twitter\"\nmax_batch = 5\nwindow = \"2s\"\n\
             fields = { datacenter = 1, region = 7 }\n\
             [etcd]\nendpoints = [\"http://file:2379\"]\nprefix = \"/file\"\nlease_ttl = \"4s\"",
        )
        .unwrap();
        let env = RawConfig {
            max_batch: Some(6),
            workers: Some(2),
            fields: Some(BTreeMap::from([("datacenter".into(), 2)])),
            etcd: RawEtcd {
                prefix: Some("/env".into()),
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
            ..Default::default()
        };
        let flags = RawConfig {
            workers: Some(3),
            etcd: RawEtcd {
                endpoints: Some(vec!["http://flag:2379".into()]),
                ..Default::default()
            },
            ..Default::default()
        };
        let raw = file.merge(env).merge(flags);
        // Each option from the last source that gives it.
        assert_eq!(raw.layout.as_deref(), Some("twitter"));
        assert_eq!(raw.window, Some(Duration::from_secs(2)));
        assert_eq!(raw.max_batch, Some(6));
        assert_eq!(raw.workers, Some(3));
        // Fixed fields merge name by name.
        let fields = BTreeMap::from([("datacenter".into(), 2), ("region".into(), 7)]);
        assert_eq!(raw.fields, Some(fields));
        // So does the [etcd] table.
        assert_eq!(
            raw.etcd,
            RawEtcd {
                endpoints: Some(vec!["http://flag:2379".into()]),
                prefix: Some("/env".into()),
                lease_ttl: Some(Duration::from_secs(4)),
                safety_margin: None,
                timeout: Some(Duration::from_millis(300)),
                ..RawEtcd::default()
            }
        );
        // An empty layer changes nothing, whichever side it is on.
        assert_eq!(raw.clone().merge(RawConfig::default()), raw);
        assert_eq!(RawConfig::default().merge(raw.clone()), raw);
    }

    #[test]
    fn etcd_section() {
        let c = load(
            RawConfig::default(),
            "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nlease_ttl = \"4s\"\nprefix = \"/x/\"",
        )
        .unwrap();
        let NodeSource::Etcd(e) = c.node else {
            panic!()
        };
        assert_eq!(e.prefix, "/x");
        assert_eq!(e.lease_ttl, Duration::from_secs(4));
        assert_eq!(e.safety_margin, Duration::from_millis(800));
    }

    #[test]
    fn etcd_tls_and_login_go_together() {
        let etcd = |extra: &str| {
            let toml = format!("[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\n{extra}");
            load(RawConfig::default(), &toml)
        };
        let Ok(c) = etcd("ca_file = \"ca.pem\"\nuser = \"u\"\npassword_file = \"pw\"") else {
            panic!("a CA and a login are enough")
        };
        let NodeSource::Etcd(e) = c.node else {
            panic!()
        };
        assert_eq!(e.tls.map(|t| t.ca_file), Some(PathBuf::from("ca.pem")));
        let login = e.login.expect("a login");
        assert_eq!(login.password, Secret::File("pw".into()));
        // The password never shows in logs.
        assert!(!format!("{login:?}").contains("hunter2"));
        for (extra, message) in [
            ("", "need the CA"),
            ("ca_file = \"c\"\ncert_file = \"x\"", "come together"),
            ("cert_file = \"x\"\nkey_file = \"y\"", "need --etcd-ca"),
            ("ca_file = \"c\"\nuser = \"u\"", "needs a password"),
            ("ca_file = \"c\"\npassword = \"p\"", "needs its user"),
            (
                "ca_file = \"c\"\nuser = \"u\"\npassword = \"p\"\npassword_file = \"f\"",
                "not both",
            ),
        ] {
            let e = etcd(extra).expect_err(extra);
            assert!(matches!(e, ConfigError::EtcdSecurity(_)), "{e:?}");
            assert!(e.to_string().contains(message), "{extra}: {e}");
        }
        let plain = "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nca_file = \"c\"";
        let e = load(RawConfig::default(), plain).expect_err("a CA without https");
        assert!(e.to_string().contains("apply to https://"), "{e}");
        let inline = EtcdLogin {
            user: "u".into(),
            password: Secret::Inline("hunter2".into()),
        };
        assert!(!format!("{inline:?}").contains("hunter2"));
    }

    fn etcd(endpoint: &str) -> RawEtcd {
        RawEtcd {
            endpoints: Some(vec![endpoint.into()]),
            ..Default::default()
        }
    }

    #[test]
    fn clear_errors() {
        let none = RawConfig::default;
        assert!(err(none(), "node_id = 1024").contains("does not fit"));
        assert!(err(none(), "layout = \"twitter\"").contains("--field"));
        assert!(err(none(), "nope = 1").contains("unknown field"));
        assert!(err(none(), "[etcd]\nnope = 1").contains("unknown field"));
        assert!(err(none(), "window = \"soon\"").contains("not a duration like"));
        assert!(err(none(), "max_batch = 0").contains("max_batch"));
        assert!(err(none(), "rollback = \"sometimes\"").contains("rollback"));
        // A node id with etcd: that id, reserved in the registry.
        let pinned = RawConfig {
            etcd: etcd("http://127.0.0.1:1"),
            node_id: Some(1),
            ..Default::default()
        };
        let NodeSource::Etcd(e) = load(pinned, "").unwrap().node else {
            panic!("not etcd")
        };
        assert_eq!(e.pinned_node_id, Some(1));
        // etcd options without endpoints would mean static node 0.
        let c = load(none(), "").unwrap();
        assert_eq!((c.node, c.node_origin), (NodeSource::Static(0), "default"));
        for toml in ["[etcd]\nprefix = \"/p\"", "[etcd]\nlease_ttl = \"5s\""] {
            assert!(
                err(none(), toml).contains("without etcd endpoints"),
                "{toml}"
            );
        }
        let https = RawConfig {
            etcd: etcd("https://127.0.0.1:1"),
            ..Default::default()
        };
        assert!(err(https, "").contains("--etcd-ca"));
        let ftp = RawConfig {
            etcd: etcd("ftp://127.0.0.1:1"),
            ..Default::default()
        };
        assert!(err(ftp, "").contains("http://host:port or https://host:port"));
        let ttl = RawConfig {
            etcd: RawEtcd {
                lease_ttl: Some(Duration::from_millis(1500)),
                ..etcd("http://127.0.0.1:1")
            },
            ..Default::default()
        };
        assert!(err(ttl, "").contains("TTL"));
        assert!(err(none(), "borrow = \"3s\"").contains("below the window"));
        assert!(err(none(), "rollback = \"continue:5s\"").contains("below the window"));
        // Each below the window, but the generator adds them.
        let both = "borrow = \"2s\"\nrollback = \"continue:2s\"";
        assert!(err(none(), both).contains("plus rollback continue"));
        assert!(load(none(), "borrow = \"1s\"\nrollback = \"continue:1s\"").is_ok());
        // A request may not be held for half a minute.
        assert!(err(none(), "rollback = \"wait:30s\"").contains("at most 5s"));
        assert!(err(none(), "rollback = \"wait:x\"").contains("wait:DURATION, e.g."));
        assert!(load(none(), "rollback = \"wait:5s\"").is_ok());
        let slow = RawConfig {
            etcd: RawEtcd {
                timeout: Some(Duration::from_secs(1)),
                ..etcd("http://127.0.0.1:1")
            },
            window: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        assert!(err(slow, "").contains("3 times the etcd timeout"));
        assert!(err(none(), "workers = 0").contains("workers"));
        assert!(err(none(), "max_body = 10").contains("max_body"));
    }

    #[test]
    fn errors_are_typed() {
        let e = load(RawConfig::default(), "node_id = 1024").unwrap_err();
        assert!(
            matches!(e, ConfigError::NodeIdTooLarge { id: 1024, .. }),
            "{e:?}"
        );
        let e = load(RawConfig::default(), "layout = \"nope\"").unwrap_err();
        assert!(matches!(e, ConfigError::Layout { .. }), "{e:?}");
        let e = load(RawConfig::default(), "max_batch = 0").unwrap_err();
        assert_eq!(e, ConfigError::MaxBatch(0));
    }

    #[test]
    fn tls_files_go_together() {
        let c = load(
            RawConfig::default(),
            "tls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\napi_token_file = \"t\"",
        )
        .unwrap();
        let files = TlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into(),
        };
        assert_eq!(c.tls, Some(files));
        assert_eq!(c.api_token_file, Some(PathBuf::from("t")));
        let half = err(RawConfig::default(), "tls_cert_file = \"c.pem\"");
        assert!(half.contains("tls_key_file is not"), "{half}");
        assert!(half.contains("--tls-key"), "{half}");
        let half = err(RawConfig::default(), "tls_key_file = \"k.pem\"");
        assert!(half.contains("tls_cert_file is not"), "{half}");
    }

    #[test]
    fn host_step_is_separate_and_only_when_asked() {
        // Without node_id_from nothing is read from the host.
        let facts = RawConfig::default().host_facts();
        assert!(facts.hostname.is_empty() && facts.macs.is_empty() && facts.ip.is_none());
        // Validation reads the facts it is given, not the host.
        let pod = HostInfo {
            hostname: "ids-7".into(),
            macs: Vec::new(),
            ip: None,
        };
        let raw = RawConfig::from_toml("node_id_from = \"hostname\"").unwrap();
        let c = Config::validate(raw.clone(), &pod).unwrap();
        assert_eq!(c.node, NodeSource::Static(7));
        // An explicit node id wins over the host.
        let explicit = RawConfig {
            node_id: Some(2),
            ..raw.clone()
        };
        assert_eq!(
            Config::validate(explicit, &pod).unwrap().node,
            NodeSource::Static(2)
        );
        let e = Config::validate(raw, &no_host()).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("node id from hostname: host name \"\""),
            "{e}"
        );
        let mac = RawConfig::from_toml("node_id_from = \"mac\"").unwrap();
        let e = Config::validate(mac, &pod).unwrap_err();
        assert!(matches!(e, ConfigError::HostNodeId { .. }), "{e}");
        let bad = RawConfig::from_toml("node_id_from = \"dns\"").unwrap();
        assert!(
            Config::validate(bad, &pod)
                .unwrap_err()
                .to_string()
                .contains("use hostname, mac or ip")
        );
    }

    /// The files are read when the client is built (not by `validate`):
    /// what is missing or is not what it says fails there, by name.
    #[test]
    fn etcd_tls_and_password_files_are_read_when_the_client_is_built() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (ca, key_file, pw) = (
            dir.path().join("ca.pem"),
            dir.path().join("key.pem"),
            dir.path().join("pw"),
        );
        std::fs::write(&ca, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        std::fs::write(&pw, "s3cret\n").unwrap();
        let config = |extra: String| {
            let toml = format!("[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\n{extra}");
            load(RawConfig::default(), &toml).unwrap()
        };
        let built = |c: Config| crate::registry::for_node_source(&c.node).map(|_| ());
        let missing = config(format!("ca_file = {:?}", dir.path().join("nope.pem")));
        assert!(built(missing).unwrap_err().to_string().contains("nope.pem"));
        // A key is not a certificate: the file must parse as what it is.
        let not_a_cert = config(format!("ca_file = {key_file:?}"));
        let e = built(not_a_cert).unwrap_err();
        assert!(
            e.needs_operator() && e.to_string().contains("no PEM certificate"),
            "{e}"
        );
        let no_pw = config(format!(
            "ca_file = {ca:?}\nuser = \"app\"\npassword_file = {:?}",
            dir.path().join("nopw")
        ));
        assert!(
            built(no_pw)
                .unwrap_err()
                .to_string()
                .contains("password file")
        );
        let full = config(format!(
            "ca_file = {ca:?}\ncert_file = {ca:?}\nkey_file = {key_file:?}\nuser = \"app\"\npassword_file = {pw:?}"
        ));
        let NodeSource::Etcd(e) = &full.node else {
            panic!()
        };
        // The password file's newline is dropped; Debug never shows it.
        let auth = e.login.as_ref().unwrap().read().unwrap();
        assert_eq!(
            (auth.user.as_str(), auth.password.as_str()),
            ("app", "s3cret")
        );
        assert!(!format!("{auth:?}").contains("s3cret"));
        built(full).unwrap();
    }

    #[test]
    fn shard_layouts() {
        let spec = "orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)";
        let c = load(
            RawConfig {
                layout: Some(spec.into()),
                shards: Some(40),
                ..Default::default()
            },
            "",
        )
        .unwrap();
        assert_eq!(c.shard_field.as_deref(), Some("shard"));
        assert_eq!(c.shards, 40);
        // The key sets the shard: a fixed value would be shown and ignored.
        let fixed_shard = load(
            RawConfig {
                layout: Some(spec.into()),
                fields: Some(BTreeMap::from([("shard".into(), 5)])),
                ..Default::default()
            },
            "",
        )
        .unwrap_err();
        assert!(fixed_shard.to_string().contains("per request from the key"));
        let twitter = load(
            RawConfig {
                layout: Some("twitter".into()),
                node_field: Some("worker".into()),
                fields: Some(BTreeMap::from([("datacenter".into(), 3)])),
                ..Default::default()
            },
            "",
        )
        .unwrap();
        assert_eq!(twitter.fixed_fields, vec![("datacenter".into(), 3)]);
    }
}
