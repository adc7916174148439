//! `mysql adopt`: an existing table's `AUTO_INCREMENT` id put under the
//! one-statement ids while the application keeps writing.
//!
//! Everything `apply` installs for a table is installed for it (its
//! sequence, high-water, refusal function, clock event, procedure), the
//! clock event first, seen running before any insert can meet the
//! trigger. Then the table is switched under `LOCK TABLES ... WRITE`
//! ([`switch`]): inserts wait for the few statements that follow, no row
//! can be added between the read of `max(id)` and the trigger, and the
//! switch is refused unless `max(id)` is below the smallest id the trigger
//! can make from now on (its sequence was set to the clock just before the
//! lock, and never moves down). So every new id sorts after every old one. Old rows
//! keep their ids. The column stays `AUTO_INCREMENT`, only so that the OK
//! packet (`LAST_INSERT_ID()`) carries the trigger's id as before; its
//! counter is parked and the guard column added, as `apply` does. The
//! switch is recorded in `shardflake.adopted` (beside the high-water),
//! which `mysql check` reports, under the same lock and before the
//! trigger: a run killed at any step leaves either no trigger, or the
//! trigger and the record of the floor it was switched above.

use std::fmt;

use super::apply::{self, Mode};
use super::*;

/// How long the switch waits for the table's lock (the application's
/// inserts queue behind a waiting `LOCK TABLES`).
pub const LOCK_WAIT_S: u32 = 5;

const ADOPTED_DDL: &str = "CREATE TABLE IF NOT EXISTS `shardflake`.`adopted` (\
    db VARCHAR(64) NOT NULL, tbl VARCHAR(64) NOT NULL, floor_id BIGINT NULL, first_new BIGINT NOT NULL, \
    adopted_at DATETIME(3) NOT NULL, PRIMARY KEY (db, tbl)) ENGINE=InnoDB";

/// What `mysql adopt` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct AdoptOptions {
    /// The table, its shard-key column, the procedure; the sequence's
    /// cache; the shard values (as for `apply`).
    pub options: Options,
    /// Plan and print the SQL; change nothing.
    pub dry_run: bool,
}

/// Which tables `mysql adopt` takes beside `--table`: each one whose `id`
/// column is `AUTO_INCREMENT` (a base table, not a view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tables {
    /// Every such table of a database (a schema, in MariaDB's words).
    Schema(String),
    /// Every such table whose `database.table` matches a SQL `LIKE`
    /// pattern (the system databases and `shardflake` excluded).
    Pattern(String),
}

impl fmt::Display for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tables::Schema(db) => write!(f, "--schema {db}"),
            Tables::Pattern(p) => write!(f, "--pattern {p}"),
        }
    }
}

/// What happened (or, in a dry run, would happen) to the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// The table's database.
    pub database: String,
    /// The table.
    pub table: String,
    /// Its shard-key column.
    pub key: String,
    /// The largest old id (none in an empty table): ids at or below it
    /// are from before adoption.
    pub floor: Option<i64>,
    /// The smallest id the trigger can make (when switched: read under the
    /// lock; in a dry run: now).
    pub first_new: i64,
    /// Already adopted: nothing was (or would be) changed.
    pub unchanged: bool,
    /// What was installed (empty in a dry run).
    pub installed: Vec<String>,
    /// Settings to know about (as `apply` warns).
    pub warnings: Vec<String>,
    /// The switch's SQL (empty for a table already adopted).
    pub script: String,
}

impl fmt::Display for Adopted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let floor = self
            .floor
            .map_or("no old ids".to_string(), |v| format!("old ids up to {v}"));
        if self.unchanged {
            write!(
                f,
                "{}.id already draws from the trigger ({floor}): unchanged",
                self.table
            )
        } else {
            write!(
                f,
                "{}.id draws from the trigger, shard = {} mod 2^shard_bits ({floor}; new ids from {})",
                self.table, self.key, self.first_new
            )
        }
    }
}

