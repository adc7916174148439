//! Routing: key → logical shard → physical server and schema; id → shard →
//! server; inserts with `RETURNING id`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use shardflake::{Id, Layout};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

use super::topology::Topology;
use crate::{Error, SHARD_FIELD, is_moved, pg};

/// Where a key or an id lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Logical shard.
    pub shard: u64,
    /// Its schema.
    pub schema: String,
    /// Server name.
    pub server: String,
    /// Server URL.
    pub url: String,
}

/// The shard of a key: `key % shards` ("Sharding & IDs at Instagram": user 31341 of 2000
/// shards is shard 1341).
pub fn shard_of_key(topo: &Topology, key: u64) -> u64 {
    key % topo.shards()
}

/// Where a sharding key lives.
pub fn route_key(topo: &Topology, key: u64) -> Result<Route, Error> {
    route_shard(topo, shard_of_key(topo, key))
}

/// Where a logical shard lives.
pub fn route_shard(topo: &Topology, shard: u64) -> Result<Route, Error> {
    let server = topo.server_of(shard)?;
    Ok(Route {
        shard,
        schema: topo.schema(shard),
        server: server.name.clone(),
        url: server.url.clone(),
    })
}

/// The shard an id was made on, read from the id itself (bigint as stored).
pub fn shard_of_id(layout: &Layout, id: i64) -> Result<u64, Error> {
    let parts = Id(id as u64).decode(layout)?;
    Ok(parts
        .field(SHARD_FIELD)
        .expect("validated layouts have a shard field"))
}

/// Where the row with this id lives.
pub fn locate(topo: &Topology, id: i64) -> Result<Route, Error> {
    let shard = shard_of_id(topo.layout(), id)?;
    route_shard(topo, shard)
}

/// Routes keys and ids to servers and runs statements there. One connection
/// per server, shared (tokio-postgres pipelines concurrent queries). Built
/// from a file, it reloads the file when a shard has moved and retries.
pub struct Router {
    topo: RwLock<Arc<Topology>>,
    path: Option<PathBuf>,
    clients: Mutex<HashMap<String, Arc<Client>>>,
    retry_for: Duration,
}

impl Router {
    /// A router over a topology.
    pub fn new(topo: Topology) -> Self {
        Router {
            topo: RwLock::new(Arc::new(topo)),
            path: None,
            clients: Mutex::new(HashMap::new()),
            retry_for: Duration::from_secs(30),
        }
    }

    /// A router over a topology file, reloaded when a shard has moved.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let topo = Topology::load(path.as_ref())?;
        let mut r = Router::new(topo);
        r.path = Some(path.as_ref().to_path_buf());
        Ok(r)
    }

    /// The current topology.
    pub fn topology(&self) -> Arc<Topology> {
        self.topo.read().expect("topology lock").clone()
    }

    /// Re-reads the topology file (no-op without one).
    pub fn reload(&self) -> Result<(), Error> {
        if let Some(p) = &self.path {
            let t = Topology::load(p)?;
            *self.topo.write().expect("topology lock") = Arc::new(t);
        }
        Ok(())
    }

    /// Where a key lives.
    pub fn route(&self, key: u64) -> Result<Route, Error> {
        route_key(&self.topology(), key)
    }

    /// Where an id lives.
    pub fn locate(&self, id: i64) -> Result<Route, Error> {
        locate(&self.topology(), id)
    }

    /// The shared connection to a route's server. Connects without holding
    /// the connection map, so a dead or hanging server stalls only the
    /// callers routed to it; of two racing connects, the first stored wins.
    pub async fn client(&self, route: &Route) -> Result<Arc<Client>, Error> {
        let open = |clients: &HashMap<String, Arc<Client>>| {
            clients.get(&route.url).filter(|c| !c.is_closed()).cloned()
        };
        if let Some(c) = open(&self.clients.lock().expect("client map lock")) {
            return Ok(c);
        }
        let c = Arc::new(pg::connect_url(&route.server, &route.url).await?);
        let mut clients = self.clients.lock().expect("client map lock");
        if let Some(existing) = open(&clients) {
            return Ok(existing);
        }
        clients.insert(route.url.clone(), c.clone());
        Ok(c)
    }

    /// Runs `sql` (with `{schema}` for the shard's schema) on the key's shard
    /// and returns the rows. With a topology file: on SQLSTATE `SF001` (the
    /// shard is moving or moved) it waits for the file to change and retries
    /// where it says; on any other error it re-reads the file and retries
    /// once the shard's server changed (a stale topology).
    pub async fn query_key(
        &self,
        key: u64,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        self.run(|t| route_key(t, key), sql, params).await
    }

    /// Runs `sql` on the shard that made `id` (reads by id).
    pub async fn query_id(
        &self,
        id: i64,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        self.run(|t| locate(t, id), sql, params).await
    }

    /// `INSERT ... RETURNING id` on the key's shard; `sql` uses `{schema}`
    /// and must return the id as its first column.
    ///
    /// ```no_run
    /// # async fn f(router: &shardflake_db::pg::Router) -> Result<(), shardflake_db::Error> {
    /// let user_id = 31341_i64;
    /// let id = router
    ///     .insert(user_id as u64,
    ///         "INSERT INTO {schema}.posts (user_id, body) VALUES ($1, $2) RETURNING id",
    ///         &[&user_id, &"hello"])
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn insert(
        &self,
        key: u64,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<i64, Error> {
        let rows = self.query_key(key, sql, params).await?;
        let row = rows.first().ok_or_else(|| crate::Error::Conflict {
            server: self.route(key).map(|r| r.server).unwrap_or_default(),
            message: "INSERT ... RETURNING id returned no row".into(),
        })?;
        row.try_get::<_, i64>(0)
            .map_err(|e| crate::Error::Postgres {
                server: self.route(key).map(|r| r.server).unwrap_or_default(),
                context: "reading the returned id".into(),
                source: e,
            })
    }

    /// Reloads the file; whether the route's shard now lives elsewhere.
    fn moved_since(&self, route: &Route) -> Result<bool, Error> {
        self.reload()?;
        Ok(route_shard(&self.topology(), route.shard)?.url != route.url)
    }

    async fn run(
        &self,
        route_of: impl Fn(&Topology) -> Result<Route, Error>,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, Error> {
        let deadline = Instant::now() + self.retry_for;
        let mut backoff = Duration::from_millis(2);
        loop {
            let route = route_of(&self.topology())?;
            let client = self.client(&route).await?;
            let text = sql.replace("{schema}", &route.schema);
            match client.query(&text, params).await {
                Ok(rows) => return Ok(rows),
                Err(e) if is_moved(&e) && self.path.is_some() && Instant::now() < deadline => {
                    // The shard is moving or has moved: wait for the new
                    // topology file and go where it says.
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(100));
                    self.reload()?;
                }
                Err(e)
                    if self.path.is_some()
                        && Instant::now() < deadline
                        && self.moved_since(&route)? =>
                {
                    // A stale topology (e.g. the old copy was already dropped
                    // when this router first went there): the file now says
                    // elsewhere, so retry there.
                    let _ = e;
                }
                Err(e) => {
                    return Err(Error::Postgres {
                        server: route.server,
                        context: format!("shard {}", route.shard),
                        source: e,
                    });
                }
            }
        }
    }
}
