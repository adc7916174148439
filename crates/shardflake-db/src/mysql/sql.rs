//! MariaDB/MySQL SQL generated from a [`Layout`]: pure functions, no server.
//! The design, and why no id repeats, is in the [`crate::mysql`] module docs.
//!
//! Every number in the SQL (epoch, tick, shifts, masks, limits) comes from
//! [`Plan`], which reads them from the same [`Layout`] `shardflake decode`
//! uses. Time is computed on `DATETIME` values,
//! `TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'<epoch>', UTC_TIMESTAMP(6))`, valid
//! from the epoch to the year 9999 (MySQL ≥ 8.0.28 and MariaDB ≥ 11.5 run
//! with clocks past 2038; `UNIX_TIMESTAMP` is `NULL` there on MariaDB before
//! 11.5 and ends in 2106 after it). [`Plan::micros_sql`] takes the time as an
//! argument so the arithmetic is testable for any date.

use shardflake::Layout;
use shardflake::layout::FieldKind;

use crate::SHARD_FIELD;

/// Version of the generated objects; bumped when their SQL changes. Stored
/// in their comments and compared by `mysql check`.
pub const VERSION: u32 = 2;

/// The clock event catches the sequence up when its reserved values lag the
/// clock by more than this many milliseconds (at least one tick).
pub const LAG_MS: u64 = 4;

/// An `INSERT` refuses to make an id whose time lags the clock by more than
/// this: the clock event is not running (see [`crate::mysql`]).
pub const STALE_MS: u64 = 1_000;

/// How far, in milliseconds, a drawn value may run ahead of the clock
/// (bursts of more than 2^sequence ids per tick borrow later ticks): a draw
/// further ahead waits until the clock is within this of it, and one more
/// than twice this ahead (the clock stepped back) is refused. So every
/// value ever handed out is at most the clock plus `AHEAD_MS` (the clock
/// not stepping back), which is what `mysql repair` and the clock event
/// put a set-back sequence past. Equal to [`STALE_MS`]: the trigger tests
/// the band around the clock with one `ABS`.
pub const AHEAD_MS: u64 = STALE_MS;

/// How long a clock loop that starts waits before it makes ids possible:
/// past [`AHEAD_MS`], so that the clock has passed every value handed out
/// before, while the last loop ran (a draw runs at most `AHEAD_MS` ahead,
/// and none is made while no loop runs), and catching the sequence up to
/// the clock puts it past them, whatever a dump restored meanwhile set it
/// back to.
pub const START_WAIT_MS: u64 = AHEAD_MS + 10;

/// How far past the highest reservation it has seen the clock event puts a
/// sequence it finds set back (a dump restored into the running server):
/// values drawn since its last look (a few ms) stay below it unless more
/// than this many ms' worth of ids were drawn in them.
pub const RESTORE_HEADROOM_MS: u64 = 500;

/// The sequence's `CACHE` unless told otherwise: values handed out from
/// memory between two writes of the sequence's row. A crash skips what is
/// left of it (never reissues).
pub const DEFAULT_CACHE: u64 = 1000;

/// The `sql_mode` the routines, the event and the table are created with
/// (a routine keeps the mode it was created with): strict, so an
/// out-of-range value is an error, never a silently clipped one.
pub const SQL_MODE: &str = "STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION";

/// The database holding each id sequence's recorded high-water
/// ([`Plan::high_water`]): outside the application's database, so a dump of
/// that database restored into the server cannot set it back.
pub const HIGH_WATER_DB: &str = "shardflake";

/// The clock event raises the recorded high-water when the sequence has
/// moved this many milliseconds' worth of values past it (about ten writes
/// a second at most).
pub const HIGH_WATER_STEP_MS: u64 = 100;

/// The id table's `AUTO_INCREMENT` counter: the largest `BIGINT`. Without
/// the trigger an insert takes it once (an id ours makes only at the
/// layout's very last tick, for the last shard) and every later one fails
/// ("Out of range value for column 'id'"), instead of taking the next id
/// above the newest row, which is the next id ours hands out in its shard.
pub const AUTO_INCREMENT_PARKED: i64 = i64::MAX;

/// The id table's invisible guard column: the trigger sets it to 1, its
/// default is 0, and a `CHECK` refuses a row where it is not 1. So an
/// insert while the trigger is missing (a restore of the table runs
/// between its `CREATE TABLE` and its `CREATE TRIGGER`) fails, rather than
/// take [`AUTO_INCREMENT_PARKED`]: taken once per restore, that one id
/// would be handed out again by the next restore of the same dump. A
/// dump keeps the column and the constraint.
pub const GUARD_COLUMN: &str = "id_by_trigger";

/// The `CHECK` constraint on [`GUARD_COLUMN`].
pub const GUARD_CONSTRAINT: &str = "id_made_by_trigger";

/// Adds the guard to a table made before it: its rows and the inserts of
/// the trigger in place now (which does not set it) get 1 until
/// [`guard_default_sql`] sets the default to 0, once the trigger sets it.
pub fn add_guard_sql(table: &str) -> String {
    format!(
        "ALTER TABLE `{table}` ADD COLUMN IF NOT EXISTS `{GUARD_COLUMN}` TINYINT NOT NULL INVISIBLE DEFAULT 1, \
         ADD CONSTRAINT IF NOT EXISTS `{GUARD_CONSTRAINT}` CHECK (`{GUARD_COLUMN}` = 1)"
    )
}

/// Marks the rows that hold the guard's default 0 (inserted while its
/// `CHECK` was dropped by hand), so that [`add_guard_sql`] can add the
/// `CHECK` back.
pub fn mark_guard_rows_sql(table: &str) -> String {
    format!("UPDATE `{table}` SET `{GUARD_COLUMN}` = 1 WHERE `{GUARD_COLUMN}` <> 1")
}

/// The guard's default once the trigger sets the column: 0, which the
/// `CHECK` refuses (an instant change).
pub fn guard_default_sql(table: &str) -> String {
    format!("ALTER TABLE `{table}` ALTER COLUMN `{GUARD_COLUMN}` SET DEFAULT 0")
}

/// MariaDB's error number for "Sequence '...' has run out".
pub const ER_SEQUENCE_RUN_OUT: u16 = 4084;

/// Refusals of SQL generation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MysqlSqlError {
    /// No `shard` node field.
    #[error(
        "layout {0:?} has no \"shard\" field; the MariaDB ids need one (shard = key mod 2^bits)"
    )]
    NoShard(String),
    /// Time and sequence do not fit a positive `BIGINT`.
    #[error("layout {0:?}: time + sequence bits exceed 62, too wide for a MariaDB sequence")]
    TooWide(String),
    /// A field other than time holds the sign bit.
    #[error(
        "layout {0:?}: a field other than time holds the sign bit, so some ids are negative from the start"
    )]
    SignBit(String),
    /// The epoch cannot be written as a `DATETIME`.
    #[error("layout {0:?}: its epoch is past the year 9999, which a DATETIME cannot hold")]
    Epoch(String),
    /// A name that is not a plain identifier.
    #[error("{what} {name:?} must be 1 to {max} letters, digits or '_', not starting with a digit")]
    Name {
        /// What is named.
        what: &'static str,
        /// The name.
        name: String,
        /// Longest allowed.
        max: usize,
    },
    /// Shard values (`--shards`) not written `LO-HI` or as one value:
    /// digits only, `LO` at most `HI`.
    #[error(
        "shard values {0:?}: expected LO-HI or one value, such as 0-511 or 7 (digits only, no spaces, LO at most HI)"
    )]
    Shards(String),
}

