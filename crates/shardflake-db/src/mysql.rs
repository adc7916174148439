//! Ids inside MariaDB/MySQL (Instagram's scheme from "Sharding & IDs at
//! Instagram", ported to a MySQL stored procedure `generate_post_id` in the
//! Korean post "서비스의 고유아이디를 만들기 위한 참고용 인스타그램 샤드키
//! 만들기"), made in the application's own
//! `INSERT`:
//!
//! ```sql
//! INSERT INTO posts (user_id, body) VALUES (?, ?) RETURNING id   -- MariaDB ≥ 10.5
//! ```
//!
//! or, for clients that read the id from the OK packet (`LAST_INSERT_ID`,
//! JDBC's generated keys), the same `INSERT` without `RETURNING`. A `BEFORE
//! INSERT` trigger on `posts` ([`sql::trigger_sql`]) draws the next value of a
//! MariaDB `SEQUENCE`, `posts_id_seq`, whose values are *packed* times and
//! sequences, `tick << sequence_bits | sequence` (the two low fields of the
//! id), and puts the shard (`user_id mod 2^shard_bits`) between them:
//!
//! ```text
//! w  := NEXT VALUE FOR posts_id_seq       -- never handed out twice
//! id := (w >> seq_bits) << time_shift | (user_id & shard_mask) << shard_shift | (w & seq_mask)
//! ```
//!
//! No call, no second statement, no lock held to commit: a sequence is not
//! transactional (a rolled-back insert wastes its value, it does not return
//! it), and a cached one hands out values from memory under a mutex. `id`
//! is `BIGINT AUTO_INCREMENT` only so that the OK packet carries the id the
//! trigger set. For callers who want the seed's JPA shape the same sequence
//! backs `CALL generate_post_id(?, ?)`; where there are no sequences
//! (MySQL), `generate_post_id_locked` counts in a row of the seed's
//! `sequences` table. The SQL is generated in [`sql`] from the same
//! [`Layout`] `shardflake decode` reads.
//!
//! Not a column `DEFAULT (NEXT VALUE FOR ...)`, though MariaDB allows it and
//! it costs less: on MariaDB 10.11.19, eight sessions running a server-side
//! prepared `INSERT` into a table with that default got one another's values
//! (duplicate keys, `NULL` ids) and crashed the server (signal 11); the same
//! expression in the trigger gave 16,000 distinct values.
//! `scripts/mariadb-default-bug.sh` reproduces it (two sessions suffice) and
//! prints `ok` on a server where the default has become safe. `mysql bench`
//! still measures the default, sent as text, for comparison.
//!
//! # Why no id is handed out twice
//!
//! 1. **The id is one to one in `w`.** For one shard key, `w`'s time and
//!    sequence bits land in disjoint fields of the id; other shards differ in
//!    the shard field. Two rows get one id only if they drew one `w`.
//! 2. **The sequence hands out each value at most once.** `NEXT VALUE FOR`
//!    takes the next value under the sequence's lock and moves past it. The
//!    sequence is `INCREMENT BY 1 NOCYCLE` with `MAXVALUE` at the layout's
//!    last packed value ([`Plan::max_packed`]), so it never wraps (past it,
//!    `NEXT VALUE FOR` fails: "Sequence ... has run out"). The one other
//!    writer is `SETVAL(seq, v, 0)`, which MariaDB ignores unless `v` is
//!    above every value handed out (it never moves a sequence down; the
//!    tests check it): values go out in increasing order.
//! 3. **A crash skips values, never repeats them.** A sequence with `CACHE n`
//!    hands out `n` values from memory after writing the first value past
//!    them (`next_not_cached_value`) to its InnoDB row; a restart resumes
//!    from that row. The write reaches the disk with the log: with
//!    `innodb_flush_log_at_trx_commit = 1` (or 2, against a killed server but
//!    not a crashed OS) every commit writes the log up to itself, and the
//!    reservation is in the log before any commit that stored an id drawn
//!    from it. With 0, the last second of the log can be lost and the
//!    sequence can restart below ids that were stored and returned
//!    (measured: a SIGKILL set it back 25,000 values). `mysql check` reports
//!    0; `mysql apply` warns.
//! 4. **Nothing else moves the sequence.** No `ALTER SEQUENCE ... RESTART`,
//!    no `INSERT` into the sequence table, no explicit ids above the
//!    sequence (`mysql apply` never does these; `mysql check` draws one
//!    value and verifies it is above every stored id). A dump restored
//!    into the running server does set it back: the clock event's loop,
//!    which outlives the restore's `DROP SEQUENCE`, puts it past the
//!    highest reservation it has seen ([`sql::event_sql`]), and the trigger
//!    refuses the set-back values meanwhile (more than [`sql::STALE_MS`]
//!    behind the clock, for a dump older than that). A restore while no
//!    loop runs is caught by the sequence's *high-water*
//!    ([`Plan::high_water`]), kept in database `shardflake` where a restore
//!    of the application's database cannot set it back, raised by the loop
//!    and never lowered: the trigger and `generate_post_id` refuse a draw
//!    below it, naming `shardflake mysql repair` ([`repair`]), and a loop
//!    started afterwards leaves such a sequence alone. Reading it costs the
//!    trigger about 4.5 µs of server CPU per row (`docs/BENCHMARKS.md`).
//! 5. **No id without the trigger.** `id` is `AUTO_INCREMENT` only for the
//!    OK packet; its counter is parked at 2^63-1
//!    ([`sql::AUTO_INCREMENT_PARKED`]), so an insert while a table restore
//!    has dropped the trigger fails rather than take the id above the
//!    newest row (the next one ours makes in that shard).
//!
//! This holds at any rate (more than 2^sequence_bits ids in one tick run
//! into the next tick: the id *borrows* time instead of wrapping) and at any
//! clock: the clock never enters the id.
//!
//! # The clock
//!
//! The time comes from catch-ups: `SETVAL(seq, packed clock, 0)` moves the
//! sequence up to the clock when it lags it by more than [`sql::LAG_MS`].
//! MariaDB's `SETVAL` takes only a literal number, and a `DEFAULT`, a
//! trigger or a stored function may not run dynamic SQL, so the catch-up
//! runs in an event, `posts_id_clock` ([`sql::event_sql`]): it fires every
//! second; the firing that gets a user-level lock loops for good and, about
//! every millisecond, reads the sequence's reserved value and, if it lags by
//! more than `LAG_MS`, runs `SETVAL` through `EXECUTE IMMEDIATE`. An id's time
//! therefore lags its insert by about `LAG_MS` plus the event's period at
//! most while the event runs, and is ahead of it only when more than
//! 2^sequence_bits ids per tick were drawn. `mysql apply` turns the event
//! scheduler on (put `event_scheduler=ON` in the server's configuration too)
//! and `mysql check` reports an event that is not running.
//!
//! The trigger reads the clock (`UTC_TIMESTAMP(6)`, the statement's start)
//! only to refuse, with an error (SQLSTATE 45000, from the function
//! `posts_id_refused`, in any `sql_mode`) naming the cause: a shard key that
//! is `NULL` or negative, a server clock before the layout's epoch or past
//! its end, and a sequence more than [`sql::STALE_MS`] behind the clock (the
//! event is not running). A used-up sequence fails with MariaDB's own
//! "Sequence 'db.posts_id_seq' has run out". After a restart, ids continue
//! from the sequence's reservation (dated before the crash) until the
//! event's first run, within a second of the start.
//!
//! Clock steps: backwards, ids keep coming from the sequence (dated ahead of
//! the clock until it catches up); forwards, the event moves the sequence up
//! within a millisecond or two, and an `INSERT` that runs first, more than
//! `STALE_MS` behind, fails rather than make an id dated that far back.
//!
//! # The procedures
//!
//! `generate_post_id(IN user_id, OUT id)` ([`sql::procedure_sql`]) draws from
//! the same sequence, so its ids and the trigger's never collide; a draw
//! that lags the clock catches the sequence up itself (a procedure may run
//! `EXECUTE IMMEDIATE`), so it needs no event. `generate_post_id_locked`
//! ([`sql::locked_procedure_sql`]) is the row-lock design for servers
//! without sequences; `generate_post_id_seed` is the seed's, verbatim, kept
//! to show its duplicates. All routines, the trigger, the event and the
//! table are created with `sql_mode` [`sql::SQL_MODE`] (a routine keeps the
//! mode it was created with); every range check comes before any write.
//!
//! Costs are measured in `docs/BENCHMARKS.md` (`scripts/bench-db.sh`).

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Pool};
use shardflake::Layout;

