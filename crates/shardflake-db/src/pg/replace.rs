//! `pg repair --replaces NAME`: a database restored into another
//! cluster takes the place of the one the deployment records NAME's
//! shards on. The copy it replaces may still be running and taking
//! inserts, and the file no longer reaches it; so the repair reaches it
//! too (`--old-url`), checks that it is the database the deployment
//! records for NAME, and fences it for good in the same deployment-lock
//! section, before the replacement serves and past its last values: two
//! copies never both make ids while both can be reached. Only the
//! operator's word (`--old-copy-gone`) lets a repair replace a copy it
//! does not reach.

use std::collections::{BTreeMap, BTreeSet};

use tokio_postgres::{Client, GenericClient};

use super::catalog::{self, Identity, Owner, ServerView, State};
use super::move_shard::replaced_fence_sql;
use super::topology::Topology;
use super::{Drift, ctx, relation_exists, sql};
use crate::{Error, SQLSTATE_MOVED};

/// How long the repair waits for a lock on an old copy before it refuses,
/// naming what holds it.
pub(crate) const OLD_COPY_LOCK_TIMEOUT: &str = "5s";

/// A server of the file whose URL reaches a database that replaces the
/// one the deployment records its shards on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replacement {
    /// The server's name in the file.
    pub server: String,
    /// The copy it replaces.
    pub old: OldCopy,
}

/// Where the replaced copy is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldCopy {
    /// Reached at this URL (the one the server had before): checked to be
    /// the recorded database, then fenced.
    Url(String),
    /// Not reached: the operator says it is gone for good (the database
    /// destroyed, or its server stopped never to take writes again). It
    /// names the system identifier of every database the deployment
    /// records the server's shards on (`--old-copy-gone SYSID,...`): the
    /// dump's source, and any copy that replaced it since, which may be
    /// live; one left out refuses the repair (`gone_problems`).
    Gone(Vec<i64>),
}

/// The name an old copy goes by in messages.
pub(crate) fn old_name(server: &str) -> String {
    format!("{server} (old copy)")
}

/// Connects to each replaced copy given by URL: `(server, client)`. One
/// that does not answer refuses the repair: it may still make ids.
pub(crate) async fn connect(replaces: &[Replacement]) -> Result<Vec<(String, Client)>, Error> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for r in replaces {
        let OldCopy::Url(url) = &r.old else { continue };
        let who = old_name(&r.server);
        match super::connect_url(&who, url).await {
            Ok(c) => {
                // Every lock wait there bounded: a transaction holding a
                // shard's table (a prepared one outlives its session)
                // must refuse the repair, not hang it.
                c.batch_execute(&format!("SET lock_timeout = '{OLD_COPY_LOCK_TIMEOUT}'"))
                    .await
                    .map_err(ctx(&who, "setting lock_timeout"))?;
                let standby: bool = c
                    .query_one("SELECT pg_is_in_recovery()", &[])
                    .await
                    .map_err(ctx(&who, "reading whether it is in recovery"))?
                    .get(0);
                if standby {
                    problems.push(Drift {
                        server: who,
                        shard: None,
                        problem: format!(
                            "--old-url reaches a standby in recovery (read-only): it makes no id itself and cannot be fenced. The copy that makes {0}'s ids is its primary, or another copy: give that one's url as --old-url (or --old-copy-gone if it is destroyed or its server stopped for good)",
                            r.server
                        ),
                    });
                } else {
                    out.push((r.server.clone(), c));
                }
            }
            Err(e) => problems.push(Drift {
                server: old_name(&r.server),
                shard: None,
                problem: format!(
                    "cannot reach the copy that --old-url gives for {0}: {e}. It may still be running and making ids, which the replacement would make again: reach it. If its server is stopped, starting it is safe (after a restart it makes no id, SQLSTATE SF005, until a repair), but a copy restarted cannot be told from a clone of it: the repair fences it and then asks for --old-copy-gone. Only if that database is destroyed or its server is stopped for good, run again with --old-copy-gone instead of --old-url",
                    r.server
                ),
            }),
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(super::refused("repair", problems))
    }
}

