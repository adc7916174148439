//! `pg apply`: check every server's records against the file, then create
//! each shard's schema, sequence, functions and tables, all or nothing.

use super::catalog::{self, Deployment, State};
use super::*;
use std::collections::BTreeMap;

/// What `apply` did on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// Server name.
    pub server: String,
    /// Logical shards installed or refreshed.
    pub shards: usize,
    /// Tables created (0 on a re-run).
    pub tables_created: usize,
}

impl fmt::Display for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} shards, {} tables created",
            self.server, self.shards, self.tables_created
        )
    }
}

/// Installs every logical shard on its server: schema, sequence, functions,
/// tables, and the records of what the deployment is. First, on every
/// server, in one transaction each holding the apply lock: the records are
/// read and the file checked against them ([`catalog::conflicts`]: a shard
/// that lives elsewhere, a fenced copy, another prefix, count, layout or
/// epoch, a restored shard are refused, with what to do instead); only then
/// is anything changed, and the transactions are committed once every
/// server's changes have run. Idempotent. A server of the file without
/// records, in a deployment that exists, is refused: see [`apply_adding`].
pub async fn apply(topo: &Topology) -> Result<Vec<Applied>, Error> {
    apply_adding(topo, &[]).await
}

/// [`apply`], with the servers named in `added` taken as new: each may hold
/// no records yet and gets them; it must hold no shard the deployment
/// already has (shards are moved to it), and must not be a name the
/// deployment records shards on (its URL would reach another database than
/// the one holding them): [`catalog::unrecorded_servers`]. A named server
/// that already records the deployment is applied as any other.
pub async fn apply_adding(topo: &Topology, added: &[String]) -> Result<Vec<Applied>, Error> {
    apply_with(
        topo,
        &ApplyOptions {
            new_servers: added.to_vec(),
            new_deployment: false,
        },
    )
    .await
}

/// What the operator says is new to `pg apply`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// Servers added to the file, with no records yet (`--new-server`):
    /// see [`apply_adding`].
    pub new_servers: Vec<String>,
    /// The file is a new deployment, separate from any that another
    /// database of a server's PostgreSQL cluster records
    /// (`--new-deployment`): without it, such a first apply is refused as a
    /// URL changed to another database ([`catalog::edited_urls`]).
    pub new_deployment: bool,
}

