//! `pg repair`: after a restore, move each shard's sequence past what it
//! handed out and rebuild its functions for the restored sequence.

use std::collections::BTreeMap;

use super::catalog::{self, State};
use super::replace::{self, Replacement};
use super::*;

/// What `repair` did to one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repaired {
    /// Server name.
    pub server: String,
    /// Logical shard.
    pub shard: u64,
    /// The sequence's last value before.
    pub from: i64,
    /// Its last value after.
    pub to: i64,
}

impl fmt::Display for Repaired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: shard {}: sequence {} -> {}",
            self.server, self.shard, self.from, self.to
        )
    }
}

/// After a restore, a restart or a failover: moves each live shard's
/// sequence (or only `only`'s) past every value it can have handed out
/// before (the server's clock plus [`sql::AHEAD_MS`], since no value runs
/// further ahead of the clock; on a server whose WAL timeline changed,
/// plus [`CLOCK_BOUND_MS`] and its clock's measured difference from this
/// host's, for the ids of the old primary it never received), and
/// rebuilds its functions for the sequence and the run of the server that
/// are there now (lifting `SF003` and `SF005`). Refuses what `apply`
/// refuses except the restore itself, and a server whose clock is more
/// than [`CLOCK_BOUND_MS`] from this host's. Ids resume dated up to
/// `AHEAD_MS` (and that margin) ahead: new draws wait until the clock is
/// within `AHEAD_MS` of them.
pub async fn repair(topo: &Topology, only: Option<u64>) -> Result<Vec<Repaired>, Error> {
    Ok(repair_replacing(topo, only, &[]).await?.repaired)
}

/// What [`repair_replacing`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replaced {
    /// Each shard repaired.
    pub repaired: Vec<Repaired>,
    /// Rows each fenced old copy holds that the replacement lacks.
    pub left_behind: Vec<replace::LeftBehind>,
    /// Moves to or from a server replaced, never live on their
    /// destination, undone as part of the replacement.
    pub undone: Vec<replace::UndoneMove>,
}

