//! Moving one logical shard to another physical server.
//!
//! 0. **Record** the move on both servers ([`crate::pg::catalog`]): the
//!    destination's shard `incoming` (from the source), the source's
//!    `moving` (to the destination). From here on `pg apply` refuses the
//!    shard and `pg check` reports the move until it is finished or undone.
//! 1. **Bulk copy**, no lock: on the destination, create the shard's schema,
//!    sequence, functions and tables; copy every table with `COPY` from a
//!    `REPEATABLE READ` snapshot of the source, and verify the copy against
//!    that snapshot (row count, id sum, a sum of hashes of each row's text;
//!    both sessions with the same `TimeZone`, `DateStyle`, ... so the text
//!    is comparable) before the pause, so the pause hashes only what changed.
//!    Until step 3 the destination's copy is fenced as a moved-away copy
//!    is ([`incoming_fence_sql`]: every write and `next_id()` raise
//!    `SF001`), so nothing but the move writes there; the move lifts that
//!    fence only inside its own copying transactions.
//! 2. **Pause** (writes and ids of this shard only): lock the source tables
//!    `IN EXCLUSIVE MODE` (reads go on), then the shard's sequence against
//!    `nextval` (see [below](#no-id-twice-across-a-move)), read its last
//!    value, copy the delta and verify the rows it touched and the counts,
//!    then *fence* the source in the same transaction: a trigger and a
//!    replaced `next_id` raise SQLSTATE `SF001` ("moved") from now on, so
//!    writers that were waiting on the lock fail instead of writing to the
//!    old copy, the sequence's `MAXVALUE` becomes its last value, so it
//!    hands out nothing more, and the source's record becomes `fenced`.
//!
//!    The delta is every row version whose `xmin` is not older than the
//!    snapshot's `xmin` (compared with `age()`, so wraparound-safe): a
//!    superset of the versions the snapshot does not see. Asking
//!    `pg_visible_in_snapshot(xmin)` instead would miss a row written in a
//!    *subtransaction* (`SAVEPOINT`) of a transaction open across the
//!    snapshot: snapshots list top-level xids only, so the subxact's xid
//!    looks committed before the snapshot. Deletions are found by comparing
//!    ids (the destination then holds every source row plus the deleted ones).
//! 3. **Go live**: set the destination's sequence to the source's last value
//!    read in the pause (the packed time and sequence, see [`crate::pg::sql`]):
//!    the destination continues where the source stopped, so no id is
//!    reused; its record becomes `live`, in the same transaction.
//! 4. **Switch**: record the deployment's next generation on every server,
//!    then write it into the topology file with the shard's new place,
//!    atomically (write, fsync, rename); from then on a file of an older
//!    generation is refused by every command. Writers
//!    that got `SF001` reload it and go to the new server ([`crate::pg::Router`]
//!    does this). The pause ends here.
//! 5. **Drop** the source schema and its record, only now (`--keep-source`
//!    keeps both, fenced for good: `pg apply` never lifts a fence).
//!
//! Sharded tables must have a unique `id bigint` column (the delta and the
//! verification use it). If anything fails before the fence, the
//! destination copy is dropped: the shard stays where it was. A copy that
//! is not live is never dropped nor overwritten while it holds rows the move
//! did not copy there (its fence dropped by hand, or a copy made before
//! there was one): the move keeps it and names them. A move
//! stopped at any point (the command killed, a server down) is finished by
//! running `move-shard` again with the same destination (before the fence
//! it copies again; after it, it copies the frozen source again, verifies
//! it whole, and goes on), or undone by `move-shard --abort` until the
//! destination went live.
//!
//! # No id twice across a move
//!
//! Ids are not only drawn by writes to the shard's tables: any statement can
//! call `shardN.next_id()` (`INSERT INTO elsewhere SELECT shard5.next_id()
//! FROM generate_series(1, 5000000)`), and PostgreSQL inlines `next_id` into
//! the statement's plan when it is planned, so replacing the function does
//! not reach a statement already running (nor one planned before the fence
//! commits and drawing later). Locking the tables does not stop it either.
//! What every draw does take is a lock on the sequence relation itself:
//! `nextval` and `setval` lock it in `ROW EXCLUSIVE` mode on their first use
//! in a transaction and hold that until the transaction ends. The pause
//! takes `SHARE ROW EXCLUSIVE`, which conflicts with it, on every sequence of
//! the shard, with a no-op `ALTER SEQUENCE` (to the options `next_id`
//! needs; PostgreSQL 15 refuses `LOCK TABLE` on a sequence: "cannot lock
//! relation"). So:
//!
//! - the pause waits until every transaction that has drawn from the shard
//!   has ended: a statement already drawing holds the lock from its first
//!   draw, so the move waits for it to finish (and the pause lasts that
//!   long, as it already did for a long transaction writing the tables);
//! - while the pause holds the locks nobody draws (new draws queue behind
//!   it), so the last values it reads are final;
//! - a draw queued behind the pause, or made later by a statement planned
//!   with the old `next_id`, comes from a transaction that had not drawn
//!   before: it must take the lock after the fence committed, which makes
//!   it read the sequence's options afresh, and it finds `MAXVALUE` at the
//!   last value: `nextval` fails (SQLSTATE `2200H`) and a catch-up's
//!   `setval` past it too (`22003`). Statements planned after the fence
//!   call the fenced `next_id` (`SF001`).
//!
//! Nothing is added to `next_id`'s path: the lock it takes is the one
//! `nextval` always takes. A transaction that drew ids and then writes to a
//! shard table can deadlock with the pause (it waits for the tables, the
//! pause for its sequence); PostgreSQL then aborts one of the two, and if
//! it is the pause, the pause starts again (at most [`PAUSE_ATTEMPTS`]
//! times). Should the move fail before the switch, the fence is removed and
//! the sequences' options restored.
//!
//! A move refuses a shard schema that holds relations, functions or types
//! the topology does not describe (dropping the old copy would destroy them
//! uncopied), and holds the deployment lock on every server of the file
//! from start to end, taken before it reads the records or (again) the
//! file, so a concurrent apply or repair cannot rebuild (unfence) the old
//! copy, and a second move starts from the file the first one wrote.

use std::collections::BTreeMap;
use std::path::Path;
use std::pin::pin;
use std::str::FromStr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient};

use super::catalog::{self, Deployment, ServerView, State};
use super::topology::{Topology, TopologyError};
use super::{Drift, Lock, ctx, lock_deployment, server_names, sql};
use crate::{Error, SQLSTATE_MOVED, pg};

/// Options of a move.
#[derive(Debug, Clone, Default)]
pub struct MoveOptions {
    /// Keep the source schema (fenced) instead of dropping it.
    pub keep_source: bool,
    /// Stop right after this step, as if the command were killed there (no
    /// clean-up): how the tests and `shardflake-chaos db` interrupt a move.
    pub stop_after: Option<MoveStep>,
}

/// The steps of a move whose end is recorded on the servers (see the module
/// docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveStep {
    /// 0: both records written.
    Recorded,
    /// 1: bulk copy made and verified.
    Copied,
    /// 2: the source fenced.
    Fenced,
    /// 3: the destination live.
    Live,
    /// 4: the topology file switched.
    Switched,
}

impl MoveStep {
    /// Every step, in order.
    pub const ALL: [MoveStep; 5] = [
        MoveStep::Recorded,
        MoveStep::Copied,
        MoveStep::Fenced,
        MoveStep::Live,
        MoveStep::Switched,
    ];