use crate::Error;

#[path = "mysql_sql.rs"]
pub mod sql;

#[path = "mysql_bench.rs"]
mod bench_impl;

pub use bench_impl::{BenchMode, BenchOptions, BenchReport, BenchResult, CpuResult, bench};
pub use sql::{MysqlSqlError, Names, Plan};

fn my(context: &str) -> impl FnOnce(mysql_async::Error) -> Error + '_ {
    move |source| Error::Mysql {
        context: context.to_string(),
        source,
    }
}

fn other(context: &str, message: impl Into<String>) -> Error {
    Error::MysqlRefused {
        context: context.to_string(),
        message: message.into(),
    }
}

fn plan(layout: &Layout) -> Result<Plan, Error> {
    Plan::new(layout).map_err(|e| other(&format!("layout {}", layout.name()), e.to_string()))
}

/// The plan for database `db`, whose high-water sequence lives in
/// [`sql::HIGH_WATER_DB`]; refuses that database itself (a restore of it
/// would set the high-water back) and names too long for it.
fn plan_in(layout: &Layout, db: &str, names: &Names) -> Result<Plan, Error> {
    if db.eq_ignore_ascii_case(sql::HIGH_WATER_DB) {
        return Err(other(
            "apply",
            format!(
                "database {db} holds the ids' high-water marks; put the tables in another database"
            ),
        ));
    }
    let hw = format!("{db}.{}", names.sequence());
    if hw.chars().count() > 64 {
        return Err(other(
            "apply",
            format!(
                "the high-water sequence {}.`{hw}` needs a name of at most 64 characters: use a shorter database or table name",
                sql::HIGH_WATER_DB
            ),
        ));
    }
    Ok(plan(layout)?.in_database(db))
}

/// The id sequence's reservation (`next_not_cached_value`) and its recorded
/// high-water (`None`: missing).
async fn reservation_and_floor(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
) -> Result<(i64, Option<i64>), Error> {
    let r = seq_options(conn, &names.sequence()).await?.next;
    let Some(hw) = plan.high_water(names) else {
        return Ok((r, None));
    };
    let floor: Result<Option<i64>, _> = conn
        .query_first(format!("SELECT next_not_cached_value FROM {hw}"))
        .await;
    match floor {
        Ok(f) => Ok((r, f)),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok((r, None)),
        Err(e) => Err(my("reading the high-water")(e)),
    }
}

/// MariaDB's "PROCEDURE ... does not exist".
const ER_SP_DOES_NOT_EXIST: u16 = 1305;

/// MariaDB's "Table ... doesn't exist".
const ER_NO_SUCH_TABLE: u16 = 1146;

fn set_back_text(names: &Names, plan: &Plan, r: i64, floor: i64) -> String {
    format!(
        "sequence {} is at {r}, below its high-water {floor} kept in {}: the database was restored from a dump, or the sequence recreated or set back, and ids above it may have been handed out; run shardflake mysql repair",
        names.sequence(),
        plan.high_water(names).unwrap_or_default().replace('`', "")
    )
}

/// Raises the recorded high-water to the sequence's reservation less its
/// cache (never lowers it).
async fn raise_floor(conn: &mut Conn, plan: &Plan, names: &Names) -> Result<(), Error> {
    let Some(hw) = plan.high_water(names) else {
        return Ok(());
    };
    let below: Option<i64> = conn
        .query_first(format!(
            "SELECT GREATEST(next_not_cached_value - cache_size, 0) FROM `{}`",
            names.sequence()
        ))
        .await
        .map_err(my("reading the sequence"))?;
    conn.query_drop(format!("DO SETVAL({hw}, {}, 0)", below.unwrap_or(0)))
        .await
        .map_err(my("raising the high-water"))
}

/// Connects a pool to `url` (`mysql://root@127.0.0.1:3306/app`).
pub fn pool(url: &str) -> Result<Pool, Error> {
    let opts = Opts::from_url(url).map_err(|e| Error::Mysql {
        context: format!("bad url {url:?}"),
        source: e.into(),
    })?;
    Ok(Pool::new(opts))
}

/// Which procedure to install or call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `generate_post_id`: draws from the table's sequence (MariaDB ≥ 10.3).
    Sequence,
    /// `generate_post_id_locked`: a row of `sequences` under its row lock
    /// (any MySQL or MariaDB).
    Locked,
    /// The seed's, verbatim: `generate_post_id_seed` (racy; for comparison).
    Seed,
}

impl Flavor {
    /// The procedure's name.
    pub fn procedure(self, names: &Names) -> String {
        match self {
            Flavor::Sequence => names.procedure.clone(),
            Flavor::Locked => names.locked_procedure(),
            Flavor::Seed => names.seed_procedure(),
        }
    }
}

