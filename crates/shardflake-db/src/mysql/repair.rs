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

/// After a restore (of the database from a dump, or of the whole server),
/// or a sequence recreated or set back: moves the id sequence past every
/// value it can have handed out and records that as the high-water
/// (re-creating it if the server restore lost it). No draw is handed out
/// more than [`sql::AHEAD_MS`] ahead of the clock, so the server's clock
/// plus that is past every one, whether or not a clock event saw it (the
/// clock not stepping back); the recorded high-water and the newest stored
/// id are taken into account too. Refuses where `apply` has not installed
/// the ids.
pub async fn repair(conn: &mut Conn, layout: &Layout, opts: &Options) -> Result<Repaired, Error> {
    let srv = server(conn).await?;
    let db = srv.named_database("repair")?;
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
        .max(now + plan.packed_ms(sql::AHEAD_MS) + 1);
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
    Ok(Repaired { from, to: past })
}
