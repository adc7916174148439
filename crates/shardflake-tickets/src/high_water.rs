//! High-water marks: for each residue class and sequence, a mark that every
//! id a client may hand out from the server answering for that class is at
//! or below, kept somewhere that survives that server, so that a server
//! that comes back *behind* (restored from a backup, a lagging replica
//! promoted) or replaces it (a fresh server, under any name) is raised past
//! them before it hands out an id again.
//!
//! Marks are keyed by the class ([`ResidueClass`]: the offset within the
//! increment), not by the server's name in the file: the ids a class
//! handed out are the class's whoever answers for it, so a server renamed
//! in the file, or replaced by one under a new name, finds them. Marks
//! written under a server's name (before classes) are read as well, as
//! long as the file names that server: a deployment upgrades without
//! losing them, and its clients write them again under the class.
//!
//! Marks are written *ahead* (`failover::Pool`): a per-id client writes
//! `mark_ahead` ids past the last id it saw before it hands out any id above
//! its last mark; a segment client writes the end of every block it reserves
//! (prefetched ones included) before the block's first id is handed out.
//! Marks only go up (`GREATEST`): a segment tail is skipped, never given
//! back, so every mark read stays a floor.
//!
//! [`HighWaterStore`] is the small seam: [`PeersStore`] keeps each server's
//! marks in a `shardflake_ticket_hw` table on every server; a tickets file
//! whose `[marks]` names etcd adds it for every client
//! ([`crate::etcd_marks`], built by [`stores`]). Every place is asked at
//! once, each within `marks_timeout_ms`.
//!
//! The places are a read/write [`Quorum`]: a mark write succeeds only when
//! a majority of the places took it, enough of them *other than the
//! class's server* that every read meets it there, and a load vouches for
//! a server only when enough places other than that server answered (the
//! server's own copy is rolled back with it). So no id leaves a client on
//! a mark only its own server holds (with two places, the peer must take
//! it), and a peer that missed marks while it was down never vouches
//! alone: with three servers, one down while marks were written, then the
//! up-to-date one down, the stale one is not enough.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::Mutex;

use crate::backend::{Backend, Holder, MarkFence};
use crate::config::{Config, ServerConfig};
use crate::error::TicketError;
use crate::session::Session;

/// A boxed future (the store is used as `dyn HighWaterStore`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The residue class a server answers for: whose marks a store keeps.
/// `key` names the class (`@<offset>of<increment>`; a `@` is never in a
/// server's name, so a class key and a name-keyed mark of an older
/// release never meet); `server` is the name in the file of the server
/// answering for it now (errors, logs, and which place is its own copy).
/// `lattice`: the lattice version the writer's session of that server is
/// pinned to; a mark write carrying it is taken only by a place recording
/// that version. The key stays the same across a reshape that keeps the
/// offsets and the increment (a new chunk, say), the version does not: a
/// server gone back to before a reshape, or a client on the file of
/// before it, is refused by every place past it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResidueClass {
    /// `@<offset>of<increment>`.
    pub key: String,
    /// The server of the file that answers for it.
    pub server: String,
    /// The lattice version its marks are written under (`None`: any, as
    /// `reshape` raising every class's marks itself).
    pub lattice: Option<i64>,
}

impl ResidueClass {
    /// The class `server` answers for under `config`.
    pub fn of(config: &Config, server: &ServerConfig) -> ResidueClass {
        ResidueClass {
            key: format!("@{}of{}", server.offset, config.increment),
            server: server.name.clone(),
            lattice: None,
        }
    }

    /// This class, its marks written under lattice `version` (0: a server
    /// that never said its version, written under any).
    pub fn pinned(&self, version: i64) -> ResidueClass {
        ResidueClass {
            lattice: (version > 0).then_some(version),
            ..self.clone()
        }
    }

    /// The class of the server named `server` in `config` (a name the file
    /// does not hold is a class of its own, keyed by that name).
    pub fn named(config: &Config, server: &str) -> ResidueClass {
        match config.servers.iter().find(|s| s.name == server) {
            Some(s) => ResidueClass::of(config, s),
            None => ResidueClass {
                key: server.to_string(),
                server: server.to_string(),
                lattice: None,
            },
        }
    }
}

