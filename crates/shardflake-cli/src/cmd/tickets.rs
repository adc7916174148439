//! `shardflake tickets ...`: Flickr-style ticket servers and segment
//! allocation (the work is in the `shardflake-tickets` crate; this only
//! parses and prints).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use shardflake_tickets::{Config, TicketClient, admin, bench};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: TicketsCommand,
}

#[derive(Debug, Clone, clap::Args)]
struct ConfigArg {
    /// The TOML file naming the servers, their offsets and the sequences.
    #[arg(long, default_value = "tickets.toml", env = "SHARDFLAKE_TICKETS")]
    config: PathBuf,
}

impl ConfigArg {
    fn load(&self) -> anyhow::Result<Config> {
        Config::load(&self.config).with_context(|| format!("reading {}", self.config.display()))
    }
}

#[derive(Debug, Subcommand)]
enum TicketsCommand {
    /// Create the ticket tables or sequences, segment rows and high-water
    /// table on every server (idempotent).
    Init {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Report each server's increment and offset (global, per session,
    /// per sequence) and high-water; fail on any problem.
    Check {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Raise every counter that is behind its high-water past it.
    Repair {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// Print ids of a sequence, one per line.
    Next {
        #[command(flatten)]
        config: ConfigArg,
        /// The sequence.
        sequence: String,
        /// How many.
        #[arg(long, short = 'n', default_value_t = 1)]
        count: usize,
    },
    /// Measure a sequence through the client (and, with --bare, a bare loop
    /// on the same servers for comparison).
    Bench {
        #[command(flatten)]
        config: ConfigArg,
        /// The sequence.
        sequence: String,
        /// Concurrent callers.
        #[arg(long, default_value_t = 8)]
        tasks: usize,
        /// Ids per call (next_n).
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Also run the bare REPLACE INTO / nextval loop, and print the ratio.
        #[arg(long)]
        bare: bool,
    },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(run_async(args))
}

async fn run_async(args: Args) -> anyhow::Result<()> {
    match args.command {
        TicketsCommand::Init { config } => {
            let config = config.load()?;
            let mut failed = 0;
            for s in admin::init(&config).await {
                match s.result {
                    Ok(lines) => {
                        println!("server {}: ok", s.server);
                        for l in lines {
                            println!("  {l}");
                        }
                    }
                    Err(e) => {
                        failed += 1;
                        println!("server {}: FAILED: {e}", s.server);
                    }
                }
            }
            if failed > 0 {
                bail!("init failed on {failed} server(s)");
            }
        }
        TicketsCommand::Check { config } => {
            let report = admin::check(&config.load()?).await;
            print!("{report}");
            if !report.ok() {
                bail!("check found {} problem(s)", report.problems.len());
            }
        }
        TicketsCommand::Repair { config } => {
            let done = admin::repair(&config.load()?).await?;
            if done.is_empty() {
                println!("no counter is behind its high-water");
            }
            for r in done {
                println!(
                    "server {} sequence {}: counter {} raised past high-water {}",
                    r.server, r.sequence, r.counter, r.high_water
                );
            }
        }
        TicketsCommand::Next {
            config,
            sequence,
            count,
        } => {
            let client = TicketClient::connect(config.load()?).await?;
            let ids = client.next_n(&sequence, count).await?;
            client.shutdown().await;
            super::with_stdout(|out| {
                for id in ids {
                    writeln!(out, "{id}")?;
                }
                Ok(())
            })?;
        }
        TicketsCommand::Bench {
            config,
            sequence,
            tasks,
            batch,
            seconds,
            bare,
        } => {
            let config = config.load()?;
            let duration = Duration::from_secs_f64(seconds);
            let client = TicketClient::connect(config.clone()).await?;
            let report = bench::bench_client(&client, &sequence, tasks, batch, duration).await?;
            let shutdown = client.shutdown().await;
            println!(
                "client {sequence}: {} ids in {:.2} s = {:.0} ids/s; {} errors over {:.0} ms; tasks {tasks}, batch {batch}",
                report.ids,
                report.elapsed.as_secs_f64(),
                report.rate(),
                report.errors,
                report.error_window.as_secs_f64() * 1000.0
            );
            for m in client.metrics() {
                println!(
                    "  server {} ({}): {}, {} calls, mean {:.0} us, max {} us, {} failovers, {} skipped ids{}",
                    m.name,
                    m.kind,
                    m.state,
                    m.calls,
                    m.latency_mean_us,
                    m.latency_max_us,
                    m.failovers,
                    m.skipped_ids,
                    m.reason.map(|r| format!(" ({r})")).unwrap_or_default()
                );
            }
            println!(
                "  shutdown: {} ids given back, {} skipped",
                shutdown.returned_ids, shutdown.skipped_ids
            );
            if bare {
                let b = bench::bench_bare(&config, &sequence, tasks, duration).await?;
                println!(
                    "bare loop {sequence}: {} ids in {:.2} s = {:.0} ids/s; {} errors; client/bare = {:.2}",
                    b.ids,
                    b.elapsed.as_secs_f64(),
                    b.rate(),
                    b.errors,
                    report.rate() / b.rate().max(1e-9)
                );
            }
        }
    }
    Ok(())
}