/// Parses the shard values of `--shards` (`apply`, `adopt`, `repair`):
/// `LO-HI` or one value, digits only (`"0 - 10"`, `"0-"` and `"5-3"` are
/// refused, not read as something else).
pub fn parse_shards(s: &str) -> Result<(u64, u64), MysqlSqlError> {
    let bad = || MysqlSqlError::Shards(s.to_string());
    let num = |v: &str| -> Result<u64, MysqlSqlError> {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        v.parse().map_err(|_| bad())
    };
    let (lo, hi) = match s.split_once('-') {
        Some((lo, hi)) => (num(lo)?, num(hi)?),
        None => {
            let v = num(s)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// A [`Layout`] checked for MariaDB, with every number the SQL uses.
#[derive(Debug, Clone)]
pub struct Plan {
    layout: Layout,
    seq_bits: u32,
    seq_shift: u32,
    time_shift: u32,
    shard_bits: u32,
    shard_shift: u32,
    limit_tick: u64,
    epoch_datetime: String,
    database: Option<String>,
    server_id: Option<u32>,
    place: Option<(u16, String)>,
    serves: Option<(u64, u64)>,
    clock_loop: bool,
}

impl Plan {
    /// Checks `layout`: a `shard` node field, time + sequence ≤ 62 bits (the
    /// packed value is a positive `BIGINT`), no sign bit outside the time
    /// field, an epoch a `DATETIME` can hold.
    pub fn new(layout: &Layout) -> Result<Plan, MysqlSqlError> {
        let name = || layout.name().to_string();
        let shard = layout
            .field(SHARD_FIELD)
            .filter(|f| f.kind() == FieldKind::Node)
            .ok_or_else(|| MysqlSqlError::NoShard(name()))?;
        let time = layout.time();
        let seq = layout.sequence();
        if time.bits() + seq.bits() > 62 {
            return Err(MysqlSqlError::TooWide(name()));
        }
        // Ids are signed BIGINT: with all 64 bits used, the time's top bit
        // would make them negative, so that tick is the first one refused.
        let limit_tick = if layout.uses_sign_bit() {
            if time.shift() + time.bits() != 64 {
                return Err(MysqlSqlError::SignBit(name()));
            }
            1u64 << (time.bits() - 1)
        } else {
            time.max() + 1
        };
        if layout.epoch_ms() >= shardflake::timestamp::YEAR_10000_MS {
            return Err(MysqlSqlError::Epoch(name()));
        }
        let epoch_datetime = shardflake::timestamp::rfc3339_ms(layout.epoch_ms())
            .replace('T', " ")
            .replace('Z', "");
        Ok(Plan {
            layout: layout.clone(),
            seq_bits: seq.bits(),
            seq_shift: seq.shift(),
            time_shift: time.shift(),
            shard_bits: shard.bits(),
            shard_shift: shard.shift(),
            limit_tick,
            epoch_datetime,
            database: None,
            server_id: None,
            place: None,
            serves: None,
            clock_loop: true,
        })
    }

    /// The plan for the objects of database `db`: the trigger, the
    /// procedure and the clock event then also check the sequence against
    /// its recorded high-water ([`Plan::high_water`]). What `mysql apply`
    /// installs; without it (`mysql sql`'s printout) they do not.
    pub fn in_database(mut self, db: &str) -> Plan {
        self.database = Some(db.to_string());
        self
    }

    /// The plan for the objects of the server whose `@@server_id` is `id`:
    /// the trigger and the procedure then refuse every id on any other
    /// server (a promoted replica has its own `server_id` and the
    /// replicated objects) until `mysql repair` reinstalls them there.
    /// What `mysql apply` installs; without it they make ids anywhere.
    pub fn on_server(mut self, id: u32) -> Plan {
        self.server_id = Some(id);
        self
    }

    /// The plan for the objects of the server listening on `port` with
    /// data directory `datadir` (`@@port`, `@@datadir`): the trigger and
    /// the procedures then refuse every id on a copy of the server started
    /// beside it (its data directory copied, the same `server_id` from the
    /// same configuration), and on the server moved to another port or
    /// data directory, until `mysql apply --shards ... --peer` gives the
    /// copy values of its own, or `mysql repair` reinstalls them. Two
    /// variable reads per row, as `@@server_id`. What `mysql apply`
    /// installs.
    pub fn at(mut self, port: u16, datadir: &str) -> Plan {
        self.place = Some((port, datadir.to_string()));
        self
    }

    /// The test of [`Plan::at`] in the trigger and the procedures:
    /// `` AND @@port = PORT AND @@datadir = 'DIR'``.
    pub fn place_sql(port: u16, datadir: &str) -> String {
        format!(" AND @@port = {port} AND @@datadir = {}", lit(datadir))
    }

    /// The plan for a server that makes ids for the shard values `lo..=hi`
    /// only (the shard value is the key mod 2^shard_bits): the trigger and
    /// the procedure refuse any other key. The whole range, or `None`,
    /// tests nothing.
    pub fn serving(mut self, range: Option<(u64, u64)>) -> Plan {
        self.serves = range.filter(|&(lo, hi)| lo > 0 || hi < self.shard_max());
        self
    }

    /// The plan for a server without sequences (MySQL): no clock event is
    /// installed there, so the row-lock procedure does not wait for its
    /// loop ([`Plan::clock_lock`] is `None`).
    pub fn without_clock_loop(mut self) -> Plan {
        self.clock_loop = false;
        self
    }

    /// The shard values this plan makes ids for (`lo..=hi`).
    pub fn serves(&self) -> (u64, u64) {
        self.serves.unwrap_or((0, self.shard_max()))
    }

    /// The largest shard value: 2^shard_bits - 1.
    pub fn shard_max(&self) -> u64 {
        (1u64 << self.shard_bits) - 1
    }

    /// The `server_id` the objects were made for ([`Plan::on_server`]).
    pub fn server_id(&self) -> Option<u32> {
        self.server_id
    }

    /// The sequence holding the high-water of `names`' id sequence, quoted:
    /// `` `shardflake`.`app.posts_id_seq` `` (with [`Plan::in_database`]).
    /// Every value the id sequence will still hand out is at or above its
    /// next value, raised by the clock event as the sequence moves, never
    /// lowered (a sequence's `SETVAL` never moves down). A dump of the
    /// application's database, restored, sets the id sequence back below
    /// it: the trigger and the procedure refuse until `mysql repair`.
    pub fn high_water(&self, names: &Names) -> Option<String> {
        self.database.as_ref().map(|db| {
            format!(
                "`{HIGH_WATER_DB}`.`{}`",
                format!("{db}.{}", names.sequence()).replace('`', "``")
            )
        })
    }

    /// The name of the user-level lock the clock event's loop holds while
    /// it runs (with [`Plan::in_database`]): what [`Names::clock_lock_sql`]
    /// computes in that database, as text the trigger compares without
    /// computing it per row.
    pub fn clock_lock(&self, names: &Names) -> Option<String> {
        use md5::{Digest, Md5};
        let db = self.database.as_ref().filter(|_| self.clock_loop);
        db.map(|db| {
            format!(
                "shardflake {:x}",
                Md5::digest(format!("{db}.{}", names.sequence()))
            )
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The epoch as a `DATETIME` literal's text, `2023-01-01 00:00:00.000` (UTC).
    pub fn epoch_datetime(&self) -> &str {
        &self.epoch_datetime
    }

    /// The first tick refused: past the time field, or (layouts using all 64
    /// bits) the first whose ids would be negative.
    pub fn limit_tick(&self) -> u64 {
        self.limit_tick
    }

    /// The value a catch-up sets the sequence to for the packed clock `t`
    /// (an SQL expression): `t`, or with the layout's random start, `t`
    /// plus a value below 2^bits taken from a hash of `t` (deterministic,
    /// so replication by statement replays it), capped at
    /// [`Plan::max_packed`]. A catch-up only ever moves the sequence up,
    /// past every value handed out, so starting the tick higher repeats
    /// none; it spreads `id % N` at low rates, where every id would
    /// otherwise be its tick's first, sequence 0.
    pub fn tick_start_sql(&self, t: &str) -> String {
        match self.layout.random_start_bits() {
            0 => t.to_string(),
            bits => format!(
                "LEAST({t} + (CRC32({t}) & {}), {})",
                (1u64 << bits) - 1,
                self.max_packed()
            ),
        }
    }

    /// The largest packed value (`tick << sequence_bits | sequence`) handed
    /// out: the sequence's `MAXVALUE`.
    pub fn max_packed(&self) -> i64 {
        ((self.limit_tick as i64) << self.seq_bits) - 1
    }

    /// The high-water that refuses every draw (above [`Plan::max_packed`]):
    /// what the clock event records for a sequence it finds set back below
    /// its high-water, so that refused draws, each of which still moves the
    /// sequence up by one, cannot carry it back up to where draws are taken
    /// again. Only `mysql repair` replaces it.
    pub fn high_water_refusing_all(&self) -> i64 {
        self.max_packed() + 1
    }

    /// The first Unix millisecond refused ([`Plan::limit_tick`]), as text.
    pub fn limit_text(&self) -> String {
        shardflake::timestamp::rfc3339_ms(self.layout.tick_to_unix_ms(self.limit_tick))
    }

    /// Packed values per tick (`2^sequence_bits`).
    pub fn per_tick(&self) -> i64 {
        1i64 << self.seq_bits
    }

    /// `ms` milliseconds as packed values (at least one tick).
    pub fn packed_ms(&self, ms: u64) -> i64 {
        let ticks = (ms / self.layout.tick_ms()).max(1);
        (ticks as i64) << self.seq_bits
    }

    /// The packed value of a Unix millisecond (the clock side of the
    /// sequence), or `None` before the epoch or at or past the limit.
    pub fn packed_at(&self, unix_ms: u64) -> Option<i64> {
        let tick = self.layout.unix_ms_to_tick(unix_ms)?;
        (tick < self.limit_tick).then(|| (tick as i64) << self.seq_bits)
    }

    /// SQL for the microseconds from the epoch to `datetime`, an SQL
    /// expression of a UTC `DATETIME` (`UTC_TIMESTAMP(6)`, or a literal in
    /// tests): `DATETIME` arithmetic, valid from year 1000 to 9999.
    pub fn micros_sql(&self, datetime: &str) -> String {
        format!(
            "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'{}', {datetime})",
            self.epoch_datetime
        )
    }

    /// SQL for the packed clock from microseconds `us` (which must be
    /// `>= 0`; `DIV` truncates): `(us DIV (1000 * tick)) * 2^sequence_bits`,
    /// a signed `BIGINT` (a shift would make it unsigned, and a draw minus
    /// it an error when negative).
    pub fn packed_sql(&self, us: &str) -> String {
        format!(
            "(({us} DIV {}) * {})",
            1000 * self.layout.tick_ms(),
            self.per_tick()
        )
    }

    /// SQL for the id made of packed value `w` and shard key `key` (both
    /// SQL expressions, `key >= 0`): the time and sequence of `w` put in
    /// their fields, the shard `key mod 2^shard_bits` in its own. One to one
    /// in `w` for a given shard.
    pub fn id_sql(&self, w: &str, key: &str) -> String {
        let seq_mask = (1u64 << self.seq_bits) - 1;
        let shard_mask = (1u64 << self.shard_bits) - 1;
        let shifted = |e: String, s: u32| {
            if s == 0 { e } else { format!("({e} << {s})") }
        };
        format!(
            "{} | {} | {}",
            shifted(format!("({w} >> {})", self.seq_bits), self.time_shift),
            shifted(format!("({key} & {shard_mask})"), self.shard_shift),
            shifted(format!("({w} & {seq_mask})"), self.seq_shift),
        )
    }

    /// The id of packed value `w` and shard key `key`, in Rust ([`Plan::id_sql`]).
    pub fn id_of(&self, w: i64, key: i64) -> i64 {
        let seq_mask = (1i64 << self.seq_bits) - 1;
        let shard_mask = (1i64 << self.shard_bits) - 1;
        ((w >> self.seq_bits) << self.time_shift)
            | ((key & shard_mask) << self.shard_shift)
            | ((w & seq_mask) << self.seq_shift)
    }

    /// Text naming the layout and its version in comments:
    /// `shardflake v1: mysql-procedure: time 43 | shard 10 | ...`.
    pub fn marker(&self) -> String {
        format!("shardflake v{VERSION}: {}", self.layout)
    }
}

fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// Whether `name` is a plain identifier of at most `max` characters.
fn check_name(what: &'static str, name: &str, max: usize) -> Result<(), MysqlSqlError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(MysqlSqlError::Name {
            what,
            name: name.to_string(),
            max,
        })
    }
}

/// The objects of one table's ids: the table, its shard-key column, the
/// sequence `{table}_id_seq`, the clock event `{table}_id_clock` and the
/// seed-shaped procedure (`generate_post_id` by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// Table whose `id` column gets the default.
    pub table: String,
    /// Its shard-key column (`user_id`): shard = key mod 2^shard_bits.
    pub key: String,
    /// The procedure `(IN key BIGINT, OUT id BIGINT)`; the row-lock variant
    /// is `{procedure}_locked`, the seed's `{procedure}_seed`.
    pub procedure: String,
}

impl Default for Names {
    fn default() -> Self {
        Names {
            table: "posts".into(),
            key: "user_id".into(),
            procedure: "generate_post_id".into(),
        }
    }
}

impl Names {
    /// Checked names (identifiers short enough for every derived name).
    pub fn new(table: &str, key: &str, procedure: &str) -> Result<Names, MysqlSqlError> {
        check_name("table", table, 48)?;
        check_name("shard-key column", key, 64)?;
        check_name("procedure", procedure, 48)?;
        Ok(Names {
            table: table.into(),
            key: key.into(),
            procedure: procedure.into(),
        })
    }
    /// The procedure of `table` when none is named: `generate_post_id`
    /// for `posts` (the seed's name), `generate_<table>_id` for another.
    pub fn default_procedure(table: &str) -> String {
        if table == "posts" {
            "generate_post_id".to_string()
        } else {
            format!("generate_{table}_id")
        }
    }
    /// `{table}_id_seq`.
    pub fn sequence(&self) -> String {
        format!("{}_id_seq", self.table)
    }
    /// `{table}_id_clock`.
    pub fn event(&self) -> String {
        format!("{}_id_clock", self.table)
    }
    /// The trigger: `{table}_id`.
    pub fn trigger(&self) -> String {
        format!("{}_id", self.table)
    }
    /// The function the trigger calls to refuse a row: `{table}_id_refused`.
    pub fn refused_function(&self) -> String {
        format!("{}_id_refused", self.table)
    }
    /// `{procedure}_locked`.
    pub fn locked_procedure(&self) -> String {
        format!("{}_locked", self.procedure)
    }
    /// `{procedure}_seed`.
    pub fn seed_procedure(&self) -> String {
        format!("{}_seed", self.procedure)
    }
    /// The row of `sequences` the row-lock procedure counts in: `{table}_id`.
    pub fn locked_row(&self) -> String {
        format!("{}_id", self.table)
    }
    /// The row of `sequences` the seed's procedure counts in.
    pub fn seed_row(&self) -> String {
        format!("{}_seed", self.table)
    }
    /// SQL for the name of the user-level lock the clock event holds while
    /// it runs (one per database and sequence; at most 64 characters).
    pub fn clock_lock_sql(&self) -> String {
        format!(
            "CONCAT('shardflake ', MD5(CONCAT(DATABASE(), '.', {})))",
            lit(&self.sequence())
        )
    }
    /// SQL for the name of the user-level lock a starting clock loop takes
    /// first, and holds while it runs: one loop starts at a time.
    pub fn clock_start_lock_sql(&self) -> String {
        format!(
            "CONCAT('shardflake start ', MD5(CONCAT(DATABASE(), '.', {})))",
            lit(&self.sequence())
        )
    }
}

/// `CREATE SEQUENCE IF NOT EXISTS` for the ids: packed values from `start`
/// (the packed clock at install), `INCREMENT BY 1`, `NOCYCLE`, `MAXVALUE`
/// [`Plan::max_packed`], InnoDB.
pub fn sequence_sql(plan: &Plan, names: &Names, start: i64, cache: u64) -> String {
    let cache = if cache <= 1 {
        "NOCACHE".to_string()
    } else {
        format!("CACHE {cache}")
    };
    format!(
        "CREATE SEQUENCE IF NOT EXISTS `{seq}` START WITH {start} MINVALUE 0 MAXVALUE {max} \
         INCREMENT BY 1 {cache} NOCYCLE COMMENT {comment} ENGINE=InnoDB",
        seq = names.sequence(),
        max = plan.max_packed(),
        comment = lit(&plan.marker()),
    )
}

/// `CREATE SEQUENCE IF NOT EXISTS` for the recorded high-water
/// ([`Plan::high_water`]), from 0, `NOCACHE` (every `SETVAL` is written),
/// InnoDB. `None` without [`Plan::in_database`].
pub fn high_water_sql(plan: &Plan, names: &Names) -> Option<String> {
    let hw = plan.high_water(names)?;
    Some(format!(
        "CREATE SEQUENCE IF NOT EXISTS {hw} START WITH 0 MINVALUE 0 MAXVALUE {max} \
         INCREMENT BY 1 NOCACHE NOCYCLE COMMENT {comment} ENGINE=InnoDB",
        max = plan.high_water_refusing_all(),
        comment = lit(&format!(
            "shardflake v{VERSION}: every value {} still hands out is at or above this one",
            names.sequence()
        )),
    ))
}

/// SQL that is true on the server and in the database the objects were
/// made for (empty without [`Plan::on_server`] and [`Plan::in_database`]):
/// `@@server_id` is read for the cost of a variable. A copy of the
/// database on the same server (`mariadb-dump app | mariadb app2`) has
/// objects that name the original's high-water and clock loop: its ids
/// would be the original's, and its loop would take the original's
/// high-water for its own.
fn on_this_server(plan: &Plan) -> String {
    let mut sql = String::new();
    if let Some(db) = &plan.database {
        sql.push_str(&format!(" AND DATABASE() = {}", lit(db)));
    }
    if let Some(id) = plan.server_id {
        sql.push_str(&format!(" AND @@server_id = {id}"));
    }
    if let Some((port, dir)) = &plan.place {
        sql.push_str(&Plan::place_sql(*port, dir));
    }
    sql
}

/// SQL that is true when key `key` has a shard value this server makes
/// ids for (empty when it makes them for all: [`Plan::serving`]).
fn in_range(plan: &Plan, key: &str) -> String {
    match plan.serves {
        Some((lo, hi)) => format!(" AND ({key} & {}) BETWEEN {lo} AND {hi}", plan.shard_max()),
        None => String::new(),
    }
}

/// An `IF`/`ELSEIF` arm naming a key whose shard value this server does
/// not make ids for (empty when it makes them for all).
fn out_of_range(plan: &Plan, who: &str, key: &str, keyword: &str, set: &str) -> String {
    let Some((lo, hi)) = plan.serves else {
        return String::new();
    };
    let max = plan.shard_max();
    format!(
        "\n  {keyword} ({key} & {max}) NOT BETWEEN {lo} AND {hi} THEN\n    \
         {set}CONCAT('{who}: shard value ', {key} & {max}, ' (the key mod {}) is not one this server makes ids for ({lo}-{hi}): another server of the deployment does; send the row there');",
        max + 1
    )
}

/// An `IF`/`ELSEIF` arm (`keyword`) naming a server other than the one the
/// objects were made for: a promoted replica, whose sequence may be behind
/// ids its old primary made, or a copy (empty without [`Plan::on_server`]).
/// Before it, an arm naming a database other than the one they were made
/// for: a copy of it on this server (empty without [`Plan::in_database`]).
fn on_another_server(plan: &Plan, who: &str, keyword: &str, set: &str) -> String {
    let mut arms = String::new();
    let mut keyword = keyword;
    if let Some(db) = &plan.database {
        let quoted = lit(db);
        let text = &quoted[1..quoted.len() - 1];
        arms.push_str(&format!(
            "\n  {keyword} DATABASE() <> {quoted} THEN\n    \
             {set}CONCAT('{who}: installed for database {text}, this is database ', DATABASE(), \
             ' (a copy of {text}, loaded from its dump?): its objects name the high-water and clock loop of {text}, whose ids it would make again; drop it, or, for a separate table whose ids may equal those of {text}, run shardflake mysql apply --new-deployment on it');"
        ));
        keyword = "ELSEIF";
    }
    // What `repair --old-server-gone` must name: the server they were
    // made for (`SERVER_ID:PORT:DATADIR`), quoted for the shell, as text
    // inside an SQL literal. (Each text is cut to 512 characters, what
    // `msg` and a SIGNAL's text hold: a data directory's path has no
    // bound.)
    let gone = |id: u32| match &plan.place {
        Some((port, dir)) => {
            let quoted = lit(dir);
            format!(
                "shardflake mysql repair --old-server-gone ''{id}:{port}:{}''",
                &quoted[1..quoted.len() - 1]
            )
        }
        None => format!("shardflake mysql repair --old-server-gone {id}"),
    };
    if let Some(id) = plan.server_id {
        arms.push_str(&format!(
            "\n  {keyword} @@server_id <> {id} THEN\n    \
             {set}LEFT(CONCAT('{who}: installed for server_id {id}, this is server_id ', @@server_id, \
             ' (a promoted replica, or a copy of the server): its sequence may be behind the old primary''s ids. While it or another copy runs: values of its own on each (shardflake mysql apply --shards LO-HI), the rest here (shardflake mysql repair --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER: one not named is not checked); all stopped for good: {}'), 512);",
            gone(id)
        ));
        keyword = "ELSEIF";
    }
    if let Some((port, dir)) = &plan.place {
        let quoted = lit(dir);
        let text = &quoted[1..quoted.len() - 1];
        arms.push_str(&format!(
            "\n  {keyword} @@port <> {port} OR @@datadir <> {quoted} THEN\n    \
             {set}LEFT(CONCAT('{who}: installed for the server on port {port}, data directory {text}; this is port ', @@port, ', ', @@datadir, \
             ': a copy of that server started beside it, or the server moved. A copy: give it shard values of its own, none of the original''s (shardflake mysql apply --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER); the server moved (the original gone for good): {}'), 512);",
            gone(plan.server_id.unwrap_or_default())
        ));
    }
    arms
}

/// SQL that is true while the clock event's loop runs (empty without
/// [`Plan::in_database`]): about 1 µs of server CPU per row. The loop is
/// what sees a dump restored into the running server (it remembers the
/// highest reservation), and only it records the high-water; with no loop,
/// ids drawn after a dump was taken could be drawn again once the dump is
/// restored. So no id is made while it is not running: a dump taken then
/// holds a sequence past every id handed out.
fn clock_loop_runs(plan: &Plan, names: &Names) -> String {
    match plan.clock_lock(names) {
        Some(lock) => format!(" AND IS_USED_LOCK({}) IS NOT NULL", lit(&lock)),
        None => String::new(),
    }
}

/// An `IF`/`ELSEIF` arm (`keyword`) naming a clock event whose loop is not
/// running, and the way out (empty without [`Plan::in_database`]).
fn clock_loop_stopped(plan: &Plan, names: &Names, who: &str, keyword: &str, set: &str) -> String {
    let Some(lock) = plan.clock_lock(names) else {
        return String::new();
    };
    format!(
        "\n  {keyword} IS_USED_LOCK({lock}) IS NULL THEN\n    \
         {set}CONCAT('{who}: the clock event {event} is not running (event_scheduler = ', @@GLOBAL.event_scheduler, \
         '): ids are made only while its loop runs, as it is what sees a restore of the database; if OFF, run SET GLOBAL event_scheduler = ON (and put event_scheduler=ON in the configuration); if ON, it starts within a second, or shardflake mysql check says why not');",
        lock = lit(&lock),
        event = names.event(),
    )
}

/// The recorded high-water as an SQL expression that is never `NULL`
/// (without one, a value above every draw: a missing high-water refuses),
/// `None` without [`Plan::in_database`].
fn high_water_now(plan: &Plan, names: &Names) -> Option<String> {
    plan.high_water(names).map(|hw| {
        format!(
            "COALESCE((SELECT next_not_cached_value FROM {hw}), {})",
            plan.max_packed() + 2
        )
    })
}

/// SQL for the id of a new row whose shard key is `key` (an SQL
/// expression, `NEW.user_id` in the trigger): draw the next packed value,
/// check the key and the clock, make the id.
///
/// ```sql
/// CASE WHEN high_water > (NEXT VALUE FOR seq) THEN <table>_id_refused(key, TRUE)
///      WHEN ABS((PREVIOUS VALUE FOR seq) - clock) <= STALE AND us >= 0 AND key >= 0
///      THEN id(PREVIOUS VALUE FOR seq, key)
///      ELSE <table>_id_refused(key, FALSE)  -- waits for the clock, or SIGNALs why
/// END
/// ```
///
/// The high-water is read *before* the draw (a comparison evaluates its
/// left side first; the value is never `NULL`, so the draw is always
/// made): every value drawn after the clock event read the reservation
/// it records is at or above it, so a draw is refused only when the
/// sequence was set back (a restore). Read after the draw, a high-water
/// raised meanwhile (the row's thread paused while catch-ups move the
/// sequence on) refused a draw made legitimately before it. Without a
/// high-water the first arm is left out. `PREVIOUS VALUE FOR` is this
/// session's draw. The clock (`UTC_TIMESTAMP(6)`, the statement's start)
/// only decides between an id, a wait ([`refused_function_sql`]) and an
/// error: the id is a function of the draw alone.
pub fn id_expression_sql(plan: &Plan, names: &Names, key: &str) -> String {
    let seq = format!("`{}`", names.sequence());
    let us = plan.micros_sql("UTC_TIMESTAMP(6)");
    let refused = names.refused_function();
    let (below, draw) = match high_water_now(plan, names) {
        Some(hw) => (
            format!("WHEN {hw} > (NEXT VALUE FOR {seq}) THEN `{refused}`({key}, TRUE) "),
            format!("(PREVIOUS VALUE FOR {seq})"),
        ),
        None => (String::new(), format!("(NEXT VALUE FOR {seq})")),
    };
    format!(
        "CASE {below}WHEN ABS({draw} - {clock}) <= {stale} AND {us} >= 0 AND {key} >= 0{server}{range}{running} \
         THEN {id} ELSE `{refused}`({key}, FALSE) END",
        running = clock_loop_runs(plan, names),
        server = on_this_server(plan),
        range = in_range(plan, key),
        stale = plan.packed_ms(STALE_MS),
        clock = plan.packed_sql(&us),
        id = plan.id_sql(&format!("(PREVIOUS VALUE FOR {seq})"), key),
    )
}

/// The `BEFORE INSERT` trigger that gives a new row its id: a row inserted
/// without one (`id` 0 or `NULL`) gets [`id_expression_sql`]; an explicit id
/// is kept (copies, backfills; `mysql check` verifies that none is above the
/// sequence). One `SET`: the trigger's only statement.
///
/// Why a trigger and not the column's `DEFAULT`: MariaDB 10.11.19 evaluates
/// `NEXT VALUE FOR` in a `DEFAULT` against another session's state when the
/// `INSERT` is a server-side prepared statement run by several sessions at
/// once (measured here: 8 sessions repeated values, and the server died of
/// signal 11, with `DEFAULT (NEXT VALUE FOR s)` alone). The same expression
/// in a trigger gave 16,000 distinct values from 8 prepared sessions.
pub fn trigger_sql(plan: &Plan, names: &Names) -> String {
    format!(
        "CREATE OR REPLACE TRIGGER `{trigger}` BEFORE INSERT ON `{table}` FOR EACH ROW\n\
         SET NEW.id = IF(NEW.id <> 0, NEW.id, {expr}), NEW.`{GUARD_COLUMN}` = 1",
        trigger = names.trigger(),
        table = names.table,
        expr = id_expression_sql(plan, names, &format!("NEW.`{}`", names.key)),
    )
}

/// The function the trigger calls for a draw outside the band around the
/// clock, or a bad key: a draw ahead of the clock by more than
/// [`AHEAD_MS`] waits until the clock is within that of it and gets its id
/// (the clock read afresh, `SYSDATE`: the statement's start may be long
/// past in a big `INSERT ... SELECT`; waits of 1 ms, about 2 s in all at
/// most); anything else is refused with its reason (shard key, clock
/// before the epoch or past the layout, sequence set back below its
/// high-water, far behind the clock, more than twice `AHEAD_MS` ahead of
/// it), `SIGNAL`led (SQLSTATE 45000) in any `sql_mode`, `INSERT
/// IGNORE` included. `generate_post_id` calls it for a draw ahead too.
/// Declared `READS SQL DATA` (it reads the sequence's last draw and the
/// high-water, and writes nothing): a server writing a binary log refuses
/// a function that declares none of that (`ERROR 1418`).
pub fn refused_function_sql(plan: &Plan, names: &Names) -> String {
    let f = names.refused_function();
    let layout = plan.layout().name();
    let ahead = plan.packed_ms(AHEAD_MS);
    format!(
        "CREATE OR REPLACE FUNCTION `{f}`(k BIGINT, below BOOLEAN) RETURNS BIGINT NOT DETERMINISTIC READS SQL DATA
COMMENT {comment}
BEGIN
  DECLARE us BIGINT DEFAULT {us};
  DECLARE w BIGINT DEFAULT PREVIOUS VALUE FOR `{seq}`;
  DECLARE lead BIGINT;
  DECLARE waits INT DEFAULT 0;
  DECLARE msg VARCHAR(512);{first} k IS NULL OR k < 0 THEN
    SET msg = CONCAT('shardflake: {table}.id: shard key {key} = ', COALESCE(k, 'NULL'), ' is not >= 0');
  ELSEIF us < 0 THEN
    SET msg = CONCAT('shardflake: {table}.id: the server clock (', UTC_TIMESTAMP(3), ' UTC) is before the epoch {epoch} UTC of layout {layout}');
  ELSEIF {clock} > {max} THEN
    SET msg = CONCAT('shardflake: {table}.id: the server clock (', UTC_TIMESTAMP(3), ' UTC) is past the last time of layout {layout} (ids end at {end})');{below}{stopped}
  ELSEIF w + {stale} < {clock} THEN
    SET msg = CONCAT('shardflake: {table}.id: sequence {seq} is ', (({clock} - COALESCE(w, 0)) DIV {per_tick}) * {tick},
      ' ms behind the server clock (', UTC_TIMESTAMP(3), ' UTC): the event {event} is not running (event_scheduler = ', @@GLOBAL.event_scheduler, ')');
  ELSE
    SET lead = w - {real_clock};
    WHILE lead > {ahead} AND lead <= {ahead2} AND waits < {max_waits} DO
      DO SLEEP(0.001);
      SET waits = waits + 1;
      SET lead = w - {real_clock};
    END WHILE;
    IF lead <= {ahead} THEN
      RETURN {id};
    END IF;
    SET msg = CONCAT('shardflake: {table}.id: sequence {seq} runs ', (lead DIV {per_tick}) * {tick},
      ' ms ahead of the server clock (', UTC_TIMESTAMP(3), ' UTC): did the clock step back? ids resume once it is within {ahead_ms} ms');
  END IF;
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;
  RETURN 0;
END",
        comment = lit(&plan.marker()),
        us = plan.micros_sql("UTC_TIMESTAMP(6)"),
        table = names.table,
        key = names.key,
        epoch = plan.epoch_datetime(),
        clock = plan.packed_sql("us"),
        real_clock = plan.packed_sql(&plan.micros_sql(REAL_UTC)),
        max = plan.max_packed(),
        end = plan.limit_text(),
        seq = names.sequence(),
        stale = plan.packed_ms(STALE_MS),
        ahead2 = 2 * ahead,
        ahead_ms = AHEAD_MS,
        // Waits of 1 ms: at most about twice AHEAD_MS in all, whatever the
        // clock does meanwhile (a lead of at most twice AHEAD_MS needs at
        // most AHEAD_MS of waiting while the clock moves).
        max_waits = 2 * AHEAD_MS,
        per_tick = plan.per_tick(),
        tick = plan.layout().tick_ms(),
        event = names.event(),
        id = plan.id_sql("w", "k"),
        below = below_high_water(plan, names, "below", &format!("shardflake: {}.id", names.table), "ELSEIF", "SET msg = "),
        stopped = clock_loop_stopped(plan, names, &format!("shardflake: {}.id", names.table), "ELSEIF", "SET msg = "),
        // A server other than the one installed on is named first: no
        // other arm may hand out an id there.
        first = match format!(
            "{}{}",
            on_another_server(plan, &format!("shardflake: {}.id", names.table), "IF", "SET msg = "),
            out_of_range(plan, &format!("shardflake: {}.id", names.table), "k", "ELSEIF", "SET msg = ")
        ) {
            arm if arm.is_empty() => "\n  IF".to_string(),
            arm if arm.starts_with("\n  ELSEIF") => format!("\n  IF{}\n  ELSEIF", &arm["\n  ELSEIF".len()..]),
            arm => format!("{arm}\n  ELSEIF"),
        },
    )
}

/// Ids by time, the SQL twins of [`Layout::min_id_at`],
/// [`Layout::max_id_at`], [`Layout::id_range`] and the decoded time, as
/// `(name, CREATE)` pairs: `tick_at(t)`, `min_id_at(t)`, `max_id_at(t)`,
/// `id_range(from, to)` (half-open; `{"first": .., "last": ..}` as JSON)
/// and `id_time(id)`. Times are UTC `DATETIME`s. A time outside the
/// layout's life raises `22008`. Declared `DETERMINISTIC NO SQL` so a
/// constant argument makes `WHERE id BETWEEN ...` an index range scan.
pub fn time_functions_sql(plan: &Plan) -> Vec<(&'static str, String)> {
    let layout = plan.layout();
    let t = layout.time();
    let comment = lit(&plan.marker());
    let epoch = plan.epoch_datetime();
    let name = layout.name();
    let tick = layout.tick_ms();
    let shift = t.shift();
    let low = (1u64 << shift) - 1;
    let header = |f: &str, args: &str, returns: &str| {
        format!(
            "CREATE OR REPLACE FUNCTION `{f}`({args}) RETURNS {returns} DETERMINISTIC NO SQL\nCOMMENT {comment}\nBEGIN\n"
        )
    };
    let tick_at = format!(
        "{}  DECLARE ms BIGINT DEFAULT FLOOR(TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'{epoch}', t) / 1000);
  IF ms < 0 THEN
    SIGNAL SQLSTATE '22008' SET MESSAGE_TEXT = 'shardflake: a time before layout {name}''s epoch {epoch} UTC: give a time at or after it';
  END IF;
  IF ms DIV {tick} > {max_tick} THEN
    SIGNAL SQLSTATE '22008' SET MESSAGE_TEXT = 'shardflake: a time at or after layout {name}''s end of life {end} UTC: give an earlier time';
  END IF;
  RETURN ms DIV {tick};
END",
        header("tick_at", "t DATETIME(6)", "BIGINT"),
        max_tick = t.max(),
        end = shardflake::timestamp::rfc3339_ms(
            u64::try_from(layout.end_of_life_ms()).unwrap_or(u64::MAX)
        ),
    );
    // `<<` works on BIGINT UNSIGNED; CAST keeps the bits of an id at or
    // above 2^63 (negative, as the library's `as_i64`).
    let min_id_at = format!(
        "{}  RETURN CAST(tick_at(t) << {shift} AS SIGNED);\nEND",
        header("min_id_at", "t DATETIME(6)", "BIGINT")
    );
    let max_id_at = format!(
        "{}  RETURN CAST((tick_at(t) << {shift}) | {low} AS SIGNED);\nEND",
        header("max_id_at", "t DATETIME(6)", "BIGINT")
    );
    let id_range = format!(
        "{}  IF from_t >= to_t THEN
    SIGNAL SQLSTATE '22008' SET MESSAGE_TEXT = 'shardflake: the span is empty: from must be before to';
  END IF;
  RETURN JSON_OBJECT('first', min_id_at(from_t), 'last', max_id_at(to_t - INTERVAL 1 MICROSECOND));
END",
        header("id_range", "from_t DATETIME(6), to_t DATETIME(6)", "LONGTEXT")
    );
    let id_time = format!(
        "{}  RETURN TIMESTAMP'{epoch}' + INTERVAL ((id >> {shift}) & {max}) * {us_per_tick} MICROSECOND;\nEND",
        header("id_time", "id BIGINT", "DATETIME(3)"),
        max = t.max(),
        us_per_tick = 1000 * tick,
    );
    vec![
        ("tick_at", tick_at),
        ("min_id_at", min_id_at),
        ("max_id_at", max_id_at),
        ("id_range", id_range),
        ("id_time", id_time),
    ]
}

/// `decode_id(id, table)`, as `(name, CREATE)`: the id's parts as JSON,
/// `{"before_adoption": false, "time": "<UTC DATETIME(3)>", "shard": ..,
/// "sequence": ..}`, except for an id from before `table`'s adoption (at
/// or below the floor `mysql adopt` recorded in `shardflake.adopted`),
/// which has no time, shard or sequence: those are null,
/// `before_adoption` true (and false for every id while no table of the
/// server was adopted: the handler of error 1146, no such table).
/// Installed beside [`time_functions_sql`]'s.
pub fn decode_function_sql(plan: &Plan) -> (&'static str, String) {
    let mask = |bits: u32| (1u64 << bits) - 1;
    let create = format!(
        "CREATE OR REPLACE FUNCTION `decode_id`(v BIGINT, of_table VARCHAR(64)) RETURNS LONGTEXT NOT DETERMINISTIC READS SQL DATA
COMMENT {comment}
BEGIN
  DECLARE old BOOLEAN DEFAULT FALSE;
  DECLARE CONTINUE HANDLER FOR 1146 SET old = FALSE;
  SELECT COALESCE(MAX(v <= floor_id), FALSE) INTO old FROM `{HIGH_WATER_DB}`.`adopted` WHERE db = DATABASE() AND tbl = of_table;
  IF old THEN
    RETURN JSON_OBJECT('before_adoption', TRUE, 'time', NULL, 'shard', NULL, 'sequence', NULL);
  END IF;
  RETURN JSON_OBJECT('before_adoption', FALSE, 'time', CAST(id_time(v) AS CHAR), 'shard', (v >> {shard_shift}) & {shard_mask}, 'sequence', (v >> {seq_shift}) & {seq_mask});
END",
        comment = lit(&plan.marker()),
        shard_shift = plan.shard_shift,
        shard_mask = mask(plan.shard_bits),
        seq_shift = plan.seq_shift,
        seq_mask = mask(plan.seq_bits),
    );
    ("decode_id", create)
}

/// The server's UTC time now, as a `DATETIME(6)` expression: `SYSDATE(6)`
/// (the time it runs, not the statement's start as `UTC_TIMESTAMP`) moved
/// from the session's time zone to UTC by the statement's own offset.
const REAL_UTC: &str =
    "(SYSDATE(6) - INTERVAL TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), NOW(6)) MICROSECOND)";

/// An `ELSEIF`/`IF` arm naming a sequence set back below its recorded
/// high-water (a restore) and the command that repairs it (empty without
/// a high-water). `below` is the SQL condition: the draw was below the
/// high-water as read before it (see [`id_expression_sql`]); the message
/// reads it again only to show it.
fn below_high_water(
    plan: &Plan,
    names: &Names,
    below: &str,
    who: &str,
    keyword: &str,
    set: &str,
) -> String {
    let Some(hw) = plan.high_water(names) else {
        return String::new();
    };
    let seq = names.sequence();
    format!(
        "\n  {keyword} {below} THEN\n    \
         {set}CONCAT('{who}: sequence {seq} is at ', COALESCE(PREVIOUS VALUE FOR `{seq}`, 'NULL'), ', below its high-water ', \
         COALESCE((SELECT next_not_cached_value FROM {hw}), 'NULL'), ' kept in {hw_text}: the database was restored from a dump, or the sequence recreated or set back; run shardflake mysql repair before writing');",
        hw_text = hw.replace('`', "").replace('\'', "''"),
    )
}

/// `CREATE TABLE IF NOT EXISTS` in the seed's shape: `id` (`BIGINT
/// AUTO_INCREMENT`, so the OK packet carries the id the trigger set, for
/// clients that read `LAST_INSERT_ID` rather than `RETURNING`), the shard
/// key, a `body`. The trigger sets every id; the counter starts at
/// [`AUTO_INCREMENT_PARKED`] and an invisible [`GUARD_COLUMN`] only the
/// trigger sets, so a row inserted while the trigger is missing (a table
/// restore drops it) fails instead of taking an id that ours, or the next
/// restore, can repeat.
pub fn table_sql(plan: &Plan, names: &Names) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS `{table}` (\n  id BIGINT NOT NULL AUTO_INCREMENT COMMENT {comment},\n  `{key}` BIGINT NOT NULL,\n  body TEXT,\n  `{GUARD_COLUMN}` TINYINT NOT NULL INVISIBLE DEFAULT 0,\n  PRIMARY KEY (id),\n  CONSTRAINT `{GUARD_CONSTRAINT}` CHECK (`{GUARD_COLUMN}` = 1)\n) ENGINE=InnoDB AUTO_INCREMENT={AUTO_INCREMENT_PARKED}",
        table = names.table,
        key = names.key,
        comment = lit(&format!("{}; sequence {}", plan.marker(), names.sequence())),
    )
}

