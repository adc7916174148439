//! `pg check`: every difference between the servers and the file, and
//! every setting that breaks the no-repeat argument.

use std::collections::BTreeSet;

use super::catalog::{self, State};
use super::*;

/// Compares what is deployed on every server with the topology and the
/// settings the no-repeat argument needs (too many sessions;
/// `synchronous_commit = off`, while `fsync = off` is logged as a warning:
/// `durability` in `pg/mod.rs`): first the records against the file ([`catalog::conflicts`]: also a shard fenced
/// everywhere, a move that did not finish, shard schemas of any prefix),
/// then each live shard's functions, sequence and tables. An unreachable
/// server is a drift item, not an error, so one dead server does not hide
/// the state of the others. Shares the deployment lock on the others
/// first: a move, apply or repair under way is waited for.
pub async fn check(topo: &Topology) -> Result<Vec<Drift>, Error> {
    let mut drift = Vec::new();
    let mut clients = Vec::new();
    for server in topo.servers() {
        match connect(server).await {
            Ok(c) => clients.push((server, c)),
            Err(e) => drift.push(Drift {
                server: server.name.clone(),
                shard: None,
                problem: format!("unreachable: {e}"),
            }),
        }
    }
    // Shared: checks run side by side, and wait for a command that
    // changes the deployment (a move under way) to end.
    let (servers, conns): (Vec<_>, Vec<_>) = clients.into_iter().unzip();
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    lock_deployment(&conns, &names, Lock::Shared).await?;
    let clients: Vec<_> = servers.into_iter().zip(conns).collect();
    let mut views = Vec::new();
    for (server, c) in &clients {
        views.push(catalog::read(c, &server.name, topo).await?);
    }
    drift.extend(catalog::conflicts(topo, &views, &[]));
    drift.extend(fenced_beside_live(topo, &views));
    let replacing = catalog::replaced_copies(&views, &[]);
    // Servers whose url reaches another copy than the recorded one: their
    // way out is `repair --replaces`, not `repair --shard`.
    let to_replace: BTreeSet<String> = replacing.iter().map(|d| d.server.clone()).collect();
    drift.extend(replacing);
    // A file older than the servers' generation is refused: where it puts
    // shards is no guide to what is missing (its `pg apply` is refused too).
    let older_file = catalog::older_file(topo, &views).is_some();
    let (mut current, mut recorded) = (Vec::new(), Vec::new());
    for (server, c) in &clients {
        let in_recovery: bool = c
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(ctx(&server.name, "asking whether it is in recovery"))?
            .get(0);
        // A server in recovery has no timeline of its own yet (reported below).
        current.push(if in_recovery {
            i64::MAX
        } else {
            catalog::current_timeline(c, &server.name).await?
        });
        recorded.push(catalog::recorded_timelines(c, &server.name).await?);
    }
    drift.extend(catalog::older_timelines(&views, &current, &recorded));
    // In a deployment that exists, a server without records is a conflict.
    let recorded = catalog::deployment_id(&views).is_some();
    for ((server, client), view) in clients.iter().zip(&views) {
        let name = server.name.as_str();
        let d = |shard: Option<u64>, problem: String| Drift {
            server: name.to_string(),
            shard,
            problem,
        };
        // A copy a replacement fenced for good: reported above, and
        // nothing here is to be repaired or applied.
        if view.replaced_by.is_some() {
            continue;
        }
        if let Some(problem) = too_many_sessions(topo, name, client).await? {
            drift.push(d(None, problem));
        }
        let settings = durability(client, name).await?;
        if let Some(problem) = settings.commits_lost_by_a_crash {
            drift.push(d(None, problem));
        }
        if let Some(warning) = settings.fsync_off {
            tracing::warn!(server = name, "{warning}");
        }
        if view.deployment.is_none() && !recorded {
            // Another database of its cluster recording this server's
            // deployment says more than the record missing here.
            let siblings = catalog::siblings(client, name, &server.url).await?;
            let edited =
                catalog::edited_urls(std::slice::from_ref(view), std::slice::from_ref(&siblings));
            if edited.is_empty() {
                drift.push(d(
                    None,
                    "holds no deployment record (schema shardflake): if this is a new deployment, run pg apply; if the server's url was changed, put back the url of the database that holds the records (pg apply would make a second deployment here, whose ids repeat the first one's)".into(),
                ));
            }
            drift.extend(edited);
        }
        let (offset, uncertainty) = clock_offset(client, name).await?;
        if let Some(problem) = clock_problem(offset, uncertainty) {
            drift.push(d(None, problem));
        }
        let in_recovery: bool = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .map_err(ctx(name, "asking whether it is in recovery"))?
            .get(0);
        if in_recovery {
            // No WAL position to read, and no id can be written there yet.
            drift.push(d(
                None,
                "is in recovery (a standby, or a restore still replaying its WAL): no id can be written there; run pg check again once it is promoted or the restore is done".into(),
            ));
        } else if let Some((recorded, current)) = catalog::timeline_changed(client, name).await? {
            drift.push(d(
                None,
                format!(
                    "is on WAL timeline {current}, not {recorded} as at the last apply or repair: it was restored from a physical backup (base backup, PITR) or a standby was promoted, so its sequences may be behind ids already handed out; run shardflake pg repair before writing"
                ),
            ));
        }
        // Schemas named like shards that are no shard of this server.
        let pattern = format!("^{}[0-9]+$", topo.schema_prefix());
        for r in client
            .query(
                "SELECT nspname FROM pg_namespace WHERE nspname ~ $1 ORDER BY 1",
                &[&pattern],
            )
            .await
            .map_err(ctx(name, "listing schemas"))?
        {
            let schema: String = r.get(0);
            let Ok(shard) = schema[topo.schema_prefix().len()..].parse::<u64>() else {
                continue;
            };
            if view.state(shard).is_none() {
                let owner = topo
                    .server_of(shard)
                    .map(|s| format!("topology puts it on {:?}", s.name))
                    .unwrap_or_else(|_| "not in the topology".to_string());
                drift.push(d(
                    Some(shard),
                    format!("unexpected schema {schema} ({owner})"),
                ));
            }
        }
        drift.extend(super::adopt::drift(client, topo, server).await?);
        let left = left_behind(client, name).await?;
        for (shard, tbl, column, rows, (min, max), replaced) in &left {
            let forget = format!(
                "then `DELETE FROM shardflake.left_behind WHERE shard = {shard} AND tbl = '{tbl}'` here (also the way to leave them there for good)"
            );
            let copy = |to: &str| {
                format!(
                    "copy them over (in psql on the old copy `\\copy (SELECT * FROM {tbl} WHERE {column} BETWEEN {min} AND {max}) TO 'rows.csv' CSV`, then on {to} `\\copy {tbl} FROM 'rows.csv' CSV`), {forget}"
                )
            };
            let fenced_by =
                format!("the old copy that `shardflake pg repair --replaces {replaced}` fenced");
            // A record left where the shard no longer is (a move before
            // moves carried them): the rows belong where it is now.
            if !server.shards.contains(shard) && view.state(*shard).is_none() {
                let at = topo.server_of(*shard).map_or_else(
                    |_| "the server that holds it".to_string(),
                    |s| s.name.clone(),
                );
                drift.push(d(
                    Some(*shard),
                    format!(
                        "{rows} row(s) of {tbl} (ids {min}..{max}) were recorded here as only on {fenced_by}, but shard {shard} is on {at} now: {}",
                        copy(&at)
                    ),
                ));
                continue;
            }
            if !relation_exists(client, name, tbl).await? {
                drift.push(d(
                    Some(*shard),
                    format!(
                        "{tbl} is missing here, and its {rows} row(s) (ids {min}..{max}) are only on {fenced_by} (the shard moved onto it after the dump): run `shardflake pg apply` to create the shard here (empty), then {}",
                        copy(name)
                    ),
                ));
                continue;
            }
            let here: i64 = client
                .query_one(
                    &format!("SELECT count(*) FROM {tbl} WHERE {column} BETWEEN $1 AND $2"),
                    &[min, max],
                )
                .await
                .map_err(ctx(name, &format!("reading {tbl}")))?
                .get(0);
            if here < *rows {
                drift.push(d(
                    Some(*shard),
                    format!(
                        "{} of the {rows} row(s) of {tbl} with ids {min}..{max} are only on {fenced_by} (inserts acknowledged there after the dump): {}",
                        rows - here,
                        copy(name)
                    ),
                ));
            }
        }
        for &shard in &server.shards {
            let schema = topo.schema(shard);
            if left.iter().any(|l| l.0 == shard)
                && !relation_exists(client, name, &sql::shard_sequence(&schema)).await?
            {
                // Said above: its rows are on the fenced old copy.
                continue;
            }
            match view.state(shard) {
                Some(State::Live)
                    if !relation_exists(client, name, &sql::shard_sequence(&schema)).await? =>
                {
                    drift.push(d(
                        Some(shard),
                        format!("schema {schema} is missing (run pg apply: it recreates the shard empty, its ids past every earlier one)"),
                    ));
                    continue;
                }
                Some(State::Live) => {}
                // Reported by the conflicts above.
                Some(_) => continue,
                None if older_file || views.iter().any(|v| v.state(shard).is_some()) => continue,
                None => {
                    drift.push(d(
                        Some(shard),
                        format!("schema {schema} is missing (run pg apply)"),
                    ));
                    continue;
                }
            }
            let want = sql::shard_meta(topo.layout(), shard, topo.sign_bit());
            match shard_meta(client, name, &schema).await? {
                None => drift.push(d(Some(shard), format!("{schema}.next_id() is missing"))),
                Some(have) if have != want => drift.push(d(
                    Some(shard),
                    format!("{schema}.next_id() was built for {have:?}, topology wants {want:?}"),
                )),
                Some(_) => {}
            }
            let seq = sql::shard_sequence(&schema);
            if let Some(problem) = restored(client, topo, name, shard).await?.map(|p| {
                if to_replace.contains(name) {
                    p.replace(
                        &format!("`shardflake pg repair --shard {shard}`"),
                        &format!("`shardflake pg repair --replaces {name} --old-url OLD` (above)"),
                    )
                } else {
                    p
                }
            }) {
                drift.push(d(Some(shard), problem));
            } else if let Some(problem) = restarted(client, topo, name, shard).await? {
                drift.push(d(Some(shard), problem));
            } else if let Ok(oid) = sequence_oid(client, name, &seq).await {
                let run = server_run(client, name).await?;
                let expected = sql::next_id_function(
                    topo.layout(),
                    &schema,
                    shard,
                    topo.sign_bit(),
                    sql::SeqOid::Vouched { oid, run },
                );
                let body: Option<String> = client
                    .query_opt(
                        "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                         WHERE n.nspname = $1 AND p.proname = 'next_id' AND p.pronargs = 1",
                        &[&schema],
                    )
                    .await
                    .map_err(ctx(name, "reading next_id"))?
                    .map(|r| r.get(0));
                if let Some(body) = body
                    && !expected.contains(body.trim())
                {
                    drift.push(d(
                        Some(shard),
                        format!("{schema}.next_id(regclass) was edited by hand (body differs from the generated one; run pg apply)"),
                    ));
                }
            }
            let max = sql::sequence_max(topo.layout(), topo.sign_bit());
            for (seq, has) in odd_sequences(client, name, std::slice::from_ref(&seq), max).await? {
                drift.push(d(
                    Some(shard),
                    format!(
                        "sequence {seq} has {has}, next_id() needs {} (run pg apply)",
                        sql::sequence_options(topo.layout(), topo.sign_bit())
                    ),
                ));
            }
            if let Some(problem) = ahead_of_clock(client, topo, name, &seq).await? {
                drift.push(d(Some(shard), problem));
            }
            if sequence_unlogged(client, name, &seq).await? {
                drift.push(d(
                    Some(shard),
                    format!("sequence {seq} is UNLOGGED: a crash resets it and ids repeat (run pg apply, which sets it LOGGED)"),
                ));
            }
            let exists: bool = client
                .query_one("SELECT to_regclass($1) IS NOT NULL", &[&seq])
                .await
                .map_err(ctx(name, "looking up relations"))?
                .get(0);
            if !exists {
                drift.push(d(Some(shard), format!("sequence {seq} is missing")));
            }
            for t in topo.tables() {
                let rel = format!("{schema}.{}", t.name);
                let exists: bool = client
                    .query_one("SELECT to_regclass($1) IS NOT NULL", &[&rel])
                    .await
                    .map_err(ctx(name, "looking up relations"))?
                    .get(0);
                if !exists {
                    drift.push(d(Some(shard), format!("table {rel} is missing")));
                    continue;
                }
                let old = sql::table_sequence(&schema, &t.name);
                if own_sequence_default(client, name, &rel, &old)
                    .await?
                    .is_some()
                {
                    drift.push(d(
                        Some(shard),
                        format!("table {rel} draws ids from {old}, a second id sequence of the shard beside {seq}: their ids collide (run pg apply, which moves the table onto {seq})"),
                    ));
                }
            }
        }
    }
    Ok(drift)
}

