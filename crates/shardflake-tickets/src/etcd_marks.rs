//! High-water marks in etcd as well as on the peers (`[marks] etcd` in the
//! tickets file, or the service's own etcd under `serve --tickets --etcd`).
//!
//! Why etcd too: the peers' marks ([`PeersStore`]) are rolled back with the
//! peers. A lone server restored from a backup takes its own marks back
//! with it; two servers restored from one night's backups agree with each
//! other. etcd is restored with neither, so a server that comes back
//! behind is raised past them whatever happened to the ticket servers.

use std::collections::HashMap;
use std::time::Duration;

use shardflake_etcd::{Client, Compare, Op};

use crate::backend::Holder;
use crate::config::MarksConfig;
use crate::error::TicketError;
use crate::high_water::{BoxFuture, HighWaterStore, PeersStore, ResidueClass};

/// Marks in etcd: `<prefix>/tickets/hw/<class>/<sequence>` = the largest
/// id handed out, in decimal (`<class>`: [`ResidueClass::key`]; a load
/// reads `<prefix>/tickets/hw/<server>/` too, where releases before
/// classes wrote them). Names are `[a-z_][a-z0-9_]*` (the tickets file is
/// checked) and class keys `@<n>of<n>`, so they cannot escape the key's
/// shape.
pub struct EtcdHighWater {
    client: Client,
    prefix: String,
}

/// How many times a mark's compare-and-set is retried against other
/// writers before the record fails (the next interval writes again).
const RAISE_TRIES: usize = 8;

impl EtcdHighWater {
    /// A store on `client`, under `prefix` (no trailing `/`).
    pub fn new(client: Client, prefix: String) -> EtcdHighWater {
        EtcdHighWater { client, prefix }
    }

    /// A store on the plain `http://` endpoints of a tickets file's
    /// `[marks]`, each call within `timeout`.
    pub fn from_file(marks: &MarksConfig, timeout: Duration) -> EtcdHighWater {
        EtcdHighWater::new(Client::new(&marks.etcd, timeout), marks.etcd_prefix.clone())
    }

    /// The keys of `holder` (a class key, or a server's name for the
    /// marks of older releases).
    fn holder_prefix(&self, holder: &str) -> String {
        format!("{}/tickets/hw/{holder}/", self.prefix)
    }

    /// Sets `key` to `value` unless it already holds as much: a
    /// compare-and-set on the value read, so two services writing at once
    /// never lower a mark.
    async fn raise(&self, server: &str, key: Vec<u8>, value: u64) -> Result<(), TicketError> {
        let new = value.to_string().into_bytes();
        let mut seen: Option<Vec<u8>> = None;
        for _ in 0..RAISE_TRIES {
            let compare = match &seen {
                None => Compare::Absent(key.clone()),
                Some(v) => Compare::ValueIs(key.clone(), v.clone()),
            };
            let put = [Op::Put(key.clone(), new.clone(), 0)];
            let answer = self
                .client
                .txn(&[compare], &put, &[Op::Get(key.clone())])
                .await
                .map_err(|e| etcd_failed(server, e))?;
            if answer.succeeded {
                return Ok(());
            }
            let Some(kv) = answer.kvs.into_iter().next() else {
                seen = None;
                continue;
            };
            if parse_mark(server, &kv.key, &kv.value)? >= value {
                return Ok(());
            }
            seen = Some(kv.value);
        }
        Err(etcd_failed(
            server,
            format!("the mark kept changing under {RAISE_TRIES} compare-and-sets"),
        ))
    }
}

fn etcd_failed(server: &str, e: impl ToString) -> TicketError {
    TicketError::Database {
        server: server.to_string(),
        context: "high-water marks in etcd".into(),
        message: e.to_string(),
    }
}

fn parse_mark(server: &str, key: &[u8], value: &[u8]) -> Result<u64, TicketError> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            etcd_failed(
                server,
                format!(
                    "{} holds {:?}, not a number",
                    String::from_utf8_lossy(key),
                    String::from_utf8_lossy(value)
                ),
            )
        })
}

