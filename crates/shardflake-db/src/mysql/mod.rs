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
//!    started afterwards leaves such a sequence alone. They read the
//!    high-water *before* the draw: the loop records the reservation less
//!    the cache, below every value drawn after it read them, so only a
//!    sequence set back is refused (read after the draw, a high-water
//!    raised while the row's thread waited for a CPU refused a draw made
//!    before it). Reading it costs the
//!    trigger about 4.5 µs of server CPU per row (`docs/BENCHMARKS.md`).
//!    Only the loop sees a restore and records the high-water, so the
//!    trigger and `generate_post_id` make no id while it is not running
//!    (they test that it holds its user-level lock, `IS_USED_LOCK`, about
//!    1 µs per row): a dump taken while no loop runs holds a sequence at or
//!    past every value handed out, and nothing is drawn again after it is
//!    restored (issue 37, C: with no loop, writers that ran the sequence
//!    ahead of the clock had their ids made again by a restore).
//! 5. **No id without the trigger.** `id` is `AUTO_INCREMENT` only for the
//!    OK packet; its counter is parked at 2^63-1
//!    ([`sql::AUTO_INCREMENT_PARKED`]), so an insert while a table restore
//!    has dropped the trigger does not take the id above the newest row
//!    (the next one ours makes in that shard), and an invisible column
//!    only the trigger sets ([`sql::GUARD_COLUMN`], `CHECK`ed) makes it
//!    fail rather than take 2^63-1, which each restore of one dump would
//!    hand out again.
//!
//! This holds at any rate (more than 2^sequence_bits ids in one tick run
//! into the next tick: the id *borrows* time instead of wrapping) and at any
//! clock: the clock never enters the id.
//!
//! 6. **No draw is handed out far ahead of the clock.** A draw more than
//!    [`sql::AHEAD_MS`] ahead of the server clock (a burst borrowing time)
//!    waits until the clock is within that of it; more than twice that
//!    ahead (the clock stepped back) it is refused. So every value ever
//!    handed out is at most the clock plus `AHEAD_MS`, and `mysql repair`
//!    after any restore (of the database or the whole server) puts the
//!    sequence past the clock plus `AHEAD_MS`: past every value made before,
//!    whether or not a clock event recorded it, provided the server's clock
//!    did not step back across the restore.
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
//! "Sequence 'db.posts_id_seq' has run out". After a restart (or with the
//! scheduler turned on again), inserts are refused until the event's loop
//! runs, within about two seconds ("the clock event ... is not running"):
//! a starting loop waits [`sql::START_WAIT_MS`] and catches the sequence up
//! with the clock before any id is made, so a dump taken while the last
//! loop ran and restored before this one started repeats no id.
//!
//! Clock steps: backwards by up to [`sql::AHEAD_MS`], ids keep coming from
//! the sequence (dated ahead of the clock until it catches up); by up to
//! twice that, each `INSERT` waits until the clock is within `AHEAD_MS` of
//! its draw; further back, `INSERT`s fail ("did the clock step back?")
//! until the clock is back. Forwards, the event moves the sequence up
//! within a millisecond or two, and an `INSERT` that runs first, more than
//! `STALE_MS` behind, fails rather than make an id dated that far back.
//!
//! # The procedures
//!
//! `generate_post_id(IN user_id, OUT id)` ([`sql::procedure_sql`]) draws from
//! the same sequence, so its ids and the trigger's never collide; a draw
//! that lags the clock catches the sequence up itself (a procedure may run
//! `EXECUTE IMMEDIATE`); like the trigger, it makes ids only while the
//! clock event's loop runs. `generate_post_id_locked`
//! ([`sql::locked_procedure_sql`]) is the row-lock design for servers
//! without sequences; `generate_post_id_seed` is the seed's, verbatim, kept
//! to show its duplicates (installed only on request). The trigger and
//! every other procedure apply the same guards before any id: the
//! database, `@@server_id`, `@@port` and `@@datadir` they were installed
//! for (a promoted replica, a copy of the database or of the server's
//! data directory started beside it, refuses), the shard values the
//! server records, and the clock event's loop (with sequences).
//!
//! # Commands across servers
//!
//! `apply`, `repair` and `adopt` take the table's deployment lock
//! (`DeploymentLock`, a user-level lock) on the server and every
//! `--peer`, in one order, before reading any server's records of shard
//! values, and hold it until this server's record and trigger are
//! written: two commands on servers that name each other run one after
//! the other. Where the objects were made for another server (a promoted
//! replica, a copy, the server moved), `repair` and `apply` take its
//! shard values only on proof that it makes them no more: that server
//! named as a `--peer` holding none of them, or `--old-server-gone`
//! naming it (`SERVER_ID:PORT:DATADIR`) exactly. Every other database
//! of the server is a peer too, named by `--peer` or not (same server,
//! same lock: its name is the table's), unless one of the two is a
//! deployment of its own (`--new-deployment`); a recorded database that
//! was dropped still counts (its ids come back with it) until its row
//! of `shardflake.serves` is deleted. A change to the table waits at most [`TABLE_LOCK_WAIT_S`]
//! for the transactions that used it. All routines, the trigger, the event and the
//! table are created with `sql_mode` [`sql::SQL_MODE`] (a routine keeps the
//! mode it was created with); every range check comes before any write.
//!
//! Costs are measured in `docs/BENCHMARKS.md` (`scripts/bench-db.sh`).

use std::time::Duration;

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts, Pool};
use shardflake::Layout;

use crate::Error;

pub mod sql;

mod adopt;
mod apply;
mod check;
mod installed;
mod repair;

pub use adopt::{
    AdoptOptions, Adopted, AdoptedTable, TableCheck, Tables, adopt, adopt_tables, adopted,
    check_tables, tables,
};
pub use apply::{Applied, apply};
pub use check::check;
pub use installed::clock_running;
use installed::*;
pub use repair::{Repaired, repair};
pub use sql::{MysqlSqlError, Names, Plan};

fn my(context: &str) -> impl FnOnce(mysql_async::Error) -> Error + '_ {
    Error::mysql(context)
}

fn other(context: &str, message: impl Into<String>) -> Error {
    Error::mysql_refused(context, message)
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

/// MariaDB's "PROCEDURE ... does not exist".
const ER_SP_DOES_NOT_EXIST: u16 = 1305;

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
    /// `@@server_id`: a replica's differs from its primary's.
    pub server_id: u32,
    /// `@@port` and `@@datadir`: a copy of the server started beside it
    /// (its data directory copied) has the same `server_id` from the same
    /// configuration, and another port or data directory.
    pub port: u16,
    /// `@@datadir`.
    pub datadir: String,
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
    /// The database the URL names, which `context` (`apply`, `repair`)
    /// needs.
    fn named_database(&self, context: &str) -> Result<String, Error> {
        self.database.clone().ok_or_else(|| {
            other(
                context,
                "the URL names no database (mysql://user@host:port/DATABASE)",
            )
        })
    }
}