/// The switch as `--dry-run` prints it (what `apply` installs for the
/// table beside it, `mysql sql --table T` prints).
pub fn switch_script(plan: &Plan, names: &Names) -> String {
    let t = &names.table;
    format!(
        "-- after the sequence, high-water, functions and clock event of shardflake mysql sql --table {t} (the event seen running):\n\
         SET SESSION lock_wait_timeout = {LOCK_WAIT_S};\n\
         DO SETVAL(`{seq}`, <the server's packed clock>, 0);  -- every later draw is at or above it\n\
         LOCK TABLES `{t}` WRITE, `{hw}`.`adopted` WRITE;  -- inserts wait until UNLOCK TABLES\n\
         SELECT MAX(id) FROM `{t}` WHERE id < {parked};  -- refused unless below the first id the trigger can make now\n\
         INSERT INTO `{hw}`.`adopted` ...;  -- the table, the largest old id, the first new id\n\
         {};\n\
         {};\n\
         ALTER TABLE `{t}` AUTO_INCREMENT = {};  -- an insert without the trigger fails\n\
         {};\n\
         UNLOCK TABLES;\n",
        sql::add_guard_sql(t),
        sql::trigger_sql(plan, names),
        sql::AUTO_INCREMENT_PARKED,
        sql::guard_default_sql(t),
        hw = sql::HIGH_WATER_DB,
        seq = names.sequence(),
        parked = sql::AUTO_INCREMENT_PARKED,
    )
}

/// One adopted table as its server records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptedTable {
    /// The table.
    pub table: String,
    /// Ids at or below it are from before adoption (none: the table was
    /// empty, or the record was written after an interrupted run).
    pub floor: Option<i64>,
    /// The smallest id the trigger could make when it was switched.
    pub first_new: i64,
}

impl AdoptedTable {
    /// Whether `id` was made before the table was adopted (at or below its
    /// floor): it has no time, shard or sequence.
    pub fn before_adoption(&self, id: i64) -> bool {
        self.floor.is_some_and(|f| id <= f)
    }
}

/// The tables of the URL's database this server records as adopted.
pub async fn adopted(conn: &mut Conn) -> Result<Vec<AdoptedTable>, Error> {
    let rows: Result<Vec<(String, Option<i64>, i64)>, _> = conn
        .query(
            "SELECT tbl, floor_id, first_new FROM `shardflake`.`adopted` WHERE db = DATABASE() ORDER BY tbl",
        )
        .await;
    match rows {
        Ok(rows) => Ok(rows
            .into_iter()
            .map(|(table, floor, first_new)| AdoptedTable {
                table,
                floor,
                first_new,
            })
            .collect()),
        Err(mysql_async::Error::Server(e)) if e.code == ER_NO_SUCH_TABLE => Ok(Vec::new()),
        Err(e) => Err(my("reading the adopted tables")(e)),
    }
}