    /// Its name (`recorded`, `copied`, `fenced`, `live`, `switched`).
    pub fn name(self) -> &'static str {
        match self {
            MoveStep::Recorded => "recorded",
            MoveStep::Copied => "copied",
            MoveStep::Fenced => "fenced",
            MoveStep::Live => "live",
            MoveStep::Switched => "switched",
        }
    }
}

impl FromStr for MoveStep {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        MoveStep::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("no move step {s:?} (recorded, copied, fenced, live, switched)"))
    }
}

/// What a move did.
#[derive(Debug, Clone)]
pub struct MoveReport {
    /// Shard moved.
    pub shard: u64,
    /// From server.
    pub from: String,
    /// To server.
    pub to: String,
    /// Rows per table after the move.
    pub rows: Vec<(String, i64)>,
    /// Rows copied in the bulk phase.
    pub bulk_rows: u64,
    /// Rows copied (or replaced) during the pause.
    pub delta_rows: u64,
    /// How long writes to the shard were paused (lock to topology switch).
    pub paused: Duration,
    /// Whether the source schema was dropped.
    pub dropped_source: bool,
    /// What an interrupted move this run finished had done (`None`: a
    /// move from the start).
    pub resumed_after: Option<MoveStep>,
}

/// Where a shard is, across the deployment's servers.
struct Whereabouts {
    /// Serving (live or moving).
    serving: Option<String>,
    /// The server whose copy is `moving`, with its peer.
    moving: Option<(String, String)>,
    /// The server whose copy is `incoming`.
    incoming: Option<String>,
    /// The server whose copy is `fenced`, with its peer.
    fenced: Option<(String, String)>,
}

/// Why a server's copy of `shard` must be repaired before a move copies it
/// or makes it live: its server's WAL timeline changed, its sequence was
/// restored, or its server restarted since its ids were vouched for.
async fn needs_repair(
    c: &Client,
    topo: &Topology,
    name: &str,
    shard: u64,
) -> Result<Vec<Drift>, Error> {
    let d = |shard, problem| Drift {
        server: name.to_string(),
        shard,
        problem,
    };
    let mut out = Vec::new();
    if let Some((recorded, current)) = catalog::timeline_changed(c, name).await? {
        out.push(d(
            None,
            format!(
                "is on WAL timeline {current}, not {recorded} as at the last apply or repair (a promoted standby, or a restore from a physical backup): its sequences may be behind ids already handed out; run `shardflake pg repair` before moving a shard from it"
            ),
        ));
    } else if let Some(p) = pg::restored(c, topo, name, shard).await? {
        out.push(d(Some(shard), p));
    } else if let Some(p) = pg::restarted(c, topo, name, shard).await? {
        out.push(d(Some(shard), p));
    }
    Ok(out)
}

fn whereabouts(views: &[ServerView], shard: u64) -> Whereabouts {
    let mut w = Whereabouts {
        serving: None,
        moving: None,
        incoming: None,
        fenced: None,
    };
    for v in views {
        let peer = v.peer(shard).unwrap_or_default().to_string();
        match v.state(shard) {
            Some(State::Live) => w.serving = Some(v.name.clone()),
            Some(State::Moving) => {
                w.serving = Some(v.name.clone());
                w.moving = Some((v.name.clone(), peer));
            }
            Some(State::Incoming) => w.incoming = Some(v.name.clone()),
            Some(State::Fenced) => w.fenced = Some((v.name.clone(), peer)),
            None => {}
        }
    }
    w
}

/// Every server's client and records, with the apply lock held on `locked`.
struct Deployed {
    topo: Topology,
    clients: Vec<Client>,
    views: Vec<ServerView>,
}

impl Deployed {
    /// Loads the file, connects to every server, takes the deployment lock
    /// on each (name order), reads the file again (a move that held the
    /// lock before may have switched it), reads the records, and refuses a
    /// deployment-wide contradiction between the file and the servers.
    async fn open(path: &Path, shard: u64) -> Result<Deployed, Error> {
        let first = Topology::load(path)?;
        first.server_of(shard)?;
        let clients = pg::connect_all(&first).await?;
        lock_deployment(&clients, &server_names(&first), Lock::Session).await?;
        let topo = Topology::load(path)?;
        if topo.servers().len() != first.servers().len()
            || topo
                .servers()
                .iter()
                .zip(first.servers())
                .any(|(a, b)| a.name != b.name || a.url != b.url)
        {
            return Err(Error::Move {
                shard,
                message: format!(
                    "the servers of {} changed while this move waited for the deployment lock: run it again",
                    path.display()
                ),
            });
        }
        topo.server_of(shard)?;
        let mut views = Vec::new();
        for (c, server) in clients.iter().zip(topo.servers()) {
            views.push(catalog::read(c, &server.name, &topo).await?);
        }
        // Problems of this shard are what the move finishes or undoes.
        let mut problems: Vec<_> = catalog::record_conflicts(&topo, &views, &[])
            .into_iter()
            .filter(|d| d.shard.is_none())
            .collect();
        problems.extend(catalog::replaced_copies(&views, &[]));
        let (timelines, recorded) = pg::timelines(&clients, &topo).await?;
        problems.extend(catalog::older_timelines(&views, &timelines, &recorded));
        // A file one generation behind is this shard's own move, recorded
        // on the servers and stopped before it wrote the file: the same
        // move finishes it (see `switch`). Any older file is refused.
        if let Some(older) = catalog::older_file(&topo, &views) {
            let newest = catalog::recorded_generation(&views);
            let own = newest.is_some_and(|d| {
                d.generation == topo.generation().saturating_add(1) && d.last_move == Some(shard)
            });
            if !own {
                problems.insert(0, older);
            }
        }
        // A copy that needs repair (restored, restarted, a promoted standby)
        // may be behind ids it handed out: a move would carry its sequence
        // on, and making it live again (`--abort`) would lift the refusal,
        // without the margin repair adds.
        for ((c, server), view) in clients.iter().zip(topo.servers()).zip(&views) {
            if !matches!(
                view.state(shard),
                Some(State::Live | State::Moving | State::Fenced)
            ) {
                continue;
            }
            problems.extend(needs_repair(c, &topo, &server.name, shard).await?);
        }
        if !problems.is_empty() {
            return Err(pg::refused("move", problems));
        }
        Ok(Deployed {
            topo,
            clients,
            views,
        })
    }

    fn index(&self, name: &str) -> Result<usize, Error> {
        self.topo
            .servers()
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| TopologyError::UnknownServer(name.to_string()).into())
    }

    /// The two clients, mutably (`a` and `b` differ: every caller checked
    /// that source and destination are two servers).
    fn pair(&mut self, a: usize, b: usize) -> (&mut Client, &mut Client) {
        if a < b {
            let (x, y) = self.clients.split_at_mut(b);
            (&mut x[a], &mut y[0])
        } else {
            let (x, y) = self.clients.split_at_mut(a);
            (&mut y[0], &mut x[b])
        }
    }

    fn deployment(&self, server: &str) -> Deployment {
        let id = catalog::deployment_id(&self.views).unwrap_or("unrecorded");
        Deployment::of(&self.topo, id, server)
    }
}

