//! Moving one logical shard to another physical server.
//!
//! 1. **Bulk copy**, no lock: on the destination, create the shard's schema,
//!    sequences, functions and tables; copy every table with `COPY` from a
//!    `REPEATABLE READ` snapshot of the source.
//! 2. **Pause** (writes and ids of this shard only): lock the source tables
//!    `IN EXCLUSIVE MODE` (reads go on), then every sequence of the shard
//!    against `nextval` (see [below](#no-id-twice-across-a-move)), read the
//!    sequences' last values, copy the delta, then *fence* the source in the
//!    same transaction: a trigger and a replaced `next_id` raise SQLSTATE
//!    `SF001` ("moved") from now on, so writers that were waiting on the lock
//!    fail instead of writing to the old copy, and each sequence's
//!    `MAXVALUE` becomes its last value, so it hands out nothing more.
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
//!    is comparable), then set each destination sequence to the source's
//!    last value read in the pause (the packed time and sequence, see
//!    [`crate::sql`]): the destination continues where the source stopped,
//!    so no id is reused.
//! 4. **Switch** the topology file atomically (write, fsync, rename). Writers
//!    that got `SF001` reload it and go to the new server ([`crate::Router`]
//!    does this). The pause ends here.
//! 5. **Drop** the source schema, only now.
//!
//! Sharded tables must have a unique `id bigint` column (the delta and the
//! verification use it). If anything fails before the switch, the fence is
//! removed and the destination copy dropped: the shard stays where it was.
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
//! uncopied), and holds the lock `pg apply` takes on both servers from start
//! to end, so a concurrent apply cannot rebuild (unfence) the old copy.

use std::path::Path;
use std::pin::pin;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

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

/// How many times the pause is started, at most, when PostgreSQL breaks a
/// deadlock between it and an application transaction by aborting the
/// pause (see the module docs).
pub const PAUSE_ATTEMPTS: u32 = 5;

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
    let mut seqs = vec![format!("{schema}.id_seq")];
    seqs.extend(tables.iter().map(|t| sql::table_sequence(&schema, t)));
    let pause = Pause {
        schema: &schema,
        tables: &tables,
        seqs: &seqs,
        options: sql::sequence_options(topo.layout(), topo.sign_bit()),
        snapshot: &snapshot,
        shard,
        to,
    };
    let result = pause_and_copy(src, dst, &pause, (s, d)).await;
    let (delta_rows, last_values) = match result {
        Ok(r) => r,
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
        // The values read under the pause's locks: final (module docs).
        for (seq, v) in &last_values {
            dst.execute(
                &format!("SELECT setval('{seq}', greatest($1, (SELECT last_value FROM {seq})))"),
                &[v],
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
    let mut delta = 0;
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
    }
    dtx.commit().await.map_err(ctx(d, "commit delta"))?;
    let mut fence = fence_sql(schema, tables, shard, p.to);
    fence.push_str(&fence_sequences_sql(&last_values));
    stx.batch_execute(&fence)
        .await
        .map_err(ctx(s, "fencing the old copy"))?;
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
    let msg = format!("shard {shard} ({schema}) has moved to server {to}; reload the topology");
    let msg = format!("E'{}'", msg.replace('\\', "\\\\").replace('\'', "''"));
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

async fn unfence(src: &Client, topo: &Topology, shard: u64) -> Result<(), Error> {
    let schema = topo.schema(shard);
    let mut sql = String::new();
    // The sequences' options (the fence lowered MAXVALUE).
    let options = sql::sequence_options(topo.layout(), topo.sign_bit());
    for seq in sql::shard_sequences(&schema, topo.tables()) {
        sql.push_str(&format!("ALTER SEQUENCE {seq} MINVALUE 1 {options};\n"));
    }
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
