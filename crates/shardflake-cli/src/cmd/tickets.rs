//! `shardflake tickets ...`: Flickr-style ticket servers and segment
//! allocation (the work is in the `shardflake-tickets` crate; this only
//! parses and prints).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use shardflake_service::{Config as ServeConfig, RawConfig};
use shardflake_tickets::{
    Config, HighWaterStore, MAX_COUNT, Mode, TicketClient, TicketError, admin,
};

mod bench;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    config: ConfigArg,
    #[command(subcommand)]
    command: TicketsCommand,
}

#[derive(Debug, Clone, clap::Args)]
struct ConfigArg {
    /// The TOML file naming the servers, their offsets and the sequences
    /// (before or after the subcommand).
    #[arg(
        long,
        global = true,
        default_value = "tickets.toml",
        env = "SHARDFLAKE_TICKETS"
    )]
    config: PathBuf,
}

impl ConfigArg {
    fn load(&self) -> anyhow::Result<Config> {
        Config::load(&self.config).with_context(|| format!("reading {}", self.config.display()))
    }
}

/// Where the high-water marks are: the stores the tickets file names
/// (`[marks]`: the peers always, etcd when named), as every client of the
/// file uses; for a file that names no etcd, the service's etcd as well
/// when `serve --tickets` leases its node id from etcd. The same variables
/// as `serve`.
#[derive(Debug, Clone, clap::Args)]
struct MarksArg {
    /// The `shardflake serve` configuration file whose `[etcd]` table
    /// (endpoints, prefix, TLS, user) the service uses.
    #[arg(long, env = "SHARDFLAKE_CONFIG")]
    serve_config: Option<PathBuf>,
    /// etcd endpoints of the service, comma-separated (override the file's).
    #[arg(long, env = "SHARDFLAKE_ETCD", value_delimiter = ',')]
    etcd: Vec<String>,
    /// The service's key prefix in etcd [default: /shardflake/default].
    #[arg(long, env = "SHARDFLAKE_ETCD_PREFIX")]
    etcd_prefix: Option<String>,
}

impl MarksArg {
    fn store(&self, config: &Config) -> anyhow::Result<Arc<dyn HighWaterStore>> {
        let file = match &self.serve_config {
            Some(path) => RawConfig::from_file(path)?,
            None => RawConfig::default(),
        };
        let mut flags = RawConfig::default();
        flags.etcd.endpoints = (!self.etcd.is_empty()).then(|| self.etcd.clone());
        flags.etcd.prefix = self.etcd_prefix.clone();
        let serve = ServeConfig::load(file.merge(flags))?;
        Ok(shardflake_service::tickets::admin_high_water_store(
            config,
            &serve.node,
        )?)
    }
}

