//! One ticket server as the client sees it: a few sessions, a circuit
//! breaker (up, down, refused), the high-water marks it is known to have
//! reached, and its metrics.
//!
//! A server whose call errs or times out is marked down and skipped; the
//! client's prober ([`crate::client`]) reconnects it in the background
//! every `probe_interval_ms` and takes it back when the reconnect passes the
//! checks. Every new session is checked before its first use: increment and
//! offset (or the sequence's schema) as in the file, and each sequence's
//! counter at or above the server's high-water (the larger of the marks in
//! memory and in the [`HighWaterStore`]). A server
//! that fails those checks is *refused* with the typed reason until it
//! passes them (after `shardflake tickets repair`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::config::{Config, ServerConfig};
use crate::error::TicketError;
use crate::high_water::HighWaterStore;
use crate::segment::Lattice;
use crate::session::Session;

/// A server's breaker state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Calls go to it.
    Up,
    /// Its last call or connect failed; probed until it answers.
    Down(String),
    /// It answers but must not be used: behind its high-water, or
    /// misconfigured. Probed until the reason is gone.
    Refused(TicketError),
}

impl Health {
    /// `up`, `down`, or the refusal's code (`behind_high_water`, `misconfigured`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Down(_) => "down",
            Health::Refused(e) => e.code(),
        }
    }
}

/// What one server's call does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// A per-id ticket of sequence `index`.
    Ticket(usize),
    /// Reserve a block: `max_id = GREATEST(max_id, floor) + step`.
    Reserve { index: usize, floor: i64, step: i64 },
    /// Set the row back to `to` if it is still `expected`.
    GiveBack {
        index: usize,
        expected: i64,
        to: i64,
    },
}

/// What it gave back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Id(u64),
    Row(i64),
    Done(bool),
}

/// A server's metrics, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerMetrics {
    /// Its name.
    pub name: String,
    /// `mariadb` or `postgres`.
    pub kind: &'static str,
    /// `up`, `down`, `behind_high_water` or `misconfigured`.
    pub state: &'static str,
    /// Why it is not up.
    pub reason: Option<String>,
    /// Calls that succeeded (ids in per-id mode, blocks in segment mode).
    pub calls: u64,
    /// Calls that failed on it (each moved to another server or failed).
    pub failovers: u64,
    /// Mean latency of its successful calls, in microseconds.
    pub latency_mean_us: f64,
    /// Largest latency of a successful call, in microseconds.
    pub latency_max_us: u64,
    /// Ids reserved from it and never handed out (segment mode).
    pub skipped_ids: u64,
}

/// A server's state before its first connect.
const NOT_CONNECTED: &str = "not connected yet";

pub(crate) struct Server {
    pub config: ServerConfig,
    pub index: usize,
    pub lattice: Lattice,
    slots: Vec<tokio::sync::Mutex<Option<Session>>>,
    next_slot: AtomicUsize,
    health: Mutex<Health>,
    /// Per sequence: the largest id handed out from it (chunk end in segment mode).
    pub high_water: Vec<AtomicU64>,
    /// Per sequence: the mark last written to the store.
    pub recorded: Vec<AtomicU64>,
    /// Calls on it now (waiting for a session or running): the client
    /// sends the next call to the up server with the fewest.
    in_flight: AtomicUsize,
    calls: AtomicU64,
    failovers: AtomicU64,
    latency_ns: AtomicU64,
    latency_max_ns: AtomicU64,
    pub skipped: AtomicU64,
}