/// Reads [`Server`].
pub async fn server(conn: &mut Conn) -> Result<Server, Error> {
    /// VERSION(), DATABASE(), the two settings, @@server_id, @@port, @@datadir.
    type Settings = (String, Option<String>, i64, String, u32, u16, String);
    let row: Option<Settings> = conn
        .query_first(
            "SELECT VERSION(), DATABASE(), @@GLOBAL.innodb_flush_log_at_trx_commit, @@GLOBAL.event_scheduler, @@server_id, @@port, @@datadir",
        )
        .await
        .map_err(my("reading the server's settings"))?;
    let (version, database, flush, scheduler, server_id, port, datadir) =
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
        server_id,
        port,
        datadir,
    })
}

/// The `server_id` the installed trigger was made for ([`Plan::on_server`]),
/// if there is one that names it.
async fn installed_server_id(conn: &mut Conn, names: &Names) -> Result<Option<u32>, Error> {
    let body: Option<String> = conn
        .exec_first(
            "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?",
            (names.trigger(),),
        )
        .await
        .map_err(my("reading the trigger"))?;
    Ok(body.and_then(|b| {
        let rest = b.split_once("@@server_id = ")?.1;
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }))
}

/// The server the installed trigger was made for ([`Plan::on_server`],
/// [`Plan::at`]): what its guard tests, and what `repair
/// --old-server-gone` must name (`SERVER_ID:PORT:DATADIR`, or
/// `SERVER_ID` for objects of a release before the guard tested the
/// port and data directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct InstalledFor {
    server_id: u32,
    place: Option<(u16, String)>,
}

impl std::fmt::Display for InstalledFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.place {
            Some((port, dir)) => write!(f, "{}:{port}:{dir}", self.server_id),
            None => write!(f, "{}", self.server_id),
        }
    }
}

impl InstalledFor {
    /// Whether a server with these `@@server_id`, `@@port` and `@@datadir`
    /// passes the guard.
    fn is(&self, server_id: u32, port: u16, datadir: &str) -> bool {
        self.server_id == server_id
            && self
                .place
                .as_ref()
                .is_none_or(|(p, d)| *p == port && d == datadir)
    }

    /// Reads it from the trigger's text (`@@server_id = N`, then
    /// [`Plan::place_sql`]); `None` where the trigger names no server.
    fn parse(body: &str) -> Option<InstalledFor> {
        let number = |rest: &str| -> Option<u64> {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        };
        let server_id = u32::try_from(number(body.split_once("@@server_id = ")?.1)?).ok()?;
        let place = body.split_once(" AND @@port = ").and_then(|(_, rest)| {
            let port = u16::try_from(number(rest)?).ok()?;
            let lit = rest.split_once(" AND @@datadir = '")?.1;
            // The literal as `sql::lit` writes it: '' and \\ escaped.
            let (mut dir, mut chars) = (String::new(), lit.chars().peekable());
            loop {
                match chars.next()? {
                    '\'' if chars.peek() == Some(&'\'') => {
                        chars.next();
                        dir.push('\'');
                    }
                    '\'' => break,
                    '\\' => dir.push(chars.next()?),
                    c => dir.push(c),
                }
            }
            Some((port, dir))
        });
        Some(InstalledFor { server_id, place })
    }
}

/// The server the installed trigger was made for, if one names it.
pub(super) async fn installed_for(
    conn: &mut Conn,
    names: &Names,
) -> Result<Option<InstalledFor>, Error> {
    let body: Option<String> = conn
        .exec_first(
            "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?",
            (names.trigger(),),
        )
        .await
        .map_err(my("reading the trigger"))?;
    Ok(body.as_deref().and_then(InstalledFor::parse))
}

/// Where this table's objects were made for this server (or are not
/// installed): the first object of another table of this server, in any
/// database, made for another server (`db.table`, and that server). Review
/// E8: a data directory copy refused its copied table's ids, yet took a
/// new table with no proof and made the original's ids for it; a server
/// any of whose objects name another is a copy for every table.
pub(super) async fn copied_server(
    conn: &mut Conn,
    srv: &Server,
) -> Result<Option<(String, InstalledFor)>, Error> {
    let triggers: Vec<(String, String, String)> = conn
        .query(
            "SELECT TRIGGER_SCHEMA, EVENT_OBJECT_TABLE, ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE ACTION_STATEMENT LIKE '%@@server_id = %' ORDER BY TRIGGER_SCHEMA, EVENT_OBJECT_TABLE",
        )
        .await
        .map_err(my("reading which server each trigger was made for"))?;
    Ok(triggers.into_iter().find_map(|(db, table, body)| {
        InstalledFor::parse(&body)
            .filter(|w| !w.is(srv.server_id, srv.port, &srv.datadir))
            .map(|w| (format!("{db}.{table}"), w))
    }))
}

