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

use crate::backend::{Holder, holder_of};
use crate::config::MarksConfig;
use crate::error::TicketError;
use crate::high_water::{
    BoxFuture, HighWaterStore, PeersStore, Quorum, ResidueClass, Tally, merge, superseded,
};

/// Marks in etcd: `<prefix>/tickets/hw/<class>/<sequence>` = the largest
/// id handed out, in decimal (`<class>`: [`ResidueClass::key`]; a load
/// reads `<prefix>/tickets/hw/<server>/` too, where releases before
/// classes wrote them). Names are `[a-z_][a-z0-9_]*` (the tickets file is
/// checked) and class keys `@<n>of<n>`, so they cannot escape the key's
/// shape.
///
/// The holder of each class, as on the peers: `<prefix>/tickets/holder/
/// <class>` = `<generation> <identity> <superseded…>` (space-separated;
/// an identity holds no space). A takeover is a compare-and-set of that
/// key on its mod revision; a mark write with an identity compares the
/// same mod revision in the transaction that raises the mark, so a
/// takeover and a write by the identity it took the class from never both
/// succeed.
///
/// `<prefix>/tickets/moved_to` = the place `reshape` moved the marks to
/// ([`MarksConfig::places`]), written before the servers record it: a
/// server dump cannot roll it back, so every load and mark write here is
/// refused from then on (`moved_away`), read in the same transaction as
/// the marks. A reshape back to this place deletes it.
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

    /// The key `reshape` writes when the marks move away from this place.
    fn moved_key(&self) -> Vec<u8> {
        format!("{}/tickets/moved_to", self.prefix).into_bytes()
    }

    /// Records that the marks moved from this place to `to` (`reshape`,
    /// before any server records `to`): this place vouches no more.
    pub(crate) async fn mark_moved(&self, to: &str) -> Result<(), TicketError> {
        let put = [Op::Put(self.moved_key(), to.as_bytes().to_vec(), 0)];
        self.client
            .txn(&[], &put, &[])
            .await
            .map_err(|e| etcd_failed("reshape", e))?;
        Ok(())
    }

    /// Where `reshape` moved the marks from here, if it did.
    pub(crate) async fn moved_to(&self) -> Result<Option<String>, TicketError> {
        let answer = self
            .client
            .txn(&[], &[Op::Get(self.moved_key())], &[])
            .await
            .map_err(|e| etcd_failed("reshape", e))?;
        Ok(answer
            .kvs
            .into_iter()
            .find(|kv| kv.key == self.moved_key())
            .map(|kv| String::from_utf8_lossy(&kv.value).into_owned()))
    }

    /// Makes this place vouch again (`reshape` moving the marks here).
    pub(crate) async fn clear_moved(&self) -> Result<(), TicketError> {
        self.client
            .txn(&[], &[Op::Delete(self.moved_key())], &[])
            .await
            .map_err(|e| etcd_failed("reshape", e))?;
        Ok(())
    }

    /// `class`'s marks here, even where the marks moved away (`reshape`
    /// reads the place it moves them from).
    pub(crate) async fn load_even_if_moved(
        &self,
        class: &ResidueClass,
    ) -> Result<HashMap<String, u64>, TicketError> {
        self.load_marks(class, false).await
    }

    /// `class`'s marks (under its class key and, for older releases, its
    /// server's name) and, in the same read, whether the marks moved away
    /// from here: refused then where `heed_moved`.
    async fn load_marks(
        &self,
        class: &ResidueClass,
        heed_moved: bool,
    ) -> Result<HashMap<String, u64>, TicketError> {
        let server = &class.server;
        let prefixes = [self.holder_prefix(&class.key), self.holder_prefix(server)];
        let moved_key = self.moved_key();
        let reads = [
            Op::Prefix(prefixes[0].clone().into_bytes()),
            Op::Prefix(prefixes[1].clone().into_bytes()),
            Op::Get(moved_key.clone()),
        ];
        let answer = self
            .client
            .txn(&[], &reads, &[])
            .await
            .map_err(|e| etcd_failed(server, e))?;
        let mut marks = HashMap::new();
        for kv in answer.kvs {
            if kv.key == moved_key {
                if heed_moved {
                    return Err(moved_away(server, &self.prefix, &kv.value));
                }
                continue;
            }
            let Some(prefix) = prefixes.iter().find(|p| kv.key.starts_with(p.as_bytes())) else {
                continue;
            };
            let sequence = String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
            let mark = parse_mark(server, &kv.key, &kv.value)?;
            let held = marks.entry(sequence).or_insert(0);
            *held = mark.max(*held);
        }
        Ok(marks)
    }

    /// The key of `class`'s holder.
    fn holder_key(&self, class: &ResidueClass) -> Vec<u8> {
        format!("{}/tickets/holder/{}", self.prefix, class.key).into_bytes()
    }

    /// `class`'s holder in etcd and the mod revision of its key (0: none).
    async fn read_holder(
        &self,
        class: &ResidueClass,
    ) -> Result<(Option<Holder>, i64), TicketError> {
        let key = self.holder_key(class);
        let answer = self
            .client
            .txn(&[], &[Op::Get(key.clone())], &[])
            .await
            .map_err(|e| etcd_failed(&class.server, e))?;
        holder_in(&class.server, &key, &answer.kvs)
    }

    /// Makes `identity` the holder of `class` in etcd where it is not (a
    /// compare-and-set on the mod revision read). `Ok(false)`: another
    /// identity took the class meanwhile.
    async fn take(
        &self,
        class: &ResidueClass,
        identity: &str,
        readmit: bool,
    ) -> Result<bool, TicketError> {
        let key = self.holder_key(class);
        let (from, revision) = self.read_holder(class).await?;
        let (generation, mut gone) = match &from {
            Some(h) if h.identity == identity => return Ok(true),
            Some(h) if !readmit && h.supersedes(identity) => {
                return Err(superseded(class, identity, h));
            }
            Some(h) => (h.generation + 1, h.superseded.clone()),
            None => (1, Vec::new()),
        };
        if let Some(h) = &from {
            gone.push(h.identity.clone());
        }
        let value = std::iter::once(generation.to_string())
            .chain(std::iter::once(identity.to_string()))
            .chain(gone)
            .collect::<Vec<_>>()
            .join(" ");
        let answer = self
            .client
            .txn(
                &[Compare::ModRevisionIs(key.clone(), revision)],
                &[Op::Put(key.clone(), value.into_bytes(), 0)],
                &[Op::Get(key.clone())],
            )
            .await
            .map_err(|e| etcd_failed(&class.server, e))?;
        if answer.succeeded {
            return Ok(true);
        }
        // Another took it meanwhile: fine only if it was this identity.
        let (now, _) = holder_in(&class.server, &key, &answer.kvs)?;
        Ok(now.is_some_and(|h| h.identity == identity))
    }

    /// Sets `key` to `value` unless it already holds as much: a
    /// compare-and-set on the value read, so two services writing at once
    /// never lower a mark. With `fence` (`identity`, the holder key's mod
    /// revision read): only while the holder key is unchanged, in the
    /// same transaction; a holder of another identity refuses the write
    /// ([`TicketError::Superseded`]).
    async fn raise(
        &self,
        class: &ResidueClass,
        key: Vec<u8>,
        value: u64,
        fence: &mut Option<(&str, i64)>,
    ) -> Result<(), TicketError> {
        let server = class.server.as_str();
        let holder_key = self.holder_key(class);
        let moved_key = self.moved_key();
        let new = value.to_string().into_bytes();
        let mut seen: Option<Vec<u8>> = None;
        for _ in 0..RAISE_TRIES {
            let mut compare = vec![match &seen {
                None => Compare::Absent(key.clone()),
                Some(v) => Compare::ValueIs(key.clone(), v.clone()),
            }];
            if let Some((_, revision)) = fence {
                compare.push(Compare::ModRevisionIs(holder_key.clone(), *revision));
            }
            // A place the marks moved away from takes no mark (a client of
            // it running since before the move is stopped here).
            compare.push(Compare::Absent(moved_key.clone()));
            let put = [Op::Put(key.clone(), new.clone(), 0)];
            let failure = [
                Op::Get(key.clone()),
                Op::Get(holder_key.clone()),
                Op::Get(moved_key.clone()),
            ];
            let answer = self
                .client
                .txn(&compare, &put, &failure)
                .await
                .map_err(|e| etcd_failed(server, e))?;
            if answer.succeeded {
                return Ok(());
            }
            if let Some(kv) = answer.kvs.iter().find(|kv| kv.key == moved_key) {
                return Err(moved_away(server, &self.prefix, &kv.value));
            }
            if let Some((identity, revision)) = fence {
                let (holder, now) = holder_in(server, &holder_key, &answer.kvs)?;
                if now != *revision {
                    match holder {
                        Some(h) if h.identity != *identity => {
                            return Err(superseded(class, identity, &h));
                        }
                        // Rewritten for the same identity: write again.
                        _ => *revision = now,
                    }
                    continue;
                }
            }
            let Some(kv) = answer.kvs.into_iter().find(|kv| kv.key == key) else {
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

/// Another identity took `class` over in etcd during this takeover.
fn taken_meanwhile(class: &ResidueClass) -> TicketError {
    TicketError::db(
        &class.server,
        "take the class over",
        format!(
            "another server took residue class {} over in etcd at the same time",
            class.key
        ),
    )
}

/// A load or mark write at `prefix`, a place `reshape` moved the marks
/// away from (to `to`): the servers' record of it may be a restore's.
pub(crate) fn moved_away(server: &str, prefix: &str, to: &[u8]) -> TicketError {
    TicketError::LatticeChanged {
        server: server.to_string(),
        sequence: String::new(),
        change: format!(
            "this file keeps the marks under etcd prefix {prefix}, but the marks moved to {} (`shardflake tickets reshape`), so a client of this file would not see the marks written since and would hand out ids again; use the file naming that place, or, if the servers were restored from before the move (they record this file's place again), run `shardflake tickets reshape --config THAT_FILE`",
            String::from_utf8_lossy(to)
        ),
    }
}

fn etcd_failed(server: &str, e: impl ToString) -> TicketError {
    TicketError::Database {
        server: server.to_string(),
        context: "high-water marks in etcd".into(),
        message: e.to_string(),
    }
}

/// The holder among `kvs` (read from `key`) and its key's mod revision
/// (0: absent).
fn holder_in(
    server: &str,
    key: &[u8],
    kvs: &[shardflake_etcd::Kv],
) -> Result<(Option<Holder>, i64), TicketError> {
    let Some(kv) = kvs.iter().find(|kv| kv.key == key) else {
        return Ok((None, 0));
    };
    let text = String::from_utf8_lossy(&kv.value);
    let mut words = text.split_whitespace();
    let generation = words.next().and_then(|g| g.parse().ok());
    let identity = words.next();
    let (Some(generation), Some(identity)) = (generation, identity) else {
        return Err(etcd_failed(
            server,
            format!(
                "{} holds {text:?}, not a holder (generation, identity, superseded)",
                String::from_utf8_lossy(key)
            ),
        ));
    };
    let rest = words.collect::<Vec<_>>().join(" ");
    Ok((
        Some(holder_of(identity.to_string(), generation, &rest)),
        kv.mod_revision,
    ))
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
    /// With `identity`: fenced by the class's holder in etcd (none, or
    /// that identity), compared in each mark's own transaction.
    fn record<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: Option<&'a str>,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let mut fence = match identity {
                None => None,
                Some(identity) => match self.read_holder(class).await? {
                    (Some(h), _) if h.identity != identity => {
                        return Err(superseded(class, identity, &h));
                    }
                    (_, revision) => Some((identity, revision)),
                },
            };
            let prefix = self.holder_prefix(&class.key);
            for (sequence, mark) in marks {
                let key = format!("{prefix}{sequence}").into_bytes();
                self.raise(class, key, *mark, &mut fence).await?;
            }
            Ok(())
        })
    }

    fn claim<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: &'a str,
        readmit: bool,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            match self.take(class, identity, readmit).await? {
                true => Ok(()),
                false => Err(taken_meanwhile(class)),
            }
        })
    }

    fn holder<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<Option<Holder>, TicketError>> {
        Box::pin(async move { Ok(self.read_holder(class).await?.0) })
    }

    fn load<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>> {
        Box::pin(self.load_marks(class, true))
    }
}

