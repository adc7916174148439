//! `shardflake`: the command line. Each subcommand lives in `cmd/<name>.rs`
//! and returns an error that `main` prints to stderr with a non-zero exit.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod cmd;

/// Unique 64-bit, time-ordered ids for sharded and distributed databases.
#[derive(Debug, Parser)]
#[command(name = "shardflake", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log lines (stderr) as `text` or `json`, filtered by `RUST_LOG`
    /// (default `info`, e.g. `RUST_LOG=shardflake_service=debug`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "SHARDFLAKE_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Logs go to stderr through `tracing`; stdout stays for output.
fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

#[derive(Debug, Subcommand)]
// Parsed once per run: the serve variant's size costs nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Generate ids (one per line) for a layout, or UUIDs and ObjectIds.
    Gen(cmd::generate::Args),
    /// Decode ids into time, node and shard fields, and sequence.
    Decode(cmd::decode::Args),
    /// Show a layout's capacity, or suggest a layout for a deployment.
    Plan(cmd::plan::Args),
    /// The smallest and largest id of a span of time (WHERE id BETWEEN ...).
    Range(cmd::range::Args),
    /// Measure generator throughput against the layout's cap.
    Bench(cmd::bench::Args),
    /// Run the id service: HTTP and gRPC, node id static or leased from etcd.
    Serve(cmd::serve::Args),
    /// A fleet of leased nodes: move it to another etcd prefix or cluster;
    /// confirm its place after an etcd restore.
    Fleet(cmd::fleet::Args),
    /// Ids made inside PostgreSQL per logical shard: apply, check, route, locate, move-shard, sql.
    Pg(cmd::pg::Args),
    /// Ids made inside MariaDB/MySQL: apply, check, repair, insert, call, sql, bench.
    Mysql(cmd::mysql::Args),
    /// Flickr-style ticket servers and segment allocation: init, check, repair, next, bench.
    Tickets(cmd::tickets::Args),
    /// Measure what each id scheme costs on your PostgreSQL and MariaDB:
    /// bytes, insert rate, table and index size, ids per second.
    Compare(cmd::compare::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cmd::completions::CompletionsArgs),
    /// Print the man page (roff) to stdout.
    Man(cmd::completions::ManArgs),
}

/// Commands that print and then end die quietly of SIGPIPE when their reader
/// goes away (`shardflake mysql sql | head -5`), as `cat` does; Rust ignores
/// SIGPIPE, so `println!` would panic instead. `serve` and `compare` keep it
/// ignored: the one writes to sockets, the other must drop its sandbox.
fn end_quietly_on_closed_pipe(command: &Command) {
    if !matches!(command, Command::Serve(_) | Command::Compare(_)) {
        // SAFETY: called once, before any thread starts; resets one signal's
        // disposition to the default.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    end_quietly_on_closed_pipe(&cli.command);
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Gen(args) => cmd::generate::run(args),
        Command::Decode(args) => cmd::decode::run(args),
        Command::Plan(args) => cmd::plan::run(args),
        Command::Range(args) => cmd::range::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::Serve(args) => cmd::serve::run(args, &Cli::command()),
        Command::Fleet(args) => cmd::fleet::run(args),
        Command::Pg(args) => cmd::pg::run(args),
        Command::Mysql(args) => cmd::mysql::run(args),
        Command::Tickets(args) => cmd::tickets::run(args),
        Command::Compare(args) => cmd::compare::run(args),
        Command::Completions(args) => cmd::completions::run_completions(args, Cli::command()),
        Command::Man(args) => cmd::completions::run_man(args, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: each cause once (drivers repeat theirs at every level).
            let mut line = err.to_string();
            for cause in err.chain().skip(1).map(|c| c.to_string()) {
                if !line.contains(&cause) {
                    line = format!("{line}: {cause}");
                }
            }
            eprintln!("error: {line}");
            ExitCode::FAILURE
        }
    }
}