/// A fenced copy of a shard beside its live copy, on a server the file
/// does not put the shard on: kept by `move-shard --keep-source`, or
/// brought back by a restore of a dump taken during a move. It makes no
/// id, but `move-shard` of that shard to any other server is refused while
/// it is there ("finish that first"): said here, with the move that drops
/// it. (A fenced copy where the file puts the shard is `conflicts`'.)
fn fenced_beside_live(topo: &Topology, views: &[catalog::ServerView]) -> Vec<Drift> {
    let mut out = Vec::new();
    for v in views.iter().filter(|v| v.replaced_by.is_none()) {
        for (&shard, (state, peer)) in &v.shards {
            let Some(live) = peer.as_deref() else {
                continue;
            };
            let is_live = |name: &str| {
                views
                    .iter()
                    .any(|w| w.name == name && w.state(shard) == Some(State::Live))
            };
            let owner = topo.server_of(shard).ok().map(|s| s.name.as_str());
            if *state != State::Fenced || owner == Some(v.name.as_str()) || !is_live(live) {
                continue;
            }
            out.push(Drift {
                server: v.name.clone(),
                shard: Some(shard),
                problem: format!(
                    "a fenced copy of shard {shard} is here (kept by `move-shard --keep-source`, or brought back by a restore), while the shard is live on {live}: it makes no id, but `shardflake pg move-shard {shard}` to any server but {live} is refused while it is here; `shardflake pg move-shard {shard} --to {live}` finishes that move and drops it"
                ),
            });
        }
    }
    out
}

/// Rows a replacement's repair found only on the old copy it fenced
/// (`shardflake.left_behind`): shard, table, id column, rows, id span,
/// the server replaced.
type LeftBehind = Vec<(u64, String, String, i64, (i64, i64), String)>;

async fn left_behind(client: &impl GenericClient, name: &str) -> Result<LeftBehind, Error> {
    if !relation_exists(client, name, "shardflake.left_behind").await? {
        return Ok(Vec::new());
    }
    Ok(client
        .query(
            "SELECT shard, tbl, id_column, rows, min_id, max_id, coalesce(replaced, $1)
               FROM shardflake.left_behind ORDER BY 1, 2",
            &[&name],
        )
        .await
        .map_err(ctx(name, "reading the rows left on a replaced copy"))?
        .iter()
        .map(|r| {
            (
                r.get::<_, i64>(0) as u64,
                r.get(1),
                r.get(2),
                r.get(3),
                (r.get(4), r.get(5)),
                r.get(6),
            )
        })
        .collect())
}
