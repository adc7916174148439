//! `init`, `check` and `repair`: the operator's commands, server by server.
//!
//! - [`init`] creates, idempotently, the per-id tables (MariaDB:
//!   Flickr's `tickets_<name>` with `id … auto_increment`, `stub … UNIQUE`;
//!   PostgreSQL: a sequence or the same table), the segment rows and the
//!   high-water table on every server.
//! - [`check`] reports each server's increment and offset (global and per
//!   session on MariaDB; in each sequence's schema on PostgreSQL), each
//!   sequence's counter and high-water, and lists the problems: two servers
//!   sharing an offset, a setting that differs from the file, a recorded
//!   lattice that differs from the file's (every session would refuse it),
//!   a counter behind its high-water, a missing guard, an unreachable or
//!   uninitialised server.
//! - [`repair`] raises every counter that is behind its high-water past it
//!   (MariaDB per-id: the counter row's `GREATEST`, which only ever
//!   raises it; PostgreSQL: `setval` or the
//!   table's row, never below where it is; a segment row: `GREATEST`). The
//!   marks are written ahead ([`crate::high_water`]), so this is past
//!   everything a client could have reserved, blocks held and prefetched
//!   included.
//! - [`reshape`] changes a sequence's lattice (increment, offsets, chunk)
//!   safely: every server's lattice version raised first (every client
//!   session still on the old file is refused by the database at its next
//!   ticket or block, and none starts until the reshape ends), then every
//!   server of the new file raised past every mark and counter it holds,
//!   then the new lattice recorded.
//!
//! Every command is bounded: each statement by the server
//! (`lock_wait_timeout`, `lock_timeout`, `statement_timeout`: the error
//! names the server and the statement), each connection and each place of
//! the marks by `admin_timeout_ms`, each server's work by `admin_timeout_ms`
//! times [`ADMIN_STATEMENTS`] on our side; `check` reads every server at
//! once. A timeout names the place and the setting.

use std::fmt;
use std::future::Future;

use futures_util::future::join_all;

use crate::backend::{
    Backend, INITIAL_VERSION, LatticeRecord, ServerSettings, check_lattice, check_marks_at,
    reshaping,
};
use crate::config::{Config, Kind, MarksConfig, Mode, ServerConfig};
use crate::error::TicketError;
use crate::etcd_marks::EtcdHighWater;
use crate::high_water::{HighWaterStore, PeersStore, ResidueClass};
use crate::segment::Lattice;
use crate::session::Session;

/// The marks in the stores the file names (the peers, etcd), each place
/// given the admin limit.
pub fn admin_store(config: &Config) -> std::sync::Arc<dyn HighWaterStore> {
    crate::high_water::stores(PeersStore::with_timeout(
        config.clone(),
        config.failover.admin_timeout(),
    ))
}

/// One server's admin work may take this many statements' limits, on our
/// side, before it is given up (each statement is bounded by the server).
pub const ADMIN_STATEMENTS: u32 = 4;

/// A connection within `admin_timeout_ms` (one statement's limit: a
/// stopped or stalled server is given up on after it).
async fn admin_session(config: &Config, server: &ServerConfig) -> Result<Session, TicketError> {
    within(
        config.failover.admin_timeout(),
        "`[failover] admin_timeout_ms`",
        server,
        "connect",
        Session::connect_admin(server, config),
    )
    .await
}

/// `work` on `server` within the admin limit (`admin_timeout_ms` times
/// [`ADMIN_STATEMENTS`]); a timeout names the server and what was being
/// done.
async fn bounded<T>(
    config: &Config,
    server: &ServerConfig,
    what: &str,
    work: impl Future<Output = Result<T, TicketError>>,
) -> Result<T, TicketError> {
    let limit = config.failover.admin_timeout() * ADMIN_STATEMENTS;
    within(limit, ADMIN_LIMIT, server, what, work).await
}

/// The admin limit of one server's work, as a timeout names it.
const ADMIN_LIMIT: &str = "4 x `[failover] admin_timeout_ms`";

async fn within<T>(
    limit: std::time::Duration,
    setting: &'static str,
    server: &ServerConfig,
    what: &str,
    work: impl Future<Output = Result<T, TicketError>>,
) -> Result<T, TicketError> {
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(TicketError::Timeout {
            server: server.name.clone(),
            context: what.to_string(),
            ms: limit.as_millis() as u64,
            setting,
        })
    })
}

/// What `init` did on one server.
#[derive(Debug)]
pub struct ServerInit {
    /// The server.
    pub server: String,
    /// One line per sequence, or why it failed.
    pub result: Result<Vec<String>, TicketError>,
}

