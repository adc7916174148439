//! PostgreSQL DDL generated from a [`Layout`]: pure functions, no server.
//!
//! Every number in the generated SQL (epoch, tick, shifts, masks, shard id)
//! comes from the same [`Layout`] the Rust library decodes with, so the two
//! cannot disagree.
//!
//! # The `next_id(regclass)` function
//!
//! Each sharded table has its own sequence, `<schema>.<table>_id_seq`. Its
//! value is not a plain counter but a *packed* time and sequence,
//! `tick << sequence_bits | sequence`, the two low fields of the id. The id is
//! that value with the shard bits put in place:
//!
//! ```text
//! w  := nextval(seq)                       -- never handed out twice
//! id := (w >> seq_bits) << time_shift | shard << shard_shift | (w & seq_mask)
//! ```
//!
//! so two calls can never make the same id: PostgreSQL sequences never hand
//! out a value twice (even across rollbacks and crashes), and the id is a
//! one-to-one function of that value. More than 2^sequence_bits ids in one
//! tick simply run the packed value into the next tick (the id's time
//! *borrows* the next millisecond) instead of wrapping as Instagram's
//! `nextval() % 1024` does.
//!
//! The clock keeps the packed value honest: when a caller finds the value
//! behind `now`, it catches the sequence up with `setval(seq, now_packed)`.
//! Catch-ups are serialised by an advisory lock and happen about once per
//! tick per busy table.
//!
//! `next_id(seq)` is a `LANGUAGE sql` function whose body is one `SELECT`
//! with no `FROM`, so PostgreSQL *inlines* it into the `INSERT` (no function
//! call, no PL/pgSQL interpreter; `EXPLAIN VERBOSE` shows the expression):
//!
//! ```sql
//! SELECT CASE
//!   WHEN nextval(seq) < now_packed - LAG THEN next_id_slow(seq)  -- behind: catch up
//!   WHEN currval(seq) >= limit THEN next_id_slow(seq)  -- raises
//!   ELSE encode(currval(seq))  -- the common path
//! END
//! ```
//!
//! `CASE` arms run in order, the clock is read after the draw, and
//! `currval` re-reads the value this session just drew. `next_id_slow` is
//! PL/pgSQL: advisory lock, clock, `nextval`, `setval` if still behind,
//! unlock (also on error), encode.
//!
//! Why no id repeats although `setval` is not atomic with other sessions'
//! `nextval`: a caller takes the slow path when its drawn value is more than
//! `LAG` ([`lag_tolerance`], one tick of sequence values) behind its clock,
//! and a catch-up is only made when the value drawn under the lock is at
//! least `LAG + GAP` behind ([`catch_up_gap`], a quarter of a tick's
//! sequence space, 256 for 10 bits). While one session X is between its
//! `nextval` and its `setval` (holding the lock), any other session that
//! draws reads its clock after its draw, hence after X read the clock; its
//! value lies less than `GAP` above X's, so more than `LAG` behind its own
//! clock: it takes the slow path and waits on X's lock. So each other session
//! draws at most one value in X's window, and with fewer than `GAP` sessions
//! (PostgreSQL's `max_connections`; `pg apply` refuses a server with more)
//! none of them reaches X's target. Assumptions: the server's wall clock does
//! not step backwards by more than the lag *during* a catch-up window, and
//! nothing else calls `nextval`/`setval` on the shard's sequences. An id's
//! time may lag the clock by up to about two ticks; it is never ahead of the
//! clock unless more than 2^sequence ids per tick were asked for.
//!
//! Cost, measured in `docs/BENCHMARKS.md` (`scripts/bench-db.sh`, pgbench,
//! 8 clients, prepared): 0.89–0.94x the insert rate of `bigserial` on a
//! shared 2-vCPU machine, against 0.75–0.79x for Instagram's published
//! PL/pgSQL function; the primary-key index is as small as `bigserial`'s.
//! One call costs about 0.8 µs against 0.3 µs for a bare `nextval()`.
//!
//! # The sign bit
//!
//! A layout that uses all 64 bits (Instagram's) makes ids that are negative
//! as `bigint` once the time's top bit is set (2046-06-27 for Instagram).
//! With [`SignBit::Refuse`] (the default) `next_id` raises an error from that
//! tick on rather than break ordering; with [`SignBit::Allow`] it keeps going.
//! Past the layout's last tick it always raises.

use std::fmt::Write as _;

use shardflake::Layout;

