//! PostgreSQL DDL generated from a [`Layout`]: pure functions, no server.
//!
//! Every number in the generated SQL (epoch, tick, shifts, masks, shard id)
//! comes from the same [`Layout`] the Rust library decodes with, so the two
//! cannot disagree.
//!
//! # The `next_id(regclass)` function
//!
//! Each shard has one sequence, `<schema>.id_seq`, which every table's
//! default and `<schema>.next_id()` draw from (two sequences of one shard
//! would hand out the same values, hence the same ids). Its
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
//! far behind `now`, it catches the sequence up with `setval(seq, now_packed)`.
//!
//! `next_id(seq)` is a `LANGUAGE sql` function whose body is one `SELECT`
//! with no `FROM`, so PostgreSQL *inlines* it into the `INSERT` (no function
//! call, no PL/pgSQL interpreter; `EXPLAIN VERBOSE` shows the expression):
//!
//! ```sql
//! SELECT CASE
//!   WHEN nextval(seq) < now_packed - LAG THEN next_id_slow(seq)  -- behind
//!   ELSE encode(currval(seq))  -- the common path
//! END
//! ```
//!
//! `CASE` arms run in order, the clock is read after the draw, and
//! `currval` re-reads the value this session just drew. Each sequence has
//! `MAXVALUE` just below the layout's limit ([`sequence_max`]), so a drawn
//! value always makes a valid id and the fast path needs no range check.
//!
//! `next_id_slow` (PL/pgSQL) looks at the value `w` this session drew
//! (`currval`) against a fresh clock reading:
//!
//! - **Far behind** (`w + LAG + GAP <= clock`): take the sequence's advisory
//!   lock (exclusive, waiting), read the clock `t`, draw `w'`; if
//!   `w' + LAG + GAP <= t` still, `setval(seq, t)` and return `t` (raising
//!   `SF002` first if `t` is past the layout's limit), else return `w'`;
//!   unlock. So a caller that arrives far behind always leaves with a value
//!   near the clock, even after an idle table (or a fresh one, at 1).
//! - **In the band** (between `LAG` and `LAG + GAP` behind):
//!   `pg_advisory_lock_shared` then `pg_advisory_unlock_shared` in one
//!   statement, which waits out a catch-up in progress and nothing else,
//!   then return its own draw `w`: no second `nextval`, no queue.
//!
//! Errors (a cancel while waiting included) release whatever the session
//! holds of the lock, looked up in `pg_locks`, and re-raise. Only callers
//! that cross `LAG + GAP` while one catch-up runs queue behind it; a busy
//! table catches up about once per `LAG` ([`LAG_MS`]), and callers in the
//! band (a quarter of a tick per catch-up) run a short PL/pgSQL call.
//!
//! **Why no value is handed out twice**, although `setval` is not atomic
//! with other sessions' `nextval`. `LAG` is [`lag_tolerance`], `GAP` is
//! [`catch_up_gap`] (a quarter of a tick's sequence space: 256 for 10 bits),
//! `N` the number of sessions. Values come from `nextval` (fast path: no
//! lock; far-behind path: under the exclusive lock) and from `setval(t)`
//! (returned as `t`, under the exclusive lock). Take a catch-up by X: X
//! holds the lock exclusively from before its clock read `t` until after
//! its `setval(t)`, and drew `w'` in between with `w' + LAG + GAP <= t`;
//! the *window* is from that draw to the `setval`. A value repeats only if
//! some value `>= t` was drawn before the `setval` (later draws are `> t`).
//! Before the window all draws are `< w'`. In the window only X holds the
//! lock, so no one else sets, and the other draws are fast-path draws
//! `w'+1, w'+2, ...` in order. Let Y draw `v < w' + GAP` in the window. Y
//! reads its clock after its draw, hence after X read `t`, so (clock not
//! stepping back) Y's clock is at least `t`, and
//! `v + LAG < w' + GAP + LAG <= t`: Y is behind by more than `LAG` and calls
//! `next_id_slow`, which waits on X's lock (exclusive or shared, either way
//! until X unlocks, after the `setval`): Y draws nothing more in the window.
//! So the draws below `w' + GAP` in the window come from distinct sessions
//! other than X, at most `N - 1` of them; the first draw to reach
//! `w' + GAP` would be the `GAP`-th, which needs `N > GAP`. With `N < GAP`
//! (`pg apply` and `pg check` require `max_connections +
//! max_worker_processes < GAP`) every value drawn before the `setval` is
//! below `w' + GAP <= t - LAG`: `t` and every later draw are fresh.
//! Assumptions: the server's wall clock does not step backwards during a
//! catch-up window (microseconds: a draw and a `setval` under the lock); a
//! step back outside windows only makes ids' times lag; nothing but
//! `next_id` calls `nextval`/`setval` on a shard's sequences (a move sets
//! them under locks no draw can pass, see [`crate::pg::move_shard`]); the
//! sequences have `INCREMENT 1`, `CACHE 1`, `NO CYCLE` (`pg apply` sets
//! them, `pg check` reports others); and all sessions run the same
//! version of the functions (upgrade with `pg apply` while writes to the
//! server are paused).
//!
//! An id's time may lag the clock by up to about `LAG + GAP` (4.25 ms for
//! Instagram's layout); it is never ahead of the clock unless more than
//! 2^sequence ids per tick were asked for.
//!
//! Cost, measured in `docs/BENCHMARKS.md` (`scripts/bench-db.sh`, pgbench,
//! 8 clients, prepared), against `bigserial` in the same run: 0.87–0.99x
//! per round on a loaded 2-vCPU machine (v1: 0.89–0.94x); CPU of one
//! backend per inserted row, +0.5 µs over `bigserial`'s 1.9 µs (v1: +1.0
//! µs), the slow path taken by 1.5% of calls. In isolation
//! (one session, 1,000,000 calls in one `SELECT`) the fast path costs
//! `nextval` (about 0.6 µs), the clock expression (0.4 µs) and two
//! `currval` (0.1 µs each).
//!
//! # What the fast path also tests, for free or nearly
//!
//! - **The sequence it was built for.** `next_id` carries the oid of the
//!   shard's sequence as read by `pg apply`; its first `CASE` arm compares
//!   the argument's oid with it. The argument is a constant
//!   (`'shard5.id_seq'::regclass`), so the planner folds the arm away. A
//!   shard restored from a dump has a new sequence under the old function:
//!   the arm raises `SF003` until `pg repair`, instead of handing out again
//!   the values drawn after the dump.
//! - **How far ahead of the clock.** The fast path's band is `clock - LAG
//!   <= w <= clock + AHEAD` ([`AHEAD_MS`]), one `abs()` of the draw minus
//!   the clock; a draw further ahead takes the slow path, which waits until
//!   the clock is within `AHEAD` of it (more than twice `AHEAD` ahead, the
//!   clock stepped back: `SF004`). So no value ever handed out exceeds the
//!   clock plus `AHEAD`, which is what `pg repair` sets a restored sequence
//!   past.
//!
//! # The sign bit
//!
//! A layout that uses all 64 bits (Instagram's) makes ids that are negative
//! as `bigint` once the time's top bit is set (2046-06-27 for Instagram).
//! With [`SignBit::Refuse`] (the default) `next_id` raises an error from that
//! tick on rather than break ordering; with [`SignBit::Allow`] it keeps going.
//! Past the layout's last tick it always raises. The error is `SF002` from
//! the catch-up, or `2200H` ("reached maximum value of sequence") should the
//! sequence itself reach its `MAXVALUE` first; [`crate::pg_message`] explains
//! the latter.