/// Refuses an old copy's URL that reaches a database a server of the
/// file reaches (`clients[i]` is the file's `i`-th server), or another old
/// copy's: it is not the copy being replaced, and the deployment lock,
/// taken there twice, would wait on itself. Read before the lock: which
/// database a URL reaches does not change under it.
pub(crate) async fn distinct(
    topo: &Topology,
    clients: &[Client],
    old: &[(String, Client)],
) -> Result<(), Error> {
    let mut seen = Vec::new();
    for (c, s) in clients.iter().zip(topo.servers()) {
        seen.push((catalog::identity(c, &s.name).await?, s.name.clone()));
    }
    let mut problems = Vec::new();
    for (server, c) in old {
        let identity = catalog::identity(c, &old_name(server)).await?;
        if let Some((_, by)) = seen.iter().find(|(i, _)| *i == identity) {
            problems.push(Drift {
                server: old_name(server),
                shard: None,
                problem: format!(
                    "--old-url reaches {identity}, the database that {by}'s url reaches: give the url that reaches the copy {server} replaces (the url {server} had before)"
                ),
            });
        }
        seen.push((identity, old_name(server)));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(super::refused("repair", problems))
    }
}

fn list(ids: &BTreeSet<Identity>) -> String {
    ids.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why an old copy reached may not be fenced as the one `server`'s
/// database replaces: `old` is its view, `views` the file's servers'. It
/// must be the database the deployment records `server`'s shards on, or
/// a copy that serves them itself (one that replaced that database
/// before); never one already replaced by another than the new copy
/// (that other one may be making ids: it is the one to fence).
pub(crate) fn problems(
    topo: &Topology,
    views: &[ServerView],
    old: &[(String, ServerView)],
) -> Vec<Drift> {
    let mut out = Vec::new();
    for (server, view) in old {
        let Some(new) = topo
            .servers()
            .iter()
            .position(|s| &s.name == server)
            .map(|i| &views[i])
        else {
            continue;
        };
        let recorded = catalog::recorded_identities(views, server);
        let id = catalog::deployment_id(views);
        let problem = if view.deployment.as_ref().map(|d| d.id.as_str()) != id || id.is_none() {
            format!(
                "--old-url reaches {}, which holds no records of this deployment: it is not a copy of {server}; give the url that reaches the database the deployment records {server}'s shards on ({})",
                view.identity,
                list(&recorded)
            )
        } else if view.identity == new.identity {
            format!(
                "--old-url reaches the database {server}'s url reaches ({}): give the url that reaches the copy being replaced ({})",
                view.identity,
                list(&recorded)
            )
        } else if let Some(by) = view.replaced_by.filter(|by| *by != new.identity) {
            format!(
                "--old-url reaches {}, which {by} already replaced (`shardflake pg repair --replaces {server}`) and fenced: that database holds {server}'s shards now and may be making ids; give its url as --old-url, so that it is fenced in turn",
                view.identity
            )
        } else if recorded.contains(&view.identity) || serves_itself(view, server) {
            continue;
        } else if recorded.contains(&new.identity) {
            format!(
                "the deployment already records {server}'s shards on the database its url reaches ({}): there is nothing to replace; run `shardflake pg repair` without --replaces",
                new.identity
            )
        } else {
            format!(
                "--old-url reaches {}, but the deployment records {server}'s shards on {}: it is not the copy this replaces; give the url that reaches that one (or --old-copy-gone if it is destroyed or its server stopped for good)",
                view.identity,
                if recorded.is_empty() {
                    "no database".to_string()
                } else {
                    list(&recorded)
                }
            )
        };
        out.push(Drift {
            server: old_name(server),
            shard: None,
            problem,
        });
    }
    out
}

/// Why `--old-copy-gone` may not replace unreached what it names: it
/// must name the system identifier of each database any server records
/// a replaced server's shards on (but the new one), each told apart in
/// the refusal (the one the new copy was restored from, or one that
/// replaced it since and may be making the ids now), and nothing else.
pub(crate) fn gone_problems(
    topo: &Topology,
    views: &[ServerView],
    replaces: &[Replacement],
) -> Vec<Drift> {
    let mut out = Vec::new();
    let mut all_recorded = BTreeSet::new();
    let mut all_named = BTreeSet::new();
    for r in replaces {
        let OldCopy::Gone(named) = &r.old else {
            continue;
        };
        all_named.extend(named.iter().copied());
        let Some(new) = topo
            .servers()
            .iter()
            .position(|s| s.name == r.server)
            .map(|i| &views[i])
        else {
            continue;
        };
        let server = r.server.as_str();
        // Each database recorded for the server's shards → who records it.
        let mut recorded: BTreeMap<Identity, BTreeSet<&str>> = BTreeMap::new();
        for v in views {
            for o in v.owners.values() {
                if o.server == server && o.identity != new.identity {
                    recorded.entry(o.identity).or_default().insert(&v.name);
                }
            }
        }
        all_recorded.extend(recorded.keys().map(|i| i.system));
        if recorded.keys().all(|i| named.contains(&i.system)) {
            continue;
        }
        let own: BTreeSet<Identity> = new
            .owners
            .values()
            .filter(|o| o.server == server)
            .map(|o| o.identity)
            .collect();
        let listed: Vec<String> = recorded
            .iter()
            .map(|(id, by)| {
                let by = by.iter().copied().collect::<Vec<_>>().join(", ");
                let what = if own.contains(id) {
                    format!("the database {server}'s new one was restored from")
                } else {
                    format!(
                        "a database that replaced it since (`shardflake pg repair --replaces {server}`): it may be live and making {server}'s ids now"
                    )
                };
                format!(
                    "{} (database oid {}), {what}, recorded by {by}",
                    id.system, id.database
                )
            })
            .collect();
        let systems: BTreeSet<String> = recorded.keys().map(|i| i.system.to_string()).collect();
        out.push(Drift {
            server: server.to_string(),
            shard: None,
            problem: format!(
                "--old-copy-gone declares gone, unreached, every database the deployment records {server}'s shards on: {}. Name the system identifier of each one that is destroyed or whose server is stopped for good (--old-copy-gone {}); one still running makes the ids the replacement would make: reach it with --old-url instead",
                listed.join("; "),
                systems.into_iter().collect::<Vec<_>>().join(",")
            ),
        });
    }
    let unknown: Vec<String> = all_named
        .difference(&all_recorded)
        .map(ToString::to_string)
        .collect();
    if !unknown.is_empty() {
        out.push(Drift {
            server: replaces
                .iter()
                .map(|r| r.server.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            shard: None,
            problem: format!(
                "--old-copy-gone names system identifier {}, which no server records for the shards of a server replaced: give only those the refusal lists",
                unknown.join(", ")
            ),
        });
    }
    out
}

/// Whether a copy records itself as the server `server` of the
/// deployment, holding all of that server's shards: a live copy (another
/// restore of the same dump that replaced the recorded one), which a
/// replacement fences as it does the recorded one.
fn serves_itself(view: &ServerView, server: &str) -> bool {
    let mut own = view
        .owners
        .values()
        .filter(|o| o.server == server)
        .peekable();
    view.deployment.as_ref().is_some_and(|d| d.server == server)
        && own.peek().is_some()
        && own.all(|o| o.identity == view.identity)
}

/// `owners` with every shard of a server in `replaces` recorded on the
/// database that server's URL reaches now (`views[i]` is the file's
/// `i`-th server).
pub(crate) fn replaced_owners(
    topo: &Topology,
    views: &[ServerView],
    owners: &BTreeMap<u64, Owner>,
    replaces: &[Replacement],
) -> BTreeMap<u64, Owner> {
    let mut owners = owners.clone();
    for o in owners.values_mut() {
        if let Some(i) = replaces
            .iter()
            .filter(|r| r.server == o.server)
            .find_map(|r| topo.servers().iter().position(|s| s.name == r.server))
        {
            o.identity = views[i].identity;
        }
    }
    owners
}

/// Fences for good every serving shard of an old copy (`view`, read under
/// the deployment lock `tx` holds), records on it the database that
/// replaced it (`by`) and the shards' owners: its last value per shard,
/// which the replacement's sequences are set past. Each shard's tables,
/// then its sequence, are locked first (as a move's pause does): every
/// transaction that drew from it has ended, and no draw passes until the
/// fence commits.
pub(crate) async fn fence(
    tx: &impl GenericClient,
    topo: &Topology,
    view: &ServerView,
    by: Identity,
    owners: &BTreeMap<u64, Owner>,
) -> Result<BTreeMap<u64, i64>, Error> {
    let who = old_name(&view.name);
    tx.batch_execute(catalog::CATALOG_DDL)
        .await
        .map_err(ctx(&who, "creating the deployment records"))?;
    let mut last = BTreeMap::new();
    for (&shard, &(state, _)) in &view.shards {
        if !serving_or_replaced(view, state) {
            continue;
        }
        let schema = topo.schema(shard);
        let seq = sql::shard_sequence(&schema);
        if !relation_exists(tx, &who, &seq).await? {
            continue;
        }
        let mut tables = Vec::new();
        for t in topo.tables() {
            if relation_exists(tx, &who, &format!("{schema}.{}", t.name)).await? {
                tables.push(t.name.clone());
            }
        }
        // The tables before the sequence, as a move's pause: a writer
        // holding a table while it waits for the sequence would deadlock
        // with the fence's triggers. Then a no-op that takes the lock
        // every draw conflicts with.
        for t in &tables {
            let table = format!("{schema}.{t}");
            lock_bounded(
                tx,
                &who,
                &table,
                &format!("LOCK TABLE {table} IN EXCLUSIVE MODE"),
            )
            .await?;
        }
        lock_bounded(
            tx,
            &who,
            &seq,
            &format!("ALTER SEQUENCE {seq} INCREMENT BY 1"),
        )
        .await?;
        let value: i64 = tx
            .query_one(&format!("SELECT last_value FROM {seq}"), &[])
            .await
            .map_err(ctx(&who, &format!("reading {seq}")))?
            .get(0);
        tx.batch_execute(&replaced_fence_sql(
            &schema,
            &tables,
            shard,
            &view.name,
            &by.to_string(),
            (&seq, value),
        ))
        .await
        .map_err(ctx(&who, &format!("fencing shard {shard}")))?;
        // Its own records say so too (no peer: no move goes on from here).
        catalog::record_shard(tx, &who, shard, State::Fenced, None).await?;
        last.insert(shard, value);
    }
    catalog::record_owners(tx, &who, owners).await?;
    catalog::record_replaced(tx, &who, by).await?;
    Ok(last)
}

/// Whether a shard in `state` on the old copy `view` is one it served:
/// live or moving away, or fenced by a replacement (whose fence its own
/// records hold too), so that what a later `--replaces` reads of that
/// copy (its `next_id`, its last values) is what it read before that
/// record was written.
fn serving_or_replaced(view: &ServerView, state: State) -> bool {
    matches!(state, State::Live | State::Moving)
        || (state == State::Fenced && view.replaced_by.is_some())
}

/// Runs `lock` (a statement that locks `rel`) in a savepoint: when it
/// waits past `lock_timeout`, the repair is refused naming what holds
/// `rel` (prepared transactions, sessions), and no lock request is left
/// queued there.
async fn lock_bounded(
    tx: &impl GenericClient,
    who: &str,
    rel: &str,
    lock: &str,
) -> Result<(), Error> {
    tx.batch_execute("SAVEPOINT shardflake_lock")
        .await
        .map_err(ctx(who, "savepoint"))?;
    let err = match tx.batch_execute(lock).await {
        Ok(()) => {
            return tx
                .batch_execute("RELEASE SAVEPOINT shardflake_lock")
                .await
                .map_err(ctx(who, "savepoint"));
        }
        Err(e) => e,
    };
    if err.code() != Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) {
        return Err(ctx(who, &format!("locking {rel}"))(err));
    }
    tx.batch_execute("ROLLBACK TO SAVEPOINT shardflake_lock")
        .await
        .map_err(ctx(who, "savepoint"))?;
    let mut holders: Vec<String> = tx
        .query(
            "SELECT format('prepared transaction %L (prepared %s by %s): COMMIT PREPARED or ROLLBACK PREPARED it', gid, prepared, owner)
               FROM pg_prepared_xacts WHERE database = current_database()",
            &[],
        )
        .await
        .map_err(ctx(who, "reading the prepared transactions"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    holders.extend(
        tx.query(
            "SELECT format('session pid %s (user %s, %s, transaction started %s): %s', a.pid, a.usename, a.state, a.xact_start, left(a.query, 80))
               FROM pg_stat_activity a
              WHERE a.pid IN (SELECT l.pid FROM pg_locks l WHERE l.relation = $1::text::regclass AND l.granted)
                AND a.pid <> pg_backend_pid()",
            &[&rel],
        )
        .await
        .map_err(ctx(who, "reading who holds the lock"))?
        .iter()
        .map(|r| r.get::<_, String>(0)),
    );
    if holders.is_empty() {
        holders.push("nothing now (it ended meanwhile): run the repair again".to_string());
    }
    Err(super::refused(
        "repair",
        vec![Drift {
            server: who.to_string(),
            shard: None,
            problem: format!(
                "{rel} stayed locked for {OLD_COPY_LOCK_TIMEOUT} there, so it could not be fenced; nothing was changed. Held by: {}. End that (or wait for it) and run the repair again",
                holders.join("; ")
            ),
        }],
    ))
}

/// Why an old copy reached (`view`, under the deployment lock) is not
/// the one that makes `server`'s ids, if it is not. The copy that makes
/// them is the one each live shard's `next_id` is vouched for on its
/// current run (apply and repair build the server's start and WAL state
/// in): a physical copy of it (a promoted standby, a base backup started)
/// or the copy restarted carries the same records and identity, but its
/// ids are refused (`SF005`), and the copy that makes them may be running
/// elsewhere. A copy an earlier run fenced (`by`) cannot be told any more.
pub(crate) async fn unvouched(
    tx: &impl GenericClient,
    topo: &Topology,
    server: &str,
    view: &ServerView,
    by: Identity,
) -> Result<Option<Drift>, Error> {
    let who = old_name(server);
    let live: Vec<u64> = view
        .shards
        .iter()
        .filter(|(_, (state, _))| serving_or_replaced(view, *state))
        .map(|(&shard, _)| shard)
        .collect();
    let (mut fenced, mut other_run) = (false, None);
    for &shard in &live {
        let body: Option<String> = tx
            .query_opt(
                "SELECT p.prosrc FROM pg_proc p
                  WHERE p.pronamespace = to_regnamespace($1) AND p.proname = 'next_id' AND p.pronargs = 1",
                &[&topo.schema(shard)],
            )
            .await
            .map_err(ctx(&who, "reading next_id"))?
            .map(|r| r.get(0));
        let Some(body) = body else { continue };
        if body.contains(SQLSTATE_MOVED) && view.replaced_by == Some(by) {
            fenced = true;
        } else if super::restarted(tx, topo, &who, shard).await?.is_some() {
            other_run = Some(vouched_start(&body));
        }
    }
    let problem = if let Some(recorded) = other_run {
        let now = super::server_run(tx, &who).await?;
        let (timeline, recorded_timeline) = timelines(tx, &who).await?;
        format!(
            "--old-url reaches {}, a copy of {server}'s database whose ids are not vouched for its current run (started {}, WAL timeline {timeline}): {server}'s ids were vouched for the run started {} (timeline {}). It is a physical copy (a promoted standby, a base backup started) or that copy restarted since, so the copy that made {server}'s ids was not reached, and it may still be making them. This copy is fenced now (it made no id anyway); {server}'s new database was not made live. Give the url of the copy that makes {server}'s ids as --old-url, or, if that one is destroyed or its server stopped for good (this one, restarted, included), --old-copy-gone",
            view.identity,
            now.started,
            recorded.as_deref().unwrap_or("(not recorded)"),
            recorded_timeline.map_or("(not recorded)".to_string(), |t| t.to_string()),
        )
    } else if fenced {
        format!(
            "--old-url reaches {}, which an earlier `--replaces {server}` already fenced (it makes no id) without making the new database live: whether it was the copy that made {server}'s ids is not known any more. Give the url of the copy that makes {server}'s ids as --old-url; if that is this one (the earlier run failed after its fence), or it is destroyed or its server stopped for good, --old-copy-gone",
            view.identity
        )
    } else {
        return Ok(None);
    };
    Ok(Some(Drift {
        server: who,
        shard: None,
        problem,
    }))
}

/// The start time a `next_id` body is vouched for (see
/// [`sql::ServerRun::changed_sql`]).
fn vouched_start(body: &str) -> Option<String> {
    let rest = body.split("pg_postmaster_start_time() <> '").nth(1)?;
    rest.split('\'').next().map(str::to_string)
}

/// A server's current WAL timeline and the one `apply`/`repair` recorded.
async fn timelines(c: &impl GenericClient, who: &str) -> Result<(i64, Option<i64>), Error> {
    let current = catalog::current_timeline(c, who).await?;
    Ok(match catalog::timeline_changed(c, who).await? {
        Some((recorded, _)) => (current, Some(recorded)),
        None => (current, Some(current)),
    })
}

/// Rows a fenced old copy holds that its replacement lacks: acknowledged
/// inserts made after the dump, only on the old copy now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftBehind {
    /// The server of the file the old copy was.
    pub server: String,
    /// The shard.
    pub shard: u64,
    /// `schema.table`.
    pub table: String,
    /// Its id column (quoted as SQL needs).
    pub column: String,
    /// How many rows.
    pub rows: i64,
    /// Their smallest and largest id.
    pub ids: (i64, i64),
    /// The replacement has no copy of the shard at all (it moved onto the
    /// old copy after the dump).
    pub shard_missing: bool,
}

impl std::fmt::Display for LeftBehind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (t, c, (min, max)) = (&self.table, &self.column, self.ids);
        let copy = format!(
            "copy them over: in psql on the old copy `\\copy (SELECT * FROM {t} WHERE {c} BETWEEN {min} AND {max}) TO 'rows.csv' CSV`, then on the new one `\\copy {t} FROM 'rows.csv' CSV`"
        );
        if self.shard_missing {
            write!(
                f,
                "{} (fenced): shard {}: {t} holds {} row(s) (ids {min}..{max}) and the new database has no shard {} at all (it moved onto the old copy after the dump): run `shardflake pg apply` to create it here (empty), then {copy}",
                old_name(&self.server),
                self.shard,
                self.rows,
                self.shard
            )
        } else {
            write!(
                f,
                "{} (fenced): shard {}: {t} holds {} row(s) the new database lacks (ids {min}..{max}, above its largest: inserts acknowledged after the dump); {copy}",
                old_name(&self.server),
                self.shard,
                self.rows
            )
        }
    }
}