/// Adopts the table of `opts`: every refusal is gathered first (nothing
/// changes if there is one), then `apply`'s objects are installed and the
/// table switched under its lock, the floor checked there again. Running
/// it again changes nothing.
pub async fn adopt(
    conn: &mut Conn,
    layout: &Layout,
    opts: &AdoptOptions,
) -> Result<Adopted, Error> {
    let names = &opts.options.names;
    let t = &names.table;
    let srv = server(conn).await?;
    let db = srv.named_database("adopt")?;
    if !srv.has_sequences() {
        return Err(other(
            "adopt",
            format!(
                "{} has no sequences (MariaDB >= 10.3 has): the one-statement ids need them",
                srv.version
            ),
        ));
    }
    let plan = plan_in(layout, &db, names)?
        .on_server(srv.server_id)
        .at(srv.port, &srv.datadir);
    let Some(col) = id_column(conn, t).await? else {
        let why = if table_exists(conn, t).await? {
            format!("table {db}.{t} has no column id")
        } else {
            format!("no table {t} in database {db}: name it with --table")
        };
        return Err(other("adopt", why));
    };
    let mut problems = Vec::new();
    let ty = col.column_type.to_ascii_lowercase();
    if !ty.starts_with("bigint") || ty.contains("unsigned") {
        problems.push(format!(
            "{t}.id is {}, too narrow for the layout's ids (signed 64-bit): first run ALTER TABLE `{t}` MODIFY `id` BIGINT NOT NULL AUTO_INCREMENT (it copies the table; writes wait meanwhile), and change the columns that hold these ids elsewhere too",
            col.column_type
        ));
    }
    if !col.auto_increment() {
        problems.push(format!(
            "{t}.id is not AUTO_INCREMENT: mysql adopt takes over an AUTO_INCREMENT column; a table that gets its ids elsewhere is installed with shardflake mysql apply --table {t}"
        ));
    }
    if !unique_on_id(conn, t).await? {
        problems.push(format!(
            "{t}.id has no primary key or unique index of its own, so nothing refuses an id stored twice: first run ALTER TABLE `{t}` ADD UNIQUE (`id`)"
        ));
    }
    if !has_column(conn, t, &names.key).await? {
        problems.push(format!(
            "{t} has no column {key} to take the shard value from (key mod 2^shard_bits): name the shard-key column with --key",
            key = names.key
        ));
    }
    let floor: Option<i64> = conn
        .query_first(max_old_id_sql(t))
        .await
        .map_err(my("reading the largest id"))?
        .flatten();
    let now = server_packed_clock(conn, &plan).await?;
    let first_new = first_new_id(&plan, now);
    let record = adopted(conn).await?.into_iter().find(|a| &a.table == t);
    let recorded_serves = recorded_serves(conn, &db, names).await?;
    let serves = opts
        .options
        .shards
        .or(recorded_serves)
        .unwrap_or((0, plan.shard_max()));
    // Values a `--peer` records too, as apply refuses them (apply's
    // install checks again under the deployment lock): here, so that a
    // dry run names them too.
    problems.extend(overlapping_peers(conn, "adopt", &opts.options.peers, names, serves).await?);
    let serving = plan.clone().serving(Some(serves));
    let wanted = sql::trigger_sql(&serving, names);
    let trigger_in_place = trigger_problem(conn, names, &wanted).await?.is_none();
    // Switched, and every step after the trigger done too (a run killed
    // after the trigger and before the parked counter or the record of
    // the shard values is finished by the next one).
    let switched = trigger_in_place
        && guard(conn, t).await?.0.as_deref() == Some("0")
        && auto_increment_counter(conn, t).await? == sql::AUTO_INCREMENT_PARKED
        && recorded_serves.is_some()
        && !routine_differs(
            conn,
            &names.procedure,
            "PROCEDURE",
            &sql::procedure_sql(&serving, names),
        )
        .await?;
    if switched && let Some(r) = &record {
        return Ok(Adopted {
            database: db.clone(),
            table: t.clone(),
            key: names.key.clone(),
            floor: r.floor,
            first_new: r.first_new,
            unchanged: true,
            installed: Vec::new(),
            warnings: Vec::new(),
            script: String::new(),
        });
    }
    // With the trigger in place, ids above the clock are its own.
    if !trigger_in_place && let Some(max) = floor.filter(|&m| m >= first_new) {
        problems.push(too_high(&plan, t, max, first_new));
    }
    if !problems.is_empty() {
        return Err(other(
            "adopt",
            format!("nothing was changed: {}", problems.join("; ")),
        ));
    }
    if opts.dry_run {
        // Every check the real run makes (review: a dry run on a copy of
        // the server printed a plan the real run refused).
        let lock = DeploymentLock::take(conn, &opts.options.peers, names, "adopt").await?;
        let checked = apply::preflight(conn, layout, &opts.options, Mode::Adopt).await;
        lock.release(conn).await;
        checked?;
        return Ok(Adopted {
            database: db.clone(),
            table: t.clone(),
            key: names.key.clone(),
            floor,
            first_new,
            unchanged: switched,
            installed: Vec::new(),
            warnings: Vec::new(),
            script: if switched {
                String::new()
            } else {
                switch_script(&serving, names)
            },
        });
    }
    // The switch locks the record's table with the table and writes the
    // record there, before the trigger.
    conn.query_drop(format!(
        "CREATE DATABASE IF NOT EXISTS `{}`",
        sql::HIGH_WATER_DB
    ))
    .await
    .map_err(my("creating database shardflake"))?;
    conn.query_drop(ADOPTED_DDL)
        .await
        .map_err(my("creating shardflake.adopted"))?;
    let applied = apply::install(conn, layout, &opts.options, Mode::Adopt).await?;
    let (floor, first_new) = applied.switched.unwrap_or((floor, first_new));
    Ok(Adopted {
        database: db.clone(),
        table: t.clone(),
        key: names.key.clone(),
        floor,
        first_new,
        // Another run (adopt from two machines at once) switched it
        // between this one's look and its lock.
        unchanged: applied.switched_before,
        installed: applied.installed,
        warnings: applied.warnings,
        script: switch_script(&serving, names),
    })
}