use std::fmt::Write as _;

use shardflake::Layout;

use super::topology::{SignBit, Table, shard_field};
use crate::{SQLSTATE_RESTARTED, SQLSTATE_RESTORED};

/// Advisory-lock namespace of the catch-up lock: key = `LOCK_BASE + oid` of
/// the sequence ("SF" in the high 32 bits).
pub const LOCK_BASE: i64 = 0x5346 << 32;

/// The schema holding the deployment-wide functions (`decode_id`, `layout`).
pub const DEPLOYMENT_SCHEMA: &str = "shardflake";

/// Version of the generated functions; bumped when their SQL changes.
pub const VERSION: u32 = 4;

/// How far, in milliseconds, a shard sequence may run ahead of the clock
/// (bursts of more than 2^sequence ids per tick borrow later ticks): a draw
/// further ahead waits until the clock is within this of it. So every value
/// ever handed out is at most `clock + AHEAD_MS` (clock not stepping back),
/// which is the high-water `pg repair` sets a restored shard past.
pub const AHEAD_MS: u64 = 1000;

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
/// a caller catches it up: the ticks of [`LAG_MS`] (at least one tick). A
/// busy table catches up about once per `LAG_MS` instead of once per tick;
/// the price is ids whose time may lag the clock by up to about that much.
pub fn lag_tolerance(layout: &Layout) -> i64 {
    let ticks = (LAG_MS / layout.tick_ms().max(1)).max(1) as i64;
    ticks << layout.sequence().bits()
}