/// The clock event: fires every second; the firing that gets the start
/// lock ([`Names::clock_start_lock_sql`]) waits [`START_WAIT_MS`], catches
/// the sequence up with the clock, and only then takes the lock the
/// trigger tests ([`Names::clock_lock_sql`]) and loops for good. Every
/// value handed out before it started was made while an earlier loop ran,
/// at most [`AHEAD_MS`] ahead of the clock: after the wait the clock is
/// past them all, so a dump taken while that loop ran and restored before
/// this one started (whose sequence a recorded high-water, raised a step
/// behind, may not catch) hands out none of them again. The loop moving the sequence up to the
/// packed clock whenever its reserved values (`next_not_cached_value`, at or
/// above every value handed out) lag it by more than [`LAG_MS`], and
/// otherwise sleeping until they could (at least 1 ms, at most
/// [`LAG_MS`]: a clock that steps forward is seen within that). `SETVAL`
/// takes only a literal, so it runs through `EXECUTE IMMEDIATE` (allowed in
/// events and procedures, not in defaults, triggers or functions). `SETVAL`
/// never moves a sequence down; a clock before the epoch or past the
/// layout's end is left alone.
///
/// The loop outlives errors (a `CONTINUE` handler: a restore's `DROP
/// SEQUENCE` fails one look, not the loop) and remembers the highest
/// reservation it saw, `hw`: no restore can roll that back while the loop
/// runs. A sequence found below it was set back (a dump restored into the
/// running server, whose `SETVAL` does not move it down afterwards): it is
/// put past every value handed out at once, [`RESTORE_HEADROOM_MS`] past
/// `hw` and past the clock plus [`AHEAD_MS`] (no draw runs further ahead).
///
/// With [`Plan::in_database`] the loop also raises the recorded high-water
/// ([`Plan::high_water`]) to the reservation less the cache as it was a
/// step of [`HIGH_WATER_STEP_MS`] of values before (a draw is tested
/// against it a moment after it is made), a write per step at most, and
/// leaves alone a sequence found
/// below it: that one was set back while no loop watched (a dump restored
/// with the event stopped), and the trigger refuses it until `mysql
/// repair`. The loop moves that high-water to
/// [`Plan::high_water_refusing_all`], since each refused draw still moves
/// the sequence up and would, in the end, carry it back to the high-water.
pub fn event_sql(plan: &Plan, names: &Names) -> String {
    let us = plan.micros_sql("UTC_TIMESTAMP(6)");
    let hw = plan.high_water(names);
    let hw_name = hw.clone().unwrap_or_default();
    let start_wait = format!("{}.{:03}", START_WAIT_MS / 1000, START_WAIT_MS % 1000);
    format!(
        "CREATE OR REPLACE EVENT `{event}` ON SCHEDULE EVERY 1 SECOND ON COMPLETION PRESERVE ENABLE
COMMENT {comment}
DO BEGIN
  DECLARE us BIGINT;
  DECLARE t BIGINT;
  DECLARE r BIGINT;
  DECLARE hw BIGINT DEFAULT 0;
  DECLARE pause_ms BIGINT;
  DECLARE failed INT DEFAULT 0;{declare_floor}
  DECLARE CONTINUE HANDLER FOR SQLEXCEPTION SET failed = 1;
  IF {in_db}GET_LOCK({start_lock}, 0) = 1 THEN
    DO SLEEP({start_wait});
    SET us = {us};
    IF us >= 0 THEN
      SET t = {clock};
      SET r = (SELECT next_not_cached_value FROM `{seq}`);{start_floor}
      IF {start_above}t <= {max} AND r < t THEN
        EXECUTE IMMEDIATE CONCAT('DO SETVAL(`{seq}`, ', {tick_start}, ', 0)');
      END IF;
    END IF;
  END IF;
  IF {in_db}failed = 0 AND IS_USED_LOCK({start_lock}) = CONNECTION_ID() AND GET_LOCK({lock}, 0) = 1 THEN
    LOOP
      SET failed = 0;
      SET r = NULL;
      SET us = {us};
      SET pause_ms = {lag_ms};
      IF us >= 0 THEN
        SET t = {clock};
        SET r = (SELECT next_not_cached_value FROM `{seq}`);{read_floor}
        IF r < hw THEN
          SET r = GREATEST(hw + {headroom}, t + {ahead} + 1);
          EXECUTE IMMEDIATE CONCAT('DO SETVAL(`{seq}`, ', r, ', 0)');{floor_arm}
        ELSEIF t <= {max} AND r + {lag} < t THEN
          EXECUTE IMMEDIATE CONCAT('DO SETVAL(`{seq}`, ', {tick_start}, ', 0)');
        ELSE
          SET pause_ms = LEAST(GREATEST(((r + {lag} - t) DIV {per_tick}) * {tick}, 1), {lag_ms});
        END IF;
        IF failed = 0 AND r > hw THEN
          SET hw = r;
        END IF;{raise_floor}
      END IF;
      IF failed = 1 OR pause_ms IS NULL THEN
        SET pause_ms = {lag_ms};
      END IF;
      DO SLEEP(pause_ms / 1000);
    END LOOP;
  END IF;
END",
        event = names.event(),
        // (event comments hold 64 characters: the body carries the layout's numbers)
        comment = lit(&format!("shardflake v{VERSION} clock event, loop v5")),
        // A copy of the database on this server (its dump loaded into
        // another) runs no loop: its event names the original's
        // high-water, which it would raise past the original's sequence.
        in_db = match &plan.database {
            Some(db) => format!("DATABASE() = {} AND ", lit(db)),
            None => String::new(),
        },
        tick_start = plan.tick_start_sql("t"),
        lock = names.clock_lock_sql(),
        start_lock = names.clock_start_lock_sql(),
        start_wait = start_wait,
        // A sequence below its recorded high-water is left to the loop,
        // which refuses it until `mysql repair`.
        start_floor = if hw.is_some() {
            format!(
                "\n      SET f = NULL;\n      SET f = (SELECT next_not_cached_value FROM {hw_name});"
            )
        } else {
            String::new()
        },
        start_above = if hw.is_some() {
            "r >= COALESCE(f, 0) AND "
        } else {
            ""
        },
        clock = plan.packed_sql("us"),
        max = plan.max_packed(),
        seq = names.sequence(),
        lag = plan.packed_ms(LAG_MS),
        lag_ms = LAG_MS.max(plan.layout().tick_ms()),
        per_tick = plan.per_tick(),
        tick = plan.layout().tick_ms(),
        headroom = plan.packed_ms(RESTORE_HEADROOM_MS),
        ahead = plan.packed_ms(AHEAD_MS),
        declare_floor = if hw.is_some() {
            "\n  DECLARE f BIGINT;\n  DECLARE c BIGINT;\n  DECLARE pend BIGINT DEFAULT NULL;"
        } else {
            ""
        },
        read_floor = if hw.is_some() {
            format!(
                "\n        SET f = NULL;\n        SET f = (SELECT next_not_cached_value FROM {hw_name});"
            )
        } else {
            String::new()
        },
        floor_arm = if hw.is_some() {
            // Set back before this loop saw it (a dump restored while no
            // loop ran): values above it may have been handed out, and
            // nothing here knows how far; the trigger refuses it until
            // `mysql repair`, and the high-water moves past every value so
            // that the refused draws do not carry the sequence back to it.
            format!(
                "\n        ELSEIF r < f THEN\n          IF f < {all} THEN\n            EXECUTE IMMEDIATE CONCAT('DO SETVAL({hw_name}, ', {all}, ', 0)');\n          END IF;\n          SET pause_ms = NULL;",
                all = plan.high_water_refusing_all(),
            )
        } else {
            String::new()
        },
        raise_floor = if hw.is_some() {
            // Every value still to come is at or above the reservation less
            // the cache, once the draws made before it have been checked: a
            // row's draw and its test against the high-water are two steps,
            // and a catch-up between them can move the reservation far past
            // the draw. So the value recorded is the one seen a step of
            // HIGH_WATER_STEP_MS before (`pend`): a write per step at most,
            // and only a draw whose test comes a step later is refused.
            format!(
                "\n        IF failed = 0 AND r >= f THEN\n          SET c = (SELECT next_not_cached_value - cache_size FROM `{seq}`);\n          IF c >= COALESCE(pend, f) + {step} THEN\n            IF pend > f THEN\n              EXECUTE IMMEDIATE CONCAT('DO SETVAL({hw_name}, ', pend, ', 0)');\n            END IF;\n            SET pend = c;\n          END IF;\n        END IF;",
                seq = names.sequence(),
                step = plan.packed_ms(HIGH_WATER_STEP_MS),
            )
        } else {
            String::new()
        },
    )
}