impl Server {
    pub fn new(config: &Config, index: usize) -> Server {
        let server = config.servers[index].clone();
        let per_sequence = || config.sequences.iter().map(|_| AtomicU64::new(0)).collect();
        Server {
            lattice: Lattice::new(config, &server),
            slots: (0..server.connections)
                .map(|_| tokio::sync::Mutex::new(None))
                .collect(),
            config: server,
            index,
            next_slot: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            health: Mutex::new(Health::Down(NOT_CONNECTED.into())),
            high_water: per_sequence(),
            recorded: per_sequence(),
            calls: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            latency_ns: AtomicU64::new(0),
            latency_max_ns: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    pub fn health(&self) -> Health {
        self.health.lock().map(|h| h.clone()).unwrap_or(Health::Up)
    }

    fn set_health(&self, health: Health) {
        if let Ok(mut h) = self.health.lock() {
            let first = *h == Health::Down(NOT_CONNECTED.into());
            if *h != health {
                match &health {
                    Health::Up if first => {
                        tracing::debug!(server = %self.config.name, "ticket server up")
                    }
                    Health::Up => {
                        tracing::info!(server = %self.config.name, "ticket server up again")
                    }
                    Health::Down(reason) => {
                        tracing::warn!(server = %self.config.name, %reason, "ticket server down")
                    }
                    Health::Refused(e) => {
                        tracing::error!(server = %self.config.name, error = %e, "ticket server refused")
                    }
                }
            }
            *h = health;
        }
    }

    pub fn mark_up(&self) {
        self.set_health(Health::Up);
    }

    /// Records a failed call or connect: refused for a typed refusal, down otherwise.
    pub fn failed(&self, error: &TicketError) {
        self.failovers.fetch_add(1, Ordering::Relaxed);
        self.mark_failed(error);
    }

    pub fn mark_failed(&self, error: &TicketError) {
        match error {
            TicketError::BehindHighWater { .. } | TicketError::Misconfigured { .. } => {
                self.set_health(Health::Refused(error.clone()))
            }
            other => self.set_health(Health::Down(other.to_string())),
        }
        self.drop_idle_sessions();
    }

    /// Closes the sessions not in use: after a failure they most likely
    /// lead to a dead or refused server, and each would fail once more
    /// after the server is taken back (sessions in use drop themselves
    /// when they fail).
    fn drop_idle_sessions(&self) {
        for slot in &self.slots {
            if let Ok(mut session) = slot.try_lock() {
                session.take();
            }
        }
    }

    /// Raises the in-memory high-water of sequence `index`.
    pub fn note_high_water(&self, index: usize, id: u64) {
        self.high_water[index].fetch_max(id, Ordering::Relaxed);
    }

    /// A new session, checked: settings (in connect) and every sequence's
    /// counter against its high-water.
    pub async fn open(
        &self,
        config: &Config,
        store: &dyn HighWaterStore,
    ) -> Result<Session, TicketError> {
        let mut session = Session::connect(&self.config, config).await?;
        let stored = match store.load(&self.config.name).await {
            Ok(marks) => marks,
            Err(e) => {
                tracing::warn!(server = %self.config.name, error = %e,
                    "no peer holds this server's high-water now; checking against the marks in memory only");
                Default::default()
            }
        };
        for (i, seq) in config.sequences.iter().enumerate() {
            let high_water = stored
                .get(&seq.name)
                .copied()
                .unwrap_or(0)
                .max(self.high_water[i].load(Ordering::Relaxed));
            let counter = session
                .counter(config, &self.config, seq)
                .await?
                .ok_or_else(|| {
                    TicketError::misconfigured(
                        &self.config.name,
                        format!(
                            "sequence {:?} is not initialised (run `shardflake tickets init`)",
                            seq.name
                        ),
                    )
                })?;
            if counter < high_water {
                return Err(TicketError::BehindHighWater {
                    server: self.config.name.clone(),
                    sequence: seq.name.clone(),
                    counter,
                    high_water,
                });
            }
            // What the peers know, this client now knows too.
            self.note_high_water(i, high_water);
        }
        Ok(session)
    }

    /// Runs `op` on one of its sessions (opening it if needed). A session
    /// whose call failed is dropped (also when the caller's timeout cancels
    /// the call: the session is out of its slot while in use).
    pub async fn run(
        &self,
        config: &Config,
        store: &dyn HighWaterStore,
        op: Op,
    ) -> Result<Outcome, TicketError> {
        let _in_flight = InFlight::enter(&self.in_flight);
        let n = self.slots.len();
        let first = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let mut guard = None;
        for k in 0..n {
            if let Ok(g) = self.slots[(first + k) % n].try_lock() {
                guard = Some(g);
                break;
            }
        }
        let mut guard = match guard {
            Some(g) => g,
            None => self.slots[first % n].lock().await,
        };
        let mut session = match guard.take() {
            Some(s) => s,
            None => self.open(config, store).await?,
        };
        let started = Instant::now();
        let result = match op {
            Op::Ticket(index) => {
                let seq = &config.sequences[index];
                session.next_ticket(index, seq).await.and_then(|id| {
                    self.check_residue(config, id)?;
                    if id > seq.max_id() {
                        return Err(TicketError::Exhausted {
                            sequence: seq.name.clone(),
                            max: seq.max_id(),
                        });
                    }
                    Ok(Outcome::Id(id))
                })
            }
            Op::Reserve { index, floor, step } => session
                .reserve(&config.sequences[index], floor, step)
                .await
                .map(Outcome::Row),
            Op::GiveBack {
                index,
                expected,
                to,
            } => session
                .give_back(&config.sequences[index], expected, to)
                .await
                .map(Outcome::Done),
        };
        match &result {
            Ok(_) => {
                let ns = started.elapsed().as_nanos() as u64;
                self.calls.fetch_add(1, Ordering::Relaxed);
                self.latency_ns.fetch_add(ns, Ordering::Relaxed);
                self.latency_max_ns.fetch_max(ns, Ordering::Relaxed);
                *guard = Some(session);
            }
            Err(TicketError::Exhausted { .. }) => *guard = Some(session),
            Err(_) => {}
        }
        result
    }

    /// A per-id ticket must be in this server's residue class: one that is
    /// not means the server hands out another server's ids.
    fn check_residue(&self, config: &Config, id: u64) -> Result<(), TicketError> {
        if id % config.increment != self.config.offset % config.increment {
            return Err(TicketError::misconfigured(
                &self.config.name,
                format!(
                    "it handed out {id}, which is not ≡ {} (mod {})",
                    self.config.offset, config.increment
                ),
            ));
        }
        Ok(())
    }

    /// Calls on this server now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Puts a probed session into an empty slot.
    pub async fn adopt(&self, session: Session) {
        let mut slot = self.slots[0].lock().await;
        if slot.is_none() {
            *slot = Some(session);
        }
    }

    pub fn metrics(&self) -> ServerMetrics {
        let health = self.health();
        let calls = self.calls.load(Ordering::Relaxed);
        let latency = self.latency_ns.load(Ordering::Relaxed);
        ServerMetrics {
            name: self.config.name.clone(),
            kind: self.config.kind.as_str(),
            state: health.as_str(),
            reason: match health {
                Health::Up => None,
                Health::Down(r) => Some(r),
                Health::Refused(e) => Some(e.to_string()),
            },
            calls,
            failovers: self.failovers.load(Ordering::Relaxed),
            latency_mean_us: if calls == 0 {
                0.0
            } else {
                latency as f64 / calls as f64 / 1000.0
            },
            latency_max_us: self.latency_max_ns.load(Ordering::Relaxed) / 1000,
            skipped_ids: self.skipped.load(Ordering::Relaxed),
        }
    }
}

/// The servers one call tries, starting from turn `first`: those up, the
/// one with the fewest calls in flight first (the turn breaks ties); then,
/// if none of them answered, those marked down (a breaker that is open on
/// every server must not fail calls without trying); never those refused.
///
/// Fewest in flight, not the turn alone: callers pinned to a server, as in
/// a bare loop, spread evenly, but blind turns pile calls up on one server
/// while another idles (MariaDB per-id, 8 callers: 0.81x the bare loop by
/// turns alone, 1.00x this way; docs/BENCHMARKS.md).
pub(crate) fn call_order(servers: &[Server], first: usize) -> Vec<&Server> {
    let n = servers.len();
    let (mut up, mut down) = (Vec::with_capacity(n), Vec::new());
    for server in (0..n).map(|k| &servers[(first + k) % n]) {
        match server.health() {
            Health::Up => up.push(server),
            Health::Down(_) => down.push(server),
            Health::Refused(_) => {}
        }
    }
    // Each count read once: other calls move them while this one sorts, and
    // a sort whose keys change under it may panic. Stable: ties keep the turn.
    up.sort_by_cached_key(|s| s.in_flight());
    up.extend(down);
    up
}

/// Counts a call in [`Server::run`] until it returns or is cancelled (the
/// caller's timeout drops the future).
struct InFlight<'a>(&'a AtomicUsize);

impl<'a> InFlight<'a> {
    fn enter(counter: &'a AtomicUsize) -> InFlight<'a> {
        counter.fetch_add(1, Ordering::Relaxed);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(n: usize) -> Vec<Server> {
        let mut toml = String::new();
        for i in 1..=n {
            toml += &format!(
                "[[servers]]\nname = \"s{i}\"\nkind = \"mariadb\"\nurl = \"mysql://root@127.0.0.1:1/app\"\noffset = {i}\n"
            );
        }
        toml += "[[sequences]]\nname = \"photos\"\n";
        let config = Config::parse(&toml).unwrap();
        (0..n).map(|i| Server::new(&config, i)).collect()
    }

    fn names(order: Vec<&Server>) -> Vec<&str> {
        order.iter().map(|s| s.config.name.as_str()).collect()
    }

    #[test]
    fn calls_go_in_turn_to_the_least_busy_up_server_then_to_those_down() {
        let s = servers(3);
        for server in &s {
            server.mark_up();
        }
        // Idle: the turn decides.
        assert_eq!(names(call_order(&s, 0)), ["s1", "s2", "s3"]);
        assert_eq!(names(call_order(&s, 4)), ["s2", "s3", "s1"]);
        // Two calls on s2, one on s3: s1 first whatever the turn.
        let _a = InFlight::enter(&s[1].in_flight);
        let _b = InFlight::enter(&s[1].in_flight);
        let c = InFlight::enter(&s[2].in_flight);
        assert_eq!(names(call_order(&s, 1)), ["s1", "s3", "s2"]);
        drop(c);
        assert_eq!(names(call_order(&s, 1)), ["s3", "s1", "s2"]);
        // Down goes last, refused never.
        s[0].mark_failed(&TicketError::Timeout {
            server: "s1".into(),
            context: "call".into(),
            ms: 1,
        });
        s[2].mark_failed(&TicketError::misconfigured("s3", "offset"));
        assert_eq!(names(call_order(&s, 0)), ["s2", "s1"]);
        assert_eq!(s[1].in_flight(), 2);
    }
}
