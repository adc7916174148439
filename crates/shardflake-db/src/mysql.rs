//! The MariaDB/MySQL variant (MISSION.md §2.3): a `sequences` table and a
//! `generate_post_id(IN user_id, OUT post_id)` procedure, called from Rust
//! the way the seed's JPA `IdentifierGenerator` calls it
//! (`CALL generate_post_id(?, @post_id)`, then read `@post_id`).
//!
//! The seed's procedure reads `next_val` with a `SELECT` and increments it in
//! a second statement, with no lock: two callers in the same millisecond can
//! read the same value and return the same id; and `next_val % 1024` wraps
//! after 1024 ids in one millisecond. Ours ([`procedure_sql`]) does both in
//! one atomic statement on the row:
//!
//! ```sql
//! UPDATE sequences SET next_val = LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))
//!  WHERE name = 'post_seq';
//! ```
//!
//! `next_val` holds the last packed `tick << sequence_bits | sequence` handed
//! out; the row lock makes the read-modify-write atomic and
//! `LAST_INSERT_ID(expr)` hands the new value back to this session only. The
//! value always grows, so ids never repeat; more than 2^sequence ids in one
//! millisecond borrow the next one. Every number comes from the [`Layout`].

use std::time::{Duration, Instant};

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Pool};
use shardflake::Layout;

use crate::Error;
use crate::topology::SHARD_FIELD;

fn my(context: &str) -> impl FnOnce(mysql_async::Error) -> Error + '_ {
    move |source| Error::Mysql {
        context: context.to_string(),
        source,
    }
}

/// `CREATE TABLE sequences` as in the seed (idempotent), and its row.
pub fn sequences_sql(sequence: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS sequences (\n    name     varchar(32) PRIMARY KEY,\n    next_val BIGINT NOT NULL DEFAULT 1\n);\n\
         INSERT IGNORE INTO sequences (name) VALUES ('{sequence}');"
    )
}

/// The seed's procedure, verbatim except for its name and sequence name
/// (kept to show its duplicates; do not use it).
pub fn seed_procedure_sql(name: &str, sequence: &str) -> String {
    format!(
        "CREATE PROCEDURE {name}(IN user_id BIGINT, OUT post_id BIGINT)
BEGIN
    SET @service_start_time = UNIX_TIMESTAMP('2023-01-01 00:00:00.000');
    SET @shard_count = 1024;
    SET @sequence_name = '{sequence}';

    SET post_id = (
            FLOOR((UNIX_TIMESTAMP(NOW(3)) - @service_start_time) * 1000) << 20 |
            (user_id % @shard_count) << 10
        );

    SET post_id = post_id | (SELECT next_val % 1024 FROM sequences WHERE name = @sequence_name);
    UPDATE sequences SET next_val = next_val + 1 WHERE name = @sequence_name;
END"
    )
}

/// Our race-free `generate_post_id`, generated from `layout` (which needs a
/// `shard` field; the shard is `user_id % 2^shard_bits`).
pub fn procedure_sql(layout: &Layout, name: &str, sequence: &str) -> String {
    let seq = layout.sequence();
    let time = layout.time();
    let shard = layout
        .field(SHARD_FIELD)
        .expect("layout with a shard field");
    let limit: i64 = ((time.max() as i64) + 1) << seq.bits();
    let limit = if layout.uses_sign_bit() {
        ((1i64) << (time.bits() - 1)) << seq.bits()
    } else {
        limit
    };
    let tick = if layout.tick_ms() == 1 {
        String::new()
    } else {
        format!(" DIV {}", layout.tick_ms())
    };
    format!(
        "CREATE PROCEDURE {name}(IN user_id BIGINT, OUT post_id BIGINT)
BEGIN
    -- shardflake: {layout}. Generated; do not edit.
    DECLARE now_packed BIGINT;
    DECLARE w BIGINT;
    IF user_id IS NULL OR user_id < 0 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'generate_post_id: user_id must be >= 0';
    END IF;
    SET now_packed = ((CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) - {epoch}){tick}) << {seq_bits};
    UPDATE sequences SET next_val = LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))
     WHERE name = '{sequence}';
    IF ROW_COUNT() <> 1 THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'generate_post_id: no row {sequence} in sequences';
    END IF;
    SET w = LAST_INSERT_ID();
    IF w >= {limit} THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'generate_post_id: time out of the layout''s range';
    END IF;
    SET post_id = ((w >> {seq_bits}) << {time_shift})
                | ((user_id % {shards}) << {shard_shift})
                | ((w & {seq_mask}) << {seq_shift});
