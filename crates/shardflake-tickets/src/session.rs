//! One connection to one ticket server, whatever its kind: the operations
//! the client, the high-water store and the admin commands need, each one
//! round trip, dispatched to the backend of its kind
//! ([`crate::backend::mariadb`], [`crate::backend::postgres`]).

use crate::backend::mariadb::MariaSession;
use crate::backend::postgres::PgSession;
use crate::backend::{LatticeRecord, ServerSettings, Stamped, check_lattice};
use crate::config::{Config, Kind, SequenceConfig, ServerConfig};
use crate::error::TicketError;
use crate::segment::Lattice;

/// A connected session.
pub(crate) enum Session {
    Maria(MariaSession),
    Pg(PgSession),
}

impl Session {
    /// A session for handing out ids: increment and offset set (MariaDB),
    /// sequences verified and statements prepared (PostgreSQL), and every
    /// sequence's recorded lattice as in the file.
    pub async fn connect(server: &ServerConfig, config: &Config) -> Result<Session, TicketError> {
        let mut session = Session::connect_admin(server, config).await?;
        let recorded = session.read_lattice().await?;
        check_lattice(config, server, &recorded)?;
        if let Session::Pg(pg) = &mut session {
            pg.prepare(server, config).await?;
        }
        Ok(session)
    }

    /// A session for admin work and the high-water table: nothing prepared,
    /// so it works before `init`.
    pub async fn connect_admin(
        server: &ServerConfig,
        config: &Config,
    ) -> Result<Session, TicketError> {
        Ok(match server.kind {
            Kind::Mariadb => Session::Maria(MariaSession::connect(server, config).await?),
            Kind::Postgres => Session::Pg(PgSession::connect(server, config).await?),
        })
    }

    pub async fn next_ticket(
        &mut self,
        index: usize,
        seq: &SequenceConfig,
    ) -> Result<Stamped<u64>, TicketError> {
        match self {
            Session::Maria(s) => s.next_ticket(index, seq).await,
            Session::Pg(s) => s.next_ticket(index, seq).await,
        }
    }

    /// The identity of the table or sequence `seq` counts with (see
    /// [`Stamped`]).
    pub async fn identity(&mut self, seq: &SequenceConfig) -> Result<Option<i64>, TicketError> {
        match self {
            Session::Maria(s) => s.identity(seq).await,
            Session::Pg(s) => s.identity(seq).await,
        }
    }

    /// Reserves a block: `Ok(row)`, or `Err(row)` when the row is below
    /// `seen` (the server went back); with the segment table's identity.
    pub async fn reserve(
        &mut self,
        seq: &SequenceConfig,
        floor: i64,
        step: i64,
        seen: i64,
    ) -> Result<Stamped<Result<i64, i64>>, TicketError> {
        match self {
            Session::Maria(s) => s.reserve(seq, floor, step, seen).await,
            Session::Pg(s) => s.reserve(seq, floor, step, seen).await,
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

    pub async fn give_back_high_water(
        &mut self,
        server: &str,
        sequence: &str,
        expected: u64,
        to: u64,
    ) -> Result<(), TicketError> {
        match self {
            Session::Maria(s) => s.give_back_high_water(server, sequence, expected, to).await,
            Session::Pg(s) => s.give_back_high_water(server, sequence, expected, to).await,
        }
    }

    /// When the server started, in unix seconds (to the second).
    pub async fn started(&mut self) -> Result<i64, TicketError> {
        match self {
            Session::Maria(s) => s.started().await,
            Session::Pg(s) => s.started().await,
        }
    }

    /// Every lattice recorded on this server, by sequence (empty before `init`).
    pub async fn read_lattice(&mut self) -> Result<Vec<(String, LatticeRecord)>, TicketError> {
        match self {
            Session::Maria(s) => s.read_lattice().await,
            Session::Pg(s) => s.read_lattice().await,
        }
    }

    /// Moves `seq` to the file's lattice, every later id above `past`.
    pub async fn reshape(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        match self {
            // The increment and offset are the session's: the counter is all.
            Session::Maria(s) => s.raise(seq, Lattice::new(config, server), past).await,
            Session::Pg(s) => s.reshape(config, server, seq, past).await,
        }
    }

    /// Records (replaces) the lattice of `sequence`.
    pub async fn write_lattice(
        &mut self,
        sequence: &str,
        record: &LatticeRecord,
    ) -> Result<(), TicketError> {
        match self {
            Session::Maria(s) => s.write_lattice(sequence, record).await,
            Session::Pg(s) => s.write_lattice(sequence, record).await,
        }
    }

    /// Every mark this server holds for `sequence`, of any server.
    pub async fn read_marks_of_sequence(&mut self, sequence: &str) -> Result<u64, TicketError> {
        match self {
            Session::Maria(s) => s.read_marks_of_sequence(sequence).await,
            Session::Pg(s) => s.read_marks_of_sequence(sequence).await,
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
