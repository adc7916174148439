//! One MariaDB (or MySQL) session of a ticket server: the per-id counter
//! rows, the segment rows and the high-water table, over mysql_async.
//!
//! A per-id sequence is one row, `tickets_<name> (stub 'a', id)`, whose
//! `id` is the next id to hand out, advanced by `UPDATE … SET id =
//! LAST_INSERT_ID(id) + increment` (see [`ticket_sql`]): one
//! row lock, no gap lock, no delete, so eight or 32 clients on one server
//! never deadlock, as Flickr's `REPLACE INTO` on InnoDB does (a delete and
//! an insert under gap locks). Every statement is sent as text
//! (`COM_QUERY`), a ticket's three in one round trip. Names in the SQL are
//! validated identifiers ([`crate::config`]) and numbers are formatted by
//! us; nothing else is interpolated.

use mysql_async::prelude::*;
use mysql_async::{Conn, Opts};

use super::{
    Backend, GUARD, GUARD_MISSING, HOLDERS_TABLE, HW_TABLE, Holder, LATTICE_MOVED, LATTICE_TABLE,
    LatticeRecord, LatticeVersion, MARKS_AT_TABLE, MarkFence, SEGMENT_TABLE, SequenceState,
    ServerIdentity, ServerSettings, Stamped, VERSION_TABLE, clean_identity, guard_refusal,
    guarded_tables, holder_fence, holder_of, lattice_moved, mode_changed, not_initialised,
    raise_segment_sql, unguarded,
};
use crate::config::{Config, Kind, Mode, SequenceConfig, ServerConfig};
use crate::error::TicketError;
use crate::segment::Lattice;

/// `init`'s row in the marks table (no server or sequence is named ''):
/// the table is never empty, and a mark is written only into a table that
/// is not (see `write_high_water`).
const HW_INIT_ROW: &str = "('', '', 0)";

/// A connected session with the client's increment and offset set on it.
pub(crate) struct MariaSession {
    server: String,
    conn: Conn,
    /// Per sequence, a ticket's one round trip (see [`ticket_sql`]).
    tickets: Vec<String>,
    /// MariaDB 10.5 and later: the tables' identities are read with every
    /// answer (`INNODB_SYS_TABLES` or the creation time).
    returning: bool,
    /// How this session reads a table's identity.
    identity: Identity,
    /// The lattice version this session is pinned to (also in its
    /// `@shardflake_lattice`, which the per-id tables' guard compares).
    lattice: Option<i64>,
}

/// What tells a table from the one a dump loaded in its place. Rows written
/// move neither; a `DROP` and `CREATE` (a dump loaded), `TRUNCATE` or a
/// rebuilding `ALTER` move both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Identity {
    /// InnoDB's table id (`INNODB_SYS_TABLES`), new for every table made:
    /// where the user may read it (the `PROCESS` privilege).
    TableId,
    /// The creation time, in unix seconds: two tables made within one
    /// second look like one (a dump loaded in the second its table was
    /// made, or two loaded in one second).
    CreateTime,
}

impl Identity {
    /// SQL for the identity of table `name` in this database.
    fn sql(self, name: &str) -> String {
        match self {
            Identity::TableId => format!(
                "SELECT CAST(TABLE_ID AS SIGNED) FROM information_schema.INNODB_SYS_TABLES WHERE NAME = CONCAT(DATABASE(), '/{name}')"
            ),
            Identity::CreateTime => format!(
                "SELECT CAST(UNIX_TIMESTAMP(CREATE_TIME) AS SIGNED) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{name}'"
            ),
        }
    }

    /// The table id where this session may read it, else the creation time.
    async fn of_session(conn: &mut Conn, server: &str) -> Result<Identity, TicketError> {
        match conn
            .query_drop("SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES WHERE NAME = ''")
            .await
        {
            Ok(()) => Ok(Identity::TableId),
            Err(mysql_async::Error::Server(e)) if e.code == ER_SPECIFIC_ACCESS_DENIED => {
                tracing::debug!(
                    server,
                    "no PROCESS privilege: tables are told apart by their creation time"
                );
                Ok(Identity::CreateTime)
            }
            Err(e) => Err(TicketError::db(server, "read InnoDB's table ids", e)),
        }
    }
}

/// ER_SPECIFIC_ACCESS_DENIED_ERROR: "you need the PROCESS privilege".
const ER_SPECIFIC_ACCESS_DENIED: u16 = 1227;

/// Whether `version` (`SELECT VERSION()`) is a MariaDB of 10.5 or later,
/// whose tables' identities every answer reads.
fn has_returning(version: &str) -> bool {
    let mut numbers = version
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    version.contains("MariaDB") && (major, minor) >= (10, 5)
}

/// Codes MariaDB answers when a counter is full: ER_AUTOINC_READ_FAILED,
/// HA_ERR_AUTOINC_ERANGE, ER_WARN_DATA_OUT_OF_RANGE, ER_DATA_OUT_OF_RANGE
/// (a per-id counter row past `bigint unsigned`).
const FULL_CODES: [u16; 4] = [1467, 167, 1264, 1690];

fn is_full(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if FULL_CODES.contains(&s.code))
}

impl MariaSession {
    /// Connects and sets `auto_increment_increment`/`auto_increment_offset`
    /// on this session, then reads them back: a server that keeps other
    /// values is refused.
    pub async fn connect(server: &ServerConfig, config: &Config) -> Result<Self, TicketError> {
        let name = &server.name;
        let opts = Opts::from_url(&server.url)
            .map_err(|e| TicketError::misconfigured(name, format!("bad url: {e}")))?;
        let mut conn = Conn::new(opts)
            .await
            .map_err(|e| TicketError::db(name, "connect", e))?;
        // Lock waits bounded by the server too: a statement a timeout gave
        // up on (a peer under FLUSH TABLES WITH READ LOCK, an ALTER waiting
        // for a metadata lock) must not wait on there for a day.
        let lock_wait = config.failover.admin_timeout().as_secs().max(1);
        conn.query_drop(format!(
            "SET SESSION auto_increment_increment = {}, auto_increment_offset = {}, lock_wait_timeout = {lock_wait}, innodb_lock_wait_timeout = {lock_wait}",
            config.increment, server.offset
        ))
        .await
        .map_err(|e| TicketError::db(name, "set session increment and offset", e))?;
        let session: Option<(u64, u64)> = conn
            .query_first(
                "SELECT @@session.auto_increment_increment, @@session.auto_increment_offset",
            )
            .await
            .map_err(|e| TicketError::db(name, "read session increment and offset", e))?;
        if session != Some((config.increment, server.offset)) {
            return Err(TicketError::misconfigured(
                name,
                format!(
                    "session auto_increment_increment/offset are {session:?} after setting them to ({}, {})",
                    config.increment, server.offset
                ),
            ));
        }
        // An adopted table's applications use the server's own increment
        // and offset: off the lattice, they hand out another server's ids.
        if config.sequences.iter().any(|q| q.adopted()) {
            let global: Option<(u64, u64)> = conn
                .query_first(
                    "SELECT @@global.auto_increment_increment, @@global.auto_increment_offset",
                )
                .await
                .map_err(|e| TicketError::db(name, "read global increment and offset", e))?;
            if let Some(why) = globals_off_lattice(global, config, server) {
                return Err(TicketError::misconfigured(name, why));
            }
        }
        let version: Option<String> = conn
            .query_first("SELECT VERSION()")
            .await
            .map_err(|e| TicketError::db(name, "read the version", e))?;
        let returning = has_returning(version.as_deref().unwrap_or(""));
        let identity = Identity::of_session(&mut conn, name).await?;
        let tickets = config
            .sequences
            .iter()
            .map(|q| {
                let identity = returning.then_some(identity);
                match q.adopted() {
                    true => adopted_ticket_sql(&q.table(), q.stub(), identity),
                    false => ticket_sql(&q.table(), config.increment, identity),
                }
            })
            .collect();
        Ok(MariaSession {
            server: name.clone(),
            conn,
            tickets,
            returning,
            identity,
            lattice: None,
        })
    }
}

/// A ticket's one round trip for per-id table `table`: the guard's proof
/// cleared, the counter row advanced (`LAST_INSERT_ID(id)`: the id handed
/// out is the row's value before), then what the client checks: the rows
/// moved (1: the row is there), the id, the proof `…_ctr_u` set to it, and
/// the table's identity (`identity`: where it is read with every answer),
/// and whether the guard ran at all ([`GUARD_RAN`]: a proof missing while
/// it ran is a row its guard does not vouch for, [`guard_triggers`]).
/// `LAST_INSERT_ID(expr)` in an `UPDATE` and the user variable last
/// for the session, so the `SELECT` reads this statement's.
fn ticket_sql(table: &str, increment: u64, identity: Option<Identity>) -> String {
    let identity = match identity {
        Some(identity) => format!("({})", identity.sql(table)),
        None => "NULL".to_string(),
    };
    format!(
        "SET {PROOF} = NULL, {GUARD_RAN} = NULL; UPDATE {table} SET id = LAST_INSERT_ID(id) + {increment} WHERE stub = '{STUB}'; SELECT ROW_COUNT(), LAST_INSERT_ID(), {PROOF}, {GUARD_RAN} IS NOT NULL, {identity}"
    )
}