/// Refuses `command` taking over the ids of the server the objects were
/// installed for, `was`, when this is another (a promoted replica, a copy
/// of its data directory or backup, the server moved), unless the
/// operator proved that server makes none of this one's values any more:
/// a `--peer` that is it (a peer whose records meet `serves` was refused
/// before), or [`Options::old_server_gone`] naming `was` exactly (it is
/// stopped for good, or this is it, moved). Review E6/E7: a plain
/// `repair` on a copy started beside its running original, or on a
/// replica promoted while the old primary ran, recorded it for all of
/// the original's values, and both made the same ids.
///
/// `other_table`: where `was` is read from another table's objects
/// ([`copied_server`]), that table; this one's are not installed for
/// another server, and `command --old-server-gone` is the way out.
pub(super) async fn old_server_proven_gone(
    command: &str,
    opts: &Options,
    was: &InstalledFor,
    other_table: Option<&str>,
    srv: &Server,
) -> Result<(), Error> {
    if was.is(srv.server_id, srv.port, &srv.datadir) {
        return Ok(());
    }
    let here = InstalledFor {
        server_id: srv.server_id,
        place: Some((srv.port, srv.datadir.clone())),
    };
    let named = opts.old_server_gone.as_deref();
    if named == Some(was.to_string().as_str()) {
        tracing::warn!(old = %was, here = %here, "mysql {command}: taking over the ids of a server named gone by --old-server-gone");
        return Ok(());
    }
    for url in &opts.peers {
        let opts = Opts::from_url(url).map_err(|e| other(command, format!("peer {url}: {e}")))?;
        let mut peer = Conn::new(opts)
            .await
            .map_err(|e| other(command, format!("peer {url} does not answer: {e}")))?;
        let them: Option<(u32, u16, String)> = peer
            .query_first("SELECT @@server_id, @@port, @@datadir")
            .await
            .map_err(my("reading which server a peer is"))?;
        let _ = peer.disconnect().await;
        if them.is_some_and(|(id, port, dir)| was.is(id, port, &dir)) {
            return Ok(());
        }
    }
    let wrong = match named {
        Some(n) => format!(
            "--old-server-gone {n} does not name the server they were installed for, {was}: "
        ),
        None => String::new(),
    };
    // Only `repair` takes `--old-server-gone`: for another table, it is
    // repaired first (its database in the URL), then this command again.
    let (whose, gone_cmd) = match other_table {
        Some(t) => (
            format!(
                "{t} on this server (so this server is a copy for {} too)",
                opts.names.table
            ),
            format!(
                "repair (the URL naming that table's database, --table its name) then {command} again, the repair with"
            ),
        ),
        None => (format!("{} here", opts.names.table), "repair".to_string()),
    };
    Err(other(
        command,
        format!(
            "nothing was changed: {wrong}the ids of {whose} were installed for server {was} (SERVER_ID:PORT:DATADIR), and this is {here}: a promoted replica, a copy of that server (its data directory or backup started here), or the server moved. While that server runs it makes the same ids for the shard values it records, so this one takes them over only on proof that it makes them no more. If it or another copy of it still runs: give each of those values of its own there (shardflake mysql apply --shards LO-HI), then this one the rest, naming every other server, since one not named is not checked and makes the same ids: shardflake mysql {command} --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER (one --peer each). Only if it is stopped for good and no other copy runs, or this is it moved: shardflake mysql {gone_cmd} --old-server-gone '{was}'"
        ),
    ))
}

/// The database the installed trigger was made for, when it names one
/// other than `db` (the high-water it reads, `` `shardflake`.`DB.SEQ` ``):
/// `db` is a copy of that database on this server, loaded from its dump.
async fn installed_for_another_database(
    conn: &mut Conn,
    db: &str,
    names: &Names,
) -> Result<Option<String>, Error> {
    let body: Option<String> = conn
        .exec_first(
            "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?",
            (names.trigger(),),
        )
        .await
        .map_err(my("reading the trigger"))?;
    Ok(body
        .and_then(|b| trigger_database(&b, names))
        .filter(|installed| installed != db))
}

/// The database a trigger's text was made for: the one whose high-water
/// it reads (`` `shardflake`.`DB.SEQ` ``).
fn trigger_database(body: &str, names: &Names) -> Option<String> {
    let prefix = format!("`{}`.`", sql::HIGH_WATER_DB);
    let suffix = format!(".{}`", names.sequence());
    let rest = body.split_once(&prefix)?.1;
    let end = rest.find(&suffix)?;
    Some(rest[..end].replace("``", "`"))
}

/// What a copy of database `installed` in `db`, on the same server, is
/// and the ways out.
fn other_database_text(db: &str, names: &Names, installed: &str) -> String {
    format!(
        "the trigger {trigger} of {db}.{table} was installed for database {installed}: {db} is a copy of it (loaded from its dump?), whose objects name the high-water and clock loop of {installed}, and every insert into {db}.{table} is refused; drop database {db}, or, for a separate table whose ids may equal those of {installed}.{table}, run shardflake mysql apply --new-deployment on {db}",
        trigger = names.trigger(),
        table = names.table,
    )
}

/// Why `command` (`apply` or `repair`) refuses a database whose ids are
/// installed but whose server records no shard values for its table, and
/// the ways out.
fn no_record_text(db: &str, names: &Names, command: &str, max: u64) -> String {
    format!(
        "nothing was changed: this server records no shard values it makes ids of {db}.{table} for (shardflake.serves), though they are installed. If a shardflake mysql adopt or apply of {table} is running at this moment (it records them as it ends), run this command again once it has finished. Otherwise: the database alone restored from another server's dump? that server may still make ids for every shard value, and two servers making ids for one make the same ids. Give this one values of its own, none of the other's (shardflake mysql {command} --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER, after shardflake mysql apply --shards with the rest on the other); if no other server makes ids of {table} any more, record them all: shardflake mysql {command} --shards 0-{max}",
        table = names.table
    )
}

/// Where each server records the shard values it makes ids for, per
/// database and table (kept with the high-water, outside the application's
/// database), and which server it is.
const SERVES_DDL: &str = "CREATE TABLE IF NOT EXISTS `shardflake`.`serves` (\
    db VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, lo BIGINT NOT NULL, hi BIGINT NOT NULL, \
    server VARCHAR(600) NOT NULL, PRIMARY KEY (db, tbl)) ENGINE=InnoDB";

/// Which server a connection reaches, as `serves` records it:
/// `HOST:PORT:DATADIR (server_uid UID)`. MariaDB's `server_uid` is a hash
/// of the port and the machine's MAC address: a renamed host keeps it, a
/// copy on another machine has another ([`same_server`]). Read from
/// `information_schema` so a server without the variable records none.
const SERVER_SQL: &str = "CONCAT(@@hostname, ':', @@port, ':', @@datadir, IFNULL(CONCAT(' (server_uid ', \
    (SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME = 'SERVER_UID'), ')'), ''))";

/// Whether two readings of [`SERVER_SQL`] are one server: the same port
/// and data directory, and the same hostname or, where both carry one,
/// the same `server_uid` (a hostname change alone is not another
/// server). A record written before it carried a `server_uid` is the same
/// server only under the same hostname.
fn same_server(recorded: &str, here: &str) -> bool {
    fn parts(s: &str) -> (Option<&str>, Option<&str>, Option<&str>, Option<&str>) {
        let (place, uid) = match s
            .strip_suffix(')')
            .and_then(|s| s.rsplit_once(" (server_uid "))
        {
            Some((place, uid)) => (place, Some(uid)),
            None => (s, None),
        };
        let mut it = place.splitn(3, ':');
        (it.next(), it.next(), it.next(), uid)
    }
    let (host_a, port_a, dir_a, uid_a) = parts(recorded);
    let (host_b, port_b, dir_b, uid_b) = parts(here);
    port_a == port_b && dir_a == dir_b && (host_a == host_b || (uid_a.is_some() && uid_a == uid_b))
}

