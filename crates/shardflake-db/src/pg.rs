//! `apply` and `check` against real PostgreSQL servers.

use std::fmt;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};

use crate::sql::{self, DEPLOYMENT_SCHEMA};
use crate::topology::{Server, Topology};
use crate::{Error, pg_message};

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

/// Installs every logical shard on its server: schema, sequences, functions
/// and tables. Idempotent; one transaction per server (all or nothing there).
/// Refuses a server whose existing shard functions were built for another
/// layout, shard or sign-bit policy (changing those under live data would
/// break ordering and uniqueness).
pub async fn apply(topo: &Topology) -> Result<Vec<Applied>, Error> {
    let mut out = Vec::new();
    for server in topo.servers() {
        let mut client = connect(server).await?;
        out.push(apply_server(topo, server, &mut client, &server.shards).await?);
    }
    Ok(out)
}

/// Installs `shards` of the topology on one server, in one transaction.
pub async fn apply_server(
    topo: &Topology,
    server: &Server,
    client: &mut Client,
    shards: &[u64],
) -> Result<Applied, Error> {
    let name = server.name.as_str();
    if let Some(message) = too_many_sessions(topo, name, client).await? {
        return Err(Error::Conflict {
            server: name.to_string(),
            message,
        });
    }
    let tx = client.transaction().await.map_err(ctx(name, "begin"))?;
    // Serialise concurrent applies on this server.
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&(sql::LOCK_BASE - 1)])
        .await
        .map_err(ctx(name, "taking the apply lock"))?;
    if let Some(deployed) = deployed_layout(&tx, name).await?
        && deployed != topo.layout().to_string()
    {
        return Err(Error::Conflict {
            server: name.to_string(),
            message: format!(
                "deployed layout is {deployed:?}, topology says {:?}; refusing to change the layout of live shards",
                topo.layout().to_string()
            ),
        });
    }
    tx.batch_execute(&sql::deployment_ddl(topo.layout())?)
        .await
        .map_err(ctx(name, "creating schema shardflake"))?;
    let mut created = 0;
    for &shard in shards {
        let schema = topo.schema(shard);
        let want = sql::shard_meta(topo.layout(), shard, topo.sign_bit());
        if let Some(have) = shard_meta(&tx, name, &schema).await? {
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
        let ddl = sql::shard_ddl(
            topo.layout(),
            &schema,
            shard,
            topo.sign_bit(),
            topo.tables(),
        )?;
        tx.batch_execute(&ddl)
            .await
            .map_err(ctx(name, &format!("installing shard {shard} ({schema})")))?;
        // Sequences made before (or by hand) keep their options under
        // CREATE IF NOT EXISTS: set the ones next_id needs, only where they
        // differ (ALTER SEQUENCE blocks nextval until commit).
        let seqs = sql::shard_sequences(&schema, topo.tables());
        let max = sql::sequence_max(topo.layout(), topo.sign_bit());
        for (seq, _) in odd_sequences(&tx, name, &seqs, max).await? {
            let options = sql::sequence_options(topo.layout(), topo.sign_bit());
            tx.batch_execute(&format!("ALTER SEQUENCE {seq} {options}"))
                .await
                .map_err(ctx(name, &format!("setting the options of {seq}")))?;
        }
        for table in topo.tables() {
            let exists: bool = tx
                .query_one(
                    "SELECT to_regclass($1) IS NOT NULL",
                    &[&format!("{schema}.{}", table.name)],
                )
                .await
                .map_err(ctx(name, "looking up tables"))?
                .get(0);
            if !exists {
                tx.batch_execute(&sql::table_ddl(&schema, table))
                    .await
                    .map_err(ctx(name, &format!("creating {schema}.{}", table.name)))?;
                created += 1;
            }
        }
    }
    tx.commit().await.map_err(ctx(name, "commit"))?;
    Ok(Applied {
        server: name.to_string(),
        shards: shards.len(),
        tables_created: created,
    })
}

