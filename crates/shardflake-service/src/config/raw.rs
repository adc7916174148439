//! The first stage: options as read from the TOML file, the environment
//! and the flags, every one optional, layered source over source.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use shardflake_host::HostInfo;

use super::ConfigError;

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
    /// Where a static node without a state file resumes: `now`, Unix ms or
    /// RFC 3339.
    pub resume_after: Option<String>,
    /// High-water window.
    #[serde(default, deserialize_with = "duration_text")]
    pub window: Option<Duration>,
    /// Longest wait past the window for a recorded high-water at start.
    #[serde(default, deserialize_with = "duration_text")]
    pub max_resume_wait: Option<Duration>,
    /// Largest batch one request may ask for.
    pub max_batch: Option<u64>,
    /// Warn at start when the layout has less than this left.
    #[serde(default, deserialize_with = "duration_text")]
    pub lifetime_warning: Option<Duration>,
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
    /// Key prefix of the fleet this one replaces with another layout.
    pub previous_prefix: Option<String>,
    /// The fleet id the node belongs to: it takes an id only where etcd
    /// holds it.
    pub fleet: Option<String>,
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
            resume_after: over.resume_after.or(self.resume_after),
            window: over.window.or(self.window),
            max_resume_wait: over.max_resume_wait.or(self.max_resume_wait),
            max_batch: over.max_batch.or(self.max_batch),
            lifetime_warning: over.lifetime_warning.or(self.lifetime_warning),
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
            previous_prefix: over.previous_prefix.or(self.previous_prefix),
            fleet: over.fleet.or(self.fleet),
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
