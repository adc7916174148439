//! Moving one logical shard to another physical server.
//!
//! 1. **Bulk copy**, no lock: on the destination, create the shard's schema,
//!    sequences, functions and tables; copy every table with `COPY` from a
//!    `REPEATABLE READ` snapshot of the source.
//! 2. **Pause** (writes to this shard only): lock the source tables
//!    `IN EXCLUSIVE MODE` (reads go on), copy the delta, then *fence* the
//!    source in the same transaction: a trigger and a replaced `next_id`
//!    raise SQLSTATE `SF001` ("moved") from now on, so writers that were
//!    waiting on the lock fail instead of writing to the old copy.
//!
//!    The delta is every row version whose `xmin` is not older than the
//!    snapshot's `xmin` (compared with `age()`, so wraparound-safe): a
//!    superset of the versions the snapshot does not see. Asking
//!    `pg_visible_in_snapshot(xmin)` instead would miss a row written in a
//!    *subtransaction* (`SAVEPOINT`) of a transaction open across the
//!    snapshot: snapshots list top-level xids only, so the subxact's xid
//!    looks committed before the snapshot. Deletions are found by comparing
//!    ids (the destination then holds every source row plus the deleted ones).
//! 3. **Verify** every table on both sides (the source can no longer
//!    change): row count, id sum and a sum of hashes of each row's text
//!    (both sessions with the same `TimeZone`, `DateStyle`, ... so the text
//!    is comparable), then set each destination sequence to
//!    the source's value (the packed time and sequence, see [`crate::sql`]):
//!    the destination continues where the source stopped, so no id is reused.
//! 4. **Switch** the topology file atomically (write, fsync, rename). Writers
//!    that got `SF001` reload it and go to the new server ([`crate::Router`]
//!    does this). The pause ends here.
//! 5. **Drop** the source schema, only now.
//!
//! Sharded tables must have a unique `id bigint` column (the delta and the
//! verification use it). If anything fails before the switch, the fence is
//! removed and the destination copy dropped: the shard stays where it was.
//!
//! A move refuses a shard schema that holds relations, functions or types
//! the topology does not describe (dropping the old copy would destroy them
//! uncopied), and holds the lock `pg apply` takes on both servers from start
//! to end, so a concurrent apply cannot rebuild (unfence) the old copy.

use std::path::Path;
use std::pin::pin;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_postgres::Client;

use crate::pg::{self, ctx};
use crate::sql;
use crate::topology::Topology;
use crate::{Error, SQLSTATE_MOVED};

/// Options of a move.
#[derive(Debug, Clone, Default)]
pub struct MoveOptions {
    /// Keep the source schema (fenced) instead of dropping it.
    pub keep_source: bool,
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
}

/// Moves `shard` to server `to`, rewriting the topology file at `path`.
pub async fn move_shard(
    path: &Path,
    shard: u64,
    to: &str,
    opts: &MoveOptions,
) -> Result<MoveReport, Error> {
    let topo = Topology::load(path)?;
    let from = topo.server_of(shard)?.clone();
    let dest = topo.server(to)?.clone();
    let fail = |message: String| Error::Move { shard, message };
    if from.name == dest.name {
        return Err(fail(format!("shard {shard} is already on {to:?}")));
    }
    let mut src = pg::connect(&from).await?;
    let mut dst = pg::connect(&dest).await?;
    let (s, d) = (from.name.as_str(), dest.name.as_str());
    // The apply lock on both servers, in name order (two moves in opposite
    // directions must not deadlock across servers).
    let mut servers = [(&src, s), (&dst, d)];
    servers.sort_by_key(|(_, name)| *name);
    for (c, name) in servers {
        c.execute("SELECT pg_advisory_lock($1)", &[&APPLY_LOCK])
            .await
            .map_err(ctx(name, "taking the apply lock"))?;
    }
    let result = locked_move(&topo, path, shard, opts, &mut src, &mut dst, (s, d)).await;
    for (c, name) in [(&src, s), (&dst, d)] {
        // On failure, closing the connection releases it anyway.
        let unlocked = c
            .execute("SELECT pg_advisory_unlock($1)", &[&APPLY_LOCK])
            .await
            .map_err(ctx(name, "releasing the apply lock"));
        if result.is_ok() {
            unlocked?;
        }
    }
    result
}

/// The lock `pg apply` holds on a server while it installs (see
/// [`crate::pg::apply_server`]).
const APPLY_LOCK: i64 = sql::LOCK_BASE - 1;