#[derive(Debug, Subcommand)]
enum TicketsCommand {
    /// Create the ticket tables or sequences, segment rows and high-water
    /// table on every server and record each sequence's lattice and where
    /// the marks are kept (idempotent; a changed lattice or other places
    /// for the marks are refused: see `reshape`).
    Init,
    /// Report each server's increment and offset (global, per session,
    /// per sequence) and high-water; fail on any problem. Warn of a
    /// counter that reaches its column's end within the lifetime warning
    /// at the rate it moved while check watched it.
    Check {
        #[command(flatten)]
        marks: MarksArg,
        /// How long to watch the counters for their rate (read again after
        /// it, when every server answered; 0s: not at all, no lifetime
        /// warning).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        rate_window: Duration,
        /// Warn of a counter that runs out sooner than this [default: 365d,
        /// or SHARDFLAKE_LIFETIME_WARNING].
        #[arg(long, value_parser = humantime::parse_duration)]
        lifetime_warning: Option<Duration>,
    },
    /// Raise every counter that is behind its high-water past it (marks
    /// are written ahead of every id: past everything any client could
    /// have reserved).
    Repair {
        #[command(flatten)]
        marks: MarksArg,
    },
    /// Make SERVER the holder of its residue class again (after the server
    /// that took it over was retired), then raise it past the class's
    /// marks. The identity that held the class is refused from then on.
    Takeover {
        /// The server, as the file names it.
        #[arg(long)]
        server: String,
        #[command(flatten)]
        marks: MarksArg,
    },
    /// Move the sequences whose recorded increment, offsets or chunk differ
    /// from this file to the file's, and the marks to the places its
    /// `[marks]` names where the servers record others: the servers first
    /// refuse every client still on the old file (at its next call), then
    /// every server of the file is raised past every mark and counter it
    /// holds, then the new lattice and places recorded. Restart the old
    /// clients with this file; every server must answer.
    Reshape {
        #[command(flatten)]
        marks: MarksArg,
    },
    /// Print ids of a sequence, one per line.
    Next {
        /// The sequence.
        sequence: String,
        /// How many: 1 to 100,000 (a per-id sequence is asked 1,000 at a time).
        #[arg(long, short = 'n', default_value_t = 1)]
        count: usize,
    },
    /// Measure a sequence through the client (and, with --bare, a bare loop
    /// on the same servers for comparison).
    Bench {
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
        /// Also run the bare loop (MariaDB: the counter row's UPDATE; PostgreSQL:
        /// nextval or the table's upsert), and print the ratio.
        #[arg(long)]
        bare: bool,
        /// Rounds; with --bare, every other round runs the bare loop first
        /// and the median ratio is printed (the second of two loops tends to
        /// run slower on a busy machine).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
        rounds: u32,
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
    let config = args.config;
    match args.command {
        TicketsCommand::Init => {
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
        TicketsCommand::Check {
            marks,
            rate_window,
            lifetime_warning,
        } => {
            let config = config.load()?;
            let threshold = match lifetime_warning {
                Some(d) => d,
                None => super::lifetime_warning()?,
            };
            let store = marks.store(&config)?;
            let report = admin::check_with_store(&config, &*store).await;
            print!("{report}");
            // Not where a server did not answer: the second read would
            // wait its timeout again.
            let answered = report.servers.iter().all(|c| c.settings.is_ok());
            if answered && !rate_window.is_zero() {
                let read = std::time::Instant::now();
                tokio::time::sleep(rate_window).await;
                let later = admin::check_with_store(&config, &*store).await;
                let now_ms = shardflake::Clock::now_ms(&shardflake::SystemClock);
                for end in counter_ends(&config, &report, &later, read.elapsed()) {
                    end.warn_within(threshold, now_ms);
                }
            }
            if !report.ok() {
                bail!("check found {} problem(s)", report.problems.len());
            }
        }
        TicketsCommand::Reshape { marks } => {
            let config = config.load()?;
            let store = marks.store(&config)?;
            let done = admin::reshape(&config, &*store).await?;
            if done.is_empty() {
                println!("every sequence already has the file's lattice");
            }
            for r in done {
                println!(
                    "sequence {}: every server raised past {} and the file's lattice recorded",
                    r.sequence, r.past
                );
            }
        }
        TicketsCommand::Repair { marks } => {
            let config = config.load()?;
            let store = marks.store(&config)?;
            let done = admin::repair_with_store(&config, &*store).await?;
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
        TicketsCommand::Takeover { server, marks } => {
            let config = config.load()?;
            let store = marks.store(&config)?;
            let done = admin::takeover(&config, &*store, &server).await?;
            println!("server {server} holds its residue class");
            for r in done {
                println!(
                    "server {} sequence {}: counter {} raised past high-water {}",
                    r.server, r.sequence, r.counter, r.high_water
                );
            }
        }
        TicketsCommand::Next { sequence, count } => {
            let config = config.load()?;
            // Bad input is refused before any server is asked.
            if let Some(e) = refused_request(&config, &sequence, count) {
                return Err(e.into());
            }
            // A process that stops once it has its ids: blocks of what it
            // asks for, so that it skips less than a chunk at exit.
            let client = TicketClient::connect(config.for_one_shot(count as u64)).await?;
            let (ids, failed) = next_in_chunks(&client, &sequence, count).await;
            client.shutdown().await;
            // The ids it got were handed out: printed, whatever failed after.
            super::with_stdout(|out| {
                for id in &ids {
                    writeln!(out, "{id}")?;
                }
                Ok(())
            })?;
            match failed {
                None => {}
                Some(e) if ids.is_empty() => return Err(e.into()),
                Some(e) => bail!("{e} (after {} of {count} ids, printed)", ids.len()),
            }
        }
        TicketsCommand::Bench {
            sequence,
            tasks,
            batch,
            seconds,
            bare,
            rounds,
        } => {
            let config = config.load()?;
            let duration = Duration::from_secs_f64(seconds);
            let client = TicketClient::connect(config.clone()).await?;
            let mut ratios = Vec::new();
            for round in 1..=rounds {
                let bare_first = bare && round % 2 == 0;
                let mut bare_report = None;
                if bare_first {
                    bare_report =
                        Some(bench::bench_bare(&config, &sequence, tasks, duration).await?);
                }
                let report =
                    bench::bench_client(&client, &sequence, tasks, batch, duration).await?;
                if bare && !bare_first {
                    bare_report =
                        Some(bench::bench_bare(&config, &sequence, tasks, duration).await?);
                }
                println!(
                    "round {round}/{rounds}: client {sequence}: {} ids in {:.2} s = {:.0} ids/s; {} errors over {:.0} ms; tasks {tasks}, batch {batch}",
                    report.ids,
                    report.elapsed.as_secs_f64(),
                    report.rate(),
                    report.errors,
                    report.error_window.as_secs_f64() * 1000.0
                );
                if let Some(b) = bare_report {
                    let ratio = report.rate() / b.rate().max(1e-9);
                    ratios.push(ratio);
                    println!(
                        "round {round}/{rounds}: bare loop {sequence} ({}): {} ids in {:.2} s = {:.0} ids/s; {} errors; client/bare = {ratio:.2}",
                        if bare_first {
                            "ran first"
                        } else {
                            "ran second"
                        },
                        b.ids,
                        b.elapsed.as_secs_f64(),
                        b.rate(),
                        b.errors,
                    );
                }
            }
            let shutdown = client.shutdown().await;
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
            println!("  shutdown: {} ids skipped", shutdown.skipped_ids);
            if ratios.len() > 1 {
                ratios.sort_by(f64::total_cmp);
                let list: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
                println!(
                    "client/bare {sequence}: median {:.2} over {} rounds (sorted: {})",
                    median(&ratios),
                    ratios.len(),
                    list.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// The median of sorted, non-empty `values`.
/// One counter's end at the rate it moved between two checks.
#[derive(Debug, Clone, PartialEq)]
struct CounterEnd {
    server: String,
    sequence: String,
    bits: u32,
    counter: u64,
    max: u64,
    per_second: f64,
    /// Seconds until the counter reaches `max` at `per_second`.
    left_s: f64,
}

/// The counters that moved between `before` and `after`, `elapsed` apart,
/// and when each reaches its column's end at that rate. A ticket counter
/// is not a clock: how long it lasts depends on the rate only, so the rate
/// is what check watched (a counter that did not move is left out).
fn counter_ends(
    config: &Config,
    before: &admin::CheckReport,
    after: &admin::CheckReport,
    elapsed: Duration,
) -> Vec<CounterEnd> {
    let counters = |report: &admin::CheckReport| {
        report
            .servers
            .iter()
            .filter_map(|c| Some((c.server.name.clone(), c.settings.as_ref().ok()?)))
            .flat_map(|(server, settings)| {
                settings
                    .sequences
                    .iter()
                    .filter_map(move |q| Some(((server.clone(), q.name.clone()), q.counter?)))
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let earlier = counters(before);
    counters(after)
        .into_iter()
        .filter_map(|((server, sequence), counter)| {
            let seq = config.sequences.iter().find(|q| q.name == sequence)?;
            let moved = counter.checked_sub(*earlier.get(&(server.clone(), sequence.clone()))?)?;
            let per_second = ids_per_second(moved, elapsed)?;
            Some(CounterEnd {
                left_s: seq.max_id().saturating_sub(counter) as f64 / per_second,
                server,
                sequence,
                bits: seq.bits,
                counter,
                max: seq.max_id(),
                per_second,
            })
        })
        .collect()
}

/// `moved` counter values over `elapsed`, or `None` for none.
fn ids_per_second(moved: u64, elapsed: Duration) -> Option<f64> {
    (moved > 0 && !elapsed.is_zero()).then(|| moved as f64 / elapsed.as_secs_f64())
}

impl CounterEnd {
    /// Logs a warning when the counter ends sooner than `threshold`.
    fn warn_within(&self, threshold: Duration, now_ms: u64) -> bool {
        if self.left_s >= threshold.as_secs_f64() {
            return false;
        }
        let ends = shardflake::timestamp::rfc3339_ms(
            now_ms.saturating_add((self.left_s * 1000.0).min(u64::MAX as f64) as u64),
        );
        let way_out = if self.bits == 32 {
            format!(
                "add a sequence with bits = 64 and start = {} (above every id of this one) to the file, run shardflake tickets init and move its callers to it",
                self.max + 1
            )
        } else {
            "add a sequence with a start above this one's last id to the file, run shardflake tickets init and move its callers to it".to_string()
        };
        tracing::warn!(
            server = %self.server,
            sequence = %self.sequence,
            counter = self.counter,
            max = self.max,
            per_second = self.per_second,
            "server {} sequence {}: counter {} of {} moved {:.0} ids/s while check watched; at that rate it reaches its column's end in {:.1} days ({ends}): {way_out}",
            self.server,
            self.sequence,
            self.counter,
            self.max,
            self.per_second,
            self.left_s / 86_400.0,
        );
        true
    }
}

fn median(values: &[f64]) -> f64 {
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// Why `count` ids of `sequence` cannot be asked for, if they cannot.
fn refused_request(config: &Config, sequence: &str, count: usize) -> Option<TicketError> {
    if count == 0 || count > MAX_COUNT {
        return Some(TicketError::BadCount {
            count,
            max: MAX_COUNT,
        });
    }
    config
        .sequence(sequence)
        .is_none()
        .then(|| TicketError::UnknownSequence(sequence.into()))
}

/// `count` ids of `sequence` (1 to [`MAX_COUNT`]), asked in chunks of the
/// sequence's own limit (lower for a per-id sequence: a round trip per id):
/// the ids it got, and the error that stopped it.
async fn next_in_chunks(
    client: &TicketClient,
    sequence: &str,
    count: usize,
) -> (Vec<u64>, Option<TicketError>) {
    if let Some(e) = refused_request(client.config(), sequence, count) {
        return (Vec::new(), Some(e));
    }
    let Some((_, seq)) = client.config().sequence(sequence) else {
        return (
            Vec::new(),
            Some(TicketError::UnknownSequence(sequence.into())),
        );
    };
    let chunk = seq.mode.max_count();
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        let want = chunk.min(count - ids.len());
        let got = match seq.mode {
            // One id at a time (a round trip each either way), so that an
            // id that fails leaves those before it to print; each chunk in
            // order, as `next_n` gives them.
            Mode::PerId => {
                let mut got = Vec::with_capacity(want);
                let mut failed = None;
                for _ in 0..want {
                    match client.next(sequence).await {
                        Ok(id) => got.push(id),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                got.sort_unstable();
                ids.extend(got);
                failed.map_or(Ok(Vec::new()), Err)
            }
            Mode::Segment => client.next_n(sequence, want).await,
        };
        match got {
            Ok(got) => ids.extend(got),
            Err(e) => return (ids, Some(e)),
        }
    }
    (ids, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake_tickets::{SequenceState, ServerSettings};

    const FILE: &str = r#"
[[servers]]
name = "t1"
kind = "mariadb"
url = "mysql://root@127.0.0.1:3306/app"
offset = 1

[[sequences]]
name = "photos"
bits = 32
"#;

    fn report(config: &Config, counter: Option<u64>) -> admin::CheckReport {
        admin::CheckReport {
            increment: 1,
            servers: vec![admin::ServerCheck {
                server: config.servers[0].clone(),
                settings: Ok(ServerSettings {
                    global: None,
                    session: None,
                    warnings: Vec::new(),
                    sequences: vec![SequenceState {
                        name: "photos".into(),
                        detail: String::new(),
                        counter,
                        high_water: None,
                        problem: None,
                    }],
                }),
                holder: String::new(),
            }],
            problems: Vec::new(),
        }
    }

    #[test]
    fn a_counter_ends_at_the_rate_check_watched() {
        let config = Config::parse(FILE).unwrap();
        let max = u64::from(u32::MAX);
        // 1,000 ids in 2 s, 10,000,000 left: 20,000 s.
        let ends = counter_ends(
            &config,
            &report(&config, Some(max - 10_001_000)),
            &report(&config, Some(max - 10_000_000)),
            Duration::from_secs(2),
        );
        assert_eq!(ends.len(), 1);
        assert_eq!(ends[0].per_second, 500.0);
        assert_eq!(ends[0].left_s, 20_000.0);
        assert!(ends[0].warn_within(Duration::from_secs(365 * 86_400), 0));
        assert!(!ends[0].warn_within(Duration::from_secs(20_000), 0));
    }

    #[test]
    fn a_counter_that_did_not_move_or_was_not_read_has_no_end() {
        let config = Config::parse(FILE).unwrap();
        let still = report(&config, Some(7));
        let none = report(&config, None);
        let second = Duration::from_secs(1);
        assert!(counter_ends(&config, &still, &still, second).is_empty());
        assert!(counter_ends(&config, &none, &still, second).is_empty());
        assert!(counter_ends(&config, &still, &none, second).is_empty());
        // A counter set back (a restore) between the reads: no rate.
        assert!(counter_ends(&config, &report(&config, Some(9)), &still, second).is_empty());
        assert_eq!(ids_per_second(5, Duration::ZERO), None);
    }
}
