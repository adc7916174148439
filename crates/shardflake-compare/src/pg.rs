//! PostgreSQL: the sandbox schema, one table per scheme, its statements.
//!
//! Every batch is one statement over arrays (`INSERT ... SELECT FROM
//! unnest($1::bigint[], ...)`), `ON CONFLICT DO NOTHING` so that a repeated id
//! is counted (rows sent less rows stored) instead of failing the run.

use std::sync::Arc;
use std::time::Duration;

use shardflake_db::pg::{SignBit, sql};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Statement};
use uuid::Uuid;

use crate::error::CompareError;
use crate::ids::{ClientIds, Ids, int_key};
use crate::load::{self, Writer, Written, bounded};
use crate::report::{SchemeResult, ServerReport};
use crate::scheme::{Scheme, ServerKind};
use crate::{Options, Progress};

const SERVER: &str = "PostgreSQL";
use crate::SANDBOX_MARK as MARK;
/// Every row's payload, the same for every scheme.
pub(crate) const BODY: &str = "sixteen bytes ok";
/// Every row's shard key: one user, as in Instagram's example (user 31341),
/// so that ids of sharded layouts come in order per connection and the
/// seed's procedure meets its race (callers on one shard in one millisecond).
pub(crate) const SHARD_KEY: i64 = 31341;

fn db(what: &str) -> impl FnOnce(tokio_postgres::Error) -> CompareError + '_ {
    move |e| CompareError::Db {
        server: SERVER,
        what: what.to_string(),
        message: shardflake_db::pg_message(&e),
    }
}

async fn connect(url: &str, opts: &Options) -> Result<Client, CompareError> {
    let err = |e: tokio_postgres::Error| CompareError::Connect {
        server: SERVER,
        url: url.to_string(),
        message: shardflake_db::pg_message(&e),
    };
    let mut config: tokio_postgres::Config = url.parse().map_err(err)?;
    config.connect_timeout(opts.timeout.min(Duration::from_secs(10)));
    config.application_name("shardflake compare");
    let (client, connection) = bounded(SERVER, "connecting", opts.timeout, async {
        config.connect(NoTls).await.map_err(err)
    })
    .await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    // The server stops a statement too, should this client be gone.
    let ms = opts.timeout.as_millis();
    client
        .batch_execute(&format!(
            "SET statement_timeout = {ms}; SET lock_timeout = {ms}"
        ))
        .await
        .map_err(db("setting the statement timeout"))?;
    Ok(client)
}

pub(crate) async fn run(
    url: &str,
    opts: &Options,
    progress: Arc<dyn Progress>,
) -> Result<ServerReport, CompareError> {
    let t = opts.timeout;
    let control = connect(url, opts).await?;
    let version: String = bounded(SERVER, "reading the version", t, async {
        Ok(control
            .query_one("SHOW server_version", &[])
            .await
            .map_err(db("reading the version"))?
            .get(0))
    })
    .await?;
    let schema = opts.schema.as_str();
    // Held by this connection until it closes: one run per sandbox.
    let locked: bool = bounded(SERVER, "taking the sandbox's lock", t, async {
        Ok(control
            .query_one(
                "SELECT pg_try_advisory_lock(hashtextextended($1, 0))",
                &[&crate::sandbox_lock(schema)],
            )
            .await
            .map_err(db("taking the sandbox's lock"))?
            .get(0))
    })
    .await?;
    if !locked {
        return Err(CompareError::Busy {
            server: SERVER,
            name: schema.to_string(),
        });
    }
    bounded(
        SERVER,
        "making the sandbox",
        t,
        make_sandbox(&control, schema),
    )
    .await?;
    let results = run_schemes(url, opts, &control, &progress).await;
    progress.phase("dropping the sandbox");
    let dropped = bounded(SERVER, "dropping the sandbox", t, async {
        control
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await
            .map_err(db("dropping the sandbox"))
    })
    .await;
    if let Err(e) = &dropped {
        tracing::error!(error = %e, "the sandbox schema {schema} is left behind: drop it with DROP SCHEMA {schema} CASCADE");
    }
    // Released here rather than when the connection task ends.
    let _ = control
        .execute(
            "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
            &[&crate::sandbox_lock(schema)],
        )
        .await;
    Ok(ServerReport {
        kind: ServerKind::Postgres,
        version,
        sandbox: schema.to_string(),
        dropped: dropped.is_ok(),
        results: results?,
    })
}