/// Creates the schema on every server (idempotent) and records where the
/// file's `[marks]` keeps the marks. One entry per server. A server that
/// records another place for its marks (`init` with a file whose `[marks]`
/// differs) refuses the whole run before any server is changed.
pub async fn init(config: &Config) -> Vec<ServerInit> {
    let places = config.marks.places();
    let mut elsewhere = None;
    for server in &config.servers {
        // Unreachable here: its own init below says so.
        let recorded = async {
            let mut session = admin_session(config, server).await?;
            bounded(config, server, "init", session.read_marks_at()).await
        }
        .await;
        if let Ok(Some(at)) = recorded
            && let Err(e) = check_marks_at(config, &server.name, Some(&at), None)
        {
            elsewhere = Some(e);
            break;
        }
    }
    // A place `reshape` moved the marks away from is refused by every
    // client of this file: so is init, naming the reshape.
    if elsewhere.is_none() && !config.marks.etcd.is_empty() {
        let etcd = EtcdHighWater::from_file(&config.marks, config.failover.admin_timeout());
        // Unreachable: init goes on with the servers, as for a place down.
        if let Ok(Some(to)) = etcd.moved_to().await {
            elsewhere = Some(crate::etcd_marks::moved_away(
                &format!("etcd {}", config.marks.etcd_prefix),
                &config.marks.etcd_prefix,
                to.as_bytes(),
            ));
        }
    }
    if let Some(e) = elsewhere {
        return config
            .servers
            .iter()
            .map(|server| ServerInit {
                server: server.name.clone(),
                result: Err(e.said_of(&server.name)),
            })
            .collect();
    }
    let mut out = Vec::new();
    let mut wrote = Vec::new();
    // Per server: it recorded a place (this file's or another's) when this
    // run read it; one that did not, and records none now, failed for a
    // reason of its own, not because another run took its record back.
    let mut seen = Vec::new();
    for server in &config.servers {
        let mut recorded_here = false;
        let mut seen_here = false;
        let result = async {
            let mut session = admin_session(config, server).await?;
            // Recorded first where none is (written only then: init again
            // changes nothing), and read back: of two inits with different
            // files at once, one is refused here.
            bounded(config, server, "init", async {
                let mut recorded = session.read_marks_at().await?;
                if recorded.is_none() {
                    session.write_marks_at(&places, false).await?;
                    recorded_here = true;
                    recorded = session.read_marks_at().await?;
                }
                seen_here = recorded.is_some();
                check_marks_at(config, &server.name, recorded.as_deref(), None)
            })
            .await?;
            bounded(config, server, "init", session.init(config, server)).await
        }
        .await;
        wrote.push(recorded_here);
        seen.push(seen_here);
        out.push(ServerInit {
            server: server.name.clone(),
            result,
        });
    }
    if let Some(e) = take_back_a_split(config, &places, &wrote, &seen).await {
        for init in &mut out {
            init.result = Err(e.said_of(&init.server));
        }
        return out;
    }
    // Once every server has its marks table: adopted tables past their
    // class's marks.
    let store = admin_store(config);
    for (server, init) in config.servers.iter().zip(&mut out) {
        if let Ok(done) = &mut init.result
            && let Err(e) = raise_adopted(config, &*store, server, done).await
        {
            init.result = Err(e);
        }
        if let Ok(done) = &mut init.result {
            say_where_ids_start(config, &*store, server, done).await;
        }
    }
    out
}

/// Rewrites `init`'s "ids from N on" of each MariaDB per-id counter of
/// `server` that is behind its residue class's marks by more than they are
/// written ahead (a fresh server put in for one that handed out ids, or a
/// restore): its first id is not N, since a client's first session on it
/// raises it past the marks before any id. The line says the counter, the
/// marks and where ids will start. Marks not read (a place down): the line
/// stays as the counter says, and the clients raise it all the same.
async fn say_where_ids_start(
    config: &Config,
    store: &dyn HighWaterStore,
    server: &ServerConfig,
    done: &mut [String],
) {
    let per_id: Vec<_> = config
        .sequences
        .iter()
        .filter(|q| q.mode == Mode::PerId && !q.adopted())
        .collect();
    // Only MariaDB's init line says where ids start.
    if server.kind != Kind::Mariadb || per_id.is_empty() {
        return;
    }
    let class = ResidueClass::of(config, server);
    let Ok(marks) = store.load(&class).await else {
        return;
    };
    let Ok(mut session) = admin_session(config, server).await else {
        return;
    };
    let span = config.failover.mark_ahead.saturating_mul(config.increment);
    for seq in per_id {
        let Some(&mark) = marks.get(&seq.name) else {
            continue;
        };
        let Ok(Some(counter)) = bounded(
            config,
            server,
            "init: read the counter",
            session.counter(config, server, seq),
        )
        .await
        else {
            continue;
        };
        if counter.saturating_add(span) >= mark {
            continue;
        }
        for line in done
            .iter_mut()
            .filter(|l| l.starts_with(&format!("{}: ", seq.name)))
        {
            // ", ids from N on" (N: the server's first id after the
            // counter), replaced whole.
            let Some(at) = line.find(", ids from ") else {
                continue;
            };
            let Some(end) = line[at..].find(" on").map(|e| at + e + " on".len()) else {
                continue;
            };
            line.replace_range(
                at..end,
                &format!(
                    ", counter at {counter} ({COUNTER_IS}, as `check` shows it), behind the marks of its residue class {} (ids up to {mark} were handed out: by the server this one replaces, or before a restore): the first client session on it raises it past them, so ids from above {mark} on",
                    class.key
                ),
            );
        }
    }
}