/// Declarations and checks shared by the procedures: `us` and `msg`
/// declared, the key checked, the clock read and checked against the epoch.
fn clock_checks(plan: &Plan, proc_name: &str, key: &str) -> String {
    format!(
        "  IF {key} IS NULL OR {key} < 0 THEN
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{proc_name}: {key} must be >= 0 (it is the shard key)';
  END IF;
  SET us = {us};
  IF us < 0 THEN
    SET msg = CONCAT('{proc_name}: the server clock (', UTC_TIMESTAMP(3), ' UTC) is before the epoch {epoch} UTC of layout {layout}');
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;
  END IF;
",
        us = plan.micros_sql("UTC_TIMESTAMP(6)"),
        epoch = plan.epoch_datetime(),
        layout = plan.layout().name(),
    )
}

fn past_end(plan: &Plan, proc_name: &str) -> String {
    format!(
        "SET msg = CONCAT('{proc_name}: the server clock (', UTC_TIMESTAMP(3), ' UTC) is past the last time of layout {layout} (ids end at {end})');
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;",
        layout = plan.layout().name(),
        end = plan.limit_text(),
    )
}

/// The seed-shaped procedure on the sequence (MariaDB ≥ 10.3):
/// `CALL generate_post_id(?, ?)` draws from the same sequence as the
/// trigger, so ids from both never collide. Its common path is one `SET`
/// (the trigger's expression, `NULL` instead of an error); a draw that lags
/// the clock by more than [`LAG_MS`], a bad key or a clock before the epoch
/// take the other branch, which names the error or catches the sequence up
/// itself (a procedure may run `EXECUTE IMMEDIATE`) and draws again. Like
/// the trigger, it makes ids only while the clock event's loop runs (it is
/// what sees a restore). A draw more than [`AHEAD_MS`]
/// ahead of the clock waits as the trigger's does ([`refused_function_sql`]).
/// No row lock, no write but the sequence's. (No SQL comments in routine
/// bodies: the `mariadb` client strips them from a restored dump, and the
/// body would no longer match what `check` expects.)
pub fn procedure_sql(plan: &Plan, names: &Names) -> String {
    let name = &names.procedure;
    let key = &names.key;
    let seq = format!("`{}`", names.sequence());
    let us = plan.micros_sql("UTC_TIMESTAMP(6)");
    format!(
        "CREATE PROCEDURE `{name}`(IN {key} BIGINT, OUT id BIGINT)
COMMENT {comment}
BEGIN{declare_high_water}
  DECLARE EXIT HANDLER FOR {run_out}
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{name}: sequence {seq_name} has run out: the ids of layout {layout} end at {end}';
  SET id = CASE WHEN {draw} + {lag} >= {clock_now} AND (PREVIOUS VALUE FOR {seq}) <= {clock_now} + {ahead} AND {us} >= 0 AND {key} >= 0{server}{range}{running} THEN {fast_id} END;
  IF id IS NULL THEN
    BEGIN
      DECLARE us BIGINT;
      DECLARE t BIGINT;
      DECLARE w BIGINT;
      DECLARE msg VARCHAR(512);{below}{guards}
{checks}      SET t = {clock};
      IF t > {max} THEN
        {past_end}
      END IF;
      SET w = PREVIOUS VALUE FOR {seq};
      IF w + {lag} < t THEN
        EXECUTE IMMEDIATE CONCAT('DO SETVAL({seq}, ', {tick_start}, ', 0)');
        SET w = NEXT VALUE FOR {seq};
      END IF;
      SET id = IF(w - t > {ahead}, `{refused}`({key}, FALSE), {id});
    END;
  END IF;
END",
        comment = lit(&plan.marker()),
        run_out = ER_SEQUENCE_RUN_OUT,
        tick_start = plan.tick_start_sql("t"),
        seq_name = names.sequence(),
        layout = plan.layout().name(),
        end = plan.limit_text(),
        lag = plan.packed_ms(LAG_MS),
        clock_now = plan.packed_sql(&us),
        fast_id = plan.id_sql(&format!("(PREVIOUS VALUE FOR {seq})"), key),
        ahead = plan.packed_ms(AHEAD_MS),
        refused = names.refused_function(),
        // The high-water is read before the draw, as in the trigger
        // (see `id_expression_sql`).
        declare_high_water = match high_water_now(plan, names) {
            Some(hw) => format!("\n  DECLARE h BIGINT DEFAULT {hw};"),
            None => String::new(),
        },
        draw = match plan.high_water(names) {
            Some(_) => format!("(NEXT VALUE FOR {seq}) >= h AND (PREVIOUS VALUE FOR {seq})"),
            None => format!("(NEXT VALUE FOR {seq})"),
        },
        below = {
            let below = format!("COALESCE(PREVIOUS VALUE FOR {seq}, -1) < h");
            let arm = below_high_water(plan, names, &below, name, "IF", "SET msg = ");
            if arm.is_empty() {
                arm
            } else {
                format!(
                    "{}\n        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;\n      END IF;",
                    arm.replace("\n  ", "\n      ")
                )
            }
        },
        server = on_this_server(plan),
        range = in_range(plan, key),
        running = clock_loop_runs(plan, names),
        // Every guard's arm SIGNALs (before, only the last arm of the
        // chain did: a copy or a promoted replica recording a range got
        // ids from the slow path).
        guards = guards_sql(plan, names, name, key).replace("\n  ", "\n      "),
        checks = clock_checks(plan, name, key).replace("\n  ", "\n      ").replacen("  IF", "      IF", 1),
        clock = plan.packed_sql("us"),
        max = plan.max_packed(),
        past_end = past_end(plan, name).replace("\n      ", "\n        "),
        id = plan.id_sql("w", key),
    )
}