/// The shard values this server records for `names.table` of `db`.
async fn recorded_serves(
    conn: &mut Conn,
    db: &str,
    names: &Names,
) -> Result<Option<(u64, u64)>, Error> {
    let row: Result<Option<(u64, u64)>, _> = conn
        .exec_first(
            "SELECT lo, hi FROM `shardflake`.`serves` WHERE db = ? AND tbl = ?",
            (db, &names.table),
        )
        .await;
    match row {
        Ok(row) => Ok(row),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok(None),
        Err(e) => Err(my("reading the shard values this server makes ids for")(e)),
    }
}

/// The server `shardflake.serves` records as making the ids of
/// `names.table` of `db` (as [`SERVER_SQL`] read it), when it is another
/// than this one: the row came with a copy of the server (its dump or
/// backup restored here, a replica) or the server moved. `(recorded, this)`.
async fn recorded_elsewhere(
    conn: &mut Conn,
    db: &str,
    names: &Names,
) -> Result<Option<(String, String)>, Error> {
    let row: Result<Option<(String, String)>, _> = conn
        .exec_first(
            format!(
                "SELECT server, {SERVER_SQL} FROM `shardflake`.`serves` WHERE db = ? AND tbl = ?"
            ),
            (db, &names.table),
        )
        .await;
    match row {
        Ok(row) => Ok(row.filter(|(recorded, here)| !same_server(recorded, here))),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok(None),
        Err(e) => Err(my("reading which server makes the ids")(e)),
    }
}

/// The way out, for a server whose objects were made for another (`was`),
/// where that server is stopped for good or this is it, moved.
fn gone_text(was: &InstalledFor) -> String {
    format!("shardflake mysql repair --old-server-gone '{was}'")
}

/// What a server whose record names another is told ([`recorded_elsewhere`]);
/// `was`: the server its objects were made for, where not this one.
fn copy_text(
    db: &str,
    names: &Names,
    (lo, hi): (u64, u64),
    recorded: &str,
    here: &str,
    was: Option<&InstalledFor>,
) -> String {
    let none = match was {
        Some(was) => format!(
            "if none does (stopped for good, or this is it, moved): {}",
            gone_text(was)
        ),
        None => format!(
            "if none does, record this server with shardflake mysql apply --shards {lo}-{hi}"
        ),
    };
    format!(
        "shardflake.serves records that server {recorded} makes the ids of {db}.{table} for shard values {lo}-{hi}, and this is {here}: a copy of that server (its dump or backup restored here, a promoted replica) or the server moved. Two servers making ids for one shard value make the same ids: if that server or another copy still makes ids of {table}, give this one shard values of its own, none of theirs (shardflake mysql apply --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER) before it takes writes; {none}",
        table = names.table
    )
}

/// [`copy_text`] for a server whose trigger was made for another
/// `server_id`, `was` (a promoted replica, or a copy of the server):
/// there `apply` is refused and `repair` is the way out.
fn promoted_copy_text(
    db: &str,
    names: &Names,
    (lo, hi): (u64, u64),
    recorded: &str,
    here: &str,
    was: &InstalledFor,
) -> String {
    format!(
        "shardflake.serves records that server {recorded} makes the ids of {db}.{table} for shard values {lo}-{hi}, and this is {here}: a promoted replica or a copy of that server. If that server is stopped for good (a promotion), {gone} records this one; if that server or another copy still makes ids, give it shard values of its own (shardflake mysql apply --shards LO-HI there) and this one the rest: shardflake mysql repair --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER",
        table = names.table,
        gone = gone_text(was)
    )
}

/// Records the shard values this server makes ids for.
async fn record_serves(
    conn: &mut Conn,
    db: &str,
    names: &Names,
    (lo, hi): (u64, u64),
) -> Result<(), Error> {
    conn.query_drop(format!(
        "CREATE DATABASE IF NOT EXISTS `{}`",
        sql::HIGH_WATER_DB
    ))
    .await
    .map_err(my("creating the high-water database"))?;
    conn.query_drop(SERVES_DDL)
        .await
        .map_err(my("creating shardflake.serves"))?;
    conn.exec_drop(
        format!("REPLACE INTO `shardflake`.`serves` VALUES (?, ?, ?, ?, {SERVER_SQL})"),
        (db, &names.table, lo, hi),
    )
    .await
    .map_err(my("recording the shard values this server makes ids for"))
}

/// Each peer that records shard values of `names.table` overlapping
/// `lo..=hi` (or records none: it may make ids for any), as a problem.
async fn overlapping_peers(
    conn: &mut Conn,
    command: &str,
    peers: &[String],
    names: &Names,
    (lo, hi): (u64, u64),
) -> Result<Vec<String>, Error> {
    let me: Option<(String, Option<String>)> = conn
        .query_first(format!("SELECT {SERVER_SQL}, DATABASE()"))
        .await
        .map_err(my("reading which server this is"))?;
    let mut problems = Vec::new();
    for url in peers {
        let opts = Opts::from_url(url).map_err(|e| other(command, format!("peer {url}: {e}")))?;
        let mut peer = Conn::new(opts)
            .await
            .map_err(|e| other(command, format!("peer {url} does not answer: {e}")))?;
        let them: Option<(String, Option<String>)> = peer
            .query_first(format!("SELECT {SERVER_SQL}, DATABASE()"))
            .await
            .map_err(my("reading which server a peer is"))?;
        if let (Some((me, db)), Some((them, their_db))) = (&me, &them)
            && me == them
        {
            // This server: its other databases are checked whatever
            // --peer names (`this_servers_other_databases`); this very
            // database named is a wrong URL.
            if db == their_db {
                problems.push(format!(
                    "--peer {url} is this database itself ({}): name each other server of the deployment (another database of this server is checked whether --peer names it or not)",
                    db.as_deref().unwrap_or("none")
                ));
            }
            let _ = peer.disconnect().await;
            continue;
        }
        let rows: Result<Vec<(String, u64, u64)>, _> = peer
            .exec(
                "SELECT db, lo, hi FROM `shardflake`.`serves` WHERE tbl = ?",
                (&names.table,),
            )
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Vec::new(),
            Err(e) => return Err(my("reading a peer's shard values")(e)),
        };
        if rows.is_empty() {
            problems.push(format!(
                "peer {url} records no shard values of table {}: it may make ids for any; run shardflake mysql apply --shards LO-HI there first",
                names.table
            ));
        }
        for (db, plo, phi) in rows {
            if plo <= hi && lo <= phi {
                // A dropped database's values count until its record is
                // deleted (its ids come back with it): say which it is.
                let exists: Option<u64> = peer
                    .exec_first(
                        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
                        (&db, &names.table),
                    )
                    .await
                    .map_err(my("looking for a peer's table"))?;
                if exists == Some(0) {
                    problems.push(format!(
                        "peer {url} records (shardflake.serves) shard values {plo}-{phi} of {db}.{table}, which meets {lo}-{hi}, and that table or its database was dropped there: its ids come back with it (a restore of its backup), so its values count until its record is deleted; if it will not come back, release them on that server: DELETE FROM shardflake.serves WHERE db = '{db_lit}' AND tbl = '{table}'",
                        table = names.table,
                        db_lit = db.replace('\'', "''"),
                    ));
                    continue;
                }
                problems.push(format!(
                    "peer {url} makes ids of {db}.{} for shard values {plo}-{phi}, which meets {lo}-{hi}: two servers making ids for one shard value make the same ids; give each server shard values of its own (shardflake mysql apply --shards LO-HI on the one that lets values go, then shardflake mysql apply --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER on the one that takes them)",
                    names.table
                ));
            }
        }
        let _ = peer.disconnect().await;
    }
    Ok(problems)
}