/// Settings under which a row's text is the same on both servers.
const TEXT_SETTINGS: &str = "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; \
    SET IntervalStyle = 'postgres'; SET extra_float_digits = 3; SET bytea_output = 'hex'";

/// The move, with the apply lock held on both servers.
async fn locked_move(
    topo: &Topology,
    path: &Path,
    shard: u64,
    opts: &MoveOptions,
    src: &mut Client,
    dst: &mut Client,
    (s, d): (&str, &str),
) -> Result<MoveReport, Error> {
    let fail = |message: String| Error::Move { shard, message };
    let to = d;
    let moved = topo.with_shard_moved(shard, to)?;
    let schema = topo.schema(shard);
    let dest = topo.server(to)?.clone();

    let on_dest: bool = dst
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .map_err(ctx(d, "looking up schema"))?
        .get(0);
    if on_dest {
        return Err(fail(format!(
            "schema {schema} already exists on {to:?}; drop it there first (a failed earlier move?)"
        )));
    }
    let on_src: bool = src
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .map_err(ctx(s, "looking up schema"))?
        .get(0);
    if !on_src {
        return Err(fail(format!("schema {schema} does not exist on {s:?}")));
    }
    let foreign = foreign_objects(src, topo, &schema)
        .await
        .map_err(ctx(s, "listing the shard's objects"))?;
    if !foreign.is_empty() {
        return Err(fail(format!(
            "schema {schema} on {s:?} holds objects the topology does not describe ({}); \
             a move would not copy them and would drop them with the old copy: move or drop them first",
            foreign.join(", ")
        )));
    }
    for (c, name) in [(&*src, s), (&*dst, d)] {
        c.batch_execute(TEXT_SETTINGS)
            .await
            .map_err(ctx(name, "setting the session"))?;
    }

    // 1. Bulk copy from a snapshot.
    pg::apply_server(topo, &dest, dst, &[shard]).await?;
    let tables: Vec<String> = topo.tables().iter().map(|t| t.name.clone()).collect();
    let snapshot: String;
    let mut bulk_rows = 0;
    {
        let stx = src
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(ctx(s, "begin snapshot"))?;
        snapshot = stx
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await
            .map_err(ctx(s, "taking snapshot"))?
            .get(0);
        let dtx = dst.transaction().await.map_err(ctx(d, "begin"))?;
        for t in &tables {
            bulk_rows += copy(
                &stx,
                &dtx,
                &format!("SELECT * FROM {schema}.{t}"),
                &format!("{schema}.{t}"),
                (s, d),
            )
            .await?;
        }
        dtx.commit().await.map_err(ctx(d, "commit bulk copy"))?;
        stx.commit().await.map_err(ctx(s, "end snapshot"))?;
    }

    // 2. Pause: lock, delta, fence.
    let paused_at = Instant::now();
    let result = pause_and_copy(src, dst, &schema, &tables, &snapshot, (s, d), shard, to).await;
    let delta_rows = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = drop_schema(dst, &schema).await;
            return Err(e);
        }
    };

    // 3. Verify, then carry the sequences over.
    let verified = async {
        let mut rows = Vec::new();
        for t in &tables {
            let q = format!(
                "SELECT count(*), coalesce(sum(id::numeric), 0)::text, \
                        coalesce(sum(hashtextextended(shardflake_row::text, 0)), 0)::text \
                   FROM {schema}.{t} shardflake_row"
            );
            let a = src.query_one(&q, &[]).await.map_err(ctx(s, "verifying"))?;
            let b = dst.query_one(&q, &[]).await.map_err(ctx(d, "verifying"))?;
            let a: (i64, String, String) = (a.get(0), a.get(1), a.get(2));
            let b: (i64, String, String) = (b.get(0), b.get(1), b.get(2));
            if a != b {
                return Err(fail(format!(
                    "verification failed for {schema}.{t}: source {} rows (id sum {}, row hash sum {}), destination {} rows (id sum {}, row hash sum {})",
                    a.0, a.1, a.2, b.0, b.1, b.2
                )));
            }
            rows.push((t.clone(), a.0));
        }
        let mut seqs = vec![format!("{schema}.id_seq")];
        seqs.extend(tables.iter().map(|t| sql::table_sequence(&schema, t)));
        for seq in &seqs {
            let v: i64 = src
                .query_one(&format!("SELECT last_value FROM {seq}"), &[])
                .await
                .map_err(ctx(s, "reading sequences"))?
                .get(0);
            dst.execute(
                &format!("SELECT setval('{seq}', greatest($1, (SELECT last_value FROM {seq})))"),
                &[&v],
            )
            .await
            .map_err(ctx(d, "setting sequences"))?;
        }
        Ok::<_, Error>(rows)
    }
    .await;
    let rows = match verified {
        Ok(r) => r,
        Err(e) => {
            let _ = unfence(src, topo, shard).await;
            let _ = drop_schema(dst, &schema).await;
            return Err(e);
        }
    };

    // 4. Switch the topology.
    if let Err(source) = moved.save(path) {
        let _ = unfence(src, topo, shard).await;
        let _ = drop_schema(dst, &schema).await;
        return Err(Error::Io {
            path: path.display().to_string(),
            source,
        });
    }
    let paused = paused_at.elapsed();

    // 5. Drop the old copy.
    if !opts.keep_source {
        drop_schema(src, &schema).await?;
    }
    Ok(MoveReport {
        shard,
        from: s.to_string(),
        to: d.to_string(),
        rows,
        bulk_rows,
        delta_rows,
        paused,
        dropped_source: !opts.keep_source,
    })
}

