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
    /// After restoring etcd from a snapshot: say that the place is still
    /// its fleet's (the snapshot is newer than the fleet's last `fleet
    /// move` and layout change), so that nodes without a state file of it
    /// take ids there again.
    #[command(after_help = "Example:
  shardflake fleet confirm --etcd http://etcd:2379 --etcd-prefix /shardflake/prod")]
    Confirm(ConfirmArgs),
}

#[derive(Debug, clap::Args)]
struct ConfirmArgs {
    /// The etcd endpoints (comma-separated).
    #[arg(long, required = true, value_delimiter = ',')]
    etcd: Vec<String>,
    /// The fleet's prefix there.
    #[arg(long)]
    etcd_prefix: String,
    /// CA certificate (PEM) for https:// endpoints.
    #[arg(long)]
    etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's mutual TLS.
    #[arg(long)]
    etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(long)]
    etcd_key: Option<PathBuf>,
    /// etcd user, with --etcd-password-file.
    #[arg(long)]
    etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(long)]
    etcd_password_file: Option<PathBuf>,
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
    /// How far past this host's clock the carried high-waters and the
    /// floor go at least (a record further ahead is carried as it is); the
    /// fleet's first takes there wait it out. At most --window +
    /// --max-resume-wait [default: 5s].
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    raise: Duration,
    /// The fleet's --max-resume-wait: where etcd was restored from a
    /// snapshot, the least --raise (a record the restore rolled back may
    /// be that far short of what its holder stamped). With --window, how
    /// far ahead of this host's clock the new place's floor may go (its
    /// nodes wait at most window + --max-resume-wait).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    max_resume_wait: Duration,
    /// The fleet's --window (see --max-resume-wait).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    window: Duration,
    /// The etcd cluster id (hex) the fleet's records here were copied
    /// from, which the operator says runs the fleet no more, for good: a
    /// copy (a snapshot restored into another cluster) is refused without
    /// it, as the fleet may still run there.
    #[arg(long)]
    copy_of_gone_cluster: Option<String>,
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
        etcd_place(
            endpoints,
            prefix,
            RawEtcd {
                ca_file: self.etcd_ca.clone(),
                cert_file: self.etcd_cert.clone(),
                key_file: self.etcd_key.clone(),
                user: self.etcd_user.clone(),
                password_file: self.etcd_password_file.clone(),
                ..RawEtcd::default()
            },
        )
    }
}

/// The etcd settings of one place (`files`: its TLS and login files),
/// checked as `serve` checks them.
fn etcd_place(endpoints: &[String], prefix: &str, files: RawEtcd) -> anyhow::Result<EtcdConfig> {
    let raw = RawConfig {
        etcd: RawEtcd {
            endpoints: Some(endpoints.to_vec()),
            prefix: Some(prefix.to_string()),
            ..files
        },
        ..RawConfig::default()
    };
    match Config::load(raw)?.node {
        NodeSource::Etcd(cfg) => Ok(cfg),
        NodeSource::Static(_) => bail!("no etcd endpoints"),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn confirm(a: ConfirmArgs) -> anyhow::Result<()> {
    let place = etcd_place(
        &a.etcd,
        &a.etcd_prefix,
        RawEtcd {
            ca_file: a.etcd_ca,
            cert_file: a.etcd_cert,
            key_file: a.etcd_key,
            user: a.etcd_user,
            password_file: a.etcd_password_file,
            ..RawEtcd::default()
        },
    )?;
    let done = runtime()?.block_on(shardflake_service::registry::confirm_place(&place))?;
    if !done.written {
        println!(
            "{}: no fleet records here; nothing to confirm, nothing written (an etcd copied from another cluster and wiped looks the same to every node: start a fleet here only if that cluster runs none of it)",
            place.prefix
        );
        return Ok(());
    }
    let what = match &done.fleet {
        Some(fleet) => format!("fleet {fleet}, generation {}", done.generation),
        None => "no fleet yet".to_string(),
    };
    let seen = if done.restore_seen {
        "etcd shows a restore"
    } else {
        "etcd shows no restore"
    };
    println!(
        "confirmed {} ({what}; {seen}): nodes without a state file of it take ids there again until etcd is restored again",
        place.prefix
    );
    Ok(())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let a = match args.command {
        Command::Move(a) => a,
        Command::Confirm(a) => return confirm(a),
    };
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
    let moved = runtime()?.block_on(shardflake_service::registry::move_fleet(
        &from,
        &to,
        now_ms,
        raise_ms,
        a.max_resume_wait.as_millis() as u64,
        a.window.as_millis() as u64,
        a.copy_of_gone_cluster.as_deref(),
    ))?;
    let what = if moved.already {
        "was already there"
    } else {
        "moved"
    };
    println!(
        "fleet {} {what}: {} -> {} (layout {:?}; {} high-waters; generation {}; its nodes resume past {})",
        moved.fleet,
        from.prefix,
        to.prefix,
        moved.layout,
        moved.high_waters,
        moved.generation,
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
