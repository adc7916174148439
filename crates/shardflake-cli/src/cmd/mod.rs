//! One module per subcommand, plus the options they share.

pub mod backfill;
pub mod bench;
pub mod compare;
pub mod completions;
pub mod decode;
pub mod fleet;
pub mod generate;
pub mod mysql;
pub mod mysql_bench;
pub mod pg;
pub mod plan;
pub mod range;
pub mod serve;
pub mod tickets;

use std::io::{self, Write};

use anyhow::Context;
use shardflake::{Layout, preset};

/// `--layout`: a preset name or a spec such as
/// `"time 41 | node 10 | sequence 12 (epoch 1288834974657 ms)"`.
#[derive(Debug, Clone, clap::Args)]
pub struct LayoutArg {
    /// Preset (snowflake, twitter, discord, instagram, sonyflake,
    /// mysql-procedure, js-safe) or a spec like
    /// "time 41 | node 10 | sequence 12 (epoch 1288834974657 ms, tick 1 ms)".
    #[arg(long, short, default_value = "snowflake", env = "SHARDFLAKE_LAYOUT")]
    pub layout: String,
}

impl LayoutArg {
    pub fn resolve(&self) -> anyhow::Result<Layout> {
        Ok(preset::resolve(&self.layout)?)
    }
}

/// How little of a layout's life left is warned of: `SHARDFLAKE_LIFETIME_WARNING`
/// (a duration such as `730d`), else a year.
pub fn lifetime_warning() -> anyhow::Result<std::time::Duration> {
    match std::env::var("SHARDFLAKE_LIFETIME_WARNING") {
        Ok(text) => humantime::parse_duration(&text).with_context(|| {
            format!("SHARDFLAKE_LIFETIME_WARNING {text:?} is not a duration like 365d")
        }),
        Err(_) => Ok(shardflake_service::LIFETIME_WARNING),
    }
}

/// Logs a warning (stderr) when `layout` has less than the threshold left.
pub fn warn_of_lifetime(layout: &Layout) -> anyhow::Result<()> {
    let now = shardflake::Clock::now_ms(&shardflake::SystemClock);
    shardflake_service::warn_of_lifetime(layout, lifetime_warning()?, now);
    Ok(())
}

/// Runs `write` on a buffered stdout; a closed pipe (`| head`) is a normal end.
pub fn with_stdout(write: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let stdout = io::stdout();
    let mut out = io::BufWriter::with_capacity(1 << 16, stdout.lock());
    let result = write(&mut out).and_then(|()| out.flush().context("writing to stdout"));
    match result {
        Err(e) if is_broken_pipe(&e) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<io::Error>())
        .any(|e| e.kind() == io::ErrorKind::BrokenPipe)
}