use crate::topology::{SignBit, Table, shard_field};

/// Advisory-lock namespace of the catch-up lock: key = `LOCK_BASE + oid` of
/// the sequence ("SF" in the high 32 bits).
pub const LOCK_BASE: i64 = 0x5346 << 32;

/// The schema holding the deployment-wide functions (`decode_id`, `layout`).
pub const DEPLOYMENT_SCHEMA: &str = "shardflake";

/// Version of the generated functions; bumped when their SQL changes.
pub const VERSION: u32 = 1;

/// Errors from SQL generation.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    /// Time and sequence together do not fit a `bigint` sequence.
    #[error("layout {0:?}: time + sequence bits exceed 62, too wide for a PostgreSQL sequence")]
    TooWide(String),
    /// A shard the layout cannot hold.
    #[error("shard {shard} does not fit layout {layout:?}")]
    Shard {
        /// Shard.
        shard: u64,
        /// Layout.
        layout: String,
    },
}

/// Minimum lag, in packed sequence values, before a catch-up `setval`; also
/// the largest number of concurrent sessions the no-repeat argument allows.
pub fn catch_up_gap(layout: &Layout) -> i64 {
    ((1i64 << layout.sequence().bits()) / 4).max(1)
}

/// How far, in packed sequence values, the sequence may lag the clock before
/// a caller catches it up: one tick's worth (2^sequence bits). Halves the
/// catch-ups of a busy table against catching up at every tick, at the price
/// of ids whose time may lag the clock by up to about two ticks.
pub fn lag_tolerance(layout: &Layout) -> i64 {
    1i64 << layout.sequence().bits()
}

/// Tick from which `next_id` raises: the first negative tick under
/// [`SignBit::Refuse`] for sign-bit layouts, else the first tick past the end.
pub fn limit_tick(layout: &Layout, sign_bit: SignBit) -> u64 {
    let time = layout.time();
    if layout.uses_sign_bit() && sign_bit == SignBit::Refuse && time.shift() + time.bits() == 64 {
        1u64 << (time.bits() - 1)
    } else {
        time.max() + 1
    }
}

/// Text stored in every shard's `shardflake_meta()`, compared by `pg check`.
pub fn shard_meta(layout: &Layout, shard: u64, sign_bit: SignBit) -> String {
    let sign = match sign_bit {
        SignBit::Refuse => "refuse",
        SignBit::Allow => "allow",
    };
    format!("v{VERSION}; shard={shard}; sign_bit={sign}; layout={layout}")
}

fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn check(layout: &Layout) -> Result<(), SqlError> {
    if layout.time().bits() + layout.sequence().bits() > 62 {
        return Err(SqlError::TooWide(layout.name().to_string()));
    }
    Ok(())
}

/// The sequence name of a table in a schema.
pub fn table_sequence(schema: &str, table: &str) -> String {
    format!("{schema}.{table}_id_seq")
}

/// `{schema}.next_id('{schema}.{table}_id_seq'::regclass)`: what `{next_id}`
/// in a table template becomes.
pub fn next_id_call(schema: &str, table: &str) -> String {
    format!(
        "{schema}.next_id({}::regclass)",
        lit(&table_sequence(schema, table))
    )
}

/// A table's `CREATE TABLE` from its template.
pub fn table_ddl(schema: &str, table: &Table) -> String {
    table
        .sql
        .replace("{next_id}", &next_id_call(schema, &table.name))
        .replace("{schema}", schema)
}

/// Schema, sequences and functions of one logical shard (not the tables),
/// idempotent (`IF NOT EXISTS`, `CREATE OR REPLACE`).
pub fn shard_ddl(
    layout: &Layout,
    schema: &str,
    shard: u64,
    sign_bit: SignBit,
    tables: &[Table],
) -> Result<String, SqlError> {
    check(layout)?;
    let shard_f = shard_field(layout);
    if shard > shard_f.max() {
        return Err(SqlError::Shard {
            shard,
            layout: layout.name().to_string(),
        });
    }
    let mut out = String::new();
    let _ = writeln!(out, "CREATE SCHEMA IF NOT EXISTS {schema};");
    let _ = writeln!(out, "CREATE SEQUENCE IF NOT EXISTS {schema}.id_seq;");
    for t in tables {
        let _ = writeln!(
            out,
            "CREATE SEQUENCE IF NOT EXISTS {};",
            table_sequence(schema, &t.name)
        );
    }
    out.push_str(&next_id_function(layout, schema, shard, sign_bit));
    let _ = writeln!(
        out,
        "CREATE OR REPLACE FUNCTION {schema}.next_id() RETURNS bigint\n\
         LANGUAGE sql VOLATILE AS $f$ SELECT {schema}.next_id('{schema}.id_seq'::regclass) $f$;"
    );
    let _ = writeln!(
        out,
        "CREATE OR REPLACE FUNCTION {schema}.shardflake_meta() RETURNS text\n\
         LANGUAGE sql IMMUTABLE AS $f$ SELECT {}::text $f$;",
        lit(&shard_meta(layout, shard, sign_bit))
    );
    Ok(out)
}