/// Both stores: every mark goes to both, every load reads both. etcd the
/// file names is one more place of the [`Quorum`], as a peer is: a write
/// needs a majority of the servers and etcd, a load the rest plus one of
/// the places other than the class's server, so an etcd outage is a peer
/// outage, not a stop. (etcd vouching alone would need every write to
/// reach it: then an unreachable etcd would stop every server.) The
/// service's own etcd under a file that names none is written and read as
/// well but counts for no quorum: the file's other clients never write
/// there. The holder is recorded in both.
pub struct EtcdAndPeers {
    /// The marks in etcd.
    pub etcd: EtcdHighWater,
    /// The marks on the peers.
    pub peers: PeersStore,
}

impl EtcdAndPeers {
    /// Whether etcd is a place of the quorum: the file's `[marks]` names it.
    fn etcd_counts(&self) -> bool {
        !self.peers.config().marks.etcd.is_empty()
    }

    fn quorum(&self) -> Quorum {
        let servers = self.peers.quorum().places;
        Quorum::of(
            self.peers.config(),
            servers + usize::from(self.etcd_counts()),
        )
    }

    /// etcd's answer added to the peers' `tally` where etcd counts; logged
    /// where it does not.
    fn add_etcd(&self, tally: &mut Tally, class: &ResidueClass, answer: Result<(), TicketError>) {
        match (self.etcd_counts(), answer) {
            (true, answer) => tally.add(true, answer),
            (false, Err(e)) => {
                tracing::warn!(server = %class.server, error = %e, "the service's etcd took no ticket marks")
            }
            (false, Ok(())) => {}
        }
    }
}

