//! The second stage: [`RawConfig`] to [`Config`], defaults filled in and
//! every rule checked once. Pure: the host's facts come as an argument.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::etcd::{ClientCert, EtcdTls};
use shardflake::node::NodeIdSource;
use shardflake::{FieldKind, RollbackPolicy, preset};
use shardflake_host::HostInfo;

use super::{
    Config, ConfigError, DEFAULT_ETCD_PREFIX, EtcdConfig, EtcdLogin, MAX_BATCH_LIMIT,
    MAX_ROLLBACK_WAIT, NodeSource, RawConfig, RawEtcd, ResumeAfter, Secret, TlsFiles,
};

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
                (e.previous_prefix.is_some(), "previous etcd prefix"),
                (e.fleet.is_some(), "fleet id"),
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
                let source = NodeIdSource::host(from)
                    .ok_or_else(|| ConfigError::NodeIdFrom(from.to_string()))?;
                let origin = source.name();
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
            resume_after: raw
                .resume_after
                .as_deref()
                .map(parse_resume_after)
                .transpose()?,
            window,
            max_resume_wait,
            max_batch,
            lifetime_warning: raw.lifetime_warning.unwrap_or(crate::LIFETIME_WARNING),
            max_body,
            rollback,
            borrow,
            workers,
            tls,
            api_token_file: raw.api_token_file,
            tickets: raw.tickets,
        })
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
    let prefix = raw.prefix.unwrap_or_else(|| DEFAULT_ETCD_PREFIX.into());
    let prefix = prefix.trim_end_matches('/').to_string();
    if prefix.is_empty() {
        return Err(ConfigError::EtcdPrefix);
    }
    // etcd keys are bytes: `a/b` and `/a/b` are two namespaces, and a
    // fleet split over both hands out its ids twice.
    if !prefix.starts_with('/') {
        return Err(ConfigError::EtcdPrefixSlash(prefix));
    }
    let previous_prefix = match raw.previous_prefix {
        None => None,
        Some(p) => {
            let p = p.trim_end_matches('/').to_string();
            if p.is_empty() {
                return Err(ConfigError::EtcdPrefix);
            }
            if !p.starts_with('/') {
                return Err(ConfigError::EtcdPrefixSlash(p));
            }
            if p == prefix {
                return Err(ConfigError::PreviousPrefixSame(p));
            }
            Some(p)
        }
    };
    // A fleet id as its first node mints it: 32 hex digits.
    let fleet = match raw.fleet {
        Some(f) => match fleet_id_problem(&f) {
            None => Some(f.to_ascii_lowercase()),
            Some(why) => return Err(ConfigError::FleetId { given: f, why }),
        },
        None => None,
    };
    Ok(EtcdConfig {
        endpoints,
        pinned_node_id: None,
        prefix,
        previous_prefix,
        fleet,
        lease_ttl,
        safety_margin,
        timeout,
        tls,
        login,
    })
}

/// `now`, Unix ms or RFC 3339.
fn parse_resume_after(text: &str) -> Result<ResumeAfter, ConfigError> {
    match text.trim() {
        "now" => Ok(ResumeAfter::Now),
        t => shardflake::timestamp::parse_unix_ms(t)
            .map(ResumeAfter::UnixMs)
            .ok_or_else(|| ConfigError::ResumeAfter(text.to_string())),
    }
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

/// What keeps `given` from being a fleet id (32 hex digits), in words
/// that point at the mistake; `None`: it is one.
fn fleet_id_problem(given: &str) -> Option<String> {
    let chars = given.chars().count();
    if given.is_empty() {
        return Some("it is empty".into());
    }
    if given.starts_with('/') {
        return Some("it looks like an etcd prefix, which is --etcd-prefix".into());
    }
    if let Some((at, c)) = given
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_hexdigit())
    {
        return Some(format!(
            "character {} ({c:?}) is not a hex digit (0-9, a-f)",
            at + 1
        ));
    }
    (chars != 32).then(|| format!("it has {chars} hex digits, not 32 (cut or pasted twice?)"))
}