/// What `apply` and `check` read from the server.
#[derive(Debug, Clone)]
pub struct Server {
    /// `VERSION()`.
    pub version: String,
    /// MariaDB (not MySQL).
    pub mariadb: bool,
    /// Major and minor version.
    pub major_minor: (u32, u32),
    /// `DATABASE()`: the URL must name one.
    pub database: Option<String>,
    /// `@@innodb_flush_log_at_trx_commit`.
    pub flush_log_at_trx_commit: i64,
    /// `@@event_scheduler` (`ON`, `OFF`, `DISABLED`).
    pub event_scheduler: String,
}

impl Server {
    /// `SEQUENCE` objects: MariaDB ≥ 10.3.
    pub fn has_sequences(&self) -> bool {
        self.mariadb && self.major_minor >= (10, 3)
    }
    /// `INSERT ... RETURNING`: MariaDB ≥ 10.5.
    pub fn has_returning(&self) -> bool {
        self.mariadb && self.major_minor >= (10, 5)
    }
}

/// Reads [`Server`].
pub async fn server(conn: &mut Conn) -> Result<Server, Error> {
    let row: Option<(String, Option<String>, i64, String)> = conn
        .query_first(
            "SELECT VERSION(), DATABASE(), @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.event_scheduler",
        )
        .await
        .map_err(my("reading the server's settings"))?;
    let (version, database, flush, scheduler) =
        row.ok_or_else(|| other("reading the server's settings", "no row"))?;
    let mut nums = version
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse::<u32>().ok());
    let major_minor = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    Ok(Server {
        mariadb: version.contains("MariaDB"),
        version,
        major_minor,
        database,
        flush_log_at_trx_commit: flush,
        event_scheduler: scheduler.to_ascii_uppercase(),
    })
}

/// What to install.
#[derive(Debug, Clone)]
pub struct Options {
    /// Table, shard-key column, procedure.
    pub names: Names,
    /// The sequence's `CACHE` (1 or 0: `NOCACHE`).
    pub cache: u64,
    /// Also the row-lock procedure and its `sequences` row.
    pub locked: bool,
    /// Also the seed's procedure (racy; for comparison).
    pub seed: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            names: Names::default(),
            cache: sql::DEFAULT_CACHE,
            locked: true,
            seed: false,
        }
    }
}

/// What `apply` did.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    /// Objects created or replaced, in order (`sequence posts_id_seq`, ...).
    pub installed: Vec<String>,
    /// Settings that weaken a guarantee, or that must also go into the
    /// server's configuration.
    pub warnings: Vec<String>,
    /// The clock event was seen running before `apply` returned.
    pub clock_running: bool,
    /// The procedure to call: `generate_post_id`, or on a server without
    /// sequences the row-lock one.
    pub procedure: String,
    /// Whether the one-statement ids (trigger, sequence, clock event) are
    /// installed (not on a server without sequences).
    pub one_statement: bool,
}

const FLUSH_0: &str = "innodb_flush_log_at_trx_commit = 0: a crash can lose the last second of InnoDB's log, with the sequence's reservations in it, so ids handed out just before a crash can be handed out again; set it to 1 (or 2: safe against a killed server, not against an OS crash)";