impl HighWaterStore for EtcdAndPeers {
    /// A refusal of either (the class taken over) refuses the write,
    /// whatever the other took.
    fn record<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: Option<&'a str>,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            let (etcd, peers) = tokio::join!(
                self.etcd.record(class, identity, marks),
                self.peers.record_tally(class, identity, marks, quorum)
            );
            // A refusal on either side (another holder, or a reshaped peer
            // that has not this class) refuses the whole write.
            if let Err(e) = &etcd
                && e.is_refusal()
            {
                return Err(e.clone());
            }
            let mut tally = peers?;
            self.add_etcd(&mut tally, class, etcd);
            tally.written(quorum, class)
        })
    }

    /// Taken over in etcd and on the peers at once, recorded by a read's
    /// quorum; a refusal (superseded) or a takeover lost to another
    /// identity at either refuses it.
    fn claim<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: &'a str,
        readmit: bool,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            let (etcd, peers) = tokio::join!(
                self.etcd.take(class, identity, readmit),
                self.peers.claim_tally(class, identity, readmit, quorum)
            );
            if let Err(e) = &etcd
                && e.is_refusal()
            {
                return Err(e.clone());
            }
            // Not that a place did not answer: another took the class.
            let mut tally = peers?;
            let etcd = match etcd {
                Ok(true) => Ok(()),
                Ok(false) => return Err(taken_meanwhile(class)),
                Err(e) => Err(e),
            };
            self.add_etcd(&mut tally, class, etcd);
            tally.read(quorum, class)
        })
    }

    /// The highest generation that etcd or a peer records.
    fn holder<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<Option<Holder>, TicketError>> {
        Box::pin(async move {
            let (etcd, peers) = tokio::join!(self.etcd.holder(class), self.peers.holder(class));
            let found = either(&class.server, [etcd, peers])?;
            Ok(found.into_iter().flatten().max_by_key(|h| h.generation))
        })
    }

    fn load<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            let (etcd, (mut marks, mut tally)) =
                tokio::join!(self.etcd.load(class), self.peers.load_tally(class, quorum));
            // The marks moved away from this etcd place: the peers' marks
            // (perhaps restored from before) cannot vouch either.
            if let Err(e) = &etcd
                && e.is_refusal()
            {
                return Err(e.clone());
            }
            let etcd = etcd.map(|found| merge(&mut marks, found));
            self.add_etcd(&mut tally, class, etcd);
            tally.read(quorum, class)?;
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