#[allow(clippy::too_many_arguments)]
async fn pause_and_copy(
    src: &mut Client,
    dst: &mut Client,
    schema: &str,
    tables: &[String],
    snapshot: &str,
    (s, d): (&str, &str),
    shard: u64,
    to: &str,
) -> Result<u64, Error> {
    let stx = src.transaction().await.map_err(ctx(s, "begin pause"))?;
    if !tables.is_empty() {
        let list: Vec<String> = tables.iter().map(|t| format!("{schema}.{t}")).collect();
        stx.batch_execute(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", list.join(", ")))
            .await
            .map_err(ctx(s, "locking the shard's tables"))?;
    }
    let dtx = dst.transaction().await.map_err(ctx(d, "begin delta"))?;
    let mut delta = 0;
    // Row versions written by the snapshot's oldest running transaction or
    // later (see the module docs): a superset of what the snapshot misses.
    let newer = format!(
        "age(xmin) <= age('{}'::xid)",
        snapshot_xmin(snapshot, shard)?
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
    }
    dtx.commit().await.map_err(ctx(d, "commit delta"))?;
    stx.batch_execute(&fence_sql(schema, tables, shard, to))
        .await
        .map_err(ctx(s, "fencing the old copy"))?;
    stx.commit().await.map_err(ctx(s, "commit fence"))?;
    Ok(delta)
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
pub fn fence_sql(schema: &str, tables: &[String], shard: u64, to: &str) -> String {
    let msg = format!("shard {shard} ({schema}) has moved to server {to}; reload the topology")
        .replace('\'', "''");
    let mut out = format!(
        "CREATE OR REPLACE FUNCTION {schema}.shardflake_moved() RETURNS trigger LANGUAGE plpgsql AS $f$\n\
         BEGIN RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_MOVED}', MESSAGE = '{msg}'; END $f$;\n\
         CREATE OR REPLACE FUNCTION {schema}.next_id(seq regclass) RETURNS bigint LANGUAGE plpgsql AS $f$\n\
         BEGIN RAISE EXCEPTION USING ERRCODE = '{SQLSTATE_MOVED}', MESSAGE = '{msg}'; END $f$;\n"
    );
    for t in tables {
        out.push_str(&format!(
            "CREATE TRIGGER shardflake_moved BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {schema}.{t} \
             FOR EACH STATEMENT EXECUTE FUNCTION {schema}.shardflake_moved();\n"
        ));
    }
    out
}

async fn unfence(src: &Client, topo: &Topology, shard: u64) -> Result<(), Error> {
    let schema = topo.schema(shard);
    let mut sql = String::new();
    for t in topo.tables() {
        sql.push_str(&format!(
            "DROP TRIGGER IF EXISTS shardflake_moved ON {schema}.{};\n",
            t.name
        ));
    }
    sql.push_str(&sql::next_id_function(
        topo.layout(),
        &schema,
        shard,
        topo.sign_bit(),
    ));
    src.batch_execute(&sql)
        .await
        .map_err(ctx("source", "unfencing"))
}

async fn drop_schema(c: &Client, schema: &str) -> Result<(), Error> {
    c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await
        .map_err(ctx("server", "dropping the old copy"))
}

async fn copy(
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
