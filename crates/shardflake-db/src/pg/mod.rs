//! PostgreSQL: the topology file, the deployment's records on its servers,
//! the generated SQL, and the commands over tokio-postgres, one module each:
//!
//! - [`topology`]: the TOML topology file (layout, logical shards, servers,
//!   table templates), validated with typed errors.
//! - [`sql`]: pure SQL generation from a [`shardflake::Layout`]: schemas,
//!   sequences, `next_id()`, the decode function, tables. The design of
//!   `next_id` (no integer overflow, sign-bit policy, no repeated id beyond
//!   2^sequence ids per tick) is documented there.
//! - [`catalog`]: what a deployment is, recorded on its servers (layout,
//!   prefix, shard count, each shard's owner, fence and move), and the rules
//!   a topology file is checked against before anything changes.
//! - `apply` (idempotent; every server checked before any is changed),
//!   `check` (drift between servers and topology) and `repair` (after a
//!   restore, a restart or a failover: `next_id` is vouched for one run
//!   of its server, [`sql::ServerRun`]), each reading every server's
//!   records first; [`replace`]: what `repair --replaces` does to the
//!   copy it replaces (reached, checked, fenced for good).
//! - [`adopt`](mod@adopt): an existing table's id column switched to a shard's
//!   `next_id()` while writes go on, recorded on its server.
//! - [`move_shard`]: copies a logical shard to another server under a brief
//!   write pause, switches the topology, verifies, then drops the old copy.
//! - [`route`]: key → logical shard → server and schema; id → shard →
//!   server; `INSERT ... RETURNING id`.
//!
//! This file holds what they share (connections, lookups, [`Drift`]); it
//! uses none of them but `sql` and `topology`, so `catalog` and the
//! commands depend on it, never the other way round.

use std::fmt;

use tokio_postgres::{Client, GenericClient};

use crate::{Error, SQLSTATE_RESTARTED, SQLSTATE_RESTORED, pg_message};

pub mod adopt;
mod apply;
pub mod catalog;
mod check;
pub mod liveness;
pub mod move_shard;
pub mod partitions;
mod repair;
pub mod replace;
pub mod route;
pub mod sql;
pub mod topology;

pub use adopt::{AdoptOptions, Adopted, AdoptedTable, Target, adopt, adopted};
pub(crate) use apply::install_shard;
pub use apply::{Applied, ApplyOptions, apply, apply_adding, apply_with};
pub use check::check;
pub use repair::{Repaired, Replaced, repair, repair_replacing};
pub use replace::{LeftBehind, OldCopy, Replacement, UndoneMove};
pub use route::{Route, Router};
pub use topology::{Server, SignBit, Topology, TopologyError};

/// Connects to a server (5 s connect timeout, unless the URL sets one);
/// the connection task runs on the current tokio runtime, and gives up on
/// a server that stops answering ([`liveness`]).
pub async fn connect(server: &Server) -> Result<Client, Error> {
    connect_url(&server.name, &server.url).await
}

/// Connects to a URL, naming the server in errors.
pub async fn connect_url(name: &str, url: &str) -> Result<Client, Error> {
    connect_database(name, url, None).await
}

/// Connects to a URL, or to another database of the same server
/// (`database`), naming the server in errors. The connection gives up on
/// a server that stops answering ([`liveness`]).
pub(crate) async fn connect_database(
    name: &str,
    url: &str,
    database: Option<&str>,
) -> Result<Client, Error> {
    let mut config: tokio_postgres::Config = url.parse().map_err(|e| Error::Connect {
        server: name.to_string(),
        url: url.to_string(),
        source: Box::new(e),
    })?;
    if let Some(database) = database {
        config.dbname(database);
    }
    config.application_name("shardflake");
    liveness::connect(name, url, config).await
}

pub(crate) fn ctx<'a>(
    server: &'a str,
    context: &'a str,
) -> impl FnOnce(tokio_postgres::Error) -> Error + 'a {
    move |source| match liveness::gave_up(server, &source) {
        Some(why) => Error::Unresponsive {
            server: server.to_string(),
            context: context.to_string(),
            why,
        },
        None => Error::Postgres {
            server: server.to_string(),
            context: context.to_string(),
            source,
        },
    }
}

/// The deployment lock: `pg apply`, `pg repair` and `pg move-shard` hold
/// it on every server of their file while they read the records and
/// change them, `pg check` shares it while it reads.
pub const DEPLOYMENT_LOCK: i64 = sql::LOCK_BASE - 1;