/// [`repair`], with the servers in `replaces` taken as replacing the
/// database the deployment records their shards on (`--replaces`: a dump
/// of it restored into another cluster): the database each such URL
/// reaches now is recorded as theirs on every server of the file, so the
/// old copy, if it comes back, is refused as a replaced one
/// ([`catalog::replaced_copies`]). Without it such a server is refused.
/// An old copy given by URL ([`replace::OldCopy::Url`]) is reached,
/// checked to be the recorded database, and fenced for good under the
/// same deployment lock, committed before anything else: it makes no id
/// from then on, and the replacement's sequences go past its last values;
/// one that does not answer refuses the repair.
/// [`replace::OldCopy::Gone`] reaches nothing: it trusts the operator that
/// each database it names never takes writes again, and must name every
/// one the deployment records the server's shards on. A replacement repairs every
/// shard of its server: `only` with `replaces` is refused.
pub async fn repair_replacing(
    topo: &Topology,
    only: Option<u64>,
    replaces: &[Replacement],
) -> Result<Replaced, Error> {
    for (i, r) in replaces.iter().enumerate() {
        if topo.servers().iter().all(|s| s.name != r.server) {
            return Err(TopologyError::UnknownServer(r.server.clone()).into());
        }
        if replaces[..i].iter().any(|o| o.server == r.server) {
            return Err(refused(
                "repair",
                vec![Drift {
                    server: r.server.clone(),
                    shard: None,
                    problem: format!(
                        "--replaces {} is given twice: name each server once",
                        r.server
                    ),
                }],
            ));
        }
    }
    let names: Vec<String> = replaces.iter().map(|r| r.server.clone()).collect();
    if let Some(shard) = only {
        topo.server_of(shard)?;
        if !names.is_empty() {
            return Err(refused(
                "repair",
                vec![Drift {
                    server: names.join(", "),
                    shard: Some(shard),
                    problem: "--shard with --replaces: a replacement repairs every shard of its server, past the old copy's last values; run it without --shard".to_string(),
                }],
            ));
        }
    }
    let mut clients = connect_all(topo).await?;
    let n = clients.len();
    // The old copies given by URL come after the file's servers: under
    // the same name, each is locked after the replacing one.
    let mut lock_names = server_names(topo);
    let old = replace::connect(replaces).await?;
    replace::distinct(topo, &clients, &old).await?;
    let old_names: Vec<String> = old.iter().map(|(name, _)| name.clone()).collect();
    // Labelled "a (old copy)" in every error; sorted after "a".
    let old_labels: Vec<String> = old_names.iter().map(|n| replace::old_name(n)).collect();
    lock_names.extend(old_labels.iter().map(String::as_str));
    clients.extend(old.into_iter().map(|(_, c)| c));
    let mut txs = Vec::new();
    for (c, name) in clients.iter_mut().zip(&lock_names) {
        txs.push(c.transaction().await.map_err(ctx(name, "begin"))?);
    }
    // The lock first, on every server: records read before it can be
    // changed by a move under way (which fences the copy read as live).
    lock_deployment(&txs, &lock_names, Lock::Transaction).await?;
    let old_txs = txs.split_off(n);
    let mut views = Vec::new();
    for (tx, server) in txs.iter().zip(topo.servers()) {
        views.push(catalog::read(tx, &server.name, topo).await?);
    }
    let mut old_views = Vec::new();
    for (tx, name) in old_txs.iter().zip(&old_names) {
        let mut view = catalog::read(tx, &replace::old_name(name), topo).await?;
        view.name = name.clone();
        old_views.push((name.clone(), view));
    }
    // Records of a copy that moved away and came back with a restore, its
    // schema dropped since (what `pg check` says to do): no copy, no ids.
    // Logged once committed, as the moves undone below: a repair refused
    // after them rolls them back.
    let mut forgotten = Vec::new();
    for stale in catalog::stale_records(&views) {
        let Some(i) = topo.servers().iter().position(|s| s.name == stale.server) else {
            continue;
        };
        catalog::forget_shard(&txs[i], &stale.server, stale.shard).await?;
        views[i].shards.remove(&stale.shard);
        views[i].schemaless.remove(&stale.shard);
        forgotten.push(stale);
    }
    // A move to or from a server replaced cannot be finished or undone by
    // `move-shard` (it refuses the new copy until the replacement, and the
    // file that reaches the lost one reaches nothing): undone here, under
    // the same lock, when that is safe (its destination never live).
    let (undone, mut problems) = if names.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        replace::undo_moves(&txs, topo, &mut views, &names).await?
    };
    problems.extend(catalog::conflicts(topo, &views, &[]));
    problems.extend(catalog::replaced_copies(&views, &names));
    problems.extend(replace::problems(topo, &views, &old_views));
    problems.extend(replace::gone_problems(topo, &views, replaces));
    let (timelines, recorded) = timelines(&txs, topo).await?;
    problems.extend(catalog::older_timelines(&views, &timelines, &recorded));
    let timelines: Vec<_> = views.iter().map(|v| v.identity).zip(timelines).collect();
    // A server on a new timeline (a promoted standby, a base backup
    // restored) may be behind ids another machine made after the last WAL
    // it has: each of those is at most that machine's clock plus AHEAD_MS,
    // which was within CLOCK_BOUND_MS of this host's if pg check held. So
    // its sequences go that bound and its measured difference further,
    // and a clock further off than the bound is refused.
    let mut margins = Vec::new();
    for (tx, server) in txs.iter().zip(topo.servers()) {
        let (offset, uncertainty) = clock_offset(tx, &server.name).await?;
        if let Some(problem) = clock_problem(offset, uncertainty) {
            problems.push(Drift {
                server: server.name.clone(),
                shard: None,
                problem,
            });
        }
        let moved_on = catalog::timeline_changed(tx, &server.name).await?.is_some();
        margins.push(if moved_on {
            offset.unsigned_abs() + uncertainty.unsigned_abs() + CLOCK_BOUND_MS
        } else {
            0
        });
    }
    if !problems.is_empty() {
        return Err(refused("repair", problems));
    }
    // Each old copy fenced, its last values read under the sequences'
    // locks: the replacement's sequences go past them. A copy whose ids
    // are not vouched for its run (a physical clone, a restart) is fenced
    // too, but it is not the one that made the ids: then the replacement
    // is refused, the fences alone committed.
    let mut past: BTreeMap<(String, u64), i64> = BTreeMap::new();
    let mut not_the_old = Vec::new();
    let mut left_behind = Vec::new();
    for (tx, (name, view)) in old_txs.iter().zip(&old_views) {
        let Some(i) = topo.servers().iter().position(|s| &s.name == name) else {
            continue;
        };
        if let Some(problem) = replace::unvouched(tx, topo, name, view, views[i].identity).await? {
            not_the_old.push(problem);
        }
        let owners = replace::replaced_owners(topo, &views, &view.owners, replaces);
        let fenced = replace::fence(tx, topo, view, views[i].identity, &owners).await?;
        let shards: Vec<u64> = fenced.keys().copied().collect();
        left_behind.extend(replace::left_behind(tx, &txs[i], topo, name, &shards).await?);
        for (shard, last) in fenced {
            past.insert((name.clone(), shard), last);
        }
    }
    if !not_the_old.is_empty() {
        for (tx, name) in old_txs.into_iter().zip(&old_names) {
            tx.commit()
                .await
                .map_err(ctx(&replace::old_name(name), "commit"))?;
        }
        return Err(Error::Conflict {
            server: not_the_old[0].server.clone(),
            message: not_the_old
                .iter()
                .map(|d| d.problem.as_str())
                .collect::<Vec<_>>()
                .join("\n  "),
        });
    }
    let mut out = Vec::new();
    for ((tx, (server, view)), &margin_ms) in txs
        .iter()
        .zip(topo.servers().iter().zip(&views))
        .zip(&margins)
    {
        let name = server.name.as_str();
        for &shard in &server.shards {
            if only.is_some_and(|s| s != shard) || view.state(shard) != Some(State::Live) {
                continue;
            }
            let seq = sql::shard_sequence(&topo.schema(shard));
            // ALTER SEQUENCE waits for every transaction that drew from it
            // and holds off new draws until commit (see move_shard).
            tx.batch_execute(&format!(
                "ALTER SEQUENCE {seq} {}",
                sql::sequence_options(topo.layout(), topo.sign_bit())
            ))
            .await
            .map_err(ctx(name, &format!("locking {seq}")))?;
            let (from, mut to) = bump_past_clock(tx, topo, name, &seq, margin_ms).await?;
            if let Some(&last) = past.get(&(name.to_string(), shard))
                && last > to
            {
                tx.execute(&format!("SELECT setval('{seq}', $1)"), &[&last])
                    .await
                    .map_err(ctx(name, &format!("setting {seq}")))?;
                to = last;
            }
            install_shard(tx, topo, name, shard).await?;
            out.push(Repaired {
                server: name.to_string(),
                shard,
                from,
                to,
            });
        }
        if only.is_none() {
            // Every shard here is past what it handed out: the timeline is
            // the one a later physical restore is told apart from.
            catalog::record_timeline(tx, name, true).await?;
        }
        // A replacing server's database becomes its shards' owner on every
        // server: the old copy is then refused wherever a file reaches it.
        if !replaces.is_empty() {
            let owners = replace::replaced_owners(topo, &views, &view.owners, replaces);
            catalog::record_owners(tx, name, &owners).await?;
        }
        // Every server learns each database's timeline: the old primary
        // of a promoted standby is then refused wherever a file reaches it.
        tx.batch_execute(catalog::CATALOG_DDL)
            .await
            .map_err(ctx(name, "creating the deployment records"))?;
        catalog::record_timelines(tx, name, &timelines).await?;
        // Rows only on the fenced old copy: `pg check` reports them here
        // until they are copied over.
        for l in left_behind.iter().filter(|l| l.server == name) {
            tx.execute(
                "INSERT INTO shardflake.left_behind
                   (shard, tbl, id_column, rows, min_id, max_id, replaced)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (shard, tbl) DO UPDATE SET id_column = EXCLUDED.id_column,
                   rows = EXCLUDED.rows, min_id = EXCLUDED.min_id, max_id = EXCLUDED.max_id,
                   replaced = EXCLUDED.replaced",
                &[
                    &(l.shard as i64),
                    &l.table,
                    &l.column,
                    &l.rows,
                    &l.ids.0,
                    &l.ids.1,
                    &name,
                ],
            )
            .await
            .map_err(ctx(name, "recording the rows left on the old copy"))?;
        }
    }
    // The old copies' fences first: a replacement never serves while the
    // copy it replaces still can. Each server's repair stands alone (no
    // id is repeated by a commit that fails after another's): a re-run
    // finishes the rest.
    for (tx, name) in old_txs.into_iter().zip(&old_names) {
        tx.commit()
            .await
            .map_err(ctx(&replace::old_name(name), "commit"))?;
    }
    for (tx, server) in txs.into_iter().zip(topo.servers()) {
        tx.commit().await.map_err(ctx(&server.name, "commit"))?;
    }
    for stale in &forgotten {
        tracing::warn!(
            server = stale.server.as_str(),
            shard = stale.shard,
            live_on = stale.live_on.as_str(),
            "removed the record of a copy that is gone"
        );
    }
    for u in &undone {
        tracing::warn!(
            shard = u.shard,
            source = u.source.as_str(),
            destination = u.destination.as_str(),
            fenced = u.unfenced,
            "undid a move whose source or destination is replaced"
        );
    }
    for l in &left_behind {
        tracing::warn!(
            server = l.server.as_str(),
            shard = l.shard,
            table = l.table.as_str(),
            rows = l.rows,
            "rows only on the fenced old copy"
        );
    }
    Ok(Replaced {
        repaired: out,
        left_behind,
        undone,
    })
}
