//! `pg repair`: after a restore, move each shard's sequence past what it
//! handed out and rebuild its functions for the restored sequence.

use super::catalog::{self, State};
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
    repair_replacing(topo, only, &[]).await
}

/// [`repair`], with the servers in `replaces` taken as replacing the
/// database the deployment records their shards on (`--replaces`: a dump
/// of it restored into another cluster, the old one gone for good): the
/// database each such URL reaches now is recorded as theirs on every
/// server of the file, so the old copy, if it comes back, is refused as a
/// replaced one ([`catalog::replaced_copies`]). Without it such a server
/// is refused.
pub async fn repair_replacing(
    topo: &Topology,
    only: Option<u64>,
    replaces: &[String],
) -> Result<Vec<Repaired>, Error> {
    for name in replaces {
        if topo.servers().iter().all(|s| &s.name != name) {
            return Err(TopologyError::UnknownServer(name.clone()).into());
        }
    }
    if let Some(shard) = only {
        topo.server_of(shard)?;
    }
    let mut clients = connect_all(topo).await?;
    let mut txs = Vec::new();
    for (c, server) in clients.iter_mut().zip(topo.servers()) {
        txs.push(c.transaction().await.map_err(ctx(&server.name, "begin"))?);
    }
    // The lock first, on every server: records read before it can be
    // changed by a move under way (which fences the copy read as live).
    lock_deployment(&txs, &server_names(topo), Lock::Transaction).await?;
    let mut views = Vec::new();
    for (tx, server) in txs.iter().zip(topo.servers()) {
        views.push(catalog::read(tx, &server.name, topo).await?);
    }
    // Records of a copy that moved away and came back with a restore, its
    // schema dropped since (what `pg check` says to do): no copy, no ids.
    for stale in catalog::stale_records(&views) {
        let Some(i) = topo.servers().iter().position(|s| s.name == stale.server) else {
            continue;
        };
        catalog::forget_shard(&txs[i], &stale.server, stale.shard).await?;
        views[i].shards.remove(&stale.shard);
        views[i].schemaless.remove(&stale.shard);
        tracing::warn!(
            server = stale.server.as_str(),
            shard = stale.shard,
            live_on = stale.live_on.as_str(),
            "removed the record of a copy that is gone"
        );
    }
    let mut problems = catalog::conflicts(topo, &views, &[]);
    problems.extend(catalog::replaced_copies(&views, replaces));
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
            let (from, to) = bump_past_clock(tx, topo, name, &seq, margin_ms).await?;
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
            let mut owners = view.owners.clone();
            for o in owners.values_mut() {
                if let Some(i) = replaces
                    .iter()
                    .filter(|r| **r == o.server)
                    .find_map(|r| topo.servers().iter().position(|s| &s.name == r))
                {
                    o.identity = views[i].identity;
                }
            }
            catalog::record_owners(tx, name, &owners).await?;
        }
        // Every server learns each database's timeline: the old primary
        // of a promoted standby is then refused wherever a file reaches it.
        tx.batch_execute(catalog::CATALOG_DDL)
            .await
            .map_err(ctx(name, "creating the deployment records"))?;
        catalog::record_timelines(tx, name, &timelines).await?;
    }
    // Each server's repair stands alone (no id is repeated by a commit
    // that fails after another's): a re-run finishes the rest.
    for (tx, server) in txs.into_iter().zip(topo.servers()) {
        tx.commit().await.map_err(ctx(&server.name, "commit"))?;
    }
    Ok(out)
}