/// Installs, idempotently, on the database the connection uses: the
/// sequence (created at the server's packed clock; an existing one keeps
/// its position, gets the options the no-repeat argument needs, and is
/// caught up with the clock), the table if missing (an existing one keeps
/// its columns; an `id` with neither `AUTO_INCREMENT` nor a default gets
/// `DEFAULT 0`), the refusal function and the trigger (replaced in one
/// statement, only when they differ, so a re-run takes no table lock), the
/// clock event (a running loop with an older body is stopped; the scheduler
/// starts the new one within a second), `generate_post_id`, and with
/// [`Options::locked`] the row-lock procedure, with [`Options::seed`] the
/// seed's. Without sequences (MySQL) it installs only the row-lock
/// procedure. Refuses a server clock outside the layout, a sequence made
/// for another layout or already past it, an `id` column that is not a
/// signed `BIGINT`, and an event scheduler it cannot turn on; warns about
/// `innodb_flush_log_at_trx_commit = 0`.
pub async fn apply(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Applied, Error> {
    let srv = server(conn).await?;
    let Some(db) = srv.database.clone() else {
        return Err(other(
            "apply",
            "the URL names no database (mysql://user@host:port/DATABASE)",
        ));
    };
    let plan = plan_in(layout, &db, &opts.names)?;
    let old_mode: String = conn
        .query_first("SELECT @@SESSION.sql_mode")
        .await
        .map_err(my("reading sql_mode"))?
        .unwrap_or_default();
    conn.query_drop(format!("SET SESSION sql_mode = '{}'", sql::SQL_MODE))
        .await
        .map_err(my("setting sql_mode"))?;
    let result = apply_pinned(conn, &plan, opts, &srv).await;
    conn.exec_drop("SET SESSION sql_mode = ?", (old_mode,))
        .await
        .map_err(my("restoring sql_mode"))?;
    result
}

async fn apply_pinned(
    conn: &mut Conn,
    plan: &Plan,
    opts: &Options,
    srv: &Server,
) -> Result<Applied, Error> {
    let names = &opts.names;
    let mut applied = Applied {
        procedure: names.locked_procedure(),
        ..Applied::default()
    };
    if !srv.has_sequences() {
        applied.warnings.push(format!(
            "{} has no sequences (MariaDB >= 10.3 has): installed only {}, the row-lock procedure",
            srv.version,
            names.locked_procedure()
        ));
        if install_locked(conn, plan, names, srv.mariadb).await? {
            applied.installed.push(names.locked_procedure());
        }
        if opts.seed && install_seed(conn, names, srv.mariadb).await? {
            applied.installed.push(names.seed_procedure());
        }
        return Ok(applied);
    }
    if srv.flush_log_at_trx_commit == 0 {
        applied.warnings.push(FLUSH_0.to_string());
    }
    match srv.event_scheduler.as_str() {
        "ON" => {}
        "DISABLED" => {
            return Err(other(
                "apply",
                "event_scheduler is DISABLED (set at server start): the clock event cannot run; start the server with event_scheduler=ON",
            ));
        }
        _ => {
            conn.query_drop("SET GLOBAL event_scheduler = ON")
                .await
                .map_err(my(
                    "turning the event scheduler on (SET GLOBAL event_scheduler = ON)",
                ))?;
            applied.warnings.push(
                "turned the event scheduler on; put event_scheduler=ON in the server's configuration, or it is off again after a restart".into(),
            );
        }
    }
    let now = server_packed_clock(conn, plan).await?;
    // The high-water, outside this database (see `Plan::high_water`).
    if let Some(create) = sql::high_water_sql(plan, names) {
        conn.query_drop(format!(
            "CREATE DATABASE IF NOT EXISTS `{}`",
            sql::HIGH_WATER_DB
        ))
        .await
        .map_err(my("creating the high-water database"))?;
        conn.query_drop(create)
            .await
            .map_err(my("creating the high-water sequence"))?;
    }
    // The sequence.
    let seq = names.sequence();
    let kind = sequence_kind(conn, &seq).await?;
    match kind {
        None => {
            conn.query_drop(sql::sequence_sql(plan, names, now, opts.cache))
                .await
                .map_err(my("creating the sequence"))?;
            applied.installed.push(format!("sequence {seq}"));
        }
        Some((kind, engine, comment)) => {
            if kind != "SEQUENCE" {
                return Err(other(
                    "apply",
                    format!("{seq} exists and is a {kind}, not a sequence"),
                ));
            }
            if !engine.eq_ignore_ascii_case("InnoDB") {
                return Err(other(
                    "apply",
                    format!(
                        "sequence {seq} uses engine {engine}; the crash argument needs InnoDB (its reservations go to InnoDB's log)"
                    ),
                ));
            }
            if layout_of(&comment) != Some(plan.layout().to_string()) {
                return Err(other(
                    "apply",
                    format!(
                        "sequence {seq} was made for another layout ({comment:?}); its values mean other times: refusing to reuse it for {}",
                        plan.layout()
                    ),
                ));
            }
            let fix = sequence_fixes(conn, plan, names, opts.cache).await?;
            if let Some(alter) = fix {
                conn.query_drop(alter)
                    .await
                    .map_err(my("setting the sequence's options"))?;
                applied.installed.push(format!("options of sequence {seq}"));
            }
            if let (r, Some(floor)) = reservation_and_floor(conn, plan, names).await?
                && r < floor
            {
                return Err(other("apply", set_back_text(names, plan, r, floor)));
            }
            if comment != plan.marker() {
                conn.query_drop(format!(
                    "ALTER TABLE `{seq}` COMMENT = {}",
                    quote(&plan.marker())
                ))
                .await
                .map_err(my("marking the sequence"))?;
            }
        }
    }
    // Up with the clock now, so the first ids are dated now (SETVAL never
    // moves a sequence down).
    conn.query_drop(format!("DO SETVAL(`{seq}`, {now}, 0)"))
        .await
        .map_err(my("catching the sequence up with the clock"))?;
    raise_floor(conn, plan, names).await?;
    // The table (the seed's shape, if missing), the function and the trigger.
    match id_column(conn, &names.table).await? {
        None if table_exists(conn, &names.table).await? => {
            return Err(other(
                "apply",
                format!("table {} has no id column", names.table),
            ));
        }
        None => {
            conn.query_drop(sql::table_sql(plan, names))
                .await
                .map_err(my("creating the table"))?;
            applied.installed.push(format!("table {}", names.table));
        }
        Some(col) => {
            col.usable(&names.table)?;
            if col.auto_increment()
                && auto_increment_counter(conn, &names.table).await? < sql::AUTO_INCREMENT_PARKED
            {
                // Instant (metadata only): rows inserted while the trigger
                // is missing fail instead of taking ids ours repeat.
                conn.query_drop(format!(
                    "ALTER TABLE `{}` AUTO_INCREMENT = {}",
                    names.table,
                    sql::AUTO_INCREMENT_PARKED
                ))
                .await
                .map_err(my("parking the AUTO_INCREMENT counter"))?;
                applied.installed.push(format!(
                    "AUTO_INCREMENT of {} parked at {}",
                    names.table,
                    sql::AUTO_INCREMENT_PARKED
                ));
            }
            if !col.auto_increment() && col.default.is_none() {
                // INSERT ... SELECT without an id needs a default in strict mode.
                conn.query_drop(format!(
                    "ALTER TABLE `{}` ALTER COLUMN id SET DEFAULT 0",
                    names.table
                ))
                .await
                .map_err(my("giving the id column a default"))?;
                applied
                    .installed
                    .push(format!("default 0 of {}.id", names.table));
            }
        }
    }
    let refused = sql::refused_function_sql(plan, names);
    if routine_differs(conn, &names.refused_function(), "FUNCTION", &refused).await? {
        conn.query_drop(&refused)
            .await
            .map_err(my("creating the refusal function"))?;
        applied.installed.push(names.refused_function());
    }
    let trigger = sql::trigger_sql(plan, names);
    if trigger_differs(conn, names, &trigger).await? {
        conn.query_drop(&trigger)
            .await
            .map_err(my("creating the trigger"))?;
        applied
            .installed
            .push(format!("trigger {}", names.trigger()));
    }
    // The clock event.
    let event = names.event();
    let current: Option<(Option<String>, Option<String>, String)> = conn
        .exec_first(
            "SELECT EVENT_DEFINITION, EVENT_COMMENT, STATUS FROM information_schema.EVENTS WHERE EVENT_SCHEMA = DATABASE() AND EVENT_NAME = ?",
            (&event,),
        )
        .await
        .map_err(my("looking up the clock event"))?;
    let wanted = sql::event_sql(plan, names);
    let same = current.as_ref().is_some_and(|(def, comment, status)| {
        status == "ENABLED"
            && def.as_deref().map(str::trim) == body_after(&wanted, "\nDO ")
            && comment.as_deref() == comment_of(&wanted)
    });
    if !same {
        conn.query_drop(&wanted)
            .await
            .map_err(my("creating the clock event"))?;
        stop_clock(conn, names).await?;
        applied.installed.push(format!("event {event}"));
    }
    applied.clock_running = wait_clock(conn, names, Duration::from_secs(3)).await?;
    if !applied.clock_running {
        applied.warnings.push(format!(
            "the clock event {event} was not seen running within 3 s"
        ));
    }
    applied.one_statement = true;
    applied.procedure = names.procedure.clone();
    // The procedures.
    if replace_procedure(
        conn,
        &names.procedure,
        &sql::procedure_sql(plan, names),
        true,
    )
    .await?
    {
        applied.installed.push(names.procedure.clone());
    }
    if opts.locked && install_locked(conn, plan, names, true).await? {
        applied.installed.push(names.locked_procedure());
    }
    if opts.seed && install_seed(conn, names, true).await? {
        applied.installed.push(names.seed_procedure());
    }
    Ok(applied)
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The layout text in a [`Plan::marker`] (`shardflake vN: <layout>`).
fn layout_of(marker: &str) -> Option<String> {
    let rest = marker.strip_prefix("shardflake v")?;
    let (_, layout) = rest.split_once(": ")?;
    Some(layout.split("; ").next().unwrap_or(layout).to_string())
}

fn body_after<'a>(sql: &'a str, marker: &str) -> Option<&'a str> {
    sql.find(marker).map(|i| sql[i + marker.len()..].trim())
}

fn comment_of(sql: &str) -> Option<&str> {
    let i = sql.find("\nCOMMENT '")? + "\nCOMMENT '".len();
    let rest = &sql[i..];
    let end = rest.find("'\n")?;
    Some(&rest[..end])
}

