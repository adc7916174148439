//! Configuration: a TOML file, overridden by `SHARDFLAKE_*` environment
//! variables, overridden by flags; validated once, at start, with errors that
//! say what to change.
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
//!
//! [etcd]
//! endpoints = ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
//! prefix = "/shardflake/prod"
//! lease_ttl = "10s"
//! safety_margin = "2s"
//! # TLS (https:// endpoints) and user/password authentication, all optional:
//! ca_file = "/etc/shardflake/etcd-ca.pem"      # required for https://
//! cert_file = "/etc/shardflake/etcd-client.pem" # mutual TLS: cert and key together
//! key_file = "/etc/shardflake/etcd-client-key.pem"
//! user = "shardflake"
//! password_file = "/etc/shardflake/etcd-password" # or password = "..."
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use shardflake::node::NodeIdSource;
use shardflake::{FieldKind, Layout, RollbackPolicy, preset};

use crate::etcd::{ClientCert, EtcdAuth, EtcdTls};

/// `shardflake serve` flags; each also reads `SHARDFLAKE_<NAME>`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file (flags and SHARDFLAKE_* variables override it).
    #[arg(long, env = "SHARDFLAKE_CONFIG")]
    pub config: Option<PathBuf>,
    /// HTTP listen address [default: 127.0.0.1:8080; port 0 picks a free one].
    #[arg(long, env = "SHARDFLAKE_HTTP")]
    pub http: Option<SocketAddr>,
    /// gRPC listen address [default: 127.0.0.1:50051].
    #[arg(long, env = "SHARDFLAKE_GRPC")]
    pub grpc: Option<SocketAddr>,
    /// Layout: a preset name or a spec [default: snowflake].
    #[arg(long, short, env = "SHARDFLAKE_LAYOUT")]
    pub layout: Option<String>,
    /// The node field the node id goes into [default: `node`, else the
    /// layout's first node field].
    #[arg(long, env = "SHARDFLAKE_NODE_FIELD")]
    pub node_field: Option<String>,
    /// A static node id [default: 0 without etcd].
    #[arg(long, env = "SHARDFLAKE_NODE_ID", conflicts_with = "node_id_from")]
    pub node_id: Option<u64>,
    /// A static node id from the host: hostname (StatefulSet ordinal), mac, ip.
    #[arg(long, env = "SHARDFLAKE_NODE_ID_FROM")]
    pub node_id_from: Option<String>,
    /// Another fixed node field, NAME=VALUE (repeatable; in SHARDFLAKE_FIELD
    /// separate them with commas).
    #[arg(
        long = "field",
        value_name = "NAME=VALUE",
        env = "SHARDFLAKE_FIELD",
        value_delimiter = ','
    )]
    pub fields: Vec<String>,
    /// Lease node ids from etcd: comma-separated endpoints (http://host:port
    /// or https://host:port).
    #[arg(long, env = "SHARDFLAKE_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Key prefix of this id cluster in etcd [default: /shardflake/default].
    #[arg(long, env = "SHARDFLAKE_ETCD_PREFIX")]
    pub etcd_prefix: Option<String>,
    /// Lease TTL [default: 10s].
    #[arg(long, env = "SHARDFLAKE_LEASE_TTL", value_parser = humantime::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// Stop issuing this long before the lease could expire [default: TTL/5, at least 500ms].
    #[arg(long, env = "SHARDFLAKE_SAFETY_MARGIN", value_parser = humantime::parse_duration)]
    pub safety_margin: Option<Duration>,
    /// Timeout of one etcd request [default: 1s, at most (TTL - margin)/4].
    #[arg(long, env = "SHARDFLAKE_ETCD_TIMEOUT", value_parser = humantime::parse_duration)]
    pub etcd_timeout: Option<Duration>,
    /// CA certificate (PEM) that https:// etcd endpoints are verified against.
    #[arg(long, env = "SHARDFLAKE_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's mutual TLS (with --etcd-key).
    #[arg(long, env = "SHARDFLAKE_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(long, env = "SHARDFLAKE_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user, for etcd's user/password authentication (with --etcd-password-file).
    #[arg(long, env = "SHARDFLAKE_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (a trailing newline is ignored).
    #[arg(long, env = "SHARDFLAKE_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// High-water window: the recorded high-water is now + window [default: 3s].
    #[arg(long, env = "SHARDFLAKE_WINDOW", value_parser = humantime::parse_duration)]
    pub window: Option<Duration>,
    /// At start, wait at most window + this for the clock to pass a recorded
    /// high-water; a record further ahead fails the start [default: 1m].
    #[arg(long, env = "SHARDFLAKE_MAX_RESUME_WAIT", value_parser = humantime::parse_duration)]
    pub max_resume_wait: Option<Duration>,
    /// Local high-water state file [default: ./shardflake.state].
    #[arg(long, env = "SHARDFLAKE_STATE_FILE")]
    pub state_file: Option<PathBuf>,
    /// Largest batch one request may ask for [default: 1000000].
    #[arg(long, env = "SHARDFLAKE_MAX_BATCH")]
    pub max_batch: Option<u64>,
    /// Largest request body in bytes [default: 4096].
    #[arg(long, env = "SHARDFLAKE_MAX_BODY")]
    pub max_body: Option<usize>,
    /// Clock rollback policy: error, wait:DURATION or continue:DURATION [default: error].
    #[arg(long, env = "SHARDFLAKE_ROLLBACK")]
    pub rollback: Option<String>,
    /// Let a full tick borrow sequence from future ticks, up to this lead [default: 0, wait].
    #[arg(long, env = "SHARDFLAKE_BORROW", value_parser = humantime::parse_duration)]
    pub borrow: Option<Duration>,
    /// Logical shards for ids by sharding key [default: every value of the shard field].
    #[arg(long, env = "SHARDFLAKE_SHARDS")]
    pub shards: Option<u64>,
    /// Runtime worker threads [default: one per CPU].
    #[arg(long, env = "SHARDFLAKE_WORKERS")]
    pub workers: Option<usize>,
}