/// The `(database, table)` pairs `which` selects, in order: base tables
/// whose `id` column is `AUTO_INCREMENT`.
pub async fn tables(conn: &mut Conn, which: &Tables) -> Result<Vec<(String, String)>, Error> {
    let (filter, arg) = match which {
        Tables::Schema(db) => ("c.TABLE_SCHEMA = ?", db),
        Tables::Pattern(p) => (
            "CONCAT(c.TABLE_SCHEMA, '.', c.TABLE_NAME) LIKE ? \
             AND c.TABLE_SCHEMA NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys', 'shardflake')",
            p,
        ),
    };
    conn.exec(
        format!(
            "SELECT c.TABLE_SCHEMA, c.TABLE_NAME FROM information_schema.COLUMNS c \
               JOIN information_schema.TABLES t ON t.TABLE_SCHEMA = c.TABLE_SCHEMA AND t.TABLE_NAME = c.TABLE_NAME \
              WHERE t.TABLE_TYPE = 'BASE TABLE' AND c.COLUMN_NAME = 'id' AND c.EXTRA LIKE '%auto_increment%' AND {filter} \
              ORDER BY c.TABLE_SCHEMA, c.TABLE_NAME"
        ),
        (arg,),
    )
    .await
    .map_err(my("listing the AUTO_INCREMENT tables"))
}

/// [`adopt()`] for every table `which` selects, each with `opts`' shard-key
/// column, cache and shard values and its own procedure
/// ([`Names::default_procedure`]); the session moves to each table's
/// database (and back). Every table is planned first: one refusal, and
/// nothing is changed (each refusal named by its table). Then each is
/// adopted in turn; one that fails after others were switched returns
/// [`Error::AdoptStopped`], naming those (they stay switched). Tables
/// already adopted are reported unchanged. A table whose id already comes
/// from a trigger of ours that no adopt recorded (`mysql apply` made it)
/// is left out.
pub async fn adopt_tables(
    conn: &mut Conn,
    layout: &Layout,
    opts: &AdoptOptions,
    which: &Tables,
) -> Result<Vec<Adopted>, Error> {
    let home: Option<String> = conn
        .query_first("SELECT DATABASE()")
        .await
        .map_err(my("reading the session's database"))?
        .flatten();
    let result = adopt_each(conn, layout, opts, which).await;
    if let Some(home) = home {
        use_database(conn, &home).await?;
    }
    result
}

