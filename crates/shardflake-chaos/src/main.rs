//! `shardflake-chaos`: runs `shardflake serve` nodes against a 3-member
//! etcd under a seeded schedule of faults while loading them over HTTP and
//! gRPC, then checks every id returned with a checker written apart from the
//! service (it links the core crate, to decode ids, and the client crate's
//! generated gRPC types; never the service).
//!
//! | module | holds |
//! |---|---|
//! | `run` | one run: start, load, faults, stop, check, table |
//! | `schedule` | the seeded fault schedules: `run`'s cycle, and the operator's faults drawn at random (`draw`) |
//! | `cluster` | etcd (via `scripts/etcd.sh`), node processes, the network namespace |
//! | `load` | HTTP and gRPC connections pinned to a node; what each returned |
//! | `record` | every id, as runs of consecutive ids, per connection |
//! | `check` | the checker and its table |
//! | `db` | `db`: in-database ids (MariaDB) under server SIGKILLs and clock steps |
//! | `db_pg` | `db-pg`: PostgreSQL's in-database ids under an operator's drawn faults |
//! | `db_adopt` | `db-adopt`: `pg adopt` or `mysql adopt` of a populated table under writers and faults |
//! | `db_load` | the writers the three db modes share: inserts, pauses, generations |
//! | `tickets` | `tickets`: MariaDB ticket servers under crashes and an operator's drawn faults |
//! | `verdict` | what `db` and `tickets` share: run directory, logs gathered, the judging |
//!
//! Usually run through `scripts/chaos.sh SECONDS [args]`, which builds the
//! release binaries and cleans up whatever is left.

mod check;
mod cluster;
mod db;
mod db_adopt;
mod db_load;
mod db_pg;
mod load;
mod record;
mod run;
mod schedule;
mod tickets;
mod verdict;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "shardflake-chaos",
    about = "Faults on a schedule against shardflake serve nodes, and an independent checker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd and the nodes, load them, apply the schedule, check every id.
    Run(RunArgs),
    /// Print the schedule a seed gives, without running it.
    Schedule(RunArgs),
    /// In-database ids: a MariaDB server with `shardflake mysql apply`'s
    /// one-statement ids, clients inserting rows, the server SIGKILLed and
    /// restarted and its clock stepped back; every id checked.
    Db(DbArgs),
    /// In-database ids on PostgreSQL under an operator's faults drawn at
    /// random from the seed: move-shard stopped at each step or SIGKILLed,
    /// apply from an older or edited topology file, a shard restored from a
    /// dump (writers stopped or live) then repaired, repair during a move,
    /// two moves at once, a crash, a failover to a standby with the old
    /// primary restarted beside it; every id checked.
    DbPg(PgArgs),
    /// `shardflake pg adopt` of a populated bigserial table (or, with
    /// `--backend mariadb`, `shardflake mysql adopt` of an AUTO_INCREMENT
    /// one) under writers and an operator's faults drawn from the seed:
    /// adopt SIGKILLed and run again, the dump from before adoption
    /// restored over the adopted table, the default changed back by hand;
    /// every id checked, and every stored id read back.
    DbAdopt(AdoptArgs),
    /// Ticket servers: a MariaDB odd/even pair (`shardflake tickets init`),
    /// ticket clients asking for ids under crashes and an operator's
    /// faults drawn at random from the seed (restores, counters lowered,
    /// a server replaced, reshapes, failovers, edited files); every id
    /// checked.
    Tickets(TicketsArgs),
}

/// What `db` and `tickets` share.
#[derive(clap::Args, Clone)]
struct ServerArgs {
    /// Length of the load, seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Clients, each with its own connections.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seed of the schedule and the request mix [default: from the clock, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds between two faults.
    #[arg(long, default_value_t = 6)]
    spacing: u64,
    /// Keep report.md (and tickets.toml) here [default: a temporary directory, removed].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The shardflake binary (runs `mysql apply` or `tickets init`).
    #[arg(long, default_value = "target/release/shardflake")]
    bin: PathBuf,
    /// The MariaDB launcher script.
    #[arg(long, default_value = "scripts/mariadb.sh")]
    mariadb_script: PathBuf,
}

impl ServerArgs {
    fn options(self) -> verdict::ServerRun {
        verdict::ServerRun {
            seconds: self.seconds,
            seed: self
                .seed
                .unwrap_or_else(|| check::unix_ms_now() % 1_000_000),
            clients: self.clients.max(1),
            bin: self.bin,
            script: self.mariadb_script,
            spacing: Duration::from_secs(self.spacing.max(2)),
            out: self.out,
        }
    }
}