/// The rows each shard of `shards` holds on the fenced old copy (`old`,
/// its tables locked) above the largest id the replacement (`new`) has,
/// table by table; every row where the replacement lacks the table.
pub(crate) async fn left_behind(
    old: &impl GenericClient,
    new: &impl GenericClient,
    topo: &Topology,
    server: &str,
    shards: &[u64],
) -> Result<Vec<LeftBehind>, Error> {
    let who = old_name(server);
    let mut out = Vec::new();
    for &shard in shards {
        let schema = topo.schema(shard);
        let shard_missing = !relation_exists(new, server, &sql::shard_sequence(&schema)).await?;
        for t in topo.tables() {
            let table = format!("{schema}.{}", t.name);
            if !relation_exists(old, &who, &table).await? {
                continue;
            }
            // The column whose default draws from the shard's next_id.
            let Some(column) = old
                .query_opt(
                    "SELECT quote_ident(a.attname) FROM pg_attribute a
                       JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                      WHERE a.attrelid = $1::text::regclass AND pg_get_expr(d.adbin, d.adrelid) LIKE '%next_id%'
                      LIMIT 1",
                    &[&table],
                )
                .await
                .map_err(ctx(&who, &format!("reading {table}'s id column")))?
                .map(|r| r.get::<_, String>(0))
            else {
                continue;
            };
            let above: i64 = if relation_exists(new, server, &table).await? {
                new.query_one(
                    &format!("SELECT coalesce(max({column}), 0) FROM {table}"),
                    &[],
                )
                .await
                .map_err(ctx(server, &format!("reading {table}")))?
                .get(0)
            } else {
                i64::MIN
            };
            let row = old
                .query_one(
                    &format!(
                        "SELECT count(*), coalesce(min({column}), 0), coalesce(max({column}), 0) FROM {table} WHERE {column} > $1"
                    ),
                    &[&above],
                )
                .await
                .map_err(ctx(&who, &format!("reading {table}")))?;
            let rows: i64 = row.get(0);
            if rows > 0 {
                out.push(LeftBehind {
                    server: server.to_string(),
                    shard,
                    table,
                    column: column.clone(),
                    rows,
                    ids: (row.get(1), row.get(2)),
                    shard_missing,
                });
            }
        }
    }
    Ok(out)
}

