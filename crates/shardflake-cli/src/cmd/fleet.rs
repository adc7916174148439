//! `shardflake fleet move`: a stopped fleet of leased nodes carried to
//! another prefix or etcd cluster with its records (the work is
//! `shardflake_service::registry::move_fleet`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use shardflake_service::config::{EtcdConfig, NodeSource, RawEtcd};
use shardflake_service::{Config, RawConfig};

/// A fleet of leased nodes (etcd): move it to another place.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Carry a stopped fleet's records (fleet id, layout, every id's
    /// high-water, raised) to another prefix or etcd cluster, and retire
    /// the old place; then start its nodes there with their state files.
    #[command(after_help = "Example:
  shardflake fleet move --etcd http://old:2379 --etcd-prefix /shardflake/prod \\
      --to-etcd http://new:2379 --to-prefix /shardflake/prod")]
    Move(MoveArgs),
}

#[derive(Debug, clap::Args)]
struct MoveArgs {
    /// The etcd endpoints the fleet is in now (comma-separated).
    #[arg(long, required = true, value_delimiter = ',')]
    etcd: Vec<String>,
    /// The fleet's prefix there.
    #[arg(long)]
    etcd_prefix: String,
    /// The etcd endpoints to move it to [default: --etcd].
    #[arg(long, value_delimiter = ',')]
    to_etcd: Vec<String>,
    /// The prefix to move it to [default: --etcd-prefix].
    #[arg(long)]
    to_prefix: Option<String>,
    /// How far past each recorded high-water, and past this host's clock,
    /// the carried high-waters go; the fleet's first takes there wait it
    /// out [default: 5s].
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    raise: Duration,
    /// CA certificate (PEM) for https:// endpoints (both places).
    #[arg(long)]
    etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's mutual TLS (both places).
    #[arg(long)]
    etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(long)]
    etcd_key: Option<PathBuf>,
    /// etcd user (both places), with --etcd-password-file.
    #[arg(long)]
    etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(long)]
    etcd_password_file: Option<PathBuf>,
}

impl MoveArgs {
    /// The etcd settings of one place, checked as `serve` checks them.
    fn place(&self, endpoints: &[String], prefix: &str) -> anyhow::Result<EtcdConfig> {
        let raw = RawConfig {
            etcd: RawEtcd {
                endpoints: Some(endpoints.to_vec()),
                prefix: Some(prefix.to_string()),
                ca_file: self.etcd_ca.clone(),
                cert_file: self.etcd_cert.clone(),
                key_file: self.etcd_key.clone(),
                user: self.etcd_user.clone(),
                password_file: self.etcd_password_file.clone(),
                ..RawEtcd::default()
            },
            ..RawConfig::default()
        };
        match Config::load(raw)?.node {
            NodeSource::Etcd(cfg) => Ok(cfg),
            NodeSource::Static(_) => bail!("no etcd endpoints"),
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Command::Move(a) = args.command;
    let from = a.place(&a.etcd, &a.etcd_prefix)?;
    let to_etcd = if a.to_etcd.is_empty() {
        &a.etcd
    } else {
        &a.to_etcd
    };
    let to = a.place(to_etcd, a.to_prefix.as_deref().unwrap_or(&a.etcd_prefix))?;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .context("this host's clock is before 1970")?
        .as_millis() as u64;
    let raise_ms = a.raise.as_millis() as u64;
    let moved = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(shardflake_service::registry::move_fleet(
            &from, &to, now_ms, raise_ms,
        ))?;
    let what = if moved.already {
        "was already there"
    } else {
        "moved"
    };
    println!(
        "fleet {} {what}: {} -> {} (layout {:?}; {} high-waters; its nodes resume past {})",
        moved.fleet,
        from.prefix,
        to.prefix,
        moved.layout,
        moved.high_waters,
        shardflake::timestamp::rfc3339_ms(moved.floor_ms),
    );
    println!(
        "start its nodes with --etcd {} --etcd-prefix {} (their state files as they are); nodes started under {} are refused",
        to.endpoints.join(","),
        to.prefix,
        from.prefix
    );
    Ok(())
}
