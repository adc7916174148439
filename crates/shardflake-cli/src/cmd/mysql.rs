//! `shardflake mysql ...`: ids inside MariaDB/MySQL: the one-statement
//! `INSERT ... RETURNING id` (a sequence `DEFAULT` kept up with the clock by
//! an event) and the seed-shaped `generate_post_id` procedures (the work is
//! in `shardflake_db::mysql`; this only parses and prints).

use anyhow::Context;
use clap::Subcommand;
use shardflake::Id;
use shardflake_db::mysql::{self, Flavor, Names, Options, sql};

use super::mysql_bench::{self, BenchMode, BenchOptions};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    conn: Conn,
    #[command(subcommand)]
    command: MysqlCommand,
}

/// The server every subcommand works on: before or after the subcommand.
#[derive(Debug, Clone, clap::Args)]
struct Conn {
    /// Server URL naming a database, e.g. mysql://root@127.0.0.1:3306/app.
    #[arg(long, global = true, env = "SHARDFLAKE_MYSQL_URL")]
    url: Option<String>,
}

impl Conn {
    /// Connects, runs `work` on one connection, disconnects.
    fn run<T>(
        &self,
        work: impl AsyncFnOnce(&mut shardflake_db::mysql_async::Conn) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let url = self.url.as_deref().context(
            "no server: pass --url mysql://USER@HOST:PORT/DATABASE (or set SHARDFLAKE_MYSQL_URL)",
        )?;
        runtime()?.block_on(async {
            let pool = mysql::pool(url)?;
            let out = match pool.get_conn().await {
                Ok(mut c) => work(&mut c).await,
                Err(e) => Err(anyhow::anyhow!(
                    "cannot connect to {}: {}",
                    redacted(url),
                    root_cause(&e)
                )),
            };
            pool.disconnect().await.ok();
            out
        })
    }
}

/// The innermost cause of an error (the drivers repeat it at every level).
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut e = e;
    while let Some(source) = e.source() {
        e = source;
    }
    e.to_string()
}

/// `url` without its password.
fn redacted(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://")
        && let Some((cred, host)) = rest.rsplit_once('@')
        && let Some((user, _)) = cred.split_once(':')
    {
        return format!("{scheme}://{user}:***@{host}");
    }
    url.to_string()
}

#[derive(Debug, Clone, clap::Args)]
struct Target {
    /// Table whose `id` column gets the default (created if missing, in the
    /// seed's shape: id, <key>, body).
    #[arg(long, default_value = "posts")]
    table: String,
    /// Its shard-key column: shard = key mod 2^shard_bits.
    #[arg(long, default_value = "user_id")]
    key: String,
    /// The procedure's name (the row-lock one is <name>_locked, the seed's
    /// <name>_seed); default: generate_post_id for table posts,
    /// generate_<table>_id for another.
    #[arg(long)]
    procedure: Option<String>,
}

impl Target {
    fn names(&self) -> anyhow::Result<Names> {
        let procedure = self
            .procedure
            .clone()
            .unwrap_or_else(|| Names::default_procedure(&self.table));
        Ok(Names::new(&self.table, &self.key, &procedure)?)
    }
}

/// Many tables at once, instead of `--table`: each keeps its own
/// procedure, generate_<table>_id.
#[derive(Debug, Clone, clap::Args)]
struct Selection {
    /// Every table of this database whose id is AUTO_INCREMENT.
    #[arg(long, conflicts_with_all = ["table", "procedure", "pattern"])]
    schema: Option<String>,
    /// Every table whose database.table matches this SQL LIKE pattern
    /// (e.g. 'app.order%') and whose id is AUTO_INCREMENT.
    #[arg(long, conflicts_with_all = ["table", "procedure"])]
    pattern: Option<String>,
}

