//! What a deployment *is*, recorded on its servers, and the rules every
//! `pg apply`, `pg check`, `pg repair` and `pg move-shard` test a topology
//! file against before they change anything.
//!
//! Each server's schema `shardflake` holds two tables:
//!
//! - `deployment`, one row: the deployment's id (shared by its servers),
//!   this server's name, the layout (epoch included), the schema prefix,
//!   the shard count, the sign-bit policy, and the deployment's
//!   *generation*: raised on every server by each `pg move-shard` before it
//!   writes the new generation into the file, with the shard it moved and
//!   the file it wrote;
//! - `shards`, a row per logical shard on this server: `live` (it serves),
//!   `moving` (it serves; a copy to `peer` is being made), `incoming` (a
//!   copy from `peer` being made here; it does not serve) or `fenced` (it
//!   moved to `peer`; this copy hands out nothing);
//! - `owners`, a row per logical shard of the deployment, the same on every
//!   server: the server that holds it, by name and by [`Identity`] (which
//!   database that name reached when `apply` or the last move recorded it).
//!   The `deployment` row also holds this server's own identity, and,
//!   on a copy that `pg repair --replaces` fenced for good, the identity
//!   of the database that replaced it ([`ServerView::replaced_by`]).
//!
//! A server is new only when the operator says so (`pg apply
//! --new-server NAME`): a database with no records in a deployment that
//! exists is refused, and one named for shards the deployment records on
//! another database is refused as a URL that now reaches another
//! database ([`unrecorded_servers`]), so an edited URL never recreates
//! live shards empty.
//!
//! The file says what the operator wants; the servers say what is. A file
//! that contradicts the servers (a shard put on another server than the one
//! it lives on, a fenced copy listed as live, another prefix, count, layout
//! or epoch, a server under another's name, a generation older than the
//! servers record) is refused with what to do instead ([`conflicts`]).
//!
//! Every command takes the deployment lock on every server of its file, in
//! name order ([`crate::pg`]'s `lock_deployment`), before it reads these
//! records, and holds it until it has written: what it read is what it
//! changes. A deployment made before these records (no
//! `deployment` row) is read from its shard schemas and recorded by the next
//! `pg apply`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use tokio_postgres::GenericClient;

use super::topology::{SignBit, Topology};
use super::{Drift, ctx};
use crate::Error;

/// Tables of the records, idempotent.
pub const CATALOG_DDL: &str = "CREATE SCHEMA IF NOT EXISTS shardflake;
CREATE TABLE IF NOT EXISTS shardflake.deployment (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  deployment text NOT NULL,
  server text NOT NULL,
  layout text NOT NULL,
  schema_prefix text NOT NULL,
  shards bigint NOT NULL,
  sign_bit text NOT NULL);
ALTER TABLE shardflake.deployment
  ADD COLUMN IF NOT EXISTS generation bigint NOT NULL DEFAULT 0,
  ADD COLUMN IF NOT EXISTS last_move bigint,
  ADD COLUMN IF NOT EXISTS file text;
CREATE TABLE IF NOT EXISTS shardflake.shards (
  shard bigint PRIMARY KEY,
  state text NOT NULL CHECK (state IN ('live', 'moving', 'incoming', 'fenced')),
  peer text);
ALTER TABLE shardflake.deployment
  ADD COLUMN IF NOT EXISTS system_identifier bigint,
  ADD COLUMN IF NOT EXISTS database_oid bigint;
CREATE TABLE IF NOT EXISTS shardflake.owners (
  shard bigint PRIMARY KEY,
  server text NOT NULL,
  system_identifier bigint NOT NULL,
  database_oid bigint NOT NULL);
CREATE TABLE IF NOT EXISTS shardflake.timeline (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  timeline bigint NOT NULL);
ALTER TABLE shardflake.deployment
  ADD COLUMN IF NOT EXISTS replaced_by_system bigint,
  ADD COLUMN IF NOT EXISTS replaced_by_database bigint;
CREATE TABLE IF NOT EXISTS shardflake.left_behind (
  shard bigint NOT NULL,
  tbl text NOT NULL,
  id_column text NOT NULL,
  rows bigint NOT NULL,
  min_id bigint NOT NULL,
  max_id bigint NOT NULL,
  PRIMARY KEY (shard, tbl));
ALTER TABLE shardflake.left_behind ADD COLUMN IF NOT EXISTS replaced text;
CREATE TABLE IF NOT EXISTS shardflake.timelines (
  system_identifier bigint NOT NULL,
  database_oid bigint NOT NULL,
  timeline bigint NOT NULL,
  PRIMARY KEY (system_identifier, database_oid));
";

/// The server's current WAL timeline: the first 8 hex digits of the
/// current WAL file's name. A physical restore that ran archive recovery
/// (a base backup, PITR) or a promoted standby starts a new one.
const CURRENT_TIMELINE: &str =
    "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint";

/// Which database a URL reaches: the cluster's system identifier (kept by
/// a physical copy, a standby and its promotion) and the database's oid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Identity {
    /// `pg_control_system().system_identifier`.
    pub system: i64,
    /// `pg_database.oid` of the current database.
    pub database: i64,
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "system identifier {}, database oid {}",
            self.system, self.database
        )
    }
}

/// The identity of the database a client is connected to, as SQL.
const IDENTITY: &str = "(SELECT system_identifier FROM pg_control_system()), \
    (SELECT oid FROM pg_database WHERE datname = current_database())::bigint";

/// Reads the identity of the database `c` is connected to.
pub async fn identity(c: &impl GenericClient, name: &str) -> Result<Identity, Error> {
    let r = c
        .query_one(&format!("SELECT {IDENTITY}"), &[])
        .await
        .map_err(ctx(name, "reading the database's identity"))?;
    Ok(Identity {
        system: r.get(0),
        database: r.get(1),
    })
}

/// The server a deployment records a shard on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its name in the file.
    pub server: String,
    /// The database that name reached.
    pub identity: Identity,
}