#[derive(clap::Args, Clone)]
struct DbArgs {
    #[command(flatten)]
    common: ServerArgs,
    /// The kinds of fault to draw from, comma-separated; a kind named
    /// twice is drawn twice as often [default:
    /// kill,kill,clock-back,restore-stopped,restore-live,restore-no-loop,
    /// restore-after-stop,restore-restart].
    #[arg(long, value_delimiter = ',', value_parser = parse_db_fault)]
    kinds: Vec<db::Fault>,
}

fn parse_db_fault(name: &str) -> Result<db::Fault, String> {
    db::Fault::parse(name).ok_or_else(|| {
        "no such kind; the kinds: kill, clock-back, restore-stopped, restore-live, restore-no-loop, restore-after-stop, restore-restart"
            .to_string()
    })
}

#[derive(clap::Args, Clone)]
struct PgArgs {
    #[command(flatten)]
    common: ServerArgs,
    /// The PostgreSQL launcher script.
    #[arg(long, default_value = "scripts/pg.sh")]
    pg_script: PathBuf,
    /// The kinds of fault to draw from, comma-separated [default: every
    /// kind: move-stopped, move-killed, older-file-apply, edit-owner,
    /// edit-prefix, edit-count, edit-epoch, edit-url, restore-stopped,
    /// restore-live, repair-during-move, two-moves, crash, failover].
    #[arg(long, value_delimiter = ',', value_parser = parse_pg_fault)]
    kinds: Vec<db_pg::Fault>,
}

#[derive(clap::Args, Clone)]
struct AdoptArgs {
    #[command(flatten)]
    common: ServerArgs,
    /// The server the table is on: `postgresql` (`pg adopt` of a
    /// bigserial) or `mariadb` (`mysql adopt` of an AUTO_INCREMENT).
    #[arg(long, default_value = "postgresql", value_parser = ["postgresql", "mariadb"])]
    backend: String,
    /// The PostgreSQL launcher script.
    #[arg(long, default_value = "scripts/pg.sh")]
    pg_script: PathBuf,
    /// The kinds of fault to draw from, comma-separated [default: every
    /// kind: adopt-killed, restore-predump, default-back].
    #[arg(long, value_delimiter = ',', value_parser = parse_adopt_fault)]
    kinds: Vec<db_adopt::Fault>,
}

fn parse_adopt_fault(name: &str) -> Result<db_adopt::Fault, String> {
    db_adopt::Fault::parse(name).ok_or_else(|| {
        let names: Vec<&str> = db_adopt::Fault::ALL.iter().map(|k| k.name()).collect();
        format!("no such kind; the kinds: {}", names.join(", "))
    })
}

fn parse_pg_fault(name: &str) -> Result<db_pg::Fault, String> {
    db_pg::Fault::parse(name).ok_or_else(|| {
        let names: Vec<&str> = db_pg::Fault::ALL.iter().map(|k| k.name()).collect();
        format!("no such kind; the kinds: {}", names.join(", "))
    })
}

#[derive(clap::Args, Clone)]
struct TicketsArgs {
    #[command(flatten)]
    common: ServerArgs,
    /// `per-id` (Flickr: a round trip per id) or `segment` (Leaf: blocks).
    #[arg(long, default_value = "segment", value_parser = ["per-id", "segment"])]
    mode: String,
    /// The kinds of fault to draw from, comma-separated [default: every
    /// kind: kill, stop, restore-live, restore-stopped, lowered,
    /// skip-triggers, peer-down, peer-backup, replaced-new-name, reshape,
    /// failover, edited-file, guard-replaced].
    #[arg(long, value_delimiter = ',', value_parser = parse_ticket_fault)]
    kinds: Vec<tickets::Fault>,
    /// Keep exactly two servers (a reshape swaps their offsets, never
    /// adds or removes one): with `--kinds kill`, how long the clients of
    /// a pair wait while one server is down (a mark needs the peer).
    #[arg(long)]
    pair: bool,
}