/// What every id a peer made of `names.table` came from, read in each
/// database its `shardflake.serves` records: the highest reservation of
/// the table's sequence, with that peer's URL, and the highest value of
/// the row-lock procedure's counter (the `sequences` row
/// [`Names::locked_row`]). Read once no peer records the values this
/// server takes ([`overlapping_peers`] found none): a peer has let them go,
/// and makes no id for them after this reading.
#[derive(Debug, Default)]
struct PeersPast {
    reservation: Option<(i64, String)>,
    locked_counter: Option<i64>,
}

async fn peers_past(command: &str, peers: &[String], names: &Names) -> Result<PeersPast, Error> {
    let mut past = PeersPast::default();
    for url in peers {
        let opts = Opts::from_url(url).map_err(|e| other(command, format!("peer {url}: {e}")))?;
        let mut peer = Conn::new(opts)
            .await
            .map_err(|e| other(command, format!("peer {url} does not answer: {e}")))?;
        let read = past_of(&mut peer, url, None, names, &mut past).await;
        let _ = peer.disconnect().await;
        read?;
    }
    Ok(past)
}

/// [`PeersPast`] of the server `conn` reaches (`label`: its URL), read in
/// each database its `shardflake.serves` records but `skip` (this
/// server's own, when it reads its other databases: each is a peer).
async fn past_of(
    peer: &mut Conn,
    label: &str,
    skip: Option<&str>,
    names: &Names,
    past: &mut PeersPast,
) -> Result<(), Error> {
    let dbs: Result<Vec<String>, _> = peer
        .exec(
            "SELECT db FROM `shardflake`.`serves` WHERE tbl = ?",
            (&names.table,),
        )
        .await;
    let dbs = match dbs {
        Ok(dbs) => dbs,
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Vec::new(),
        Err(e) => return Err(my("reading a peer's shard values")(e)),
    };
    for db in dbs {
        if Some(db.as_str()) == skip {
            continue;
        }
        let db = db.replace('`', "``");
        let reserved: Result<Option<i64>, _> = peer
            .query_first(format!(
                "SELECT next_not_cached_value FROM `{db}`.`{}`",
                names.sequence()
            ))
            .await;
        let reserved = match reserved {
            Ok(r) => r,
            // Recorded, but its table's ids since dropped: none to pass.
            Err(mysql_async::Error::Server(e))
                if e.code == ER_NO_SUCH_TABLE || e.code == ER_BAD_DB_ERROR =>
            {
                None
            }
            Err(e) => return Err(my("reading a peer's sequence")(e)),
        };
        if let Some(r) = reserved
            && past.reservation.as_ref().is_none_or(|(h, _)| r > *h)
        {
            past.reservation = Some((r, label.to_string()));
        }
        let counter: Result<Option<Option<i64>>, _> = peer
            .exec_first(
                format!("SELECT MAX(next_val) FROM `{db}`.sequences WHERE name = ?"),
                (names.locked_row(),),
            )
            .await;
        let counter = match counter {
            Ok(c) => c.flatten(),
            // No row-lock procedure there.
            Err(mysql_async::Error::Server(e))
                if e.code == ER_NO_SUCH_TABLE || e.code == ER_BAD_DB_ERROR =>
            {
                None
            }
            Err(e) => return Err(my("reading a peer's row-lock counter")(e)),
        };
        past.locked_counter = past.locked_counter.max(counter);
    }
    Ok(())
}

/// MariaDB's "Unknown database".
const ER_BAD_DB_ERROR: u16 = 1049;

/// Where each server records the databases whose table is a deployment
/// of its own (`apply --new-deployment`): its ids may equal those of the
/// same-named table in the server's other databases, by the operator's
/// word, so their shard values do not meet.
const SEPARATE_DDL: &str = "CREATE TABLE IF NOT EXISTS `shardflake`.`separate` (\
    db VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, PRIMARY KEY (db, tbl)) ENGINE=InnoDB";

/// The databases of this server recorded as deployments of their own for
/// `names.table` ([`SEPARATE_DDL`]).
async fn separate_databases(conn: &mut Conn, names: &Names) -> Result<Vec<String>, Error> {
    let rows: Result<Vec<String>, _> = conn
        .exec(
            "SELECT db FROM `shardflake`.`separate` WHERE tbl = ?",
            (&names.table,),
        )
        .await;
    match rows {
        Ok(rows) => Ok(rows),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok(Vec::new()),
        Err(e) => Err(my(
            "reading the databases that are deployments of their own",
        )(e)),
    }
}

/// Records `db`'s table as a deployment of its own.
async fn record_separate(conn: &mut Conn, db: &str, names: &Names) -> Result<(), Error> {
    conn.query_drop(SEPARATE_DDL)
        .await
        .map_err(my("creating shardflake.separate"))?;
    conn.exec_drop(
        "INSERT IGNORE INTO `shardflake`.`separate` VALUES (?, ?)",
        (db, &names.table),
    )
    .await
    .map_err(my("recording a deployment of its own"))
}