/// A ticket's one round trip for an adopted Flickr table: the very
/// statement its applications run (`REPLACE INTO T (stub) VALUES ('a')`),
/// so that both kinds of client draw from the table's one `AUTO_INCREMENT`
/// counter, which InnoDB never hands out twice on a running server (the
/// session's increment and offset are the lattice's, and `init` checks
/// the server's globals, which the applications' sessions use, are too).
/// Then what [`ticket_sql`] reads: the rows moved, the id, the proof its
/// `…_sf_i` trigger set, the table's identity.
fn adopted_ticket_sql(table: &str, stub: &str, identity: Option<Identity>) -> String {
    let identity = match identity {
        Some(identity) => format!("({})", identity.sql(table)),
        None => "NULL".to_string(),
    };
    format!(
        "SET {PROOF} = NULL; REPLACE INTO {table} (stub) VALUES ('{stub}'); SELECT ROW_COUNT(), LAST_INSERT_ID(), {PROOF}, {PROOF} IS NOT NULL, {identity}"
    )
}

/// ER_LOCK_DEADLOCK: InnoDB rolled the statement back.
const ER_LOCK_DEADLOCK: u16 = 1213;

/// How many times an adopted table's `REPLACE` is run again after a
/// deadlock: Flickr's `REPLACE` on InnoDB deadlocks under concurrency
/// with or without our triggers (measured: 4 to 6 in 8,000 at 8
/// connections with no trigger at all); the statement was rolled back,
/// so running it again hands out nothing twice.
const DEADLOCK_RETRIES: usize = 20;

/// The session variable a per-id table's `…_ctr_u` trigger sets to the id
/// its update hands out: the answer's proof that the guard ran.
const PROOF: &str = "@shardflake_ticket";

/// The session variable a per-id table's `…_ctr_u` trigger sets whenever
/// it runs, vouching or not.
const GUARD_RAN: &str = "@shardflake_guard";

/// The session variable a client sets to 1 around its raise of a per-id
/// row past the marks it read from the store (and only then): the row
/// the guard vouches for from then on ([`guard_triggers`]).
const VOUCH: &str = "@shardflake_vouch";

/// The session variable a segment row's update trigger sets to the row
/// it leaves where its guard vouches for the row it reserved from: a
/// block's proof, read with the table's identity.
const BLOCK_PROOF: &str = "@shardflake_block";

/// The version of the guard's text ([`guard_triggers`]), the label of
/// every trigger's body: `init` puts this release's text in where a
/// trigger's differs (keeping its token, so rows stay vouched for), and
/// `check` warns of a guard of another version. 2: the give-back branch
/// of the segment guard (`@shardflake_give_back`, which no client sets
/// since segment tails are skipped) is gone; version 1 had no label.
const GUARD_VERSION: u32 = 2;

/// A trigger's body under the guard's version label (`statements`: what
/// goes between `BEGIN` and `END`). MariaDB keeps the body as written, so
/// `ACTION_STATEMENT` reads it back the same.
fn guard_body(statements: &str) -> String {
    format!(
        "{} BEGIN {statements} END shardflake_guard_v{GUARD_VERSION}",
        guard_label()
    )
}

/// What every guard trigger's body of this release starts with.
fn guard_label() -> String {
    format!("shardflake_guard_v{GUARD_VERSION}:")
}

/// The column of a per-id counter row that says what its guard vouches
/// for: `<token>:<id>`, the guard's token (new each time `init` makes
/// the guard anew) and the id the guard last left the row at.
const VOUCHED: &str = "vouched";

/// The one row of a per-id table (Flickr's stub).
const STUB: &str = "a";

/// What [`ticket_sql`]'s `SELECT` reads.
struct TicketRow {
    /// `ROW_COUNT()`: 1, or 0 where the table has no row.
    moved: i64,
    /// The id handed out.
    id: u64,
    /// What the guard's trigger set, if it ran and vouches for the row.
    proof: Option<u64>,
    /// Whether the guard's update trigger ran.
    guarded: bool,
    /// The table's identity ([`Stamped::table`]).
    table: Option<i64>,
}

/// The two shapes of a per-id table `init` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PerIdForm {
    /// `(id auto_increment PRIMARY KEY, stub UNIQUE)`, handed out by
    /// `REPLACE INTO` (shardflake before the counter row, and Flickr):
    /// `init` converts it.
    Replace,
    /// `(stub PRIMARY KEY, id)`: the counter row.
    Counter,
}

/// The guard's triggers of the `REPLACE` form, which `init` drops when it
/// converts a table (suffixes of the table's name).
const REPLACE_FORM_TRIGGERS: [&str; 4] = ["_guard_i", "_guard_u", "_guard_d", "_guard_v"];

impl MariaSession {
    /// Runs sequence `index`'s [`ticket_sql`]; its `SELECT`'s row.
    async fn take_ticket(&mut self, index: usize) -> Result<Option<TicketRow>, mysql_async::Error> {
        let mut result = self.conn.query_iter(self.tickets[index].as_str()).await?;
        let mut last = None;
        while !result.is_empty() {
            let rows: Vec<mysql_async::Row> = result.collect().await?;
            if let Some(row) = rows.into_iter().next() {
                last = Some(row);
            }
        }
        let Some(row) = last else { return Ok(None) };
        let (moved, id, proof, guarded, table) =
            mysql_async::from_row_opt::<(i64, u64, Option<u64>, bool, Option<i64>)>(row)
                .map_err(|e| mysql_async::Error::Other(format!("{e:?}").into()))?;
        Ok(Some(TicketRow {
            moved,
            id,
            proof,
            guarded,
            table,
        }))
    }