/// [`AHEAD_MS`] in packed sequence values (at least one tick), rounded so
/// that it plus [`lag_tolerance`] is even (the fast path tests the band
/// between them as a midpoint and a half width).
pub fn lead_bound(layout: &Layout) -> i64 {
    let ticks = (AHEAD_MS / layout.tick_ms().max(1)).max(1) as i64;
    let ahead = ticks << layout.sequence().bits();
    ahead - ((ahead + lag_tolerance(layout)) & 1)
}

/// The lag tolerance of [`lag_tolerance`], in milliseconds.
pub const LAG_MS: u64 = 4;

/// The largest value a shard sequence may hand out (its `MAXVALUE`): the
/// packed value just below [`limit_tick`]. `nextval` past it fails (SQLSTATE
/// `2200H`), so no id at or past the limit is ever made.
pub fn sequence_max(layout: &Layout, sign_bit: SignBit) -> i64 {
    ((limit_tick(layout, sign_bit) as i64) << layout.sequence().bits()) - 1
}

/// Options every shard sequence must have for the no-repeat argument:
/// `ALTER SEQUENCE` to them (idempotent).
pub fn sequence_options(layout: &Layout, sign_bit: SignBit) -> String {
    format!(
        "INCREMENT 1 CACHE 1 NO CYCLE MAXVALUE {}",
        sequence_max(layout, sign_bit)
    )
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

/// Whether the SQL can make the layout's ids as the library does.
pub(crate) fn check(layout: &Layout) -> Result<(), SqlError> {
    if layout.time().bits() + layout.sequence().bits() > 62 {
        return Err(SqlError::TooWide(layout.name().to_string()));
    }
    Ok(())
}

/// The per-table sequence of versions before 3 (`<table>_id_seq`): two
/// sequences of one shard make the same ids, so `pg apply` moves such a
/// table onto the shard's one sequence and `pg check` reports one left.
pub fn table_sequence(schema: &str, table: &str) -> String {
    format!("{schema}.{table}_id_seq")
}

/// The one id sequence of a shard: every table's default and
/// `{schema}.next_id()` draw from it, so no two calls in a shard can make
/// one id (two sequences would hand out the same packed values).
pub fn shard_sequence(schema: &str) -> String {
    format!("{schema}.id_seq")
}

/// `{schema}.next_id('{schema}.id_seq'::regclass)`: what `{next_id}` in a
/// table template becomes.
pub fn next_id_call(schema: &str) -> String {
    format!(
        "{schema}.next_id({}::regclass)",
        lit(&shard_sequence(schema))
    )
}

/// A table's `CREATE TABLE` from its template.
pub fn table_ddl(schema: &str, table: &Table) -> String {
    table
        .sql
        .replace("{next_id}", &next_id_call(schema))
        .replace("{schema}", schema)
}

/// Schema and sequence of one logical shard, idempotent (`IF NOT EXISTS`).
pub fn shard_schema_ddl(layout: &Layout, schema: &str, sign_bit: SignBit) -> String {
    format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};\nCREATE SEQUENCE IF NOT EXISTS {} {};\n",
        shard_sequence(schema),
        sequence_options(layout, sign_bit)
    )
}

/// The functions of one logical shard (`CREATE OR REPLACE`), for the
/// sequence whose oid is `seq_oid` (see [`next_id_function`]).
pub fn shard_ddl(
    layout: &Layout,
    schema: &str,
    shard: u64,
    sign_bit: SignBit,
    seq_oid: SeqOid,
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
    out.push_str(&next_id_function(layout, schema, shard, sign_bit, seq_oid));
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

/// Which sequence a shard's `next_id(seq)` accepts, and on which run of
/// the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeqOid {
    /// The oid of the shard's sequence, read on the server: a restored
    /// shard (a new sequence, a new oid, the old function) is refused with
    /// `SF003` until `pg repair`.
    Oid(u32),
    /// [`SeqOid::Oid`], and only on the run of the server that `pg apply`
    /// or `pg repair` read ([`ServerRun`]): after a restart or WAL
    /// recovery (a crash, a promoted standby, a base backup restored)
    /// every id is refused with `SF005` until `pg repair`.
    Vouched {
        /// The sequence's oid.
        oid: u32,
        /// The run of the server the ids are vouched for.
        run: ServerRun,
    },
    /// Looked up by name when a statement is planned (`pg sql`'s printout:
    /// it cannot tell a restored sequence).
    ByName,
}