/// The server's other databases that make ids of a table of
/// `names.table`'s name, as problems: each one meeting `lo..=hi`, and
/// with `report_dropped` each recorded one whose database or table is
/// gone. A database of this server is always one of the table's servers,
/// under the same deployment lock (its name is the table's), whether or
/// not a `--peer` names it (review 18: only the first apply in a database
/// was checked, and a later `apply --shards` there took values another
/// database made ids for). Counted: every database `shardflake.serves`
/// records, a dropped one too (its ids come back with it, from a backup,
/// so its values count until its record is deleted: review 19), and every
/// one whose table has our trigger but no record (installed before
/// records: all values). Not counted: one recorded as a deployment of its
/// own (`--new-deployment`), or any where `db` is one.
async fn this_servers_other_databases(
    conn: &mut Conn,
    db: &str,
    names: &Names,
    (lo, hi): (u64, u64),
    all: (u64, u64),
    report_dropped: bool,
) -> Result<Vec<String>, Error> {
    let separate = separate_databases(conn, names).await?;
    if separate.iter().any(|s| s == db) {
        return Ok(Vec::new());
    }
    let recorded: Result<Vec<(String, u64, u64)>, _> = conn
        .exec(
            "SELECT db, lo, hi FROM `shardflake`.`serves` WHERE tbl = ? AND db <> ? ORDER BY db",
            (&names.table, db),
        )
        .await;
    let mut others = match recorded {
        Ok(rows) => rows,
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Vec::new(),
        Err(e) => {
            return Err(my(
                "reading the shard values of the server's other databases",
            )(e));
        }
    };
    let first = recorded_serves(conn, db, names).await?.is_none();
    let triggered: Vec<(String, String)> = conn
        .exec(
            "SELECT TRIGGER_SCHEMA, ACTION_STATEMENT FROM information_schema.TRIGGERS
              WHERE TRIGGER_NAME = ? AND EVENT_OBJECT_TABLE = ? AND TRIGGER_SCHEMA <> ?
              ORDER BY 1",
            (names.trigger(), &names.table, db),
        )
        .await
        .map_err(my(
            "looking for the table's ids in the server's other databases",
        ))?;
    for (other, body) in triggered {
        // A copy of another database's objects (loaded from its dump)
        // refuses every id: it makes none until applied there.
        let copy = trigger_database(&body, names).is_some_and(|made_for| made_for != other);
        if !copy && !others.iter().any(|(o, _, _)| *o == other) {
            others.push((other, all.0, all.1));
        }
    }
    let table = &names.table;
    let mut problems = Vec::new();
    for (other, olo, ohi) in others {
        if separate.contains(&other) {
            continue;
        }
        let (schema, tables): (u64, u64) = conn
            .exec_first(
                "SELECT (SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?),
                        (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?)",
                (&other, &other, table),
            )
            .await
            .map_err(my("looking for the server's other databases"))?
            .unwrap_or((0, 0));
        let meets = olo <= hi && lo <= ohi;
        let gone = match (schema, tables) {
            (0, _) => Some(format!("database {other}")),
            (_, 0) => Some(format!("table {other}.{table}")),
            _ => None,
        };
        if let Some(gone) = gone {
            if meets || report_dropped {
                problems.push(format!(
                    "{gone}, dropped, is still recorded (shardflake.serves) as making ids of {other}.{table} for shard values {olo}-{ohi}{}: its ids come back with it (a restore of its backup), so its values count until its record is deleted; if it will not come back, release them on this server: DELETE FROM shardflake.serves WHERE db = '{other}' AND tbl = '{table}'",
                    if meets { format!(", which meets {lo}-{hi}") } else { String::new() },
                    other = other.replace('\'', "''"),
                ));
            }
        } else if meets && first {
            problems.push(format!(
                "database {other} of this server makes ids of {other}.{table} for shard values {olo}-{ohi}, which meets {lo}-{hi}, and {db}.{table} has none yet: the URL now names another database than the one making them? two databases making ids for one shard value make the same ids; put back the URL of database {other}. If {db}.{table} is a separate table, whose ids may equal those of {other}.{table}, run shardflake mysql apply --new-deployment; to make ids for one table from both, give each --shards of its own"
            ));
        } else if meets {
            problems.push(format!(
                "database {other} of this server makes ids of {other}.{table} for shard values {olo}-{ohi}, which meets {lo}-{hi} of {db}.{table}: two databases making ids for one shard value make the same ids (every database of a server is one of the table's servers, named by --peer or not); give each shard values of its own (shardflake mysql apply --shards LO-HI on the one that lets values go, then on the other), or, if {db}.{table} is a separate table whose ids may equal those of {other}.{table}: shardflake mysql apply --new-deployment"
            ));
        }
    }
    Ok(problems)
}

/// How long, in seconds, `apply`, `repair` and `adopt` wait for a
/// table's deployment lock on each server (`DeploymentLock`): another
/// operator's command of the same table holds it.
pub const DEPLOYMENT_LOCK_WAIT_S: u64 = 10;

/// How long, in seconds, `apply`, `repair` and `adopt` wait for a table's
/// metadata lock (`lock_wait_timeout`) before a change to the table, its
/// sequence or its trigger (an open transaction that used the table
/// holds it, and every insert into the table waits behind the change
/// meanwhile), and for the row-lock counter's row (`innodb_lock_wait_timeout`:
/// a transaction that called `generate_post_id_locked` holds it).
pub const TABLE_LOCK_WAIT_S: u64 = 2;

/// MariaDB's "Lock wait timeout exceeded".
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// The user-level lock of a table's deployment, one name on every server
/// (at most 63 characters: a table's name has at most 48).
fn deployment_lock_name(names: &Names) -> String {
    format!("shardflake ops {}", names.table)
}

/// A table's deployment lock ([`deployment_lock_name`]), held on this
/// server by the command's own connection and on each `--peer` by a
/// connection of its own, from before the command reads any server's
/// records of shard values until this server's record and trigger are
/// written. Taken in one order on every server, sorted by the servers'
/// identities ([`SERVER_SQL`]), so two commands never wait on each other
/// (issue 37, A2: two `apply --peer` started together each read the
/// other's old record, and both recorded overlapping values).
pub(super) struct DeploymentLock {
    name: String,
    peers: Vec<Conn>,
}

impl DeploymentLock {
    /// Takes the lock of `names.table` on this server and each peer,
    /// waiting up to [`DEPLOYMENT_LOCK_WAIT_S`] on each; `command`
    /// (`apply`, `repair`, `adopt`) names the refusal.
    pub(super) async fn take(
        conn: &mut Conn,
        peers: &[String],
        names: &Names,
        command: &str,
    ) -> Result<DeploymentLock, Error> {
        let name = deployment_lock_name(names);
        let here = identity(conn).await?;
        // (identity, the peer's connection; None: this server's own)
        let mut servers: Vec<(String, Option<Conn>)> = vec![(here, None)];
        for url in peers {
            let opts =
                Opts::from_url(url).map_err(|e| other(command, format!("peer {url}: {e}")))?;
            let mut peer = Conn::new(opts)
                .await
                .map_err(|e| other(command, format!("peer {url} does not answer: {e}")))?;
            let id = identity(&mut peer).await?;
            if servers.iter().any(|(known, _)| *known == id) {
                let _ = peer.disconnect().await;
                continue;
            }
            servers.push((id, Some(peer)));
        }
        servers.sort_by(|a, b| a.0.cmp(&b.0));
        let mut lock = DeploymentLock {
            name,
            peers: Vec::new(),
        };
        let mut failed = None;
        for (server, peer) in servers {
            let taken = match peer {
                None => get_lock(conn, &lock.name, &server, names, command).await,
                Some(mut peer) => {
                    let taken = get_lock(&mut peer, &lock.name, &server, names, command).await;
                    lock.peers.push(peer);
                    taken
                }
            };
            if let Err(e) = taken {
                failed = Some(e);
                break;
            }
        }
        match failed {
            None => Ok(lock),
            Some(e) => {
                lock.release(conn).await;
                Err(e)
            }
        }
    }