/// Two inits at once with files naming different places each record
/// their own on the servers they reach first, then find the other's on
/// the rest: both refused, the servers split between two places, and each
/// file's clients served by a part of them. So, once this run has been
/// over every server: where a server that answers records another place,
/// or none where this run read a record (the other run took its own
/// back), this run takes back the record it wrote (`wrote`, per
/// server of the file) and is refused. Of two such runs neither leaves
/// its place behind, and `init` again with the file meant makes the
/// servers whole. A server on which this run read no record (`seen`:
/// per server; unreachable, or its write failed) may record none for
/// that reason alone. `None`: no split.
async fn take_back_a_split(
    config: &Config,
    places: &str,
    wrote: &[bool],
    seen: &[bool],
) -> Option<TicketError> {
    let mut other = None;
    for (server, seen) in config.servers.iter().zip(seen) {
        let recorded = async {
            let mut session = admin_session(config, server).await?;
            bounded(config, server, "init", session.read_marks_at()).await
        }
        .await;
        match recorded {
            Ok(Some(at)) if at == places => {}
            Ok(None) if !seen => {}
            Ok(at) => {
                other = Some((server.name.clone(), at));
                break;
            }
            // Down: its own init said so; it records nothing new.
            Err(_) => {}
        }
    }
    let (name, at) = other?;
    for (server, _) in config.servers.iter().zip(wrote).filter(|(_, w)| **w) {
        let taken = async {
            let mut session = admin_session(config, server).await?;
            bounded(config, server, "init", session.forget_marks_at(places)).await
        }
        .await;
        if let Err(e) = taken {
            tracing::warn!(server = %server.name, error = %e, "init: the record of where the marks are kept was not taken back");
        }
    }
    let at = at.unwrap_or_else(|| "no place".to_string());
    Some(TicketError::misconfigured(
        &name,
        format!(
            "it records {at} as where its clients keep their marks while this file names {places}: another `shardflake tickets init` with another file ran at the same time; this run took back what it recorded, so that no two servers name different places; run `shardflake tickets init --config FILE` again, once, with the file you mean"
        ),
    ))
}

/// Raises each adopted table of `server` past its residue class's marks
/// (a line in `done` for each it moved). Their applications' own
/// `REPLACE` reads no marks, so a server restored or replaced by a fresh
/// one would otherwise hand them out the ids shardflake's clients got from
/// the one before; shardflake's own clients raise it at their first
/// session, but the applications may come first. Only ever upwards: the
/// second `init` finds the counter past the marks and changes nothing.
async fn raise_adopted(
    config: &Config,
    store: &dyn HighWaterStore,
    server: &ServerConfig,
    done: &mut Vec<String>,
) -> Result<(), TicketError> {
    let adopted: Vec<_> = config.sequences.iter().filter(|q| q.adopted()).collect();
    if adopted.is_empty() {
        return Ok(());
    }
    let class = ResidueClass::of(config, server);
    let marks = store.load(&class).await.map_err(|e| {
        TicketError::misconfigured(
            &server.name,
            format!(
                "init: the marks of residue class {} could not be read ({e}): an adopted table is raised past them before its applications' REPLACE, which reads none, can hand out an id again; bring the places back and run `shardflake tickets init` again",
                class.key
            ),
        )
    })?;
    let mut session = admin_session(config, server).await?;
    for seq in adopted {
        let Some(mark) = marks.get(&seq.name).copied() else {
            continue;
        };
        let counter = bounded(
            config,
            server,
            "init: read the counter",
            session.counter(config, server, seq),
        )
        .await?
        .unwrap_or(0);
        if counter < mark {
            bounded(
                config,
                server,
                "init: raise the counter past the marks",
                session.raise(config, server, seq, mark),
            )
            .await?;
            // Below the marks by more than they are written ahead: it went
            // back (a restore, a fresh server).
            let span = config.failover.mark_ahead.saturating_mul(config.increment);
            let went_back = counter.saturating_add(span) < mark;
            tracing::info!(server = %server.name, sequence = %seq.name, counter, mark, went_back, "adopted table raised past its class's marks");
            done.push(match went_back {
                false => format!(
                    "{}: raised past the marks written ahead of it, ids above {mark}",
                    seq.name
                ),
                true => format!(
                    "{}: WENT BACK (restored, or a fresh server): raised from {counter} past its residue class's marks, ids above {mark}; ids its applications took above the last mark are not covered: raise it by hand past the largest id they stored before letting them back",
                    seq.name
                ),
            });
        }
    }
    Ok(())
}

/// What a counter `check` and `init` show is: the same value in both.
pub const COUNTER_IS: &str = "the last id it may have handed out";

/// One server in a [`CheckReport`].
#[derive(Debug, Clone)]
pub struct ServerCheck {
    /// Its configuration.
    pub server: ServerConfig,
    /// What was read, or why nothing was.
    pub settings: Result<ServerSettings, TicketError>,
    /// Its identity and who holds its residue class (empty when unread).
    pub holder: String,
}