/// A shard's state on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Serves.
    Live,
    /// Serves; a move to the peer is copying it.
    Moving,
    /// A move from the peer is copying it here; does not serve.
    Incoming,
    /// Moved to the peer; hands out nothing.
    Fenced,
}

impl State {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Live => "live",
            State::Moving => "moving",
            State::Incoming => "incoming",
            State::Fenced => "fenced",
        }
    }

    fn parse(s: &str) -> State {
        match s {
            "moving" => State::Moving,
            "incoming" => State::Incoming,
            "fenced" => State::Fenced,
            _ => State::Live,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `deployment` row of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// Shared by every server of the deployment.
    pub id: String,
    /// The server's own name.
    pub server: String,
    /// `Layout::to_string()`: fields, epoch, tick.
    pub layout: String,
    /// Schema prefix.
    pub schema_prefix: String,
    /// Logical shard count.
    pub shards: u64,
    /// `refuse` or `allow`.
    pub sign_bit: String,
    /// How many moves the deployment has seen (the file's `generation`).
    pub generation: u64,
    /// The shard the move that set `generation` moved.
    pub last_move: Option<u64>,
    /// The file that move wrote.
    pub file: Option<String>,
}

impl Deployment {
    /// The record a topology makes for `server`.
    pub fn of(topo: &Topology, id: &str, server: &str) -> Deployment {
        Deployment {
            id: id.to_string(),
            server: server.to_string(),
            layout: topo.layout().to_string(),
            schema_prefix: topo.schema_prefix().to_string(),
            shards: topo.shards(),
            sign_bit: sign_text(topo.sign_bit()).to_string(),
            generation: topo.generation(),
            last_move: None,
            file: None,
        }
    }
}

fn sign_text(s: SignBit) -> &'static str {
    match s {
        SignBit::Refuse => "refuse",
        SignBit::Allow => "allow",
    }
}

/// What one server holds.
#[derive(Debug, Clone)]
pub struct ServerView {
    /// Its name in the file.
    pub name: String,
    /// The database its URL reaches now.
    pub identity: Identity,
    /// Its `deployment` row (none: new, or made before the records).
    pub deployment: Option<Deployment>,
    /// Shard → the server the deployment records it on (empty: recorded
    /// before owners were).
    pub owners: BTreeMap<u64, Owner>,
    /// Shard → state and peer.
    pub shards: BTreeMap<u64, (State, Option<String>)>,
    /// Schemas with a `shardflake_meta()` outside the recorded (or the
    /// file's) prefix: another deployment's, or this one's under another
    /// prefix.
    pub foreign: Vec<String>,
    /// Shards recorded here whose schema is gone.
    pub schemaless: BTreeSet<u64>,
    /// The database that replaced this one (`pg repair --replaces` with
    /// `--old-url`), which fenced every shard here for good.
    pub replaced_by: Option<Identity>,
    /// Live shards here restored from a dump (`next_id` made for another
    /// sequence: `SF003`): of two live copies, such a one is the stale.
    pub restored: BTreeSet<u64>,
}

impl ServerView {
    /// The state of `shard` here, if held.
    pub fn state(&self, shard: u64) -> Option<State> {
        self.shards.get(&shard).map(|(s, _)| *s)
    }
    /// The peer of `shard`'s move, if any.
    pub fn peer(&self, shard: u64) -> Option<&str> {
        self.shards.get(&shard).and_then(|(_, p)| p.as_deref())
    }
}

/// Reads a server's records; a server without them is read from its shard
/// schemas (`shardflake_meta()`; a `shardflake_moved()` marks a fenced copy).
pub async fn read(
    c: &impl GenericClient,
    name: &str,
    topo: &Topology,
) -> Result<ServerView, Error> {
    let has: bool = c
        .query_one(
            "SELECT to_regclass('shardflake.deployment') IS NOT NULL",
            &[],
        )
        .await
        .map_err(ctx(name, "looking up the deployment records"))?
        .get(0);
    let mut view = ServerView {
        name: name.to_string(),
        identity: identity(c, name).await?,
        deployment: None,
        owners: BTreeMap::new(),
        shards: BTreeMap::new(),
        foreign: Vec::new(),
        schemaless: BTreeSet::new(),
        replaced_by: None,
        restored: BTreeSet::new(),
    };
    if has {
        if let Some(r) = c
            .query_opt(
                // The columns a deployment recorded before generations
                // lacks read as absent (to_jsonb), not as an error.
                "SELECT deployment, server, layout, schema_prefix, shards, sign_bit,
                        coalesce((to_jsonb(d) ->> 'generation')::bigint, 0),
                        (to_jsonb(d) ->> 'last_move')::bigint, to_jsonb(d) ->> 'file',
                        (to_jsonb(d) ->> 'replaced_by_system')::bigint,
                        (to_jsonb(d) ->> 'replaced_by_database')::bigint
                   FROM shardflake.deployment d",
                &[],
            )
            .await
            .map_err(ctx(name, "reading the deployment record"))?
        {
            view.deployment = Some(Deployment {
                id: r.get(0),
                server: r.get(1),
                layout: r.get(2),
                schema_prefix: r.get(3),
                shards: r.get::<_, i64>(4) as u64,
                sign_bit: r.get(5),
                generation: r.get::<_, i64>(6) as u64,
                last_move: r.get::<_, Option<i64>>(7).map(|s| s as u64),
                file: r.get(8),
            });
            if let (Some(system), Some(database)) = (r.get(9), r.get(10)) {
                view.replaced_by = Some(Identity { system, database });
            }
        }
        for r in c
            .query("SELECT shard, state, peer FROM shardflake.shards", &[])
            .await
            .map_err(ctx(name, "reading the shard records"))?
        {
            let state: String = r.get(1);
            view.shards
                .insert(r.get::<_, i64>(0) as u64, (State::parse(&state), r.get(2)));
        }
        let has_owners: bool = c
            .query_one("SELECT to_regclass('shardflake.owners') IS NOT NULL", &[])
            .await
            .map_err(ctx(name, "looking up the shards' owners"))?
            .get(0);
        let owners = if has_owners {
            c.query(
                "SELECT shard, server, system_identifier, database_oid FROM shardflake.owners",
                &[],
            )
            .await
            .map_err(ctx(name, "reading the shards' owners"))?
        } else {
            Vec::new()
        };
        for r in owners {
            view.owners.insert(
                r.get::<_, i64>(0) as u64,
                Owner {
                    server: r.get(1),
                    identity: Identity {
                        system: r.get(2),
                        database: r.get(3),
                    },
                },
            );
        }
    }
    let prefix = view
        .deployment
        .as_ref()
        .map_or(topo.schema_prefix(), |d| d.schema_prefix.as_str())
        .to_string();
    if has {
        for r in c
            .query(
                "SELECT shard FROM shardflake.shards s
                  WHERE NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1 || s.shard::text)",
                &[&prefix],
            )
            .await
            .map_err(ctx(name, "looking up the recorded shards' schemas"))?
        {
            view.schemaless.insert(r.get::<_, i64>(0) as u64);
        }
    }
    let rows = c
        .query(
            "SELECT n.nspname, EXISTS (SELECT 1 FROM pg_proc m WHERE m.pronamespace = n.oid AND m.proname = 'shardflake_moved')
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE p.proname = 'shardflake_meta' AND p.pronargs = 0 ORDER BY 1",
            &[],
        )
        .await
        .map_err(ctx(name, "listing shard schemas"))?;
    for r in rows {
        let (schema, moved): (String, bool) = (r.get(0), r.get(1));
        let shard = schema
            .strip_prefix(prefix.as_str())
            .and_then(|n| n.parse::<u64>().ok());
        match shard {
            Some(shard) if view.deployment.is_none() => {
                // Made before the records: live, or fenced by a move.
                let state = if moved { State::Fenced } else { State::Live };
                view.shards.insert(shard, (state, None));
            }
            Some(_) => {}
            None => view.foreign.push(schema),
        }
    }
    let live: Vec<u64> = view
        .shards
        .iter()
        .filter(|(_, (state, _))| *state == State::Live)
        .map(|(&shard, _)| shard)
        .collect();
    for shard in live {
        if super::restored(c, topo, name, shard).await?.is_some() {
            view.restored.insert(shard);
        }
    }
    Ok(view)
}