/// `CREATE TABLE sequences` as in the seed (idempotent), and one row.
pub fn sequences_sql(row: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS sequences (\n    name     varchar(32) PRIMARY KEY,\n    next_val BIGINT NOT NULL DEFAULT 1\n);\n\
         INSERT IGNORE INTO sequences (name) VALUES ({});",
        lit(row)
    )
}

/// The row-lock procedure, for servers without sequences (MySQL): one
/// atomic statement on a row of `sequences`,
///
/// ```sql
/// UPDATE sequences SET next_val = LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))
///  WHERE name = '<row>' AND next_val < MAX;
/// ```
///
/// `next_val` holds the last packed value handed out; the row lock makes
/// the read-modify-write atomic, `LAST_INSERT_ID(expr)` hands the new value
/// back to this session only, and the value only grows, so ids never
/// repeat. Every check comes **before** the write: the clock against the
/// epoch (no negative shift) and the layout's end, the row against `MAX`.
/// The row stays locked until the caller's transaction ends.
///
/// Before all that, the guards the trigger and `generate_post_id` apply
/// (`guards_sql`): the database and server it was installed for, the
/// shard values the server records, and (with sequences) the clock
/// event's loop. Without them a server that gave shard values away still
/// made ids for them here (issue 37, A7: 314 of 18,539 ids twice after a
/// hand-over).
pub fn locked_procedure_sql(plan: &Plan, names: &Names) -> String {
    let name = names.locked_procedure();
    let key = &names.key;
    let row = lit(&names.locked_row());
    format!(
        "CREATE PROCEDURE `{name}`(IN {key} BIGINT, OUT id BIGINT)
COMMENT {comment}
BEGIN
  DECLARE us BIGINT;
  DECLARE now_packed BIGINT;
  DECLARE msg VARCHAR(512);{guards}
{checks}  SET now_packed = {clock};
  IF now_packed > {max} THEN
    {past_end}
  END IF;
  UPDATE sequences SET next_val = LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))
   WHERE name = {row} AND next_val < {max};
  IF ROW_COUNT() <> 1 THEN
    IF EXISTS (SELECT 1 FROM sequences WHERE name = {row}) THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{name}: row {row_text} of sequences has run out: the ids of layout {layout} end at {end}';
    END IF;
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{name}: no row {row_text} in sequences';
  END IF;
  SET id = {id};