/// What `check` found.
#[derive(Debug, Clone)]
pub struct CheckReport {
    /// The file's increment.
    pub increment: u64,
    /// Each server.
    pub servers: Vec<ServerCheck>,
    /// Everything wrong; empty when all is well.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// No problem found.
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.servers {
            let s = &c.server;
            writeln!(
                f,
                "server {} ({}, {}): file increment {} offset {}",
                s.name,
                s.kind.as_str(),
                s.url,
                self.increment,
                s.offset
            )?;
            match &c.settings {
                Err(e) => writeln!(f, "  unreachable: {e}")?,
                Ok(settings) => {
                    if !c.holder.is_empty() {
                        writeln!(f, "  {}", c.holder)?;
                    }
                    if let Some((i, o)) = settings.global {
                        writeln!(
                            f,
                            "  global:  auto_increment_increment {i} auto_increment_offset {o}"
                        )?;
                    }
                    if let Some((i, o)) = settings.session {
                        writeln!(
                            f,
                            "  session: auto_increment_increment {i} auto_increment_offset {o}"
                        )?;
                    }
                    for w in &settings.warnings {
                        writeln!(f, "  warning: {w}")?;
                    }
                    for q in &settings.sequences {
                        let counter = q
                            .counter
                            .map_or("-".to_string(), |c| format!("{c} ({COUNTER_IS})"));
                        let hw = q.high_water.map_or("-".to_string(), |c| c.to_string());
                        writeln!(
                            f,
                            "  sequence {}: {}; counter {counter}; high-water {hw}{}",
                            q.name,
                            q.detail,
                            q.problem
                                .as_ref()
                                .map(|p| format!("; PROBLEM: {p}"))
                                .unwrap_or_default()
                        )?;
                    }
                }
            }
        }
        if self.ok() {
            writeln!(f, "ok")
        } else {
            writeln!(f, "{} problem(s):", self.problems.len())?;
            for p in &self.problems {
                writeln!(f, "  - {p}")?;
            }
            Ok(())
        }
    }
}

/// Reads every server and lists what is wrong, with the high-water marks
/// kept on the peers (each place given `admin_timeout_ms`).
pub async fn check(config: &Config) -> CheckReport {
    check_with_store(config, &*admin_store(config)).await
}

/// [`check`] against the marks of `store` (the service's etcd and peers;
/// give each place `admin_timeout_ms`, as [`check`] does: a peer slow
/// under load is then waited for, not taken for absent).
pub async fn check_with_store(config: &Config, store: &dyn HighWaterStore) -> CheckReport {
    // Every server at once: a check of servers that are all stopped or
    // stalled ends within one limit, not one per server.
    let checked = join_all(
        config
            .servers
            .iter()
            .map(|server| check_server(config, store, server)),
    )
    .await;
    let seen: Vec<(&str, &LatticeSeen)> = config
        .servers
        .iter()
        .zip(&checked)
        .map(|(s, (_, _, l))| (s.name.as_str(), l))
        .collect();
    let mut problems = Vec::new();
    for (server, (_, found, lattice)) in config.servers.iter().zip(&checked) {
        problems.extend(found.iter().cloned());
        problems.extend(lattice_problem(&server.name, lattice, &seen));
    }
    let servers: Vec<ServerCheck> = checked.into_iter().map(|(c, _, _)| c).collect();
    // Two MariaDB servers with one global offset hand out the same ids to
    // any client that does not set its session (plain SQL, other languages).
    for (i, a) in servers.iter().enumerate() {
        for b in &servers[i + 1..] {
            if let (Ok(sa), Ok(sb)) = (&a.settings, &b.settings)
                && a.server.kind == Kind::Mariadb
                && b.server.kind == Kind::Mariadb
                && let (Some(ga), Some(gb)) = (sa.global, sb.global)
                && ga != MARIADB_DEFAULT
                && gb != MARIADB_DEFAULT
                && ga.1 % ga.0.max(1) == gb.1 % gb.0.max(1)
            {
                problems.push(format!(
                    "servers {} and {} share global auto_increment_offset {} (increment {}/{}): they hand out the same ids",
                    a.server.name, b.server.name, ga.1, ga.0, gb.0
                ));
            }
        }
    }
    CheckReport {
        increment: config.increment,
        servers,
        problems,
    }
}

