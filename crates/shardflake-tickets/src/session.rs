//! One connection to one ticket server, whatever its kind: the operations
//! the client, the high-water store and the admin commands need, each one
//! round trip, dispatched to [`crate::mariadb`] or [`crate::postgres`].

use crate::config::{Config, Kind, SequenceConfig, ServerConfig};
use crate::error::TicketError;
use crate::mariadb::MariaSession;
use crate::postgres::PgSession;
use crate::segment::Lattice;

/// The segment rows: one per segment sequence.
pub const SEGMENT_TABLE: &str = "shardflake_ticket_segments";
/// The high-water marks of every server, kept on its peers.
pub const HW_TABLE: &str = "shardflake_ticket_hw";

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

/// A connected session.
pub(crate) enum Session {
    Maria(MariaSession),
    Pg(PgSession),
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

impl Session {
    /// A session for handing out ids: increment and offset set (MariaDB),
    /// sequences verified and statements prepared (PostgreSQL).
    pub async fn connect(server: &ServerConfig, config: &Config) -> Result<Session, TicketError> {
        Ok(match server.kind {
            Kind::Mariadb => Session::Maria(MariaSession::connect(server, config).await?),
            Kind::Postgres => Session::Pg(PgSession::connect(server, config, true).await?),
        })
    }

    /// A session for admin work and the high-water table: nothing prepared,
    /// so it works before `init`.
    pub async fn connect_admin(
        server: &ServerConfig,
        config: &Config,
    ) -> Result<Session, TicketError> {
        Ok(match server.kind {
            Kind::Mariadb => Session::Maria(MariaSession::connect(server, config).await?),
            Kind::Postgres => Session::Pg(PgSession::connect(server, config, false).await?),
        })
    }

    pub async fn next_ticket(
        &mut self,
        index: usize,
        seq: &SequenceConfig,
    ) -> Result<u64, TicketError> {
        match self {
            Session::Maria(s) => s.next_ticket(index, seq).await,
            Session::Pg(s) => s.next_ticket(index, seq).await,
        }
    }

    pub async fn reserve(
        &mut self,
        seq: &SequenceConfig,
        floor: i64,
        step: i64,
    ) -> Result<i64, TicketError> {
        match self {
            Session::Maria(s) => s.reserve(seq, floor, step).await,
            Session::Pg(s) => s.reserve(seq, floor, step).await,
        }
    }

    pub async fn give_back(
        &mut self,
        seq: &SequenceConfig,
        expected: i64,
        to: i64,
    ) -> Result<bool, TicketError> {
        match self {
            Session::Maria(s) => s.give_back(seq, expected, to).await,
            Session::Pg(s) => s.give_back(seq, expected, to).await,
        }
    }

    pub async fn counter(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<Option<u64>, TicketError> {
        match self {
            Session::Maria(s) => s.counter(seq, Lattice::new(config, server)).await,
            Session::Pg(s) => s.counter(config, server, seq).await,
        }
    }

    pub async fn raise(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        match self {
            Session::Maria(s) => s.raise(seq, Lattice::new(config, server), past).await,
            Session::Pg(s) => s.raise(config, server, seq, past).await,
        }
    }

    pub async fn write_high_water(
        &mut self,
        marks: &[(String, String, u64)],
    ) -> Result<(), TicketError> {
        match self {
            Session::Maria(s) => s.write_high_water(marks).await,
            Session::Pg(s) => s.write_high_water(marks).await,
        }
    }

    pub async fn read_high_water(
        &mut self,
        server: &str,
    ) -> Result<Vec<(String, u64)>, TicketError> {
        match self {
            Session::Maria(s) => s.read_high_water(server).await,
            Session::Pg(s) => s.read_high_water(server).await,
        }
    }

    pub async fn init(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<Vec<String>, TicketError> {
        match self {
            Session::Maria(s) => s.init(config, server).await,
            Session::Pg(s) => s.init(config, server).await,
        }
    }

    pub async fn settings(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<ServerSettings, TicketError> {
        match self {
            Session::Maria(s) => s.settings(config, server).await,
            Session::Pg(s) => s.settings(config, server).await,
        }
    }
}