async fn make_sandbox(control: &Client, schema: &str) -> Result<(), CompareError> {
    let found = control
        .query_opt(
            "SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1",
            &[&schema],
        )
        .await
        .map_err(db("looking for the sandbox"))?;
    if let Some(row) = found {
        let comment: Option<String> = row.get(0);
        if comment.as_deref() != Some(MARK) {
            return Err(CompareError::NotOurs {
                server: SERVER,
                kind: "schema",
                name: schema.into(),
            });
        }
        tracing::warn!(
            "dropping schema {schema}, left by an earlier shardflake compare that did not finish"
        );
        control
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .map_err(db("dropping an earlier run's sandbox"))?;
    }
    control
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; COMMENT ON SCHEMA {schema} IS '{MARK}'"
        ))
        .await
        .map_err(db("making the sandbox"))
}

async fn run_schemes(
    url: &str,
    opts: &Options,
    control: &Client,
    progress: &Arc<dyn Progress>,
) -> Result<Vec<SchemeResult>, CompareError> {
    let mut results: Vec<SchemeResult> = Vec::new();
    // Warm up: the baseline, unmeasured, so that the scheme measured first
    // does not pay for a cold server (caches, WAL files) alone.
    let (warm, mut warmed) = opts.warm_up(ServerKind::Postgres);
    progress.phase("warming the server up (unmeasured)");
    if let Err(e) = run_scheme(url, &warm, control, &crate::silent(), &mut warmed).await {
        tracing::warn!(error = %e, "warming up failed");
    }
    for &scheme in Scheme::for_server(ServerKind::Postgres) {
        if !opts.wants(scheme) || opts.cancelled() {
            continue;
        }
        let mut r = SchemeResult::new(scheme, ServerKind::Postgres);
        if let Err(e) = run_scheme(url, opts, control, progress, &mut r).await {
            tracing::warn!(scheme = scheme.name(), error = %e, "scheme failed");
            r.error = Some(e.to_string());
        }
        progress.finish();
        results.push(r);
    }
    crate::report::against_baseline(&mut results);
    Ok(results)
}

/// Why `scheme` cannot run on this server, if it cannot.
async fn skip_reason(control: &Client, scheme: Scheme) -> Result<Option<String>, CompareError> {
    Ok(match scheme {
        Scheme::NextId => {
            let layout = instagram()?;
            let gap = sql::catch_up_gap(&layout);
            let sessions: i64 = control
                .query_one(
                    "SELECT current_setting('max_connections')::bigint + current_setting('max_worker_processes')::bigint",
                    &[],
                )
                .await
                .map_err(db("reading max_connections"))?
                .get(0);
            (sessions >= gap).then(|| {
                format!(
                    "the server allows {sessions} sessions (max_connections + max_worker_processes); \
                     next_id's catch-up needs fewer than {gap} (pg apply refuses this server too)"
                )
            })
        }
        Scheme::ServerUuid => {
            let has: bool = control
                .query_one(
                    "SELECT to_regprocedure('gen_random_uuid()') IS NOT NULL",
                    &[],
                )
                .await
                .map_err(db("looking for gen_random_uuid()"))?
                .get(0);
            (!has).then(|| "gen_random_uuid() needs PostgreSQL 13 or later".to_string())
        }
        _ => None,
    })
}

fn instagram() -> Result<shardflake::Layout, CompareError> {
    shardflake::preset::by_name("instagram").map_err(|e| CompareError::Invalid(e.to_string()))
}