END",
        epoch = layout.epoch_ms(),
        seq_bits = seq.bits(),
        time_shift = time.shift(),
        shards = 1u64 << shard.bits(),
        shard_shift = shard.shift(),
        seq_mask = seq.max(),
        seq_shift = seq.shift(),
    )
}

/// Which procedure to install or call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// The seed's, verbatim: `generate_post_id_seed`, sequence `post_seq_seed`.
    Seed,
    /// Ours: `generate_post_id`, sequence `post_seq`.
    Ours,
}

impl Flavor {
    /// Procedure name.
    pub fn procedure(self) -> &'static str {
        match self {
            Flavor::Seed => "generate_post_id_seed",
            Flavor::Ours => "generate_post_id",
        }
    }
    /// Row in `sequences`.
    pub fn sequence(self) -> &'static str {
        match self {
            Flavor::Seed => "post_seq_seed",
            Flavor::Ours => "post_seq",
        }
    }
}

/// Connects a pool to `url` (`mysql://root@127.0.0.1:3306/db`).
pub fn pool(url: &str) -> Result<Pool, Error> {
    let opts = Opts::from_url(url).map_err(|e| Error::Mysql {
        context: format!("bad url {url:?}"),
        source: e.into(),
    })?;
    Ok(Pool::new(opts))
}

/// Installs the `sequences` table and the procedure (replacing it).
pub async fn install(conn: &mut Conn, layout: &Layout, flavor: Flavor) -> Result<(), Error> {
    conn.query_drop(sequences_sql(flavor.sequence()))
        .await
        .map_err(my("creating sequences"))?;
    conn.query_drop(format!("DROP PROCEDURE IF EXISTS {}", flavor.procedure()))
        .await
        .map_err(my("dropping the old procedure"))?;
    let sql = match flavor {
        Flavor::Seed => seed_procedure_sql(flavor.procedure(), flavor.sequence()),
        Flavor::Ours => procedure_sql(layout, flavor.procedure(), flavor.sequence()),
    };
    conn.query_drop(sql)
        .await
        .map_err(my("creating the procedure"))
}

/// Calls the procedure as the seed's ORM id generator does: IN `user_id`,
/// OUT `post_id`, read back from the session variable.
pub async fn generate_post_id(conn: &mut Conn, flavor: Flavor, user_id: i64) -> Result<i64, Error> {
    conn.exec_drop(
        format!("CALL {}(?, @shardflake_post_id)", flavor.procedure()),
        (user_id,),
    )
    .await
    .map_err(my("calling the procedure"))?;
    let id: Option<i64> = conn
        .query_first("SELECT @shardflake_post_id")
        .await
        .map_err(my("reading @post_id"))?;
    id.ok_or_else(|| Error::Mysql {
        context: "reading @post_id".into(),
        source: mysql_async::Error::Other("procedure returned NULL".into()),
    })
}

/// Result of one benchmark mode.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// `auto_increment`, `seed procedure` or `shardflake procedure`.
    pub mode: String,
    /// Rows attempted.
    pub rows: u64,
    /// Rows rejected as duplicate keys (`INSERT IGNORE`).
    pub duplicates: u64,
    /// Wall time.
    pub elapsed: Duration,
}

