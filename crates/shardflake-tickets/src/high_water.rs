//! High-water marks: the largest id each server is known to have handed
//! out, kept somewhere that survives that server, so that a server that
//! comes back *behind* (restored from a backup, a lagging replica promoted)
//! is refused instead of handing out those ids again.
//!
//! [`HighWaterStore`] is the small seam: [`PeersStore`] keeps each server's
//! marks in a `shardflake_ticket_hw` table on every *other* server (on
//! itself only when it is alone, which a restore rolls back too); an
//! etcd-backed store can implement the same two calls. Marks only ever go
//! up (`GREATEST` on write).
//!
//! The client writes marks every `high_water_interval_ms` and at block
//! boundaries, so a restore is caught if it lost more than the ids of the
//! last interval; within one running client the check is exact (it also
//! compares with the marks it holds in memory).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::config::Config;
use crate::error::TicketError;
use crate::session::Session;

/// A boxed future (the store is used as `dyn HighWaterStore`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where high-water marks live.
pub trait HighWaterStore: Send + Sync {
    /// Raises (never lowers) `server`'s marks: `(sequence, largest id)`.
    fn record<'a>(
        &'a self,
        server: &'a str,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>>;

    /// `server`'s marks, per sequence, from every place that could be read;
    /// an error only when none could.
    fn load<'a>(
        &'a self,
        server: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>>;
}

/// Marks kept in the peers' `shardflake_ticket_hw` tables, over one admin
/// connection per server.
pub struct PeersStore {
    config: Config,
    sessions: Vec<Mutex<Option<Session>>>,
    timeout: Duration,
}

impl PeersStore {
    /// A store over the servers of `config` (connects lazily).
    pub fn new(config: Config) -> PeersStore {
        let sessions = config.servers.iter().map(|_| Mutex::new(None)).collect();
        let timeout = config.failover.attempt_timeout();
        PeersStore {
            config,
            sessions,
            timeout,
        }
    }

    /// The servers that hold `server`'s marks.
    fn holders(&self, server: &str) -> Vec<usize> {
        let peers: Vec<usize> = (0..self.config.servers.len())
            .filter(|&i| self.config.servers[i].name != server)
            .collect();
        if peers.is_empty() {
            (0..self.config.servers.len()).collect()
        } else {
            peers
        }
    }

    /// Runs one operation on holder `i`, connecting if needed; a failed
    /// session is dropped.
    async fn on<T>(
        &self,
        i: usize,
        op: impl AsyncFnOnce(&mut Session) -> Result<T, TicketError>,
    ) -> Result<T, TicketError> {
        let server = &self.config.servers[i];
        let work = async {
            let mut slot = self.sessions[i].lock().await;
            let mut session = match slot.take() {
                Some(s) => s,
                None => Session::connect_admin(server, &self.config).await?,
            };
            let result = op(&mut session).await;
            if result.is_ok() {
                *slot = Some(session);
            }
            result
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(TicketError::Timeout {
                    server: server.name.clone(),
                    context: "high-water marks".into(),
                    ms: self.timeout.as_millis() as u64,
                })
            })
    }
}

impl HighWaterStore for PeersStore {
    fn record<'a>(
        &'a self,
        server: &'a str,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let rows: Vec<(String, String, u64)> = marks
                .iter()
                .map(|(q, hw)| (server.to_string(), q.clone(), *hw))
                .collect();
            let mut last_error = None;
            let mut written = 0;
            for i in self.holders(server) {
                match self.on(i, async |s| s.write_high_water(&rows).await).await {
                    Ok(()) => written += 1,
                    Err(e) => last_error = Some(e),
                }
            }
            match (written, last_error) {
                (0, Some(e)) => Err(e),
                _ => Ok(()),
            }
        })
    }

    fn load<'a>(
        &'a self,
        server: &'a str,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>> {
        Box::pin(async move {
            let mut marks = HashMap::new();
            let mut last_error = None;
            let mut read = 0;
            for i in self.holders(server) {
                match self.on(i, async |s| s.read_high_water(server).await).await {
                    Ok(rows) => {
                        read += 1;
                        for (sequence, hw) in rows {
                            let mark = marks.entry(sequence).or_insert(0);
                            *mark = hw.max(*mark);
                        }
                    }
                    Err(e) => last_error = Some(e),
                }
            }
            match (read, last_error) {
                (0, Some(e)) => Err(e),
                _ => Ok(marks),
            }
        })
    }
}