/// One run of a PostgreSQL server: when its postmaster started and how
/// far it had replayed WAL when it began taking writes. Both are set once
/// per start (the replay position when a start recovers from WAL: after a
/// crash, a promotion, a restore from a base backup; none after a clean
/// start) and read for the cost of a function call each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerRun {
    /// `pg_postmaster_start_time()` in UTC, ISO 8601 to the microsecond
    /// (`2026-11-27T18:53:17.994030Z`: read the same whatever the
    /// session's `DateStyle` and `TimeZone`).
    pub started: String,
    /// `pg_last_wal_replay_lsn()` as text, `None` after a clean start.
    pub replayed: Option<String>,
}

impl ServerRun {
    /// SQL that reads the current run: two text columns.
    pub const QUERY: &'static str = "SELECT to_char(pg_postmaster_start_time() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), pg_last_wal_replay_lsn()::text";

    /// The test `next_id` makes before each draw: true when the server is
    /// not on this run any more. Both literals are constants of the plan,
    /// so each id costs two function calls and two comparisons (measured:
    /// about 70 ns of a backend's 1.8 us per inserted row; the start time
    /// as a number instead cost 220 ns).
    pub fn changed_sql(&self) -> String {
        let replayed = match &self.replayed {
            Some(lsn) => format!("IS DISTINCT FROM {}::pg_lsn", lit(lsn)),
            None => "IS NOT NULL".to_string(),
        };
        format!(
            "pg_postmaster_start_time() <> {}::timestamptz OR pg_last_wal_replay_lsn() {replayed}",
            lit(&self.started)
        )
    }
}

/// The layout's random start in `next_id_slow`'s catch-up (empty without
/// one): the tick caught up to starts its sequence at a random value below
/// 2^bits instead of 0, so that `id % N` is not skewed at low rates. Only
/// the catch-up starts a tick (a busy sequence runs on from the value it
/// reached), and every value drawn before the `setval` is below `t` (see
/// the module docs), so starting above `t` repeats none; the last ticks
/// before `max` start lower rather than past it.
fn random_start_sql(layout: &Layout, max: i64) -> String {
    match layout.random_start_bits() {
        0 => String::new(),
        bits => format!(
            "\n        -- The layout's random start: this tick's first value.\n        t := LEAST(t + floor(random() * {})::bigint, {max});",
            1u64 << bits
        ),
    }
}