async fn run_scheme(
    url: &str,
    opts: &Options,
    control: &Client,
    progress: &Arc<dyn Progress>,
    r: &mut SchemeResult,
) -> Result<(), CompareError> {
    let t = opts.timeout;
    let scheme = r.scheme;
    if let Some(why) = bounded(
        SERVER,
        "checking the server",
        t,
        skip_reason(control, scheme),
    )
    .await?
    {
        r.skipped = Some(why);
        return Ok(());
    }
    let table = format!("{}.t_{}", opts.schema, scheme.name());
    progress.phase(&format!("{}: creating {table}", r.label));
    bounded(SERVER, "creating the table", t, async {
        if scheme == Scheme::NextId {
            install_next_id(control, &opts.schema).await?;
        }
        control
            .batch_execute(&ddl(scheme, &opts.schema, &table)?)
            .await
            .map_err(db("creating the table"))
    })
    .await?;
    let client_ids = ClientIds::of(scheme)?.map(Arc::new);
    let segment = Arc::new(SegmentBuf {
        range: Mutex::new((1, 0)),
        step: opts.segment_step as i64,
    });
    let mut writers = Vec::with_capacity(opts.clients);
    for _ in 0..opts.clients {
        let client = connect(url, opts).await?;
        writers.push(
            bounded(
                SERVER,
                "preparing the statements",
                t,
                PgWriter::new(
                    client,
                    scheme,
                    &opts.schema,
                    &table,
                    client_ids.clone(),
                    segment.clone(),
                    t,
                ),
            )
            .await?,
        );
    }
    let writers = load::generate_and_insert(
        writers,
        client_ids.as_ref(),
        ServerKind::Postgres,
        opts,
        progress,
        r,
    )
    .await?;
    progress.phase(&format!("{}: measuring", r.label));
    (r.table_bytes, r.index_bytes) =
        bounded(SERVER, "measuring", t, sizes(control, &table)).await?;
    if opts.cancelled() {
        return Ok(());
    }
    progress.phase(&format!(
        "{}: deleting ~10%, vacuuming, inserting as many",
        r.label
    ));
    let deleted = bounded(SERVER, "deleting ~10% of the rows", t, async {
        let n = control
            .execute(&format!("DELETE FROM {table} WHERE random() < 0.1"), &[])
            .await
            .map_err(db("deleting ~10% of the rows"))?;
        control
            .batch_execute(&format!("VACUUM {table}"))
            .await
            .map_err(db("vacuuming"))?;
        Ok(n)
    })
    .await?;
    load::reinsert(writers, deleted, opts, progress, r).await?;
    (r.table_bytes_after_churn, r.index_bytes_after_churn) =
        bounded(SERVER, "measuring", t, sizes(control, &table)).await?;
    bounded(SERVER, "dropping the table", t, async {
        control
            .batch_execute(&format!("DROP TABLE {table}"))
            .await
            .map_err(db("dropping the table"))
    })
    .await
}

/// `pg apply`'s own objects for one logical shard (shard 1) in the
/// sandbox: the shard's sequence, then `next_id()` made for that
/// sequence's oid, as `pg apply` makes it.
async fn install_next_id(control: &Client, schema: &str) -> Result<(), CompareError> {
    let layout = instagram()?;
    control
        .batch_execute(&sql::shard_schema_ddl(&layout, schema, SignBit::Refuse))
        .await
        .map_err(db("creating the shard's sequence"))?;
    let oid: u32 = control
        .query_one(
            "SELECT $1::text::regclass::oid",
            &[&sql::shard_sequence(schema)],
        )
        .await
        .map_err(db("reading the sequence's oid"))?
        .get(0);
    let functions = sql::shard_ddl(&layout, schema, 1, SignBit::Refuse, sql::SeqOid::Oid(oid))
        .map_err(|e| CompareError::Invalid(e.to_string()))?;
    control
        .batch_execute(&functions)
        .await
        .map_err(db("creating next_id()"))
}

