//! `mysql repair`: after a restore, put the sequence past what it handed out.

use super::*;

/// What [`repair`] did: the id sequence's reservation before and the value
/// it hands out next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repaired {
    /// The sequence's reservation (`next_not_cached_value`) found.
    pub from: i64,
    /// Its next value now, also the recorded high-water.
    pub to: i64,
}

/// Why the sequence cannot go to `past`, beyond the layout's last value,
/// and the way out: a stored id at that value (`stored`, packed) names its
/// row; otherwise the layout's ids are used up.
pub(super) async fn exhausted_text(
    conn: &mut Conn,
    plan: &Plan,
    names: &Names,
    stored: i64,
    past: i64,
) -> Result<String, Error> {
    let (seq, table, max) = (names.sequence(), &names.table, plan.max_packed());
    let (layout, end) = (plan.layout().name(), plan.limit_text());
    let new_table = "install a layout that ends later for a new table: shardflake mysql apply --layout LAYOUT --table NEW_TABLE";
    if stored < max {
        return Ok(format!(
            "sequence {seq} would have to move to {past}, past the last value {max} of layout {layout}: its ids are used up (they end at {end}, and no id is made more than {} ms ahead of the clock); {new_table}",
            sql::AHEAD_MS
        ));
    }
    let id: Option<Option<i64>> = conn
        .query_first(format!(
            "SELECT MAX(id) FROM `{table}` WHERE id < {}",
            sql::AUTO_INCREMENT_PARKED
        ))
        .await
        .map_err(my("reading the newest id"))?;
    let id = id.flatten().unwrap_or_default();
    Ok(format!(
        "the newest id stored in {table}, {id}, is at the last value {max} of layout {layout} (its last time, {end}): sequence {seq} has no value left above it. If the sequence did not make it (a row inserted with an explicit id, or kept from another layout), delete or renumber that row (DELETE FROM `{table}` WHERE id = {id}), then run shardflake mysql repair again; otherwise the layout's ids are used up: {new_table}"
    ))
}