    /// The shape of per-id table `table`; `None`: no such table.
    async fn per_id_form(&mut self, table: &str) -> Result<Option<PerIdForm>, TicketError> {
        let extra: Option<String> = self
            .conn
            .query_first(format!(
                "SELECT EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'id'"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the ticket table's shape", e))?;
        Ok(extra.map(|extra| match extra.contains("auto_increment") {
            true => PerIdForm::Replace,
            false => PerIdForm::Counter,
        }))
    }

    /// Converts per-id table `seq` of the `REPLACE` form to the counter
    /// row, in place, with clients running. The counter form's guard is
    /// already on it ([`guard_triggers`]: its insert trigger refuses every
    /// `REPLACE`, so an older client is refused from then on, never handed
    /// an id the counter row hands out too). Returns the next id above
    /// every id the table handed out (its `AUTO_INCREMENT` and, read when
    /// no `REPLACE` can run any more, its largest row). The table is
    /// rebuilt: running clients see a new table (`recreated`) and are
    /// raised past the marks.
    async fn convert(&mut self, seq: &SequenceConfig) -> Result<u64, TicketError> {
        let table = seq.table();
        let err = |what: &str| {
            let (server, what) = (
                self.server.clone(),
                format!("init: convert {table}: {what}"),
            );
            move |e| TicketError::db(&server, &what, e)
        };
        // AUTO_INCREMENT before the ALTER removes it; the largest row after
        // it, when no REPLACE can run any more (one into a table still
        // empty went through the insert guard meanwhile).
        let counter: Option<u64> = self
            .conn
            .query_first(format!(
                "SELECT COALESCE(AUTO_INCREMENT, 1) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
            ))
            .await
            .map_err(err("read its AUTO_INCREMENT"))?;
        self.conn
            .query_drop(format!(
                "ALTER TABLE {table} MODIFY id {COUNTER_COLUMN} NOT NULL, MODIFY stub char(1) NOT NULL, DROP PRIMARY KEY, DROP INDEX stub, ADD PRIMARY KEY (stub)"
            ))
            .await
            .map_err(err("ALTER TABLE to the counter row"))?;
        let row: Option<u64> = self
            .conn
            .query_first(format!("SELECT COALESCE(MAX(id), 0) + 1 FROM {table}"))
            .await
            .map_err(err("read its largest row"))?;
        Ok(counter.unwrap_or(1).max(row.unwrap_or(1)))
    }
}

impl MariaSession {
    /// The [`VOUCHED`] column added to per-id table `table` (or the
    /// segment table) of an older
    /// release (a nullable column: instant, rows written meanwhile go in;
    /// the row is vouched for by no guard until a client raises it).
    async fn add_vouched(&mut self, table: &str) -> Result<(), TicketError> {
        let has: Option<u64> = self
            .conn
            .query_first(format!(
                "SELECT 1 FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' AND COLUMN_NAME = '{VOUCHED}'"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "init: read the ticket table's columns", e))?;
        if has.is_some() {
            return Ok(());
        }
        self.conn
            .query_drop(format!(
                "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {VOUCHED} varchar(64) NULL"
            ))
            .await
            .map_err(|e| {
                TicketError::db(
                    &self.server,
                    &format!("init: ALTER TABLE {table} ADD COLUMN {VOUCHED}"),
                    e,
                )
            })
    }

    /// The token of the guard of per-id table `table` (or the segment
    /// table): the one its update
    /// trigger carries where every trigger of the guard is there, so that
    /// `init` again changes nothing; else a new one. A guard made anew
    /// (one of its triggers was missing: dropped, a restore without
    /// triggers) vouches for no row until a client raises it past the
    /// marks ([`guard_triggers`]).
    async fn guard_token(&mut self, table: &str) -> Result<String, TicketError> {
        let names = guard_names(&[table.to_string()]);
        let update = match table == SEGMENT_TABLE {
            true => format!("{GUARD}_update"),
            false => format!("{table}_ctr_u"),
        };
        let err = |e| TicketError::db(&self.server, "init: read the guard's token", e);
        let found: Option<(u64, Option<String>)> = self
            .conn
            .query_first(format!(
                "SELECT COUNT(*), MAX(REGEXP_SUBSTR(IF(TRIGGER_NAME = '{update}', ACTION_STATEMENT, ''), '{TOKEN_PREFIX}[0-9a-f]{{16}}')) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = '{table}' AND TRIGGER_NAME IN ({names})"
            ))
            .await
            .map_err(err)?;
        if let Some((count, Some(token))) = found
            && count == guard_triggers(table, "").len() as u64
            && !token.is_empty()
        {
            return Ok(token);
        }
        let token: Option<String> = self
            .conn
            .query_first(format!(
                "SELECT CONCAT('{TOKEN_PREFIX}', LEFT(MD5(CONCAT(UUID(), RAND())), 16))"
            ))
            .await
            .map_err(err)?;
        token.ok_or_else(|| TicketError::db(&self.server, "init: make the guard's token", "no row"))
    }
}

impl MariaSession {
    /// Puts the guard `triggers` (`(name, CREATE OR REPLACE …)`) on
    /// `table`: each trigger missing or whose text differs (another
    /// version, another token) is made, one already as wanted is left as
    /// it is (`init` again takes no lock on a table clients use). Says so
    /// where it replaced a trigger of another guard version.
    async fn install_guard(
        &mut self,
        table: &str,
        triggers: Vec<(String, String)>,
    ) -> Result<Option<String>, TicketError> {
        let installed: Vec<(String, String)> = self
            .conn
            .query(format!(
                "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = '{table}'"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "init: read the guard's triggers", e))?;
        let mut other_version = false;
        for (trigger, sql) in triggers {
            let body = sql.split_once(" FOR EACH ROW ").map_or("", |(_, b)| b);
            match installed.iter().find(|(name, _)| *name == trigger) {
                Some((_, now)) if now == body => continue,
                Some((_, now)) => other_version |= !now.starts_with(&guard_label()),
                None => {}
            }
            self.conn.query_drop(sql).await.map_err(|e| {
                TicketError::db(
                    &self.server,
                    &format!("init: CREATE TRIGGER {trigger} ON {table}"),
                    e,
                )
            })?;
        }
        Ok(other_version.then(|| {
            format!(
                "{table}: guard of another shardflake release replaced by guard version {GUARD_VERSION} (running clients go on: what it vouched for stays vouched for)"
            )
        }))
    }

    /// The tables among `tables` with a guard trigger of another guard
    /// version than this release's (an older shardflake's; `init` puts
    /// this release's in, and clients of this release use either
    /// meanwhile). Other triggers (an application's own, on an adopted
    /// table) are not looked at.
    async fn older_guards(
        &mut self,
        config: &Config,
        tables: &[String],
    ) -> Result<Vec<String>, TicketError> {
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        let names = tables
            .iter()
            .flat_map(|t| guard_of(config, t))
            .map(|(name, _)| format!("'{name}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let label = guard_label();
        self.conn
            .query(format!(
                "SELECT DISTINCT EVENT_OBJECT_TABLE FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND TRIGGER_NAME IN ({names}) AND LEFT(ACTION_STATEMENT, {}) <> '{label}' ORDER BY 1",
                label.len()
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the guard's version", e))
    }
}

/// What a guard's token starts with (then 16 hex digits).
const TOKEN_PREFIX: &str = "sfg";

/// Why a server's global `auto_increment_increment`/`offset` (`global`),
/// which an adopted table's own applications draw with, cannot be used:
/// `None` when they are the file's.
fn globals_off_lattice(
    global: Option<(u64, u64)>,
    config: &Config,
    server: &ServerConfig,
) -> Option<String> {
    let want = (config.increment, server.offset);
    let (gi, go) = global.unwrap_or((0, 0));
    if (gi, go) == want {
        return None;
    }
    let off = format!(
        "the server's global auto_increment_increment/offset are {gi}/{go}, the file's increment/offset {}/{}: the applications' own REPLACE INTO on an adopted table would hand out ids of another server's class",
        want.0, want.1
    );
    // A server already on the file's increment at another offset (offsets
    // swapped in the file): its applications already draw that class, so
    // the file follows the server. A SET GLOBAL under running applications
    // splits it: their open connections keep the offset they connected
    // with, and two servers then hand out one class.
    if gi == config.increment && (1..=gi).contains(&go) {
        return Some(format!(
            "{off}; its applications already draw ids of offset {go}: set `offset = {go}` for server {} in the file (and give any other server of the file its own server's global offset), then run `shardflake tickets init`; do not SET GLOBAL another offset while applications run: their open connections keep the one they connected with, and two servers would hand out the same ids",
            server.name
        ));
    }
    Some(format!(
        "{off}; with every application of the server stopped (their open connections keep the values they connected with), set auto-increment-increment = {} and auto-increment-offset = {} in the server's configuration and with SET GLOBAL, then run `shardflake tickets init` before they start again",
        want.0, want.1
    ))
}

impl MariaSession {
    /// What makes adopted table `seq` unusable as a Flickr ticket table
    /// both kinds of client share: not there, `id` not a `bigint`
    /// `AUTO_INCREMENT`, no unique key on `stub` alone (each `REPLACE`
    /// would add a row), or the server's globals off the lattice. `None`:
    /// fine. `init` refuses it, `check` reports it.
    async fn adopted_problem(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<Option<String>, TicketError> {
        let table = seq.table();
        let err = |e| TicketError::db(&self.server, &format!("read the shape of {table}"), e);
        let id: Option<(String, String)> = self
            .conn
            .query_first(format!(
                "SELECT COLUMN_TYPE, EXTRA FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' AND COLUMN_NAME = 'id'"
            ))
            .await
            .map_err(err)?;
        let Some((column, extra)) = id else {
            return Ok(Some(format!(
                "{table} has no column id (or is not there): `table` names an existing Flickr ticket table (id bigint AUTO_INCREMENT, stub with a unique key); remove `table` from sequence {} to have init create tickets_{}",
                seq.name, seq.name
            )));
        };
        if !column.starts_with("bigint") || !extra.contains("auto_increment") {
            return Ok(Some(format!(
                "{table}.id is {column} {extra}, not a bigint AUTO_INCREMENT: not a Flickr ticket table; ALTER TABLE {table} MODIFY id bigint unsigned NOT NULL AUTO_INCREMENT, then run `shardflake tickets init`"
            )));
        }
        let keyed: Option<u64> = self
            .conn
            .query_first(format!(
                "SELECT 1 FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' AND NON_UNIQUE = 0 GROUP BY INDEX_NAME HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = 'stub' LIMIT 1"
            ))
            .await
            .map_err(err)?;
        if keyed.is_none() {
            return Ok(Some(format!(
                "{table} has no unique key on stub alone: every REPLACE INTO would add a row rather than replace the one row; ALTER TABLE {table} ADD UNIQUE KEY stub (stub), then run `shardflake tickets init`"
            )));
        }
        let global: Option<(u64, u64)> = self
            .conn
            .query_first("SELECT @@global.auto_increment_increment, @@global.auto_increment_offset")
            .await
            .map_err(err)?;
        Ok(globals_off_lattice(global, config, server))
    }

    /// `init` of adopted table `seq`: refused where [`Self::adopted_problem`]
    /// says; else its guard (no trigger that changes how `REPLACE` runs:
    /// no delete trigger, which makes InnoDB run it as a real delete and
    /// insert) and its `AUTO_INCREMENT` raised past `start`, never
    /// lowered (InnoDB keeps it above every id the table handed out).
    /// Idempotent.
    async fn adopt(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<String, TicketError> {
        if let Some(why) = self.adopted_problem(config, server, seq).await? {
            return Err(TicketError::misconfigured(&self.server, why));
        }
        let table = seq.table();
        let upgraded = self
            .install_guard(&table, adopted_guard_triggers(&table))
            .await?;
        self.raise(config, server, seq, seq.start - 1).await?;
        let counter = self.counter(config, server, seq).await?.unwrap_or(0);
        Ok(format!(
            "{}: adopted table {table} (stub '{}'; its applications' own REPLACE INTO keeps working beside shardflake's clients), ids above {counter}{}",
            seq.name,
            seq.stub(),
            upgraded.map(|u| format!("; {u}")).unwrap_or_default()
        ))
    }
}

/// The SQL type of a per-id counter row's `id`, the next id: `bigint
/// unsigned` for 32 bits too, so that the row can pass 4,294,967,295 and
/// that last id be handed out (the client refuses every id past a
/// sequence's largest: `exhausted`).
const COUNTER_COLUMN: &str = "bigint unsigned";

/// The first id at or above `from` in a server's residue class (`≡ offset
/// (mod increment)`, as MariaDB's `auto_increment_offset` means it).
fn first_at_or_above(increment: u64, offset: u64, from: u64) -> u64 {
    let up = (offset % increment + increment - from % increment) % increment;
    from.saturating_add(up)
}

/// The largest id below `next` in a server's residue class (0: none): the
/// last id a counter whose next id is `next` may have handed out (not
/// `next - 1`, which is another class's when the increment is above 1).
fn last_below(increment: u64, offset: u64, next: u64) -> u64 {
    let Some(below) = next.checked_sub(1) else {
        return 0;
    };
    let down = (below % increment + increment - offset % increment) % increment;
    below.saturating_sub(down)
}

impl MariaSession {
    /// The version [`Backend::pin_lattice`] pinned this session to.
    fn pinned(&self) -> Result<i64, TicketError> {
        self.lattice.ok_or_else(|| {
            TicketError::misconfigured(
                &self.server,
                "a session used before its lattice was checked",
            )
        })
    }
}

impl Backend for MariaSession {
    /// Nothing to prepare: the increment and offset are set at connect,
    /// and every statement is sent as text.
    async fn prepare(&mut self, _: &ServerConfig, _: &Config) -> Result<(), TicketError> {
        Ok(())
    }

    /// One per-id ticket: the counter row advanced, read back with its
    /// guard's proof and the table's identity, in one round trip
    /// ([`ticket_sql`]). An answer without the proof is refused, whatever
    /// its value: where the guard did not run (dropped, or the table of
    /// before `init` converted it), as a table without its guard; where
    /// it ran but does not vouch for the row (moved outside it, or the
    /// guard made anew: [`guard_triggers`]), as `recreated`, checked
    /// against the marks again.
    async fn next_ticket(
        &mut self,
        index: usize,
        seq: &SequenceConfig,
    ) -> Result<Stamped<u64>, TicketError> {
        let mut answer = self.take_ticket(index).await;
        for _ in 0..DEADLOCK_RETRIES {
            match &answer {
                Err(mysql_async::Error::Server(e))
                    if seq.adopted() && e.code == ER_LOCK_DEADLOCK =>
                {
                    answer = self.take_ticket(index).await;
                }
                _ => break,
            }
        }
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) if is_full(&e) => {
                return Err(TicketError::Exhausted {
                    sequence: seq.name.clone(),
                    max: seq.max_id(),
                });
            }
            Err(e) if is_lattice_moved(&e) => return Err(lattice_moved(&self.server, &seq.name)),
            Err(e) => return Err(TicketError::db(&self.server, "take a ticket", e)),
        };
        let Some(TicketRow {
            moved,
            id,
            proof,
            guarded,
            table,
        }) = answer
        else {
            return Err(TicketError::db(&self.server, "take a ticket", "no answer"));
        };
        // A REPLACE moves 1 row (inserted) or 2 (the old one replaced).
        if moved != 1 && !(seq.adopted() && moved == 2) {
            return Err(not_initialised(&self.server, seq));
        }
        if proof != Some(id) {
            // The guard ran but does not vouch for the row: it was moved
            // outside the guard, or the guard was made anew. Like a table
            // recreated: checked against the marks again.
            if guarded && proof.is_none() {
                return Err(TicketError::Recreated {
                    server: self.server.clone(),
                    sequence: seq.name.clone(),
                });
            }
            return Err(unguarded(&self.server, &seq.table()));
        }
        Ok(Stamped { value: id, table })
    }

    /// The identity of what sequence `seq` counts with: its table's (per
    /// id) or the segment table's (see [`Stamped`], [`Identity`]).
    async fn identity(&mut self, seq: &SequenceConfig) -> Result<Option<i64>, TicketError> {
        if !self.returning {
            return Ok(None);
        }
        let table = match seq.mode {
            Mode::PerId => seq.table(),
            Mode::Segment => SEGMENT_TABLE.to_string(),
        };
        let created: Option<Option<i64>> =
            self.conn
                .query_first(self.identity.sql(&table))
                .await
                .map_err(|e| TicketError::db(&self.server, "read the table's identity", e))?;
        Ok(created.flatten())
    }

    /// Reserves a block: `max_id = GREATEST(max_id, floor) + step`, read back
    /// through `LAST_INSERT_ID(expr)` (the guard's trigger keeps it out of
    /// the OK packet: `SELECT LAST_INSERT_ID()`), only where the
    /// row is at or above `seen` (the largest this client got from it):
    /// `Err(row)` when it is below (the server went back); and only while
    /// the server's lattice version is the session's (else `lattice_changed`). The segment
    /// table's identity and guard are read after it (a second round trip,
    /// once a block: `UPDATE` has no `RETURNING`); read after, they show
    /// any recreation that came before the reservation.
    async fn reserve(
        &mut self,
        seq: &SequenceConfig,
        floor: i64,
        step: i64,
        seen: i64,
    ) -> Result<Stamped<Result<i64, i64>>, TicketError> {
        let version = self.pinned()?;
        self.conn
            .query_drop(format!(
                "UPDATE {SEGMENT_TABLE} SET max_id = LAST_INSERT_ID(GREATEST(max_id, {floor}) + {step}) WHERE sequence_name = '{}' AND max_id >= {seen} AND (SELECT version FROM {VERSION_TABLE}) = {version}",
                seq.name
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "reserve a block", e))?;
        let value = if self.conn.affected_rows() != 1 {
            let row: Option<(i64, Option<i64>)> = self
                .conn
                .query_first(format!(
                    "SELECT max_id, (SELECT version FROM {VERSION_TABLE}) FROM {SEGMENT_TABLE} WHERE sequence_name = '{}'",
                    seq.name
                ))
                .await
                .map_err(|e| TicketError::db(&self.server, "read the segment row", e))?;
            match row {
                Some((_, now)) if now != Some(version) => {
                    return Err(lattice_moved(&self.server, &seq.name));
                }
                Some((row, _)) => Err(row),
                None => return Err(not_initialised(&self.server, seq)),
            }
        } else {
            // The OK packet carries it unless a trigger ran (the guard):
            // then it is asked for.
            let max = match self.conn.last_insert_id() {
                Some(max) => max,
                None => self
                    .conn
                    .query_first::<u64, _>("SELECT LAST_INSERT_ID()")
                    .await
                    .map_err(|e| TicketError::db(&self.server, "reserve a block", e))?
                    .ok_or_else(|| {
                        TicketError::db(&self.server, "reserve a block", "no LAST_INSERT_ID")
                    })?,
            };
            Ok(i64::try_from(max)
                .map_err(|_| TicketError::db(&self.server, "reserve a block", "max_id overflow"))?)
        };
        // The table's identity and its guard, in one round trip: a table
        // without its guard (a restore made with --skip-triggers, a trigger
        // dropped) is refused before its block is used.
        let identity = match self.returning {
            true => format!("({})", self.identity.sql(SEGMENT_TABLE)),
            false => "NULL".to_string(),
        };
        let (table, guards, proof): (Option<i64>, u64, Option<i64>) = self
            .conn
            .query_first(format!(
                "SELECT {identity}, ({}), {BLOCK_PROOF}",
                guard_count_sql()
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the table's identity", e))?
            .ok_or_else(|| TicketError::db(&self.server, "read the table's identity", "no row"))?;
        if guards != guard_triggers(SEGMENT_TABLE, "").len() as u64 {
            return Err(unguarded(&self.server, SEGMENT_TABLE));
        }
        // A block reserved from a row its guard does not vouch for (moved
        // outside the guard, or the guard made anew): not used, the
        // server checked against the marks again. (The proof of an
        // earlier block is another row: a reservation moves the row.)
        if let Ok(max) = value
            && proof != Some(max)
        {
            return Err(TicketError::Recreated {
                server: self.server.clone(),
                sequence: seq.name.clone(),
            });
        }
        Ok(Stamped { value, table })
    }

    /// The largest id the server's counter says it may have handed out: every
    /// later id is above it. `None`: not initialised. A per-id table of the
    /// counter form holds the next id; one of the `REPLACE` form (before
    /// `init` converted it), its `AUTO_INCREMENT` and largest row.
    async fn counter(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<Option<u64>, TicketError> {
        let lattice = Lattice::new(config, server);
        match seq.mode {
            Mode::PerId => {
                let table = seq.table();
                // An adopted table's rows of other stubs draw from the
                // same AUTO_INCREMENT.
                let stub = match seq.adopted() {
                    true => String::new(),
                    false => format!(" WHERE stub = '{STUB}'"),
                };
                let row: Option<(Option<u64>, Option<u64>)> = self
                    .conn
                    .query_first(format!(
                        "SELECT AUTO_INCREMENT, (SELECT MAX(id) FROM {table}{stub}) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}'"
                    ))
                    .await
                    .map_err(|e| {
                        TicketError::db(&self.server, &format!("read the counter of {table}"), e)
                    })?;
                let last = |next| last_below(config.increment, server.offset, next);
                Ok(match row {
                    None => None,
                    Some((Some(next), id)) => Some(last(next).max(id.unwrap_or(0))),
                    Some((None, next)) => next.map(last),
                })
            }
            Mode::Segment => {
                let row: Option<i64> = self
                    .conn
                    .query_first(format!(
                        "SELECT max_id FROM {SEGMENT_TABLE} WHERE sequence_name = '{}'",
                        seq.name
                    ))
                    .await
                    .map_err(|e| TicketError::db(&self.server, "read the segment row", e))?;
                Ok(row.map(|max| lattice.counter_of_row(max)))
            }
        }
    }

    /// Raises the counter so that every later id is above `past`: a per-id
    /// row to the first id of the server's class above it (`GREATEST`:
    /// never lowered, whatever clients took meanwhile).
    async fn raise(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        let lattice = Lattice::new(config, server);
        let sql = match seq.mode {
            Mode::PerId if seq.adopted() => {
                // InnoDB never sets AUTO_INCREMENT at or below the
                // table's largest id, and the row holds the last id
                // handed out: asked only to raise it, it never lowers
                // below an id handed out, even when a REPLACE ran since
                // the counter was read.
                let next =
                    first_at_or_above(config.increment, server.offset, past.min(seq.max_id()) + 1);
                match self.counter(config, server, seq).await? {
                    Some(counter) if counter >= next - 1 => return Ok(()),
                    _ => format!("ALTER TABLE {} AUTO_INCREMENT = {next}", seq.table()),
                }
            }
            Mode::PerId => {
                let next =
                    first_at_or_above(config.increment, server.offset, past.min(seq.max_id()) + 1);
                format!(
                    "UPDATE {} SET id = GREATEST(id, {next}) WHERE stub = '{STUB}'",
                    seq.table()
                )
            }
            Mode::Segment => raise_segment_sql(lattice, seq, past),
        };
        self.conn
            .query_drop(&sql)
            .await
            .map_err(|e| TicketError::db(&self.server, &format!("raise the counter ({sql})"), e))
    }

    /// A per-id counter row (not an adopted table's) or a segment row
    /// raised past `past` with [`VOUCH`] set: its guard vouches for the row
    /// from now on.
    async fn vouch(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        if seq.adopted() {
            return Ok(());
        }
        let err = |e| TicketError::db(&self.server, "vouch for the counter row", e);
        let sql = match seq.mode {
            Mode::PerId => {
                let next =
                    first_at_or_above(config.increment, server.offset, past.min(seq.max_id()) + 1);
                format!(
                    "UPDATE {} SET id = GREATEST(id, {next}) WHERE stub = '{STUB}'",
                    seq.table()
                )
            }
            Mode::Segment => raise_segment_sql(Lattice::new(config, server), seq, past),
        };
        self.conn
            .query_drop(format!("SET {VOUCH} = 1"))
            .await
            .map_err(err)?;
        let vouched = self.conn.query_drop(sql).await;
        let reset = self.conn.query_drop(format!("SET {VOUCH} = NULL")).await;
        vouched.map_err(err)?;
        reset.map_err(err)
    }

    /// The increment and offset are the client's: a per-id row is raised
    /// onto the new class past `past` and every id it may have handed out
    /// on the old one (no client takes one meanwhile: the reshape has
    /// fenced them).
    async fn reshape(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        let counter = match seq.mode {
            Mode::PerId => self.counter(config, server, seq).await?.unwrap_or(0),
            Mode::Segment => 0,
        };
        self.raise(config, server, seq, past.max(counter)).await
    }

    /// Raises (never lowers) high-water marks: `(server, sequence, id)`,
    /// only into a table that is not empty (`init` puts `HW_INIT_ROW` in).
    /// A live `mariadb-dump` restore recreates the table empty and then
    /// inserts its rows: a mark written between the two would make the
    /// dump's `INSERT` fail (`Duplicate entry`) and abort the restore
    /// halfway. Into the empty table nothing is written: the mark is not
    /// held here (an error, as for a place down); the dump's rows go in.
    async fn write_high_water(
        &mut self,
        marks: &[(String, String, u64)],
        mark_fence: Option<MarkFence<'_>>,
    ) -> Result<bool, TicketError> {
        if marks.is_empty() {
            return Ok(true);
        }
        let rows = marks
            .iter()
            .map(|(s, q, hw)| format!("SELECT '{s}' AS s, '{q}' AS q, {hw} AS h"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ");
        let fence = match mark_fence {
            Some(f) => {
                format!(
                    " AND {} AND {}",
                    holder_fence(f.class, f.identity, "LOCK IN SHARE MODE"),
                    super::lattice_fence(f.class, f.lattice, marks, "LOCK IN SHARE MODE")
                )
            }
            None => String::new(),
        };
        let context = "write high-water marks";
        self.conn
            .query_drop(format!(
                "INSERT INTO {HW_TABLE} (server_name, sequence_name, high_water) SELECT s, q, h FROM ({rows}) AS m WHERE EXISTS (SELECT 1 FROM {HW_TABLE}){fence} ON DUPLICATE KEY UPDATE high_water = GREATEST(high_water, VALUES(high_water))"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, context, e))?;
        if self.conn.affected_rows() > 0 {
            return Ok(true);
        }
        // Nothing changed: every mark was already as high, the table is
        // empty, the class is another identity's here, or of another
        // lattice.
        if let Some(f) = mark_fence {
            if let Some(h) = self.read_holder(f.class).await?
                && h.identity != f.identity
            {
                return Ok(false);
            }
            let refused: Option<i32> = self
                .conn
                .query_first(super::lattice_fence_refuses(f.class, f.lattice, marks))
                .await
                .map_err(|e| TicketError::db(&self.server, context, e))?;
            match refused {
                Some(1) => return Err(super::lattice_fenced(&self.server, f.class, f.lattice)),
                Some(super::NO_VERSION) => return Err(super::no_version(&self.server)),
                _ => {}
            }
        }
        let any: Option<u64> = self
            .conn
            .query_first(format!("SELECT EXISTS (SELECT 1 FROM {HW_TABLE})"))
            .await
            .map_err(|e| TicketError::db(&self.server, context, e))?;
        match any {
            Some(1) => Ok(true),
            _ => Err(TicketError::db(
                &self.server,
                context,
                format!(
                    "{HW_TABLE} is empty (recreated by a restore under way, or never given its init row: run `shardflake tickets init`): no mark is written into it"
                ),
            )),
        }
    }

    async fn read_holder(&mut self, class: &str) -> Result<Option<Holder>, TicketError> {
        let row: Option<(String, u64, String)> = self
            .conn
            .query_first(format!(
                "SELECT identity, generation, superseded FROM {HOLDERS_TABLE} WHERE class_key = '{class}'"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the class's holder", e))?;
        Ok(row
            .map(|(identity, generation, superseded)| holder_of(identity, generation, &superseded)))
    }

    /// A mark write under way holds a shared lock on the holder row (or
    /// its gap) read by its fence: the `INSERT`/`UPDATE` here waits for it,
    /// and every later write reads the new holder.
    async fn claim(
        &mut self,
        class: &str,
        identity: &str,
        server: &str,
        from: Option<&Holder>,
    ) -> Result<bool, TicketError> {
        let sql = match from {
            None => format!(
                "INSERT IGNORE INTO {HOLDERS_TABLE} (class_key, identity, generation, server_name, superseded) SELECT '{class}', '{identity}', 1, '{server}', '' FROM DUAL WHERE EXISTS (SELECT 1 FROM {HOLDERS_TABLE} WHERE class_key = '')"
            ),
            Some(h) => format!(
                "UPDATE {HOLDERS_TABLE} SET identity = '{identity}', generation = {}, server_name = '{server}', superseded = TRIM(CONCAT(superseded, ' ', '{}')) WHERE class_key = '{class}' AND generation = {} AND identity = '{}'",
                h.generation + 1,
                h.identity,
                h.generation,
                h.identity
            ),
        };
        let context = "take the class over";
        self.conn
            .query_drop(sql)
            .await
            .map_err(|e| TicketError::db(&self.server, context, e))?;
        if self.conn.affected_rows() == 1 {
            return Ok(true);
        }
        let init_row: Option<u64> = self
            .conn
            .query_first(format!(
                "SELECT EXISTS (SELECT 1 FROM {HOLDERS_TABLE} WHERE class_key = '')"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, context, e))?;
        match init_row {
            Some(1) => Ok(false),
            _ => Err(super::holders_empty(&self.server)),
        }
    }

    /// The largest mark this server holds for `sequence`, of any server.
    async fn read_marks_of_sequence(&mut self, sequence: &str) -> Result<u64, TicketError> {
        let max: Option<Option<u64>> = self
            .conn
            .query_first(format!(
                "SELECT MAX(high_water) FROM {HW_TABLE} WHERE sequence_name = '{sequence}'"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read high-water marks", e))?;
        Ok(max.flatten().unwrap_or(0))
    }

    /// When the server started, in unix seconds, and its identity: host
    /// name, port, data directory, `server_id`, database (MariaDB 10.11
    /// has no `@@server_uuid`).
    async fn identify(&mut self) -> Result<ServerIdentity, TicketError> {
        let row: Option<(i64, String)> = self
            .conn
            .query_first("SELECT CAST(UNIX_TIMESTAMP() - VARIABLE_VALUE AS SIGNED), CONCAT_WS(':', 'mariadb', @@hostname, @@port, @@datadir, @@server_id, DATABASE()) FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'UPTIME'")
            .await
            .map_err(|e| TicketError::db(&self.server, "read the uptime and identity", e))?;
        let (started, id) = row.ok_or_else(|| {
            TicketError::db(&self.server, "read the uptime and identity", "no row")
        })?;
        Ok(ServerIdentity {
            started,
            id: clean_identity(&id),
        })
    }

    /// The tables that lack one of their guard's triggers (MariaDB cannot
    /// disable a trigger).
    async fn unguarded(&mut self, config: &Config) -> Result<Vec<String>, TicketError> {
        let tables = guarded_tables(config, Kind::Mariadb);
        if tables.is_empty() {
            return Ok(tables);
        }
        let names = tables
            .iter()
            .flat_map(|t| guard_of(config, t))
            .map(|(name, _)| format!("'{name}'"))
            .collect::<Vec<_>>()
            .join(", ");
        let found: Vec<String> = self
            .conn
            .query(format!(
                "SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND TRIGGER_NAME IN ({names})"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the triggers", e))?;
        Ok(tables
            .into_iter()
            .filter(|t| {
                guard_of(config, t)
                    .iter()
                    .any(|(name, _)| !found.contains(name))
            })
            .collect())
    }

    /// Every lattice recorded here (none before `init`).
    async fn read_lattice(&mut self) -> Result<Vec<(String, LatticeRecord)>, TicketError> {
        let exists: Option<u64> = self
            .conn
            .query_first(format!(
                "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{LATTICE_TABLE}'"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the recorded lattice", e))?;
        if exists.is_none() {
            return Ok(Vec::new());
        }
        let rows: Vec<(String, String, u64, u64, String, u32, u64)> = self
            .conn
            .query(format!(
                "SELECT sequence_name, server_name, increment, server_offset, mode, bits, chunk FROM {LATTICE_TABLE}"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read the recorded lattice", e))?;
        Ok(rows
            .into_iter()
            .map(|(q, server, increment, offset, mode, bits, chunk)| {
                (
                    q,
                    LatticeRecord {
                        server,
                        increment,
                        offset,
                        mode,
                        bits,
                        chunk,
                    },
                )
            })
            .collect())
    }

    /// The lattice's version (`None`: no [`VERSION_TABLE`], before `init`).
    async fn lattice_version(&mut self) -> Result<Option<LatticeVersion>, TicketError> {
        let read = self
            .conn
            .query_first::<(i64, bool), _>(format!(
                "SELECT version, reshaping FROM {VERSION_TABLE}"
            ))
            .await;
        match read {
            Ok(row) => Ok(row.map(|(version, reshaping)| LatticeVersion { version, reshaping })),
            Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok(None),
            Err(e) => Err(TicketError::db(&self.server, "read the lattice version", e)),
        }
    }

    async fn read_marks_at(&mut self) -> Result<Option<String>, TicketError> {
        let read = self
            .conn
            .query_first::<String, _>(format!("SELECT places FROM {MARKS_AT_TABLE}"))
            .await;
        match read {
            Ok(places) => Ok(places),
            Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok(None),
            Err(e) => Err(TicketError::db(
                &self.server,
                "read where the marks are kept",
                e,
            )),
        }
    }

    async fn write_marks_at(&mut self, places: &str, replace: bool) -> Result<(), TicketError> {
        let verb = if replace { "REPLACE" } else { "INSERT IGNORE" };
        self.conn
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {MARKS_AT_TABLE} (one tinyint NOT NULL DEFAULT 1 PRIMARY KEY CHECK (one = 1), places varchar(4096) NOT NULL) ENGINE=InnoDB"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, &format!("CREATE TABLE {MARKS_AT_TABLE}"), e))?;
        self.conn
            .exec_drop(
                format!("{verb} INTO {MARKS_AT_TABLE} (one, places) VALUES (1, ?)"),
                (places,),
            )
            .await
            .map_err(|e| TicketError::db(&self.server, &format!("{verb} INTO {MARKS_AT_TABLE}"), e))
    }

    async fn forget_marks_at(&mut self, places: &str) -> Result<(), TicketError> {
        self.conn
            .exec_drop(
                format!("DELETE FROM {MARKS_AT_TABLE} WHERE places = ?"),
                (places,),
            )
            .await
            .map_err(|e| TicketError::db(&self.server, &format!("DELETE FROM {MARKS_AT_TABLE}"), e))
    }

    /// `@shardflake_lattice`, which the per-id tables' guard compares.
    async fn pin_lattice(&mut self, version: i64) -> Result<(), TicketError> {
        self.conn
            .query_drop(format!("SET @shardflake_lattice = {version}"))
            .await
            .map_err(|e| TicketError::db(&self.server, "pin the lattice version", e))?;
        self.lattice = Some(version);
        Ok(())
    }

    async fn begin_reshape(&mut self, to: i64) -> Result<(), TicketError> {
        self.conn
            .query_drop(format!(
                "UPDATE {VERSION_TABLE} SET version = GREATEST(version + 1, {to}), reshaping = TRUE"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "begin the reshape", e))
    }

    async fn end_reshape(&mut self) -> Result<(), TicketError> {
        self.conn
            .query_drop(format!("UPDATE {VERSION_TABLE} SET reshaping = FALSE"))
            .await
            .map_err(|e| TicketError::db(&self.server, "end the reshape", e))
    }

    /// Records (replaces) the lattice of `sequence`.
    async fn write_lattice(
        &mut self,
        sequence: &str,
        r: &LatticeRecord,
    ) -> Result<(), TicketError> {
        self.conn
            .query_drop(format!(
                "REPLACE INTO {LATTICE_TABLE} (sequence_name, server_name, increment, server_offset, mode, bits, chunk) VALUES ('{sequence}', '{}', {}, {}, '{}', {}, {})",
                r.server, r.increment, r.offset, r.mode, r.bits, r.chunk
            ))
            .await
            .map_err(|e| {
                TicketError::db(
                    &self.server,
                    &format!("record the lattice of {sequence} (REPLACE INTO {LATTICE_TABLE})"),
                    e,
                )
            })
    }

    /// Every server this server holds marks of (not `init`'s row).
    async fn high_water_servers(&mut self) -> Result<Vec<String>, TicketError> {
        self.conn
            .query(format!(
                "SELECT DISTINCT server_name FROM {HW_TABLE} WHERE server_name <> ''"
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read high-water marks", e))
    }

    /// The high-water marks this server holds under `holders`.
    async fn read_high_water(
        &mut self,
        holders: &[&str],
    ) -> Result<Vec<(String, u64)>, TicketError> {
        self.conn
            .query(format!(
                "SELECT sequence_name, high_water FROM {HW_TABLE} WHERE server_name IN ({})",
                super::holders_list(holders)
            ))
            .await
            .map_err(|e| TicketError::db(&self.server, "read high-water marks", e))
    }

    /// Creates what `config` needs, idempotently; returns what it did.
    async fn init(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<Vec<String>, TicketError> {
        let mut done = Vec::new();
        let name = self.server.clone();
        let run = |what: String| {
            let name = name.clone();
            move |e| TicketError::db(&name, &format!("init: {what}"), e)
        };
        // The version before the records, as a session reads them.
        let version = self.lattice_version().await?;
        let recorded = self.read_lattice().await?;
        super::check_recorded_lattice(config, server, &recorded, version.as_ref())?;
        self.conn
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {LATTICE_TABLE} (sequence_name varchar(64) NOT NULL PRIMARY KEY, server_name varchar(64) NOT NULL, increment bigint unsigned NOT NULL, server_offset bigint unsigned NOT NULL, mode varchar(16) NOT NULL, bits int unsigned NOT NULL, chunk bigint unsigned NOT NULL) ENGINE=InnoDB"
            ))
            .await
            .map_err(|e| TicketError::db(&name, &format!("init: CREATE TABLE {LATTICE_TABLE}"), e))?;
        self.conn
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (one tinyint NOT NULL DEFAULT 1 PRIMARY KEY CHECK (one = 1), version bigint NOT NULL, reshaping boolean NOT NULL) ENGINE=InnoDB"
            ))
            .await
            .map_err(run(format!("CREATE TABLE {VERSION_TABLE}")))?;
        self.conn
            .query_drop(format!(
                "INSERT IGNORE INTO {VERSION_TABLE} (one, version, reshaping) VALUES (1, 1, FALSE)"
            ))
            .await
            .map_err(run(format!("INSERT INTO {VERSION_TABLE}")))?;
        self.conn
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {HW_TABLE} (server_name varchar(64) NOT NULL, sequence_name varchar(64) NOT NULL, high_water bigint unsigned NOT NULL, updated_at timestamp(3) NOT NULL DEFAULT current_timestamp(3) ON UPDATE current_timestamp(3), PRIMARY KEY (server_name, sequence_name)) ENGINE=InnoDB"
            ))
            .await
            .map_err(run(format!("CREATE TABLE {HW_TABLE}")))?;
        self.conn
            .query_drop(format!(
                "INSERT IGNORE INTO {HW_TABLE} (server_name, sequence_name, high_water) VALUES {HW_INIT_ROW}"
            ))
            .await
            .map_err(run(format!("INSERT the init row INTO {HW_TABLE}")))?;
        self.conn
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {HOLDERS_TABLE} (class_key varchar(64) NOT NULL PRIMARY KEY, identity varchar(1024) NOT NULL, generation bigint unsigned NOT NULL, server_name varchar(64) NOT NULL, superseded text NOT NULL, updated_at timestamp(3) NOT NULL DEFAULT current_timestamp(3) ON UPDATE current_timestamp(3)) ENGINE=InnoDB"
            ))
            .await
            .map_err(run(format!("CREATE TABLE {HOLDERS_TABLE}")))?;
        self.conn
            .query_drop(format!(
                "INSERT IGNORE INTO {HOLDERS_TABLE} (class_key, identity, generation, server_name, superseded) VALUES {}",
                super::HOLDERS_INIT_ROW
            ))
            .await
            .map_err(run(format!("INSERT the init row INTO {HOLDERS_TABLE}")))?;
        self.conn
            .query_drop(format!(
                "CREATE TABLE IF NOT EXISTS {SEGMENT_TABLE} (sequence_name varchar(64) NOT NULL PRIMARY KEY, max_id bigint NOT NULL, {VOUCHED} varchar(64) NULL) ENGINE=InnoDB"
            ))
            .await
            .map_err(run(format!("CREATE TABLE {SEGMENT_TABLE}")))?;
        self.add_vouched(SEGMENT_TABLE).await?;
        let token = self.guard_token(SEGMENT_TABLE).await?;
        done.extend(
            self.install_guard(SEGMENT_TABLE, guard_triggers(SEGMENT_TABLE, &token))
                .await?,
        );
        for seq in &config.sequences {
            let lattice = Lattice::new(config, server);
            let table_exists: Option<u64> = self
                .conn
                .query_first(format!(
                    "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{}'",
                    seq.table()
                ))
                .await
                .map_err(run("look up the ticket table".into()))?;
            let row: Option<i64> = self
                .conn
                .query_first(format!(
                    "SELECT max_id FROM {SEGMENT_TABLE} WHERE sequence_name = '{}'",
                    seq.name
                ))
                .await
                .map_err(run("read the segment row".into()))?;
            match seq.mode {
                Mode::PerId if seq.adopted() => {
                    if row.is_some() {
                        return Err(mode_changed(&name, seq, "segment"));
                    }
                    done.push(self.adopt(config, server, seq).await?);
                }
                Mode::PerId => {
                    if row.is_some() {
                        return Err(mode_changed(&name, seq, "segment"));
                    }
                    let table = seq.table();
                    let column = COUNTER_COLUMN;
                    let form = self.per_id_form(&table).await?;
                    if form.is_none() {
                        self.conn
                            .query_drop(format!(
                                "CREATE TABLE IF NOT EXISTS {table} (stub char(1) NOT NULL PRIMARY KEY, id {column} NOT NULL, {VOUCHED} varchar(64) NULL) ENGINE=InnoDB"
                            ))
                            .await
                            .map_err(run(format!("CREATE TABLE {table}")))?;
                    } else {
                        self.add_vouched(&table).await?;
                    }
                    // The guard first: on a table of the REPLACE form, its
                    // insert trigger refuses every REPLACE from here on.
                    let token = self.guard_token(&table).await?;
                    done.extend(
                        self.install_guard(&table, guard_triggers(&table, &token))
                            .await?,
                    );
                    let converted = match form {
                        Some(PerIdForm::Replace) => Some(self.convert(seq).await?),
                        _ => None,
                    };
                    for suffix in REPLACE_FORM_TRIGGERS {
                        self.conn
                            .query_drop(format!("DROP TRIGGER IF EXISTS {table}{suffix}"))
                            .await
                            .map_err(run(format!("DROP TRIGGER {table}{suffix}")))?;
                    }
                    // The row, where there is none (a new table, or one of
                    // the REPLACE form never used), then raised: never
                    // lowered, whatever clients take meanwhile.
                    let first = first_at_or_above(
                        config.increment,
                        server.offset,
                        seq.start.max(converted.unwrap_or(0)),
                    );
                    self.conn
                        .query_drop(format!(
                            "INSERT INTO {table} (stub, id) SELECT '{STUB}', {first} FROM DUAL WHERE NOT EXISTS (SELECT 1 FROM {table})"
                        ))
                        .await
                        .map_err(run(format!("INSERT the counter row INTO {table}")))?;
                    self.raise(config, server, seq, first - 1).await?;
                    let last = self.counter(config, server, seq).await?.unwrap_or(0);
                    let next = first_at_or_above(config.increment, server.offset, last + 1);
                    done.push(match converted {
                        Some(_) => format!(
                            "{}: table {table} ({column}) converted to the counter row, ids from {next} on (clients of the REPLACE form are refused from now on)",
                            seq.name
                        ),
                        None => format!(
                            "{}: table {table} ({column}), ids from {next} on",
                            seq.name
                        ),
                    });
                }
                Mode::Segment => {
                    if table_exists.is_some() {
                        return Err(mode_changed(&name, seq, "per-id"));
                    }
                    let start_row = lattice.row_above(seq.start - 1);
                    // An existing row only goes up (an upsert's insert of
                    // a lower row is what the guard refuses).
                    let sql = match row {
                        Some(_) => format!(
                            "UPDATE {SEGMENT_TABLE} SET max_id = GREATEST(max_id, {start_row}) WHERE sequence_name = '{}'",
                            seq.name
                        ),
                        None => format!(
                            "INSERT INTO {SEGMENT_TABLE} (sequence_name, max_id) VALUES ('{}', {start_row})",
                            seq.name
                        ),
                    };
                    self.conn
                        .query_drop(sql)
                        .await
                        .map_err(run(format!("INSERT INTO {SEGMENT_TABLE}")))?;
                    done.push(format!("{}: segment row in {SEGMENT_TABLE}", seq.name));
                }
            }
            if !recorded.iter().any(|(q, _)| *q == seq.name) {
                self.write_lattice(&seq.name, &LatticeRecord::of(config, server, seq))
                    .await?;
            }
        }
        Ok(done)
    }

    /// Global and session increment/offset and each sequence's state.
    async fn settings(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<ServerSettings, TicketError> {
        let row: Option<(u64, u64, u64, u64, String)> = self
            .conn
            .query_first("SELECT @@global.auto_increment_increment, @@global.auto_increment_offset, @@session.auto_increment_increment, @@session.auto_increment_offset, CAST(@@global.innodb_flush_log_at_trx_commit AS CHAR)")
            .await
            .map_err(|e| TicketError::db(&self.server, "read settings", e))?;
        let (gi, go, si, so, flush) =
            row.ok_or_else(|| TicketError::db(&self.server, "read settings", "no row"))?;
        let mut warnings = Vec::new();
        if flush == "0" {
            warnings.push(
                "innodb_flush_log_at_trx_commit = 0: a crash can lose the last second of tickets and hand them out again; use 1 (or 2)".to_string(),
            );
        }
        let unguarded = self.unguarded(config).await?;
        let guarded: Vec<String> = guarded_tables(config, Kind::Mariadb)
            .into_iter()
            .filter(|t| !unguarded.contains(t))
            .collect();
        for table in self.older_guards(config, &guarded).await? {
            warnings.push(format!(
                "{table}: its guard is of another shardflake release than this one's (guard version {GUARD_VERSION}); clients of this release use either: run `shardflake tickets init` to put this release's in"
            ));
        }
        let mut sequences = Vec::new();
        for seq in &config.sequences {
            let counter = self.counter(config, server, seq).await?;
            let column: Option<String> = if seq.mode == Mode::PerId {
                self.conn
                    .query_first(format!(
                        "SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{}' AND COLUMN_NAME = 'id'",
                        seq.table()
                    ))
                    .await
                    .map_err(|e| TicketError::db(&self.server, "read column type", e))?
            } else {
                None
            };
            let form = match seq.mode {
                Mode::PerId => self.per_id_form(&seq.table()).await?,
                Mode::Segment => None,
            };
            let mut problem = None;
            if seq.adopted() {
                problem = self.adopted_problem(config, server, seq).await?;
                if problem.is_none() && unguarded.contains(&seq.table()) {
                    problem = Some(format!("{}: {GUARD_MISSING}", seq.table()));
                }
            } else if form == Some(PerIdForm::Replace) {
                problem = Some(format!(
                    "{} is of the REPLACE form of older shardflake releases: run `shardflake tickets init` to convert it to the counter row (clients of older releases are refused from then on)",
                    seq.table()
                ));
            } else if counter.is_none() {
                problem = Some("not initialised (run `shardflake tickets init`)".to_string());
            } else if seq.mode == Mode::Segment {
                if unguarded.iter().any(|t| t == SEGMENT_TABLE) {
                    problem = Some(format!("{SEGMENT_TABLE}: {GUARD_MISSING}"));
                }
            } else if unguarded.contains(&seq.table()) {
                problem = Some(format!("{}: {GUARD_MISSING}", seq.table()));
            } else if let Some(column) = &column
                && !(column.starts_with("bigint") && column.contains("unsigned"))
            {
                problem = Some(format!("column id is {column}, want {COUNTER_COLUMN}"));
            }
            sequences.push(SequenceState {
                name: seq.name.clone(),
                detail: match (&column, seq.mode) {
                    (Some(c), Mode::PerId) => format!("table {} id {c}", seq.table()),
                    (_, Mode::Segment) => format!("segment row in {SEGMENT_TABLE}"),
                    (None, Mode::PerId) => format!("table {} missing", seq.table()),
                },
                counter,
                high_water: None,
                problem,
            });
        }
        Ok(ServerSettings {
            global: Some((gi, go)),
            session: Some((si, so)),
            warnings,
            sequences,
        })
    }
}

/// The guard's triggers on `table` ([`GUARD`]): `(name, CREATE
/// statement)`, a refusal unless the session set `@shardflake_rewind = 1`
/// (any other value, 0 included, leaves the guard on) (`init`'s counter
/// row, or an operator restoring with every client stopped). MariaDB names triggers per database: the segment
/// table's are `GUARD_update`, `GUARD_insert`, `GUARD_delete` (a row set
/// lower, a row inserted lower than the one it replaces, a row deleted to
/// be inserted again lower).
///
/// A per-id table `t` is one counter row: `t_ctr_u` refuses it set lower
/// (or its stub changed), `t_ctr_d` its deletion, `t_ctr_i` any row
/// inserted beside it (so neither a data-only dump loaded into it, as
/// `INSERT` or `REPLACE`, nor a `REPLACE INTO … (stub)` of an older client
/// or of Flickr's clients goes in: the counter row and `AUTO_INCREMENT`
/// would each hand out the same ids). Into the table left empty, which
/// the delete guard leaves only to `TRUNCATE` (a new table id, seen by
/// every client) or a table just made (`init`, a dump), a row goes in. `t_ctr_u` also compares the session's
/// `@shardflake_lattice` with the server's lattice version
/// ([`VERSION_TABLE`]), whatever `@shardflake_rewind` says: a client still
/// on the file of before a reshape is refused at its next ticket (an
/// operator's session, which set none, is not); and it sets
/// [`PROOF`] to the id its update hands out, which the client reads in
/// the same round trip: an answer that does not carry it (the trigger
/// dropped under a running client) is refused. Suffixes of 6 characters:
/// a table's name is at most 56, a trigger's 64.
///
/// The proof is given only for a row the guard vouches for: its
/// [`VOUCHED`] column is `<token>:<id>`, `token` this guard's (new each
/// time `init` makes the guard anew, [`MariaSession::guard_token`]). A
/// client's raise past the marks it read from the store ([`VOUCH`] = 1)
/// vouches for the row; each ticket of a vouched row keeps it vouched;
/// a row inserted (`t_ctr_i`: a dump's row, a `TRUNCATE` and insert), set
/// with `@shardflake_rewind = 1`, changed while the guard was dropped, or
/// vouched under another guard (dropped and made anew by `init`) is not,
/// and every ticket of it is answered without the proof (the guard ran:
/// [`GUARD_RAN`]) until a client raises it past the marks again: each
/// client refuses such an answer (`recreated`) and checks the server
/// against the marks. Cheap: no read beyond the row the `UPDATE` locks.
fn guard_triggers(table: &str, token: &str) -> Vec<(String, String)> {
    let refusal = guard_refusal(table, "SET @shardflake_rewind = 1").replace('\'', "''");
    let rewind = "NOT (@shardflake_rewind <=> 1) AND";
    let moved = format!("{LATTICE_MOVED}: restart the client with the file reshape was given");
    let refuse = |event: &str, name: String, lower: String| {
        let sql = format!(
            "CREATE OR REPLACE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW {}",
            guard_body(&format!(
                "IF {rewind} {lower} THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; END IF;"
            ))
        );
        (name, sql)
    };
    let vouched = |id: &str| format!("CONCAT('{token}:', {id})");
    if table == SEGMENT_TABLE {
        // As a per-id row's (below), per row: a reservation of a row its
        // guard vouches for sets [`BLOCK_PROOF`].
        let update = format!(
            "CREATE OR REPLACE TRIGGER {GUARD}_update BEFORE UPDATE ON {table} FOR EACH ROW {}",
            guard_body(&format!(
                "IF {rewind} NEW.max_id < OLD.max_id THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; END IF; IF {VOUCH} <=> 1 THEN SET NEW.{VOUCHED} = {new}; ELSEIF OLD.{VOUCHED} <=> {old} AND NOT (@shardflake_rewind <=> 1) THEN SET NEW.{VOUCHED} = {new}; SET {BLOCK_PROOF} = NEW.max_id; ELSE SET NEW.{VOUCHED} = NULL; END IF;",
                new = vouched("NEW.max_id"),
                old = vouched("OLD.max_id"),
            ))
        );
        let insert = format!(
            "CREATE OR REPLACE TRIGGER {GUARD}_insert BEFORE INSERT ON {table} FOR EACH ROW {}",
            guard_body(&format!(
                "IF {rewind} NEW.max_id < (SELECT s.max_id FROM {SEGMENT_TABLE} s WHERE s.sequence_name = NEW.sequence_name) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; END IF; SET NEW.{VOUCHED} = NULL;"
            ))
        );
        return vec![
            (format!("{GUARD}_update"), update),
            (format!("{GUARD}_insert"), insert),
            refuse("DELETE", format!("{GUARD}_delete"), "TRUE".into()),
        ];
    }
    let name = format!("{table}_ctr_u");
    let update = format!(
        "CREATE OR REPLACE TRIGGER {name} BEFORE UPDATE ON {table} FOR EACH ROW {}",
        guard_body(&format!(
            "IF {rewind} (NEW.id < OLD.id OR NEW.stub <> OLD.stub) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; END IF; IF @shardflake_lattice IS NOT NULL AND NOT (@shardflake_lattice <=> (SELECT version FROM {VERSION_TABLE})) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{moved}'; END IF; SET {GUARD_RAN} = 1; IF {VOUCH} <=> 1 THEN SET NEW.{VOUCHED} = {new}; ELSEIF OLD.{VOUCHED} <=> {old} AND NOT (@shardflake_rewind <=> 1) THEN SET NEW.{VOUCHED} = {new}; SET {PROOF} = OLD.id; ELSE SET NEW.{VOUCHED} = NULL; END IF;",
            new = vouched("NEW.id"),
            old = vouched("OLD.id"),
        ))
    );
    let insert = format!(
        "CREATE OR REPLACE TRIGGER {table}_ctr_i BEFORE INSERT ON {table} FOR EACH ROW {}",
        guard_body(&format!(
            "IF {rewind} EXISTS (SELECT 1 FROM {table}) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; END IF; SET NEW.{VOUCHED} = NULL;"
        ))
    );
    vec![
        (format!("{table}_ctr_i"), insert),
        (name, update),
        refuse("DELETE", format!("{table}_ctr_d"), "TRUE".into()),
    ]
}

/// The guard of an adopted Flickr table `table`, which its applications'
/// `REPLACE INTO` keeps using: `t_sf_u` refuses its row set lower (or its
/// stub changed) by an `UPDATE` (unless the session set
/// `@shardflake_rewind = 1`, as for every guard), and `t_sf_i`, after each insert (each
/// `REPLACE`), refuses a session pinned to another lattice version and
/// sets [`PROOF`] to the id inserted, which [`adopted_ticket_sql`] reads
/// (`AFTER`: a `BEFORE INSERT` trigger sees 0 for the `AUTO_INCREMENT`
/// id). No delete trigger: it makes InnoDB run each `REPLACE` as a real
/// delete and insert. A row deleted is not refused; InnoDB keeps
/// `AUTO_INCREMENT` where it was (persisted since MariaDB 10.2.4), and
/// only an `ALTER TABLE … AUTO_INCREMENT` after it could set it back.
fn adopted_guard_triggers(table: &str) -> Vec<(String, String)> {
    let refusal = guard_refusal(table, "SET @shardflake_rewind = 1").replace('\'', "''");
    let moved = format!("{LATTICE_MOVED}: restart the client with the file reshape was given");
    let update = format!("{table}_sf_u");
    let insert = format!("{table}_sf_i");
    vec![
        (
            update.clone(),
            format!(
                "CREATE OR REPLACE TRIGGER {update} BEFORE UPDATE ON {table} FOR EACH ROW {}",
                guard_body(&format!(
                    "IF NOT (@shardflake_rewind <=> 1) AND (NEW.id < OLD.id OR NEW.stub <> OLD.stub) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{refusal}'; END IF;"
                ))
            ),
        ),
        (
            insert.clone(),
            format!(
                "CREATE OR REPLACE TRIGGER {insert} AFTER INSERT ON {table} FOR EACH ROW {}",
                guard_body(&format!(
                    "IF @shardflake_lattice IS NOT NULL AND NOT (@shardflake_lattice <=> (SELECT version FROM {VERSION_TABLE})) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{moved}'; END IF; SET {PROOF} = NEW.id;"
                ))
            ),
        ),
    ]
}

/// The guard of `table` under `config`: an adopted table's or ours.
fn guard_of(config: &Config, table: &str) -> Vec<(String, String)> {
    match config
        .sequences
        .iter()
        .any(|q| q.adopted() && q.table() == table)
    {
        true => adopted_guard_triggers(table),
        false => guard_triggers(table, ""),
    }
}

/// The names of the guard's triggers on `tables`, quoted for `IN (…)`.
fn guard_names(tables: &[String]) -> String {
    tables
        .iter()
        .flat_map(|t| guard_triggers(t, ""))
        .map(|(name, _)| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How many of the segment table's guard triggers exist.
fn guard_count_sql() -> String {
    format!(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = '{SEGMENT_TABLE}' AND TRIGGER_NAME IN ({})",
        guard_names(&[SEGMENT_TABLE.to_string()])
    )
}

/// ER_SIGNAL_EXCEPTION: a trigger refused the statement.
const SIGNALLED: u16 = 1644;

/// Whether `e` is the guard refusing a ticket of a session pinned to
/// another lattice version.
fn is_lattice_moved(e: &mysql_async::Error) -> bool {
    matches!(e, mysql_async::Error::Server(s) if s.code == SIGNALLED && s.message.starts_with(LATTICE_MOVED))
}

/// ER_NO_SUCH_TABLE.
const ER_NO_SUCH_TABLE: u16 = 1146;

#[cfg(test)]
mod tests {
    use super::{first_at_or_above, has_returning, last_below};

    /// `check` showed server t1 (offset 1 of 2) at "counter 2004 (the last
    /// id it may have handed out)", an even id it never hands out.
    #[test]
    fn the_last_id_a_counter_may_have_handed_out_is_of_its_class() {
        assert_eq!(last_below(2, 1, 2005), 2003);
        assert_eq!(last_below(2, 2, 2006), 2004);
        assert_eq!(last_below(2, 1, 2006), 2005);
        assert_eq!(last_below(1, 1, 10), 9);
        assert_eq!(last_below(3, 3, 10), 9);
        // Nothing handed out yet.
        assert_eq!(last_below(2, 1, 1), 0);
        assert_eq!(last_below(2, 2, 2), 0);
        assert_eq!(last_below(2, 1, 0), 0);
    }

    #[test]
    fn a_counter_row_lands_on_the_servers_residue_class() {
        assert_eq!(first_at_or_above(2, 1, 1), 1);
        assert_eq!(first_at_or_above(2, 2, 1), 2);
        assert_eq!(first_at_or_above(2, 1, 2), 3);
        assert_eq!(first_at_or_above(2, 2, 4), 4);
        // An offset equal to the increment is residue 0.
        assert_eq!(first_at_or_above(3, 3, 1), 3);
        assert_eq!(first_at_or_above(4, 3, 10), 11);
        assert_eq!(first_at_or_above(2, 1, u64::MAX - 1), u64::MAX);
    }

    #[test]
    fn returning_from_mariadb_10_5_on() {
        assert!(has_returning("10.11.19-MariaDB-0+deb12u1"));
        assert!(has_returning("10.5.0-MariaDB"));
        assert!(has_returning("11.4.2-MariaDB-log"));
        assert!(!has_returning("10.4.34-MariaDB"));
        assert!(!has_returning("8.0.36"));
        assert!(!has_returning(""));
    }
}
