//! [`ConfigError`]: why a configuration cannot be used, saying what to change.

use std::path::PathBuf;
use std::time::Duration;

use shardflake::node::NodeIdSource;
use shardflake::{LayoutError, NodeIdError};

use super::{MAX_BATCH_LIMIT, MAX_ROLLBACK_WAIT};

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
    /// `--previous-prefix` names the fleet's own prefix.
    #[error(
        "--previous-prefix {0} is this fleet's own --etcd-prefix: a layout change starts the new fleet on a new prefix and names the old one as previous"
    )]
    PreviousPrefixSame(String),
    /// A `--fleet` that is no fleet id.
    #[error(
        "--fleet {given:?} is not a fleet id: {why}. A fleet id is 32 hex digits, minted by the fleet's first node (which starts without --fleet): copy it from `etcdctl get <prefix>/fleet --print-value-only` or from the fleet line of one of the fleet's state files"
    )]
    FleetId {
        /// The value given.
        given: String,
        /// What is wrong with it.
        why: String,
    },
    /// An etcd prefix without its leading `/`.
    #[error(
        "etcd prefix {0:?} must start with /: without it, it names another namespace than \"/{0}\" (nodes under both would hand out one node id twice); use --etcd-prefix /{0}"
    )]
    EtcdPrefixSlash(String),
    /// An unknown host source.
    #[error("node_id_from {0:?}: use {hosts}", hosts = NodeIdSource::HOST_NAMES)]
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
    /// `resume_after` is not `now`, Unix ms nor RFC 3339.
    #[error("resume_after {0:?}: use now, Unix milliseconds or RFC 3339 (2026-01-01T00:00:00Z)")]
    ResumeAfter(String),
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
