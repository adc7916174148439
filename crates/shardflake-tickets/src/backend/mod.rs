//! The backend layer: one file per database ([`mariadb`], [`postgres`]),
//! each one session of that kind, every operation one round trip; and what
//! both share: the tables every server holds, the lattice record `init`
//! writes and every session checks, what `check` reads. The session
//! ([`crate::session`]) dispatches to them; nothing here knows about
//! failover, marks stores or clients.

use crate::config::{Config, Mode, SequenceConfig, ServerConfig};
use crate::error::TicketError;

pub(crate) mod mariadb;
pub(crate) mod postgres;

/// The segment rows: one per segment sequence.
pub const SEGMENT_TABLE: &str = "shardflake_ticket_segments";
/// The high-water marks of every server, kept on its peers.
pub const HW_TABLE: &str = "shardflake_ticket_hw";
/// Each sequence's lattice as `init` recorded it on this server.
pub const LATTICE_TABLE: &str = "shardflake_ticket_lattice";

/// The trigger (MariaDB: one per event, this name and a suffix) that
/// refuses to set a counter back in place: the segment table's rows, and
/// PostgreSQL's per-id ticket tables. A restore that keeps the table (an
/// `UPDATE`, a `DELETE` and rows again, MariaDB's `REPLACE` of a data-only
/// dump) keeps its identity, so a client whose last answer was below the
/// restored value could not see it and would hand out ids again; a table
/// dropped and created again is seen (every answer carries its identity).
/// A give-back sets the session's rewind flag for its statement.
pub const GUARD: &str = "shardflake_ticket_guard";

/// What the guard says, for `table` and the way `flag` is set.
pub(crate) fn guard_refusal(table: &str, flag: &str) -> String {
    format!(
        "shardflake: {table} is never set back in place (running ticket clients cannot see it and would hand out ids again): restore the table whole (dropped and created, as mariadb-dump and pg_dump --clean do), which clients see; to set it back anyway, stop every client, {flag} in that session, then run shardflake tickets repair"
    )
}

/// What `check` says of a table without its guard.
pub(crate) const GUARD_MISSING: &str = "no guard against setting it back in place (made by an older shardflake): run `shardflake tickets init`";

/// What fixes which ids a server hands out for one sequence: recorded on
/// the server by `init`, compared with the file by every session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatticeRecord {
    /// The server's name in the file.
    pub server: String,
    /// The file's increment.
    pub increment: u64,
    /// The server's offset.
    pub offset: u64,
    /// `per-id` or `segment`.
    pub mode: String,
    /// 32 or 64.
    pub bits: u32,
    /// The segment chunk (0 in per-id mode, where it plays no part).
    pub chunk: u64,
}

impl LatticeRecord {
    /// What the file says for `seq` on `server`.
    pub fn of(config: &Config, server: &ServerConfig, seq: &SequenceConfig) -> LatticeRecord {
        LatticeRecord {
            server: server.name.clone(),
            increment: config.increment,
            offset: server.offset,
            mode: seq.mode.as_str().to_string(),
            bits: seq.bits,
            chunk: if seq.mode == Mode::Segment {
                config.segment.chunk
            } else {
                0
            },
        }
    }
}

impl std::fmt::Display for LatticeRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "server name {} increment {} offset {} mode {} bits {}",
            self.server, self.increment, self.offset, self.mode, self.bits
        )?;
        if self.chunk > 0 {
            write!(f, " chunk {}", self.chunk)?;
        }
        Ok(())
    }
}

/// Compares the records read from a server with the file: the first
/// sequence whose record is missing or differs is an error.
pub(crate) fn check_lattice(
    config: &Config,
    server: &ServerConfig,
    recorded: &[(String, LatticeRecord)],
) -> Result<(), TicketError> {
    for seq in &config.sequences {
        let file = LatticeRecord::of(config, server, seq);
        match recorded.iter().find(|(name, _)| *name == seq.name) {
            None => {
                return Err(TicketError::misconfigured(
                    &server.name,
                    format!(
                        "sequence {:?} has no recorded lattice (run `shardflake tickets init`)",
                        seq.name
                    ),
                ));
            }
            Some((_, r)) if *r != file => {
                return Err(TicketError::lattice_changed(
                    &server.name,
                    &seq.name,
                    r,
                    &file,
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An answer with the identity of the table or sequence it came from,
/// read in the same round trip: a restore that recreates the object (a
/// dump loaded into a running server: `DROP`, `CREATE`, rows) changes it,
/// so a client can tell an answer from a restored counter from a good one
/// although the value alone looks fine to it. PostgreSQL: the relation's
/// file node (`pg_relation_filenode`: new for a recreated relation, and for
/// a `TRUNCATE`, `ALTER SEQUENCE … RESTART` or a rewrite, not for rows
/// written or `setval`); MariaDB: InnoDB's table id, or without the `PROCESS` privilege the
/// table's creation time (unix seconds). `None` where the server cannot
/// say (MySQL has no `RETURNING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamped<T> {
    pub value: T,
    pub table: Option<i64>,
}

/// `('server', 'sequence', id), ...`: the rows of a high-water upsert.
/// Server and sequence names are plain identifiers (the config checks them),
/// so they need no escaping.
pub(crate) fn high_water_rows(marks: &[(String, String, u64)]) -> String {
    marks
        .iter()
        .map(|(s, q, hw)| format!("('{s}', '{q}', {hw})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `check` reads from one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// MariaDB `@@global.auto_increment_increment`, `…_offset`.
    pub global: Option<(u64, u64)>,
    /// The same for the client's session, after it set them.
    pub session: Option<(u64, u64)>,
    /// Durability settings that can make a crash hand out ids again.
    pub warnings: Vec<String>,
    /// Each sequence.
    pub sequences: Vec<SequenceState>,
}

/// One sequence on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceState {
    /// The sequence.
    pub name: String,
    /// Its table, sequence or row, and type.
    pub detail: String,
    /// The largest id its counter says may have been handed out (`None`:
    /// not initialised).
    pub counter: Option<u64>,
    /// The high-water its peers hold for it.
    pub high_water: Option<u64>,
    /// What is wrong with it, if anything.
    pub problem: Option<String>,
}

pub(crate) fn not_initialised(server: &str, seq: &SequenceConfig) -> TicketError {
    TicketError::misconfigured(
        server,
        format!(
            "sequence {:?} is not initialised (run `shardflake tickets init`)",
            seq.name
        ),
    )
}

/// A sequence `init` finds in the other mode on this server.
pub(crate) fn mode_changed(server: &str, seq: &SequenceConfig, was: &str) -> TicketError {
    TicketError::misconfigured(
        server,
        format!(
            "sequence {:?} is already {was} on this server; changing its mode would hand out ids twice",
            seq.name
        ),
    )
}