fn parse_ticket_fault(name: &str) -> Result<tickets::Fault, String> {
    tickets::Fault::parse(name).ok_or_else(|| {
        let names: Vec<&str> = tickets::Fault::ALL.iter().map(|k| k.name()).collect();
        format!("no such kind; the kinds: {}", names.join(", "))
    })
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// Length of the load, seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Nodes (a spare is added for the SIGSTOP hand-over).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Seed of the schedule and the request mix [default: from the clock, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Keep logs, state files and report.md here [default: a temporary directory, removed].
    #[arg(long)]
    out: Option<PathBuf>,
    /// The shardflake binary.
    #[arg(long, default_value = "target/release/shardflake")]
    bin: PathBuf,
    /// The etcd launcher script.
    #[arg(long, default_value = "scripts/etcd.sh")]
    etcd_script: PathBuf,
    /// Connections per node per protocol.
    #[arg(long, default_value_t = 2)]
    conns: usize,
    /// The large batch size (half the batches; the others are 2..=2000).
    #[arg(long, default_value_t = 100_000)]
    batch: u64,
    /// Share of requests for a single id.
    #[arg(long, default_value_t = 0.4)]
    single_share: f64,
    /// Seconds between two faults.
    #[arg(long, default_value_t = 8)]
    spacing: u64,
    /// Lease TTL of the nodes, ms.
    #[arg(long, default_value_t = 2000)]
    lease_ttl_ms: u64,
    /// Skip the network namespace (and the cut-from-etcd fault).
    #[arg(long)]
    no_netns: bool,
    /// etcd with user/password authentication and JWT tokens: the nodes
    /// log in, and the schedule adds auth changes (each voids every token).
    #[arg(long)]
    etcd_auth: bool,
}

impl RunArgs {
    fn options(&self) -> run::Options {
        let seed = self
            .seed
            .unwrap_or_else(|| check::unix_ms_now() % 1_000_000);
        run::Options {
            seconds: self.seconds,
            nodes: self.nodes,
            seed,
            out: self.out.clone(),
            bin: self.bin.clone(),
            etcd_script: self.etcd_script.clone(),
            conns: self.conns,
            mix: load::Mix {
                single_share: self.single_share.clamp(0.0, 1.0),
                big_batch: self.batch.max(2),
            },
            spacing: Duration::from_secs(self.spacing.max(1)),
            netns: !self.no_netns,
            lease_ttl: Duration::from_millis(self.lease_ttl_ms),
            etcd_auth: self.etcd_auth,
        }
    }
}

/// A run's verdict as the exit status: 0 passed, 1 failed, 2 could not run.
fn exit(result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("shardflake-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,shardflake_tickets=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Schedule(a) => {
            let o = a.options();
            println!("seed {}", o.seed);
            for p in schedule::plan(o.seed, &run::shape(&o)) {
                println!("  {p}");
            }
            ExitCode::SUCCESS
        }
        Command::Tickets(a) => {
            let o = tickets::TicketsOptions {
                run: a.common.options(),
                segment: a.mode == "segment",
                kinds: if a.kinds.is_empty() {
                    tickets::Fault::ALL.to_vec()
                } else {
                    a.kinds
                },
                pair: a.pair,
            };
            println!(
                "shardflake-chaos tickets --seconds {} --clients {} --mode {} --seed {}{}",
                o.run.seconds,
                o.run.clients,
                a.mode,
                o.run.seed,
                if o.pair { " --pair" } else { "" }
            );
            exit(tickets::run(&o))
        }
        Command::Db(a) => {
            let o = a.common.options();
            println!(
                "shardflake-chaos db --seconds {} --clients {} --seed {}",
                o.seconds, o.clients, o.seed
            );
            let kinds = if a.kinds.is_empty() {
                db::Fault::DEFAULT.to_vec()
            } else {
                a.kinds
            };
            exit(db::run(&o, &kinds))
        }
        Command::DbPg(a) => {
            let o = a.common.options();
            println!(
                "shardflake-chaos db-pg --seconds {} --clients {} --seed {}",
                o.seconds, o.clients, o.seed
            );
            let kinds = if a.kinds.is_empty() {
                db_pg::Fault::ALL.to_vec()
            } else {
                a.kinds
            };
            exit(db_pg::run(&o, &a.pg_script, &kinds))
        }
        Command::DbAdopt(a) => {
            let o = a.common.options();
            println!(
                "shardflake-chaos db-adopt --backend {} --seconds {} --clients {} --seed {}",
                a.backend, o.seconds, o.clients, o.seed
            );
            let backend = if a.backend == "mariadb" {
                db_load::Backend::MariaDb
            } else {
                db_load::Backend::Postgres
            };
            let kinds = if a.kinds.is_empty() {
                db_adopt::Fault::ALL.to_vec()
            } else {
                a.kinds
            };
            exit(db_adopt::run(&o, backend, &a.pg_script, &kinds))
        }
        Command::Run(a) => {
            let o = a.options();
            println!(
                "shardflake-chaos run --seconds {} --nodes {} --seed {}",
                o.seconds, o.nodes, o.seed
            );
            exit(run::run(&o))
        }
    }
}