/// The deployment id the servers agree on, if any has one.
pub fn deployment_id(views: &[ServerView]) -> Option<&str> {
    views
        .iter()
        .find_map(|v| v.deployment.as_ref().map(|d| d.id.as_str()))
}

/// The newest generation the servers record, with the record that holds
/// it (none: no server records a deployment).
pub fn recorded_generation(views: &[ServerView]) -> Option<&Deployment> {
    let id = deployment_id(views);
    views
        .iter()
        .filter_map(|v| v.deployment.as_ref())
        .filter(|d| Some(d.id.as_str()) == id)
        .max_by_key(|d| d.generation)
}

/// Shard → the server the deployment records it on: the owners of the
/// server of the newest generation that records any (the same on every
/// server, but a server restored from a dump holds older ones).
pub fn recorded_owners(views: &[ServerView]) -> BTreeMap<u64, Owner> {
    let id = deployment_id(views);
    views
        .iter()
        .filter(|v| !v.owners.is_empty())
        .filter_map(|v| Some((v.deployment.as_ref()?, v)))
        .filter(|(d, _)| Some(d.id.as_str()) == id)
        .max_by_key(|(d, _)| d.generation)
        .map(|(_, v)| v.owners.clone())
        .unwrap_or_default()
}

/// Servers of the file holding records whose database is not the one the
/// deployment records their shards on: another copy of it (a dump
/// restored into another cluster, a clone), or the old copy of one that
/// `pg repair --replaces` replaced. Both copies would hand out the same
/// ids; refused until the operator says which is the server
/// (`replaces`: the names `pg repair --replaces` was given, not reported).
/// A copy that a replacement fenced ([`ServerView::replaced_by`]) is
/// reported even when named there: it never serves again.
pub fn replaced_copies(views: &[ServerView], replaces: &[String]) -> Vec<Drift> {
    let mut out = Vec::new();
    for v in views.iter().filter(|v| v.deployment.is_some()) {
        if let Some(by) = v.replaced_by {
            out.push(Drift {
                server: v.name.clone(),
                shard: None,
                problem: format!(
                    "this URL reaches {}, the copy that `shardflake pg repair --replaces {}` replaced with {by} and fenced for good: its shards make no id (SQLSTATE SF001) and no command makes them serve again; point the url of {} at the database that replaced it (the file that repair ran with), and retire this one",
                    v.identity, v.name, v.name
                ),
            });
            continue;
        }
        if replaces.contains(&v.name) {
            continue;
        }
        // Recorded identity → (shards, servers recording it).
        let mut other: BTreeMap<Identity, (BTreeSet<u64>, BTreeSet<&str>)> = BTreeMap::new();
        for w in views {
            for (&shard, o) in &w.owners {
                if o.server == v.name && o.identity != v.identity {
                    let e = other.entry(o.identity).or_default();
                    e.0.insert(shard);
                    e.1.insert(w.name.as_str());
                }
            }
        }
        for (was, (shards, by)) in other {
            let shards: Vec<String> = shards.iter().map(u64::to_string).collect();
            let by: Vec<&str> = by.into_iter().collect();
            out.push(Drift {
                server: v.name.clone(),
                shard: None,
                problem: format!(
                    "this URL reaches {}, but {} record shards {} of {} on {was}: this is another copy of that database (a dump restored into another cluster, a clone), or the copy another server replaced; two copies would hand out the same ids. If this one is to replace the recorded one, run `shardflake pg repair --replaces {} --old-url URL`, URL reaching the recorded one (the url {} had before): it fences that copy and records this one on every server of the file; `--old-copy-gone` instead of `--old-url` only if that database is destroyed or its server stopped for good. A `move-shard` to or from {} that did not finish is settled by that repair (undone while its destination never went live). Otherwise put back the url of the recorded one",
                    v.identity,
                    by.join(", "),
                    shards.join(", "),
                    v.name,
                    v.name,
                    v.name,
                    v.name
                ),
            });
        }
    }
    out
}