/// The server's clock as a packed value; refuses a clock outside the layout.
async fn server_packed_clock(conn: &mut Conn, plan: &Plan) -> Result<i64, Error> {
    let row: Option<(Option<i64>, String)> = conn
        .query_first(format!(
            "SELECT {}, CAST(UTC_TIMESTAMP(3) AS CHAR)",
            plan.micros_sql("UTC_TIMESTAMP(6)")
        ))
        .await
        .map_err(my("reading the server's clock"))?;
    let (us, text) = row.ok_or_else(|| other("reading the server's clock", "no row"))?;
    let us = us.unwrap_or(-1);
    if us < 0 {
        return Err(other(
            "apply",
            format!(
                "the server clock ({text} UTC) is before the epoch {} UTC of layout {}",
                plan.epoch_datetime(),
                plan.layout().name()
            ),
        ));
    }
    let unix_ms = plan.layout().epoch_ms() + us as u64 / 1000;
    plan.packed_at(unix_ms).ok_or_else(|| {
        other(
            "apply",
            format!(
                "the server clock ({text} UTC) is past the last time of layout {} (ids end at {})",
                plan.layout().name(),
                plan.limit_text()
            ),
        )
    })
}

/// An `ALTER SEQUENCE` giving the options the argument needs, if any
/// differ; refuses a sequence already past the layout.
async fn sequence_fixes(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    cache: u64,
) -> Result<Option<String>, Error> {
    let seq = names.sequence();
    let o = seq_options(conn, &seq).await?;
    if o.next > plan.max_packed() + 1 {
        return Err(other(
            "apply",
            format!(
                "sequence {seq} is at {}, past the layout's last value {}",
                o.next,
                plan.max_packed()
            ),
        ));
    }
    let want_cache = cache.max(1) as i64;
    let mut fix = Vec::new();
    if o.min != 0 && o.min > 0 {
        fix.push("MINVALUE 0".to_string());
    }
    if o.max != plan.max_packed() {
        fix.push(format!("MAXVALUE {}", plan.max_packed()));
    }
    if o.increment != 1 {
        fix.push("INCREMENT BY 1".into());
    }
    if o.cycle {
        fix.push("NOCYCLE".into());
    }
    if o.cache.max(1) != want_cache {
        fix.push(if want_cache == 1 {
            "NOCACHE".to_string()
        } else {
            format!("CACHE {want_cache}")
        });
    }
    Ok((!fix.is_empty()).then(|| format!("ALTER SEQUENCE `{seq}` {}", fix.join(" "))))
}

struct SeqOptions {
    next: i64,
    min: i64,
    max: i64,
    increment: i64,
    cache: i64,
    cycle: bool,
}

async fn seq_options(conn: &mut Conn, seq: &str) -> Result<SeqOptions, Error> {
    let row: Option<(i64, i64, i64, i64, i64, i64)> = conn
        .query_first(format!(
            "SELECT next_not_cached_value, minimum_value, maximum_value, increment, cache_size, cycle_option FROM `{seq}`"
        ))
        .await
        .map_err(my("reading the sequence's options"))?;
    let (next, min, max, increment, cache, cycle) =
        row.ok_or_else(|| other("reading the sequence", "no row"))?;
    Ok(SeqOptions {
        next,
        min,
        max,
        increment,
        cache,
        cycle: cycle != 0,
    })
}

/// The table's `AUTO_INCREMENT` counter (0 when it has none).
async fn auto_increment_counter(conn: &mut Conn, table: &str) -> Result<i64, Error> {
    let n: Option<Option<u64>> = conn
        .exec_first(
            "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            (table,),
        )
        .await
        .map_err(my("reading the AUTO_INCREMENT counter"))?;
    Ok(n.flatten().map_or(0, |n| n.min(i64::MAX as u64) as i64))
}

async fn table_exists(conn: &mut Conn, table: &str) -> Result<bool, Error> {
    let n: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            (table,),
        )
        .await
        .map_err(my("looking up the table"))?;
    Ok(n.unwrap_or(0) > 0)
}

struct IdColumn {
    column_type: String,
    extra: String,
    default: Option<String>,
}

impl IdColumn {
    fn auto_increment(&self) -> bool {
        self.extra.to_ascii_lowercase().contains("auto_increment")
    }
    fn usable(&self, table: &str) -> Result<(), Error> {
        let t = self.column_type.to_ascii_lowercase();
        if !t.starts_with("bigint") || t.contains("unsigned") {
            return Err(other(
                "apply",
                format!("{table}.id is {}, not a signed BIGINT", self.column_type),
            ));
        }
        Ok(())
    }
}

async fn id_column(conn: &mut Conn, table: &str) -> Result<Option<IdColumn>, Error> {
    let row: Option<(String, String, Option<String>)> = conn
        .exec_first(
            "SELECT COLUMN_TYPE, EXTRA, COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'id'",
            (table,),
        )
        .await
        .map_err(my("looking up the id column"))?;
    Ok(row.map(|(column_type, extra, default)| IdColumn {
        column_type,
        extra,
        default: default.filter(|d| d != "NULL"),
    }))
}

/// The body of a `CREATE ... ROUTINE` from `BEGIN` on.
fn routine_body(create: &str) -> Option<&str> {
    create.find("\nBEGIN").map(|i| create[i + 1..].trim())
}

/// Whether a routine is missing or differs from `create` (its body or its
/// `sql_mode`).
async fn routine_differs(
    conn: &mut Conn,
    name: &str,
    kind: &str,
    create: &str,
) -> Result<bool, Error> {
    Ok(routine_problem(conn, name, kind, create).await?.is_some())
}

async fn routine_problem(
    conn: &mut Conn,
    name: &str,
    kind: &str,
    create: &str,
) -> Result<Option<String>, Error> {
    let row: Option<(Option<String>, String)> = conn
        .exec_first(
            "SELECT ROUTINE_DEFINITION, SQL_MODE FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ? AND ROUTINE_TYPE = ?",
            (name, kind),
        )
        .await
        .map_err(my("looking up a routine"))?;
    let kind_lc = kind.to_ascii_lowercase();
    Ok(match row {
        None => Some(format!("{kind_lc} {name} is missing")),
        Some((def, mode)) => {
            if def.as_deref().map(str::trim) != routine_body(create) {
                Some(format!(
                    "{kind_lc} {name} differs from this version's (another layout, or older): re-run apply"
                ))
            } else if !same_modes(&mode, sql::SQL_MODE) {
                Some(format!(
                    "{kind_lc} {name} was created with sql_mode {mode:?}, not {:?}: re-run apply",
                    sql::SQL_MODE
                ))
            } else {
                None
            }
        }
    })
}