/// Where high-water marks live.
pub trait HighWaterStore: Send + Sync {
    /// Raises (never lowers) `class`'s marks: `(sequence, mark)`. `Ok` once
    /// a write's majority of the places holds them, enough of them other
    /// than the class's server ([`Quorum::write`], [`Quorum::write_others`];
    /// else [`TicketError::NoHighWater`]). With `identity` (the server whose
    /// ids they cover), a place that records another identity as the
    /// class's holder refuses them, and so does the whole write
    /// ([`TicketError::Superseded`]).
    fn record<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: Option<&'a str>,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>>;

    /// Makes `identity` the holder of `class` where it is not: compare-
    /// and-set of the holder record (generation + 1) in every place that
    /// answers, before the class's marks are read; `Ok` once a read's
    /// quorum of places other than the class's server recorded it
    /// ([`Quorum::read`]: the takeover meets every later mark write of the
    /// identity it took the class from). An identity that held
    /// the class and was taken over is refused
    /// ([`TicketError::Superseded`]) unless `readmit` (`tickets
    /// takeover`). The default records nothing.
    fn claim<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: &'a str,
        readmit: bool,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        let _ = (class, identity, readmit);
        Box::pin(async { Ok(()) })
    }

    /// The holder of `class`: the highest generation any place records.
    fn holder<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<Option<Holder>, TicketError>> {
        let _ = class;
        Box::pin(async { Ok(None) })
    }

    /// `class`'s marks, per sequence: the largest from every place that
    /// answered, under its key and its server's name. An error
    /// ([`TicketError::NoHighWater`]) unless a read's quorum of places
    /// other than the class's server answered ([`Quorum::read`]): those
    /// survive a restore of the server, and hold every mark a write's
    /// majority took.
    fn load<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>>;
}

/// How many places keep a class's marks (each server of the file, and etcd
/// when the file names it), and how many must take a mark write or answer
/// a read: every read meets every write in a place other than the class's
/// own server, whose copy is rolled back with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorum {
    /// The places.
    pub places: usize,
    /// `[failover] allow_without_marks`: a write the class's own server
    /// alone took counts too (availability over safety: a restore of that
    /// server loses the marks, and its ids can be handed out again).
    pub own_copy_counts: bool,
}

impl Quorum {
    /// The quorum of `places` under `config`'s `[failover]`.
    pub fn of(config: &Config, places: usize) -> Quorum {
        Quorum {
            places,
            own_copy_counts: config.failover.allow_without_marks,
        }
    }

    /// A mark write: a majority of the places, of which at least
    /// [`Quorum::write_others`] other than the class's server. With two
    /// places or fewer, one: a majority of two is both, and one place down
    /// would stop every server.
    pub fn write(self) -> usize {
        match self.places {
            0..=2 => 1,
            n => n / 2 + 1,
        }
    }

    /// Of a mark write's places, how many must be other than the class's
    /// server (the only place when it is alone): enough to meet every
    /// read ([`Quorum::read`] of them) there, since its own copy goes back
    /// with a restore of it. With two places, the other one: a server
    /// whose only peer is down writes no new mark, so its clients hand
    /// out only the ids already marked, then refuse (`no_high_water`).
    /// From three places on, a write's majority holds that many already.
    pub fn write_others(self) -> usize {
        self.places.saturating_sub(1).saturating_sub(self.read()) + 1
    }

    /// A read: answers from places other than the class's server, enough
    /// to meet every write's majority outside it (places − write + 1);
    /// with two places the other one, with one the server itself.
    pub fn read(self) -> usize {
        match self.places {
            0..=2 => 1,
            n => n - self.write() + 1,
        }
    }

    /// Whether place `i`'s answer counts for a read of `class`: not the
    /// class's own server, unless it is the only place.
    fn counts(self, config: &Config, i: usize, class: &ResidueClass) -> bool {
        config.servers[i].name != class.server || self.places == 1
    }
}

/// What the places answered to one write or read, counted for a
/// [`Quorum`].
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Places that took the write (or answered the read).
    pub took: usize,
    /// Of those, the ones that count for a read ([`Quorum::read`]).
    pub others: usize,
    /// Why the other places did not.
    pub errors: Vec<TicketError>,
}

impl Tally {
    /// One place's answer; `counts`: it counts for a read.
    pub fn add(&mut self, counts: bool, answer: Result<(), TicketError>) {
        match answer {
            Ok(()) => {
                self.took += 1;
                self.others += usize::from(counts);
            }
            Err(e) => self.errors.push(e),
        }
    }