/// The databases the servers of the file other than `server` record
/// `server`'s shards on (empty in a one-server file, or where no other
/// server records any of them): what a replacement of `server` replaces.
/// A copy restored from a dump records what the dump held, so the other
/// servers' records come first; `server`'s own are the fallback.
pub fn recorded_identities(views: &[ServerView], server: &str) -> BTreeSet<Identity> {
    let of = |v: &ServerView| -> BTreeSet<Identity> {
        v.owners
            .values()
            .filter(|o| o.server == server)
            .map(|o| o.identity)
            .collect()
    };
    let others: BTreeSet<Identity> = views
        .iter()
        .filter(|v| v.name != server)
        .flat_map(of)
        .collect();
    if !others.is_empty() {
        return others;
    }
    views
        .iter()
        .filter(|v| v.name == server)
        .flat_map(of)
        .collect()
}

/// Records on a copy that a replacement fenced which database replaced it.
pub async fn record_replaced(
    c: &impl GenericClient,
    server: &str,
    by: Identity,
) -> Result<(), Error> {
    c.execute(
        "UPDATE shardflake.deployment SET replaced_by_system = $1, replaced_by_database = $2",
        &[&by.system, &by.database],
    )
    .await
    .map_err(ctx(server, "recording the database that replaced it"))?;
    Ok(())
}

/// Servers of the file with no records in a deployment that exists.
/// Each is refused unless the operator named it new (`added`); one named
/// for shards the deployment records on another database is refused even
/// then: its URL now reaches another database than the one holding them,
/// and creating them there would hand out their ids a second time. Also
/// refused: a new server the file gives a shard the deployment holds
/// (a new server starts empty; shards are moved to it), and a shard the
/// deployment records on a server the file does not list.
pub fn unrecorded_servers(topo: &Topology, views: &[ServerView], added: &[String]) -> Vec<Drift> {
    let mut out = Vec::new();
    // The first apply: every server is new.
    let Some(id) = deployment_id(views) else {
        return out;
    };
    let owners = recorded_owners(views);
    let recorded: Vec<&str> = views
        .iter()
        .filter(|v| v.deployment.is_some())
        .map(|v| v.name.as_str())
        .collect();
    let list = |shards: &[u64]| {
        shards
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    for v in views.iter().filter(|v| v.deployment.is_none()) {
        let mut elsewhere: BTreeMap<Identity, Vec<u64>> = BTreeMap::new();
        for (&shard, o) in &owners {
            if o.server == v.name && o.identity != v.identity {
                elsewhere.entry(o.identity).or_default().push(shard);
            }
        }
        if let Some((was, shards)) = elsewhere.iter().next() {
            out.push(Drift {
                server: v.name.clone(),
                shard: None,
                problem: format!(
                    "this URL now reaches another database ({}) than the one the deployment records shards {} on ({was}), and it holds no records: creating those shards here would hand out their ids a second time; put back the url of the database that holds them (if it is lost, restore it there from a backup, then run `shardflake pg repair`)",
                    v.identity,
                    list(shards),
                ),
            });
            continue;
        }
        // Shard schemas and no records: made before the records (a move
        // recorded only its two servers); apply records it.
        if !v.shards.is_empty() {
            continue;
        }
        if !added.contains(&v.name) {
            out.push(Drift {
                server: v.name.clone(),
                shard: None,
                problem: format!(
                    "holds no records of deployment {id}, which {} record: if it is a new server, add it with `shardflake pg apply --new-server {}`; if its url was changed, put back the url of the database that holds its shards",
                    recorded.join(", "),
                    v.name
                ),
            });
            continue;
        }
        let held: Vec<u64> = topo
            .servers()
            .iter()
            .filter(|s| s.name == v.name)
            .flat_map(|s| s.shards.iter().copied())
            .filter(|shard| {
                owners.contains_key(shard)
                    || views
                        .iter()
                        .any(|o| o.name != v.name && o.state(*shard).is_some())
            })
            .collect();
        if !held.is_empty() {
            out.push(Drift {
                server: v.name.clone(),
                shard: None,
                problem: format!(
                    "a new server holds no shard until one is moved there, but the file gives it shards {}, which the deployment holds: give it shards = \"\" and move each with `shardflake pg move-shard N --to {}`",
                    list(&held),
                    v.name
                ),
            });
        }
    }
    for (&shard, o) in &owners {
        if topo.servers().iter().all(|s| s.name != o.server) {
            out.push(Drift {
                server: o.server.clone(),
                shard: Some(shard),
                problem: format!(
                    "the deployment records shard {shard} on {} ({}), which the file does not list: use the file that lists it",
                    o.server, o.identity
                ),
            });
        }
    }
    out
}

/// A deployment recorded in another database of the cluster a server of
/// the file reaches ([`siblings`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sibling {
    /// That database's name.
    pub database: String,
    /// The deployment it records.
    pub deployment: String,
    /// The name of the server it records itself as.
    pub server: String,
    /// Its schema prefix.
    pub schema_prefix: String,
    /// The shards it serves (live or moving).
    pub shards: Vec<u64>,
}