/// The TOML file; every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    http: Option<SocketAddr>,
    grpc: Option<SocketAddr>,
    layout: Option<String>,
    node_field: Option<String>,
    node_id: Option<u64>,
    node_id_from: Option<String>,
    #[serde(default)]
    fields: BTreeMap<String, u64>,
    state_file: Option<PathBuf>,
    window: Option<String>,
    max_resume_wait: Option<String>,
    max_batch: Option<u64>,
    max_body: Option<usize>,
    rollback: Option<String>,
    borrow: Option<String>,
    shards: Option<u64>,
    workers: Option<usize>,
    etcd: Option<FileEtcd>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEtcd {
    #[serde(default)]
    endpoints: Vec<String>,
    prefix: Option<String>,
    lease_ttl: Option<String>,
    safety_margin: Option<String>,
    timeout: Option<String>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    password: Option<String>,
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
    /// Endpoints, `http://host:port` or `https://host:port`, tried in turn.
    pub endpoints: Vec<String>,
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
    pub auth: Option<EtcdAuth>,
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
}

/// Largest batch the service accepts whatever the configuration says.
pub const MAX_BATCH_LIMIT: u64 = 10_000_000;

impl Config {
    /// Reads the file named by `args.config`, then the environment (through
    /// clap), then flags, and validates the result.
    pub fn load(args: &ServeArgs) -> anyhow::Result<Config> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading config file {}", path.display()))?;
                toml::from_str::<FileConfig>(&text)
                    .with_context(|| format!("config file {}", path.display()))?
            }
            None => FileConfig::default(),
        };
        Self::merge(args, file)
    }

    /// Parses TOML text and merges it under `args` (for tests and embedding).
    pub fn from_toml(args: &ServeArgs, toml_text: &str) -> anyhow::Result<Config> {
        let file = toml::from_str::<FileConfig>(toml_text).context("config")?;
        Self::merge(args, file)
    }

    fn merge(args: &ServeArgs, file: FileConfig) -> anyhow::Result<Config> {
        let dur =
            |flag: Option<Duration>, text: Option<String>, key: &str, default: Duration| match (
                flag, text,
            ) {
                (Some(d), _) => Ok(d),
                (None, Some(t)) => humantime::parse_duration(&t)
                    .with_context(|| format!("{key} = {t:?}: not a duration like \"3s\"")),
                (None, None) => Ok(default),
            };
        let spec = args
            .layout
            .clone()
            .or(file.layout)
            .unwrap_or_else(|| "snowflake".into());
        let layout = preset::resolve(&spec).with_context(|| format!("layout {spec:?}"))?;
        let node_fields: Vec<&str> = layout
            .fields()
            .iter()
            .filter(|f| f.kind() == FieldKind::Node)
            .map(|f| f.name())
            .collect();
        let node_field = match args.node_field.clone().or(file.node_field) {
            Some(f) => f,
            None if node_fields.contains(&"node") => "node".into(),
            None => node_fields
                .first()
                .map(|s| s.to_string())
                .with_context(|| format!("layout {} has no node field", layout.name()))?,
        };
        let width = match layout.field(&node_field) {
            Some(f) if f.kind() == FieldKind::Node => f.bits(),
            _ => bail!(
                "node field {node_field:?} is not a node field of layout {} (node fields: {})",
                layout.name(),
                node_fields.join(", ")
            ),
        };

        let mut fixed: BTreeMap<String, u64> = file.fields;
        for f in &args.fields {
            let (name, value) = f
                .split_once('=')
                .with_context(|| format!("--field {f:?}: write NAME=VALUE"))?;
            let value: u64 = value
                .trim()
                .parse()
                .with_context(|| format!("--field {f:?}: value is not a number"))?;
            fixed.insert(name.trim().to_string(), value);
        }
        let shard_field =
            (node_field != "shard" && node_fields.contains(&"shard")).then(|| "shard".to_string());
        for name in &node_fields {
            if *name == node_field || Some(*name) == shard_field.as_deref() {
                continue;
            }
            if !fixed.contains_key(*name) {
                bail!(
                    "layout {} has node field {name:?}: give it a value with --field {name}=N",
                    layout.name()
                );
            }
        }
        for (name, value) in &fixed {
            if Some(name.as_str()) == shard_field.as_deref() {
                bail!(
                    "--field {name}: layout {} sets {name} per request from the key (/v1/shard-id?key=K); it cannot be fixed",
                    layout.name()
                );
            }
            let field = layout
                .field(name)
                .filter(|f| f.kind() == FieldKind::Node && *name != node_field)
                .with_context(|| {
                    format!(
                        "--field {name}: not another node field of {}",
                        layout.name()
                    )
                })?;
            if *value > field.max() {
                bail!(
                    "--field {name}={value}: the field holds 0..={}",
                    field.max()
                );
            }
        }
        let shard_max = shard_field
            .as_deref()
            .and_then(|f| layout.field(f))
            .map_or(0, |f| f.max());
        let shards = args.shards.or(file.shards).unwrap_or(shard_max + 1);
        if shard_field.is_some() && (shards == 0 || shards > shard_max + 1) {
            bail!(
                "shards = {shards}: the shard field holds 1..={} shards",
                shard_max + 1
            );
        }

        let endpoints = if args.etcd.is_empty() {
            file.etcd
                .as_ref()
                .map(|e| e.endpoints.clone())
                .unwrap_or_default()
        } else {
            args.etcd.clone()
        };
        let static_id = args.node_id.or(file.node_id);
        let from = args.node_id_from.clone().or(file.node_id_from);
        let node = if !endpoints.is_empty() {
            if static_id.is_some() || from.is_some() {
                bail!("give either etcd endpoints or a static node id, not both");
            }
            let fe = file.etcd.unwrap_or_default();
            for e in &endpoints {
                if !(e.starts_with("http://") || e.starts_with("https://")) {
                    bail!("etcd endpoint {e:?}: write http://host:port or https://host:port");
                }
            }
            let (tls, auth) = etcd_security(args, &fe, &endpoints)?;
            let lease_ttl = dur(
                args.lease_ttl,
                fe.lease_ttl,
                "etcd.lease_ttl",
                Duration::from_secs(10),
            )?;
            if lease_ttl < Duration::from_secs(2) || lease_ttl.subsec_nanos() != 0 {
                bail!("lease TTL {lease_ttl:?}: use whole seconds, at least 2s");
            }
            let default_margin = (lease_ttl / 5).max(Duration::from_millis(500));
            let safety_margin = dur(
                args.safety_margin,
                fe.safety_margin,
                "etcd.safety_margin",
                default_margin,
            )?;
            if safety_margin * 2 > lease_ttl {
                bail!(
                    "safety margin {safety_margin:?} must be at most half the lease TTL {lease_ttl:?}"
                );
            }
            let default_timeout = ((lease_ttl - safety_margin) / 4).min(Duration::from_secs(1));
            let timeout = dur(
                args.etcd_timeout,
                fe.timeout,
                "etcd.timeout",
                default_timeout,
            )?;
            if timeout.is_zero() || timeout * 4 > lease_ttl - safety_margin {
                bail!(
                    "etcd timeout {timeout:?} must be above 0 and at most a quarter of TTL - margin"
                );
            }
            let prefix = args
                .etcd_prefix
                .clone()
                .or(fe.prefix)
                .unwrap_or_else(|| "/shardflake/default".into());
            let prefix = prefix.trim_end_matches('/').to_string();
            if prefix.is_empty() {
                bail!("etcd prefix must not be empty or /");
            }
            NodeSource::Etcd(EtcdConfig {
                endpoints,
                prefix,
                lease_ttl,
                safety_margin,
                timeout,
                tls,
                auth,
            })
        } else {
            let id = match (static_id, from.as_deref()) {
                (Some(id), _) => id,
                (None, None) => 0,
                (None, Some(src)) => {
                    let source = match src {
                        "hostname" | "host-ordinal" | "ordinal" => NodeIdSource::HostOrdinal,
                        "mac" | "mac-hash" => NodeIdSource::MacHash,
                        "ip" => NodeIdSource::Ip,
                        other => bail!("node_id_from {other:?}: use hostname, mac or ip"),
                    };
                    shardflake_host::HostInfo::read()
                        .node_id(&layout, &node_field, &source)
                        .with_context(|| format!("node id from {src}"))?
                }
            };
            if width < 64 && id >> width != 0 {
                bail!(
                    "node id {id} does not fit node field {node_field:?} ({width} bits: 0..={})",
                    (1u64 << width) - 1
                );
            }
            NodeSource::Static(id)
        };

        let window = dur(args.window, file.window, "window", Duration::from_secs(3))?;
        if window < Duration::from_millis(100) || window > Duration::from_secs(600) {
            bail!("window {window:?}: use 100ms to 10m");
        }
        if let NodeSource::Etcd(e) = &node {
            // Three tries at recording the high-water fit in one window.
            if window < e.timeout * 3 {
                bail!(
                    "window {window:?} must be at least 3 times the etcd timeout {:?}",
                    e.timeout
                );
            }
        }
        let max_resume_wait = dur(
            args.max_resume_wait,
            file.max_resume_wait,
            "max_resume_wait",
            Duration::from_secs(60),
        )?;
        let max_batch = args.max_batch.or(file.max_batch).unwrap_or(1_000_000);
        if max_batch == 0 || max_batch > MAX_BATCH_LIMIT {
            bail!("max_batch {max_batch}: use 1..={MAX_BATCH_LIMIT}");
        }
        let max_body = args.max_body.or(file.max_body).unwrap_or(4096);
        if !(64..=1 << 20).contains(&max_body) {
            bail!("max_body {max_body}: use 64..=1048576 bytes");
        }
        let rollback = parse_rollback(
            &args
                .rollback
                .clone()
                .or(file.rollback)
                .unwrap_or_else(|| "error".into()),
        )?;
        let borrow = dur(args.borrow, file.borrow, "borrow", Duration::ZERO)?;
        // Ids stamped ahead of the clock (borrowed, or riding out a rollback)
        // must stay within the recorded window.
        // The generator adds the two leads (a borrowed tick and a rollback
        // ridden through look alike to it), so their sum is what must fit.
        let ride = match rollback {
            RollbackPolicy::Continue { max } => max,
            _ => Duration::ZERO,
        };
        if borrow.saturating_add(ride) >= window {
            bail!(
                "borrow {borrow:?} plus rollback continue:{ride:?} must be below the window {window:?} (raise --window)"
            );
        }
        let workers = args
            .workers
            .or(file.workers)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        if workers == 0 || workers > 1024 {
            bail!("workers {workers}: use 1..=1024");
        }
        Ok(Config {
            http: args
                .http
                .or(file.http)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
            grpc: args
                .grpc
                .or(file.grpc)
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 50051))),
            layout,
            node_field,
            node,
            fixed_fields: fixed.into_iter().collect(),
            shard_field,
            shards,
            state_file: args
                .state_file
                .clone()
                .or(file.state_file)
                .unwrap_or_else(|| PathBuf::from("shardflake.state")),
            window,
            max_resume_wait,
            max_batch,
            max_body,
            rollback,
            borrow,
            workers,
        })
    }

    /// The largest node id the node field holds.
    pub fn max_node_id(&self) -> u64 {
        self.layout.field(&self.node_field).map_or(0, |f| f.max())
    }
}