/// How a command holds the deployment lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lock {
    /// Until the transaction each client is in ends (`apply`, `repair`).
    Transaction,
    /// Until the session ends or it is released (`move-shard`, which
    /// commits steps on the way).
    Session,
    /// Shared with other readers, until the session ends (`check`).
    Shared,
}

/// Takes the deployment lock on each of `clients` (`names[i]` is the
/// server of `clients[i]`) in name order, so two commands never wait on
/// each other in a circle. Every command takes it before it reads the
/// records: what it read then stays true until it has written.
pub(crate) async fn lock_deployment<C: GenericClient>(
    clients: &[C],
    names: &[&str],
    lock: Lock,
) -> Result<(), Error> {
    let call = match lock {
        Lock::Transaction => "SELECT pg_advisory_xact_lock($1)",
        Lock::Session => "SELECT pg_advisory_lock($1)",
        Lock::Shared => "SELECT pg_advisory_lock_shared($1)",
    };
    let mut order: Vec<usize> = (0..clients.len()).collect();
    order.sort_by_key(|&i| names[i]);
    for i in order {
        clients[i]
            .execute(call, &[&DEPLOYMENT_LOCK])
            .await
            .map_err(ctx(names[i], "taking the deployment lock"))?;
    }
    Ok(())
}

/// Each server's current WAL timeline and the timelines it records for
/// the deployment's databases ([`catalog::older_timelines`]).
pub(crate) async fn timelines<C: GenericClient>(
    clients: &[C],
    topo: &Topology,
) -> Result<
    (
        Vec<i64>,
        Vec<std::collections::BTreeMap<catalog::Identity, i64>>,
    ),
    Error,
> {
    let (mut current, mut recorded) = (Vec::new(), Vec::new());
    for (c, server) in clients.iter().zip(topo.servers()) {
        current.push(catalog::current_timeline(c, &server.name).await?);
        recorded.push(catalog::recorded_timelines(c, &server.name).await?);
    }
    Ok((current, recorded))
}

/// The names of the file's servers, in its order.
pub(crate) fn server_names(topo: &Topology) -> Vec<&str> {
    topo.servers().iter().map(|s| s.name.as_str()).collect()
}

/// Connects to every server of the file (all must answer: a plan needs
/// every server's records).
pub(crate) async fn connect_all(topo: &Topology) -> Result<Vec<Client>, Error> {
    let mut clients = Vec::new();
    for server in topo.servers() {
        clients.push(connect(server).await?);
    }
    Ok(clients)
}