    /// `Ok` when a write's majority took it, with enough places other than
    /// the class's server among them ([`Quorum::write_others`]), else
    /// `no_high_water` naming the counts and each place's reason.
    pub fn written(self, quorum: Quorum, class: &ResidueClass) -> Result<(), TicketError> {
        let others = quorum.own_copy_counts || self.others >= quorum.write_others();
        match self.took >= quorum.write() && others {
            true => Ok(()),
            false => Err(TicketError::NoHighWater {
                server: class.server.clone(),
                reason: format!(
                    "{} of {} places took the marks, {} needed, {} of them other than the server ({} needed: its own copy goes back with a restore of it): {}",
                    self.took,
                    quorum.places,
                    quorum.write(),
                    self.others,
                    quorum.write_others(),
                    reasons(&self.errors)
                ),
            }),
        }
    }

    /// `Ok` when enough places other than the class's server answered.
    pub fn read(self, quorum: Quorum, class: &ResidueClass) -> Result<(), TicketError> {
        match self.others >= quorum.read() {
            true => Ok(()),
            false => Err(TicketError::NoHighWater {
                server: class.server.clone(),
                reason: format!(
                    "{} of the places other than it answered, {} needed (of {} places, a write needs {}): {}",
                    self.others,
                    quorum.read(),
                    quorum.places,
                    quorum.write(),
                    reasons(&self.errors)
                ),
            }),
        }
    }
}

/// The stores the tickets file names: `peers`, and etcd as well when its
/// `[marks]` names it (each etcd call within the peers' timeout). Every
/// client of the file uses these: the library, the CLI, the service.
pub fn stores(peers: PeersStore) -> Arc<dyn HighWaterStore> {
    let marks = &peers.config.marks;
    match marks.etcd.is_empty() {
        true => Arc::new(peers),
        false => Arc::new(crate::etcd_marks::EtcdAndPeers {
            etcd: crate::etcd_marks::EtcdHighWater::from_file(marks, peers.timeout),
            peers,
        }),
    }
}

/// Marks kept in every server's `shardflake_ticket_hw` table, over one
/// admin connection per server.
pub struct PeersStore {
    config: Config,
    sessions: Vec<Mutex<Option<Session>>>,
    timeout: Duration,
    /// The setting `timeout` comes from.
    setting: &'static str,
}

impl PeersStore {
    /// A store over the servers of `config` (connects lazily), each place
    /// within `marks_timeout_ms`.
    pub fn new(config: Config) -> PeersStore {
        let timeout = config.failover.marks_timeout();
        PeersStore::with_timeout(config, timeout)
    }

    /// The same, each place within `timeout` (the admin commands wait
    /// `admin_timeout_ms`).
    pub fn with_timeout(config: Config, timeout: Duration) -> PeersStore {
        let sessions = config.servers.iter().map(|_| Mutex::new(None)).collect();
        // What a timeout names: the setting the operator changes.
        let setting = match timeout {
            t if t == config.failover.marks_timeout() => "`[failover] marks_timeout_ms`",
            t if t == config.failover.admin_timeout() => "`[failover] admin_timeout_ms`",
            _ => "the marks store's timeout",
        };
        PeersStore {
            config,
            sessions,
            timeout,
            setting,
        }
    }

    /// The tickets file it serves.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The quorum of the servers alone (a file that names no etcd).
    pub(crate) fn quorum(&self) -> Quorum {
        Quorum::of(&self.config, self.config.servers.len())
    }

    /// Runs `op` on every server at once, each within the timeout.
    async fn on_all<T, F>(&self, op: impl Fn(usize, Session) -> F) -> Vec<Result<T, TicketError>>
    where
        F: Future<Output = (Session, Result<T, TicketError>)>,
    {
        join_all((0..self.config.servers.len()).map(|i| self.on(i, &op))).await
    }

    /// Runs one operation on server `i` (which hands the session back),
    /// connecting if needed; a failed or timed-out session is dropped.
    async fn on<T, F>(&self, i: usize, op: &impl Fn(usize, Session) -> F) -> Result<T, TicketError>
    where
        F: Future<Output = (Session, Result<T, TicketError>)>,
    {
        let server = &self.config.servers[i];
        let work = async {
            let mut slot = self.sessions[i].lock().await;
            let session = match slot.take() {
                Some(s) => s,
                None => Session::connect_admin(server, &self.config).await?,
            };
            let (session, result) = op(i, session).await;
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
                    setting: self.setting,
                })
            })
    }
}