/// [`apply`] with what the operator says is new.
pub async fn apply_with(topo: &Topology, opts: &ApplyOptions) -> Result<Vec<Applied>, Error> {
    let added = &opts.new_servers[..];
    // Before any connection: a layout the SQL cannot make changes nothing.
    sql::check(topo.layout())?;
    for name in added {
        if topo.servers().iter().all(|s| &s.name != name) {
            return Err(TopologyError::UnknownServer(name.clone()).into());
        }
    }
    let mut clients = connect_all(topo).await?;
    let mut txs = Vec::new();
    for (i, c) in clients.iter_mut().enumerate() {
        let name = topo.servers()[i].name.as_str();
        txs.push(c.transaction().await.map_err(ctx(name, "begin"))?);
    }
    lock_deployment(&txs, &server_names(topo), Lock::Transaction).await?;
    let mut views = Vec::new();
    let mut problems = Vec::new();
    for (tx, server) in txs.iter().zip(topo.servers()) {
        views.push(catalog::read(tx, &server.name, topo).await?);
        // Warnings, as `mysql apply` warns: `pg check` fails on the first.
        let settings = durability(tx, &server.name).await?;
        for warning in [settings.commits_lost_by_a_crash, settings.fsync_off]
            .into_iter()
            .flatten()
        {
            tracing::warn!(server = server.name.as_str(), "{warning}");
        }
        let (offset, uncertainty) = clock_offset(tx, &server.name).await?;
        if let Some(problem) = clock_problem(offset, uncertainty) {
            problems.push(Drift {
                server: server.name.clone(),
                shard: None,
                problem,
            });
        }
        if let Some(p) = too_many_sessions(topo, &server.name, tx).await? {
            problems.push(Drift {
                server: server.name.clone(),
                shard: None,
                problem: p,
            });
        }
    }
    problems.extend(catalog::conflicts(topo, &views, added));
    problems.extend(catalog::replaced_copies(&views, &[]));
    // No server of the file records a deployment: look for one in the
    // other databases of each server's cluster (a URL changed to another
    // database of the same cluster), unless the operator says it is new.
    if catalog::deployment_id(&views).is_none() && !opts.new_deployment {
        let mut siblings = Vec::new();
        for (tx, server) in txs.iter().zip(topo.servers()) {
            siblings.push(catalog::siblings(tx, &server.name, &server.url).await?);
        }
        problems.extend(catalog::edited_urls(&views, &siblings));
    }
    let (timelines, recorded) = timelines(&txs, topo).await?;
    problems.extend(catalog::older_timelines(&views, &timelines, &recorded));
    let timelines: Vec<_> = views.iter().map(|v| v.identity).zip(timelines).collect();
    for (tx, (server, view)) in txs.iter().zip(topo.servers().iter().zip(&views)) {
        for &shard in &server.shards {
            if view.state(shard) != Some(State::Live) {
                continue;
            }
            // Both are lifted by rebuilding the functions: only repair may.
            for p in [
                restored(tx, topo, &server.name, shard).await?,
                restarted(tx, topo, &server.name, shard)
                    .await?
                    .map(|p| format!("{p}; pg apply does not lift this")),
            ]
            .into_iter()
            .flatten()
            {
                problems.push(Drift {
                    server: server.name.clone(),
                    shard: Some(shard),
                    problem: p,
                });
            }
        }
    }
    if !problems.is_empty() {
        return Err(refused("apply", problems));
    }
    let id = match catalog::deployment_id(&views) {
        Some(id) => id.to_string(),
        None => txs[0]
            .query_one("SELECT gen_random_uuid()::text", &[])
            .await
            .map_err(ctx(&topo.servers()[0].name, "making a deployment id"))?
            .get(0),
    };
    // Every shard's server, by name and by the database its URL reaches:
    // what a later apply tells an edited URL from a new server by.
    let owners: BTreeMap<u64, catalog::Owner> = topo
        .servers()
        .iter()
        .zip(&views)
        .flat_map(|(server, view)| {
            server.shards.iter().map(|&shard| {
                (
                    shard,
                    catalog::Owner {
                        server: server.name.clone(),
                        identity: view.identity,
                    },
                )
            })
        })
        .collect();
    let mut out = Vec::new();
    for (tx, server) in txs.iter().zip(topo.servers()) {
        let name = server.name.as_str();
        tx.batch_execute(&sql::deployment_ddl(topo.layout())?)
            .await
            .map_err(ctx(name, "creating schema shardflake"))?;
        tx.batch_execute(catalog::CATALOG_DDL)
            .await
            .map_err(ctx(name, "creating the deployment records"))?;
        catalog::record_deployment(tx, &Deployment::of(topo, &id, name)).await?;
        catalog::record_timeline(tx, name, false).await?;
        catalog::record_timelines(tx, name, &timelines).await?;
        catalog::record_owners(tx, name, &owners).await?;
        let mut created = 0;
        let view = &views[out.len()];
        for &shard in &server.shards {
            let seq = sql::shard_sequence(&topo.schema(shard));
            let lost =
                view.state(shard) == Some(State::Live) && !relation_exists(tx, name, &seq).await?;
            created += install_shard(tx, topo, name, shard).await?;
            if lost {
                // Recorded live, its sequence gone (dropped): the new one
                // starts past every id the old one can have handed out.
                tracing::warn!(
                    server = name,
                    shard,
                    "recreating a dropped live shard past the clock"
                );
                bump_past_clock(tx, topo, name, &seq, 0).await?;
            }
            catalog::record_shard(tx, name, shard, State::Live, None).await?;
        }
        out.push(Applied {
            server: name.to_string(),
            shards: server.shards.len(),
            tables_created: created,
        });
    }
    // Every server's changes ran: commit them all. A commit can still fail
    // (the server dies now): then those before it are in, and a re-run
    // completes the rest (every step is idempotent).
    let mut committed = Vec::new();
    for (tx, server) in txs.into_iter().zip(topo.servers()) {
        if let Err(e) = tx.commit().await {
            return Err(Error::Conflict {
                server: server.name.clone(),
                message: format!(
                    "commit failed after {} committed: {}; re-run apply once the server is back",
                    if committed.is_empty() {
                        "no other server".to_string()
                    } else {
                        committed.join(", ")
                    },
                    pg_message(&e)
                ),
            });
        }
        committed.push(server.name.clone());
    }
    Ok(out)
}