/// The table of `scheme`, and what its ids need (a sequence, a function).
fn ddl(scheme: Scheme, schema: &str, table: &str) -> Result<String, CompareError> {
    let rest = "user_id bigint NOT NULL, body text NOT NULL";
    Ok(match scheme {
        Scheme::Bigserial => format!("CREATE TABLE {table} (id bigserial PRIMARY KEY, {rest})"),
        Scheme::NextId => format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY DEFAULT {schema}.next_id(), {rest})"
        ),
        Scheme::ServerUuid => {
            format!("CREATE TABLE {table} (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), {rest})")
        }
        Scheme::UuidV4 | Scheme::UuidV7 => {
            format!("CREATE TABLE {table} (id uuid PRIMARY KEY, {rest})")
        }
        Scheme::ObjectId => format!("CREATE TABLE {table} (id bytea PRIMARY KEY, {rest})"),
        Scheme::Snowflake => format!("CREATE TABLE {table} (id bigint PRIMARY KEY, {rest})"),
        Scheme::Tickets => format!(
            "CREATE SEQUENCE {schema}.tickets; CREATE TABLE {table} (id bigint PRIMARY KEY, {rest})"
        ),
        Scheme::Segment => format!(
            "CREATE TABLE {schema}.segments (name text PRIMARY KEY, max_id bigint NOT NULL);\n\
             INSERT INTO {schema}.segments VALUES ('compare', 0);\n\
             CREATE TABLE {table} (id bigint PRIMARY KEY, {rest})"
        ),
        other => {
            return Err(CompareError::Invalid(format!(
                "{} does not run on PostgreSQL",
                other.name()
            )));
        }
    })
}