/// After a restore (of the database from a dump, or of the whole server),
/// or a sequence recreated or set back: moves the id sequence past every
/// value it can have handed out and records that as the high-water
/// (re-creating it if the server restore lost it). No draw is handed out
/// more than [`sql::AHEAD_MS`] ahead of the clock, so the server's clock
/// plus that is past every one, whether or not a clock event saw it (the
/// clock not stepping back); the recorded high-water and the newest stored
/// id are taken into account too. Refuses where `apply` has not installed
/// the ids, and a server whose clock is more than [`crate::CLOCK_BOUND_MS`]
/// from this host's. On a promoted replica (the trigger installed for
/// another `server_id`) it goes that bound and the measured clock
/// difference further, for ids its old primary made after the last change
/// it received, then reinstalls the trigger, the procedures and the clock
/// event there (a replica's is `SLAVESIDE_DISABLED`). Where the server
/// records no shard values for the table (the database alone copied from
/// another server), it refuses unless [`Options::shards`] names them,
/// none that a `--peer` or another database of this server records, then
/// records them and reinstalls the objects for them; a database whose
/// objects were made for another database of this server (a copy loaded
/// from its dump) is refused.
///
/// Where the objects were installed for another server (a promoted
/// replica, a copy of the server, the server moved), it takes over that
/// server's values only on proof that it makes them no more: a `--peer`
/// that is it, holding none of them, or [`Options::old_server_gone`]
/// naming it exactly (`old_server_proven_gone`).
///
/// It runs under the table's deployment lock on this server and every
/// `--peer` (`DeploymentLock`), and every refusal comes before any change.
pub async fn repair(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Repaired, Error> {
    let lock = DeploymentLock::take(conn, &opts.peers, &opts.names, "repair").await?;
    let result = repair_locked(conn, layout, opts).await;
    lock.release(conn).await;
    result
}

async fn repair_locked(
    conn: &mut Conn,
    layout: &Layout,
    opts: &Options,
) -> Result<Repaired, Error> {
    let srv = server(conn).await?;
    let db = srv.named_database("repair")?;
    let names = &opts.names;
    let recorded = recorded_serves(conn, &db, names).await?;
    let plan = plan_in(layout, &db, names)?
        .on_server(srv.server_id)
        .at(srv.port, &srv.datadir)
        .serving(recorded);
    if let Some(installed) = installed_for_another_database(conn, &db, names).await? {
        return Err(other(
            "repair",
            format!(
                "nothing was changed: {}",
                other_database_text(&db, names, &installed)
            ),
        ));
    }
    // The trigger made for another server: a promoted replica, a copy of
    // the server (its data directory or backup), or the server moved.
    let was = installed_for(conn, names)
        .await?
        .filter(|w| !w.is(srv.server_id, srv.port, &srv.datadir));
    // A promoted replica or a copy of the server (its trigger made for
    // another server_id) may take other values than the record it came
    // with, where the server it copies still makes ids.
    let promoted = was.as_ref().is_some_and(|w| w.server_id != srv.server_id);
    let moved = was.is_some();
    if let Some(shards) = opts.shards {
        apply::check_range("repair", layout, &plan, shards)?;
    }
    // This table's objects are this server's (or none): another table's
    // made for another server make this server a copy all the same.
    let copied = match &was {
        None => copied_server(conn, &srv).await?,
        Some(_) => None,
    };
    let either = was.as_ref().or(copied.as_ref().map(|(_, w)| w));
    apply::nothing_to_prove("repair", opts, either, &srv)?;
    if let Some(shards) = opts.shards
        && recorded.is_some_and(|r| r != shards)
        && !promoted
    {
        return Err(other(
            "repair",
            format!(
                "nothing was changed: this server records shard values {}-{} for {db}.{}; to change them, run shardflake mysql apply --shards {}-{} (with --peer URL of each other server)",
                plan.serves().0,
                plan.serves().1,
                names.table,
                shards.0,
                shards.1
            ),
        ));
    }
    // No record of which shard values this server makes ids for: the
    // database alone copied from another server's dump (that server may
    // still make ids for every value), or restored where its server's
    // records were lost. Which values it takes is the operator's word.
    let records = recorded.is_none() || (promoted && opts.shards.is_some());
    if records && opts.shards.is_none() {
        return Err(other(
            "repair",
            no_record_text(&db, names, "repair", plan.shard_max()),
        ));
    }
    // The values it will make ids for, against every peer's, before any
    // change (the reinstall below checks them again, after the move).
    let serves = opts.shards.filter(|_| records).unwrap_or(plan.serves());
    // The reinstall below records them: every other database of this
    // server is a peer too.
    let reinstall = promoted || moved || records;
    if reinstall || !opts.peers.is_empty() {
        let mut overlaps = overlapping_peers(conn, "repair", &opts.peers, names, serves).await?;
        if reinstall && !opts.new_deployment {
            overlaps.extend(
                this_servers_other_databases(
                    conn,
                    &db,
                    names,
                    serves,
                    (0, plan.shard_max()),
                    false,
                )
                .await?,
            );
        }
        if !overlaps.is_empty() {
            return Err(other(
                "repair",
                format!("nothing was changed: {}", overlaps.join("; ")),
            ));
        }
    }
    // Only where the server the objects were made for makes none of
    // these values any more.
    if let Some(was) = &was {
        old_server_proven_gone("repair", opts, was, None, &srv).await?;
    }
    if let Some((table, was)) = &copied {
        old_server_proven_gone("repair", opts, was, Some(table), &srv).await?;
    }
    // A promoted replica (the trigger made for another server_id) may be
    // behind ids its old primary made after the last change it received:
    // each at most that server's clock plus AHEAD_MS, within
    // CLOCK_BOUND_MS of this host's if mysql check held. So its sequence
    // goes that bound and the measured difference further, and a clock
    // further off than the bound is refused.
    let (offset, uncertainty) = clock_offset(conn).await?;
    if let Some(problem) = crate::clock_problem(offset, uncertainty, "mysql repair") {
        return Err(other("repair", problem));
    }
    let margin_ms = if promoted {
        offset.unsigned_abs() + uncertainty.unsigned_abs() + crate::CLOCK_BOUND_MS
    } else {
        0
    };
    let seq = names.sequence();
    match sequence_kind(conn, &seq).await? {
        Some((kind, _, comment))
            if kind == "SEQUENCE" && layout_of(&comment) == Some(layout.to_string()) => {}
        Some((kind, _, comment)) if kind == "SEQUENCE" && layout_of(&comment).is_some() => {
            // apply refuses another layout on this sequence: name the one
            // that works.
            let made = layout_of(&comment).unwrap_or_default();
            return Err(other(
                "repair",
                format!(
                    "nothing was changed: sequence {seq} in {db} was made for layout {made}, not {layout}: its values mean that layout's times; run shardflake mysql repair --layout '{made}'"
                ),
            ));
        }
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
    create_high_water(conn, &plan, names).await?;
    let o = seq_options(conn, &seq).await?;
    let (from, floor) = reservation_and_floor(conn, &plan, names).await?;
    // The clock event's mark of a sequence it found set back holds no
    // value; it is replaced below (a sequence's SETVAL never moves down).
    let refusing_all = floor == Some(plan.high_water_refusing_all());
    let floor = floor.filter(|_| !refusing_all);
    let stored = max_stored_packed(conn, &plan, names).await?.unwrap_or(0);
    let now = server_packed_clock(conn, &plan).await?;
    // The high-water is the reservation less the cache: values up to a
    // cache above it may be out.
    let past = floor
        .map_or(0, |f| f + o.cache.max(0))
        .max(stored + 1)
        .max(from)
        .max(now + plan.packed_ms(sql::AHEAD_MS + margin_ms) + 1);
    if past > plan.max_packed() {
        return Err(Error::MysqlExhausted {
            context: "repair".into(),
            message: exhausted_text(conn, &plan, names, stored, past).await?,
        });
    }
    conn.query_drop(format!("DO SETVAL(`{seq}`, {past}, 0)"))
        .await
        .map_err(my("moving the sequence past its high-water"))?;
    if let Some(hw) = plan.high_water(names) {
        if refusing_all {
            // Inserts fail while it is missing (the trigger reads it).
            conn.query_drop(format!("DROP SEQUENCE {hw}"))
                .await
                .map_err(my("replacing the high-water"))?;
            create_high_water(conn, &plan, names).await?;
        }
        conn.query_drop(format!("DO SETVAL({hw}, {past}, 0)"))
            .await
            .map_err(my("recording the high-water"))?;
    }
    tracing::info!(sequence = %seq, from, to = past, "mysql repair moved the sequence");
    if reinstall {
        // The trigger and procedure for this server and the shard values
        // now recorded, and the clock event, which a replica has disabled
        // (SLAVESIDE_DISABLED) and ran none.
        let applied = apply::install(conn, layout, opts, apply::Mode::Repair)
            .await
            .map_err(|e| {
                other(
                    "repair",
                    format!(
                        "moved sequence {seq} from {from} to {past} and recorded that as its high-water, then stopped before installing the trigger, the procedures and the clock event for this server (inserts are still refused): {}",
                        e.to_string()
                            .replace("mysql: repair: ", "")
                            .replace("nothing was changed: ", "")
                    ),
                )
            })?;
        for warning in &applied.warnings {
            tracing::warn!("{warning}");
        }
    }
    Ok(Repaired { from, to: past })
}