/// The `next_id(seq regclass)` function of one shard (see the module docs).
pub fn next_id_function(
    layout: &Layout,
    schema: &str,
    shard: u64,
    sign_bit: SignBit,
    seq_oid: SeqOid,
) -> String {
    let seq_bits = layout.sequence().bits();
    let seq_shift = layout.sequence().shift();
    let time_shift = layout.time().shift();
    let shard_bits = (shard << shard_field(layout).shift()) as i64;
    let max = sequence_max(layout, sign_bit);
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
    let ms = "floor(date_part('epoch', clock_timestamp()) * 1000)::bigint";
    let (epoch, tick) = (layout.epoch_ms(), layout.tick_ms());
    let lag = lag_tolerance(layout);
    let gap = catch_up_gap(layout);
    let ahead = lead_bound(layout);
    // The clock, packed like the sequence (tick << seq_bits), and the fast
    // path's band `clock - LAG <= w <= clock + AHEAD` as |w - base - mid| <=
    // half (one draw, one clock reading), with the epoch folded into `mid`
    // where the Unix ms shifted by the sequence bits fits a bigint (to year
    // 9999).
    const MS_YEAR_10000: i128 = 253_402_300_800_000;
    let folded_epoch = (epoch as i128) << seq_bits;
    let fold = tick == 1
        && (MS_YEAR_10000 << seq_bits) <= i64::MAX as i128
        && folded_epoch + lag as i128 <= i64::MAX as i128;
    let half = (ahead + lag) / 2;
    let (clock, base, mid) = if fold {
        (
            format!("(({ms} - {epoch}) << {seq_bits})"),
            format!("({ms} << {seq_bits})"),
            (ahead - lag) / 2 - folded_epoch as i64,
        )
    } else {
        let ticks = if tick == 1 {
            format!("({ms} - {epoch})")
        } else {
            format!("(({ms} - {epoch}) / {tick})")
        };
        let packed = format!("({ticks} << {seq_bits})");
        (packed.clone(), packed, (ahead - lag) / 2)
    };
    let part = |w: &str| {
        let seq_part = if seq_shift == 0 {
            format!("({w} & {})", layout.sequence().max())
        } else {
            format!("(({w} & {}) << {seq_shift})", layout.sequence().max())
        };
        format!("(({w} >> {seq_bits}) << {time_shift}) | {shard_bits} | {seq_part}")
    };
    let lock_class = LOCK_BASE >> 32;
    let (oid, oid_text, run) = match seq_oid {
        SeqOid::Oid(oid) => (format!("{oid}::oid"), oid.to_string(), None),
        SeqOid::Vouched { oid, run } => (format!("{oid}::oid"), oid.to_string(), Some(run)),
        SeqOid::ByName => (
            format!("{}::regclass::oid", lit(&shard_sequence(schema))),
            "looked up by name".to_string(),
            None,
        ),
    };
    // After a restart or WAL recovery the server cannot tell whether a
    // standby was promoted in its place, or (promoted itself) whether its
    // sequence is behind ids its old primary handed out: no id until
    // `pg repair` vouches for the new run. Two cheap calls per id.
    let run_arm = match &run {
        Some(run) => format!(
            "\n    WHEN {} THEN {schema}.next_id_restarted(seq)",
            run.changed_sql()
        ),
        None => String::new(),
    };
    let restarted = lit(&format!(
        "shard {shard}: this server restarted or replayed WAL (a crash, a promoted standby, a restore from a base backup) since pg apply or pg repair last vouched for its ids, so it makes none: a standby may have been promoted in its place, or its sequence may be behind ids already handed out. Run shardflake pg repair (it refuses a server whose clock is off); but if a standby was promoted in place of this server, this is the old primary: do not repair it, retire it or rebuild it as a standby (pg_rewind)"
    ));
    let refused = lit(&format!(
        "is not the sequence shard {shard}'s next_id() was made for ({}, oid {oid_text}): the shard was restored from a dump or its sequence was recreated; run shardflake pg repair before writing to it",
        shard_sequence(schema)
    ));
    format!(
        "CREATE OR REPLACE FUNCTION {schema}.next_id_slow(seq regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $f$
-- shardflake: {layout}, shard {shard}. Generated; do not edit.
-- next_id's slow path: this session's drawn value (currval) is LAG or more
-- behind the clock, or more than AHEAD ahead of it. See the shardflake-db
-- docs for why no id repeats.
DECLARE
  w bigint := currval(seq);  -- packed (tick << {seq_bits}) | sequence
  t bigint;                  -- the clock, packed the same way
  k bigint := {LOCK_BASE} + seq::oid::bigint;
BEGIN
  BEGIN
    IF w + {lag} + {gap} <= {clock} THEN
      -- Far behind: catch the sequence up, one session at a time; a session
      -- that finds it caught up draws a fresh value.
      PERFORM pg_advisory_lock(k);
      t := {clock};
      IF t > {max} THEN
        RAISE EXCEPTION USING ERRCODE = 'SF002', MESSAGE = {why_lit};
      END IF;
      w := nextval(seq);
      IF w + {lag} + {gap} <= t THEN{random_start}
        PERFORM setval(seq, t);
        w := t;
      END IF;
      PERFORM pg_advisory_unlock(k);
    ELSIF w + {lag} < {clock} THEN
      -- Less than LAG + GAP behind: wait out a catch-up in progress, then
      -- keep the value drawn (no second draw).
      PERFORM pg_advisory_lock_shared(k), pg_advisory_unlock_shared(k);
    ELSE
      -- Ahead: wait until the clock is within AHEAD of the value drawn, so
      -- no value is ever more than AHEAD ahead of the clock (what pg repair
      -- relies on). Twice AHEAD ahead, the clock stepped back: refuse.
      t := {clock};
      WHILE w - t > {ahead} LOOP
        IF w - t > {ahead2} THEN
          RAISE EXCEPTION USING ERRCODE = 'SF004', MESSAGE = {ahead_lit};
        END IF;
        PERFORM pg_sleep((((w - t - {ahead}) >> {seq_bits}) * {tick} + 1) / 1000.0);
        t := {clock};
      END LOOP;
    END IF;
  EXCEPTION WHEN OTHERS OR query_canceled THEN
    -- Release what this session holds of the lock (even one granted while
    -- the wait was being cancelled), then re-raise.
    PERFORM CASE WHEN l.mode = 'ExclusiveLock' THEN pg_advisory_unlock(k) ELSE pg_advisory_unlock_shared(k) END
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
       AND l.classid = {lock_class} AND l.objid = seq::oid AND l.objsubid = 1;
    RAISE;
  END;
  RETURN {slow_part};
END
$f$;
CREATE OR REPLACE FUNCTION {schema}.next_id_refused(seq regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_RESTORED}', MESSAGE = seq::text || ' ' || {refused};
END
$f$;
CREATE OR REPLACE FUNCTION {schema}.next_id_restarted(seq regclass) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $f$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_RESTARTED}', MESSAGE = {restarted};
END
$f$;
CREATE OR REPLACE FUNCTION {schema}.next_id(seq regclass) RETURNS bigint
LANGUAGE sql VOLATILE AS $f$
  -- shardflake: {layout}, shard {shard}, sequence oid {oid_text}. Generated; do not edit.
  -- One SELECT with no FROM: PostgreSQL inlines it into the INSERT (no
  -- function call), and folds the sequence test away (its argument is a
  -- constant). The CASE runs in order: draw, compare with the clock read
  -- after the draw, then currval() re-reads this session's drawn value.
  SELECT CASE
    WHEN seq::oid <> {oid} THEN {schema}.next_id_refused(seq){run_arm}
    WHEN abs(nextval(seq) - {base} - ({mid})) <= {half} THEN {fast_part}
    ELSE {schema}.next_id_slow(seq)
  END
$f$;
",
        why_lit = lit(&why),
        ahead2 = 2 * ahead,
        ahead_lit = lit(&format!(
            "shard {shard}'s sequence runs more than {} ms ahead of the server clock: did the clock step back (or run ahead while ids were made)? ids resume once it is within {AHEAD_MS} ms; `shardflake pg check` says when",
            2 * AHEAD_MS
        )),
        random_start = random_start_sql(layout, max),
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
    out.push_str(&time_functions_ddl(layout));
    Ok(out)
}