async fn sizes(control: &Client, table: &str) -> Result<(u64, u64), CompareError> {
    let row = control
        .query_one(
            "SELECT pg_table_size($1::text::regclass), pg_indexes_size($1::text::regclass)",
            &[&table],
        )
        .await
        .map_err(db("reading the table's size"))?;
    Ok((row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
}

/// Blocks of ids shared by a scheme's connections (Leaf's segment, single
/// buffered: the connection that finds it empty takes the next block).
struct SegmentBuf {
    /// Next id and last id of the block in hand.
    range: Mutex<(i64, i64)>,
    step: i64,
}

enum Source {
    Database,
    Client(Arc<ClientIds>),
    Ticket(Statement),
    Segment(Arc<SegmentBuf>, Statement),
}

struct PgWriter {
    client: Client,
    scheme: Scheme,
    insert: Statement,
    source: Source,
    timeout: Duration,
}

impl PgWriter {
    async fn new(
        client: Client,
        scheme: Scheme,
        schema: &str,
        table: &str,
        client_ids: Option<Arc<ClientIds>>,
        segment: Arc<SegmentBuf>,
        timeout: Duration,
    ) -> Result<PgWriter, CompareError> {
        let prepare = |sql: String| {
            let client = &client;
            async move {
                client
                    .prepare(&sql)
                    .await
                    .map_err(db("preparing the insert"))
            }
        };
        let column = match scheme {
            Scheme::UuidV4 | Scheme::UuidV7 => "uuid",
            Scheme::ObjectId => "bytea",
            _ => "bigint",
        };
        let (insert, source) = match scheme.made_by() {
            crate::MadeBy::Database => (
                prepare(format!(
                    "INSERT INTO {table} (user_id, body) SELECT u, $2 FROM unnest($1::bigint[]) AS u \
                     ON CONFLICT DO NOTHING RETURNING id"
                ))
                .await?,
                Source::Database,
            ),
            made_by => {
                let insert = prepare(format!(
                    "INSERT INTO {table} (id, user_id, body) SELECT i, u, $3 \
                     FROM unnest($1::{column}[], $2::bigint[]) AS x(i, u) ON CONFLICT DO NOTHING"
                ))
                .await?;
                let source = match made_by {
                    crate::MadeBy::TicketServer => {
                        Source::Ticket(prepare(format!("SELECT nextval('{schema}.tickets')")).await?)
                    }
                    crate::MadeBy::Segment => Source::Segment(
                        segment,
                        prepare(format!(
                            "UPDATE {schema}.segments SET max_id = max_id + $1 WHERE name = 'compare' RETURNING max_id"
                        ))
                        .await?,
                    ),
                    _ => Source::Client(client_ids.ok_or_else(|| {
                        CompareError::Invalid(format!("{} has no client-side generator", scheme.name()))
                    })?),
                };
                (insert, source)
            }
        };
        Ok(PgWriter {
            client,
            scheme,
            insert,
            source,
            timeout,
        })
    }

    /// The next `n` ids from a ticket, a segment or the client's generator.
    async fn ids(&mut self, n: usize) -> Result<Ids, CompareError> {
        match &self.source {
            Source::Database => Err(CompareError::Invalid("the database makes these ids".into())),
            Source::Client(g) => g.take(self.scheme, n),
            Source::Ticket(next) => {
                let mut ids = Vec::with_capacity(n);
                for _ in 0..n {
                    let row = self
                        .client
                        .query_one(next, &[])
                        .await
                        .map_err(db("taking a ticket"))?;
                    ids.push(row.get::<_, i64>(0));
                }
                Ok(Ids::Int(ids))
            }
            Source::Segment(buf, reserve) => {
                let mut ids = Vec::with_capacity(n);
                let mut range = buf.range.lock().await;
                while ids.len() < n {
                    if range.0 > range.1 {
                        let row = self
                            .client
                            .query_one(reserve, &[&buf.step])
                            .await
                            .map_err(db("reserving a segment"))?;
                        let max: i64 = row.get(0);
                        *range = (max - buf.step + 1, max);
                    }
                    let take = (range.1 - range.0 + 1).min((n - ids.len()) as i64);
                    ids.extend(range.0..range.0 + take);
                    range.0 += take;
                }
                Ok(Ids::Int(ids))
            }
        }
    }
}

impl Writer for PgWriter {
    async fn write(&mut self, n: usize) -> Result<Written, CompareError> {
        let users: Vec<i64> = vec![SHARD_KEY; n];
        let limit = self.timeout;
        if let Source::Database = self.source {
            let rows = bounded(SERVER, "inserting", limit, async {
                self.client
                    .query(&self.insert, &[&users, &BODY])
                    .await
                    .map_err(db("inserting"))
            })
            .await?;
            let keys = if self.scheme == Scheme::ServerUuid {
                rows.iter().map(|r| r.get::<_, Uuid>(0).as_u128()).collect()
            } else {
                rows.iter().map(|r| int_key(r.get(0))).collect()
            };
            return Ok(Written {
                inserted: rows.len() as u64,
                keys,
            });
        }
        let ids = bounded(SERVER, "taking ids", limit, self.ids(n)).await?;
        let keys = ids.keys();
        let client = &self.client;
        let insert = &self.insert;
        let inserted = bounded(SERVER, "inserting", limit, async {
            match &ids {
                Ids::Int(v) => client.execute(insert, &[v, &users, &BODY]).await,
                Ids::Uuid(v) => client.execute(insert, &[v, &users, &BODY]).await,
                Ids::Bytes(v) => client.execute(insert, &[v, &users, &BODY]).await,
            }
            .map_err(db("inserting"))
        })
        .await?;
        Ok(Written { inserted, keys })
    }

    async fn take_ids(&mut self, n: usize) -> Option<Result<(), CompareError>> {
        match self.source {
            Source::Database | Source::Client(_) => None,
            _ => Some(
                bounded(SERVER, "taking ids", self.timeout, self.ids(n))
                    .await
                    .map(drop),
            ),
        }
    }
}