/// The TLS files and credentials for etcd, checked: https endpoints need a
/// CA, a client certificate comes with its key, files exist and parse, a
/// user comes with one password.
fn etcd_security(
    args: &ServeArgs,
    file: &FileEtcd,
    endpoints: &[String],
) -> anyhow::Result<(Option<EtcdTls>, Option<EtcdAuth>)> {
    let ca_file = args.etcd_ca.clone().or(file.ca_file.clone());
    let cert_file = args.etcd_cert.clone().or(file.cert_file.clone());
    let key_file = args.etcd_key.clone().or(file.key_file.clone());
    let https = endpoints.iter().any(|e| e.starts_with("https://"));
    let tls = match (ca_file, cert_file, key_file) {
        (None, None, None) if https => {
            bail!(
                "https:// etcd endpoints need the CA that signed etcd's certificates: --etcd-ca FILE"
            )
        }
        (None, None, None) => None,
        (_, _, _) if !https => {
            bail!(
                "--etcd-ca, --etcd-cert and --etcd-key apply to https:// etcd endpoints; none is https://"
            )
        }
        (None, _, _) => bail!(
            "--etcd-cert and --etcd-key need --etcd-ca (the CA that signed etcd's certificates)"
        ),
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
        (Some(_), _, _) => bail!("--etcd-cert and --etcd-key come together (mutual TLS)"),
    };
    if let Some(tls) = &tls {
        tls.load().context("etcd TLS")?;
    }
    let password = match (
        &args.etcd_password_file,
        &file.password_file,
        &file.password,
    ) {
        (Some(path), _, _) | (None, Some(path), None) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the etcd password file {}", path.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
        ),
        (None, None, Some(password)) => Some(password.clone()),
        (None, Some(_), Some(_)) => bail!("[etcd] give password_file or password, not both"),
        (None, None, None) => None,
    };
    let auth = match (args.etcd_user.clone().or(file.user.clone()), password) {
        (Some(user), Some(password)) => {
            if user.is_empty() || password.is_empty() {
                bail!("the etcd user and password must not be empty");
            }
            Some(EtcdAuth { user, password })
        }
        (None, None) => None,
        (Some(_), None) => bail!("--etcd-user needs a password: --etcd-password-file FILE"),
        (None, Some(_)) => bail!("an etcd password needs its user: --etcd-user NAME"),
    };
    Ok((tls, auth))
}