/// A move between a replaced server and another, never live on its
/// destination, that `--replaces` undid (see `undo_moves`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UndoneMove {
    /// The shard.
    pub shard: u64,
    /// The move's source: the shard stays there, live.
    pub source: String,
    /// The move's destination, whose copy (not live) was dropped.
    pub destination: String,
    /// Rows the dropped copy held above the largest id of the copy that
    /// stays, copied there first: `(table, rows)`.
    pub copied: Vec<(String, u64)>,
    /// The source's copy was fenced (the move had passed its fence): its
    /// fence lifted, and its sequence goes past the repair's clock margin.
    pub unfenced: bool,
}

impl std::fmt::Display for UndoneMove {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, d) = (&self.source, &self.destination);
        write!(
            f,
            "shard {}: its move from {s} to {d}, never live on {d}, is undone: {d}'s copy dropped, the shard stays live on {s}",
            self.shard
        )?;
        for (table, rows) in &self.copied {
            write!(
                f,
                "; {rows} row(s) of {table} that only the dropped copy held (acknowledged on the old copy after the dump) copied to {s} first"
            )?;
        }
        if self.unfenced {
            write!(
                f,
                "; the move had passed its fence: {s}'s fence is lifted and its ids go past every id the lost copy can have made"
            )?;
        }
        Ok(())
    }
}