/// [`check_with_store`] of one server: what it read, and the problems.
/// Bounded as a whole by the admin limit (a server that answers each
/// statement just in time cannot make it last longer).
async fn check_server(
    config: &Config,
    store: &dyn HighWaterStore,
    server: &ServerConfig,
) -> (ServerCheck, Vec<String>, LatticeSeen) {
    let mut problems = Vec::new();
    let span = config.failover.mark_ahead.saturating_mul(config.increment);
    let mut holder = String::new();
    let mut lattice = LatticeSeen::default();
    let work = async {
        // The marks before the counters: a mark read first is never
        // ahead of a counter read after it unless the counter went back
        // (a block's mark is written after its row moved; a per-id
        // mark at most `mark_ahead` ids ahead of the counter it was
        // written from). Read the other way round, a client's block
        // reserved between the two reads looked like a restore.
        let class = ResidueClass::of(config, server);
        // The connection while the marks are read (nothing is read from
        // it before them): a stalled server costs one limit, not two.
        let (marks, session) = tokio::join!(store.load(&class), admin_session(config, server));
        let marks = match marks {
            Ok(marks) => marks,
            Err(e) => {
                problems.push(format!("server {}: {e}", server.name));
                Default::default()
            }
        };
        let mut session = session?;
        let mut settings =
            bounded(config, server, "check", session.settings(config, server)).await?;
        // What every session checks first: a file whose lattice differs
        // from the recorded one (a server renamed, an offset moved) is
        // refused by every client, so it is no ok here either. A
        // sequence not initialised says so already.
        let version = bounded(config, server, "check", session.lattice_version()).await?;
        let recorded = bounded(config, server, "check", session.read_lattice()).await?;
        let initialised = settings.sequences.iter().all(|q| q.counter.is_some());
        lattice.version = version.map(|v| v.version);
        match check_lattice(config, server, &recorded, version.as_ref()) {
            // Said once every server is read: which side is older.
            Err(e @ TicketError::LatticeChanged { .. }) => lattice.refused = Some(e.to_string()),
            Err(e) if initialised => problems.push(e.to_string()),
            Ok(()) => lattice.files = true,
            _ => {}
        }
        // Every session refuses these too.
        let marks_at = bounded(config, server, "check", session.read_marks_at()).await?;
        if initialised
            && let Err(e) = check_marks_at(
                config,
                &server.name,
                marks_at.as_deref(),
                version.map(|v| v.version),
            )
        {
            problems.push(e.to_string());
        }
        match version {
            Some(v) if v.reshaping => problems.push(reshaping(&server.name).to_string()),
            None if initialised => problems.push(format!(
                "server {}: no lattice version recorded (made by an older shardflake): run `shardflake tickets init`",
                server.name
            )),
            _ => {}
        }
        // A server answering with an identity its class was taken
        // from (an old primary beside its promoted standby) is not
        // behind: it must not be repaired, but retired.
        let who = bounded(config, server, "check", session.identify()).await?;
        let mut superseded = false;
        holder = match store.holder(&class).await {
            Ok(Some(h)) if h.supersedes(&who.id) => {
                superseded = true;
                let e = TicketError::Superseded(Box::new(crate::error::Superseded {
                    server: server.name.clone(),
                    class: class.key.clone(),
                    identity: who.id.clone(),
                    holder: h.identity.clone(),
                }));
                problems.push(e.to_string());
                format!(
                    "class {} held by {} (generation {}); this server answers as {}: SUPERSEDED",
                    class.key, h.identity, h.generation, who.id
                )
            }
            Ok(Some(h)) if h.identity == who.id => format!(
                "class {} held by this server, {} (generation {})",
                class.key, who.id, h.generation
            ),
            Ok(Some(h)) => format!(
                "class {} held by {} (generation {}); this server answers as {} and takes it over at its first session",
                class.key, h.identity, h.generation, who.id
            ),
            Ok(None) => format!(
                "class {} held by no server yet; this server answers as {}",
                class.key, who.id
            ),
            Err(e) => format!("class {}: holder not read: {e}", class.key),
        };
        for (q, seq) in settings.sequences.iter_mut().zip(&config.sequences) {
            q.high_water = marks.get(&q.name).copied();
            let Some(counter) = q.counter else { continue };
            let hw = q.high_water.unwrap_or(0);
            // A segment row is never below a block's mark; a per-id
            // counter is below the mark written ahead of it by at most
            // `mark_ahead` ids of the server.
            let behind = match seq.mode {
                Mode::Segment => counter < hw,
                Mode::PerId => counter.saturating_add(span) < hw,
            };
            if seq.mode == Mode::Segment && q.problem.is_none() {
                let lattice = Lattice::new(config, server);
                let row = lattice.row_of_counter(counter);
                if let Err(e) = lattice.check_row(&server.name, &seq.name, row) {
                    q.problem = Some(e.to_string());
                }
            }
            // Said beside any other problem (a guard missing after a
            // restore made without triggers is most often behind too).
            if behind && !superseded {
                let went_back = format!(
                    "counter {counter} is behind the high-water {hw}: it went back (restored?); clients raise it past the mark on their next checked session, `shardflake tickets repair` does it now"
                );
                q.problem = Some(match q.problem.take() {
                    Some(p) => format!("{p}; and {went_back}"),
                    None => went_back,
                });
            }
        }
        Ok(settings)
    };
    let mut settings = bounded(config, server, "check", work).await;
    match &mut settings {
        Err(e) => problems.push(format!("server {}: {e}", server.name)),
        Ok(s) => {
            let want = (config.increment, server.offset);
            match s.global {
                // Never configured: shardflake's clients set their own
                // sessions and never use it; only plain SQL clients of
                // the server would (ids of every class).
                Some(MARIADB_DEFAULT) if want != MARIADB_DEFAULT => s.warnings.push(format!(
                    "global auto_increment_increment/offset are MariaDB's defaults 1/1: shardflake's clients set {}/{} on their own sessions and are not affected; a client that does not (plain SQL) hands out ids of every server's class: set them in the server's configuration if any such client uses it",
                    want.0, want.1
                )),
                Some(global) if global != want => problems.push(format!(
                    "server {}: global auto_increment_increment/offset are {}/{}, the file says {}/{}",
                    server.name, global.0, global.1, want.0, want.1
                )),
                _ => {}
            }
            if let Some(session) = s.session
                && session != want
            {
                problems.push(format!(
                    "server {}: a session keeps auto_increment_increment/offset {}/{} after setting {}/{}",
                    server.name, session.0, session.1, want.0, want.1
                ));
            }
            for q in &s.sequences {
                if let Some(p) = &q.problem {
                    problems.push(format!("server {} sequence {}: {p}", server.name, q.name));
                }
            }
        }
    }
    (
        ServerCheck {
            server: server.clone(),
            settings,
            holder,
        },
        problems,
        lattice,
    )
}