/// The longest clock rollback `wait:` may wait out: each request that meets
/// the rollback is held that long (on a timer, not a thread), and clients
/// and load balancers give up on a request long before minutes.
pub const MAX_ROLLBACK_WAIT: Duration = Duration::from_secs(5);

/// `error`, `wait:DURATION` (at most [`MAX_ROLLBACK_WAIT`]) or `continue:DURATION`.
pub fn parse_rollback(text: &str) -> anyhow::Result<RollbackPolicy> {
    let (name, arg) = text.split_once(':').unwrap_or((text, ""));
    let max = || {
        humantime::parse_duration(arg.trim())
            .with_context(|| format!("rollback {text:?}: write {name}:DURATION, e.g. {name}:5s"))
    };
    Ok(match name.trim() {
        "error" if arg.is_empty() => RollbackPolicy::Error,
        "wait" => {
            let max = max()?;
            if max > MAX_ROLLBACK_WAIT {
                bail!(
                    "rollback {text:?}: a request waits at most {MAX_ROLLBACK_WAIT:?} for the clock; use continue:DURATION or error for longer steps"
                );
            }
            RollbackPolicy::Wait { max }
        }
        "continue" => RollbackPolicy::Continue { max: max()? },
        _ => bail!("rollback {text:?}: use error, wait:DURATION or continue:DURATION"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: ServeArgs, toml: &str) -> anyhow::Result<Config> {
        Config::from_toml(&args, toml)
    }

    #[test]
    fn embedded_default() {
        let c = load(ServeArgs::default(), "").unwrap();
        assert_eq!(c.http.to_string(), "127.0.0.1:8080");
        assert_eq!(c.layout.name(), "snowflake");
        assert_eq!(c.node, NodeSource::Static(0));
        assert_eq!(c.node_field, "node");
        assert_eq!(c.shard_field, None);
        assert_eq!(c.rollback, RollbackPolicy::Error);
    }

    #[test]
    fn flags_override_the_file() {
        let args = ServeArgs {
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
    fn etcd_section() {
        let c = load(
            ServeArgs::default(),
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
    fn clear_errors() {
        let err = |args: ServeArgs, toml: &str| format!("{:#}", load(args, toml).unwrap_err());
        assert!(err(ServeArgs::default(), "node_id = 1024").contains("does not fit"));
        assert!(err(ServeArgs::default(), "layout = \"twitter\"").contains("--field"));
        assert!(err(ServeArgs::default(), "nope = 1").contains("unknown field"));
        assert!(err(ServeArgs::default(), "max_batch = 0").contains("max_batch"));
        assert!(err(ServeArgs::default(), "rollback = \"sometimes\"").contains("rollback"));
        let etcd = ServeArgs {
            etcd: vec!["http://127.0.0.1:1".into()],
            node_id: Some(1),
            ..Default::default()
        };
        assert!(err(etcd, "").contains("not both"));
        let ttl = ServeArgs {
            etcd: vec!["http://127.0.0.1:1".into()],
            lease_ttl: Some(Duration::from_millis(1500)),
            ..Default::default()
        };
        assert!(err(ttl, "").contains("TTL"));
        assert!(err(ServeArgs::default(), "borrow = \"3s\"").contains("below the window"));
        assert!(
            err(ServeArgs::default(), "rollback = \"continue:5s\"").contains("below the window")
        );
        // Each below the window, but the generator adds them.
        let both = "borrow = \"2s\"\nrollback = \"continue:2s\"";
        assert!(err(ServeArgs::default(), both).contains("plus rollback continue"));
        assert!(
            load(
                ServeArgs::default(),
                "borrow = \"1s\"\nrollback = \"continue:1s\""
            )
            .is_ok()
        );
        // A request may not be held for half a minute.
        assert!(err(ServeArgs::default(), "rollback = \"wait:30s\"").contains("at most 5s"));
        assert!(load(ServeArgs::default(), "rollback = \"wait:5s\"").is_ok());
        let slow = ServeArgs {
            etcd: vec!["http://127.0.0.1:1".into()],
            etcd_timeout: Some(Duration::from_secs(1)),
            window: Some(Duration::from_secs(2)),
            ..Default::default()
        };
        assert!(err(slow, "").contains("3 times the etcd timeout"));
    }

    #[test]
    fn etcd_tls_and_auth_settings() {
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
        let https = || ServeArgs {
            etcd: vec!["https://127.0.0.1:2379".into()],
            ..Default::default()
        };
        let err = |args: ServeArgs, toml: &str| format!("{:#}", load(args, toml).unwrap_err());

        assert!(err(https(), "").contains("--etcd-ca"));
        let only_cert = ServeArgs {
            etcd_ca: Some(ca.clone()),
            etcd_cert: Some(ca.clone()),
            ..https()
        };
        assert!(err(only_cert, "").contains("come together"));
        let missing = ServeArgs {
            etcd_ca: Some(dir.path().join("nope.pem")),
            ..https()
        };
        assert!(err(missing, "").contains("nope.pem"));
        // A key is not a certificate: the file must parse as what it is.
        let not_a_cert = ServeArgs {
            etcd_ca: Some(key_file.clone()),
            ..https()
        };
        assert!(err(not_a_cert, "").contains("no PEM certificate"));
        let plain_with_ca = ServeArgs {
            etcd: vec!["http://127.0.0.1:2379".into()],
            etcd_ca: Some(ca.clone()),
            ..Default::default()
        };
        assert!(err(plain_with_ca, "").contains("none is https://"));
        let user_only = ServeArgs {
            etcd_user: Some("app".into()),
            etcd_ca: Some(ca.clone()),
            ..https()
        };
        assert!(err(user_only, "").contains("needs a password"));

        // Flags, and the same from the file; the password file's newline is dropped.
        let full = ServeArgs {
            etcd_ca: Some(ca.clone()),
            etcd_cert: Some(ca.clone()),
            etcd_key: Some(key_file.clone()),
            etcd_user: Some("app".into()),
            etcd_password_file: Some(pw.clone()),
            ..https()
        };
        let NodeSource::Etcd(e) = load(full, "").unwrap().node else {
            panic!()
        };
        let tls = e.tls.unwrap();
        assert_eq!(tls.ca_file, ca);
        assert_eq!(tls.client_cert.unwrap().key_file, key_file);
        let auth = e.auth.unwrap();
        assert_eq!(
            (auth.user.as_str(), auth.password.as_str()),
            ("app", "s3cret")
        );
        assert!(!format!("{auth:?}").contains("s3cret"));
        let toml = format!(
            "[etcd]\nendpoints = [\"https://127.0.0.1:2379\"]\nca_file = {ca:?}\nuser = \"app\"\npassword = \"pw\""
        );
        let NodeSource::Etcd(e) = load(ServeArgs::default(), &toml).unwrap().node else {
            panic!()
        };
        assert!(e.tls.unwrap().client_cert.is_none());
        assert_eq!(e.auth.unwrap().password, "pw");
    }

    #[test]
    fn shard_layouts() {
        let spec = "orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)";
        let c = load(
            ServeArgs {
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
            ServeArgs {
                layout: Some(spec.into()),
                fields: vec!["shard=5".into()],
                ..Default::default()
            },
            "",
        )
        .unwrap_err();
        assert!(format!("{fixed_shard:#}").contains("per request from the key"));
        let twitter = load(
            ServeArgs {
                layout: Some("twitter".into()),
                node_field: Some("worker".into()),
                fields: vec!["datacenter=3".into()],
                ..Default::default()
            },
            "",
        )
        .unwrap();
        assert_eq!(twitter.fixed_fields, vec![("datacenter".into(), 3)]);
    }
}