/// `identity` of `class`'s server, taken over by `holder`.
pub(crate) fn superseded(class: &ResidueClass, identity: &str, holder: &Holder) -> TicketError {
    TicketError::Superseded(Box::new(crate::error::Superseded {
        server: class.server.clone(),
        class: class.key.clone(),
        identity: identity.to_string(),
        holder: holder.identity.clone(),
    }))
}

fn reasons(errors: &[TicketError]) -> String {
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

impl PeersStore {
    /// Raises `class`'s marks on every server: which took them, or a
    /// refusal (a server that records another holder of the class, a
    /// reshaped one without it), which refuses the whole write.
    pub(crate) async fn record_tally(
        &self,
        class: &ResidueClass,
        identity: Option<&str>,
        marks: &[(String, u64)],
        quorum: Quorum,
    ) -> Result<Tally, TicketError> {
        let rows: Vec<(String, String, u64)> = marks
            .iter()
            .map(|(q, hw)| (class.key.clone(), q.clone(), *hw))
            .collect();
        let rows = &rows;
        let fence = identity.map(|identity| MarkFence {
            class: &class.key,
            identity,
            lattice: class.lattice,
        });
        let results = self
            .on_all(|_, mut s| async move {
                let r = match s.write_high_water(rows, fence).await {
                    Ok(true) => Ok(None),
                    Ok(false) => match s.read_holder(&class.key).await {
                        Ok(Some(h)) if Some(h.identity.as_str()) != identity => Ok(Some(h)),
                        Ok(_) => Err(TicketError::db(
                            &class.server,
                            "write high-water marks",
                            "the class's holder changed under the write",
                        )),
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                (s, r)
            })
            .await;
        let mut tally = Tally::default();
        for (i, result) in results.into_iter().enumerate() {
            let counts = quorum.counts(&self.config, i, class);
            match result {
                Ok(None) => tally.add(counts, Ok(())),
                // Another identity holds the class there: this server
                // was taken over, whatever the other places say.
                Ok(Some(holder)) => {
                    return Err(superseded(class, identity.unwrap_or(""), &holder));
                }
                // A reshaped place refuses a class of the lattice before:
                // so does the whole write.
                Err(e) if e.is_refusal() => return Err(e),
                Err(e) => tally.add(counts, Err(e)),
            }
        }
        Ok(tally)
    }

    /// Makes `identity` the holder of `class` on every server that
    /// answers (see [`HighWaterStore::claim`]): which recorded it, or a
    /// refusal, or another identity that took it at the same time.
    pub(crate) async fn claim_tally(
        &self,
        class: &ResidueClass,
        identity: &str,
        readmit: bool,
        quorum: Quorum,
    ) -> Result<Tally, TicketError> {
        let server = class.server.as_str();
        let read = self
            .on_all(|_, mut s| async move {
                let r = s.read_holder(&class.key).await;
                (s, r)
            })
            .await;
        if !readmit {
            for holder in read.iter().flatten().flatten() {
                if holder.supersedes(identity) {
                    return Err(superseded(class, identity, holder));
                }
            }
        }
        let read = &read;
        let taken = self
            .on_all(|i, mut s| async move {
                let r = match &read[i] {
                    Ok(Some(h)) if h.identity == identity => Ok(true),
                    Ok(from) => s.claim(&class.key, identity, server, from.as_ref()).await,
                    Err(e) => Err(e.clone()),
                };
                (s, r)
            })
            .await;
        let mut tally = Tally::default();
        for (i, result) in taken.into_iter().enumerate() {
            let counts = quorum.counts(&self.config, i, class);
            match result {
                Ok(true) => tally.add(counts, Ok(())),
                Ok(false) => {
                    return Err(TicketError::db(
                        server,
                        "take the class over",
                        format!(
                            "{} took residue class {} over at the same time",
                            self.config.servers[i].name, class.key
                        ),
                    ));
                }
                Err(e) if counts => tally.add(counts, Err(e)),
                Err(_) => {}
            }
        }
        Ok(tally)
    }

    /// `class`'s marks on every server that answers (the largest of each
    /// sequence, under its key and its server's name), and which answered.
    pub(crate) async fn load_tally(
        &self,
        class: &ResidueClass,
        quorum: Quorum,
    ) -> (HashMap<String, u64>, Tally) {
        let keys = [class.key.as_str(), class.server.as_str()];
        let keys = &keys;
        let results = self
            .on_all(|_, mut s| async move {
                let r = s.read_high_water(keys).await;
                (s, r)
            })
            .await;
        let mut marks = HashMap::new();
        let mut tally = Tally::default();
        for (i, result) in results.into_iter().enumerate() {
            let counts = quorum.counts(&self.config, i, class);
            match result {
                Ok(rows) => {
                    tally.add(counts, Ok(()));
                    merge(&mut marks, rows);
                }
                Err(e) if counts => tally.add(counts, Err(e)),
                Err(_) => {}
            }
        }
        (marks, tally)
    }
}

/// Raises each sequence's mark in `marks` to the one in `found`.
pub(crate) fn merge(
    marks: &mut HashMap<String, u64>,
    found: impl IntoIterator<Item = (String, u64)>,
) {
    for (sequence, hw) in found {
        let mark = marks.entry(sequence).or_insert(0);
        *mark = hw.max(*mark);
    }
}

impl HighWaterStore for PeersStore {
    fn record<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: Option<&'a str>,
        marks: &'a [(String, u64)],
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            self.record_tally(class, identity, marks, quorum)
                .await?
                .written(quorum, class)
        })
    }

    fn claim<'a>(
        &'a self,
        class: &'a ResidueClass,
        identity: &'a str,
        readmit: bool,
    ) -> BoxFuture<'a, Result<(), TicketError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            self.claim_tally(class, identity, readmit, quorum)
                .await?
                .read(quorum, class)
        })
    }

    fn holder<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<Option<Holder>, TicketError>> {
        Box::pin(async move {
            let read = self
                .on_all(|_, mut s| async move {
                    let r = s.read_holder(&class.key).await;
                    (s, r)
                })
                .await;
            let mut errors = Vec::new();
            let mut best: Option<Holder> = None;
            let mut answered = false;
            for result in read {
                match result {
                    Ok(h) => {
                        answered = true;
                        if let Some(h) = h
                            && best.as_ref().is_none_or(|b| h.generation > b.generation)
                        {
                            best = Some(h);
                        }
                    }
                    Err(e) => errors.push(e),
                }
            }
            match answered {
                true => Ok(best),
                false => Err(TicketError::NoHighWater {
                    server: class.server.clone(),
                    reason: reasons(&errors),
                }),
            }
        })
    }

    fn load<'a>(
        &'a self,
        class: &'a ResidueClass,
    ) -> BoxFuture<'a, Result<HashMap<String, u64>, TicketError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            let (marks, tally) = self.load_tally(class, quorum).await;
            tally.read(quorum, class)?;
            Ok(marks)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quorum(places: usize) -> Quorum {
        Quorum {
            places,
            own_copy_counts: false,
        }
    }

    fn tally(own: bool, others: usize) -> Tally {
        let mut tally = Tally::default();
        tally.add(
            false,
            if own {
                Ok(())
            } else {
                Err(TicketError::db("a", "x", "down"))
            },
        );
        for _ in 0..others {
            tally.add(true, Ok(()));
        }
        tally
    }

    #[test]
    fn a_write_needs_enough_places_other_than_the_server_to_meet_every_read() {
        for places in 2..=7 {
            let q = quorum(places);
            // Every write meets every read outside the server.
            assert!(q.write_others() + q.read() > places - 1, "{places}");
            assert!(q.write_others() <= q.write(), "{places}");
        }
        assert_eq!(quorum(1).write_others(), 1);
        assert_eq!(quorum(2).write_others(), 1);
        assert_eq!(quorum(3).write_others(), 1);
        assert_eq!(quorum(4).write_others(), 2);
    }

    #[test]
    fn the_servers_own_copy_alone_is_no_write_unless_availability_wins() {
        let class = ResidueClass {
            key: "@1of2".into(),
            server: "a".into(),
            lattice: None,
        };
        let e = tally(true, 0).written(quorum(2), &class).unwrap_err();
        assert!(
            e.to_string().contains("0 of them other than the server"),
            "{e}"
        );
        tally(false, 1).written(quorum(2), &class).unwrap();
        tally(true, 1).written(quorum(3), &class).unwrap();
        assert!(tally(true, 0).written(quorum(3), &class).is_err());
        let lenient = Quorum {
            places: 2,
            own_copy_counts: true,
        };
        tally(true, 0).written(lenient, &class).unwrap();
    }
}