    /// Releases the lock on every server.
    pub(super) async fn release(self, conn: &mut Conn) {
        let _ = conn.exec_drop("DO RELEASE_LOCK(?)", (&self.name,)).await;
        for peer in self.peers {
            let _ = peer.disconnect().await;
        }
    }
}

/// Which server a connection reaches ([`SERVER_SQL`]).
async fn identity(conn: &mut Conn) -> Result<String, Error> {
    let id: Option<String> = conn
        .query_first(format!("SELECT {SERVER_SQL}"))
        .await
        .map_err(my("reading which server this is"))?;
    id.ok_or_else(|| other("reading which server this is", "no row"))
}

/// Takes the user-level lock `name` on `server`, waiting (and saying so)
/// up to [`DEPLOYMENT_LOCK_WAIT_S`]; refuses naming the session holding it.
async fn get_lock(
    c: &mut Conn,
    name: &str,
    server: &str,
    names: &Names,
    command: &str,
) -> Result<(), Error> {
    let try_lock = async |c: &mut Conn, wait: u64| -> Result<bool, Error> {
        let got: Option<Option<i64>> = c
            .exec_first("SELECT GET_LOCK(?, ?)", (name, wait))
            .await
            .map_err(my("taking the table's deployment lock"))?;
        Ok(got.flatten() == Some(1))
    };
    if try_lock(c, 0).await? {
        return Ok(());
    }
    tracing::info!(
        server,
        lock = name,
        "waiting up to {DEPLOYMENT_LOCK_WAIT_S} s for the deployment lock of table {}: another shardflake mysql apply, repair or adopt of it is running",
        names.table
    );
    if try_lock(c, DEPLOYMENT_LOCK_WAIT_S).await? {
        return Ok(());
    }
    let holder: Option<(u64, String, String)> = c
        .exec_first(
            "SELECT ID, USER, HOST FROM information_schema.PROCESSLIST WHERE ID = IS_USED_LOCK(?)",
            (name,),
        )
        .await
        .map_err(my("reading who holds the table's deployment lock"))?;
    let (by, kill) = match holder {
        Some((id, user, host)) => (
            format!(" (connection {id} of {user}@{host})"),
            format!("; if none runs, end that session there: KILL {id}"),
        ),
        None => (String::new(), String::new()),
    };
    Err(other(
        command,
        format!(
            "nothing was changed: another shardflake mysql apply, repair or adopt of table {table} is running: it holds the table's deployment lock '{name}' on server {server}{by}, and {command} waited {DEPLOYMENT_LOCK_WAIT_S} s for it. Wait for that command to end, then run shardflake mysql {command} again{kill}",
            table = names.table
        ),
    ))
}

/// The context of a failed statement on the row-lock procedure's counter
/// row (`sequences`): a lock wait there is a row lock ([`lock_was_a_row`]).
pub(super) const ROW_LOCK_COUNTER: &str = "writing the row-lock counter's row in sequences";

/// Whether a lock wait that ran out ([`lock_wait_ran_out`]) was for the
/// row-lock counter's row (an InnoDB row lock, held by a transaction
/// that called `generate_post_id_locked`), not a metadata lock.
fn lock_was_a_row(e: &Error) -> bool {
    matches!(e, Error::Mysql { context, .. } if context == ROW_LOCK_COUNTER)
}