/// The `next_id(seq regclass)` function of one shard (see the module docs).
pub fn next_id_function(layout: &Layout, schema: &str, shard: u64, sign_bit: SignBit) -> String {
    let seq_bits = layout.sequence().bits();
    let seq_shift = layout.sequence().shift();
    let time_shift = layout.time().shift();
    let shard_bits = (shard << shard_field(layout).shift()) as i64;
    let limit = (limit_tick(layout, sign_bit) as i64) << seq_bits;
    let limit_ms = layout.tick_to_unix_ms(limit_tick(layout, sign_bit));
    let why = if limit_tick(layout, sign_bit) <= layout.max_tick() {
        format!(
            "ids of layout {} would be negative as bigint from {} (sign_bit = refuse)",
            layout.name(),
            shardflake::timestamp::rfc3339_ms(limit_ms)
        )
    } else {
        format!(
            "layout {} cannot represent times from {}",
            layout.name(),
            shardflake::timestamp::rfc3339_ms(limit_ms)
        )
    };
    let tick_expr = if layout.tick_ms() == 1 {
        format!(
            "(floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - {})",
            layout.epoch_ms()
        )
    } else {
        format!(
            "((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - {}) / {})",
            layout.epoch_ms(),
            layout.tick_ms()
        )
    };
    let part = |w: &str| {
        let seq_part = if seq_shift == 0 {
            format!("({w} & {})", layout.sequence().max())
        } else {
            format!("(({w} & {}) << {seq_shift})", layout.sequence().max())
        };
        format!("(({w} >> {seq_bits}) << {time_shift}) | {shard_bits} | {seq_part}")
    };
    format!(
        "CREATE OR REPLACE FUNCTION {schema}.next_id_slow(seq regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $f$
-- shardflake: {layout}, shard {shard}. Generated; do not edit.
-- next_id's slow path: the sequence is behind the clock (or at the limit).
DECLARE
  w bigint;  -- packed (tick << {seq_bits}) | sequence, from the table's sequence
  t bigint;  -- the clock, packed the same way
BEGIN
  -- Catch up, one session at a time (see the shardflake-db docs).
  PERFORM pg_advisory_lock({LOCK_BASE} + seq::oid::bigint);
  BEGIN
    t := {tick_expr} << {seq_bits};
    w := nextval(seq);
    IF w + {lag} + {gap} <= t THEN
      PERFORM setval(seq, t);
      w := t;
    END IF;
  EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM pg_advisory_unlock({LOCK_BASE} + seq::oid::bigint);
    RAISE;
  END;
  PERFORM pg_advisory_unlock({LOCK_BASE} + seq::oid::bigint);
  IF w >= {limit} THEN
    RAISE EXCEPTION USING ERRCODE = 'SF002', MESSAGE = {why_lit};
  END IF;
  RETURN {slow_part};
END
$f$;
CREATE OR REPLACE FUNCTION {schema}.next_id(seq regclass) RETURNS bigint
LANGUAGE sql VOLATILE AS $f$
  -- shardflake: {layout}, shard {shard}. Generated; do not edit.
  -- One SELECT with no FROM: PostgreSQL inlines it into the INSERT (no
  -- function call). The CASE arms run in order: draw, compare with the clock
  -- read after the draw, then currval() re-reads this session's drawn value.
  SELECT CASE
    WHEN nextval(seq) < ({tick_expr} << {seq_bits}) - {lag} THEN {schema}.next_id_slow(seq)
    WHEN currval(seq) >= {limit} THEN {schema}.next_id_slow(seq)
    ELSE {fast_part}
  END
$f$;
",
        gap = catch_up_gap(layout),
        lag = lag_tolerance(layout),
        why_lit = lit(&why),
        slow_part = part("w"),
        fast_part = part("currval(seq)"),
    )
}

