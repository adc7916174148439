//! `shardflake serve`: the id service; all of it lives in `shardflake-service`.
//! Here are its flags (each also read from `SHARDFLAKE_<NAME>` by clap),
//! which become the top layer of the service's raw options, over the
//! `--config` file.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use shardflake_service::config::{RawConfig, RawEtcd};

/// Serve ids over HTTP and gRPC. With no flags: HTTP on 127.0.0.1:8080,
/// gRPC on 127.0.0.1:50051, layout snowflake, node id 0, high-water in
/// ./shardflake.state. With --etcd: node ids leased from etcd and fenced.
#[derive(Debug, clap::Args)]
pub struct Args {
    // Boxed: the largest of the subcommands' flags by far.
    #[command(flatten)]
    serve: Box<ServeArgs>,
}

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
        value_delimiter = ',',
        value_parser = parse_field
    )]
    pub fields: Vec<(String, u64)>,
    /// Lease node ids from etcd: comma-separated endpoints (http://host:port
    /// or https://host:port).
    #[arg(long, env = "SHARDFLAKE_ETCD", value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Key prefix of this id cluster in etcd [default: /shardflake/default].
    #[arg(long, env = "SHARDFLAKE_ETCD_PREFIX")]
    pub etcd_prefix: Option<String>,
    /// Changing the layout: the prefix of the fleet this one replaces (same
    /// etcd). Its nodes must all be stopped; the first take checks that this
    /// layout's ids are above every id it made, and retires it.
    #[arg(long, env = "SHARDFLAKE_PREVIOUS_PREFIX")]
    pub previous_prefix: Option<String>,
    /// The fleet id this node belongs to (`etcdctl get <prefix>/fleet`):
    /// it takes a node id only where etcd holds it, so a node given
    /// another cluster's endpoints or another prefix is refused. Not for a
    /// fleet's first node, which mints the id.
    #[arg(long, env = "SHARDFLAKE_FLEET")]
    pub fleet: Option<String>,
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
    /// Warn at start when the layout has less than this left before its
    /// end or its first negative id [default: 365d].
    #[arg(long, env = "SHARDFLAKE_LIFETIME_WARNING", value_parser = humantime::parse_duration)]
    pub lifetime_warning: Option<Duration>,
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
    /// A static node without a state file resumes after this time: `now`
    /// for its first start, else a time after every id it issued (Unix ms
    /// or RFC 3339). Without it such a node refuses to start; so does one
    /// whose state file does not name its own path (moved, or written by
    /// hand), which this takes as its own.
    #[arg(long, env = "SHARDFLAKE_RESUME_AFTER")]
    pub resume_after: Option<String>,
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
    /// Serve HTTPS and gRPC over TLS with this PEM certificate chain (with --tls-key).
    #[arg(
        long = "tls-cert",
        env = "SHARDFLAKE_TLS_CERT",
        requires = "tls_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(
        long = "tls-key",
        env = "SHARDFLAKE_TLS_KEY",
        requires = "tls_cert_file"
    )]
    pub tls_key_file: Option<PathBuf>,
    /// Require `Authorization: Bearer <token>` on the id, decode and info
    /// calls (HTTP and gRPC), the token read from this file; health,
    /// readiness and metrics stay open.
    #[arg(long, env = "SHARDFLAKE_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// Also serve the ticket sequences of this TOML file (the format of
    /// `shardflake tickets`) at `GET /v1/tickets/{sequence}?count=N` and
    /// gRPC `NextTickets`; with --etcd, high-water marks go to etcd too.
    #[arg(long, env = "SHARDFLAKE_TICKETS")]
    pub tickets: Option<PathBuf>,
}