/// What `command` is told when a lock it waited [`TABLE_LOCK_WAIT_S`]
/// for stayed held: the row-lock counter's row (`row`: an InnoDB row
/// lock) or the metadata lock of the table, its sequence or its trigger.
/// It names the sessions that can hold it: each open transaction
/// holding row locks; for a metadata lock each open transaction, or,
/// where none shows in `INNODB_TRX` (one that only drew from the
/// sequence shows nowhere), the server's other client sessions.
async fn open_transactions_text(
    conn: &mut Conn,
    names: &Names,
    command: &str,
    changed: &str,
    row: bool,
) -> String {
    type Session = (u64, String, String, u64, Option<String>);
    let describe = |sessions: &[Session], what: &str| {
        let mut parts: Vec<String> = sessions
            .iter()
            .take(5)
            .map(|(id, user, host, secs, info)| {
                format!(
                    "connection {id} of {user}@{host}, {what} {secs} s{}",
                    info.as_deref()
                        .map(|i| format!(", running {i:.80}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        if sessions.len() > 5 {
            parts.push(format!("{} more", sessions.len() - 5));
        }
        parts.join("; ")
    };
    let open: Vec<Session> = conn
        .query(format!(
            "SELECT p.ID, p.USER, p.HOST, TIMESTAMPDIFF(SECOND, t.trx_started, NOW()), p.INFO
               FROM information_schema.INNODB_TRX t JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id
              WHERE p.ID <> CONNECTION_ID(){} ORDER BY t.trx_started",
            if row { " AND t.trx_rows_locked > 0" } else { "" }
        ))
        .await
        .unwrap_or_default();
    let (table, seq) = (&names.table, names.sequence());
    let (held, holders) = if row {
        (
            format!(
                "the row {row_name:?} of table sequences (the counter of {proc}) is locked by an open transaction that called {proc} (an InnoDB row lock, held until that transaction ends), and {command} waited {TABLE_LOCK_WAIT_S} s to write it",
                row_name = names.locked_row(),
                proc = names.locked_procedure()
            ),
            if open.is_empty() {
                "Open transactions holding row locks: none now (it has ended: run the command again)".to_string()
            } else {
                format!(
                    "Open transactions holding row locks: {}",
                    describe(&open, "open")
                )
            },
        )
    } else {
        let holders = if open.is_empty() {
            // A transaction that only drew from the sequence (CALL
            // generate_post_id, an insert rolled back) holds the
            // sequence's metadata lock without showing in INNODB_TRX.
            let others: Vec<Session> = conn
                .query(
                    "SELECT ID, USER, HOST, TIME, INFO FROM information_schema.PROCESSLIST
                      WHERE ID <> CONNECTION_ID() AND COMMAND IN ('Sleep', 'Query', 'Execute')
                        AND USER NOT IN ('system user', 'event_scheduler') ORDER BY TIME DESC",
                )
                .await
                .unwrap_or_default();
            if others.is_empty() {
                "No open transaction shows in information_schema.INNODB_TRX, and no other session is connected now (it has ended: run the command again)".to_string()
            } else {
                format!(
                    "No open transaction shows in information_schema.INNODB_TRX (one that only drew ids from the sequence, such as CALL {proc} in a transaction not yet ended, holds the lock without showing there); the other sessions now, one of which holds it: {}",
                    describe(&others, "in its state for"),
                    proc = names.procedure
                )
            }
        } else {
            format!("Open transactions: {}", describe(&open, "open"))
        };
        (
            format!(
                "table {table} or its sequence {seq} is held by an open transaction that used it (its metadata lock), and {command} waited {TABLE_LOCK_WAIT_S} s to change the table, the sequence or the trigger (inserts into {table} waited behind it meanwhile, then went on)"
            ),
            holders,
        )
    };
    format!(
        "{changed}: {held}. {holders}. End it (COMMIT or ROLLBACK, or KILL its connection), then run shardflake mysql {command} again"
    )
}

/// Whether `e` is a lock wait that ran out (`lock_wait_timeout`).
fn lock_wait_ran_out(e: &Error) -> bool {
    matches!(e, Error::Mysql { source: mysql_async::Error::Server(s), .. } if s.code == ER_LOCK_WAIT_TIMEOUT)
}

/// What a server other than the one the ids were installed on (`was`)
/// is told.
fn other_server_text(names: &Names, was: &InstalledFor, here: u32) -> String {
    format!(
        "the trigger {} was installed for server_id {}, and this server is server_id {here}: a promoted replica (or a copy of the server), whose sequence may be behind ids the old primary made; every insert is refused until shardflake mysql repair (apply refuses it; repair reinstalls everything for this server), which refuses a clock more than {} ms from this host's, and takes over the old server's ids only on proof that it makes them no more: if it or another copy of it (a second replica, a copy of a copy) still runs, give each of those shard values of its own (shardflake mysql apply --shards LO-HI there) and this one the rest, naming every other server, since one not named is not checked and makes the same ids (shardflake mysql repair --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER, one --peer each); if it is stopped for good and no other copy runs, {}",
        names.trigger(),
        was.server_id,
        crate::CLOCK_BOUND_MS,
        gone_text(was)
    )
}

/// A server's clock against this host's: `(offset, uncertainty)` in
/// milliseconds, the offset positive when the server's clock is ahead.
async fn clock_offset(conn: &mut Conn) -> Result<(i64, i64), Error> {
    let before = crate::host_unix_ms();
    let server: Option<i64> = conn
        .query_first("SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000")
        .await
        .map_err(my("reading the server's clock"))?;
    let after = crate::host_unix_ms();
    let server = server.ok_or_else(|| other("reading the server's clock", "no row"))?;
    Ok((server - (before + after) / 2, (after - before + 1) / 2))
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
    /// `apply`: the shard values (the key mod 2^shard_bits) this server
    /// makes ids for, `lo..=hi`; `None`: those it records, or all.
    pub shards: Option<(u64, u64)>,
    /// `apply`: the URLs of the deployment's other servers; a shard value
    /// that one of them records too is refused, and the sequence is put
    /// past each one's (values taken from a peer get ids after its ids).
    pub peers: Vec<String>,
    /// `apply`: this database's table is a deployment of its own, separate
    /// from the same-named one other databases of this server make ids
    /// for (their ids may be equal); recorded in `shardflake.separate`.
    /// Without it, shard values another database of this server records
    /// are refused as a peer's are (`this_servers_other_databases`).
    pub new_deployment: bool,
    /// `repair` (and `apply`) where the objects were installed for
    /// another server (a promoted replica, a copy, the server moved): the
    /// operator's word that the server they name, as
    /// `SERVER_ID:PORT:DATADIR` (what the refusal prints), makes no ids
    /// any more. Without it, or a `--peer` that is that server, such a
    /// takeover is refused.
    pub old_server_gone: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            names: Names::default(),
            cache: sql::DEFAULT_CACHE,
            locked: true,
            seed: false,
            shards: None,
            peers: Vec::new(),
            new_deployment: false,
            old_server_gone: None,
        }
    }
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
            format!(
                "{context} (the id sequence is used up: the layout's last time is reached; install a layout that ends later for a new table: shardflake mysql apply --layout LAYOUT --table NEW_TABLE)"
            )
        } else {
            context.to_string()
        },
        source: e,
    }
}

#[cfg(test)]
mod tests {
    use super::{InstalledFor, same_server};

    #[test]
    fn the_server_a_trigger_was_made_for_is_read_back_from_its_text() {
        for dir in [
            "/var/lib/mysql/",
            "/srv/it's \\ odd/",
            "/x/ AND @@port = 9/",
        ] {
            let body = format!(
                "SET NEW.id = IF(NEW.id <> 0, NEW.id, CASE WHEN @@server_id = 42{} THEN 1 ELSE f(NEW.user_id, FALSE) END)",
                super::sql::Plan::place_sql(3307, dir)
            );
            let was = InstalledFor::parse(&body).unwrap();
            assert_eq!(was.to_string(), format!("42:3307:{dir}"), "{body}");
            assert!(was.is(42, 3307, dir));
            assert!(!was.is(42, 3306, dir));
            assert!(!was.is(43, 3307, dir));
            assert!(!was.is(42, 3307, "/other/"));
        }
        // Objects of a release before the guard tested the place.
        let old = InstalledFor::parse("CASE WHEN @@server_id = 7 THEN 1 END").unwrap();
        assert_eq!(old.to_string(), "7");
        assert!(old.is(7, 1, "/anywhere/"));
        assert_eq!(InstalledFor::parse("SET NEW.id = 1"), None);
    }

    #[test]
    fn a_server_is_its_port_and_datadir_with_its_hostname_or_server_uid() {
        let here = "vm:3306:/var/lib/mysql/ (server_uid Abc=)";
        assert!(same_server(here, here));
        assert!(same_server(
            "old:3306:/var/lib/mysql/ (server_uid Abc=)",
            here
        ));
        assert!(same_server("vm:3306:/var/lib/mysql/", here));
        assert!(!same_server("old:3306:/var/lib/mysql/", here));
        assert!(!same_server(
            "old:3306:/var/lib/mysql/ (server_uid Xyz=)",
            here
        ));
        assert!(!same_server(
            "vm:3307:/var/lib/mysql/ (server_uid Abc=)",
            here
        ));
        assert!(!same_server("vm:3306:/srv/mysql/ (server_uid Abc=)", here));
        assert!(!same_server(
            "old:3306:/var/lib/mysql/",
            "vm:3306:/var/lib/mysql/"
        ));
    }
}