/// Moves `shard` to server `to`, rewriting the topology file at `path`; or
/// finishes a move of it to `to` that was stopped at any step.
pub async fn move_shard(
    path: &Path,
    shard: u64,
    to: &str,
    opts: &MoveOptions,
) -> Result<MoveReport, Error> {
    let mut dep = Deployed::open(path, shard).await?;
    let fail = |message: String| Error::Move { shard, message };
    let d = dep.index(to)?;
    let w = whereabouts(&dep.views, shard);
    let file_owner = dep.topo.server_of(shard)?.name.clone();
    if let Some((at, peer)) = &w.fenced {
        // Fenced: the move to `peer` is past the point of no return.
        if peer != to {
            return Err(fail(format!(
                "shard {shard} was fenced on {at} for a move to {peer}: finish that first (`shardflake pg move-shard {shard} --to {peer}`)"
            )));
        }
        let s = dep.index(at)?;
        if s == d {
            return Err(fail(format!(
                "the records say shard {shard} moved from {at} to itself: fix them by hand (shardflake.shards on {at})"
            )));
        }
        return resume_fenced(
            &mut dep,
            path,
            shard,
            (s, d),
            w.serving.as_deref() == Some(to),
            opts,
        )
        .await;
    }
    let Some(from) = w.serving.clone() else {
        return Err(fail(format!(
            "shard {shard} is live on no server (run pg check)"
        )));
    };
    if from == to {
        // Already there: a file that says otherwise is switched.
        if file_owner != to {
            switch(&dep, path, shard, to).await?;
        }
        return Err(fail(format!("shard {shard} is already on {to:?}")));
    }
    if let Some((_, peer)) = &w.moving
        && peer != to
    {
        return Err(fail(format!(
            "a move of shard {shard} to {peer} did not finish: finish it (`--to {peer}`) or undo it (`--abort`) first"
        )));
    }
    if file_owner != from {
        return Err(fail(format!(
            "the file puts shard {shard} on {file_owner}, but it lives on {from}: use the file the last move wrote"
        )));
    }
    let s = dep.index(&from)?;
    let schema = dep.topo.schema(shard);
    if let Some(problem) =
        super::adopt::shard_dependents(&dep.clients[s], &from, shard, &schema).await?
    {
        return Err(fail(problem));
    }
    let resumed = w.moving.is_some() || w.incoming.is_some();
    if resumed {
        // Stopped before the fence: nothing was handed over; copy again.
        let copy_at = dep.index(w.incoming.as_deref().unwrap_or(to))?;
        if copy_at != s {
            undo_copy(&mut dep, shard, (s, copy_at)).await?;
        }
    }
    let mut report = fresh_move(&mut dep, path, shard, (s, d), opts).await?;
    report.resumed_after = resumed.then_some(MoveStep::Recorded);
    Ok(report)
}

/// Undoes a move of `shard` that did not go live on its destination: drops
/// the destination's copy and, if the source was fenced, lifts its fence.
/// Returns the server the shard stays on.
pub async fn abort_move(path: &Path, shard: u64) -> Result<String, Error> {
    let mut dep = Deployed::open(path, shard).await?;
    let fail = |message: String| Error::Move { shard, message };
    let w = whereabouts(&dep.views, shard);
    if let Some((at, peer)) = &w.fenced {
        if w.serving.as_deref() == Some(peer.as_str()) {
            return Err(fail(format!(
                "the move to {peer} went live there (its copy hands out ids): it cannot be undone; finish it with `shardflake pg move-shard {shard} --to {peer}`, then move the shard back if needed"
            )));
        }
        let s = dep.index(at)?;
        let d = dep.index(peer)?;
        if s == d {
            return Err(fail(format!(
                "the records say shard {shard} moved from {at} to itself: fix them by hand (shardflake.shards on {at})"
            )));
        }
        let topo = dep.topo.clone();
        let (src, dst) = dep.pair(s, d);
        discard_copy((&*src, at), (&*dst, peer), &topo, shard).await?;
        let src_tx = src.transaction().await.map_err(ctx(at, "begin"))?;
        unfence(&src_tx, &topo, at, shard).await?;
        catalog::record_shard(&src_tx, at, shard, State::Live, None).await?;
        src_tx.commit().await.map_err(ctx(at, "commit unfence"))?;
        return Ok(at.clone());
    }
    // Before the fence: the copy (if any) goes, the source serves on.
    let copy_at = match (&w.incoming, &w.moving) {
        (Some(dest), _) | (None, Some((_, dest))) => dest.clone(),
        (None, None) => return Err(fail("no move of it is under way".into())),
    };
    let Some(from) = w.serving.clone() else {
        return Err(fail("it is live on no server (run pg check)".into()));
    };
    let (s, d) = (dep.index(&from)?, dep.index(&copy_at)?);
    if s == d {
        return Err(fail(format!(
            "the records say shard {shard} is copied from {from} to itself: fix them by hand (shardflake.shards on {from})"
        )));
    }
    undo_copy(&mut dep, shard, (s, d)).await?;
    Ok(from)
}

/// Before the fence: drop the destination's copy and record, and the
/// source's `moving`.
async fn undo_copy(dep: &mut Deployed, shard: u64, (s, d): (usize, usize)) -> Result<(), Error> {
    let topo = dep.topo.clone();
    let (sn, dn) = (
        topo.servers()[s].name.clone(),
        topo.servers()[d].name.clone(),
    );
    let (src, dst) = dep.pair(s, d);
    discard_copy((&*src, &sn), (&*dst, &dn), &topo, shard).await?;
    if has_records(src, &sn).await? {
        catalog::record_shard(&*src, &sn, shard, State::Live, None).await?;
    }
    Ok(())
}

async fn dep_has_deployment(c: &Client, name: &str) -> Result<bool, Error> {
    Ok(
        c.query_one("SELECT EXISTS (SELECT 1 FROM shardflake.deployment)", &[])
            .await
            .map_err(ctx(name, "reading the deployment record"))?
            .get(0),
    )
}

async fn has_records(c: &Client, name: &str) -> Result<bool, Error> {
    Ok(
        c.query_one("SELECT to_regclass('shardflake.shards') IS NOT NULL", &[])
            .await
            .map_err(ctx(name, "looking up the records"))?
            .get(0),
    )
}