impl Selection {
    fn tables(&self) -> Option<mysql::Tables> {
        self.schema
            .clone()
            .map(mysql::Tables::Schema)
            .or_else(|| self.pattern.clone().map(mysql::Tables::Pattern))
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum FlavorArg {
    /// generate_post_id: the sequence (MariaDB >= 10.3).
    Sequence,
    /// generate_post_id_locked: a row of `sequences` under its row lock.
    Locked,
    /// The seed's procedure, verbatim (racy; for comparison only).
    Seed,
}

impl From<FlavorArg> for Flavor {
    fn from(f: FlavorArg) -> Flavor {
        match f {
            FlavorArg::Sequence => Flavor::Sequence,
            FlavorArg::Locked => Flavor::Locked,
            FlavorArg::Seed => Flavor::Seed,
        }
    }
}

#[derive(Debug, Subcommand)]
enum MysqlCommand {
    /// Install (idempotently): the sequence, the table or its id default,
    /// the clock event, generate_post_id and generate_post_id_locked.
    /// Without sequences (MySQL): generate_post_id_locked only.
    Apply {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        layout: LayoutArg,
        /// The sequence's CACHE (0 or 1: NOCACHE).
        #[arg(long, default_value_t = sql::DEFAULT_CACHE)]
        cache: u64,
        /// Also install the seed's racy procedure, for comparison.
        #[arg(long)]
        seed: bool,
        /// The shard values (the shard key mod 2^shard_bits, 1024 for the
        /// default layout) this server makes ids for: LO-HI or one value.
        /// Recorded on the server; default: what it records, or all.
        #[arg(long, value_name = "LO-HI", value_parser = parse_shards)]
        shards: Option<(u64, u64)>,
        /// Another server making ids for the same table (repeatable): a
        /// shard value it records too is refused, and this server's
        /// sequence is put past the peer's (values taken from it get ids
        /// after its ids). Every other database of this server counts as
        /// one, named or not; naming this very database is refused.
        #[arg(long = "peer", value_name = "URL")]
        peers: Vec<String>,
        /// The table is separate from the same-named one other databases
        /// of this server make ids for (their ids may be equal); recorded.
        /// Without it, shard values another database of this server
        /// records are refused as a peer's are.
        #[arg(long = "new-deployment")]
        new_deployment: bool,
    },
    /// Put an existing table's AUTO_INCREMENT id under the one-statement
    /// ids while the application keeps writing: what apply installs, then
    /// the trigger under LOCK TABLES, refused unless every old id is below
    /// the first new one. Running it again changes nothing.
    Adopt {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        layout: LayoutArg,
        /// The sequence's CACHE (0 or 1: NOCACHE).
        #[arg(long, default_value_t = sql::DEFAULT_CACHE)]
        cache: u64,
        /// The shard values this server makes ids for (as for apply).
        #[arg(long, value_name = "LO-HI", value_parser = parse_shards)]
        shards: Option<(u64, u64)>,
        /// Another server making ids for the same table (repeatable), as
        /// for apply: a shard value it records too is refused, and this
        /// server's sequence is put past the peer's.
        #[arg(long = "peer", value_name = "URL")]
        peers: Vec<String>,
        /// Print the plan and the switch's SQL; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Verify what apply installs and the settings the no-repeat argument
    /// needs (exit 1 on any difference). Draws one value of the sequence.
    /// With --schema or --pattern: every table adopt selects, each one.
    Check {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        selection: Selection,
        #[command(flatten)]
        layout: LayoutArg,
        /// Another server making ids for the same table (repeatable): a
        /// shard value it records too is reported (both make the same ids).
        #[arg(long = "peer", value_name = "URL")]
        peers: Vec<String>,
    },
    /// After a restore (a dump of the database, or of the whole server), or
    /// a sequence recreated or set back, which inserts refuse: move the
    /// sequence past every value it can have handed out and record that.
    Repair {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        layout: LayoutArg,
        /// Where the server records no shard values for the table (the
        /// database alone copied from another server), or on a promoted
        /// replica or a copy of the server, the ones it makes ids for:
        /// LO-HI or one value; recorded. Refused without it where none
        /// are recorded.
        #[arg(long, value_name = "LO-HI", value_parser = parse_shards)]
        shards: Option<(u64, u64)>,
        /// Another server making ids for the same table (repeatable): a
        /// shard value it records too is refused. On a promoted replica
        /// or a copy of the server, naming the server the ids were
        /// installed for proves that it makes none of this one's values.
        #[arg(long = "peer", value_name = "URL")]
        peers: Vec<String>,
        /// On a promoted replica, a copy of the server or a server moved:
        /// the server the ids were installed for, as the refusal and
        /// `mysql check` print it (SERVER_ID:PORT:DATADIR), is stopped
        /// for good (or this is it, moved). It must name exactly that
        /// server; one still running would make this one's ids too.
        /// Refused where the ids were installed for this server (nothing
        /// to prove).
        #[arg(long, value_name = "SERVER_ID:PORT:DATADIR")]
        old_server_gone: Option<String>,
    },
    /// Decode an id of the URL's database: its time, shard and sequence,
    /// or that it is from before an adopted table's adoption (such an id
    /// has none). In SQL: SELECT decode_id(id, 'table').
    Locate {
        /// Id as stored (signed BIGINT).
        #[arg(allow_hyphen_values = true)]
        id: i64,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// INSERT rows in one statement (INSERT ... RETURNING id); print the ids
    /// and decode them.
    Insert {
        /// Shard key (user id).
        #[arg(allow_hyphen_values = true)]
        user_id: i64,
        /// How many rows.
        #[arg(long, short = 'n', default_value_t = 1)]
        count: usize,
        /// The body column's text.
        #[arg(long, default_value = "hello")]
        body: String,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// Call a procedure as the seed's ORM does; print the ids and decode them.
    Call {
        /// Shard key (user id); the shard is user_id mod 2^shard_bits.
        #[arg(allow_hyphen_values = true)]
        user_id: i64,
        /// How many ids.
        #[arg(long, short = 'n', default_value_t = 1)]
        count: usize,
        /// Which procedure.
        #[arg(long, value_enum, default_value = "sequence")]
        flavor: FlavorArg,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// Print the generated SQL (what apply installs).
    Sql {
        /// Print the seed's procedure instead.
        #[arg(long)]
        seed: bool,
        /// The database the objects go in (the high-water sequence, in
        /// database shardflake, is named after it).
        #[arg(long, default_value = "app")]
        database: String,
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// Every way to get an id against AUTO_INCREMENT, N clients sharing one
    /// user id: inserts/s, duplicates, server CPU. Drops and creates bench_*
    /// tables, sequences, events and routines.
    Bench {
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Rows per client per mode per round.
        #[arg(long, default_value_t = 2000)]
        rows: u64,
        /// Rounds, each in a rotated order of the modes.
        #[arg(long, default_value_t = 1)]
        rounds: usize,
        #[arg(long, default_value_t = 1801)]
        user_id: i64,
        /// The server's pid, if it runs on this machine: server CPU per insert.
        #[arg(long)]
        server_pid: Option<u32>,
        /// Rows of a bulk INSERT ... SELECT for the per-row CPU of one
        /// connection (needs --server-pid; 0: skip).
        #[arg(long, default_value_t = 0)]
        cpu_rows: u64,
        /// Runs of that measure per mode.
        #[arg(long, default_value_t = 3)]
        cpu_runs: usize,
        #[command(flatten)]
        layout: LayoutArg,
    },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `--layout` of the mysql commands: the seed's mysql-procedure by default
/// (the other commands default to snowflake, which has no shard field).
#[derive(Debug, Clone, clap::Args)]
struct LayoutArg {
    /// Preset or spec with a "shard" field (mysql-procedure, instagram, or
    /// e.g. "time 43 | shard 10 | sequence 10 (epoch 1672531200000 ms)").
    #[arg(
        long,
        short,
        default_value = "mysql-procedure",
        env = "SHARDFLAKE_LAYOUT"
    )]
    layout: String,
}

/// The layout asked for, as asked: one without a shard field (snowflake)
/// is refused, never replaced.
fn mysql_layout(layout: &LayoutArg) -> anyhow::Result<shardflake::Layout> {
    let l = shardflake::preset::resolve(&layout.layout)?;
    mysql::Plan::new(&l)?;
    Ok(l)
}

fn print_id(l: &shardflake::Layout, id: i64) -> anyhow::Result<()> {
    let p = Id(id as u64).decode(l)?;
    println!(
        "{id} time {} shard {} sequence {}",
        p.timestamp(),
        p.field("shard").unwrap_or_default(),
        p.sequence
    );
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let conn = args.conn;
    match args.command {
        MysqlCommand::Sql {
            seed,
            database,
            target,
            layout,
        } => {
            let l = mysql_layout(&layout)?;
            let names = target.names()?;
            if seed {
                println!("{}\n", sql::sequences_sql(&names.seed_row()));
                println!(
                    "DELIMITER //\n{} //\nDELIMITER ;",
                    sql::seed_procedure_sql(&names.seed_procedure(), &names.seed_row())
                );
                return Ok(());
            }
            let plan = mysql::Plan::new(&l)?.in_database(&database);
            println!("-- shardflake mysql apply: {l}, database {database}");
            println!("-- every routine, the event and the table are created with");
            println!("SET SESSION sql_mode = '{}';\n", sql::SQL_MODE);
            if let Some(hw) = sql::high_water_sql(&plan, &names) {
                println!(
                    "-- the sequence's high-water, where a restore of {database} cannot set it back"
                );
                println!(
                    "CREATE DATABASE IF NOT EXISTS `{}`;\n{hw};\n",
                    sql::HIGH_WATER_DB
                );
            }
            println!("-- START WITH: the server's packed clock at apply time");
            println!(
                "{};\n",
                sql::sequence_sql(&plan, &names, 0, sql::DEFAULT_CACHE)
            );
            println!(
                "-- if missing (an existing table keeps its columns; id must be a signed BIGINT)"
            );
            println!("{};\n", sql::table_sql(&plan, &names));
            println!(
                "DELIMITER //\n{} //\n",
                sql::refused_function_sql(&plan, &names)
            );
            println!("{} //\n", sql::trigger_sql(&plan, &names));
            println!("{} //\n", sql::event_sql(&plan, &names));
            println!("{} //\n", sql::procedure_sql(&plan, &names));
            println!("DELIMITER ;\n{}\n", sql::sequences_sql(&names.locked_row()));
            println!(
                "DELIMITER //\n{} //\nDELIMITER ;",
                sql::locked_procedure_sql(&plan, &names)
            );
            Ok(())
        }
        MysqlCommand::Apply {
            target,
            layout,
            cache,
            seed,
            shards,
            peers,
            new_deployment,
        } => {
            let l = mysql_layout(&layout)?;
            let opts = Options {
                names: target.names()?,
                cache,
                locked: true,
                seed,
                shards,
                peers,
                new_deployment,
                old_server_gone: None,
            };
            conn.run(async |c| {
                let applied = mysql::apply(c, &l, &opts).await?;
                println!(
                    "installed {} ({l}); created or changed: {}",
                    applied.procedure,
                    if applied.installed.is_empty() {
                        "nothing".to_string()
                    } else {
                        applied.installed.join(", ")
                    }
                );
                if applied.one_statement {
                    println!(
                        "ids in one statement: INSERT INTO {} ({}, ...) VALUES (...) RETURNING id (or the OK packet's insert id)",
                        opts.names.table, opts.names.key
                    );
                }
                if applied.clock_running {
                    println!("clock event {} running", opts.names.event());
                }
                for w in &applied.warnings {
                    eprintln!("warning: {w}");
                }
                Ok(())
            })
        }
        MysqlCommand::Adopt {
            target,
            selection,
            layout,
            cache,
            shards,
            peers,
            dry_run,
        } => {
            let l = mysql_layout(&layout)?;
            let opts = mysql::AdoptOptions {
                options: Options {
                    names: target.names()?,
                    cache,
                    locked: true,
                    seed: false,
                    shards,
                    peers,
                    new_deployment: false,
                    old_server_gone: None,
                },
                dry_run,
            };
            if let Some(which) = selection.tables() {
                return conn.run(async |c| {
                    for a in mysql::adopt_tables(c, &l, &opts, &which).await? {
                        if dry_run {
                            println!("plan ({l}): {}: {a}", a.database);
                            print!("{}", a.script);
                        } else {
                            println!("{}: {a}", a.database);
                        }
                        for w in &a.warnings {
                            eprintln!("warning: {}: {w}", a.database);
                        }
                    }
                    if dry_run {
                        println!("dry run: nothing was changed");
                    }
                    Ok(())
                });
            }
            conn.run(async |c| {
                let a = mysql::adopt(c, &l, &opts).await?;
                if dry_run {
                    println!("plan ({l}): {a}");
                    print!("{}", a.script);
                    println!("dry run: nothing was changed");
                    return Ok(());
                }
                println!("{a}");
                if !a.unchanged {
                    println!(
                        "created or changed: {}",
                        if a.installed.is_empty() {
                            "nothing".to_string()
                        } else {
                            a.installed.join(", ")
                        }
                    );
                }
                for w in &a.warnings {
                    eprintln!("warning: {w}");
                }
                Ok(())
            })
        }
        MysqlCommand::Check {
            target,
            selection,
            layout,
            peers,
        } => {
            let l = mysql_layout(&layout)?;
            super::warn_of_lifetime(&l)?;
            let opts = Options {
                names: target.names()?,
                peers,
                ..Options::default()
            };
            if let Some(which) = selection.tables() {
                return conn.run(async |c| {
                    let checked = mysql::check_tables(c, &l, &opts, &which).await?;
                    anyhow::ensure!(
                        !checked.is_empty(),
                        "no table selected by {which} has an AUTO_INCREMENT column id"
                    );
                    let mut problems = 0;
                    for t in &checked {
                        let name = format!("{}.{}", t.database, t.table);
                        for p in &t.problems {
                            println!("{name}: {p}");
                        }
                        problems += t.problems.len();
                        if t.problems.is_empty() {
                            println!("ok: {name}.id as installed for {l}");
                        }
                        if let Some(a) = &t.adopted {
                            println!("adopted: {name}.id, {}", before_adoption(a));
                        }
                    }
                    anyhow::ensure!(problems == 0, "{problems} problem(s)");
                    Ok(())
                });
            }
            conn.run(async |c| {
                let problems = mysql::check(c, &l, &opts).await?;
                if problems.is_empty() {
                    println!(
                        "ok: {}.id and {} as installed for {l}",
                        opts.names.table, opts.names.procedure
                    );
                    for a in mysql::adopted(c).await? {
                        if a.table == opts.names.table {
                            println!("adopted: {}.id, {}", a.table, before_adoption(&a));
                        }
                    }
                    return Ok(());
                }
                for p in &problems {
                    println!("{p}");
                }
                anyhow::bail!("{} problem(s)", problems.len())
            })
        }
        MysqlCommand::Repair {
            target,
            layout,
            shards,
            peers,
            old_server_gone,
        } => {
            let l = mysql_layout(&layout)?;
            let opts = Options {
                names: target.names()?,
                shards,
                peers,
                old_server_gone,
                ..Options::default()
            };
            conn.run(async |c| {
                let r = mysql::repair(c, &l, &opts).await?;
                println!(
                    "repaired {}: its next value is {} (was at {}), recorded as its high-water",
                    opts.names.sequence(),
                    r.to,
                    r.from
                );
                Ok(())
            })
        }
        MysqlCommand::Locate { id, layout } => {
            let l = mysql_layout(&layout)?;
            conn.run(async |c| {
                // An adopted table's old ids carry no time or shard.
                let old: Vec<String> = mysql::adopted(c)
                    .await?
                    .into_iter()
                    .filter(|a| a.before_adoption(id))
                    .map(|a| a.table)
                    .collect();
                if old.is_empty() {
                    return print_id(&l, id);
                }
                println!(
                    "id {id} is from before adoption in {} (at or below its largest old id): it has no time, shard or sequence",
                    old.join(", ")
                );
                Ok(())
            })
        }
        MysqlCommand::Insert {
            user_id,
            count,
            body,
            target,
            layout,
        } => {
            let l = mysql_layout(&layout)?;
            let names = target.names()?;
            conn.run(async |c| {
                for _ in 0..count {
                    print_id(&l, mysql::insert(c, &names, user_id, &body).await?)?;
                }
                Ok(())
            })
        }
        MysqlCommand::Call {
            user_id,
            count,
            flavor,
            target,
            layout,
        } => {
            let l = mysql_layout(&layout)?;
            let procedure = Flavor::from(flavor).procedure(&target.names()?);
            conn.run(async |c| {
                for _ in 0..count {
                    print_id(&l, mysql::generate_post_id(c, &procedure, user_id).await?)?;
                }
                Ok(())
            })
        }
        MysqlCommand::Bench {
            clients,
            rows,
            rounds,
            user_id,
            server_pid,
            cpu_rows,
            cpu_runs,
            layout,
        } => {
            let l = mysql_layout(&layout)?;
            anyhow::ensure!(
                clients > 0 && rows > 0 && rounds > 0,
                "clients, rows and rounds must be > 0"
            );
            let opts = BenchOptions {
                clients,
                rows,
                user_id,
                rounds,
                modes: BenchMode::ALL.to_vec(),
                server_pid,
                cpu_rows,
                cpu_runs,
            };
            let url = conn.url.context("mysql bench needs --url")?;
            runtime()?.block_on(async {
                let pool = mysql::pool(&url)?;
                let report = mysql_bench::bench(&pool, &l, &opts).await?;
                pool.disconnect().await.ok();
                print_report(&report, &opts);
                Ok(())
            })
        }
    }
}

fn print_report(report: &mysql_bench::BenchReport, opts: &BenchOptions) {
    println!("{}\n", report.version);
    let rates_of = |m: BenchMode| -> Vec<f64> { report.of(m).iter().map(|r| r.rate()).collect() };
    let (base, base_text) = (
        rates_of(BenchMode::AutoIncrement),
        rates_of(BenchMode::AutoIncrementText),
    );
    println!(
        "| mode | inserts/s (median) | each round | vs AUTO_INCREMENT, each round | server CPU µs/insert, median (each round) | duplicate ids | id age when the insert returned, max |"
    );
    println!("|---|---:|---|---|---:|---:|---:|");
    for mode in &opts.modes {
        let rs = report.of(*mode);
        let rates: Vec<f64> = rs.iter().map(|r| r.rate()).collect();
        // text against text, the rest against prepared AUTO_INCREMENT
        let base = if *mode == BenchMode::DefaultText {
            &base_text
        } else {
            &base
        };
        let ratios: Vec<String> = rs
            .iter()
            .map(|r| {
                base.get(r.round - 1)
                    .map_or("-".into(), |b| format!("{:.2}x", r.rate() / b))
            })
            .collect();
        let cpu: Vec<f64> = rs.iter().filter_map(|r| r.cpu_per_row_us()).collect();
        let dups: u64 = rs.iter().map(|r| r.duplicates).sum();
        let total: u64 = rs.iter().map(|r| r.rows).sum();
        let lag = rs.iter().filter_map(|r| r.max_lag_ms).max();
        println!(
            "| {} | {:.0} | {} | {} | {} | {} ({:.1}%) | {} |",
            mode.label(),
            median(rates.clone()),
            rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join("/"),
            ratios.join("/"),
            if cpu.is_empty() {
                "-".into()
            } else {
                format!(
                    "{:.1} ({})",
                    median(cpu.clone()),
                    cpu.iter()
                        .map(|c| format!("{c:.1}"))
                        .collect::<Vec<_>>()
                        .join("/")
                )
            },
            dups,
            100.0 * dups as f64 / total.max(1) as f64,
            lag.map_or("-".into(), |l| format!("{l} ms")),
        );
    }
    if let Some(share) = report.clock_cpu_share {
        println!(
            "\nClock event (one loop per sequence): {:.2}% of one CPU over the run.",
            share * 100.0
        );
    }
    if !report.cpu.is_empty() {
        println!(
            "\n| id (one connection, one INSERT ... SELECT of {} rows) | µs CPU per row, each run | median |",
            opts.cpu_rows
        );
        println!("|---|---|---:|");
        for c in &report.cpu {
            println!(
                "| {} | {} | {:.2} |",
                c.mode.label(),
                c.per_row_us
                    .iter()
                    .map(|u| format!("{u:.2}"))
                    .collect::<Vec<_>>()
                    .join("/"),
                median(c.per_row_us.clone())
            );
        }
    }
}

/// What `mysql check` says of an adopted table's old ids.
fn before_adoption(a: &mysql::AdoptedTable) -> String {
    format!(
        "ids below {} from before adoption{}",
        a.first_new,
        a.floor
            .map_or(String::new(), |f| format!(" (the largest {f})"))
    )
}

/// `LO-HI` or one value: the shard values `--shards` of `mysql apply`,
/// `adopt` and `repair` take (one parser, the library's).
fn parse_shards(s: &str) -> Result<(u64, u64), String> {
    sql::parse_shards(s).map_err(|e| e.to_string())
}