async fn adopt_each(
    conn: &mut Conn,
    layout: &Layout,
    opts: &AdoptOptions,
    which: &Tables,
) -> Result<Vec<Adopted>, Error> {
    let found = tables(conn, which).await?;
    if found.is_empty() {
        return Err(other(
            "adopt",
            format!(
                "nothing was changed: no table selected by {which} has an AUTO_INCREMENT column id"
            ),
        ));
    }
    let mut planned = Vec::new();
    let mut problems = Vec::new();
    for (db, t) in &found {
        use_database(conn, db).await?;
        let mut one = opts.clone();
        one.dry_run = true;
        one.options.names = match Names::new(
            t,
            &opts.options.names.key,
            &Names::default_procedure(t),
        ) {
            Ok(n) => n,
            // Its objects are named after the table (T_id, T_id_seq,
            // T_id_clock, T_id_refused): a shorter procedure name helps
            // only when the table's own name fits.
            Err(e @ MysqlSqlError::Name { what: "table", .. }) => {
                problems.push(format!(
                        "{db}.{t}: {e}: the trigger, sequence, event and function adopt makes for a table are named after it; rename the table (RENAME TABLE `{db}`.`{t}` TO `{db}`.`SHORTER_NAME`, and the application's statements with it) and adopt it under that name, or leave it out of the selection (--pattern)"
                    ));
                continue;
            }
            Err(
                e @ MysqlSqlError::Name {
                    what: "procedure", ..
                },
            ) => {
                problems.push(format!(
                        "{db}.{t}: {e}: adopt it alone with a shorter procedure name: shardflake mysql adopt --table {t} --procedure gen_{short}_id",
                        short = t.chars().take(40).collect::<String>()
                    ));
                continue;
            }
            Err(e) => {
                problems.push(format!("{db}.{t}: {e}"));
                continue;
            }
        };
        match adopt(conn, layout, &one).await {
            Ok(p) => {
                let recorded = adopted(conn).await?.iter().any(|a| &a.table == t);
                if !p.unchanged || recorded {
                    planned.push((one, p));
                }
            }
            Err(Error::MysqlRefused { message, .. }) => problems.push(format!(
                "{db}.{t}: {}",
                message
                    .strip_prefix("nothing was changed: ")
                    .unwrap_or(&message)
            )),
            Err(e) => return Err(e),
        }
    }
    if !problems.is_empty() {
        return Err(other(
            "adopt",
            format!("nothing was changed:\n  {}", problems.join("\n  ")),
        ));
    }
    let mut out: Vec<Adopted> = Vec::new();
    let mut rest = planned.into_iter();
    while let Some((mut one, p)) = rest.next() {
        if opts.dry_run || p.unchanged {
            out.push(p);
            continue;
        }
        one.dry_run = false;
        use_database(conn, &p.database).await?;
        match adopt(conn, layout, &one).await {
            Ok(a) => out.push(a),
            // Tables switched before this one stay switched: say which.
            Err(e) if out.iter().any(|a| !a.unchanged) => {
                return Err(Error::AdoptStopped {
                    command: "mysql adopt",
                    switched: out
                        .iter()
                        .filter(|a| !a.unchanged)
                        .map(|a| format!("{}: {a}", a.database))
                        .collect(),
                    stopped_at: format!("{}.{}", p.database, p.table),
                    problem: e.to_string(),
                    not_reached: rest
                        .filter(|(_, p)| !p.unchanged)
                        .map(|(_, p)| format!("{}.{}", p.database, p.table))
                        .collect(),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// One table of [`check_tables`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCheck {
    /// The table's database.
    pub database: String,
    /// The table.
    pub table: String,
    /// Its record, if adopted.
    pub adopted: Option<AdoptedTable>,
    /// What [`check()`](super::check()) finds (or that it is not adopted); empty: all is well.
    pub problems: Vec<String>,
}

/// [`check()`](super::check()) of every table `which` selects, as [`adopt_tables`] names
/// them. A table still taking its ids from `AUTO_INCREMENT` (no trigger of
/// ours) is reported as not adopted, with the command that adopts it.
pub async fn check_tables(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
    which: &Tables,
) -> Result<Vec<TableCheck>, Error> {
    let home: Option<String> = conn
        .query_first("SELECT DATABASE()")
        .await
        .map_err(my("reading the session's database"))?
        .flatten();
    let mut out = Vec::new();
    let mut result = Ok(());
    for (db, t) in tables(conn, which).await? {
        if let Err(e) = check_one(conn, layout, opts, which, &db, &t, &mut out).await {
            result = Err(e);
            break;
        }
    }
    if let Some(home) = home {
        use_database(conn, &home).await?;
    }
    result.map(|()| out)
}

async fn check_one(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
    which: &Tables,
    db: &str,
    t: &str,
    out: &mut Vec<TableCheck>,
) -> Result<(), Error> {
    use_database(conn, db).await?;
    let names = Names::new(t, &opts.names.key, &Names::default_procedure(t))
        .map_err(|e| other("check", format!("{db}.{t}: {e}")))?;
    let record = adopted(conn).await?.into_iter().find(|a| a.table == t);
    let has_trigger: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?",
            (names.trigger(),),
        )
        .await
        .map_err(my("looking up the trigger"))?;
    let problems = if record.is_none() && has_trigger == Some(0) {
        vec![format!(
            "{db}.{t}.id is not adopted (it takes its ids from AUTO_INCREMENT): run shardflake mysql adopt {which}"
        )]
    } else {
        let one = Options {
            names,
            ..opts.clone()
        };
        super::check(conn, layout, &one).await?
    };
    out.push(TableCheck {
        database: db.to_string(),
        table: t.to_string(),
        adopted: record,
        problems,
    });
    Ok(())
}

async fn use_database(conn: &mut Conn, db: &str) -> Result<(), Error> {
    conn.query_drop(format!("USE `{}`", db.replace('`', "``")))
        .await
        .map_err(my("switching to the table's database"))
}

/// The smallest id the trigger can make once its sequence is set to a
/// server clock of `now` (packed): `SETVAL` never moves a sequence down, so
/// every later draw is at or above `now`, and the id grows with the draw;
/// shard value 0.
fn first_new_id(plan: &Plan, now: i64) -> i64 {
    plan.id_of(now.max(0), 0)
}

/// The largest old id of `t`, leaving out the parked counter's value
/// ([`sql::AUTO_INCREMENT_PARKED`]), as `check` and `repair` do: an
/// insert made while the trigger and the guard's `CHECK` were dropped by
/// hand takes it once, and ours makes that id only at the layout's very
/// last tick, for the last shard value; counting it would refuse adopt,
/// the way back `check` names, for good.
fn max_old_id_sql(t: &str) -> String {
    format!(
        "SELECT MAX(id) FROM `{t}` WHERE id < {}",
        sql::AUTO_INCREMENT_PARKED
    )
}

fn too_high(plan: &Plan, t: &str, max: i64, first_new: i64) -> String {
    format!(
        "{t} holds ids up to {max}, at or above {first_new}, the first id layout {} can make now: new ids would not sort after the old ones and could meet them; adopt with a layout whose ids are larger now (--layout, a later epoch makes them smaller), or move the table's ids below it",
        plan.layout().name()
    )
}

/// Switches the table under `LOCK TABLES ... WRITE` of the table and of
/// `shardflake.adopted` (its clock event already running): the largest id
/// read and checked below the first id the trigger can make, the record,
/// then the guard column, the trigger, the parked counter, the guard's
/// default. Returns the largest old id and the first new one, as
/// recorded.
pub(super) async fn switch(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    applied: &mut apply::Applied,
) -> Result<(Option<i64>, i64), Error> {
    let t = &names.table;
    conn.query_drop(format!("SET SESSION lock_wait_timeout = {LOCK_WAIT_S}"))
        .await
        .map_err(my("setting lock_wait_timeout"))?;
    // Every draw from here on is at or above the clock now.
    let now = server_packed_clock(conn, plan).await?;
    conn.query_drop(format!("DO SETVAL(`{}`, {now}, 0)", names.sequence()))
        .await
        .map_err(my("setting the sequence to the clock"))?;
    let first_new = first_new_id(plan, now);
    conn.query_drop(format!(
        "LOCK TABLES `{t}` WRITE, `{}`.`adopted` WRITE",
        sql::HIGH_WATER_DB
    ))
        .await
        .map_err(|e| {
            other(
                "adopt",
                format!(
                    "table {t} was not changed: its lock was not granted within {LOCK_WAIT_S} s ({e}); a long transaction holds it: run adopt again once it ends"
                ),
            )
        })?;
    let result = switch_locked(conn, plan, names, first_new, applied).await;
    let unlocked = conn
        .query_drop("UNLOCK TABLES")
        .await
        .map_err(my("unlocking the table"));
    let switched = result?;
    unlocked?;
    tracing::debug!(table = %t, floor = ?switched.0, first_new = switched.1, "switched");
    Ok(switched)
}

async fn switch_locked(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    first_new: i64,
    applied: &mut apply::Applied,
) -> Result<(Option<i64>, i64), Error> {
    let t = &names.table;
    let max: Option<i64> = conn
        .query_first(max_old_id_sql(t))
        .await
        .map_err(my("reading the largest id under the lock"))?
        .flatten();
    let recorded: Option<(Option<i64>, i64)> = conn
        .exec_first(
            "SELECT floor_id, first_new FROM `shardflake`.`adopted` WHERE db = DATABASE() AND tbl = ?",
            (t,),
        )
        .await
        .map_err(my("reading the table's record"))?;
    // The trigger already in place (a run stopped before the guard's
    // default or the parked counter): every id since came from the
    // sequence, so the recorded floor stands; without a record (a version
    // that recorded after the switch), the floor is not known.
    let trigger_in_place = !trigger_differs(conn, names, &sql::trigger_sql(plan, names)).await?;
    let (floor, first_new) = match (trigger_in_place, recorded) {
        (true, Some(r)) => r,
        (true, None) => (None, first_new),
        (false, _) => {
            if let Some(max) = max.filter(|&m| m >= first_new) {
                return Err(other(
                    "adopt",
                    format!("nothing was changed: {}", too_high(plan, t, max, first_new)),
                ));
            }
            (max, first_new)
        }
    };
    let changes_before = applied.installed.len();
    if !(trigger_in_place && recorded.is_some()) {
        conn.exec_drop(
            "INSERT INTO `shardflake`.`adopted` VALUES (DATABASE(), ?, ?, ?, UTC_TIMESTAMP(3)) \
             ON DUPLICATE KEY UPDATE floor_id = VALUES(floor_id), first_new = VALUES(first_new), adopted_at = VALUES(adopted_at)",
            (t, floor, first_new),
        )
        .await
        .map_err(my("recording the adopted table"))?;
    }
    apply::install_guard_and_trigger(conn, plan, names, applied).await?;
    if auto_increment_counter(conn, t).await? < sql::AUTO_INCREMENT_PARKED {
        conn.query_drop(format!(
            "ALTER TABLE `{t}` AUTO_INCREMENT = {}",
            sql::AUTO_INCREMENT_PARKED
        ))
        .await
        .map_err(my("parking the AUTO_INCREMENT counter"))?;
        applied.installed.push(format!(
            "AUTO_INCREMENT of {t} parked at {}",
            sql::AUTO_INCREMENT_PARKED
        ));
    }
    applied.switched_before =
        trigger_in_place && recorded.is_some() && applied.installed.len() == changes_before;
    Ok((floor, first_new))
}

/// Whether a primary key or unique index has `id` as its only column.
async fn unique_on_id(conn: &mut Conn, table: &str) -> Result<bool, Error> {
    let n: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS \
              WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND NON_UNIQUE = 0 \
              GROUP BY INDEX_NAME HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = 'id') u",
            (table,),
        )
        .await
        .map_err(my("looking up the id column's keys"))?;
    Ok(n.unwrap_or(0) > 0)
}

async fn has_column(conn: &mut Conn, table: &str, column: &str) -> Result<bool, Error> {
    let n: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
            (table, column),
        )
        .await
        .map_err(my("looking up the shard-key column"))?;
    Ok(n.unwrap_or(0) > 0)
}