/// Rows of `dname`'s copy of `shard` (not live) that the move did not copy
/// there, as "N rows of table (ids ...)": the rows of each table without
/// its fence trigger firing always ([`incoming_fence_sql`]: with it,
/// nothing but the move wrote there) whose id `sname` does not hold. A
/// copy made before the fence, or whose fence was dropped or disabled, may
/// hold rows written there directly, acknowledged to whoever wrote them.
async fn rows_not_copied(
    (src, sname): (&Client, &str),
    (dst, dname): (&Client, &str),
    topo: &Topology,
    shard: u64,
) -> Result<Vec<String>, Error> {
    let schema = topo.schema(shard);
    let mut found = Vec::new();
    for t in topo.tables() {
        let rel = format!("{schema}.{}", t.name);
        let fenced: Option<bool> = dst
            .query_one(
                "SELECT CASE WHEN to_regclass($1) IS NULL THEN NULL ELSE EXISTS (
                        SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass($1)
                           AND tgname = 'shardflake_moved' AND tgenabled = 'A') END",
                &[&rel],
            )
            .await
            .map_err(ctx(dname, "reading the copy's fence"))?
            .get(0);
        if fenced != Some(false) {
            continue;
        }
        let ids: Vec<i64> = dst
            .query(&format!("SELECT id FROM {rel}"), &[])
            .await
            .map_err(ctx(dname, "listing the copy's ids"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if ids.is_empty() {
            continue;
        }
        let source_has = pg::relation_exists(src, sname, &rel).await?;
        let only: Vec<i64> = if source_has {
            src.query(
                &format!(
                    "SELECT i FROM unnest($1::bigint[]) i EXCEPT SELECT id FROM {rel} ORDER BY 1"
                ),
                &[&ids],
            )
            .await
            .map_err(ctx(sname, "comparing the copy's ids"))?
            .iter()
            .map(|r| r.get(0))
            .collect()
        } else {
            ids
        };
        if !only.is_empty() {
            found.push(format!(
                "{} rows of {rel} (ids {})",
                only.len(),
                id_list(&only)
            ));
        }
    }
    Ok(found)
}

/// Up to ten ids, then how many more.
fn id_list(ids: &[i64]) -> String {
    let mut text: Vec<String> = ids.iter().take(10).map(i64::to_string).collect();
    if ids.len() > 10 {
        text.push(format!("and {} more", ids.len() - 10));
    }
    text.join(", ")
}

/// Refuses to drop or overwrite `dname`'s copy of `shard` while it holds
/// rows the move did not copy ([`rows_not_copied`]), naming them.
async fn refuse_rows_not_copied(
    (src, sname): (&Client, &str),
    (dst, dname): (&Client, &str),
    topo: &Topology,
    shard: u64,
) -> Result<(), Error> {
    let kept = rows_not_copied((src, sname), (dst, dname), topo, shard).await?;
    if kept.is_empty() {
        return Ok(());
    }
    Err(Error::Move {
        shard,
        message: format!(
            "{dname}'s copy of shard {shard}, not live, holds rows that {sname} does not: {}. They were written to the copy directly (its fence dropped or disabled, or the copy made before there was one), or deleted on {sname} since the copy; the copy is kept. Move those rows to {sname} (or delete them on {dname} if they are deleted rows), then run `shardflake pg move-shard {shard} --to {dname}` again, or `--abort`",
            kept.join("; ")
        ),
    })
}

/// Drops `dname`'s copy of `shard` (not live) and its record, unless it
/// holds rows the move did not copy there ([`refuse_rows_not_copied`]).
async fn discard_copy(
    (src, sname): (&Client, &str),
    (dst, dname): (&Client, &str),
    topo: &Topology,
    shard: u64,
) -> Result<(), Error> {
    refuse_rows_not_copied((src, sname), (dst, dname), topo, shard).await?;
    drop_copy(dst, dname, &topo.schema(shard), shard).await
}

/// Drops a destination's copy of a shard and its record.
async fn drop_copy(c: &Client, name: &str, schema: &str, shard: u64) -> Result<(), Error> {
    drop_schema(c, name, schema).await?;
    if has_records(c, name).await? {
        catalog::forget_shard(c, name, shard).await?;
    }
    Ok(())
}

fn stop(opts: &MoveOptions, step: MoveStep, shard: u64) -> Result<(), Error> {
    if opts.stop_after == Some(step) {
        tracing::warn!(shard, step = step.name(), "move stopped as asked");
        return Err(Error::Move {
            shard,
            message: format!("stopped after step {:?} as asked", step.name()),
        });
    }
    Ok(())
}

/// Step 4: records the deployment's next generation on every server of the
/// file (with the shard moved and the file), then writes it into the file
/// with the shard on `to`. Stopped in between, the file is one generation
/// behind the servers: every command refuses it but this move, which
/// records the same generation again and writes the file.
async fn switch(dep: &Deployed, path: &Path, shard: u64, to: &str) -> Result<(), Error> {
    let recorded = catalog::recorded_generation(&dep.views).map_or(0, |d| d.generation);
    let generation = if dep.topo.generation() < recorded {
        recorded
    } else {
        dep.topo.generation().saturating_add(1)
    };
    let file = std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string();
    let owner = BTreeMap::from([(
        shard,
        catalog::Owner {
            server: to.to_string(),
            identity: dep.views[dep.index(to)?].identity,
        },
    )]);
    for (c, server) in dep.clients.iter().zip(dep.topo.servers()) {
        c.batch_execute(catalog::CATALOG_DDL)
            .await
            .map_err(ctx(&server.name, "creating the records"))?;
        catalog::record_generation(c, &server.name, generation, shard, &file).await?;
        catalog::record_owners(c, &server.name, &owner).await?;
    }
    carry_left_behind(dep, shard, to).await?;
    dep.topo
        .with_generation(generation)
        .with_shard_moved(shard, to)?
        .save_keeping_comments(path)
        .map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
}

/// The records of rows a replacement left on a fenced old copy of
/// `shard` (`shardflake.left_behind`) go where the shard goes: `pg check`
/// reports them on the server that holds it, until the rows are copied
/// there. Written there before they are deleted elsewhere: a move stopped
/// in between leaves them on both, and the move run again carries them.
async fn carry_left_behind(dep: &Deployed, shard: u64, to: &str) -> Result<(), Error> {
    let d = dep.index(to)?;
    for (i, (c, server)) in dep.clients.iter().zip(dep.topo.servers()).enumerate() {
        if i == d {
            continue;
        }
        let name = server.name.as_str();
        let rows = c
            .query(
                "SELECT tbl, id_column, rows, min_id, max_id, coalesce(replaced, $2)
                   FROM shardflake.left_behind WHERE shard = $1",
                &[&(shard as i64), &name],
            )
            .await
            .map_err(ctx(name, "reading the rows left on a replaced copy"))?;
        for r in &rows {
            let (tbl, column, n, min, max, replaced): (String, String, i64, i64, i64, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            dep.clients[d]
                .execute(
                    "INSERT INTO shardflake.left_behind
                       (shard, tbl, id_column, rows, min_id, max_id, replaced)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (shard, tbl) DO UPDATE SET id_column = EXCLUDED.id_column,
                       rows = EXCLUDED.rows, min_id = EXCLUDED.min_id,
                       max_id = EXCLUDED.max_id, replaced = EXCLUDED.replaced",
                    &[&(shard as i64), &tbl, &column, &n, &min, &max, &replaced],
                )
                .await
                .map_err(ctx(to, "recording the rows left on a replaced copy"))?;
        }
        if !rows.is_empty() {
            c.execute(
                "DELETE FROM shardflake.left_behind WHERE shard = $1",
                &[&(shard as i64)],
            )
            .await
            .map_err(ctx(
                name,
                "moving the record of rows left on a replaced copy",
            ))?;
        }
    }
    Ok(())
}

/// Settings under which a row's text is the same on both servers.
const TEXT_SETTINGS: &str = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; \
    SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; SET bytea_output = 'hex'";

/// How many times the pause is started, at most, when PostgreSQL breaks a
/// deadlock between it and an application transaction by aborting the
/// pause (see the module docs).
pub const PAUSE_ATTEMPTS: u32 = 5;

/// A move from the start: record, copy, pause and fence, go live, switch,
/// drop.
async fn fresh_move(
    dep: &mut Deployed,
    path: &Path,
    shard: u64,
    (s, d): (usize, usize),
    opts: &MoveOptions,
) -> Result<MoveReport, Error> {
    let fail = |message: String| Error::Move { shard, message };
    let topo = dep.topo.clone();
    let (sn, dn) = (
        topo.servers()[s].name.clone(),
        topo.servers()[d].name.clone(),
    );
    let (sname, dname) = (sn.as_str(), dn.as_str());
    let dest_record = dep.deployment(dname);
    let source_record = dep.deployment(sname);
    let (src, dst) = dep.pair(s, d);
    let schema = topo.schema(shard);
    for (c, name, want) in [(&*dst, dname, false), (&*src, sname, true)] {
        let exists: bool = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                &[&schema],
            )
            .await
            .map_err(ctx(name, "looking up schema"))?
            .get(0);
        if exists != want {
            return Err(fail(if want {
                format!("schema {schema} does not exist on {name:?}")
            } else {
                format!(
                    "schema {schema} already exists on {name:?} with no record of a move: it is not this deployment's copy; drop it there first"
                )
            }));
        }
    }
    let foreign = foreign_objects(src, &topo, &schema)
        .await
        .map_err(ctx(sname, "listing the shard's objects"))?;
    if !foreign.is_empty() {
        return Err(fail(format!(
            "schema {schema} on {sname:?} holds objects the topology does not describe ({}); \
             a move would not copy them and would drop them with the old copy: move or drop them first",
            foreign.join(", ")
        )));
    }
    for (c, name) in [(&*src, sname), (&*dst, dname)] {
        c.batch_execute(TEXT_SETTINGS)
            .await
            .map_err(ctx(name, "setting the session"))?;
    }

    // 0. Record the move on both servers.
    {
        let tx = dst.transaction().await.map_err(ctx(dname, "begin"))?;
        tx.batch_execute(&sql::deployment_ddl(topo.layout())?)
            .await
            .map_err(ctx(dname, "creating schema shardflake"))?;
        tx.batch_execute(catalog::CATALOG_DDL)
            .await
            .map_err(ctx(dname, "creating the records"))?;
        catalog::record_deployment(&tx, &dest_record).await?;
        catalog::record_shard(&tx, dname, shard, State::Incoming, Some(sname)).await?;
        tx.commit().await.map_err(ctx(dname, "commit"))?;
    }
    // A deployment made before the records gets them on the source too.
    src.batch_execute(catalog::CATALOG_DDL)
        .await
        .map_err(ctx(sname, "creating the records"))?;
    if !dep_has_deployment(src, sname).await? {
        catalog::record_deployment(&*src, &source_record).await?;
    }
    catalog::record_shard(&*src, sname, shard, State::Moving, Some(dname)).await?;
    stop(opts, MoveStep::Recorded, shard)?;

    // 1. Bulk copy from a snapshot, verified against it.
    let tables: Vec<String> = topo.tables().iter().map(|t| t.name.clone()).collect();
    let mut bulk_rows = 0;
    let bulk = async {
        let stx = src
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(ctx(sname, "begin snapshot"))?;
        let snapshot: String = stx
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await
            .map_err(ctx(sname, "taking snapshot"))?
            .get(0);
        let dtx = dst.transaction().await.map_err(ctx(dname, "begin"))?;
        bulk_rows = copy_shard(&stx, &dtx, &topo, shard, &tables, (sname, dname)).await?;
        dtx.commit().await.map_err(ctx(dname, "commit bulk copy"))?;
        stx.commit().await.map_err(ctx(sname, "end snapshot"))?;
        Ok::<_, Error>(snapshot)
    }
    .await;
    let snapshot = match bulk {
        Ok(s) => s,
        Err(e) => {
            if let Err(kept @ Error::Move { .. }) =
                discard_copy((&*src, sname), (&*dst, dname), &topo, shard).await
            {
                return Err(fail(format!("{e}; {kept}")));
            }
            let _ = catalog::record_shard(&*src, sname, shard, State::Live, None).await;
            return Err(e);
        }
    };
    stop(opts, MoveStep::Copied, shard)?;

    // 2. Pause: lock, delta, verify it, fence.
    let paused_at = Instant::now();
    let seqs = vec![sql::shard_sequence(&schema)];
    let pause = Pause {
        schema: &schema,
        tables: &tables,
        seqs: &seqs,
        options: sql::sequence_options(topo.layout(), topo.sign_bit()),
        snapshot: &snapshot,
        shard,
        to: dname,
    };
    let (delta_rows, last_values) = match pause_and_copy(src, dst, &pause, (sname, dname)).await {
        Ok(r) => r,
        Err(e) => {
            if let Err(kept @ Error::Move { .. }) =
                discard_copy((&*src, sname), (&*dst, dname), &topo, shard).await
            {
                return Err(fail(format!("{e}; {kept}")));
            }
            let _ = catalog::record_shard(&*src, sname, shard, State::Live, None).await;
            return Err(e);
        }
    };
    stop(opts, MoveStep::Fenced, shard)?;

    // 3..5.
    let rows = go_live(dst, &topo, dname, &tables, &last_values, shard).await?;
    stop(opts, MoveStep::Live, shard)?;
    switch(dep, path, shard, dname).await?;
    let paused = paused_at.elapsed();
    stop(opts, MoveStep::Switched, shard)?;
    if !opts.keep_source {
        let (src, _) = dep.pair(s, d);
        drop_copy(src, sname, &schema, shard).await?;
    }
    Ok(MoveReport {
        shard,
        from: sn.clone(),
        to: dn.clone(),
        rows,
        bulk_rows,
        delta_rows,
        paused,
        dropped_source: !opts.keep_source,
        resumed_after: None,
    })
}

/// Step 3: the destination continues where the fenced source stopped, and
/// serves: its fence lifted and `next_id` rebuilt, in the transaction that
/// records it live.
async fn go_live(
    dst: &mut Client,
    topo: &Topology,
    dname: &str,
    tables: &[String],
    last_values: &[(String, i64)],
    shard: u64,
) -> Result<Vec<(String, i64)>, Error> {
    let schema = &topo.schema(shard);
    let tx = dst.transaction().await.map_err(ctx(dname, "begin"))?;
    tx.batch_execute(&lift_fence_triggers_sql(schema, tables))
        .await
        .map_err(ctx(dname, "lifting the copy's fence"))?;
    pg::install_shard(&tx, topo, dname, shard).await?;
    for (seq, v) in last_values {
        tx.execute(
            &format!("SELECT setval('{seq}', greatest($1, (SELECT last_value FROM {seq})))"),
            &[v],
        )
        .await
        .map_err(ctx(dname, "setting sequences"))?;
    }
    let mut rows = Vec::new();
    for t in tables {
        let n: i64 = tx
            .query_one(&format!("SELECT count(*) FROM {schema}.{t}"), &[])
            .await
            .map_err(ctx(dname, "counting"))?
            .get(0);
        rows.push((t.clone(), n));
    }
    catalog::record_shard(&tx, dname, shard, State::Live, None).await?;
    tx.commit().await.map_err(ctx(dname, "commit"))?;
    Ok(rows)
}

/// Finishes a move whose source is fenced: copies the frozen source again
/// (whole, verified whole) unless the destination already went live, then
/// switches the file and drops the source.
async fn resume_fenced(
    dep: &mut Deployed,
    path: &Path,
    shard: u64,
    (s, d): (usize, usize),
    dest_live: bool,
    opts: &MoveOptions,
) -> Result<MoveReport, Error> {
    let topo = dep.topo.clone();
    let (sn, dn) = (
        topo.servers()[s].name.clone(),
        topo.servers()[d].name.clone(),
    );
    let (sname, dname) = (sn.as_str(), dn.as_str());
    let schema = topo.schema(shard);
    let tables: Vec<String> = topo.tables().iter().map(|t| t.name.clone()).collect();
    let (src, dst) = dep.pair(s, d);
    for (c, name) in [(&*src, sname), (&*dst, dname)] {
        c.batch_execute(TEXT_SETTINGS)
            .await
            .map_err(ctx(name, "setting the session"))?;
    }
    let mut bulk_rows = 0;
    let rows;
    if dest_live {
        rows = Vec::new();
    } else {
        refuse_rows_not_copied((&*src, sname), (&*dst, dname), &topo, shard).await?;
        let seq = sql::shard_sequence(&schema);
        let last: i64 = src
            .query_one(&format!("SELECT last_value FROM {seq}"), &[])
            .await
            .map_err(ctx(sname, "reading the fenced sequence"))?
            .get(0);
        {
            let stx = src.transaction().await.map_err(ctx(sname, "begin"))?;
            let dtx = dst.transaction().await.map_err(ctx(dname, "begin"))?;
            bulk_rows = copy_shard(&stx, &dtx, &topo, shard, &tables, (sname, dname)).await?;
            dtx.commit().await.map_err(ctx(dname, "commit copy"))?;
            stx.commit().await.map_err(ctx(sname, "end"))?;
        }
        stop(opts, MoveStep::Copied, shard)?;
        rows = go_live(dst, &topo, dname, &tables, &[(seq, last)], shard).await?;
        stop(opts, MoveStep::Live, shard)?;
    }
    switch(dep, path, shard, dname).await?;
    stop(opts, MoveStep::Switched, shard)?;
    if !opts.keep_source {
        let (src, _) = dep.pair(s, d);
        drop_copy(src, sname, &schema, shard).await?;
    }
    Ok(MoveReport {
        shard,
        from: sn.clone(),
        to: dn.clone(),
        rows,
        bulk_rows,
        delta_rows: 0,
        paused: Duration::ZERO,
        dropped_source: !opts.keep_source,
        resumed_after: Some(if dest_live {
            MoveStep::Live
        } else {
            MoveStep::Fenced
        }),
    })
}

/// Compares tables on both sides: count, id sum and sum of row-text hashes
/// (`ids`: only those rows, plus the counts).
async fn verify(
    a: &impl GenericClient,
    b: &impl GenericClient,
    schema: &str,
    tables: &[String],
    ids: Option<&[Vec<i64>]>,
    (s, d): (&str, &str),
    shard: u64,
) -> Result<(), Error> {
    for (i, t) in tables.iter().enumerate() {
        let (q, only): (String, Option<&Vec<i64>>) = match ids {
            None => (
                format!(
                    "SELECT count(*), coalesce(sum(id::numeric), 0)::text, \
                            coalesce(sum(hashtextextended(shardflake_row::text, 0)), 0)::text \
                       FROM {schema}.{t} shardflake_row"
                ),
                None,
            ),
            Some(ids) => (
                format!(
                    "SELECT (SELECT count(*) FROM {schema}.{t}), coalesce(sum(id::numeric), 0)::text, \
                            coalesce(sum(hashtextextended(shardflake_row::text, 0)), 0)::text \
                       FROM {schema}.{t} shardflake_row WHERE id = ANY($1)"
                ),
                Some(&ids[i]),
            ),
        };
        let (ra, rb) = match only {
            None => (
                a.query_one(&q, &[]).await.map_err(ctx(s, "verifying"))?,
                b.query_one(&q, &[]).await.map_err(ctx(d, "verifying"))?,
            ),
            Some(ids) => (
                a.query_one(&q, &[ids]).await.map_err(ctx(s, "verifying"))?,
                b.query_one(&q, &[ids]).await.map_err(ctx(d, "verifying"))?,
            ),
        };
        let x: (i64, String, String) = (ra.get(0), ra.get(1), ra.get(2));
        let y: (i64, String, String) = (rb.get(0), rb.get(1), rb.get(2));
        if x != y {
            // What differs, row by row (a failure is rare: the cost is fine).
            let rel = format!("{schema}.{t}");
            let (hs, hd) = (row_hashes(a, s, &rel).await?, row_hashes(b, d, &rel).await?);
            return Err(Error::Move {
                shard,
                message: format!(
                    "verification failed for {rel}: source {s} {} rows, destination {d} {} rows: {}",
                    x.0,
                    y.0,
                    describe_differences(&hs, &hd)
                ),
            });
        }
    }
    Ok(())
}

/// Each row's id and the hash of its text.
async fn row_hashes(
    c: &impl GenericClient,
    name: &str,
    rel: &str,
) -> Result<BTreeMap<i64, i64>, Error> {
    Ok(c.query(
        &format!("SELECT id, hashtextextended(shardflake_row::text, 0) FROM {rel} shardflake_row"),
        &[],
    )
    .await
    .map_err(ctx(name, "listing rows that differ"))?
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect())
}

/// The rows that differ between a source's and a destination's table
/// (id → hash of the row's text), in words.
fn describe_differences(src: &BTreeMap<i64, i64>, dst: &BTreeMap<i64, i64>) -> String {
    let only = |a: &BTreeMap<i64, i64>, b: &BTreeMap<i64, i64>| -> Vec<i64> {
        a.keys().filter(|id| !b.contains_key(id)).copied().collect()
    };
    let (only_dst, only_src) = (only(dst, src), only(src, dst));
    let changed: Vec<i64> = src
        .iter()
        .filter(|(id, h)| dst.get(id).is_some_and(|g| g != *h))
        .map(|(id, _)| *id)
        .collect();
    let mut parts = Vec::new();
    for (ids, what) in [
        (&only_dst, "only on the destination"),
        (&only_src, "only on the source"),
        (&changed, "on both with different contents"),
    ] {
        if !ids.is_empty() {
            parts.push(format!("{} rows {what} (ids {})", ids.len(), id_list(ids)));
        }
    }
    if parts.is_empty() {
        "no row differs when read again (the rows changed while they were compared)".to_string()
    } else {
        parts.join("; ")
    }
}

/// What the pause works on.
struct Pause<'a> {
    schema: &'a str,
    tables: &'a [String],
    /// Every sequence of the shard, schema-qualified.
    seqs: &'a [String],
    /// [`sql::sequence_options`] of the topology.
    options: String,
    snapshot: &'a str,
    shard: u64,
    to: &'a str,
}