async fn trigger_problem(
    conn: &mut Conn,
    names: &Names,
    create: &str,
) -> Result<Option<String>, Error> {
    let row: Option<(String, String, String, String)> = conn
        .exec_first(
            "SELECT ACTION_STATEMENT, ACTION_TIMING, EVENT_MANIPULATION, SQL_MODE FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ? AND EVENT_OBJECT_TABLE = ?",
            (names.trigger(), &names.table),
        )
        .await
        .map_err(my("looking up the trigger"))?;
    let name = names.trigger();
    let want = create
        .split_once("FOR EACH ROW\n")
        .map(|(_, body)| body.trim());
    Ok(match row {
        None => Some(format!(
            "trigger {name} on {} is missing: rows inserted without an id get none from the sequence",
            names.table
        )),
        Some((stmt, timing, event, mode)) => {
            if timing != "BEFORE" || event != "INSERT" || Some(stmt.trim()) != want {
                Some(format!(
                    "trigger {name} differs from this version's (another layout, or older): re-run apply"
                ))
            } else if !same_modes(&mode, sql::SQL_MODE) {
                Some(format!(
                    "trigger {name} has sql_mode {mode:?}: re-run apply"
                ))
            } else {
                None
            }
        }
    })
}

async fn trigger_differs(conn: &mut Conn, names: &Names, create: &str) -> Result<bool, Error> {
    Ok(trigger_problem(conn, names, create).await?.is_some())
}

async fn stop_clock(conn: &mut Conn, names: &Names) -> Result<(), Error> {
    let holder: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .map_err(my("looking for a running clock event"))?;
    if let Some(Some(id)) = holder {
        // An older loop: end it; the scheduler starts the new body.
        let _ = conn.query_drop(format!("KILL CONNECTION {id}")).await;
    }
    Ok(())
}

/// Waits up to `within` for the clock event's loop to hold its lock.
async fn wait_clock(conn: &mut Conn, names: &Names, within: Duration) -> Result<bool, Error> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if clock_running(conn, names).await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The sequence's table type, engine and comment, if it exists.
async fn sequence_kind(
    conn: &mut Conn,
    seq: &str,
) -> Result<Option<(String, String, String)>, Error> {
    conn.exec_first(
        "SELECT TABLE_TYPE, ENGINE, TABLE_COMMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        (seq,),
    )
    .await
    .map_err(my("looking up the sequence"))
}

