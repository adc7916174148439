//! Reading what is installed on the server: the sequence, its high-water,
//! the table, the routines, the trigger, the clock loop; the text of the
//! generated objects compared with it.

use super::*;

pub(super) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "''"))
}

/// The layout text in a [`Plan::marker`] (`shardflake vN: <layout>`).
pub(super) fn layout_of(marker: &str) -> Option<String> {
    let rest = marker.strip_prefix("shardflake v")?;
    let (_, layout) = rest.split_once(": ")?;
    Some(layout.split("; ").next().unwrap_or(layout).to_string())
}

pub(super) fn body_after<'a>(sql: &'a str, marker: &str) -> Option<&'a str> {
    sql.find(marker).map(|i| sql[i + marker.len()..].trim())
}

pub(super) fn comment_of(sql: &str) -> Option<&str> {
    let i = sql.find("\nCOMMENT '")? + "\nCOMMENT '".len();
    let rest = &sql[i..];
    let end = rest.find("'\n")?;
    Some(&rest[..end])
}

/// The server's clock as a packed value; refuses a clock outside the layout.
pub(super) async fn server_packed_clock(conn: &mut Conn, plan: &Plan) -> Result<i64, Error> {
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

pub(super) struct SeqOptions {
    pub(super) next: i64,
    pub(super) min: i64,
    pub(super) max: i64,
    pub(super) increment: i64,
    pub(super) cache: i64,
    pub(super) cycle: bool,
}

pub(super) async fn seq_options(conn: &mut Conn, seq: &str) -> Result<SeqOptions, Error> {
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
pub(super) async fn auto_increment_counter(conn: &mut Conn, table: &str) -> Result<i64, Error> {
    let n: Option<Option<u64>> = conn
        .exec_first(
            "SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            (table,),
        )
        .await
        .map_err(my("reading the AUTO_INCREMENT counter"))?;
    Ok(n.flatten().map_or(0, |n| n.min(i64::MAX as u64) as i64))
}

pub(super) async fn table_exists(conn: &mut Conn, table: &str) -> Result<bool, Error> {
    let n: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
            (table,),
        )
        .await
        .map_err(my("looking up the table"))?;
    Ok(n.unwrap_or(0) > 0)
}

pub(super) struct IdColumn {
    pub(super) column_type: String,
    pub(super) extra: String,
    pub(super) default: Option<String>,
}

impl IdColumn {
    pub(super) fn auto_increment(&self) -> bool {
        self.extra.to_ascii_lowercase().contains("auto_increment")
    }
    pub(super) fn usable(&self, table: &str) -> Result<(), Error> {
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

pub(super) async fn id_column(conn: &mut Conn, table: &str) -> Result<Option<IdColumn>, Error> {
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

/// The id table's guard ([`sql::GUARD_COLUMN`]) as installed: the
/// column's default (`None`: no column) and whether its `CHECK` is there.
pub(super) async fn guard(conn: &mut Conn, table: &str) -> Result<(Option<String>, bool), Error> {
    let default: Option<Option<String>> = conn
        .exec_first(
            "SELECT COLUMN_DEFAULT FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
            (table, sql::GUARD_COLUMN),
        )
        .await
        .map_err(my("looking up the guard column"))?;
    let checked: Option<i64> = conn
        .exec_first(
            "SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = DATABASE() AND TABLE_NAME = ? AND CONSTRAINT_NAME = ?",
            (table, sql::GUARD_CONSTRAINT),
        )
        .await
        .map_err(my("looking up the guard constraint"))?;
    Ok((
        default.map(|d| d.unwrap_or_default()),
        checked.unwrap_or(0) > 0,
    ))
}

/// The body of a `CREATE ... ROUTINE` from `BEGIN` on.
pub(super) fn routine_body(create: &str) -> Option<&str> {
    create.find("\nBEGIN").map(|i| create[i + 1..].trim())
}

/// Whether a routine is missing or differs from `create` (its body or its
/// `sql_mode`).
pub(super) async fn routine_differs(
    conn: &mut Conn,
    name: &str,
    kind: &str,
    create: &str,
) -> Result<bool, Error> {
    Ok(routine_problem(conn, name, kind, create).await?.is_some())
}

pub(super) async fn routine_problem(
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

pub(super) async fn trigger_problem(
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

pub(super) async fn trigger_differs(
    conn: &mut Conn,
    names: &Names,
    create: &str,
) -> Result<bool, Error> {
    Ok(trigger_problem(conn, names, create).await?.is_some())
}

/// The sequence's table type, engine and comment, if it exists.
pub(super) async fn sequence_kind(
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
pub(super) async fn clock_loop(
    conn: &mut Conn,
    names: &Names,
) -> Result<Option<(u64, i64)>, Error> {
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
pub(super) async fn locked_procedure_problem(
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

/// The packed value (`tick << sequence_bits | sequence`) of the newest id
/// stored in the table, for layouts with time on top (`None`: empty table,
/// or time not on top).
pub(super) async fn max_stored_packed(
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
    // Not the parked AUTO_INCREMENT value: a row an insert took while the
    // trigger was missing (before the guard column), not a draw of ours
    // (ours makes it only at the layout's last tick); counted, it would put
    // the sequence past the layout's last value, where repair cannot go.
    let max: Option<Option<i64>> = conn
        .query_first(format!(
            "SELECT MAX(id) FROM `{}` WHERE id < {}",
            names.table,
            sql::AUTO_INCREMENT_PARKED
        ))
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

pub(super) fn same_modes(a: &str, b: &str) -> bool {
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

/// The id sequence's reservation (`next_not_cached_value`) and its recorded
/// high-water (`None`: missing).
pub(super) async fn reservation_and_floor(
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

/// Creates the high-water database and `names`' high-water sequence in it
/// where missing (nothing without [`Plan::in_database`]).
pub(super) async fn create_high_water(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
) -> Result<(), Error> {
    let Some(create) = sql::high_water_sql(plan, names) else {
        return Ok(());
    };
    conn.query_drop(format!(
        "CREATE DATABASE IF NOT EXISTS `{}`",
        sql::HIGH_WATER_DB
    ))
    .await
    .map_err(my("creating the high-water database"))?;
    conn.query_drop(create)
        .await
        .map_err(my("creating the high-water sequence"))
}

/// MariaDB's "Table ... doesn't exist".
pub(super) const ER_NO_SUCH_TABLE: u16 = 1146;

pub(super) fn set_back_text(names: &Names, plan: &Plan, r: i64, floor: i64) -> String {
    if floor == plan.high_water_refusing_all() {
        return format!(
            "sequence {} (at {r}) was found set back below its high-water by the clock event (the database restored from a dump while no clock loop ran), which now refuses every id; run shardflake mysql repair",
            names.sequence()
        );
    }
    format!(
        "sequence {} is at {r}, below its high-water {floor} kept in {}: the database was restored from a dump, or the sequence recreated or set back, and ids above it may have been handed out; run shardflake mysql repair",
        names.sequence(),
        plan.high_water(names).unwrap_or_default().replace('`', "")
    )
}

pub(super) const FLUSH_0: &str = "innodb_flush_log_at_trx_commit = 0: a crash can lose the last second of InnoDB's log, with the sequence's reservations in it, so ids handed out just before a crash can be handed out again; set it to 1 (or 2: safe against a killed server, not against an OS crash)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mysql::sql;

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
        assert_eq!(comment_of(&e), Some("shardflake v2 clock event, loop v5"));
        assert!(same_modes(
            "NO_ENGINE_SUBSTITUTION,STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO",
            sql::SQL_MODE
        ));
        assert!(!same_modes("", sql::SQL_MODE));
    }
}