/// What [`check_server`] read of a server's lattice.
#[derive(Debug, Default)]
struct LatticeSeen {
    /// Its lattice version.
    version: Option<i64>,
    /// It records the file's lattice.
    files: bool,
    /// Why a session of the file is refused there (`lattice_changed`).
    refused: Option<String>,
}

/// A server's lattice refusal, said as it is: where another server of the
/// file records the file's lattice at a higher version, the file is the
/// current one and the refusing server went back to before the reshape
/// that recorded it (its own dump loaded): the way out is that reshape
/// again, not another file.
fn lattice_problem(
    server: &str,
    seen: &LatticeSeen,
    others: &[(&str, &LatticeSeen)],
) -> Option<String> {
    let refused = seen.refused.clone()?;
    let current = others
        .iter()
        .filter(|(name, o)| *name != server && o.files)
        .filter_map(|(name, o)| Some((o.version?, *name)))
        .max();
    Some(match (seen.version, current) {
        (Some(own), Some((version, other))) if own < version => {
            TicketError::went_back_before_reshape(server, own, other, version).to_string()
        }
        _ => refused,
    })
}

/// MariaDB's own `auto_increment_increment`/`_offset`: a global never
/// configured (a warning of `check`, not a problem; its own warning says
/// why).
const MARIADB_DEFAULT: (u64, u64) = (1, 1);

/// One counter `repair` raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The server.
    pub server: String,
    /// The sequence.
    pub sequence: String,
    /// Its counter before.
    pub counter: u64,
    /// The high-water it is now past.
    pub high_water: u64,
}

/// Raises every counter that is behind its high-water past it. Fails on
/// the first server that cannot be read or raised (nothing is lowered, so
/// it can be run again). The marks are those kept on the peers.
pub async fn repair(config: &Config) -> Result<Vec<Repair>, TicketError> {
    repair_with_store(config, &*admin_store(config)).await
}

/// [`repair`] against the marks of `store` (the service's etcd and peers;
/// each place given `admin_timeout_ms`, as for [`check_with_store`]).
pub async fn repair_with_store(
    config: &Config,
    store: &dyn HighWaterStore,
) -> Result<Vec<Repair>, TicketError> {
    let mut done = Vec::new();
    for server in &config.servers {
        done.extend(repair_server(config, store, server).await?);
    }
    Ok(done)
}

/// Makes the server named `name` in the file the holder of its residue
/// class again, whatever held it (an identity taken over included), then
/// raises its counters past the class's marks. Retire the server that
/// held the class first: from then on it is refused (`superseded`).
pub async fn takeover(
    config: &Config,
    store: &dyn HighWaterStore,
    name: &str,
) -> Result<Vec<Repair>, TicketError> {
    let server = config
        .servers
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| {
            TicketError::misconfigured(name, "no server of that name in the tickets file")
        })?;
    let mut session = admin_session(config, server).await?;
    let who = bounded(
        config,
        server,
        "takeover: read its identity",
        session.identify(),
    )
    .await?;
    let class = ResidueClass::of(config, server);
    store.claim(&class, &who.id, true).await?;
    tracing::info!(server = %server.name, class = %class.key, identity = %who.id, "residue class taken over");
    repair_server(config, store, server).await
}

/// [`repair`] of one server.
async fn repair_server(
    config: &Config,
    store: &dyn HighWaterStore,
    server: &ServerConfig,
) -> Result<Vec<Repair>, TicketError> {
    let mut done = Vec::new();
    {
        let marks = store.load(&ResidueClass::of(config, server)).await?;
        let mut session = admin_session(config, server).await?;
        let lattice = Lattice::new(config, server);
        for seq in &config.sequences {
            let high_water = marks.get(&seq.name).copied().unwrap_or(0);
            let Some(counter) = bounded(
                config,
                server,
                "repair: read the counter",
                session.counter(config, server, seq),
            )
            .await?
            else {
                continue;
            };
            // A segment row off this server's lattice (another server's
            // row) is raised onto it, past the marks and past the row.
            let off_lattice =
                seq.mode == Mode::Segment && !lattice.holds(lattice.row_of_counter(counter));
            if counter < high_water || off_lattice {
                let past = high_water.max(counter);
                bounded(
                    config,
                    server,
                    "repair: raise the counter",
                    session.raise(config, server, seq, past),
                )
                .await?;
                tracing::info!(server = %server.name, sequence = %seq.name, counter, high_water = past, off_lattice, "counter raised past its high-water");
                done.push(Repair {
                    server: server.name.clone(),
                    sequence: seq.name.clone(),
                    counter,
                    high_water: past,
                });
            }
        }
    }
    Ok(done)
}

/// One sequence [`reshape`] moved to the file's lattice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reshaped {
    /// The sequence.
    pub sequence: String,
    /// Every server of the file was raised past this id: the largest mark
    /// and counter any of them held.
    pub past: u64,
}

