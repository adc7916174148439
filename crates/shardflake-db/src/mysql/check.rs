//! `mysql check`: every difference from what `apply` installs, and every
//! setting that breaks the no-repeat argument.

use super::*;

/// Reports every difference between the server and what [`apply`] installs
/// with `opts`, and every setting that breaks the no-repeat argument or the
/// clock: `innodb_flush_log_at_trx_commit = 0`, the event scheduler off,
/// the clock event not running, a sequence that is not InnoDB, cycles,
/// increments by other than 1, ends past the layout, draws a value at or
/// below a stored id, lags the clock by more than [`sql::STALE_MS`] or runs
/// ahead of it by more than twice [`sql::AHEAD_MS`], and with
/// [`Options::peers`] each shard value a peer records too. Draws
/// one value from the sequence. An empty list: all is well.
///
/// For an adopted table the fix of every problem is `mysql adopt` again
/// (it reinstalls what apply would, then switches the table back under
/// the trigger), so that is the one command named.
pub async fn check(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Vec<String>, Error> {
    let mut problems = check_installed(conn, layout, opts).await?;
    let names = &opts.names;
    let srv = server(conn).await?;
    if let Some(was) = installed_for(conn, names)
        .await?
        .filter(|w| !w.is(srv.server_id, srv.port, &srv.datadir))
    {
        // A promoted replica or a copy of the server: plain apply refuses
        // it, and the objects differ only because they name the server
        // they were made for. The way out takes the proof that it makes
        // no more ids, naming every other server (a second copy, or a
        // copy of a copy, not named is not checked).
        let way = if was.server_id != srv.server_id {
            format!(
                "this is a promoted replica or a copy of server {was}: run shardflake mysql repair with the proof that it makes no more ids (--shards LO-HI --peer URL_OF_EACH_OTHER_SERVER while it or another copy runs, --old-server-gone '{was}' once it is stopped for good)"
            )
        } else {
            format!(
                "this is a copy of server {was} (its data directory started here) or that server moved: while it or another copy runs, give this one shard values of its own with shardflake mysql apply --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER; if it is stopped for good or this is it moved: shardflake mysql repair --old-server-gone '{was}'"
            )
        };
        // Objects that differ only in the server they name: the copy is
        // the one problem (review: four "re-run apply" lines where
        // apply is refused).
        problems.retain(|p| !p.contains("differs from this version's"));
        for p in &mut problems {
            *p = p.replace("re-run apply", &way);
        }
        if !problems.iter().any(|p| p.contains("--old-server-gone")) {
            problems.push(way);
        }
    } else if !problems.is_empty()
        && super::adopt::adopted(conn)
            .await?
            .iter()
            .any(|a| a.table == names.table)
    {
        let again = format!(
            "run shardflake mysql adopt --table {} --key {} again",
            names.table, names.key
        );
        for p in &mut problems {
            *p = p.replace("re-run apply", &again);
        }
    }
    Ok(problems)
}

async fn check_installed(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
) -> Result<Vec<String>, Error> {
    let srv = server(conn).await?;
    let names = &opts.names;
    let mut problems = Vec::new();
    let Some(db) = srv.database.clone() else {
        problems.push("the URL names no database".to_string());
        return Ok(problems);
    };
    let recorded = recorded_serves(conn, &db, names).await?;
    let plan = plan_in(layout, &db, names)?
        .on_server(srv.server_id)
        .at(srv.port, &srv.datadir)
        .serving(recorded);
    let plan = if srv.has_sequences() {
        plan
    } else {
        plan.without_clock_loop()
    };
    // A copy of another database of this server: that is the problem to
    // name (its shard values are the original's, not its own).
    if let Some(installed) = installed_for_another_database(conn, &db, names).await? {
        problems.push(other_database_text(&db, names, &installed));
    } else if recorded.is_none() && srv.has_sequences() {
        problems.push(format!(
            "the shard values this server makes ids of {}.{} for are not recorded (in shardflake.serves): run shardflake mysql apply, with --shards LO-HI where other servers make ids for the same table",
            db, names.table
        ));
    }
    let was = installed_for(conn, names)
        .await?
        .filter(|w| !w.is(srv.server_id, srv.port, &srv.datadir));
    let promoted = was.as_ref().filter(|w| w.server_id != srv.server_id);
    if let Some(was) = promoted {
        problems.push(other_server_text(names, was, srv.server_id));
    }
    if let (Some(serves), Some((recorded_at, here))) =
        (recorded, recorded_elsewhere(conn, &db, names).await?)
    {
        problems.push(match promoted {
            Some(was) => promoted_copy_text(&db, names, serves, &recorded_at, &here, was),
            None => copy_text(&db, names, serves, &recorded_at, &here, was.as_ref()),
        });
    }
    // Review E6/E7: a dump from before the values were narrowed restores
    // a trigger that still makes ids for the wider ones, which another
    // server may now make ids for.
    if let (Some((lo, hi)), Some((tlo, thi))) =
        (recorded, trigger_serves(conn, &plan, names).await?)
        && (tlo < lo || thi > hi)
    {
        problems.push(format!(
            "the trigger {trigger} of {db}.{table} makes ids for shard values {tlo}-{thi}, but this server records {lo}-{hi} (shardflake.serves): it was restored from a dump taken before its values were narrowed, and another server may make the same ids for the rest; run shardflake mysql apply to reinstall it for {lo}-{hi}",
            trigger = names.trigger(),
            table = names.table,
        ));
    }
    // Values recorded by this server and a peer too (`--peer`): both make
    // the same ids for them.
    problems.extend(overlapping_peers(conn, "check", &opts.peers, names, plan.serves()).await?);
    // And this server's other databases, always: each is a peer.
    if recorded.is_some() {
        problems.extend(
            this_servers_other_databases(
                conn,
                &db,
                names,
                plan.serves(),
                (0, plan.shard_max()),
                true,
            )
            .await?,
        );
    }
    let (offset, uncertainty) = clock_offset(conn).await?;
    problems.extend(crate::clock_problem(offset, uncertainty, "mysql repair"));
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
            // The largest stored id first, then the draw: every row read
            // was drawn before this draw, so a healthy sequence is above
            // it; the other way round, writers' rows drawn after the
            // draw looked like ids the sequence would repeat.
            let stored = max_stored_packed(conn, &plan, names).await?;
            let drawn: Result<Option<i64>, _> = conn
                .query_first(format!("SELECT NEXT VALUE FOR `{seq}`"))
                .await;
            let drawn = match drawn {
                Ok(drawn) => drawn.unwrap_or(i64::MAX),
                // Past its MAXVALUE: nothing more to draw.
                Err(mysql_async::Error::Server(e)) if e.code == sql::ER_SEQUENCE_RUN_OUT => {
                    i64::MAX
                }
                Err(e) => return Err(Error::mysql("drawing from the sequence")(e)),
            };
            if drawn > plan.max_packed() {
                problems.push(
                    super::repair::exhausted_text(conn, &plan, names, stored.unwrap_or(0), drawn)
                        .await?,
                );
            } else if let Some(stored) = stored
                && drawn <= stored
            {
                problems.push(if stored < plan.max_packed() {
                    format!(
                        "sequence {seq} hands out {drawn}, at or below the packed value {stored} of an id stored in {}: ids would repeat; run shardflake mysql repair, which moves the sequence past them",
                        names.table
                    )
                } else {
                    super::repair::exhausted_text(conn, &plan, names, stored, stored + 1).await?
                });
            }
            if drawn <= plan.max_packed()
                && let Ok(now) = server_packed_clock(conn, &plan).await
            {
                let ms = |packed: i64| packed / plan.per_tick() * plan.layout().tick_ms() as i64;
                if drawn + plan.packed_ms(sql::STALE_MS) < now {
                    problems.push(format!(
                        "sequence {seq} is {} ms behind the server clock: INSERTs fail until the clock event catches it up",
                        ms(now - drawn)
                    ));
                } else if drawn > now + 2 * plan.packed_ms(sql::AHEAD_MS) {
                    problems.push(format!(
                        "sequence {seq} is {} ms ahead of the server clock (did it step back?): INSERTs fail until the clock is within {} ms of it",
                        ms(drawn - now),
                        sql::AHEAD_MS
                    ));
                }
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
    for (name, create) in sql::time_functions_sql(&plan)
        .into_iter()
        .chain([sql::decode_function_sql(&plan)])
    {
        problems.extend(routine_problem(conn, name, "FUNCTION", &create).await?);
    }
    match guard(conn, &names.table).await? {
        (Some(default), true) if default == "0" => {}
        _ => problems.push(format!(
            "table {} lacks the guard column {} (default 0, CHECK = 1) that makes an insert without the trigger fail (one such insert takes the parked id 2^63-1, and every restore of the table can hand it out again); re-run apply",
            names.table,
            sql::GUARD_COLUMN
        )),
    }
    let trigger = trigger_problem(conn, names, &sql::trigger_sql(&plan, names)).await?;
    let parked = auto_increment_counter(conn, &names.table).await? == sql::AUTO_INCREMENT_PARKED;
    if let Some(a) = super::adopt::adopted(conn)
        .await?
        .into_iter()
        .find(|a| a.table == names.table)
        && (trigger.is_some() || !parked)
    {
        problems.push(format!(
            "table {} was adopted (ids below {} are from before adoption), and its trigger or its parked AUTO_INCREMENT counter was changed back by hand: inserts no longer get ids from the sequence; run shardflake mysql adopt --table {} --key {} again (the ids made meanwhile count as old ones)",
            names.table, a.first_new, names.table, names.key
        ));
    }
    problems.extend(trigger);
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
    // The scheduler fires the event within a second of its creation or of
    // a loop's end, and a loop starts [`sql::START_WAIT_MS`] later: give it
    // that before calling it stopped.
    let mut running = clock_loop(conn, names).await?;
    if running.is_none() && super::apply::wait_clock(conn, names, Duration::from_secs(3)).await? {
        running = clock_loop(conn, names).await?;
    }
    match running {
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

/// The shard values the installed trigger makes ids for (its `(key &
/// MAX) BETWEEN LO AND HI`, or every value where it tests none); `None`
/// where no trigger is installed.
async fn trigger_serves(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
) -> Result<Option<(u64, u64)>, Error> {
    let body: Option<String> = conn
        .exec_first(
            "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = ?",
            (names.trigger(),),
        )
        .await
        .map_err(my("reading the trigger"))?;
    let Some(body) = body else {
        return Ok(None);
    };
    let marker = format!(" & {}) BETWEEN ", plan.shard_max());
    let range = body.split_once(&marker).and_then(|(_, rest)| {
        let mut it = rest
            .split(|c: char| !c.is_ascii_digit())
            .filter(|s| !s.is_empty());
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    });
    Ok(Some(range.unwrap_or((0, plan.shard_max()))))
}
