//! `shardflake bench`: generator throughput for a layout, threads and batch
//! size, against the layout's cap and against a plain shared atomic counter
//! run in the same process (the fastest shared source of unique numbers, and
//! a baseline that drifts with the machine the way the generator does).

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use shardflake::timestamp::rfc3339_ms;
use shardflake::{ExhaustedPolicy, GenerateError, Generator};

use super::{LayoutArg, with_stdout};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Every thread calls the shared generator: ids returned before a call
    /// starts are smaller than its id, across threads.
    Shared,
    /// Every thread takes blocks from the shared generator: ids increase per
    /// thread only.
    Local,
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  shardflake bench --threads 2
  shardflake bench --layout \"time 41 | node 6 | sequence 16\" --threads 16
  shardflake bench --batch 1000 --json")]
pub struct Args {
    #[command(flatten)]
    layout: LayoutArg,
    /// Threads sharing one generator (default: one per core).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Ids per call: 1 is next_id(), more is next_ids(BATCH).
    #[arg(short, long, default_value_t = 1)]
    batch: u64,
    /// How threads share the generator.
    #[arg(long, value_enum, default_value_t = Mode::Shared)]
    mode: Mode,
    /// Ids each thread reserves at a time in the local mode (at most a tick's worth).
    #[arg(long, default_value_t = 4096)]
    block: u64,
    /// Seconds to run each measurement.
    #[arg(short, long, default_value_t = 2.0)]
    seconds: f64,
    /// Let a full tick borrow up to this many ms of future ticks.
    #[arg(long)]
    borrow_ms: Option<u64>,
    /// Skip the shared-atomic-counter baseline.
    #[arg(long)]
    no_baseline: bool,
    /// JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[repr(align(128))]
struct CacheLine<T>(T);

/// Calls between checks of the stop flag and updates of the shared count.
const ROUND: u64 = 256;

pub fn run(args: Args) -> anyhow::Result<()> {
    let layout = args.layout.resolve()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if !(1..=1024).contains(&threads) {
        bail!("--threads must be between 1 and 1024");
    }
    if !(args.seconds > 0.0 && args.seconds <= 3600.0) {
        bail!("--seconds must be above 0 and at most 3600");
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let mut builder = Generator::builder(layout.clone()).max_batch(args.batch.max(1));
    for field in layout.node_fields() {
        builder = builder.node(field.name(), 0);
    }
    if let Some(ms) = args.borrow_ms {
        builder = builder.on_exhausted(ExhaustedPolicy::Borrow {
            max_lead: Duration::from_millis(ms),
        });
    }
    let generator = builder.build()?;
    if args.batch == 0 || args.batch > generator.max_batch() {
        bail!("--batch must be between 1 and {}", generator.max_batch());
    }

    let baseline = (!args.no_baseline).then(|| {
        let counter = AtomicU64::new(0);
        measure(
            "baseline: shared atomic counter",
            threads,
            duration,
            args.json,
            |_| {
                let mut n = 0;
                while n < ROUND {
                    black_box(counter.fetch_add(args.batch, Ordering::Relaxed));
                    n += args.batch;
                }
                Ok(n)
            },
        )
    });
    let baseline = baseline.transpose()?;

    let label = format!(
        "{} x{threads} {:?} batch {}",
        layout.name(),
        args.mode,
        args.batch
    );
    let ids = match args.mode {
        Mode::Shared if args.batch == 1 => measure(&label, threads, duration, args.json, |_| {
            for _ in 0..ROUND {
                black_box(generator.next_id()?);
            }
            Ok(ROUND)
        })?,
        Mode::Shared => measure(&label, threads, duration, args.json, |_| {
            let batch = generator.next_ids(args.batch)?;
            batch.iter().for_each(|id| {
                black_box(id);
            });
            Ok(args.batch)
        })?,
        Mode::Local => {
            // One handle per thread, kept across rounds.
            // One handle per thread, kept across rounds, each on its own
            // cache line (neighbours would slow each other down).
            let locals: Vec<_> = (0..threads)
                .map(|_| CacheLine(std::sync::Mutex::new(generator.local(args.block))))
                .collect();
            measure(&label, threads, duration, args.json, |t| {
                let mut local = locals[t]
                    .0
                    .lock()
                    .map_err(|_| anyhow::anyhow!("poisoned"))?;
                for _ in 0..ROUND {
                    black_box(local.next_id()?);
                }
                Ok(ROUND)
            })?
        }
    };

    let (ids, elapsed) = ids;
    let rate = ids as f64 / elapsed.as_secs_f64();
    let cap = layout.ids_per_second();
    let stats = generator.stats();
    let baseline_rate = baseline.map(|(n, took)| n as f64 / took.as_secs_f64());
    with_stdout(|out| {
        if args.json {
            let report = json!({
                "layout": layout.name(),
                "negative_from": layout.negative_from_ms().map(rfc3339_ms),
                "threads": threads,
                "mode": format!("{:?}", args.mode).to_lowercase(),
                "batch": args.batch,
                "seconds": elapsed.as_secs_f64(),
                "ids": ids,
                "ids_per_second": rate,
                "cap_per_second": cap,
                "fraction_of_cap": rate / cap,
                "ns_per_id_per_thread": 1e9 * threads as f64 / rate,
                "baseline_ids_per_second": baseline_rate,
                "vs_baseline": baseline_rate.map(|b| rate / b),
                "exhaustions": stats.exhaustions,
            });
            writeln!(out, "{report}")?;
        } else {
            writeln!(out, "layout     {layout}")?;
            writeln!(
                out,
                "run        {threads} threads, {:?}, batch {}, {:.1} s",
                args.mode,
                args.batch,
                elapsed.as_secs_f64()
            )?;
            writeln!(
                out,
                "ids/s      {:.3} M ({:.1} ns per id per thread)",
                rate / 1e6,
                1e9 * threads as f64 / rate
            )?;
            writeln!(
                out,
                "cap        {:.3} M/s; reached {:.1}%",
                cap / 1e6,
                100.0 * rate / cap
            )?;
            if let Some(b) = baseline_rate {
                writeln!(
                    out,
                    "baseline   shared atomic counter {:.3} M/s; generator {:.3}x",
                    b / 1e6,
                    rate / b
                )?;
            }
            writeln!(
                out,
                "waits      {} full ticks waited out",
                stats.exhaustions
            )?;
        }
        Ok(())
    })
}

/// Runs `round` on `threads` threads for `duration`; returns the ids made
/// and the time until the last thread finished its last round (threads run
/// on past `duration` to the end of a round, so that is what the ids took).
fn measure(
    label: &str,
    threads: usize,
    duration: Duration,
    quiet: bool,
    round: impl Fn(usize) -> Result<u64, anyhow::Error> + Sync,
) -> anyhow::Result<(u64, Duration)> {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::with_draw_target(
            Some(duration.as_millis() as u64),
            ProgressDrawTarget::stderr(),
        );
        bar.set_style(
            ProgressStyle::with_template("{msg:40} [{bar:30}] {prefix}")
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .progress_chars("=> "),
        );
        bar.set_message(label.to_string());
        bar
    };
    let started = Instant::now();
    let results: Vec<Result<u64, anyhow::Error>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, total, round) = (&stop, &total, &round);
                s.spawn(move || {
                    let mut made = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let n = round(t)?;
                        made += n;
                        total.fetch_add(n, Ordering::Relaxed);
                    }
                    Ok::<u64, anyhow::Error>(made)
                })
            })
            .collect();
        while started.elapsed() < duration {
            std::thread::sleep(Duration::from_millis(50).min(duration));
            bar.set_position(started.elapsed().as_millis() as u64);
            bar.set_prefix(format!(
                "{:.1} M ids",
                total.load(Ordering::Relaxed) as f64 / 1e6
            ));
        }
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a bench thread panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    bar.finish_and_clear();
    let mut ids = 0;
    for r in results {
        ids += r.map_err(|e| match e.downcast::<GenerateError>() {
            Ok(g) => anyhow::Error::new(g).context("generator refused during the bench"),
            Err(e) => e,
        })?;
    }
    Ok((ids, elapsed))
}
