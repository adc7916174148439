//! `shardflake mysql ...`: the MariaDB/MySQL `generate_post_id` procedure.

use anyhow::Context;
use clap::Subcommand;
use shardflake::Id;
use shardflake_db::mysql::{self, Flavor};

use super::LayoutArg;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: MysqlCommand,
}

#[derive(Debug, Clone, clap::Args)]
struct Conn {
    /// Server URL, e.g. mysql://root@127.0.0.1:3306/app.
    #[arg(long, env = "SHARDFLAKE_MYSQL_URL")]
    url: String,
    /// Use the seed's original procedure (racy; for comparison only).
    #[arg(long)]
    seed: bool,
}

#[derive(Debug, Subcommand)]
enum MysqlCommand {
    /// Install the `sequences` table and `generate_post_id` (replacing it).
    Apply {
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// Call the procedure as the seed's ORM does; print the ids and decode them.
    Call {
        /// Sharding key (user id); the shard is user_id % 2^shard_bits.
        user_id: i64,
        /// How many ids.
        #[arg(long, short = 'n', default_value_t = 1)]
        count: usize,
        #[command(flatten)]
        conn: Conn,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// Print the generated procedure.
    Sql {
        /// Print the seed's procedure instead.
        #[arg(long)]
        seed: bool,
        #[command(flatten)]
        layout: LayoutArg,
    },
    /// AUTO_INCREMENT vs the seed's procedure vs ours, N clients sharing one
    /// user id; counts duplicate ids. Creates tables post_auto/post_seed/post_ours.
    Bench {
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Rows per client per mode.
        #[arg(long, default_value_t = 2000)]
        rows: u64,
        #[arg(long, default_value_t = 1801)]
        user_id: i64,
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

fn flavor(seed: bool) -> Flavor {
    if seed { Flavor::Seed } else { Flavor::Ours }
}

fn procedure_layout(layout: &LayoutArg) -> anyhow::Result<shardflake::Layout> {
    // The `--layout` option defaults to snowflake for the other commands;
    // here the seed's mysql-procedure layout is the natural default.
    let spec = if layout.layout == "snowflake" {
        "mysql-procedure"
    } else {
        &layout.layout
    };
    let l = shardflake::preset::resolve(spec)?;
    anyhow::ensure!(
        l.field("shard").is_some(),
        "layout {} has no \"shard\" field; the procedure needs one",
        l.name()
    );
    Ok(l)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    match args.command {
        MysqlCommand::Sql { seed, layout } => {
            let l = procedure_layout(&layout)?;
            let f = flavor(seed);
            println!("{}\n", mysql::sequences_sql(f.sequence()));
            let p = if seed {
                mysql::seed_procedure_sql(f.procedure(), f.sequence())
            } else {
                mysql::procedure_sql(&l, f.procedure(), f.sequence())
            };
            println!("DELIMITER //\n{p} //\nDELIMITER ;");
            Ok(())
        }
        MysqlCommand::Apply { conn, layout } => {
            let l = procedure_layout(&layout)?;
            runtime()?.block_on(async {
                let pool = mysql::pool(&conn.url)?;
                let mut c = pool.get_conn().await.context("connecting")?;
                mysql::install(&mut c, &l, flavor(conn.seed)).await?;
                drop(c);
                pool.disconnect().await.ok();
                println!("installed {} ({})", flavor(conn.seed).procedure(), l);
                Ok(())
            })
        }
        MysqlCommand::Call {
            user_id,
            count,
            conn,
            layout,
        } => {
            let l = procedure_layout(&layout)?;
            runtime()?.block_on(async {
                let pool = mysql::pool(&conn.url)?;
                let mut c = pool.get_conn().await.context("connecting")?;
                for _ in 0..count {
                    let id = mysql::generate_post_id(&mut c, flavor(conn.seed), user_id).await?;
                    let p = Id(id as u64).decode(&l)?;
                    println!(
                        "{id} time {} shard {} sequence {}",
                        p.timestamp(),
                        p.field("shard").unwrap_or_default(),
                        p.sequence
                    );
                }
                drop(c);
                pool.disconnect().await.ok();
                Ok(())
            })
        }
        MysqlCommand::Bench {
            url,
            clients,
            rows,
            user_id,
            layout,
        } => {
            let l = procedure_layout(&layout)?;
            runtime()?.block_on(async {
                let pool = mysql::pool(&url)?;
                let results = mysql::bench(&pool, &l, clients, rows, user_id).await?;
                pool.disconnect().await.ok();
                let base = results[0].rate();
                println!("| mode | rows | inserts/s | vs AUTO_INCREMENT | duplicate ids |");
                println!("|---|---:|---:|---:|---:|");
                for r in &results {
                    println!(
                        "| {} | {} | {:.0} | {:.2}x | {} ({:.1}%) |",
                        r.mode,
                        r.rows,
                        r.rate(),
                        r.rate() / base,
                        r.duplicates,
                        r.duplicate_rate() * 100.0
                    );
                }
                Ok(())
            })
        }
    }
}