/// Undoes each unfinished move whose source or destination is a server
/// being replaced (`replaced`), and whose destination is not live, under
/// the deployment lock `txs` hold (`txs[i]` and `views[i]`: the file's
/// `i`-th server): `move-shard` cannot finish or undo it (it refuses the
/// new copy until the replacement, and a file reaching the lost copy
/// reaches nothing). The shard stays live on the source alone, never on
/// two copies, and its sequence goes past the repair's clock margin, past
/// every id the lost copy made:
///
/// - the source replaced: the destination's copy, not live (read on its
///   live server), holds only what the move copied from the lost source;
///   its rows above the new copy's largest id (acknowledged after the
///   dump) are copied to the new copy, then it is dropped. The new copy
///   holds every row either had; fenced (a dump taken after the fence),
///   its fence is lifted;
/// - the destination replaced: the source holds every row the move
///   copied (after its fence it took none); the new copy's copy, if the
///   dump holds one, is dropped and a fenced source unfenced. Past the
///   fence, the lost destination may have gone live: rows written there
///   since were on it alone, and its ids stay below the source's.
///
/// A move whose destination is live (it went live, and the file was not
/// switched) is not undone: that copy holds the rows written since, and
/// dropping it would lose them. It is refused until the file puts the
/// shard on the destination (the switch the move did not write); then
/// the source's copy is fenced, if it is not, and the move is finished.
pub(crate) async fn undo_moves(
    txs: &[tokio_postgres::Transaction<'_>],
    topo: &Topology,
    views: &mut [ServerView],
    replaced: &[String],
) -> Result<(Vec<UndoneMove>, Vec<Drift>), Error> {
    let index = |name: &str| topo.servers().iter().position(|s| s.name == name);
    let shards: BTreeSet<u64> = views
        .iter()
        .flat_map(|v| v.shards.keys().copied())
        .collect();
    let (mut undone, mut problems) = (Vec::new(), Vec::new());
    for shard in shards {
        let held = |state: State| {
            views
                .iter()
                .find(|v| v.state(shard) == Some(state))
                .map(|v| {
                    (
                        v.name.clone(),
                        v.peer(shard).unwrap_or_default().to_string(),
                    )
                })
        };
        let (source, destination) = match (
            held(State::Incoming),
            held(State::Moving),
            held(State::Fenced),
            held(State::Live),
        ) {
            (Some((d, s)), _, _, _) => (s, d),
            (None, Some((s, d)), _, _) => (s, d),
            (None, None, Some((s, d)), live) if live.as_ref().is_none_or(|(l, _)| *l == d) => {
                (s, d)
            }
            _ => continue,
        };
        let source_lost = replaced.contains(&source);
        if !source_lost && !replaced.contains(&destination) {
            continue;
        }
        let (Some(s), Some(d)) = (index(&source), index(&destination)) else {
            continue;
        };
        // A new copy of the source without the shard (it moved there after
        // the dump) has nothing to serve: left to `conflicts`.
        if views[s].state(shard).is_none() {
            continue;
        }
        if views[d].state(shard) == Some(State::Live) {
            // The file already says where it went live: the move is
            // finished but for the source's copy, which must serve no more.
            if topo.server_of(shard)?.name == destination {
                if views[s].state(shard) != Some(State::Fenced) {
                    let tables: Vec<String> =
                        topo.tables().iter().map(|t| t.name.clone()).collect();
                    txs[s]
                        .batch_execute(&super::move_shard::fence_sql(
                            &topo.schema(shard),
                            &tables,
                            shard,
                            &destination,
                        ))
                        .await
                        .map_err(ctx(&source, "fencing the moved-away copy"))?;
                    catalog::record_shard(
                        &txs[s],
                        &source,
                        shard,
                        State::Fenced,
                        Some(&destination),
                    )
                    .await?;
                    views[s]
                        .shards
                        .insert(shard, (State::Fenced, Some(destination.clone())));
                }
                continue;
            }
            let lost = if source_lost { &source } else { &destination };
            // The move may have recorded its generation before it stopped:
            // the file must then say it too, or every command refuses it.
            let generation = catalog::recorded_generation(views)
                .map(|d| d.generation)
                .filter(|&g| g > topo.generation())
                .map(|g| format!(" and set `generation = {g}`"))
                .unwrap_or_default();
            problems.push(Drift {
                server: destination.clone(),
                shard: Some(shard),
                problem: format!(
                    "the move of shard {shard} from {source} to {destination} went live on {destination} (it makes the shard's ids) but did not switch the file, and {lost} is replaced: `--replaces {lost}` does not undo it, which would drop the rows written on {destination} since. Put shard {shard} in {destination}'s list in the file (out of {source}'s){generation}: the switch the move did not write. Then run the repair again"
                ),
            });
            continue;
        }
        let fenced = views[s].state(shard) == Some(State::Fenced);
        if let Some((at, _)) = held(State::Fenced).filter(|(at, _)| *at != source) {
            problems.push(Drift {
                server: at.clone(),
                shard: Some(shard),
                problem: format!(
                    "shard {shard} is fenced on {at} while it moves from {source} to {destination}: the records contradict each other; run `shardflake pg check` and fix them by hand (shardflake.shards on {at})"
                ),
            });
            continue;
        }
        let schema = topo.schema(shard);
        let mut copied = Vec::new();
        if source_lost && views[d].state(shard) == Some(State::Incoming) {
            for t in topo.tables() {
                let rel = format!("{schema}.{}", t.name);
                if !relation_exists(&txs[d], &destination, &rel).await?
                    || !relation_exists(&txs[s], &source, &rel).await?
                {
                    continue;
                }
                let above: i64 = txs[s]
                    .query_one(
                        &format!("SELECT coalesce(max(id), $1) FROM {rel}"),
                        &[&i64::MIN],
                    )
                    .await
                    .map_err(ctx(&source, &format!("reading {rel}")))?
                    .get(0);
                if fenced {
                    // The fence's triggers refuse the copy's own writes.
                    txs[s]
                        .batch_execute(&super::move_shard::lift_fence_triggers_sql(
                            &schema,
                            std::slice::from_ref(&t.name),
                        ))
                        .await
                        .map_err(ctx(&source, "lifting the fence"))?;
                }
                let rows = super::move_shard::copy(
                    &txs[d],
                    &txs[s],
                    &format!("SELECT * FROM {rel} WHERE id > {above}"),
                    &rel,
                    (&destination, &source),
                )
                .await?;
                if rows > 0 {
                    copied.push((rel, rows));
                }
            }
        }
        // The copy that never went live goes, with its record.
        if views[d].state(shard) == Some(State::Incoming) {
            txs[d]
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await
                .map_err(ctx(&destination, "dropping the move's copy"))?;
            catalog::forget_shard(&txs[d], &destination, shard).await?;
            views[d].shards.remove(&shard);
        }
        if fenced {
            super::move_shard::unfence(&txs[s], topo, &source, shard).await?;
        }
        catalog::record_shard(&txs[s], &source, shard, State::Live, None).await?;
        views[s].shards.insert(shard, (State::Live, None));
        undone.push(UndoneMove {
            shard,
            source,
            destination,
            copied,
            unfenced: fenced,
        });
    }
    Ok((undone, problems))
}
