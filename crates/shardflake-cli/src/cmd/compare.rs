//! `shardflake compare`: what each id scheme costs on your own PostgreSQL
//! and MariaDB (the work is in `shardflake_compare`; this parses, draws the
//! progress bar, stops on Ctrl-C and prints).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use shardflake_compare::{Options, Progress, Report, Scheme, ServerKind};

use super::with_stdout;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// PostgreSQL URL, e.g. postgres://postgres@127.0.0.1:5432/app (the
    /// sandbox schema is made in that database).
    #[arg(long, env = "SHARDFLAKE_COMPARE_PG")]
    pg: Option<String>,
    /// MariaDB/MySQL URL, e.g. mysql://root@127.0.0.1:3306 (the sandbox is
    /// a database of its own).
    #[arg(long, env = "SHARDFLAKE_COMPARE_MYSQL")]
    mysql: Option<String>,
    /// Rows to insert per scheme.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Connections inserting at once.
    #[arg(long, short = 'c', default_value_t = 8)]
    clients: usize,
    /// Rows per INSERT statement (1 to 1000).
    #[arg(long, default_value_t = 100)]
    batch: usize,
    /// Longest insert phase per scheme, in seconds (fewer rows if it runs out).
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Longest wait for any one statement (e.g. 30s, 2m).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Name of the sandbox schema (PostgreSQL) or database (MariaDB); one
    /// of that name not made by compare is refused.
    #[arg(long, default_value = "shardflake_compare")]
    schema: String,
    /// Only these schemes (comma-separated; the server's own counter always
    /// runs): bigserial, next_id, auto_increment, trigger, procedure,
    /// seed_procedure, snowflake, server_uuid, uuid_v4, uuid_v7, objectid,
    /// tickets, segment.
    #[arg(long, value_delimiter = ',', value_parser = parse_scheme)]
    only: Vec<Scheme>,
    /// Ids per block of the segment scheme.
    #[arg(long, default_value_t = 1000)]
    segment_step: u64,
    /// Output: an aligned table, Markdown or JSON.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also draw bar charts into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// No progress bar (it is drawn only on a terminal anyway).
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Format {
    Table,
    Markdown,
    Json,
}

fn parse_scheme(s: &str) -> Result<Scheme, String> {
    Scheme::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = Scheme::ALL.iter().map(|s| s.name()).collect();
        format!("unknown scheme {s:?}; one of {}", names.join(", "))
    })
}

/// The progress bar: one bar, reset for each scheme.
struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&self, server: ServerKind, label: &str, rows: u64) {
        self.0.reset();
        self.0.set_length(rows);
        self.0.set_message(format!("{}: {label}", server.name()));
    }
    fn rows(&self, n: u64) {
        self.0.inc(n);
    }
    fn phase(&self, what: &str) {
        self.0.set_message(what.to_string());
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.pg.is_none() && args.mysql.is_none() {
        bail!("name a server to compare on: --pg postgres://... and/or --mysql mysql://...");
    }
    let opts = Options {
        rows: args.rows,
        clients: args.clients,
        batch: args.batch,
        seconds: args.seconds,
        timeout: args.timeout,
        schema: args.schema.clone(),
        only: args.only.clone(),
        segment_step: args.segment_step,
        ..Options::default()
    };
    opts.validate()?;
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{msg:50} [{bar:30}] {pos}/{len}")
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .progress_chars("=> "),
        );
        bar
    };
    let progress: Arc<dyn Progress> = Arc::new(Bar(bar.clone()));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let report = runtime.block_on(async {
        let cancel = opts.cancel.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                cancel.store(true, Ordering::Relaxed);
                tracing::warn!("interrupted: finishing the running batches, then dropping the sandbox (Ctrl-C again quits at once)");
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        });
        let mut servers = Vec::new();
        if let Some(url) = &args.pg {
            servers.push(shardflake_compare::postgres(url, &opts, progress.clone()).await?);
        }
        if let Some(url) = &args.mysql
            && !opts.cancel.load(Ordering::Relaxed)
        {
            servers.push(shardflake_compare::mariadb(url, &opts, progress.clone()).await?);
        }
        anyhow::Ok(Report {
            rows: opts.rows,
            clients: opts.clients,
            batch: opts.batch,
            seconds: opts.seconds,
            servers,
            interrupted: opts.cancel.load(Ordering::Relaxed),
        })
    });
    bar.finish_and_clear();
    let report = report?;
    if let Some(path) = &args.chart {
        shardflake_compare::chart::write_svg(&report, path)?;
    }
    with_stdout(|out| {
        match args.format {
            Format::Table => write!(out, "{}", report.table())?,
            Format::Markdown => write!(out, "{}", report.markdown())?,
            Format::Json => writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?,
        }
        Ok(())
    })?;
    if report.interrupted {
        bail!("interrupted before every scheme ran; the sandbox was dropped");
    }
    if !report.clean() {
        bail!(
            "a scheme failed, repeated ids it should not, or the sandbox was left behind (see above)"
        );
    }
    Ok(())
}