END",
        comment = lit(&plan.marker()),
        guards = guards_sql(plan, names, &name, key),
        checks = clock_checks(plan, &name, key),
        clock = plan.packed_sql("us"),
        max = plan.max_packed(),
        past_end = past_end(plan, &name),
        row_text = names.locked_row(),
        layout = plan.layout().name(),
        end = plan.limit_text(),
        id = plan.id_sql("LAST_INSERT_ID()", key),
    )
}

/// The guards every way of making an id applies, as one `IF` that
/// `SIGNAL`s the first that fails (empty when there are none): a
/// database or server other than the one the objects were installed for,
/// a key whose shard value this server does not record, the clock
/// event's loop not running. `who` names the routine, `key` its shard key.
fn guards_sql(plan: &Plan, names: &Names, who: &str, key: &str) -> String {
    let arms = format!(
        "{}{}{}",
        on_another_server(plan, who, "ELSEIF", "SET msg = "),
        out_of_range(plan, who, key, "ELSEIF", "SET msg = "),
        clock_loop_stopped(plan, names, who, "ELSEIF", "SET msg = "),
    );
    match arms.strip_prefix("\n  ELSEIF") {
        None => String::new(),
        Some(rest) => format!(
            "\n  IF{rest}\n  END IF;\n  IF msg IS NOT NULL THEN\n    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;\n  END IF;"
        ),
    }
}