impl BenchResult {
    /// Inserts per second.
    pub fn rate(&self) -> f64 {
        self.rows as f64 / self.elapsed.as_secs_f64()
    }
    /// Fraction of rows whose id was a duplicate.
    pub fn duplicate_rate(&self) -> f64 {
        self.duplicates as f64 / self.rows.max(1) as f64
    }
}

/// Inserts `rows_per_client` posts from each of `clients` connections, all
/// for the same user id (as the seed's test does), in three modes:
/// `AUTO_INCREMENT`, the seed's procedure + insert, ours + insert. Ids go
/// into a primary key with `INSERT IGNORE`, so duplicates are counted, not
/// fatal. Installs tables and procedures first.
pub async fn bench(
    pool: &Pool,
    layout: &Layout,
    clients: usize,
    rows_per_client: u64,
    user_id: i64,
) -> Result<Vec<BenchResult>, Error> {
    let mut c = pool.get_conn().await.map_err(my("connecting"))?;
    install(&mut c, layout, Flavor::Seed).await?;
    install(&mut c, layout, Flavor::Ours).await?;
    c.query_drop(
        "DROP TABLE IF EXISTS post_auto, post_seed, post_ours;
         CREATE TABLE post_auto (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE post_seed (id BIGINT PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;
         CREATE TABLE post_ours (id BIGINT PRIMARY KEY, user_id BIGINT NOT NULL, body VARCHAR(64)) ENGINE=InnoDB;",
    )
    .await
    .map_err(my("creating bench tables"))?;
    drop(c);
    let mut out = Vec::new();
    for (mode, flavor) in [
        ("auto_increment", None),
        ("seed procedure", Some(Flavor::Seed)),
        ("shardflake procedure", Some(Flavor::Ours)),
    ] {
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = pool.get_conn().await.map_err(my("connecting"))?;
                let mut dups = 0u64;
                for _ in 0..rows_per_client {
                    let affected = match flavor {
                        None => {
                            c.exec_drop(
                                "INSERT INTO post_auto (user_id, body) VALUES (?, 'hello')",
                                (user_id,),
                            )
                            .await
                            .map_err(my("insert"))?;
                            c.affected_rows()
                        }
                        Some(f) => {
                            let id = generate_post_id(&mut c, f, user_id).await?;
                            let table = if f == Flavor::Seed { "post_seed" } else { "post_ours" };
                            c.exec_drop(
                                format!("INSERT IGNORE INTO {table} (id, user_id, body) VALUES (?, ?, 'hello')"),
                                (id, user_id),
                            )
                            .await
                            .map_err(my("insert"))?;
                            c.affected_rows()
                        }
                    };
                    if affected == 0 {
                        dups += 1;
                    }
                }
                Ok::<u64, Error>(dups)
            }));
        }
        let mut duplicates = 0;
        for t in tasks {
            duplicates += t.await.map_err(|e| Error::Mysql {
                context: "bench task".into(),
                source: mysql_async::Error::Other(e.to_string().into()),
            })??;
        }
        out.push(BenchResult {
            mode: mode.to_string(),
            rows: rows_per_client * clients as u64,
            duplicates,
            elapsed: start.elapsed(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake::preset;

    #[test]
    fn generated_from_layout() {
        let l = preset::by_name("mysql-procedure").unwrap();
        let p = procedure_sql(&l, "generate_post_id", "post_seq");
        assert!(p.contains("- 1672531200000)) << 10"), "{p}");
        assert!(p.contains("((w >> 10) << 20)"));
        assert!(p.contains("((user_id % 1024) << 10)"));
        assert!(p.contains("((w & 1023) << 0)"));
        assert!(p.contains("LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))"));
        assert!(p.contains(&format!("IF w >= {}", (1i64 << 43) << 10)));
        let seed = seed_procedure_sql("generate_post_id", "post_seq");
        assert!(seed.contains("SELECT next_val % 1024 FROM sequences"));
    }
}