/// The pause (see the module docs): returns the rows copied and each
/// sequence's last value, read under the locks.
async fn pause_and_copy(
    src: &mut Client,
    dst: &mut Client,
    p: &Pause<'_>,
    (s, d): (&str, &str),
) -> Result<(u64, Vec<(String, i64)>), Error> {
    let (schema, tables, shard) = (p.schema, p.tables, p.shard);
    let mut attempt = 1;
    let (stx, last_values) = loop {
        let stx = src.transaction().await.map_err(ctx(s, "begin pause"))?;
        match lock_shard(&stx, p).await {
            Ok(v) => break (stx, v),
            Err(e)
                if attempt < PAUSE_ATTEMPTS
                    && e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) =>
            {
                // PostgreSQL chose the pause as the deadlock's victim: its
                // locks are gone with the transaction; start again.
                stx.rollback()
                    .await
                    .map_err(ctx(s, "rolling back the pause"))?;
                attempt += 1;
            }
            Err(e) => return Err(ctx(s, "locking the shard's tables and sequences")(e)),
        }
    };
    let dtx = dst.transaction().await.map_err(ctx(d, "begin delta"))?;
    dtx.batch_execute(&lift_fence_triggers_sql(schema, tables))
        .await
        .map_err(ctx(d, "lifting the copy's fence to copy into it"))?;
    let mut delta = 0;
    let mut touched = Vec::new();
    // Row versions written by the snapshot's oldest running transaction or
    // later (see the module docs): a superset of what the snapshot misses.
    let newer = format!(
        "age(xmin) <= age('{}'::xid)",
        snapshot_xmin(p.snapshot, shard)?
    );
    for t in tables {
        let rel = format!("{schema}.{t}");
        let changed: Vec<i64> = stx
            .query(&format!("SELECT id FROM {rel} WHERE {newer}"), &[])
            .await
            .map_err(ctx(s, "finding changed rows"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if !changed.is_empty() {
            dtx.execute(
                &format!("DELETE FROM {rel} WHERE id = ANY($1)"),
                &[&changed],
            )
            .await
            .map_err(ctx(d, "replacing changed rows"))?;
            delta += copy(
                &stx,
                &dtx,
                &format!("SELECT * FROM {rel} WHERE {newer}"),
                &rel,
                (s, d),
            )
            .await?;
        }
        // Deletions: only when the counts say some happened.
        let q = format!("SELECT count(*) FROM {rel}");
        let a: i64 = stx
            .query_one(&q, &[])
            .await
            .map_err(ctx(s, "counting"))?
            .get(0);
        let b: i64 = dtx
            .query_one(&q, &[])
            .await
            .map_err(ctx(d, "counting"))?
            .get(0);
        if a != b {
            let ids: Vec<i64> = stx
                .query(&format!("SELECT id FROM {rel}"), &[])
                .await
                .map_err(ctx(s, "listing ids"))?
                .iter()
                .map(|r| r.get(0))
                .collect();
            dtx.execute(
                &format!("DELETE FROM {rel} WHERE NOT (id = ANY($1))"),
                &[&ids],
            )
            .await
            .map_err(ctx(d, "removing deleted rows"))?;
        }
        touched.push(changed);
    }
    // The bulk copy was verified against its snapshot: what changed since,
    // and the counts, are all that is left to compare.
    verify(&stx, &dtx, schema, tables, Some(&touched), (s, d), shard).await?;
    dtx.batch_execute(&incoming_fence_sql(schema, tables, shard, s))
        .await
        .map_err(ctx(d, "fencing the copy until it goes live"))?;
    dtx.commit().await.map_err(ctx(d, "commit delta"))?;
    let mut fence = fence_sql(schema, tables, shard, p.to);
    fence.push_str(&fence_sequences_sql(&last_values));
    stx.batch_execute(&fence)
        .await
        .map_err(ctx(s, "fencing the old copy"))?;
    catalog::record_shard(&stx, s, shard, State::Fenced, Some(p.to)).await?;
    stx.commit().await.map_err(ctx(s, "commit fence"))?;
    Ok((delta, last_values))
}

/// Locks the shard's tables `IN EXCLUSIVE MODE`, then its sequences against
/// every `nextval` (`SHARE ROW EXCLUSIVE`, by `ALTER SEQUENCE` to the options
/// they must have anyway), and reads each sequence's last value.
async fn lock_shard(
    stx: &tokio_postgres::Transaction<'_>,
    p: &Pause<'_>,
) -> Result<Vec<(String, i64)>, tokio_postgres::Error> {
    if !p.tables.is_empty() {
        let list: Vec<String> = p
            .tables
            .iter()
            .map(|t| format!("{}.{t}", p.schema))
            .collect();
        stx.batch_execute(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", list.join(", ")))
            .await?;
    }
    let mut last_values = Vec::new();
    for seq in p.seqs {
        stx.batch_execute(&format!("ALTER SEQUENCE {seq} {}", p.options))
            .await?;
        let v: i64 = stx
            .query_one(&format!("SELECT last_value FROM {seq}"), &[])
            .await?
            .get(0);
        last_values.push((seq.clone(), v));
    }
    Ok(last_values)
}

/// SQL that makes the old copy's sequences hand out nothing more: each
/// marked as having handed out its last value `v` (at least 1), with
/// `MAXVALUE v` (and `MINVALUE 0`: PostgreSQL wants it below `MAXVALUE`).
fn fence_sequences_sql(last_values: &[(String, i64)]) -> String {
    last_values
        .iter()
        .map(|(seq, v)| {
            format!("SELECT setval('{seq}', {v});\nALTER SEQUENCE {seq} MINVALUE 0 MAXVALUE {v};\n")
        })
        .collect()
}

/// The snapshot's `xmin` (`pg_current_snapshot()` text is `xmin:xmax:xip,..`)
/// as a 32-bit xid.
fn snapshot_xmin(snapshot: &str, shard: u64) -> Result<u32, Error> {
    snapshot
        .split(':')
        .next()
        .and_then(|x| x.parse::<u64>().ok())
        .map(|x| x as u32) // the xid is the low 32 bits of the xid8
        .ok_or_else(|| Error::Move {
            shard,
            message: format!("unexpected snapshot {snapshot:?}"),
        })
}

/// Relations (other than indexes and TOAST), functions and types in the
/// shard's schema that the topology does not describe, as "kind name".
async fn foreign_objects(
    c: &Client,
    topo: &Topology,
    schema: &str,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let mut relations = vec!["id_seq".to_string()];
    for t in topo.tables() {
        relations.push(t.name.clone());
        relations.push(format!("{}_id_seq", t.name));
    }
    let functions = [
        "next_id",
        "next_id_slow",
        "next_id_refused",
        "next_id_restarted",
        "shardflake_meta",
        "shardflake_moved",
    ];
    let rows = c
        .query(
            "SELECT 'relation ' || c.relname FROM pg_class c
              WHERE c.relnamespace = to_regnamespace($1) AND c.relkind NOT IN ('i', 'I', 't')
                AND NOT (c.relname = ANY($2))
             UNION ALL
             SELECT 'function ' || p.proname FROM pg_proc p
              WHERE p.pronamespace = to_regnamespace($1) AND NOT (p.proname = ANY($3))
             UNION ALL
             SELECT 'type ' || t.typname FROM pg_type t
              WHERE t.typnamespace = to_regnamespace($1) AND t.typrelid = 0 AND t.typcategory <> 'A'
             ORDER BY 1",
            &[&schema, &relations, &&functions[..]],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// SQL that makes the old copy refuse writes and ids with SQLSTATE SF001.
///
/// `schema` and `tables` must be plain identifiers (a validated topology's
/// are). `to` may be any text: it ends up in a string literal that escapes
/// quotes and backslashes, inside a dollar quote whose tag it cannot contain
/// (topologies also refuse such server names).
pub fn fence_sql(schema: &str, tables: &[String], shard: u64, to: &str) -> String {
    fence_with(
        schema,
        tables,
        &format!("shard {shard} ({schema}) has moved to server {to}; reload the topology"),
    )
}

/// SQL that makes a destination's copy refuse writes and ids with SQLSTATE
/// SF001, the refusal of a moved-away copy, until the move makes it live:
/// a row written there would be no row of the shard (the source serves),
/// and the move would drop or overwrite it. The triggers fire `ALWAYS`,
/// also in a session with `session_replication_role = replica`. The move's
/// own copying lifts them inside its transactions
/// ([`lift_fence_triggers_sql`]).
pub fn incoming_fence_sql(schema: &str, tables: &[String], shard: u64, from: &str) -> String {
    let mut out = lift_fence_triggers_sql(schema, tables);
    out.push_str(&fence_with(
        schema,
        tables,
        &format!(
            "shard {shard} ({schema}) is being moved here from server {from} and is not live here yet: write to {from}; reload the topology"
        ),
    ));
    for t in tables {
        out.push_str(&format!(
            "ALTER TABLE {schema}.{t} ENABLE ALWAYS TRIGGER shardflake_moved;\n"
        ));
    }
    out
}

/// SQL that fences for good a live copy that `pg repair --replaces`
/// replaced (`by`: the database that replaced it): the move's fence
/// (`SF001` from every write and `next_id()`, triggers firing `ALWAYS`)
/// and its sequence capped at `last`, its last value read under the
/// sequence's lock, so a statement planned before the fence draws nothing
/// either (`2200H`).
pub(crate) fn replaced_fence_sql(
    schema: &str,
    tables: &[String],
    shard: u64,
    server: &str,
    by: &str,
    (seq, last): (&str, i64),
) -> String {
    let mut out = lift_fence_triggers_sql(schema, tables);
    out.push_str(&fence_with(
        schema,
        tables,
        &format!(
            "shard {shard} ({schema}): this copy of server {server} was replaced by another database ({by}, `shardflake pg repair --replaces {server}`) and makes no id; reload the topology"
        ),
    ));
    for t in tables {
        out.push_str(&format!(
            "ALTER TABLE {schema}.{t} ENABLE ALWAYS TRIGGER shardflake_moved;\n"
        ));
    }
    out.push_str(&fence_sequences_sql(&[(seq.to_string(), last)]));
    out
}

/// SQL that drops the fence's triggers (if there) from the shard's tables.
pub fn lift_fence_triggers_sql(schema: &str, tables: &[String]) -> String {
    tables
        .iter()
        .map(|t| format!("DROP TRIGGER IF EXISTS shardflake_moved ON {schema}.{t};\n"))
        .collect()
}

/// The fence's functions and triggers, raising `message`.
fn fence_with(schema: &str, tables: &[String], message: &str) -> String {
    let msg = format!("E'{}'", message.replace('\\', "\\\\").replace('\'', "''"));
    let body = dollar_quote(&format!(
        "\nBEGIN RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_MOVED}', MESSAGE = {msg}; END "
    ));
    let mut out = format!(
        "CREATE OR REPLACE FUNCTION {schema}.shardflake_moved() RETURNS trigger LANGUAGE plpgsql AS {body};\n\
         CREATE OR REPLACE FUNCTION {schema}.next_id(seq regclass) RETURNS bigint LANGUAGE plpgsql AS {body};\n"
    );
    for t in tables {
        out.push_str(&format!(
            "CREATE TRIGGER shardflake_moved BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {schema}.{t} \
             FOR EACH STATEMENT EXECUTE FUNCTION {schema}.shardflake_moved();\n"
        ));
    }
    out
}

/// `body` in dollar quotes whose tag does not occur in it (nor is formed
/// where the body ends).
fn dollar_quote(body: &str) -> String {
    let mut n = 0u32;
    loop {
        let tag = if n == 0 {
            "$f$".to_string()
        } else {
            format!("$f{n}$")
        };
        let closed = format!("{body}{tag}");
        if closed.find(&tag) == Some(body.len()) {
            return format!("{tag}{closed}");
        }
        n += 1;
    }
}

/// Lifts a fence (only `move-shard --abort`, before the destination went
/// live): the sequence's options back, the triggers dropped, the functions
/// rebuilt for the sequence.
pub(crate) async fn unfence(
    tx: &impl GenericClient,
    topo: &Topology,
    name: &str,
    shard: u64,
) -> Result<(), Error> {
    let schema = topo.schema(shard);
    let options = sql::sequence_options(topo.layout(), topo.sign_bit());
    let mut text = format!(
        "ALTER SEQUENCE {} MINVALUE 1 {options};\n",
        sql::shard_sequence(&schema)
    );
    for t in topo.tables() {
        text.push_str(&format!(
            "DROP TRIGGER IF EXISTS shardflake_moved ON {schema}.{};\n",
            t.name
        ));
    }
    tx.batch_execute(&text)
        .await
        .map_err(ctx(name, "unfencing"))?;
    pg::install_shard(tx, topo, name, shard).await?;
    Ok(())
}

async fn drop_schema(c: &Client, name: &str, schema: &str) -> Result<(), Error> {
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
        .map_err(ctx(name, "dropping a copy"))
}

/// Makes the destination's copy of `shard` (schema, sequence, functions,
/// tables: [`pg::install_shard`]) hold exactly what the source transaction
/// `stx` sees, and verifies it whole: the bulk copy of a fresh move, and the
/// copy again of a fenced source when a move is resumed (any rows an
/// interrupted copy left are emptied first). The copy is left fenced
/// ([`incoming_fence_sql`]) until it goes live. The rows copied.
async fn copy_shard(
    stx: &tokio_postgres::Transaction<'_>,
    dtx: &tokio_postgres::Transaction<'_>,
    topo: &Topology,
    shard: u64,
    tables: &[String],
    (s, d): (&str, &str),
) -> Result<u64, Error> {
    let schema = topo.schema(shard);
    pg::install_shard(dtx, topo, d, shard).await?;
    dtx.batch_execute(&lift_fence_triggers_sql(&schema, tables))
        .await
        .map_err(ctx(d, "lifting the copy's fence to copy into it"))?;
    let mut rows = 0;
    for t in tables {
        let rel = format!("{schema}.{t}");
        dtx.batch_execute(&format!("TRUNCATE {rel}"))
            .await
            .map_err(ctx(d, "emptying the copy"))?;
        rows += copy(stx, dtx, &format!("SELECT * FROM {rel}"), &rel, (s, d)).await?;
    }
    verify(stx, dtx, &schema, tables, None, (s, d), shard).await?;
    dtx.batch_execute(&incoming_fence_sql(&schema, tables, shard, s))
        .await
        .map_err(ctx(d, "fencing the copy until it goes live"))?;
    Ok(rows)
}

/// Copies the rows `select` reads on `from` into `rel` on `to` (binary
/// `COPY`: the same columns on both); the rows copied.
pub(crate) async fn copy(
    from: &tokio_postgres::Transaction<'_>,
    to: &tokio_postgres::Transaction<'_>,
    select: &str,
    rel: &str,
    (s, d): (&str, &str),
) -> Result<u64, Error> {
    let reader = from
        .copy_out(&format!("COPY ({select}) TO STDOUT (FORMAT binary)"))
        .await
        .map_err(ctx(s, "COPY out"))?;
    let sink = to
        .copy_in(&format!("COPY {rel} FROM STDIN (FORMAT binary)"))
        .await
        .map_err(ctx(d, "COPY in"))?;
    let mut reader = pin!(reader);
    let mut sink = pin!(sink);
    while let Some(chunk) = reader.next().await {
        let chunk = chunk.map_err(ctx(s, "COPY out"))?;
        sink.send(chunk).await.map_err(ctx(d, "COPY in"))?;
    }
    sink.as_mut().finish().await.map_err(ctx(d, "COPY in"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reviewer's case: two rows written to the destination directly,
    /// the sums over the rows the pause touched equal: the message names
    /// the extra rows, never "same sums".
    #[test]
    fn a_failed_verification_names_the_rows_that_differ() {
        let src = BTreeMap::from([(1, 10), (2, 20), (3, 30)]);
        let mut dst = src.clone();
        dst.insert(7, 70);
        dst.insert(8, 80);
        assert_eq!(
            describe_differences(&src, &dst),
            "2 rows only on the destination (ids 7, 8)"
        );
        dst.remove(&1);
        dst.insert(2, 21);
        assert_eq!(
            describe_differences(&src, &dst),
            "2 rows only on the destination (ids 7, 8); 1 rows only on the source (ids 1); 1 rows on both with different contents (ids 2)"
        );
        let many: BTreeMap<i64, i64> = (0..12).map(|i| (i, i)).collect();
        assert_eq!(
            describe_differences(&BTreeMap::new(), &many),
            "12 rows only on the destination (ids 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, and 2 more)"
        );
        assert!(describe_differences(&src, &src).contains("no row differs"));
    }
}