/// `next_id`'s no-repeat argument needs fewer sessions than the catch-up gap:
/// client connections plus background workers (which can run SQL too).
/// `Some(problem)` when the server allows too many.
async fn too_many_sessions(
    topo: &Topology,
    name: &str,
    client: &Client,
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

async fn deployed_layout(
    c: &impl tokio_postgres::GenericClient,
    name: &str,
) -> Result<Option<String>, Error> {
    let exists: bool = c
        .query_one(
            "SELECT to_regprocedure($1) IS NOT NULL",
            &[&format!("{DEPLOYMENT_SCHEMA}.layout()")],
        )
        .await
        .map_err(ctx(name, "looking up shardflake.layout()"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let row = c
        .query_one(&format!("SELECT {DEPLOYMENT_SCHEMA}.layout()"), &[])
        .await
        .map_err(ctx(name, "calling shardflake.layout()"))?;
    Ok(Some(row.get(0)))
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

/// Compares what is deployed on every server with the topology. An
/// unreachable server is a drift item, not an error, so one dead server does
/// not hide the state of the others.
pub async fn check(topo: &Topology) -> Result<Vec<Drift>, Error> {
    let mut drift = Vec::new();
    for server in topo.servers() {
        let name = server.name.as_str();
        let d = |shard: Option<u64>, problem: String| Drift {
            server: name.to_string(),
            shard,
            problem,
        };
        let client = match connect(server).await {
            Ok(c) => c,
            Err(e) => {
                drift.push(d(None, format!("unreachable: {e}")));
                continue;
            }
        };
        if let Some(problem) = too_many_sessions(topo, name, &client).await? {
            drift.push(d(None, problem));
        }
        match deployed_layout(&client, name).await? {
            None => drift.push(d(
                None,
                "schema shardflake is missing (run pg apply)".into(),
            )),
            Some(l) if l != topo.layout().to_string() => drift.push(d(
                None,
                format!(
                    "deployment layout is {l:?}, topology says {:?}",
                    topo.layout().to_string()
                ),
            )),
            Some(_) => {}
        }
        let pattern = format!("^{}[0-9]+$", topo.schema_prefix());
        let rows = client
            .query(
                "SELECT nspname FROM pg_namespace WHERE nspname ~ $1",
                &[&pattern],
            )
            .await
            .map_err(ctx(name, "listing schemas"))?;
        let present: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
        for &shard in &server.shards {
            let schema = topo.schema(shard);
            if !present.contains(&schema) {
                drift.push(d(Some(shard), format!("schema {schema} is missing")));
                continue;
            }
            let want = sql::shard_meta(topo.layout(), shard, topo.sign_bit());
            match shard_meta(&client, name, &schema).await? {
                None => drift.push(d(Some(shard), format!("{schema}.next_id() is missing"))),
                Some(have) if have != want => drift.push(d(
                    Some(shard),
                    format!("{schema}.next_id() was built for {have:?}, topology wants {want:?}"),
                )),
                Some(_) => {}
            }
            let expected = sql::next_id_function(topo.layout(), &schema, shard, topo.sign_bit());
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
                        format!("{schema}.next_id(regclass) was edited by hand (body differs from the generated one)"),
                    ));
            }
            let seqs = sql::shard_sequences(&schema, topo.tables());
            let max = sql::sequence_max(topo.layout(), topo.sign_bit());
            for (seq, has) in odd_sequences(&client, name, &seqs, max).await? {
                drift.push(d(
                    Some(shard),
                    format!(
                        "sequence {seq} has {has}, next_id() needs {} (run pg apply)",
                        sql::sequence_options(topo.layout(), topo.sign_bit())
                    ),
                ));
            }
            for t in topo.tables() {
                for (what, rel) in [
                    ("table", format!("{schema}.{}", t.name)),
                    ("sequence", sql::table_sequence(&schema, &t.name)),
                ] {
                    let exists: bool = client
                        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&rel])
                        .await
                        .map_err(ctx(name, "looking up relations"))?
                        .get(0);
                    if !exists {
                        drift.push(d(Some(shard), format!("{what} {rel} is missing")));
                    }
                }
            }
        }
        for schema in &present {
            let shard: u64 = match schema[topo.schema_prefix().len()..].parse() {
                Ok(s) => s,
                Err(_) => continue,
            };
            if !server.shards.contains(&shard) {
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
