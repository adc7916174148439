//! `shardflake pg ...`: ids made inside PostgreSQL, per logical shard
//! (the work is in the `shardflake-db` crate; this only parses and prints).

use std::path::PathBuf;

use anyhow::Context;
use clap::Subcommand;
use shardflake::Id;
use shardflake_db::pg::{self, Topology, move_shard, route, sql};

/// Topology file option shared by every `pg` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct TopologyArg {
    /// Topology file (TOML): layout, logical shards, servers, table templates.
    #[arg(
        long,
        short,
        global = true,
        default_value = "shardflake.toml",
        env = "SHARDFLAKE_TOPOLOGY"
    )]
    pub topology: PathBuf,
}

impl TopologyArg {
    fn load(&self) -> anyhow::Result<Topology> {
        if !self.topology.exists() {
            anyhow::bail!(
                "reading topology {}: no such file; pass -t FILE (before or after the subcommand) or set SHARDFLAKE_TOPOLOGY",
                self.topology.display()
            );
        }
        Ok(Topology::load(&self.topology)?)
    }
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    topology: TopologyArg,
    #[command(subcommand)]
    command: PgCommand,
}

#[derive(Debug, Subcommand)]
enum PgCommand {
    /// Create (idempotently) every shard's schema, sequence, next_id() and
    /// tables on its server, after checking the file against what every
    /// server records (refused, with what to do, if they disagree).
    Apply {
        /// A server added to the file, with no records yet (repeatable): a
        /// server without records is refused unless named here, so an
        /// edited url never recreates its shards on another database.
        #[arg(long = "new-server", value_name = "NAME")]
        new_servers: Vec<String>,
        /// The file is a new deployment, separate from any that another
        /// database of a server's cluster records (their ids may be
        /// equal): without it, that first apply is refused as a url
        /// changed to another database.
        #[arg(long = "new-deployment")]
        new_deployment: bool,
    },
    /// Report drift between the servers and the topology (exit 1 if any).
    Check,
    /// After restoring a dump: move each shard's sequence past every id it
    /// handed out before, so that ids resume (a restored shard refuses ids
    /// until then).
    Repair {
        /// Only this logical shard.
        #[arg(long)]
        shard: Option<u64>,
        /// This server of the file replaces the database the deployment
        /// records its shards on (a dump of it restored into another
        /// cluster): record the database its URL reaches now as theirs on
        /// every server, after fencing the old copy for good (--old-url,
        /// or --old-copy-gone).
        #[arg(long, value_name = "SERVER")]
        replaces: Vec<String>,
        /// The URL that reaches the copy --replaces replaces (the server's
        /// url before), one per --replaces, in the same order: repair
        /// checks it is the recorded database and fences its shards for
        /// good before the replacement serves; refused if it does not
        /// answer.
        #[arg(long, value_name = "URL", requires = "replaces")]
        old_url: Vec<String>,
        /// The copies --replaces replaces are gone for good (the database
        /// destroyed, or its server stopped never to take writes again):
        /// repair reaches none of them, on your word. One still running
        /// would make the replacement's ids too. Names the system
        /// identifier of each database the deployment records those
        /// shards on (given none, the refusal lists them and what each
        /// is).
        #[arg(
            long,
            value_name = "SYSID",
            num_args = 0..,
            value_delimiter = ',',
            requires = "replaces",
            conflicts_with = "old_url"
        )]
        old_copy_gone: Option<Vec<i64>>,
    },
    /// Which logical shard, schema and server a sharding key lives on.
    Route {
        /// Sharding key (e.g. a user id).
        key: u64,
    },
    /// Which shard and server made an id, and its time and sequence.
    Locate {
        /// Id as stored (signed bigint).
        #[arg(allow_hyphen_values = true)]
        id: i64,
    },
    /// Move a logical shard to another server: copy, brief write pause,
    /// switch the topology file, drop the old copy. Run again to finish a
    /// move that was stopped; --abort to undo one.
    MoveShard {
        /// Logical shard to move.
        shard: u64,
        /// Destination server (its name in the topology).
        #[arg(long, required_unless_present = "abort")]
        to: Option<String>,
        /// Keep the old (fenced) copy instead of dropping it.
        #[arg(long)]
        keep_source: bool,
        /// Undo a move of the shard that did not go live on its destination.
        #[arg(long, conflicts_with_all = ["to", "keep_source"])]
        abort: bool,
        /// Stop after this step as if killed there (for fault tests).
        #[arg(long, hide = true, env = "SHARDFLAKE_MOVE_STOP_AFTER")]
        stop_after: Option<move_shard::MoveStep>,
    },
    /// Range partitions of a table by day, week or month of its ids: print
    /// them, or create the missing ones on every shard with --apply
    /// (idempotent). Drop an old period with DROP TABLE of its partition.
    Partitions {
        /// The table (in the topology's [[tables]], PARTITION BY RANGE (id)).
        #[arg(long)]
        table: String,
        /// Period of one partition.
        #[arg(long, value_enum, default_value_t = PeriodArg::Day)]
        by: PeriodArg,
        /// First period: the one holding this time (RFC 3339, now, -7d).
        #[arg(long, default_value = "now", allow_hyphen_values = true)]
        from: String,
        /// How many periods from --from on.
        #[arg(long, default_value_t = 7)]
        count: u32,
        /// Create the missing partitions instead of printing them.
        #[arg(long)]
        apply: bool,
    },
    /// Switch existing tables' id column (bigserial, identity or DEFAULT
    /// nextval) to a shard's next_id() while the application keeps
    /// writing: every new id above every old one, the old sequence kept.
    /// Running it again changes nothing.
    Adopt {
        /// One table (schema.table).
        #[arg(long, group = "adopt_target")]
        table: Option<String>,
        /// Every table of this schema that has the column.
        #[arg(long, group = "adopt_target")]
        schema: Option<String>,
        /// Every table whose schema.table matches this SQL LIKE pattern.
        #[arg(long, group = "adopt_target")]
        pattern: Option<String>,
        /// The id column.
        #[arg(long, default_value = "id")]
        column: String,
        /// Only this server of the file (default: every server).
        #[arg(long)]
        server: Option<String>,
        /// The logical shard the tables draw from (default: each server's
        /// lowest); refused for tables on a server that does not hold it.
        #[arg(long)]
        shard: Option<u64>,
        /// Print the plan and the SQL; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print the generated SQL (deployment functions, and one shard's schema).
    Sql {
        /// Shard whose schema to print (default: the first).
        #[arg(long)]
        shard: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum PeriodArg {
    Day,
    Week,
    Month,
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let t = args.topology;
    let topology = &t;
    match args.command {
        PgCommand::Apply {
            new_servers,
            new_deployment,
        } => {
            let topo = t.load()?;
            let opts = pg::ApplyOptions {
                new_servers,
                new_deployment,
            };
            for applied in runtime()?.block_on(pg::apply_with(&topo, &opts))? {
                println!("{applied}");
            }
            Ok(())
        }
        PgCommand::Check => {
            let topo = t.load()?;
            let rt = runtime()?;
            super::warn_of_lifetime(topo.layout())?;
            let drift = rt.block_on(pg::check(&topo))?;
            for a in rt.block_on(pg::adopted(&topo))? {
                println!(
                    "adopted: {}: {}.{} draws from shard {}{}",
                    a.server,
                    a.table,
                    a.column,
                    a.shard,
                    a.floor.map_or(String::new(), |f| format!(
                        ", ids up to {f} from before adoption"
                    ))
                );
            }
            if drift.is_empty() {
                println!("ok: {topo}, deployed as in {}", t.topology.display());
                return Ok(());
            }
            for d in &drift {
                println!("{d}");
            }
            anyhow::bail!(
                "{} difference(s) between the servers and {}",
                drift.len(),
                t.topology.display()
            )
        }
        PgCommand::Route { key } => {
            let topo = topology.load()?;
            let r = route::route_key(&topo, key)?;
            println!(
                "key {key} -> shard {} (schema {}) on server {} ({})",
                r.shard, r.schema, r.server, r.url
            );
            Ok(())
        }
        PgCommand::Locate { id } => {
            let topo = topology.load()?;
            // An adopted table's old ids carry no time or shard.
            let old: Vec<_> = runtime()?
                .block_on(pg::adopted(&topo))?
                .into_iter()
                .filter(|a| a.before_adoption(id))
                .collect();
            if !old.is_empty() {
                let tables: Vec<String> = old
                    .iter()
                    .map(|a| format!("{}.{} on server {}", a.table, a.column, a.server))
                    .collect();
                println!(
                    "id {id} is from before adoption in {} (at or below its largest old id): it has no time, shard or sequence",
                    tables.join(", ")
                );
                return Ok(());
            }
            let r = route::locate(&topo, id)?;
            let parts = Id(id as u64).decode(topo.layout())?;
            println!(
                "id {id} -> shard {} (schema {}) on server {} ({}); time {}, sequence {}",
                r.shard,
                r.schema,
                r.server,
                r.url,
                parts.timestamp(),
                parts.sequence
            );
            Ok(())
        }
        PgCommand::Repair {
            shard,
            replaces,
            old_url,
            old_copy_gone,
        } => {
            let topo = topology.load()?;
            let replaces = replacements(replaces, old_url, old_copy_gone)?;
            let repaired = runtime()?.block_on(pg::repair_replacing(&topo, shard, &replaces))?;
            for r in &replaces {
                match &r.old {
                    pg::OldCopy::Url(_) => println!(
                        "{}: the copy it replaces (--old-url) is fenced for good: it makes no id",
                        r.server
                    ),
                    pg::OldCopy::Gone(systems) => println!(
                        "{}: the copies it replaces were not reached (--old-copy-gone {}): they must never take writes again",
                        r.server,
                        systems
                            .iter()
                            .map(ToString::to_string)
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                }
            }
            for u in &repaired.undone {
                println!("{u}");
            }
            for r in &repaired.repaired {
                println!("{r}");
            }
            for l in &repaired.left_behind {
                println!("{l}");
            }
            println!(
                "repaired {} shard(s); new ids wait until the clock is within {} ms of them",
                repaired.repaired.len(),
                sql::AHEAD_MS
            );
            Ok(())
        }
        PgCommand::MoveShard {
            shard, abort: true, ..
        } => {
            let at = runtime()?.block_on(move_shard::abort_move(&topology.topology, shard))?;
            println!("undid the move of shard {shard}: it stays on {at}");
            Ok(())
        }
        PgCommand::MoveShard {
            shard,
            to,
            keep_source,
            stop_after,
            ..
        } => {
            let to = to.context("--to is required")?;
            let opts = move_shard::MoveOptions {
                keep_source,
                stop_after,
            };
            let report = runtime()?.block_on(move_shard::move_shard(
                &topology.topology,
                shard,
                &to,
                &opts,
            ))?;
            let rows: Vec<String> = report
                .rows
                .iter()
                .map(|(t, n)| format!("{t} {n}"))
                .collect();
            if let Some(step) = report.resumed_after {
                println!(
                    "finished a move that had stopped after step {:?}",
                    step.name()
                );
            }
            println!(
                "moved shard {} from {} to {}: rows [{}] ({} bulk, {} during the pause); writes paused {:.1} ms; old copy {}",
                report.shard,
                report.from,
                report.to,
                rows.join(", "),
                report.bulk_rows,
                report.delta_rows,
                report.paused.as_secs_f64() * 1000.0,
                if report.dropped_source {
                    "dropped"
                } else {
                    "kept (fenced)"
                }
            );
            Ok(())
        }
        PgCommand::Partitions {
            table,
            by,
            from,
            count,
            apply,
        } => {
            use shardflake_db::pg::partitions::{self, Period};
            let topo = t.load()?;
            let now = shardflake::Clock::now_ms(&shardflake::SystemClock);
            let from_ms = shardflake::timestamp::parse_time(&from, now).with_context(|| {
                format!("--from {from:?} is not a time: use RFC 3339, now, or -7d")
            })?;
            let period = match by {
                PeriodArg::Day => Period::Day,
                PeriodArg::Week => Period::Week,
                PeriodArg::Month => Period::Month,
            };
            let parts = partitions::partitions(topo.layout(), period, from_ms, count)?;
            if !apply {
                for server in topo.servers() {
                    for &shard in &server.shards {
                        print!(
                            "{}",
                            partitions::partitions_sql(&topo.schema(shard), &table, &parts)
                        );
                    }
                }
                return Ok(());
            }
            for (server, created) in
                runtime()?.block_on(partitions::apply_partitions(&topo, &table, &parts))?
            {
                println!("{server}: {created} partitions created");
            }
            Ok(())
        }
        PgCommand::Adopt {
            table,
            schema,
            pattern,
            column,
            server,
            shard,
            dry_run,
        } => {
            let topo = topology.load()?;
            let target = match (table, schema, pattern) {
                (Some(t), None, None) => pg::Target::Table(t),
                (None, Some(s), None) => pg::Target::Schema(s),
                (None, None, Some(p)) => pg::Target::Pattern(p),
                _ => anyhow::bail!("name the tables to adopt: --table, --schema or --pattern"),
            };
            let opts = pg::AdoptOptions {
                target,
                column,
                server,
                shard,
                dry_run,
            };
            let done = runtime()?.block_on(pg::adopt(&topo, &opts))?;
            for a in &done {
                if dry_run && !a.unchanged {
                    println!("-- would adopt: {a}");
                    print!("{}", a.script());
                } else {
                    println!("{a}");
                }
            }
            let changed = done.iter().filter(|a| !a.unchanged).count();
            if dry_run {
                println!("dry run: {changed} table(s) to adopt, nothing changed");
            } else {
                println!("adopted {changed} table(s)");
            }
            Ok(())
        }
        PgCommand::Sql { shard } => {
            let topo = topology.load()?;
            let shard = shard.unwrap_or(0);
            topo.server_of(shard)?;
            let schema = topo.schema(shard);
            println!("-- deployment-wide (every server)");
            print!("{}", sql::deployment_ddl(topo.layout())?);
            println!("\n-- logical shard {shard}");
            print!(
                "{}",
                sql::shard_schema_ddl(topo.layout(), &schema, topo.sign_bit())
            );
            println!(
                "-- pg apply names the sequence by its oid, so that a restored shard is refused"
            );
            print!(
                "{}",
                sql::shard_ddl(
                    topo.layout(),
                    &schema,
                    shard,
                    topo.sign_bit(),
                    sql::SeqOid::ByName
                )?
            );
            for t in topo.tables() {
                println!("{};", sql::table_ddl(&schema, t));
            }
            Ok(())
        }
    }
}

/// Pairs each `--replaces` with its `--old-url`, in order, or with
/// `--old-copy-gone`: a replacement names where the copy it replaces is.
fn replacements(
    servers: Vec<String>,
    old_urls: Vec<String>,
    gone: Option<Vec<i64>>,
) -> anyhow::Result<Vec<pg::Replacement>> {
    if let Some(systems) = gone {
        return Ok(servers
            .into_iter()
            .map(|server| pg::Replacement {
                server,
                old: pg::OldCopy::Gone(systems.clone()),
            })
            .collect());
    }
    if old_urls.len() != servers.len() {
        let names = servers.join(", ");
        anyhow::bail!(
            "pg repair --replaces {names}: {} --old-url for {} --replaces. The replacement fences the copy it replaces, so that the two never both make ids: give the url that reaches each old copy (the url its server had before) with --old-url URL, one per --replaces, in the same order; only if the old copies are destroyed or their servers stopped for good, --old-copy-gone instead",
            old_urls.len(),
            servers.len()
        );
    }
    Ok(servers
        .into_iter()
        .zip(old_urls)
        .map(|(server, url)| pg::Replacement {
            server,
            old: pg::OldCopy::Url(url),
        })
        .collect())
}
