//! One module per subcommand, plus the options they share.

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