impl HighWaterStore for EtcdHighWater {
    /// A compare-and-set: the mark is lowered only while it still holds
    /// `expected` (written as `EtcdHighWater::raise` writes it); a mark
    /// another writer moved is kept, its ids skipped.
    fn give_back<'a>(
        &'a self,
        class: &'a ResidueClass,
        sequence: &'a str,
        expected: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let server = &class.server;
            let key = format!("{}{sequence}", self.holder_prefix(&class.key)).into_bytes();
            let compare = Compare::ValueIs(key.clone(), expected.to_string().into_bytes());
            let put = [Op::Put(key, to.to_string().into_bytes(), 0)];
            self.client
                .txn(&[compare], &put, &[])
                .await
                .map_err(|e| etcd_failed(server, e))?;
            Ok(())
        })
    }

    /// Not fenced by the holder: etcd records no holder (the peers do).
    fn record<'a>(
        &'a self,
        class: &'a ResidueClass,
        _identity: Option<&'a str>,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let prefix = self.holder_prefix(&class.key);
            for (sequence, mark) in marks {
                let key = format!("{prefix}{sequence}").into_bytes();
                self.raise(&class.server, key, *mark).await?;
            }
            Ok(())
        })
    }

    fn load<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>> {
        Box::pin(async move {
            let server = &class.server;
            let mut marks = HashMap::new();
            for holder in [&class.key, server] {
                let prefix = self.holder_prefix(holder);
                let kvs = self
                    .client
                    .range_prefix(prefix.as_bytes())
                    .await
                    .map_err(|e| etcd_failed(server, e))?;
                for kv in kvs {
                    let sequence = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
                    let mark = parse_mark(server, &kv.key, &kv.value)?;
                    let held = marks.entry(sequence).or_insert(0);
                    *held = mark.max(*held);
                }
            }
            Ok(marks)
        })
    }
}

/// Both stores: every mark goes to both; a load takes the larger of the
/// two. Either alone answering is enough (the other is logged), so an etcd
/// outage does not stop the ticket servers and a peer outage does not
/// either.
pub struct EtcdAndPeers {
    /// The marks in etcd.
    pub etcd: EtcdHighWater,
    /// The marks on the peers.
    pub peers: PeersStore,
}

impl HighWaterStore for EtcdAndPeers {
    /// A refusal of the peers (the class taken over) refuses the write,
    /// whatever etcd took.
    fn record<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: Option<&'a str>,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let (etcd, peers) = tokio::join!(
                self.etcd.record(class, identity, marks),
                self.peers.record(class, identity, marks)
            );
            if let Err(e @ TicketError::Superseded(_)) = peers {
                return Err(e);
            }
            either(&class.server, [etcd, peers]).map(drop)
        })
    }

    /// The holder is recorded on the peers only.
    fn claim<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: &'a str,
        readmit: bool,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        self.peers.claim(class, identity, readmit)
    }

    fn holder<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<Option<Holder>, TicketError>> {
        self.peers.holder(class)
    }

    /// Lowered in both, each by its own compare-and-set: a place that
    /// keeps the higher mark makes the ids skipped, never repeated.
    fn give_back<'a>(
        &'a self,
        class: &'a ResidueClass,
        sequence: &'a str,
        expected: u64,
        to: u64,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let (etcd, peers) = tokio::join!(
                self.etcd.give_back(class, sequence, expected, to),
                self.peers.give_back(class, sequence, expected, to)
            );
            either(&class.server, [etcd, peers]).map(drop)
        })
    }

    fn load<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>> {
        Box::pin(async move {
            let (etcd, peers) = tokio::join!(self.etcd.load(class), self.peers.load(class));
            let mut marks = HashMap::new();
            for found in either(&class.server, [etcd, peers])? {
                for (sequence, mark) in found {
                    let held = marks.entry(sequence).or_insert(0);
                    *held = mark.max(*held);
                }
            }
            Ok(marks)
        })
    }
}

/// The answers of the stores that answered (a failure of one is logged),
/// or the first error when none did.
fn either<T>(server: &str, results: [Result<T, TicketError>; 2]) -> Result<Vec<T>, TicketError> {
    let mut answers = Vec::new();
    let mut first_error = None;
    for result in results {
        match result {
            Ok(v) => answers.push(v),
            Err(e) => {
                tracing::warn!(server, error = %e, "a ticket high-water store failed");
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if answers.is_empty() => Err(e),
        _ => Ok(answers),
    }
}