/// The deployments recorded in the other databases of the PostgreSQL
/// cluster that `c` (server `name`, at `url`) is connected to: each
/// database this user may connect to is read on a connection of its own.
/// A database that refuses the connection is logged and skipped (its
/// records cannot be seen). Run only while no server of the file records
/// a deployment: it is what tells a one-server file whose URL was changed
/// to another database of the same cluster from a new deployment's.
pub async fn siblings(
    c: &impl GenericClient,
    name: &str,
    url: &str,
) -> Result<Vec<Sibling>, Error> {
    let databases: Vec<String> = c
        .query(
            "SELECT datname FROM pg_database
              WHERE datallowconn AND NOT datistemplate AND datname <> current_database()
                AND has_database_privilege(datname, 'CONNECT')
              ORDER BY 1",
            &[],
        )
        .await
        .map_err(ctx(name, "listing the cluster's databases"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut out = Vec::new();
    for database in databases {
        let other = match super::connect_database(name, url, Some(&database)).await {
            Ok(other) => other,
            Err(e) => {
                tracing::warn!(
                    server = name,
                    database = database.as_str(),
                    "cannot read database {database:?} of the same cluster for a deployment's records: {e}"
                );
                continue;
            }
        };
        let has: bool = other
            .query_one(
                "SELECT to_regclass('shardflake.deployment') IS NOT NULL
                    AND to_regclass('shardflake.shards') IS NOT NULL",
                &[],
            )
            .await
            .map_err(ctx(name, "looking up another database's records"))?
            .get(0);
        if !has {
            continue;
        }
        let Some(d) = other
            .query_opt(
                "SELECT deployment, server, schema_prefix FROM shardflake.deployment",
                &[],
            )
            .await
            .map_err(ctx(name, "reading another database's deployment record"))?
        else {
            continue;
        };
        let shards = other
            .query(
                "SELECT shard FROM shardflake.shards WHERE state IN ('live', 'moving') ORDER BY 1",
                &[],
            )
            .await
            .map_err(ctx(name, "reading another database's shard records"))?
            .iter()
            .map(|r| r.get::<_, i64>(0) as u64)
            .collect();
        out.push(Sibling {
            database,
            deployment: d.get(0),
            server: d.get(1),
            schema_prefix: d.get(2),
            shards,
        });
    }
    Ok(out)
}

/// Shards as ranges: `0-3, 5`.
fn ranges(shards: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < shards.len() {
        let mut j = i;
        while j + 1 < shards.len() && shards[j + 1] == shards[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            shards[i].to_string()
        } else {
            format!("{}-{}", shards[i], shards[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// While no server of the file records a deployment (a first apply, or a
/// file all of whose URLs were changed): each server whose cluster holds,
/// in another database, any deployment's records. Its URL was likely
/// changed from that database to this one (the server's name in the file
/// perhaps too), and `apply` would create its shards here a second time,
/// their ids made again. Neither a server's name nor a schema prefix
/// keeps two deployments' ids apart, so every one counts.
/// `siblings[i]` are [`siblings`] of `views[i]`'s server; the operator's
/// way past it, for a separate deployment, is `pg apply --new-deployment`.
pub fn edited_urls(views: &[ServerView], siblings: &[Vec<Sibling>]) -> Vec<Drift> {
    if deployment_id(views).is_some() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (view, sibs) in views.iter().zip(siblings) {
        for s in sibs {
            let shards = if s.shards.is_empty() {
                "no shard".to_string()
            } else {
                format!("shards {}", ranges(&s.shards))
            };
            out.push(Drift {
                server: view.name.clone(),
                shard: None,
                problem: format!(
                    "this URL reaches a database ({}) with no deployment records, but database {:?} of the same PostgreSQL cluster records deployment {}'s server {:?} (schema prefix {:?}), serving {shards}: this URL now reaches another database than the one holding them (whatever the file now calls the server)? apply would create shards here a second time and make their ids again; put back the url of database {:?} and the server's name {:?}. If this is a separate deployment, whose ids may equal that one's, run `shardflake pg apply --new-deployment`",
                    view.identity, s.database, s.deployment, s.server, s.schema_prefix, s.database, s.server
                ),
            });
        }
    }
    out
}

/// A file older than the generation its servers record: written before a
/// move it has not seen, it may put a shard where it no longer lives, or
/// leave out the server that now holds it (which no other rule can see).
pub fn older_file(topo: &Topology, views: &[ServerView]) -> Option<Drift> {
    let newest = recorded_generation(views)?;
    if topo.generation() >= newest.generation {
        return None;
    }
    // The move records the generation on every server, then writes the
    // file: stopped in between, the file it names still holds the old one.
    let moved = match (newest.last_move, &newest.file) {
        (Some(shard), Some(file)) => {
            let to = recorded_owners(views)
                .get(&shard)
                .map_or_else(|| "its destination".to_string(), |o| o.server.clone());
            format!(
                ": the last `pg move-shard`, of shard {shard} to {to}, recorded it on the servers, then writes it to {file}. If that file still says an older generation (the move stopped in between), run that move again from it (`shardflake pg move-shard {shard} --to {to}`), which writes it; or, where that move is refused, make its two edits by hand: set `generation = {}` and put shard {shard} in {to}'s list (out of any other's)",
                newest.generation
            )
        }
        _ => String::new(),
    };
    Some(Drift {
        server: newest.server.clone(),
        shard: None,
        problem: format!(
            "the file is generation {}, but the servers record generation {}: it was written before a shard move it has not seen, and may put shards where they no longer live or leave out the server that holds them; use the file of generation {}{moved}",
            topo.generation(),
            newest.generation,
            newest.generation,
        ),
    })
}

/// Every way the servers contradict the file or each other, each saying
/// what to do instead. `pg apply` refuses on any; `pg check` reports them.
/// `added`: the servers the operator named new (`pg apply --new-server`).
pub fn conflicts(topo: &Topology, views: &[ServerView], added: &[String]) -> Vec<Drift> {
    let mut out: Vec<Drift> = older_file(topo, views).into_iter().collect();
    out.extend(record_conflicts(topo, views, added));
    out
}

/// A record of a shard `live` on a server where its schema is gone, while
/// another server holds it live with its schema: a whole-server restore
/// brought back the record of a copy that had moved away, and the copy was
/// dropped as `pg check` said. No copy there hands out ids; `pg repair`
/// removes the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleRecord {
    /// The server holding the record.
    pub server: String,
    /// The shard.
    pub shard: u64,
    /// The server it is live on.
    pub live_on: String,
}

/// Every [`StaleRecord`] of the deployment.
pub fn stale_records(views: &[ServerView]) -> Vec<StaleRecord> {
    let mut out = Vec::new();
    for v in views {
        for &shard in &v.schemaless {
            if v.state(shard) != Some(State::Live) {
                continue;
            }
            let live_on = views.iter().find(|o| {
                o.name != v.name
                    && o.state(shard) == Some(State::Live)
                    && !o.schemaless.contains(&shard)
            });
            if let Some(o) = live_on {
                out.push(StaleRecord {
                    server: v.name.clone(),
                    shard,
                    live_on: o.name.clone(),
                });
            }
        }
    }
    out
}

/// [`conflicts`] but a file's generation.
pub fn record_conflicts(topo: &Topology, views: &[ServerView], added: &[String]) -> Vec<Drift> {
    let stale = stale_records(views);
    let mut out = unrecorded_servers(topo, views, added);
    out.extend(stale
        .iter()
        .map(|s| Drift {
            server: s.server.clone(),
            shard: Some(s.shard),
            problem: format!(
                "shard {} is recorded live here, but its schema is gone and it lives on {}: the record came back with a restore; `shardflake pg repair` removes it",
                s.shard, s.live_on
            ),
        }));
    // Past that, a stale record is no copy.
    let mut views = views.to_vec();
    for s in &stale {
        if let Some(v) = views.iter_mut().find(|v| v.name == s.server) {
            v.shards.remove(&s.shard);
        }
    }
    let views = &views[..];
    let mut say = |server: &str, shard: Option<u64>, problem: String| {
        out.push(Drift {
            server: server.to_string(),
            shard,
            problem,
        })
    };
    let id = deployment_id(views);
    for v in views {
        let Some(d) = &v.deployment else { continue };
        if Some(d.id.as_str()) != id {
            say(
                &v.name,
                None,
                format!(
                    "belongs to another deployment ({}, not {}): a server holds one deployment; fix its url in the file",
                    d.id,
                    id.unwrap_or("-")
                ),
            );
            continue;
        }
        if d.server != v.name {
            say(
                &v.name,
                None,
                format!(
                    "this server records itself as {:?}: the file's names or urls were swapped; give it back its name {:?}",
                    d.server, d.server
                ),
            );
        }
        let want = Deployment::of(topo, &d.id, &v.name);
        if d.layout != want.layout {
            say(
                &v.name,
                None,
                format!(
                    "deployed layout is {:?}, the file says {:?}: the layout (epoch, fields, tick) of live shards cannot change; put layout back",
                    d.layout, want.layout
                ),
            );
        }
        if d.schema_prefix != want.schema_prefix {
            say(
                &v.name,
                None,
                format!(
                    "schema_prefix is recorded as {:?}, the file says {:?}: one database holds one deployment; put schema_prefix = {:?} back (another deployment goes in another database)",
                    d.schema_prefix, want.schema_prefix, d.schema_prefix
                ),
            );
        }
        if d.shards != want.shards {
            say(
                &v.name,
                None,
                format!(
                    "shard count is recorded as {} (shards = {}), the file says {}: keys would route to other shards than the ones holding their rows; put shards = {} back (shards are split only by a planned migration, not by apply)",
                    d.shards, d.shards, want.shards, d.shards
                ),
            );
        }
        if d.sign_bit != want.sign_bit {
            say(
                &v.name,
                None,
                format!(
                    "sign_bit is recorded as {:?}, the file says {:?}: put it back",
                    d.sign_bit, want.sign_bit
                ),
            );
        }
    }
    for v in views {
        if !v.foreign.is_empty() {
            say(
                &v.name,
                None,
                format!(
                    "holds shard schemas outside schema_prefix {:?}: {} (another prefix's shards, live: a database holds one deployment; if the prefix was changed in the file, put it back)",
                    topo.schema_prefix(),
                    v.foreign.join(", ")
                ),
            );
        }
    }
    let all: BTreeSet<u64> = views
        .iter()
        .flat_map(|v| v.shards.keys().copied())
        .collect();
    for shard in all {
        let owner = topo.server_of(shard).ok().map(|s| s.name.as_str());
        // A copy another database replaced is fenced for good
        // (`replaced_copies` says so): no holder of any shard.
        let holders: Vec<(&str, State, Option<&str>)> = views
            .iter()
            .filter(|v| v.replaced_by.is_none())
            .filter_map(|v| Some((v.name.as_str(), v.state(shard)?, v.peer(shard))))
            .collect();
        if let Some((at, _, peer)) = holders
            .iter()
            .find(|(_, s, _)| matches!(s, State::Moving | State::Incoming))
        {
            let to = match holders.iter().find(|(_, s, _)| *s == State::Incoming) {
                Some((dest, _, _)) => *dest,
                None => peer.unwrap_or("?"),
            };
            let serving = holders
                .iter()
                .any(|(_, s, _)| matches!(s, State::Live | State::Moving));
            let fenced_at = holders
                .iter()
                .find(|(_, s, _)| *s == State::Fenced)
                .map(|(n, _, _)| *n);
            let what = match fenced_at {
                Some(f) if !serving => format!(
                    "shard {shard} is fenced on {f} and live nowhere, so every write to it fails: its move to {to} did not finish"
                ),
                _ => format!("a move of shard {shard} to {to} did not finish"),
            };
            say(
                at,
                Some(shard),
                format!(
                    "{what}: finish it with `shardflake pg move-shard {shard} --to {to}` or undo it with `shardflake pg move-shard {shard} --abort`"
                ),
            );
            continue;
        }
        let live: Vec<&str> = holders
            .iter()
            .filter(|(_, s, _)| *s == State::Live)
            .map(|(n, _, _)| *n)
            .collect();
        let fenced: Vec<(&str, Option<&str>)> = holders
            .iter()
            .filter(|(_, s, _)| *s == State::Fenced)
            .map(|(n, _, p)| (*n, *p))
            .collect();
        if live.len() > 1 {
            let schema = topo.schema(shard);
            // A copy restored from a dump beside one that is not (a move
            // went live there after the dump): the restored one is stale,
            // whatever the file says (a move stopped before its switch
            // leaves the file naming the old server).
            let restored = |n: &str| {
                views
                    .iter()
                    .any(|v| v.name == n && v.restored.contains(&shard))
            };
            let fresh: Vec<&str> = live.iter().copied().filter(|n| !restored(n)).collect();
            if let [keep] = fresh[..] {
                let stale: Vec<&str> = live.iter().copied().filter(|n| restored(n)).collect();
                let switch = if owner == Some(keep) {
                    String::new()
                } else {
                    format!(
                        "; put shard {shard} in {keep}'s list in the file (out of {}'s): the move to {keep} went live and did not switch it",
                        owner.unwrap_or("?")
                    )
                };
                say(
                    stale[0],
                    Some(shard),
                    format!(
                        "shard {shard} is live on {}: the copy on {} was restored from a dump taken before the shard went live on {keep}, and holds none of the rows written on {keep} since: stop writes to it and drop it (`DROP SCHEMA {schema} CASCADE` on {}), keep the one on {keep}{switch}, then run `shardflake pg repair`",
                        live.join(" and "),
                        stale.join(" and "),
                        stale.join(" and ")
                    ),
                );
                continue;
            }
            let (at, which) = match owner.filter(|o| live.contains(o)) {
                Some(owner) => {
                    let other = live.iter().find(|&&n| n != owner).copied().unwrap_or("?");
                    (
                        other,
                        format!(
                            "the file puts it on {owner}: stop writes to the copy on {other} and drop it (`DROP SCHEMA {schema} CASCADE` there)"
                        ),
                    )
                }
                None => (
                    live[1],
                    format!(
                        "stop writes to the copy the file does not put there and drop it (`DROP SCHEMA {schema} CASCADE` there)"
                    ),
                ),
            };
            say(
                at,
                Some(shard),
                format!(
                    "shard {shard} is live on {}: two copies hand out ids (a restored server brought back a copy that had moved?); {which}, then run `shardflake pg repair`",
                    live.join(" and ")
                ),
            );
            continue;
        }
        let stale = fenced
            .iter()
            .find(|(at, _)| Some(*at) == owner)
            .filter(|_| !live.is_empty());
        match (live.first(), owner, stale) {
            (Some(&at), Some(owner), Some(_)) => say(
                owner,
                Some(shard),
                format!(
                    "the file puts shard {shard} on {owner}, which holds only its fenced old copy (it moved to {at}): the file is older than the move; use the file the move wrote, or let `shardflake pg move-shard {shard} --to {at}` rewrite it"
                ),
            ),
            (Some(&at), Some(owner), None) if at != owner => say(
                owner,
                Some(shard),
                format!(
                    "shard {shard} lives on {at}, the file puts it on {owner}: move it with `shardflake pg move-shard {shard} --to {owner}` (the file's own copy must say {at}), or use the file the last move wrote"
                ),
            ),
            (None, _, _) if !fenced.is_empty() => {
                let (at, to) = fenced[0];
                let to = to.unwrap_or("?");
                say(
                    at,
                    Some(shard),
                    format!(
                        "shard {shard} is fenced on {at} (moved to {to}) and live nowhere, so every write fails: finish the move with `shardflake pg move-shard {shard} --to {to}`"
                    ),
                )
            }
            _ => {}
        }
    }
    out
}

/// Writes (upserts) a server's `deployment` row; its generation only ever
/// goes up.
pub async fn record_deployment(c: &impl GenericClient, d: &Deployment) -> Result<(), Error> {
    c.execute(
        &format!("INSERT INTO shardflake.deployment (deployment, server, layout, schema_prefix, shards, sign_bit, generation,
           system_identifier, database_oid)
         VALUES ($1, $2, $3, $4, $5, $6, $7, {IDENTITY})
         ON CONFLICT (singleton) DO UPDATE SET deployment = $1, server = $2, layout = $3,
           schema_prefix = $4, shards = $5, sign_bit = $6,
           generation = greatest(shardflake.deployment.generation, $7),
           system_identifier = EXCLUDED.system_identifier, database_oid = EXCLUDED.database_oid"),
        &[
            &d.id,
            &d.server,
            &d.layout,
            &d.schema_prefix,
            &(d.shards as i64),
            &d.sign_bit,
            &(d.generation as i64),
        ],
    )
    .await
    .map_err(ctx(&d.server, "recording the deployment"))?;
    Ok(())
}

/// Records on a server the generation a move of `shard` reached and the
/// file it writes (never lowering the generation).
pub async fn record_generation(
    c: &impl GenericClient,
    server: &str,
    generation: u64,
    shard: u64,
    file: &str,
) -> Result<(), Error> {
    c.execute(
        "UPDATE shardflake.deployment SET generation = greatest(generation, $1), last_move = $2, file = $3",
        &[&(generation as i64), &(shard as i64), &file],
    )
    .await
    .map_err(ctx(server, "recording the deployment's generation"))?;
    Ok(())
}

/// Records on a server which server holds each of `owners`' shards.
pub async fn record_owners(
    c: &impl GenericClient,
    server: &str,
    owners: &BTreeMap<u64, Owner>,
) -> Result<(), Error> {
    let shards: Vec<i64> = owners.keys().map(|&s| s as i64).collect();
    let names: Vec<&str> = owners.values().map(|o| o.server.as_str()).collect();
    let systems: Vec<i64> = owners.values().map(|o| o.identity.system).collect();
    let databases: Vec<i64> = owners.values().map(|o| o.identity.database).collect();
    c.execute(
        "INSERT INTO shardflake.owners (shard, server, system_identifier, database_oid)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[])
         ON CONFLICT (shard) DO UPDATE SET server = EXCLUDED.server,
           system_identifier = EXCLUDED.system_identifier, database_oid = EXCLUDED.database_oid",
        &[&shards, &names, &systems, &databases],
    )
    .await
    .map_err(ctx(server, "recording the shards' owners"))?;
    Ok(())
}

/// Records the server's timeline: where none is recorded (`apply`), or
/// over the recorded one (`repair`, after a physical restore).
pub async fn record_timeline(
    c: &impl GenericClient,
    server: &str,
    overwrite: bool,
) -> Result<(), Error> {
    let conflict = if overwrite {
        "DO UPDATE SET timeline = EXCLUDED.timeline"
    } else {
        "DO NOTHING"
    };
    c.batch_execute(&format!(
        "INSERT INTO shardflake.timeline (timeline) {CURRENT_TIMELINE} ON CONFLICT (singleton) {conflict}"
    ))
    .await
    .map_err(ctx(server, "recording the WAL timeline"))
}

/// The server's timeline if it differs from the one recorded at `apply` or
/// the last `repair` (`None`: the same, or nothing recorded yet).
pub async fn timeline_changed(
    c: &impl GenericClient,
    server: &str,
) -> Result<Option<(i64, i64)>, Error> {
    let recorded = c
        .query_opt("SELECT timeline FROM shardflake.timeline", &[])
        .await;
    let recorded: i64 = match recorded {
        Ok(Some(row)) => row.get(0),
        // Not recorded yet (a deployment from before the record), or the
        // table is missing: nothing to compare.
        Ok(None) | Err(_) => return Ok(None),
    };
    let current: i64 = c
        .query_one(CURRENT_TIMELINE, &[])
        .await
        .map_err(ctx(server, "reading the WAL timeline"))?
        .get(0);
    Ok((current != recorded).then_some((recorded, current)))
}

/// The server's current WAL timeline.
pub async fn current_timeline(c: &impl GenericClient, server: &str) -> Result<i64, Error> {
    Ok(c.query_one(CURRENT_TIMELINE, &[])
        .await
        .map_err(ctx(server, "reading the WAL timeline"))?
        .get(0))
}

/// The newest WAL timeline a server records for each database of the
/// deployment (`shardflake.timelines`; empty where there is none yet).
pub async fn recorded_timelines(
    c: &impl GenericClient,
    server: &str,
) -> Result<BTreeMap<Identity, i64>, Error> {
    let has: bool = c
        .query_one(
            "SELECT to_regclass('shardflake.timelines') IS NOT NULL",
            &[],
        )
        .await
        .map_err(ctx(server, "looking up the recorded timelines"))?
        .get(0);
    if !has {
        return Ok(BTreeMap::new());
    }
    let rows = c
        .query(
            "SELECT system_identifier, database_oid, timeline FROM shardflake.timelines",
            &[],
        )
        .await
        .map_err(ctx(server, "reading the recorded timelines"))?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                Identity {
                    system: r.get(0),
                    database: r.get(1),
                },
                r.get(2),
            )
        })
        .collect())
}

/// Records on a server each database's current timeline, never lowering
/// one recorded before: a copy on an older one is then told apart.
pub async fn record_timelines(
    c: &impl GenericClient,
    server: &str,
    timelines: &[(Identity, i64)],
) -> Result<(), Error> {
    for (identity, timeline) in timelines {
        c.execute(
            "INSERT INTO shardflake.timelines VALUES ($1, $2, $3)
             ON CONFLICT (system_identifier, database_oid)
             DO UPDATE SET timeline = greatest(shardflake.timelines.timeline, EXCLUDED.timeline)",
            &[&identity.system, &identity.database, timeline],
        )
        .await
        .map_err(ctx(server, "recording the timelines"))?;
    }
    Ok(())
}

/// Servers of the file whose database another server of the deployment
/// records on a newer WAL timeline than the one it is on: a copy left on
/// the old timeline, such as the old primary started again after its
/// standby was promoted (split brain). `current[i]` is the timeline of
/// `views[i]`'s server, `recorded[i]` what it records.
pub fn older_timelines(
    views: &[ServerView],
    current: &[i64],
    recorded: &[BTreeMap<Identity, i64>],
) -> Vec<Drift> {
    let mut out = Vec::new();
    for (view, &now) in views.iter().zip(current) {
        let newest = views
            .iter()
            .zip(recorded)
            .filter_map(|(other, r)| r.get(&view.identity).map(|&t| (t, &other.name)))
            .max();
        if let Some((newer, by)) = newest.filter(|&(t, _)| t > now) {
            out.push(Drift {
                server: view.name.clone(),
                shard: None,
                problem: format!(
                    "is on WAL timeline {now}, but server {by:?} records timeline {newer} for this database ({}): it is a copy left on an older timeline, such as the old primary started again after a standby was promoted in its place; it makes no id (SF005), and no command vouches for it: retire it or rebuild it as a standby (pg_rewind), and point the file at the promoted server",
                    view.identity
                ),
            });
        }
    }
    out
}

/// Writes (upserts) a shard's row on a server.
pub async fn record_shard(
    c: &impl GenericClient,
    server: &str,
    shard: u64,
    state: State,
    peer: Option<&str>,
) -> Result<(), Error> {
    c.execute(
        "INSERT INTO shardflake.shards (shard, state, peer) VALUES ($1, $2, $3)
         ON CONFLICT (shard) DO UPDATE SET state = $2, peer = $3",
        &[&(shard as i64), &state.as_str(), &peer],
    )
    .await
    .map_err(ctx(server, "recording the shard"))?;
    Ok(())
}

/// Removes a shard's row (its copy was dropped).
pub async fn forget_shard(c: &impl GenericClient, server: &str, shard: u64) -> Result<(), Error> {
    c.execute(
        "DELETE FROM shardflake.shards WHERE shard = $1",
        &[&(shard as i64)],
    )
    .await
    .map_err(ctx(server, "removing the shard's record"))?;
    Ok(())
}