/// Moves every sequence whose recorded lattice differs from the file's to
/// the file's. First, on every server of the file, raises the lattice
/// version and marks a reshape under way (`begin_reshape`):
/// from then on the database refuses every ticket and block of a session
/// opened before (a client still running on the old file, its pooled
/// sessions included), and no session starts. Then reads every mark (of
/// any server on the servers' tables, removed ones included, and in
/// `store`, etcd too where the file names it, those of every server of
/// the file or named on the servers' tables) and
/// every counter (under the lattice it was recorded with), so everything
/// the old clients got is counted;
/// raises each server past the largest, records the new lattice, writes
/// that mark for every server, and ends the reshape. Every server must
/// answer; one that fails midway stays refused until `reshape` is run
/// again. A block an old client reserved before is still handed out by it
/// (it is below every new id). The mode and the bits cannot change this way.
///
/// A file whose `[marks]` names other places than the servers record (a
/// new etcd prefix or cluster) moves the marks there the same way: every
/// sequence is raised past every mark and counter and that mark written
/// to the file's places, which the servers record before the reshape
/// ends. An old etcd place must answer: its marks are read and it is told
/// where the marks moved (`<prefix>/tickets/moved_to`, before any server
/// records the new place), so its clients are refused ever after, even
/// once every server is restored from before the move. A move away from
/// peers only leaves no such record: nothing outside the servers holds it.
pub async fn reshape(
    config: &Config,
    store: &dyn HighWaterStore,
) -> Result<Vec<Reshaped>, TicketError> {
    let mut sessions = Vec::new();
    let mut recorded = Vec::new();
    for server in &config.servers {
        let mut session = admin_session(config, server).await?;
        recorded.push(
            bounded(
                config,
                server,
                "reshape: read the lattice",
                session.read_lattice(),
            )
            .await?,
        );
        sessions.push(session);
    }
    let changed: Vec<_> = config
        .sequences
        .iter()
        .filter(|seq| {
            config.servers.iter().zip(&recorded).any(|(server, r)| {
                r.iter()
                    .find(|(q, _)| *q == seq.name)
                    .is_none_or(|(_, r)| *r != LatticeRecord::of(config, server, seq))
            })
        })
        .collect();
    // What reshape cannot do is refused before any server is fenced.
    for seq in &changed {
        for (server, r) in config.servers.iter().zip(&recorded) {
            let old = r.iter().find(|(q, _)| *q == seq.name).map(|(_, r)| r);
            if let Some(old) = old
                && (old.mode != seq.mode.as_str() || old.bits != seq.bits)
            {
                return Err(TicketError::misconfigured(
                    &server.name,
                    format!(
                        "sequence {:?} was {} with {} bits: reshape changes the increment, offsets and chunk only; a new mode or width is a new sequence",
                        seq.name, old.mode, old.bits
                    ),
                ));
            }
        }
    }
    // A reshape left unfinished is finished by this one, changed or not.
    let mut unfinished = false;
    // One past the highest version any server records: every server of
    // the new lattice records the same version (a server added by an
    // earlier reshape, or restored, would otherwise count apart).
    let mut highest = INITIAL_VERSION;
    // Marks kept elsewhere than the file says (another etcd prefix or
    // cluster) move to the file's places: every sequence is raised past
    // every mark and counter, as for a new lattice, and recorded there.
    let places = config.marks.places();
    let mut moved = false;
    let mut old_places = Vec::new();
    for (server, session) in config.servers.iter().zip(&mut sessions) {
        let version = bounded(
            config,
            server,
            "reshape: read the lattice version",
            session.lattice_version(),
        )
        .await?;
        unfinished |= version.is_some_and(|v| v.reshaping);
        highest = highest.max(version.map_or(INITIAL_VERSION, |v| v.version));
        let at = bounded(
            config,
            server,
            "reshape: read where the marks are kept",
            session.read_marks_at(),
        )
        .await?;
        moved |= at.as_deref() != Some(places.as_str());
        if let Some(at) = at
            && at != places
            && !old_places.contains(&at)
        {
            old_places.push(at);
        }
    }
    let changed = match moved {
        true => config.sequences.iter().collect(),
        false => changed,
    };
    if changed.is_empty() && !unfinished {
        return Ok(Vec::new());
    }
    // From the fence on, a reshape cut short leaves servers refusing every
    // session until one runs to its end: its error says so first.
    let rest = async {
        // Fence first: every old client's session refused from here on, so the
        // counters read below hold everything it got.
        for (server, session) in config.servers.iter().zip(&mut sessions) {
            bounded(
                config,
                server,
                "reshape: raise the lattice version",
                session.begin_reshape(highest + 1),
            )
            .await?;
        }
        // The marks in the stores the file names (etcd too, where the peers'
        // went back with them in a restore), read after the fence: of every
        // server of the file and every server the servers hold marks of (one
        // the new file removes: its ids are in the new lattice's classes).
        let mut names: Vec<String> = config.servers.iter().map(|s| s.name.clone()).collect();
        for (server, session) in config.servers.iter().zip(&mut sessions) {
            names.extend(
                bounded(
                    config,
                    server,
                    "reshape: read the marks",
                    session.high_water_servers(),
                )
                .await?,
            );
        }
        // And every class of every lattice the servers recorded (a class whose
        // marks only etcd still holds is read too).
        for r in &recorded {
            for (_, old) in r {
                names.extend((1..=old.increment).map(|o| format!("@{o}of{}", old.increment)));
            }
        }
        names.sort();
        names.dedup();
        let mut stored = Vec::new();
        // Marks moving from another etcd place: read there too (a server
        // restored since holds fewer than that place), then that place told
        // where they moved, before any server records it: a later restore of
        // every server from before this reshape brings the old place back on
        // the servers, never in etcd, so the old file's clients stay refused.
        // A place an earlier reshape moved the marks away from names where
        // they went: that place is read and told too (servers restored from
        // before that reshape record the first place only), and so on along
        // the chain; each place once.
        let mut next = 0;
        while let Some(at) = old_places.get(next).cloned() {
            next += 1;
            let Some(old) = MarksConfig::etcd_of_places(&at) else {
                continue;
            };
            let etcd = EtcdHighWater::from_file(&old, config.failover.admin_timeout());
            let unread = |name: &str, e: TicketError| {
                TicketError::misconfigured(
                    name,
                    format!(
                        "the marks kept so far in etcd {} at {} could not be read or marked moved ({e}); no session starts until a reshape ends: make that etcd answer and run `shardflake tickets reshape --config FILE` again",
                        old.etcd_prefix,
                        old.etcd.join(",")
                    ),
                )
            };
            if let Some(went) = etcd
                .moved_to()
                .await
                .map_err(|e| unread(&old.etcd_prefix, e))?
                && went != places
                && !old_places.contains(&went)
            {
                old_places.push(went);
            }
            for name in &names {
                let marks = etcd
                    .load_even_if_moved(&ResidueClass::named(config, name))
                    .await
                    .map_err(|e| unread(name, e))?;
                stored.push(marks);
            }
            etcd.mark_moved(&places)
                .await
                .map_err(|e| unread(&old.etcd_prefix, e))?;
        }
        // A place the marks were moved away from before vouches again once
        // they move back to it (only after the old places were told).
        if moved && !config.marks.etcd.is_empty() {
            EtcdHighWater::from_file(&config.marks, config.failover.admin_timeout())
                .clear_moved()
                .await?;
        }
        for name in &names {
            stored.push(store.load(&ResidueClass::named(config, name)).await?);
        }
        let mut done = Vec::new();
        for seq in changed {
            let mut past = stored
                .iter()
                .filter_map(|marks| marks.get(&seq.name).copied())
                .max()
                .unwrap_or(0);
            for ((server, session), r) in config.servers.iter().zip(&mut sessions).zip(&recorded) {
                let old = r.iter().find(|(q, _)| *q == seq.name).map(|(_, r)| r);
                let marks = bounded(
                    config,
                    server,
                    "reshape: read the marks",
                    session.read_marks_of_sequence(&seq.name),
                )
                .await?;
                // The counter under the lattice it was handed out with.
                let mut then = config.clone();
                let mut then_server = server.clone();
                if let Some(old) = old {
                    then.increment = old.increment;
                    then.segment.chunk = old.chunk.max(1);
                    then_server.offset = old.offset;
                }
                let counter = bounded(
                    config,
                    server,
                    "reshape: read the counter",
                    session.counter(&then, &then_server, seq),
                )
                .await?
                .unwrap_or(0);
                past = past.max(marks).max(counter);
            }
            for (server, session) in config.servers.iter().zip(&mut sessions) {
                bounded(
                    config,
                    server,
                    "reshape: raise the counter",
                    session.reshape(config, server, seq, past),
                )
                .await?;
                bounded(
                    config,
                    server,
                    "reshape: record the lattice",
                    session.write_lattice(&seq.name, &LatticeRecord::of(config, server, seq)),
                )
                .await?;
            }
            for server in &config.servers {
                store
                    .record(
                        &ResidueClass::of(config, server),
                        None,
                        &[(seq.name.clone(), past)],
                    )
                    .await?;
            }
            tracing::info!(sequence = %seq.name, past, "sequence reshaped");
            done.push(Reshaped {
                sequence: seq.name.clone(),
                past,
            });
        }
        for (server, session) in config.servers.iter().zip(&mut sessions) {
            bounded(
                config,
                server,
                "reshape: record where the marks are kept",
                session.write_marks_at(&places, true),
            )
            .await?;
            bounded(
                config,
                server,
                "reshape: end the reshape",
                session.end_reshape(),
            )
            .await?;
        }
        Ok::<_, TicketError>(done)
    };
    rest.await.map_err(half_done)
}

/// An error of a reshape past its fence: the reshape is half done (the
/// servers it reached refuse every session), whatever stopped it, and only
/// running it to its end gets out of it.
fn half_done(cause: TicketError) -> TicketError {
    TicketError::misconfigured(
        cause.server().unwrap_or("reshape"),
        format!(
            "the reshape is half done: every server it reached refuses sessions until a reshape runs to its end. It stopped on: {cause}. Make that server (or place) answer, then run `shardflake tickets reshape --config FILE` again with this file"
        ),
    )
}