/// Whether the clock event's loop runs (holds its lock).
pub async fn clock_running(conn: &mut Conn, names: &Names) -> Result<bool, Error> {
    let holder: Option<Option<u64>> = conn
        .query_first(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .map_err(my("looking for the clock event"))?;
    Ok(matches!(holder, Some(Some(_))))
}

/// The clock event loop's connection and how long its current statement
/// has run (seconds; the loop's statements take milliseconds), if it runs.
async fn clock_loop(conn: &mut Conn, names: &Names) -> Result<Option<(u64, i64)>, Error> {
    let row: Option<(Option<u64>, Option<i64>)> = conn
        .query_first(format!(
            "SELECT l.id, (SELECT TIME FROM information_schema.PROCESSLIST WHERE ID = l.id) \
             FROM (SELECT IS_USED_LOCK({}) AS id) l",
            names.clock_lock_sql()
        ))
        .await
        .map_err(my("looking for the clock event"))?;
    Ok(match row {
        Some((Some(id), time)) => Some((id, time.unwrap_or(0))),
        _ => None,
    })
}

/// What `check` finds wrong with the row-lock procedure, if anything.
async fn locked_procedure_problem(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
) -> Result<Option<String>, Error> {
    routine_problem(
        conn,
        &names.locked_procedure(),
        "PROCEDURE",
        &sql::locked_procedure_sql(plan, names),
    )
    .await
}

/// Creates or replaces a procedure whose body or `sql_mode` differs from
/// `create` (`CREATE OR REPLACE` on MariaDB: no moment without it; `DROP`
/// then `CREATE` on MySQL). Whether it did.
async fn replace_procedure(
    conn: &mut Conn,
    name: &str,
    create: &str,
    mariadb: bool,
) -> Result<bool, Error> {
    if !routine_differs(conn, name, "PROCEDURE", create).await? {
        return Ok(false);
    }
    if mariadb {
        let create = create.replacen("CREATE PROCEDURE", "CREATE OR REPLACE PROCEDURE", 1);
        conn.query_drop(create)
            .await
            .map_err(my("creating the procedure"))?;
    } else {
        conn.query_drop(format!("DROP PROCEDURE IF EXISTS `{name}`"))
            .await
            .map_err(my("dropping the old procedure"))?;
        conn.query_drop(create)
            .await
            .map_err(my("creating the procedure"))?;
    }
    Ok(true)
}

async fn install_locked(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    mariadb: bool,
) -> Result<bool, Error> {
    conn.query_drop(sql::sequences_sql(&names.locked_row()))
        .await
        .map_err(my("creating sequences"))?;
    replace_procedure(
        conn,
        &names.locked_procedure(),
        &sql::locked_procedure_sql(plan, names),
        mariadb,
    )
    .await
}

async fn install_seed(conn: &mut Conn, names: &Names, mariadb: bool) -> Result<bool, Error> {
    conn.query_drop(sql::sequences_sql(&names.seed_row()))
        .await
        .map_err(my("creating sequences"))?;
    replace_procedure(
        conn,
        &names.seed_procedure(),
        &sql::seed_procedure_sql(&names.seed_procedure(), &names.seed_row()),
        mariadb,
    )
    .await
}

/// The packed value (`tick << sequence_bits | sequence`) of the newest id
/// stored in the table, for layouts with time on top (`None`: empty table,
/// or time not on top).
async fn max_stored_packed(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
) -> Result<Option<i64>, Error> {
    let l = plan.layout();
    if l.fields().first().map(|f| f.kind()) != Some(shardflake::FieldKind::Time) {
        return Ok(None);
    }
    let (ts, tmax) = (l.time().shift(), l.time().max());
    let (qs, qbits, qmax) = (
        l.sequence().shift(),
        l.sequence().bits(),
        l.sequence().max(),
    );
    let max: Option<Option<i64>> = conn
        .query_first(format!("SELECT MAX(id) FROM `{}`", names.table))
        .await
        .map_err(my("reading the newest id"))?;
    let Some(Some(max)) = max else {
        return Ok(None);
    };
    if max < 0 {
        return Ok(None);
    }
    let tick = ((max as u64) >> ts) & tmax;
    let lo = (tick as i128) << ts;
    let hi = ((tick as i128 + 1) << ts).min(i64::MAX as i128);
    let seq: Option<Option<i64>> = conn
        .query_first(format!(
            "SELECT MAX((id >> {qs}) & {qmax}) FROM `{}` WHERE id >= {lo} AND id <= {hi}",
            names.table
        ))
        .await
        .map_err(my("reading the newest ids"))?;
    let seq = seq.flatten().unwrap_or(0);
    Ok(Some(((tick as i64) << qbits) | seq))
}

fn same_modes(a: &str, b: &str) -> bool {
    let set = |s: &str| {
        let mut v: Vec<String> = s
            .split(',')
            .filter(|m| !m.is_empty())
            .map(|m| m.trim().to_ascii_uppercase())
            .collect();
        v.sort();
        v
    };
    set(a) == set(b)
}

/// Reports every difference between the server and what [`apply`] installs
/// with `opts`, and every setting that breaks the no-repeat argument or the
/// clock: `innodb_flush_log_at_trx_commit = 0`, the event scheduler off,
/// the clock event not running, a sequence that is not InnoDB, cycles,
/// increments by other than 1, ends past the layout, draws a value at or
/// below a stored id or lags the clock by more than [`sql::STALE_MS`]. Draws
/// one value from the sequence. An empty list: all is well.
pub async fn check(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Vec<String>, Error> {
    let srv = server(conn).await?;
    let names = &opts.names;
    let mut problems = Vec::new();
    let Some(db) = srv.database.clone() else {
        problems.push("the URL names no database".to_string());
        return Ok(problems);
    };
    let plan = plan_in(layout, &db, names)?;
    if !srv.has_sequences() {
        problems.extend(locked_procedure_problem(conn, &plan, names).await?);
        return Ok(problems);
    }
    if srv.flush_log_at_trx_commit == 0 {
        problems.push(FLUSH_0.to_string());
    }
    if srv.event_scheduler != "ON" {
        problems.push(format!(
            "event_scheduler = {}: a clock event loop that ends (a restart, a KILL) is not started again; then ids' times fall behind the clock and INSERTs fail once the sequence is {} s behind (SET GLOBAL event_scheduler = ON, and in the server's configuration)",
            srv.event_scheduler,
            sql::STALE_MS / 1000
        ));
    }
    let seq = names.sequence();
    let kind = sequence_kind(conn, &seq).await?;
    match kind {
        None => problems.push(format!("sequence {seq} is missing")),
        Some((kind, _, _)) if kind != "SEQUENCE" => {
            problems.push(format!("{seq} is a {kind}, not a sequence"))
        }
        Some((_, engine, comment)) => {
            if !engine.eq_ignore_ascii_case("InnoDB") {
                problems.push(format!(
                    "sequence {seq} uses engine {engine}, not InnoDB: its reservations may not survive a crash"
                ));
            }
            if comment != plan.marker() {
                problems.push(format!(
                    "sequence {seq} is marked {comment:?}, not {:?}",
                    plan.marker()
                ));
            }
            let o = seq_options(conn, &seq).await?;
            if o.increment != 1 {
                problems.push(format!(
                    "sequence {seq} increments by {}, not 1",
                    o.increment
                ));
            }
            if o.cycle {
                problems.push(format!(
                    "sequence {seq} cycles: it would hand out values again"
                ));
            }
            if o.max != plan.max_packed() || o.min < 0 {
                problems.push(format!(
                    "sequence {seq} runs from {} to {}, not 0 to {} (the layout's last packed value)",
                    o.min,
                    o.max,
                    plan.max_packed()
                ));
            }
            match reservation_and_floor(conn, &plan, names).await? {
                (_, None) => problems.push(format!(
                    "the high-water sequence {} is missing (the server was restored, or it was dropped): inserts fail; run shardflake mysql repair",
                    plan.high_water(names).unwrap_or_default().replace('`', "")
                )),
                (r, Some(floor)) if r < floor => {
                    problems.push(set_back_text(names, &plan, r, floor))
                }
                _ => {}
            }
            let drawn: Option<i64> = conn
                .query_first(format!("SELECT NEXT VALUE FOR `{seq}`"))
                .await
                .map_err(my("drawing from the sequence"))?;
            let drawn = drawn.unwrap_or(i64::MAX);
            if let Some(stored) = max_stored_packed(conn, &plan, names).await?
                && drawn <= stored
            {
                problems.push(format!(
                    "sequence {seq} hands out {drawn}, at or below the packed value {stored} of an id stored in {}: ids would repeat",
                    names.table
                ));
            }
            if let Ok(now) = server_packed_clock(conn, &plan).await
                && drawn + plan.packed_ms(sql::STALE_MS) < now
            {
                problems.push(format!(
                    "sequence {seq} is {} ms behind the server clock: INSERTs fail until the clock event catches it up",
                    (now - drawn) / plan.per_tick() * plan.layout().tick_ms() as i64
                ));
            }
        }
    }
    match id_column(conn, &names.table).await? {
        None => problems.push(format!("table {} or its id column is missing", names.table)),
        Some(col) => {
            if let Err(e) = col.usable(&names.table) {
                problems.push(e.to_string());
            }
            let counter = auto_increment_counter(conn, &names.table).await?;
            if col.auto_increment() && counter < sql::AUTO_INCREMENT_PARKED {
                problems.push(format!(
                    "table {}'s AUTO_INCREMENT counter is at {counter}: while its trigger is missing (a restore of the table drops it) inserts take ids from it that ours repeat; re-run apply (it parks the counter at {}, so such inserts fail)",
                    names.table,
                    sql::AUTO_INCREMENT_PARKED
                ));
            }
        }
    }
    problems.extend(
        routine_problem(
            conn,
            &names.refused_function(),
            "FUNCTION",
            &sql::refused_function_sql(&plan, names),
        )
        .await?,
    );
    problems.extend(trigger_problem(conn, names, &sql::trigger_sql(&plan, names)).await?);
    let event = names.event();
    let current: Option<(Option<String>, Option<String>, String, String)> = conn
        .exec_first(
            "SELECT EVENT_DEFINITION, EVENT_COMMENT, STATUS, SQL_MODE FROM information_schema.EVENTS WHERE EVENT_SCHEMA = DATABASE() AND EVENT_NAME = ?",
            (&event,),
        )
        .await
        .map_err(my("looking up the clock event"))?;
    let wanted = sql::event_sql(&plan, names);
    match current {
        None => problems.push(format!("event {event} is missing")),
        Some((def, comment, status, mode)) => {
            if status != "ENABLED" {
                problems.push(format!("event {event} is {status}"));
            }
            if def.as_deref().map(str::trim) != body_after(&wanted, "\nDO ")
                || comment.as_deref() != comment_of(&wanted)
            {
                problems.push(format!(
                    "event {event} differs from this version's: re-run apply"
                ));
            }
            if !same_modes(&mode, sql::SQL_MODE) {
                problems.push(format!("event {event} has sql_mode {mode:?}: re-run apply"));
            }
        }
    }
    match clock_loop(conn, names).await? {
        None => problems.push(format!(
            "the clock event {event} is not running (nothing holds its lock)"
        )),
        Some((id, secs)) if secs > 2 => problems.push(format!(
            "the clock event {event}'s loop (connection {id}) has not moved for {secs} s: it is stuck; KILL {id} (the scheduler starts it again within a second)"
        )),
        Some(_) => {}
    }
    problems.extend(
        routine_problem(
            conn,
            &names.procedure,
            "PROCEDURE",
            &sql::procedure_sql(&plan, names),
        )
        .await?,
    );
    if opts.locked {
        problems.extend(locked_procedure_problem(conn, &plan, names).await?);
    }
    Ok(problems)
}

/// What [`repair`] did: the id sequence's reservation before and the value
/// it hands out next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repaired {
    /// The sequence's reservation (`next_not_cached_value`) found.
    pub from: i64,
    /// Its next value now, also the recorded high-water.
    pub to: i64,
}

/// After a restore (of the database from a dump, or of the whole server),
/// or a sequence recreated or set back: moves the id sequence past every
/// value it can have handed out (the larger of its recorded high-water,
/// the newest stored id and the server clock, plus [`sql::RESTORE_HEADROOM_MS`]
/// and a cache's worth) and records that as the high-water (re-creating it
/// if the server restore lost it). Values drawn after the last record
/// while no clock event ran are not known to it: restore while the event
/// runs, or wait out how far ahead the ids ran before repairing.
/// Refuses where `apply` has not installed the ids.
pub async fn repair(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Repaired, Error> {
    let srv = server(conn).await?;
    let Some(db) = srv.database.clone() else {
        return Err(other(
            "repair",
            "the URL names no database (mysql://user@host:port/DATABASE)",
        ));
    };
    let names = &opts.names;
    let plan = plan_in(layout, &db, names)?;
    let seq = names.sequence();
    match sequence_kind(conn, &seq).await? {
        Some((kind, _, comment))
            if kind == "SEQUENCE" && layout_of(&comment) == Some(layout.to_string()) => {}
        _ => {
            return Err(other(
                "repair",
                format!(
                    "no sequence {seq} made for layout {} in {db}: run shardflake mysql apply",
                    layout.name()
                ),
            ));
        }
    }
    if let Some(create) = sql::high_water_sql(&plan, names) {
        conn.query_drop(format!(
            "CREATE DATABASE IF NOT EXISTS `{}`",
            sql::HIGH_WATER_DB
        ))
        .await
        .map_err(my("creating the high-water database"))?;
        conn.query_drop(create)
            .await
            .map_err(my("creating the high-water sequence"))?;
    }
    let o = seq_options(conn, &seq).await?;
    let (from, floor) = reservation_and_floor(conn, &plan, names).await?;
    let stored = max_stored_packed(conn, &plan, names).await?.unwrap_or(0);
    let now = server_packed_clock(conn, &plan).await?;
    let past = floor.unwrap_or(0).max(stored + 1).max(now).max(from)
        + plan.packed_ms(sql::RESTORE_HEADROOM_MS)
        + o.cache.max(0);
    if past > plan.max_packed() {
        return Err(other(
            "repair",
            format!(
                "sequence {seq} would move to {past}, past the layout's last value {}",
                plan.max_packed()
            ),
        ));
    }
    conn.query_drop(format!("DO SETVAL(`{seq}`, {past}, 0)"))
        .await
        .map_err(my("moving the sequence past its high-water"))?;
    if let Some(hw) = plan.high_water(names) {
        conn.query_drop(format!("DO SETVAL({hw}, {past}, 0)"))
            .await
            .map_err(my("recording the high-water"))?;
    }
    tracing::info!(sequence = %seq, from, to = past, "mysql repair moved the sequence");
    Ok(Repaired { from, to: past })
}

/// Calls a procedure as the seed's ORM id generator does, IN the shard key,
/// OUT the id, in one round trip (the OUT parameter comes back through the
/// binary protocol, as JDBC's `CallableStatement` reads it).
pub async fn generate_post_id(
    conn: &mut Conn,
    procedure: &str,
    user_id: i64,
) -> Result<i64, Error> {
    let id: Option<Option<i64>> = conn
        .exec_first(
            format!("CALL `{procedure}`(?, ?)"),
            (user_id, mysql_async::Value::NULL),
        )
        .await
        .map_err(|e| match e {
            mysql_async::Error::Server(s) if s.code == ER_SP_DOES_NOT_EXIST => other(
                "calling the procedure",
                format!(
                    "{procedure} is not installed in this database: run shardflake mysql apply{}",
                    if procedure.ends_with("_seed") {
                        " --seed (the seed's procedure is installed only on request)"
                    } else {
                        ""
                    }
                ),
            ),
            e => my("calling the procedure")(e),
        })?;
    id.flatten()
        .ok_or_else(|| other("calling the procedure", "it returned no id"))
}

/// The one-statement insert: `INSERT INTO posts (user_id, body) VALUES (?,
/// ?) RETURNING id` (MariaDB ≥ 10.5).
pub async fn insert(
    conn: &mut Conn,
    names: &Names,
    user_id: i64,
    body: &str,
) -> Result<i64, Error> {
    let id: Result<Option<i64>, _> = conn
        .exec_first(
            format!(
                "INSERT INTO `{}` (`{}`, body) VALUES (?, ?) RETURNING id",
                names.table, names.key
            ),
            (user_id, body),
        )
        .await;
    match id {
        Ok(id) => id.ok_or_else(|| other("inserting", "RETURNING gave no row")),
        Err(e) => Err(explained(e, "inserting")),
    }
}

/// A failed insert's error, with a word on a used-up sequence (MariaDB's
/// own "Sequence '...' has run out", raised by the trigger's draw).
pub fn explained(e: mysql_async::Error, context: &str) -> Error {
    let run_out = matches!(&e, mysql_async::Error::Server(s) if s.code == sql::ER_SEQUENCE_RUN_OUT);
    Error::Mysql {
        context: if run_out {
            format!("{context} (the id sequence is used up: the layout's last time is reached)")
        } else {
            context.to_string()
        },
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_and_bodies() {
        let l = shardflake::preset::by_name("mysql-procedure").unwrap();
        let p = Plan::new(&l).unwrap();
        assert_eq!(layout_of(&p.marker()), Some(l.to_string()));
        assert!(
            routine_body(&sql::procedure_sql(&p, &Names::default()))
                .unwrap()
                .starts_with("BEGIN")
        );
        assert_eq!(layout_of("hello"), None);
        let e = sql::event_sql(&p, &Names::default());
        assert!(body_after(&e, "\nDO ").unwrap().starts_with("BEGIN"));
        assert_eq!(comment_of(&e), Some("shardflake v1 clock event, loop v2"));
        assert!(same_modes(
            "NO_ENGINE_SUBSTITUTION,STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO",
            sql::SQL_MODE
        ));
        assert!(!same_modes("", sql::SQL_MODE));
    }
}