/// Deployment-wide functions in schema `shardflake`: `decode_id(id)` and
/// `layout()`. The same on every server of a deployment.
pub fn deployment_ddl(layout: &Layout) -> Result<String, SqlError> {
    check(layout)?;
    let s = DEPLOYMENT_SCHEMA;
    let t = layout.time();
    let q = layout.sequence();
    let sh = shard_field(layout);
    let time = format!(
        "(((id >> {}) & {}) * {} + {})",
        t.shift(),
        t.max(),
        layout.tick_ms(),
        layout.epoch_ms()
    );
    let mut out = String::new();
    let _ = writeln!(out, "CREATE SCHEMA IF NOT EXISTS {s};");
    let _ = writeln!(
        out,
        "CREATE OR REPLACE FUNCTION {s}.decode_id(id bigint,
  OUT unix_ms bigint, OUT ts timestamptz, OUT shard integer, OUT sequence integer)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
  SELECT {time}, to_timestamp({time} / 1000.0),
         ((id >> {}) & {})::integer, ((id >> {}) & {})::integer
$f$;",
        sh.shift(),
        sh.max(),
        q.shift(),
        q.max()
    );
    let _ = writeln!(
        out,
        "CREATE OR REPLACE FUNCTION {s}.layout() RETURNS text
LANGUAGE sql IMMUTABLE AS $f$ SELECT {}::text $f$;",
        lit(&layout.to_string())
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake::preset;

    #[test]
    fn instagram_next_id_numbers() {
        let l = preset::by_name("instagram").unwrap();
        let f = next_id_function(&l, "shard5", 5, SignBit::Refuse);
        // packed value = tick << 10 | seq; id = tick << 23 | 5 << 10 | seq
        assert!(f.contains("- 1314220021721) << 10"), "{f}");
        assert!(f.contains("((w >> 10) << 23) | 5120 | (w & 1023)"), "{f}");
        assert!(
            f.contains("((currval(seq) >> 10) << 23) | 5120 | (currval(seq) & 1023)"),
            "{f}"
        );
        // refuse from tick 2^40 (2046-06-27)
        assert!(
            f.contains(&format!("IF w >= {}", (1i64 << 40) << 10)),
            "{f}"
        );
        assert!(f.contains("2046-06-27"), "{f}");
        assert!(f.contains("w + 1024 + 256 <= t"), "{f}");
        assert!(
            f.contains(") << 10) - 1024 THEN shard5.next_id_slow(seq)"),
            "{f}"
        );
        let allow = next_id_function(&l, "shard5", 5, SignBit::Allow);
        assert!(allow.contains(&format!("IF w >= {}", (1i64 << 41) << 10)));
    }

    #[test]
    fn mysql_layout_and_no_int4_overflow() {
        let l = preset::by_name("mysql-procedure").unwrap();
        let f = next_id_function(&l, "s", 1023, SignBit::Refuse);
        assert!(
            f.contains("((w >> 10) << 20) | 1047552 | (w & 1023)"),
            "{f}"
        );
        // every shift applies to a bigint: w, t and the casted clock
        assert!(f.contains("::bigint -"));
        assert!(!l.uses_sign_bit());
        assert!(f.contains(&format!("IF w >= {}", (1i64 << 43) << 10)));
    }

    #[test]
    fn decode_and_templates() {
        let l = preset::by_name("instagram").unwrap();
        let d = deployment_ddl(&l).unwrap();
        assert!(
            d.contains("(((id >> 23) & 2199023255551) * 1 + 1314220021721)"),
            "{d}"
        );
        assert!(d.contains("((id >> 10) & 8191)::integer, ((id >> 0) & 1023)::integer"));
        let t = Table {
            name: "posts".into(),
            sql: "CREATE TABLE {schema}.posts (id bigint DEFAULT {next_id})".into(),
        };
        assert_eq!(
            table_ddl("shard7", &t),
            "CREATE TABLE shard7.posts (id bigint DEFAULT shard7.next_id('shard7.posts_id_seq'::regclass))"
        );
        let ddl = shard_ddl(&l, "shard7", 7, SignBit::Refuse, &[t]).unwrap();
        assert!(ddl.contains("CREATE SEQUENCE IF NOT EXISTS shard7.posts_id_seq;"));
        assert!(ddl.contains("v1; shard=7; sign_bit=refuse; layout=instagram"));
        assert!(shard_ddl(&l, "x", 9000, SignBit::Refuse, &[]).is_err());
    }
}