/// `NAME=VALUE` of `--field`.
fn parse_field(text: &str) -> Result<(String, u64), String> {
    let (name, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: write NAME=VALUE"))?;
    let value = value
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: value is not a number"))?;
    Ok((name.trim().to_string(), value))
}

impl From<ServeArgs> for RawConfig {
    /// The flags (and environment) as one layer of raw options: what was
    /// not given stays unset, so the file below shows through.
    fn from(a: ServeArgs) -> RawConfig {
        let some_if = |v: Vec<String>| (!v.is_empty()).then_some(v);
        let fields =
            (!a.fields.is_empty()).then(|| a.fields.into_iter().collect::<BTreeMap<_, _>>());
        RawConfig {
            http: a.http,
            grpc: a.grpc,
            layout: a.layout,
            node_field: a.node_field,
            node_id: a.node_id,
            node_id_from: a.node_id_from,
            fields,
            state_file: a.state_file,
            resume_after: a.resume_after,
            window: a.window,
            max_resume_wait: a.max_resume_wait,
            max_batch: a.max_batch,
            lifetime_warning: a.lifetime_warning,
            max_body: a.max_body,
            rollback: a.rollback,
            borrow: a.borrow,
            shards: a.shards,
            workers: a.workers,
            tls_cert_file: a.tls_cert_file,
            tls_key_file: a.tls_key_file,
            api_token_file: a.api_token_file,
            tickets: a.tickets,
            etcd: RawEtcd {
                endpoints: some_if(a.etcd),
                prefix: a.etcd_prefix,
                previous_prefix: a.previous_prefix,
                fleet: a.fleet,
                lease_ttl: a.lease_ttl,
                safety_margin: a.safety_margin,
                timeout: a.etcd_timeout,
                ca_file: a.etcd_ca,
                cert_file: a.etcd_cert,
                key_file: a.etcd_key,
                user: a.etcd_user,
                password_file: a.etcd_password_file,
                password: None,
            },
        }
    }
}

/// Variables named like ours that no option reads, yet set by the
/// project's own scripts for their tools (not for `serve`).
const SCRIPT_VARIABLES: &[&str] = &["SHARDFLAKE_BIN"];

/// `SHARDFLAKE_*` variables in `vars` that no option of `cli` reads: a
/// misspelled one (`SHARDFLAKE_NODEID`) would silently leave its default
/// (static node 0), so start is refused with their names.
fn unknown_variables(
    cli: &clap::Command,
    vars: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<String> {
    fn known(cmd: &clap::Command, into: &mut Vec<String>) {
        into.extend(
            cmd.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned()),
        );
        for sub in cmd.get_subcommands() {
            known(sub, into);
        }
    }
    let mut names = Vec::new();
    known(cli, &mut names);
    let mut unknown: Vec<String> = vars
        .filter_map(|v| v.into_string().ok())
        .filter(|v| v.starts_with("SHARDFLAKE_"))
        .filter(|v| !names.contains(v) && !SCRIPT_VARIABLES.contains(&v.as_str()))
        .collect();
    unknown.sort();
    unknown
}

pub fn run(args: Args, cli: &clap::Command) -> anyhow::Result<()> {
    let unknown = unknown_variables(cli, std::env::vars_os().map(|(k, _)| k));
    if !unknown.is_empty() {
        anyhow::bail!(
            "unknown environment variable(s) {}: no option reads them (misspelled?); see `shardflake serve --help` for the SHARDFLAKE_* names, and unset or rename them",
            unknown.join(", ")
        );
    }
    let file = match &args.serve.config {
        Some(path) => RawConfig::from_file(path)?,
        None => RawConfig::default(),
    };
    shardflake_service::run_blocking(file.merge((*args.serve).into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    fn flags(args: &[&str]) -> RawConfig {
        let cli =
            Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).unwrap();
        cli.serve.into()
    }

    #[test]
    fn flags_become_one_raw_layer() {
        let raw = flags(&[
            "--node-id",
            "4",
            "--field",
            "datacenter=1",
            "--field",
            "region=2",
            "--etcd-prefix",
            "/p",
            "--window",
            "2s",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--api-token-file",
            "token",
            "--tickets",
            "tickets.toml",
        ]);
        assert_eq!(raw.node_id, Some(4));
        let fields = BTreeMap::from([("datacenter".into(), 1), ("region".into(), 2)]);
        assert_eq!(raw.fields, Some(fields));
        assert_eq!(raw.window, Some(Duration::from_secs(2)));
        assert_eq!(raw.etcd.prefix.as_deref(), Some("/p"));
        // No --etcd: the file's endpoints, if any, stay.
        assert_eq!(raw.etcd.endpoints, None);
        assert_eq!(raw.tls_cert_file, Some(PathBuf::from("c.pem")));
        assert_eq!(raw.tls_key_file, Some(PathBuf::from("k.pem")));
        assert_eq!(raw.api_token_file, Some(PathBuf::from("token")));
        assert_eq!(raw.tickets, Some(PathBuf::from("tickets.toml")));
        // Nothing given, nothing set: every file option shows through.
        let file =
            RawConfig::from_toml("max_batch = 7\n[etcd]\nendpoints = [\"http://e:1\"]").unwrap();
        let none = flags(&[]);
        assert_eq!(file.clone().merge(none), file);
    }

    #[test]
    fn unknown_variables_are_named() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let vars = [
            "SHARDFLAKE_ETCD_PREFIX",
            "SHARDFLAKE_NODEID",
            "SHARDFLAKE_ETCD_ENDPOINTS",
            "SHARDFLAKE_BIN",
            "PATH",
        ];
        let unknown = unknown_variables(&cli, vars.iter().map(Into::into));
        assert_eq!(unknown, ["SHARDFLAKE_ETCD_ENDPOINTS", "SHARDFLAKE_NODEID"]);
    }

    #[test]
    fn flag_errors_say_what_to_write() {
        let err = |args: &[&str]| {
            let argv = std::iter::once("serve").chain(args.iter().copied());
            Cli::try_parse_from(argv).unwrap_err().to_string()
        };
        assert!(err(&["--field", "datacenter"]).contains("write NAME=VALUE"));
        assert!(err(&["--field", "datacenter=x"]).contains("value is not a number"));
        assert!(err(&["--tls-cert", "c.pem"]).contains("--tls-key"));
        assert!(err(&["--node-id", "1", "--node-id-from", "ip"]).contains("cannot be used"));
    }
}
