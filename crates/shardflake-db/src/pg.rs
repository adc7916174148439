//! `apply`, `check` and `repair` against real PostgreSQL servers, each
//! reading every server's records first ([`crate::catalog`]).

use std::fmt;
use std::time::Duration;

use tokio_postgres::{Client, GenericClient, NoTls};

use crate::catalog::{self, Deployment, State};
use crate::sql;
use crate::topology::{Server, Topology};
use crate::{Error, SQLSTATE_RESTORED, pg_message};

/// Connects to a server (5 s connect timeout); the connection task runs on
/// the current tokio runtime.
pub async fn connect(server: &Server) -> Result<Client, Error> {
    connect_url(&server.name, &server.url).await
}

/// Connects to a URL, naming the server in errors.
pub async fn connect_url(name: &str, url: &str) -> Result<Client, Error> {
    let err = |source| Error::Connect {
        server: name.to_string(),
        url: url.to_string(),
        source,
    };
    let mut config: tokio_postgres::Config = url.parse().map_err(err)?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    config.application_name("shardflake");
    let (client, connection) = config.connect(NoTls).await.map_err(err)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

pub(crate) fn ctx<'a>(
    server: &'a str,
    context: &'a str,
) -> impl FnOnce(tokio_postgres::Error) -> Error + 'a {
    move |source| Error::Postgres {
        server: server.to_string(),
        context: context.to_string(),
        source,
    }
}

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

/// The lock `pg apply`, `pg repair` and `pg move-shard` hold on a server
/// while they change it.
pub(crate) const APPLY_LOCK: i64 = sql::LOCK_BASE - 1;

/// Connects to every server of the file (all must answer: a plan needs
/// every server's records).
pub(crate) async fn connect_all(topo: &Topology) -> Result<Vec<Client>, Error> {
    let mut clients = Vec::new();
    for server in topo.servers() {
        clients.push(connect(server).await?);
    }
    Ok(clients)
}