/// Ids by time in schema `shardflake`, the SQL twins of
/// [`Layout::min_id_at`], [`Layout::max_id_at`], [`Layout::id_range`] and
/// the decoded time: `tick_at(unix_ms)`, `min_id_at(t)`, `max_id_at(t)`,
/// `id_range(from, to)` (half-open, both ids included; a range that crosses
/// into negative ids has `first_id > last_id`) and `id_time(id)`. A time
/// outside the layout's life, or a layout with a field above time, raises
/// `22008`. Declared `IMMUTABLE` so `WHERE id >= shardflake.min_id_at(...)`
/// is folded to a constant and scans the primary key's index.
pub fn time_functions_ddl(layout: &Layout) -> String {
    let s = DEPLOYMENT_SCHEMA;
    let t = layout.time();
    let name = lit(layout.name());
    let epoch = layout.epoch_ms();
    // Beyond i64 no timestamptz reaches: the check never fires there.
    let end = i64::try_from(layout.end_of_life_ms()).unwrap_or(i64::MAX);
    let on_top = t.shift() + t.bits() == layout.total_bits();
    let low = (1u64 << t.shift()) - 1;
    let top_refusal = if on_top {
        String::new()
    } else {
        format!(
            "  RAISE EXCEPTION 'shardflake: layout % has a field above its time field, so a span of time is not one range of ids', {name}
    USING ERRCODE = '22008', HINT = 'use a layout with time as its top field';\n"
        )
    };
    format!(
        "CREATE OR REPLACE FUNCTION {s}.tick_at(unix_ms bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $f$
BEGIN
{top_refusal}  IF unix_ms < {epoch} THEN
    RAISE EXCEPTION 'shardflake: % ms is before layout %''s epoch {epoch} ms', unix_ms, {name}
      USING ERRCODE = '22008', HINT = 'give a time at or after the epoch';
  END IF;
  IF unix_ms >= {end} THEN
    RAISE EXCEPTION 'shardflake: % ms is at or after layout %''s end of life {end} ms', unix_ms, {name}
      USING ERRCODE = '22008', HINT = 'give an earlier time';
  END IF;
  RETURN (unix_ms - {epoch}) / {tick};
END $f$;
CREATE OR REPLACE FUNCTION {s}.min_id_at(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
  SELECT {s}.tick_at(floor(extract(epoch FROM t) * 1000)::bigint) << {shift}
$f$;
CREATE OR REPLACE FUNCTION {s}.max_id_at(t timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
  SELECT ({s}.tick_at(floor(extract(epoch FROM t) * 1000)::bigint) << {shift}) | {low}
$f$;
CREATE OR REPLACE FUNCTION {s}.id_range(from_t timestamptz, to_t timestamptz,
  OUT first_id bigint, OUT last_id bigint)
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $f$
DECLARE
  from_ms bigint := floor(extract(epoch FROM from_t) * 1000)::bigint;
  -- The span is half-open: its last millisecond is the one before to_t.
  last_ms bigint := ceil(extract(epoch FROM to_t) * 1000)::bigint - 1;
BEGIN
  IF from_t >= to_t THEN
    RAISE EXCEPTION 'shardflake: the span % .. % is empty', from_t, to_t
      USING ERRCODE = '22008', HINT = 'from must be before to';
  END IF;
  first_id := {s}.tick_at(from_ms) << {shift};
  last_id := ({s}.tick_at(last_ms) << {shift}) | {low};
END $f$;
CREATE OR REPLACE FUNCTION {s}.id_time(id bigint) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $f$
  SELECT 'epoch'::timestamptz + (((id >> {shift}) & {max}) * {tick} + {epoch}) * interval '1 millisecond'
$f$;
",
        tick = layout.tick_ms(),
        shift = t.shift(),
        max = t.max(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake::preset;

    #[test]
    fn a_random_start_starts_the_tick_caught_up_to() {
        let l = preset::resolve(
            "r: time 41 | shard 13 | sequence 10 (epoch 1314220021721 ms, random start 4 bits)",
        )
        .unwrap();
        deployment_ddl(&l).unwrap();
        let ddl = shard_ddl(&l, "shard1", 1, SignBit::Refuse, SeqOid::ByName).unwrap();
        let max = sequence_max(&l, SignBit::Refuse);
        assert!(
            ddl.contains(&format!(
                "t := LEAST(t + floor(random() * 16)::bigint, {max});"
            )),
            "{ddl}"
        );
        // Without one, the catch-up sets the tick's first value, 0.
        let plain = preset::resolve("instagram").unwrap();
        let ddl = shard_ddl(&plain, "shard1", 1, SignBit::Refuse, SeqOid::ByName).unwrap();
        assert!(!ddl.contains("random()"), "{ddl}");
    }

    #[test]
    fn instagram_next_id_numbers() {
        let l = preset::by_name("instagram").unwrap();
        let f = next_id_function(&l, "shard5", 5, SignBit::Refuse, SeqOid::Oid(16400));
        // packed value = tick << 10 | seq; id = tick << 23 | 5 << 10 | seq
        assert!(f.contains("- 1314220021721) << 10"), "{f}");
        assert!(f.contains("((w >> 10) << 23) | 5120 | (w & 1023)"), "{f}");
        assert!(
            f.contains("((currval(seq) >> 10) << 23) | 5120 | (currval(seq) & 1023)"),
            "{f}"
        );
        // refuse from tick 2^40 (2046-06-27): the sequence stops just below
        let max = ((1i64 << 40) << 10) - 1;
        assert_eq!(sequence_max(&l, SignBit::Refuse), max);
        assert!(f.contains(&format!("IF t > {max} THEN")), "{f}");
        assert!(f.contains("2046-06-27"), "{f}");
        // lag 4 ticks (4 ms), gap 256
        assert_eq!(lag_tolerance(&l), 4096);
        assert!(f.contains("w + 4096 + 256 <= t"), "{f}");
        // the fast path's band: clock - 4 ms <= w <= clock + 1000 ms, as
        // |w - (ms << 10) - mid| <= half with the epoch folded into mid
        let (ahead, lag) = (1000i64 << 10, 4096);
        assert_eq!(lead_bound(&l), ahead);
        let mid = (ahead - lag) / 2 - (1314220021721i64 << 10);
        assert!(
            f.contains(&format!(
                "::bigint << 10) - ({mid})) <= {} THEN ((currval(seq)",
                (ahead + lag) / 2
            )),
            "{f}"
        );
        // the restore guard: only the sequence the function was made for
        assert!(f.contains("WHEN seq::oid <> 16400::oid THEN shard5.next_id_refused(seq)"));
        assert!(f.contains("sequence oid 16400."), "{f}");
        assert!(f.contains("ELSE shard5.next_id_slow(seq)"), "{f}");
        assert!(!f.contains("currval(seq) >="), "no range check: MAXVALUE");
        assert_eq!(sequence_max(&l, SignBit::Allow), ((1i64 << 41) << 10) - 1);
    }

    #[test]
    fn a_vouched_next_id_refuses_another_run_of_the_server() {
        let l = preset::by_name("instagram").unwrap();
        let run = |replayed: Option<&str>| ServerRun {
            started: "2026-11-27T18:53:17.994030Z".into(),
            replayed: replayed.map(Into::into),
        };
        let vouched = |r| SeqOid::Vouched { oid: 16400, run: r };
        let f = next_id_function(&l, "shard5", 5, SignBit::Refuse, vouched(run(None)));
        // After the oid test, before the draw: a new run draws nothing.
        assert!(
            f.contains(
                "WHEN seq::oid <> 16400::oid THEN shard5.next_id_refused(seq)\n    \
                 WHEN pg_postmaster_start_time() <> '2026-11-27T18:53:17.994030Z'::timestamptz \
                 OR pg_last_wal_replay_lsn() IS NOT NULL THEN shard5.next_id_restarted(seq)\n    \
                 WHEN abs(nextval(seq)"
            ),
            "{f}"
        );
        assert!(f.contains("ERRCODE = 'SF005'"), "{f}");
        let f = next_id_function(&l, "s", 5, SignBit::Refuse, vouched(run(Some("0/1500800"))));
        assert!(
            f.contains("pg_last_wal_replay_lsn() IS DISTINCT FROM '0/1500800'::pg_lsn THEN"),
            "{f}"
        );
        let f = next_id_function(&l, "s", 5, SignBit::Refuse, SeqOid::Oid(16400));
        assert!(!f.contains("WHEN pg_postmaster_start_time()"), "{f}");
    }

    #[test]
    fn mysql_layout_and_no_int4_overflow() {
        let l = preset::by_name("mysql-procedure").unwrap();
        let f = next_id_function(&l, "s", 1023, SignBit::Refuse, SeqOid::ByName);
        assert!(
            f.contains("((w >> 10) << 20) | 1047552 | (w & 1023)"),
            "{f}"
        );
        // every shift applies to a bigint: w, t and the casted clock
        assert!(f.contains("::bigint -"));
        assert!(!l.uses_sign_bit());
        assert_eq!(sequence_max(&l, SignBit::Refuse), ((1i64 << 43) << 10) - 1);
    }

    #[test]
    fn wide_sequence_fields_do_not_fold_the_clock() {
        let l = shardflake::preset::resolve("w: time 30 | shard 2 | sequence 30").unwrap();
        let f = next_id_function(&l, "s", 1, SignBit::Refuse, SeqOid::ByName);
        // (Unix ms << 30) would overflow a bigint: ticks are shifted instead
        let (ahead, lag) = (lead_bound(&l), lag_tolerance(&l));
        assert!(
            f.contains(&format!(
                "::bigint - 0) << 30) - ({})) <= {} THEN",
                (ahead - lag) / 2,
                (ahead + lag) / 2
            )),
            "{f}"
        );
        assert!(!f.contains("::bigint << 30"), "{f}");
    }

    #[test]
    fn lag_is_about_four_ms_and_at_least_a_tick() {
        let ten = shardflake::preset::resolve("t: time 41 | shard 13 | sequence 10 (tick 10 ms)")
            .unwrap();
        assert_eq!(lag_tolerance(&ten), 1024);
        let two =
            shardflake::preset::resolve("t: time 41 | shard 13 | sequence 6 (tick 2 ms)").unwrap();
        assert_eq!(lag_tolerance(&two), 2 << 6);
        assert_eq!(catch_up_gap(&two), 16);
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
            "CREATE TABLE shard7.posts (id bigint DEFAULT shard7.next_id('shard7.id_seq'::regclass))"
        );
        let head = shard_schema_ddl(&l, "shard7", SignBit::Refuse);
        assert_eq!(
            head,
            format!(
                "CREATE SCHEMA IF NOT EXISTS shard7;\nCREATE SEQUENCE IF NOT EXISTS shard7.id_seq INCREMENT 1 CACHE 1 NO CYCLE MAXVALUE {};\n",
                ((1i64 << 40) << 10) - 1
            )
        );
        let ddl = shard_ddl(&l, "shard7", 7, SignBit::Refuse, SeqOid::ByName).unwrap();
        assert!(ddl.contains("v4; shard=7; sign_bit=refuse; layout=instagram"));
        assert!(ddl.contains("WHEN seq::oid <> 'shard7.id_seq'::regclass::oid THEN"));
        assert!(shard_ddl(&l, "x", 9000, SignBit::Refuse, SeqOid::ByName).is_err());
    }
}