/// An error listing every problem found, each with what to do instead.
pub(crate) fn refused(what: &str, problems: Vec<Drift>) -> Error {
    Error::Refused {
        what: what.to_string(),
        problems: problems.iter().map(ToString::to_string).collect(),
    }
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

/// The run of the server `c` is connected to ([`sql::ServerRun`]).
pub(crate) async fn server_run(
    c: &impl GenericClient,
    name: &str,
) -> Result<sql::ServerRun, Error> {
    let row = c
        .query_one(sql::ServerRun::QUERY, &[])
        .await
        .map_err(ctx(name, "reading when the server started"))?;
    Ok(sql::ServerRun {
        started: row.get(0),
        replayed: row.get(1),
    })
}

/// Why a live shard's `next_id` refuses every id (`SF005`), if it does:
/// it was vouched for another run of the server, which has restarted or
/// replayed WAL since (a function made before this guard has none).
pub(crate) async fn restarted(
    c: &impl GenericClient,
    topo: &Topology,
    name: &str,
    shard: u64,
) -> Result<Option<String>, Error> {
    let schema = topo.schema(shard);
    let body: Option<String> = c
        .query_opt(
            "SELECT p.prosrc FROM pg_proc p
              WHERE p.pronamespace = to_regnamespace($1) AND p.proname = 'next_id' AND p.pronargs = 1",
            &[&schema],
        )
        .await
        .map_err(ctx(name, "reading next_id"))?
        .map(|r| r.get(0));
    let Some(body) = body.filter(|b| b.contains("pg_postmaster_start_time()")) else {
        return Ok(None);
    };
    if body.contains(&server_run(c, name).await?.changed_sql()) {
        return Ok(None);
    }
    // On a new timeline this server is the promoted standby (or a physical
    // restore): repair is its step. On the same one it restarted, and may
    // be the old primary of a standby promoted elsewhere. (In recovery it
    // has no timeline of its own to read yet.)
    let timeline_table: bool = c
        .query_one(
            "SELECT to_regclass('shardflake.timeline') IS NOT NULL AND NOT pg_is_in_recovery()",
            &[],
        )
        .await
        .map_err(ctx(name, "looking up the recorded timeline"))?
        .get(0);
    let new_timeline = timeline_table && catalog::timeline_changed(c, name).await?.is_some();
    Ok(Some(if new_timeline {
        format!(
            "the server replayed WAL onto a new timeline (a promoted standby, or a restore from a base backup) since its ids were last vouched for: {schema}.next_id() refuses every id (SQLSTATE {SQLSTATE_RESTARTED}) until `shardflake pg repair`"
        )
    } else {
        format!(
            "the server restarted or replayed WAL (a crash, a restart, a restore from a base backup) since its ids were last vouched for: {schema}.next_id() refuses every id (SQLSTATE {SQLSTATE_RESTARTED}) until `shardflake pg repair`. If a standby was promoted in place of this server, this is the old primary: do not repair it, retire it or rebuild it as a standby (pg_rewind)"
        )
    }))
}

pub use crate::CLOCK_BOUND_MS;

/// A server's clock against this host's: `(offset, uncertainty)` in
/// milliseconds, the offset positive when the server's clock is ahead,
/// the uncertainty half the round trip of the reading.
pub(crate) async fn clock_offset(c: &impl GenericClient, name: &str) -> Result<(i64, i64), Error> {
    let before = crate::host_unix_ms();
    let server: i64 = c
        .query_one(
            "SELECT floor(date_part('epoch', clock_timestamp()) * 1000)::bigint",
            &[],
        )
        .await
        .map_err(ctx(name, "reading the server's clock"))?
        .get(0);
    let after = crate::host_unix_ms();
    Ok((server - (before + after) / 2, (after - before + 1) / 2))
}

/// Why a server's clock is too far from this host's for `pg repair` to
/// vouch for a promoted standby ([`CLOCK_BOUND_MS`]), if it is.
pub(crate) fn clock_problem(offset: i64, uncertainty: i64) -> Option<String> {
    crate::clock_problem(offset, uncertainty, "pg repair")
}

/// The server clock packed as a shard sequence's values are, in SQL.
fn packed_clock_sql(topo: &Topology) -> String {
    let l = topo.layout();
    format!(
        "(((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - {}) / {}) << {})",
        l.epoch_ms(),
        l.tick_ms().max(1),
        l.sequence().bits()
    )
}

/// Why `next_id` refuses every id of a shard for now, if its sequence runs
/// further ahead of the server clock than `next_id` allows (twice
/// [`sql::AHEAD_MS`]: `SF004`): the clock ran ahead, ids were made at its
/// time, and it was set back. Ids made since are dated that far ahead, and
/// every new id must come after them: until the clock catches up with the
/// sequence, none can be made without dating it further ahead than
/// `pg repair` can account for after a restore.
pub(crate) async fn ahead_of_clock(
    c: &impl GenericClient,
    topo: &Topology,
    name: &str,
    seq: &str,
) -> Result<Option<String>, Error> {
    let l = topo.layout();
    let row = c
        .query_one(
            &format!(
                "SELECT last_value - {}, floor(date_part('epoch', clock_timestamp()) * 1000)::bigint FROM {seq}",
                packed_clock_sql(topo)
            ),
            &[],
        )
        .await
        .map_err(ctx(name, &format!("reading {seq}")))?;
    let (lead, now_ms): (i64, i64) = (row.get(0), row.get(1));
    let lead_ms = (lead >> l.sequence().bits()).saturating_mul(l.tick_ms().max(1) as i64);
    if lead_ms <= 2 * sql::AHEAD_MS as i64 {
        return Ok(None);
    }
    let resume = shardflake::timestamp::rfc3339_ms(
        now_ms.saturating_add(lead_ms - sql::AHEAD_MS as i64).max(0) as u64,
    );
    Ok(Some(format!(
        "sequence {seq} runs {:.1} s ahead of the server clock: next_id() refuses every id (SQLSTATE SF004) until the clock is within {} ms of it, at about {resume} (server time); ids already handed out are dated that far ahead (the clock ran ahead, then was set back), and every new id must come after them. If the server's clock is wrong now, correct it; otherwise writes to this shard resume then, by themselves",
        lead_ms as f64 / 1000.0,
        sql::AHEAD_MS
    )))
}

/// Sets a shard's sequence past every value it can have handed out (the
/// server clock plus [`sql::lead_bound`]: no value runs further ahead of
/// the clock), and `margin_ms` further; returns its last value before and
/// after.
async fn bump_past_clock(
    c: &impl GenericClient,
    topo: &Topology,
    name: &str,
    seq: &str,
    margin_ms: u64,
) -> Result<(i64, i64), Error> {
    let l = topo.layout();
    let clock = packed_clock_sql(topo);
    let margin_ticks = margin_ms.div_ceil(l.tick_ms().max(1)) as i64;
    let lead = (sql::lead_bound(l) + 1).saturating_add(margin_ticks << l.sequence().bits());
    let row = c
        .query_one(
            &format!("SELECT last_value, greatest(last_value, {clock} + $1::bigint) FROM {seq}"),
            &[&lead],
        )
        .await
        .map_err(ctx(name, &format!("reading {seq}")))?;
    let (from, to): (i64, i64) = (row.get(0), row.get(1));
    c.execute(&format!("SELECT setval('{seq}', $1)"), &[&to])
        .await
        .map_err(ctx(name, &format!("setting {seq}")))?;
    Ok((from, to))
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

/// What a crash can do to the ids a server acknowledged, as its settings
/// say ([`durability`]).
#[derive(Debug, Default)]
pub(crate) struct Durability {
    /// `synchronous_commit = off` for our session, or set so by a database
    /// or role: the problem, naming them.
    pub commits_lost_by_a_crash: Option<String>,
    /// `fsync = off`: the warning.
    pub fsync_off: Option<String>,
}

/// Reads the settings that decide whether a crash can set a shard
/// sequence back below ids already handed out. `next_id` is safe only if
/// the WAL of every commit that returned an id is on disk before the
/// commit returns; we report rather than force `synchronous_commit` from
/// `next_id` (a session can still turn it off, and forcing it costs every
/// caller a flush per transaction), as `mysql check` reports
/// `innodb_flush_log_at_trx_commit = 0`:
///
/// - `synchronous_commit = off` loses the last commits' WAL (still in
///   shared memory) when the server is killed, or a backend is (the
///   postmaster then restarts every process): ids are made again with no
///   operator step in between. A problem for `pg check`, a warning of
///   `pg apply`. A database's or role's override (`ALTER DATABASE/ROLE ...
///   SET`) counts, since the application's sessions get it; a session's
///   own `SET` cannot be seen from here (the guide says so).
/// - `fsync = off` loses nothing when the server is killed, only when the
///   operating system crashes (which can corrupt the whole cluster): the
///   counterpart of `innodb_flush_log_at_trx_commit = 2`. A warning of
///   both.
pub(crate) async fn durability(c: &impl GenericClient, name: &str) -> Result<Durability, Error> {
    let row = c
        .query_one(
            "SELECT current_setting('synchronous_commit'), current_setting('fsync'),
                    (SELECT string_agg(concat_ws(' and ', 'database ' || d.datname, 'role ' || r.rolname), ', '
                                       ORDER BY d.datname, r.rolname)
                       FROM pg_db_role_setting s
                       LEFT JOIN pg_database d ON d.oid = s.setdatabase
                       LEFT JOIN pg_roles r ON r.oid = s.setrole
                      WHERE EXISTS (SELECT FROM unnest(s.setconfig) c
                                     WHERE lower(c) ~ '^synchronous_commit=(off|false|no|0)$'))",
            &[],
        )
        .await
        .map_err(ctx(name, "reading synchronous_commit and fsync"))?;
    let (sync, fsync, overrides): (String, String, Option<String>) =
        (row.get(0), row.get(1), row.get(2));
    let mut set_by = Vec::new();
    if sync == "off" {
        set_by.push("for this server".to_string());
    }
    set_by.extend(overrides.map(|o| format!("by {o}")));
    let fix = "ALTER SYSTEM SET synchronous_commit = on (or remote_write, remote_apply, local), and RESET it where a database or role sets it off";
    Ok(Durability {
        commits_lost_by_a_crash: (!set_by.is_empty()).then(|| {
            format!(
                "synchronous_commit = off ({}): a crash of the server, or of one backend, loses the last commits, a shard sequence's position with them, and next_id() hands out again ids it already acknowledged; {fix}",
                set_by.join("; ")
            )
        }),
        fsync_off: (fsync == "off").then(|| {
            "fsync = off: an operating-system crash (not a killed server) can lose acknowledged commits, a shard sequence's position with them (ids handed out again), or corrupt the cluster; set fsync = on unless the data is thrown away".to_string()
        }),
    })
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

/// Runs a statement on a server by URL, for tools and tests.
pub async fn execute(name: &str, url: &str, sql: &str) -> Result<(), Error> {
    let c = connect_url(name, url).await?;
    c.batch_execute(sql).await.map_err(|e| Error::Postgres {
        server: name.to_string(),
        context: format!("running {sql:?}: {}", pg_message(&e)),
        source: e,
    })
}