/// Installs every logical shard on its server: schema, sequence, functions,
/// tables, and the records of what the deployment is. First, on every
/// server, in one transaction each holding the apply lock: the records are
/// read and the file checked against them ([`catalog::conflicts`]: a shard
/// that lives elsewhere, a fenced copy, another prefix, count, layout or
/// epoch, a restored shard are refused, with what to do instead); only then
/// is anything changed, and the transactions are committed once every
/// server's changes have run. Idempotent.
pub async fn apply(topo: &Topology) -> Result<Vec<Applied>, Error> {
    let mut clients = connect_all(topo).await?;
    let mut txs = Vec::new();
    // The lock in name order on every server (two applies, or an apply and
    // a move, never wait on each other in a circle).
    let mut order: Vec<usize> = (0..clients.len()).collect();
    order.sort_by_key(|&i| topo.servers()[i].name.as_str());
    for (i, c) in clients.iter_mut().enumerate() {
        let name = topo.servers()[i].name.as_str();
        txs.push(c.transaction().await.map_err(ctx(name, "begin"))?);
    }
    for &i in &order {
        let name = topo.servers()[i].name.as_str();
        txs[i]
            .execute("SELECT pg_advisory_xact_lock($1)", &[&APPLY_LOCK])
            .await
            .map_err(ctx(name, "taking the apply lock"))?;
    }
    let mut views = Vec::new();
    let mut problems = Vec::new();
    for (tx, server) in txs.iter().zip(topo.servers()) {
        views.push(catalog::read(tx, &server.name, topo).await?);
        if let Some(p) = too_many_sessions(topo, &server.name, tx).await? {
            problems.push(Drift {
                server: server.name.clone(),
                shard: None,
                problem: p,
            });
        }
    }
    problems.extend(catalog::conflicts(topo, &views));
    for (tx, (server, view)) in txs.iter().zip(topo.servers().iter().zip(&views)) {
        for &shard in &server.shards {
            if view.state(shard) == Some(State::Live)
                && let Some(p) = restored(tx, topo, &server.name, shard).await?
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
                bump_past_clock(tx, topo, name, &seq).await?;
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

/// An error listing every problem found, each with what to do instead.
pub(crate) fn refused(what: &str, problems: Vec<Drift>) -> Error {
    Error::Refused {
        what: what.to_string(),
        problems: problems.iter().map(ToString::to_string).collect(),
    }
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
    tx.batch_execute(&sql::shard_ddl(
        topo.layout(),
        &schema,
        shard,
        topo.sign_bit(),
        sql::SeqOid::Oid(oid),
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

async fn relation_exists(c: &impl GenericClient, name: &str, rel: &str) -> Result<bool, Error> {
    Ok(c.query_one("SELECT to_regclass($1) IS NOT NULL", &[&rel])
        .await
        .map_err(ctx(name, "looking up relations"))?
        .get(0))
}

/// The oid of a relation.
pub(crate) async fn sequence_oid(
    c: &impl GenericClient,
    name: &str,
    seq: &str,
) -> Result<u32, Error> {
    Ok(c.query_one("SELECT $1::text::regclass::oid", &[&seq])
        .await
        .map_err(ctx(name, &format!("looking up {seq}")))?
        .get(0))
}

async fn sequence_unlogged(c: &impl GenericClient, name: &str, seq: &str) -> Result<bool, Error> {
    Ok(c
        .query_one(
            "SELECT coalesce((SELECT relpersistence = 'u' FROM pg_class WHERE oid = to_regclass($1)), false)",
            &[&seq],
        )
        .await
        .map_err(ctx(name, "reading a sequence's persistence"))?
        .get(0))
}

/// The `id` default of `rel` when it draws from `old` (a table made before
/// version 3), as text.
async fn own_sequence_default(
    c: &impl GenericClient,
    name: &str,
    rel: &str,
    old: &str,
) -> Result<Option<String>, Error> {
    let default: Option<String> = c
        .query_opt(
            "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
               JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
              WHERE d.adrelid = $1::text::regclass AND a.attname = 'id'",
            &[&rel],
        )
        .await
        .map_err(ctx(name, "reading a table's id default"))?
        .map(|r| r.get(0));
    let table_seq = old.split_once('.').map_or(old, |(_, s)| s);
    Ok(default.filter(|d| d.contains(&format!("{table_seq}'"))))
}

/// Why a live shard's `next_id` does not fit its sequence (a restore made a
/// new sequence under the old functions), if it does not.
pub(crate) async fn restored(
    c: &impl GenericClient,
    topo: &Topology,
    name: &str,
    shard: u64,
) -> Result<Option<String>, Error> {
    let schema = topo.schema(shard);
    let seq = sql::shard_sequence(&schema);
    let row = c
        .query_opt(
            "SELECT to_regclass($1)::oid, (SELECT p.prosrc FROM pg_proc p
               WHERE p.pronamespace = to_regnamespace($2) AND p.proname = 'next_id' AND p.pronargs = 1)",
            &[&seq, &schema],
        )
        .await
        .map_err(ctx(name, "reading next_id"))?;
    let Some(row) = row else { return Ok(None) };
    let (oid, body): (Option<u32>, Option<String>) = (row.get(0), row.get(1));
    let made_for = body.as_deref().and_then(|b| {
        b.split_once("sequence oid ")
            .and_then(|(_, rest)| rest.split('.').next())
            .and_then(|n| n.trim().parse::<u32>().ok())
    });
    Ok(match (oid, made_for) {
        (Some(oid), Some(made_for)) if oid != made_for => Some(format!(
            "{schema}.next_id() was made for sequence oid {made_for}, but {seq} is oid {oid}: the shard was restored from a dump (or its sequence recreated), and refuses ids (SQLSTATE {SQLSTATE_RESTORED}) until `shardflake pg repair --shard {shard}` moves it past every id it handed out"
        )),
        _ => None,
    })
}

/// Sets a shard's sequence past every value it can have handed out (the
/// server clock plus [`sql::lead_bound`]: no value runs further ahead of
/// the clock); returns its last value before and after.
async fn bump_past_clock(
    c: &impl GenericClient,
    topo: &Topology,
    name: &str,
    seq: &str,
) -> Result<(i64, i64), Error> {
    let l = topo.layout();
    let clock = format!(
        "(((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - {}) / {}) << {})",
        l.epoch_ms(),
        l.tick_ms().max(1),
        l.sequence().bits()
    );
    let row = c
        .query_one(
            &format!("SELECT last_value, greatest(last_value, {clock} + $1::bigint) FROM {seq}"),
            &[&(sql::lead_bound(l) + 1)],
        )
        .await
        .map_err(ctx(name, &format!("reading {seq}")))?;
    let (from, to): (i64, i64) = (row.get(0), row.get(1));
    c.execute(&format!("SELECT setval('{seq}', $1)"), &[&to])
        .await
        .map_err(ctx(name, &format!("setting {seq}")))?;
    Ok((from, to))
}

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

/// After a restore: moves each live shard's sequence (or only `only`'s)
/// past every value it can have handed out before (the server's clock plus
/// [`sql::AHEAD_MS`], since no value runs further ahead of the clock), and
/// rebuilds its functions for the sequence that is there now. Refuses what
/// `apply` refuses except the restore itself. Ids resume dated up to
/// `AHEAD_MS` ahead (new draws wait until the clock is within that).
pub async fn repair(topo: &Topology, only: Option<u64>) -> Result<Vec<Repaired>, Error> {
    if let Some(shard) = only {
        topo.server_of(shard)?;
    }
    let mut clients = connect_all(topo).await?;
    let mut views = Vec::new();
    for (c, server) in clients.iter().zip(topo.servers()) {
        views.push(catalog::read(c, &server.name, topo).await?);
    }
    let problems = catalog::conflicts(topo, &views);
    if !problems.is_empty() {
        return Err(refused("repair", problems));
    }
    let mut out = Vec::new();
    for (c, (server, view)) in clients.iter_mut().zip(topo.servers().iter().zip(&views)) {
        let name = server.name.as_str();
        let tx = c.transaction().await.map_err(ctx(name, "begin"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&APPLY_LOCK])
            .await
            .map_err(ctx(name, "taking the apply lock"))?;
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
            let (from, to) = bump_past_clock(&tx, topo, name, &seq).await?;
            install_shard(&tx, topo, name, shard).await?;
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
            catalog::record_timeline(&tx, name, true).await?;
        }
        tx.commit().await.map_err(ctx(name, "commit"))?;
    }
    Ok(out)
}

/// `next_id`'s no-repeat argument needs fewer sessions than the catch-up gap:
/// client connections plus background workers (which can run SQL too).
/// `Some(problem)` when the server allows too many.
async fn too_many_sessions(
    topo: &Topology,
    name: &str,
    client: &impl GenericClient,
) -> Result<Option<String>, Error> {
    let row = client
        .query_one(
            "SELECT current_setting('max_connections')::bigint, current_setting('max_worker_processes')::bigint",
            &[],
        )
        .await
        .map_err(ctx(name, "reading max_connections"))?;
    let (conns, workers): (i64, i64) = (row.get(0), row.get(1));
    let gap = sql::catch_up_gap(topo.layout());
    if conns.saturating_add(workers) < gap {
        return Ok(None);
    }
    Ok(Some(format!(
        "max_connections = {conns} + max_worker_processes = {workers}, but next_id() for layout {} guarantees no repeated id only with fewer than {gap} sessions; lower them (use a pooler) or widen the sequence field",
        topo.layout().name()
    )))
}

/// Sequences among `seqs` (schema-qualified) whose options differ from what
/// `next_id` needs ([`sql::sequence_options`]), each with what it has.
async fn odd_sequences(
    c: &impl tokio_postgres::GenericClient,
    name: &str,
    seqs: &[String],
    max: i64,
) -> Result<Vec<(String, String)>, Error> {
    let rows = c
        .query(
            "SELECT schemaname || '.' || sequencename, increment_by, cache_size, cycle, max_value \
             FROM pg_sequences WHERE schemaname || '.' || sequencename = ANY($1) \
             AND (increment_by <> 1 OR cache_size <> 1 OR cycle OR max_value <> $2) ORDER BY 1",
            &[&seqs, &max],
        )
        .await
        .map_err(ctx(name, "reading sequence options"))?;
    Ok(rows
        .iter()
        .map(|r| {
            let (inc, cache, cycle, maxv): (i64, i64, bool, i64) =
                (r.get(1), r.get(2), r.get(3), r.get(4));
            (
                r.get(0),
                format!(
                    "INCREMENT {inc} CACHE {cache} {}CYCLE MAXVALUE {maxv}",
                    if cycle { "" } else { "NO " }
                ),
            )
        })
        .collect())
}

/// `shardflake_meta()` text without its leading generator version.
fn meta_without_version(meta: &str) -> &str {
    meta.split_once("; ").map_or(meta, |(_, rest)| rest)
}

/// `shardflake_meta()` of a schema, if the function exists.
pub async fn shard_meta(
    c: &impl tokio_postgres::GenericClient,
    name: &str,
    schema: &str,
) -> Result<Option<String>, Error> {
    let exists: bool = c
        .query_one(
            "SELECT to_regprocedure($1) IS NOT NULL",
            &[&format!("{schema}.shardflake_meta()")],
        )
        .await
        .map_err(ctx(name, "looking up shardflake_meta()"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = c
        .query_one(&format!("SELECT {schema}.shardflake_meta()"), &[])
        .await
        .map_err(ctx(name, "calling shardflake_meta()"))?;
    Ok(Some(row.get(0)))
}

/// One difference between a server and the topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drift {
    /// Server name.
    pub server: String,
    /// Logical shard, when the problem is about one.
    pub shard: Option<u64>,
    /// What differs.
    pub problem: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.shard {
            Some(s) => write!(f, "{}: shard {s}: {}", self.server, self.problem),
            None => write!(f, "{}: {}", self.server, self.problem),
        }
    }
}

/// Compares what is deployed on every server with the topology: first the
/// records against the file ([`catalog::conflicts`]: also a shard fenced
/// everywhere, a move that did not finish, shard schemas of any prefix),
/// then each live shard's functions, sequence and tables. An unreachable
/// server is a drift item, not an error, so one dead server does not hide
/// the state of the others.
pub async fn check(topo: &Topology) -> Result<Vec<Drift>, Error> {
    let mut drift = Vec::new();
    let mut clients = Vec::new();
    let mut views = Vec::new();
    for server in topo.servers() {
        match connect(server).await {
            Ok(c) => {
                views.push(catalog::read(&c, &server.name, topo).await?);
                clients.push((server, c));
            }
            Err(e) => drift.push(Drift {
                server: server.name.clone(),
                shard: None,
                problem: format!("unreachable: {e}"),
            }),
        }
    }
    drift.extend(catalog::conflicts(topo, &views));
    for ((server, client), view) in clients.iter().zip(&views) {
        let name = server.name.as_str();
        let d = |shard: Option<u64>, problem: String| Drift {
            server: name.to_string(),
            shard,
            problem,
        };
        if let Some(problem) = too_many_sessions(topo, name, client).await? {
            drift.push(d(None, problem));
        }
        if view.deployment.is_none() {
            drift.push(d(
                None,
                "holds no deployment record (schema shardflake): run pg apply".into(),
            ));
        }
        if let Some((recorded, current)) = catalog::timeline_changed(client, name).await? {
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
        for &shard in &server.shards {
            let schema = topo.schema(shard);
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
                None if views.iter().any(|v| v.state(shard).is_some()) => continue,
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
            if let Some(problem) = restored(client, topo, name, shard).await? {
                drift.push(d(Some(shard), problem));
            } else if let Ok(oid) = sequence_oid(client, name, &seq).await {
                let expected = sql::next_id_function(
                    topo.layout(),
                    &schema,
                    shard,
                    topo.sign_bit(),
                    sql::SeqOid::Oid(oid),
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

/// Runs a statement on a server by URL, for tools and tests.
pub async fn execute(name: &str, url: &str, sql: &str) -> Result<(), Error> {
    let c = connect_url(name, url).await?;
    c.batch_execute(sql).await.map_err(|e| Error::Postgres {
        server: name.to_string(),
        context: format!("running {sql:?}: {}", pg_message(&e)),
        source: e,
    })
}