/// The seed's procedure, verbatim except for its name and row (kept to show
/// its duplicates; do not use it).
pub fn seed_procedure_sql(name: &str, row: &str) -> String {
    format!(
        "CREATE PROCEDURE {name}(IN user_id BIGINT, OUT post_id BIGINT)
BEGIN
    SET @service_start_time = UNIX_TIMESTAMP('2023-01-01 00:00:00.000');
    SET @shard_count = 1024;
    SET @sequence_name = '{row}';

    SET post_id = (
            FLOOR((UNIX_TIMESTAMP(NOW(3)) - @service_start_time) * 1000) << 20 |
            (user_id % @shard_count) << 10
        );

    SET post_id = post_id | (SELECT next_val % 1024 FROM sequences WHERE name = @sequence_name);
    UPDATE sequences SET next_val = next_val + 1 WHERE name = @sequence_name;
END"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardflake::preset;

    fn plan() -> Plan {
        Plan::new(&preset::by_name("mysql-procedure").unwrap()).unwrap()
    }

    #[test]
    fn shard_values_are_lo_hi_or_one_value_and_nothing_else() {
        assert_eq!(parse_shards("0-511"), Ok((0, 511)));
        assert_eq!(parse_shards("7"), Ok((7, 7)));
        assert_eq!(parse_shards("0-1023"), Ok((0, 1023)));
        for bad in [
            "0 - 10",
            " 0-10",
            "0-10 ",
            "0- 10",
            "",
            "-",
            "0-",
            "-5",
            "5-3",
            "0-10-20",
            "a-b",
            "+1-2",
            "0x10",
            "1,2",
            "99999999999999999999",
        ] {
            assert_eq!(
                parse_shards(bad),
                Err(MysqlSqlError::Shards(bad.to_string())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn numbers_of_the_mysql_procedure_layout() {
        let p = plan();
        assert_eq!(p.epoch_datetime(), "2023-01-01 00:00:00.000");
        assert_eq!(p.max_packed(), (1i64 << 53) - 1);
        assert_eq!(p.packed_ms(LAG_MS), 4096);
        assert_eq!(
            p.id_sql("w", "`user_id`"),
            "((w >> 10) << 20) | ((`user_id` & 1023) << 10) | (w & 1023)"
        );
        assert_eq!(
            p.micros_sql("UTC_TIMESTAMP(6)"),
            "TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'2023-01-01 00:00:00.000', UTC_TIMESTAMP(6))"
        );
        assert_eq!(p.packed_sql("us"), "((us DIV 1000) * 1024)");
        // The worked example of "Sharding & IDs at Instagram" (1387263000 ms,
        // shard 1341, sequence 5001), in this layout's shape
        assert_eq!(p.id_of((1387263000 << 10) | (5001 % 1024), 1341), {
            (1387263000i64 << 20) | ((1341 % 1024) << 10) | (5001 % 1024)
        });
        assert_eq!(p.packed_at(1_672_531_200_000), Some(0));
        assert_eq!(p.packed_at(1_672_531_199_999), None);
        assert_eq!(p.packed_at(1_672_531_200_003), Some(3 << 10));
    }

    #[test]
    fn trigger_draws_first_and_names_its_errors() {
        let p = plan();
        let n = Names::default();
        let t = trigger_sql(&p, &n);
        assert!(
            t.starts_with("CREATE OR REPLACE TRIGGER `posts_id` BEFORE INSERT ON `posts` FOR EACH ROW\nSET NEW.id = IF(NEW.id <> 0, NEW.id, CASE WHEN ABS((NEXT VALUE FOR `posts_id_seq`) - ((TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'2023-01-01 00:00:00.000', UTC_TIMESTAMP(6)) DIV 1000) * 1024)) <= 1024000 AND "),
            "{t}"
        );
        assert!(t.contains("THEN (((PREVIOUS VALUE FOR `posts_id_seq`) >> 10) << 20) | ((NEW.`user_id` & 1023) << 10) | ((PREVIOUS VALUE FOR `posts_id_seq`) & 1023) ELSE `posts_id_refused`(NEW.`user_id`, FALSE) END)"), "{t}");
        assert_eq!(t.matches("NEXT VALUE FOR").count(), 1, "{t}");
        let f = refused_function_sql(&p, &n);
        assert!(
            f.contains("is before the epoch 2023-01-01 00:00:00.000 UTC of layout mysql-procedure")
        );
        assert!(f.contains("the event posts_id_clock is not running"));
        // A draw ahead waits on the clock read afresh, at most twice AHEAD.
        assert!(f.contains("SET lead = w - ((TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'2023-01-01 00:00:00.000', (SYSDATE(6) - INTERVAL"), "{f}");
        assert!(
            f.contains("WHILE lead > 1024000 AND lead <= 2048000 AND waits < 2000 DO"),
            "{f}"
        );
        assert!(
            f.contains("RETURN ((w >> 10) << 20) | ((k & 1023) << 10) | (w & 1023);"),
            "{f}"
        );
        assert!(f.contains("did the clock step back?"), "{f}");
        assert!(f.contains("SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = msg;"));
        assert!(
            table_sql(&p, &n).contains(
                "id BIGINT NOT NULL AUTO_INCREMENT COMMENT 'shardflake v2: mysql-procedure"
            )
        );
    }

    /// A draw is tested against the high-water as read before it: every
    /// value drawn after the clock event read the reservation it records
    /// is at or above it. Read after the draw, a high-water raised
    /// meanwhile refused a draw made legitimately before it (no restore).
    #[test]
    fn the_high_water_is_read_before_the_draw() {
        let p = plan().in_database("app");
        let n = Names::default();
        let hw = format!(
            "COALESCE((SELECT next_not_cached_value FROM `shardflake`.`app.posts_id_seq`), {})",
            p.max_packed() + 2
        );
        let t = trigger_sql(&p, &n);
        let first = format!(
            "CASE WHEN {hw} > (NEXT VALUE FOR `posts_id_seq`) THEN `posts_id_refused`(NEW.`user_id`, TRUE) WHEN ABS((PREVIOUS VALUE FOR `posts_id_seq`) - "
        );
        assert!(t.contains(&first), "{t}");
        assert_eq!(t.matches("NEXT VALUE FOR").count(), 1, "{t}");
        assert_eq!(t.matches("shardflake`.`app.posts_id_seq").count(), 1, "{t}");
        assert!(
            t.contains("ELSE `posts_id_refused`(NEW.`user_id`, FALSE) END"),
            "{t}"
        );
        // The function refuses as below the high-water only on the
        // trigger's word, never on a reading taken after the draw.
        let f = refused_function_sql(&p, &n);
        assert!(f.contains("(k BIGINT, below BOOLEAN)"), "{f}");
        assert!(f.contains("\n  ELSEIF below THEN\n    SET msg = CONCAT('shardflake: posts.id: sequence posts_id_seq is at '"), "{f}");
        assert!(
            !f.contains("< COALESCE((SELECT next_not_cached_value"),
            "{f}"
        );
        let proc_ = procedure_sql(&p, &n);
        let declare = proc_
            .find(&format!("DECLARE h BIGINT DEFAULT {hw};"))
            .expect(&proc_);
        let draw = proc_.find("NEXT VALUE FOR").unwrap();
        assert!(declare < draw, "{proc_}");
        assert!(proc_.contains("SET id = CASE WHEN (NEXT VALUE FOR `posts_id_seq`) >= h AND (PREVIOUS VALUE FOR `posts_id_seq`) + 4096 >= "), "{proc_}");
        assert!(
            proc_.contains("IF COALESCE(PREVIOUS VALUE FOR `posts_id_seq`, -1) < h THEN"),
            "{proc_}"
        );
    }

    #[test]
    fn event_and_procedures() {
        let p = plan();
        let n = Names::default();
        let e = event_sql(&p, &n);
        assert!(
            e.contains("SET r = (SELECT next_not_cached_value FROM `posts_id_seq`);"),
            "{e}"
        );
        assert!(e.contains("AND r + 4096 < t THEN"), "{e}");
        // set back under the loop: past what it saw and past clock + AHEAD
        assert!(
            e.contains("SET r = GREATEST(hw + 512000, t + 1024000 + 1);"),
            "{e}"
        );
        // set back while no loop ran: the high-water then refuses every draw
        let e = event_sql(&p.clone().in_database("app"), &n);
        let all = p.high_water_refusing_all();
        assert_eq!(all, p.max_packed() + 1);
        assert!(
            e.contains(&format!("ELSEIF r < f THEN\n          IF f < {all} THEN\n            EXECUTE IMMEDIATE CONCAT('DO SETVAL(`shardflake`.`app.posts_id_seq`, ', {all}, ', 0)');")),
            "{e}"
        );
        assert!(
            e.contains(&format!("IF t <= {} AND", (1i64 << 53) - 1)),
            "{e}"
        );
        assert!(e.contains("EXECUTE IMMEDIATE CONCAT('DO SETVAL(`posts_id_seq`, ', t, ', 0)')"));
        let proc_ = procedure_sql(&p, &n);
        assert!(
            proc_.contains("CREATE PROCEDURE `generate_post_id`(IN user_id BIGINT, OUT id BIGINT)")
        );
        assert!(
            proc_.contains("SET id = CASE WHEN (NEXT VALUE FOR `posts_id_seq`) + 4096 >= "),
            "{proc_}"
        );
        assert!(proc_.contains("AND user_id >= 0 THEN (((PREVIOUS VALUE FOR `posts_id_seq`) >> 10) << 20) | ((user_id & 1023) << 10) | ((PREVIOUS VALUE FOR `posts_id_seq`) & 1023) END;"), "{proc_}");
        assert!(proc_.contains("IF id IS NULL THEN"), "{proc_}");
        assert!(
            proc_.contains("AND (PREVIOUS VALUE FOR `posts_id_seq`) <= ((TIMESTAMPDIFF"),
            "{proc_}"
        );
        assert!(
            proc_.contains("SET id = IF(w - t > 1024000, `posts_id_refused`(user_id, FALSE), ((w >> 10) << 20) | ((user_id & 1023) << 10) | (w & 1023));"),
            "{proc_}"
        );
        let locked = locked_procedure_sql(&p, &n);
        assert!(locked.contains("LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))"));
        // the clock is checked before the shift, the range before the write
        let before = locked.find("IF us < 0").unwrap();
        let shift = locked.find("SET now_packed =").unwrap();
        let range = locked.find("IF now_packed >").unwrap();
        let write = locked.find("UPDATE sequences").unwrap();
        assert!(before < shift && shift < range && range < write, "{locked}");
        assert!(!locked.contains("UNIX_TIMESTAMP"), "{locked}");
        assert!(!proc_.contains("UNIX_TIMESTAMP"));
        assert!(seed_procedure_sql("s", "r").contains("SELECT next_val % 1024 FROM sequences"));
    }

    /// Issue 37, A7: the row-lock procedure applies the trigger's guards.
    #[test]
    fn the_locked_procedure_has_the_triggers_guards() {
        let n = Names::default();
        let p = plan()
            .in_database("app")
            .on_server(7)
            .serving(Some((0, 511)));
        let locked = locked_procedure_sql(&p, &n);
        for guard in [
            "IF DATABASE() <> 'app' THEN",
            "ELSEIF @@server_id <> 7 THEN",
            "ELSEIF (user_id & 1023) NOT BETWEEN 0 AND 511 THEN",
            "IS_USED_LOCK('shardflake ",
            "IF msg IS NOT NULL THEN\n    SIGNAL",
        ] {
            assert!(locked.contains(guard), "{guard}: {locked}");
        }
        // every guard before the write
        assert!(locked.find("IS_USED_LOCK").unwrap() < locked.find("UPDATE sequences").unwrap());
        // MySQL runs no clock event: no wait for its loop there
        let mysql = locked_procedure_sql(&p.clone().without_clock_loop(), &n);
        assert!(!mysql.contains("IS_USED_LOCK"), "{mysql}");
        assert!(mysql.contains("ELSEIF @@server_id <> 7 THEN"), "{mysql}");
        // generate_post_id refuses at every guard, not at the last one only
        let proc_ = procedure_sql(&p, &n);
        assert!(
            proc_.contains("\n      ELSEIF @@server_id <> 7 THEN"),
            "{proc_}"
        );
        assert!(
            proc_.contains("\n      IF msg IS NOT NULL THEN\n        SIGNAL"),
            "{proc_}"
        );
        // a copy beside the server, or the server moved
        let placed = locked_procedure_sql(&p.clone().at(3306, "/var/lib/mysql/"), &n);
        assert!(
            placed.contains("ELSEIF @@port <> 3306 OR @@datadir <> '/var/lib/mysql/' THEN"),
            "{placed}"
        );
        let t = trigger_sql(&p.clone().at(3306, "/var/lib/mysql/"), &n);
        assert!(
            t.contains(" AND @@server_id = 7 AND @@port = 3306 AND @@datadir = '/var/lib/mysql/'"),
            "{t}"
        );
        // `mysql sql`'s printout: no guard
        assert!(!locked_procedure_sql(&plan(), &n).contains("msg IS NOT NULL"));
    }

    #[test]
    fn ids_only_while_the_clock_loop_runs() {
        let n = Names::default();
        // What MariaDB computes: SELECT CONCAT('shardflake ', MD5('b1.posts_id_seq'))
        let lock = "'shardflake 8e6a6e720790f0f485277bbe84175b64'";
        let p = plan().in_database("b1");
        assert_eq!(p.clock_lock(&n).map(|l| lit(&l)).as_deref(), Some(lock));
        let running = format!("IS_USED_LOCK({lock}) IS NOT NULL");
        assert!(trigger_sql(&p, &n).contains(&running));
        assert!(procedure_sql(&p, &n).contains(&running));
        let stopped = format!("IS_USED_LOCK({lock}) IS NULL THEN");
        assert!(refused_function_sql(&p, &n).contains(&stopped));
        assert!(procedure_sql(&p, &n).contains(&stopped));
        // `mysql sql`'s printout, without a database: no such test
        assert!(!trigger_sql(&plan(), &n).contains("IS_USED_LOCK"));
    }

    #[test]
    fn a_random_start_starts_each_caught_up_tick() {
        let random = preset::resolve(
            "r: time 42 | shard 10 | sequence 11 (epoch 1288834974657 ms, random start 4 bits)",
        )
        .unwrap();
        let p = Plan::new(&random).unwrap();
        let start = format!("LEAST(t + (CRC32(t) & 15), {})", p.max_packed());
        assert_eq!(p.tick_start_sql("t"), start);
        let n = Names::default();
        let e = event_sql(&p, &n);
        assert_eq!(e.matches(&format!("', {start}, ', 0)")).count(), 2, "{e}");
        let insta = Plan::new(&preset::by_name("instagram").unwrap()).unwrap();
        assert_eq!(insta.tick_start_sql("t"), "t");
        assert!(!event_sql(&insta, &n).contains("CRC32"));
    }

    #[test]
    fn refused_layouts_and_names() {
        let no_shard = preset::by_name("snowflake").unwrap();
        assert!(matches!(
            Plan::new(&no_shard),
            Err(MysqlSqlError::NoShard(_))
        ));
        let wide = preset::resolve("w: time 40 | shard 1 | sequence 23").unwrap();
        assert!(matches!(Plan::new(&wide), Err(MysqlSqlError::TooWide(_))));
        let insta = preset::by_name("instagram").unwrap();
        let p = Plan::new(&insta).unwrap();
        // all 64 bits: refuse from the first negative tick (2046-06-27)
        assert_eq!(p.limit_tick(), 1 << 40);
        assert!(
            p.limit_text().starts_with("2046-06-27"),
            "{}",
            p.limit_text()
        );
        assert!(Names::new("posts; DROP", "user_id", "p").is_err());
        assert!(Names::new("posts", "1user", "p").is_err());
        assert!(Names::new(&"x".repeat(49), "user_id", "p").is_err());
        assert!(Names::new("posts", "user_id", "generate_post_id").is_ok());
    }

    #[test]
    fn shards_in_the_low_bits_and_ticks() {
        let l = preset::resolve("t: time 41 | sequence 12 | shard 10 (tick 10 ms)").unwrap();
        let p = Plan::new(&l).unwrap();
        assert_eq!(
            p.id_sql("w", "k"),
            "((w >> 12) << 22) | (k & 1023) | ((w & 4095) << 10)"
        );
        assert_eq!(p.packed_sql("us"), "((us DIV 10000) * 4096)");
        assert_eq!(p.packed_ms(LAG_MS), 1 << 12, "at least one tick");
    }
}