/// Installs or refreshes one shard on a server, inside the caller's
/// transaction: schema, sequence (with the options `next_id` needs),
/// functions (for the sequence's oid), tables, and a table made by an
/// earlier version with a sequence of its own moved onto the shard's one.
/// Returns the tables created. Refuses a schema whose functions were built
/// for another layout, shard or sign-bit policy.
pub(crate) async fn install_shard(
    tx: &impl GenericClient,
    topo: &Topology,
    name: &str,
    shard: u64,
) -> Result<usize, Error> {
    let schema = topo.schema(shard);
    let want = sql::shard_meta(topo.layout(), shard, topo.sign_bit());
    if let Some(have) = shard_meta(tx, name, &schema).await? {
        // Another generator version of the same shard is rebuilt in place.
        if meta_without_version(&have) != meta_without_version(&want) {
            return Err(Error::Conflict {
                server: name.to_string(),
                message: format!(
                    "schema {schema} holds functions built for {have:?}, topology wants {want:?}; refusing to rebuild a live shard"
                ),
            });
        }
    }
    tx.batch_execute(&sql::shard_schema_ddl(
        topo.layout(),
        &schema,
        topo.sign_bit(),
    ))
    .await
    .map_err(ctx(name, &format!("creating shard {shard} ({schema})")))?;
    // A sequence made before (or by hand) keeps its options under CREATE IF
    // NOT EXISTS: set the ones next_id needs, only where they differ
    // (ALTER SEQUENCE blocks nextval until commit).
    let seq = sql::shard_sequence(&schema);
    let max = sql::sequence_max(topo.layout(), topo.sign_bit());
    let options = sql::sequence_options(topo.layout(), topo.sign_bit());
    if !odd_sequences(tx, name, std::slice::from_ref(&seq), max)
        .await?
        .is_empty()
    {
        tx.batch_execute(&format!("ALTER SEQUENCE {seq} {options}"))
            .await
            .map_err(ctx(name, &format!("setting the options of {seq}")))?;
    }
    if sequence_unlogged(tx, name, &seq).await? {
        tx.batch_execute(&format!("ALTER SEQUENCE {seq} SET LOGGED"))
            .await
            .map_err(ctx(name, &format!("making {seq} logged")))?;
    }
    let oid = sequence_oid(tx, name, &seq).await?;
    let run = server_run(tx, name).await?;
    tx.batch_execute(&sql::shard_ddl(
        topo.layout(),
        &schema,
        shard,
        topo.sign_bit(),
        sql::SeqOid::Vouched { oid, run },
    )?)
    .await
    .map_err(ctx(name, &format!("installing shard {shard} ({schema})")))?;
    let mut created = 0;
    for table in topo.tables() {
        let rel = format!("{schema}.{}", table.name);
        let exists: bool = tx
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&rel])
            .await
            .map_err(ctx(name, "looking up tables"))?
            .get(0);
        if !exists {
            tx.batch_execute(&sql::table_ddl(&schema, table))
                .await
                .map_err(ctx(name, &format!("creating {rel}")))?;
            created += 1;
            continue;
        }
        // Before version 3 each table drew from a sequence of its own,
        // whose values repeat the shard's: continue on the shard's sequence
        // past both, and fence the old one (as a move fences a source).
        let old = sql::table_sequence(&schema, &table.name);
        if let Some(default) = own_sequence_default(tx, name, &rel, &old).await? {
            tracing::info!(server = name, table = %rel, %default, "moving a table onto its shard's sequence");
            tx.batch_execute(&format!("ALTER SEQUENCE {old} {options}"))
                .await
                .map_err(ctx(name, &format!("locking {old}")))?;
            let last: i64 = tx
                .query_one(&format!("SELECT last_value FROM {old}"), &[])
                .await
                .map_err(ctx(name, &format!("reading {old}")))?
                .get(0);
            tx.batch_execute(&format!(
                "SELECT setval('{seq}', greatest({last}, (SELECT last_value FROM {seq})));
                 SELECT setval('{old}', {last});
                 ALTER SEQUENCE {old} MINVALUE 0 MAXVALUE {last};
                 ALTER TABLE {rel} ALTER COLUMN id SET DEFAULT {};",
                sql::next_id_call(&schema)
            ))
            .await
            .map_err(ctx(name, &format!("moving {rel} onto {seq}")))?;
        }
    }
    Ok(created)
}
