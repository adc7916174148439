//! One connection to one ticket server, whatever its kind: the enum over
//! the two backends ([`crate::backend::mariadb`],
//! [`crate::backend::postgres`]), implementing [`Backend`] by delegating
//! each call to the session it holds.

use crate::backend::mariadb::MariaSession;
use crate::backend::postgres::PgSession;
use crate::backend::{
    Backend, Holder, LatticeRecord, LatticeVersion, MarkFence, ServerIdentity, ServerSettings,
    Stamped, check_lattice, check_marks_at, reshaping, unguarded,
};
use crate::config::{Config, Kind, SequenceConfig, ServerConfig};
use crate::error::TicketError;

/// A connected session.
pub(crate) enum Session {
    Maria(MariaSession),
    Pg(PgSession),
}

impl Session {
    /// A session for handing out ids: increment and offset set (MariaDB),
    /// sequences verified and statements prepared (PostgreSQL), every
    /// sequence's recorded lattice as in the file, no reshape under way,
    /// every table the guard watches guarded, the marks kept where the
    /// file's `[marks]` says, and the session pinned to the lattice's
    /// version.
    /// `read`: the lattice version the server records, once read (also
    /// when the session is refused: a server refusing the file's lattice
    /// at a lower version than another server went back, not the file).
    pub async fn connect(
        server: &ServerConfig,
        config: &Config,
        read: &mut Option<i64>,
    ) -> Result<Session, TicketError> {
        let mut session = Session::connect_admin(server, config).await?;
        // The version before the lattice: a reshape that begins between the
        // two raises the version, so this session is refused at its first
        // call (read after, a new version could pass with the old lattice).
        let version = session.lattice_version().await?;
        *read = version.map(|v| v.version);
        let recorded = session.read_lattice().await?;
        check_lattice(config, server, &recorded, version.as_ref())?;
        let version = version
            .ok_or_else(|| TicketError::missing_record(&server.name, "the lattice version"))?;
        if version.reshaping {
            return Err(reshaping(&server.name));
        }
        // A client keeping its marks elsewhere than the others would never
        // see theirs.
        check_marks_at(
            config,
            &server.name,
            session.read_marks_at().await?.as_deref(),
            Some(version.version),
        )?;
        session.pin_lattice(version.version).await?;
        session.prepare(server, config).await?;
        if let Some(table) = session.unguarded(config).await?.first() {
            return Err(unguarded(&server.name, table));
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
}

/// `$call` on the backend session `$session` holds, named `$b`.
macro_rules! delegate {
    ($session:expr, $b:ident => $call:expr) => {
        match $session {
            Session::Maria($b) => $call,
            Session::Pg($b) => $call,
        }
    };
}

impl Backend for Session {
    async fn prepare(&mut self, server: &ServerConfig, config: &Config) -> Result<(), TicketError> {
        delegate!(self, b => b.prepare(server, config).await)
    }

    async fn next_ticket(
        &mut self,
        index: usize,
        seq: &SequenceConfig,
    ) -> Result<Stamped<u64>, TicketError> {
        delegate!(self, b => b.next_ticket(index, seq).await)
    }

    async fn identity(&mut self, seq: &SequenceConfig) -> Result<Option<i64>, TicketError> {
        delegate!(self, b => b.identity(seq).await)
    }

    async fn reserve(
        &mut self,
        seq: &SequenceConfig,
        floor: i64,
        step: i64,
        seen: i64,
    ) -> Result<Stamped<Result<i64, i64>>, TicketError> {
        delegate!(self, b => b.reserve(seq, floor, step, seen).await)
    }

    async fn counter(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<Option<u64>, TicketError> {
        delegate!(self, b => b.counter(config, server, seq).await)
    }

    async fn raise(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        delegate!(self, b => b.raise(config, server, seq, past).await)
    }

    async fn vouch(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        delegate!(self, b => b.vouch(config, server, seq, past).await)
    }

    async fn reshape(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError> {
        delegate!(self, b => b.reshape(config, server, seq, past).await)
    }

    async fn write_high_water(
        &mut self,
        marks: &[(String, String, u64)],
        fence: Option<MarkFence<'_>>,
    ) -> Result<bool, TicketError> {
        delegate!(self, b => b.write_high_water(marks, fence).await)
    }

    async fn read_holder(&mut self, class: &str) -> Result<Option<Holder>, TicketError> {
        delegate!(self, b => b.read_holder(class).await)
    }

    async fn claim(
        &mut self,
        class: &str,
        identity: &str,
        server: &str,
        from: Option<&Holder>,
    ) -> Result<bool, TicketError> {
        delegate!(self, b => b.claim(class, identity, server, from).await)
    }

    async fn read_marks_of_sequence(&mut self, sequence: &str) -> Result<u64, TicketError> {
        delegate!(self, b => b.read_marks_of_sequence(sequence).await)
    }

    async fn high_water_servers(&mut self) -> Result<Vec<String>, TicketError> {
        delegate!(self, b => b.high_water_servers().await)
    }

    async fn read_high_water(
        &mut self,
        holders: &[&str],
    ) -> Result<Vec<(String, u64)>, TicketError> {
        delegate!(self, b => b.read_high_water(holders).await)
    }

    async fn identify(&mut self) -> Result<ServerIdentity, TicketError> {
        delegate!(self, b => b.identify().await)
    }

    async fn unguarded(&mut self, config: &Config) -> Result<Vec<String>, TicketError> {
        delegate!(self, b => b.unguarded(config).await)
    }

    async fn read_lattice(&mut self) -> Result<Vec<(String, LatticeRecord)>, TicketError> {
        delegate!(self, b => b.read_lattice().await)
    }

    async fn lattice_version(&mut self) -> Result<Option<LatticeVersion>, TicketError> {
        delegate!(self, b => b.lattice_version().await)
    }

    async fn read_marks_at(&mut self) -> Result<Option<String>, TicketError> {
        delegate!(self, b => b.read_marks_at().await)
    }

    async fn write_marks_at(&mut self, places: &str, replace: bool) -> Result<(), TicketError> {
        delegate!(self, b => b.write_marks_at(places, replace).await)
    }

    async fn forget_marks_at(&mut self, places: &str) -> Result<(), TicketError> {
        delegate!(self, b => b.forget_marks_at(places).await)
    }

    async fn pin_lattice(&mut self, version: i64) -> Result<(), TicketError> {
        delegate!(self, b => b.pin_lattice(version).await)
    }

    async fn begin_reshape(&mut self, to: i64) -> Result<(), TicketError> {
        delegate!(self, b => b.begin_reshape(to).await)
    }

    async fn end_reshape(&mut self) -> Result<(), TicketError> {
        delegate!(self, b => b.end_reshape().await)
    }

    async fn write_lattice(
        &mut self,
        sequence: &str,
        record: &LatticeRecord,
    ) -> Result<(), TicketError> {
        delegate!(self, b => b.write_lattice(sequence, record).await)
    }

    async fn init(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<Vec<String>, TicketError> {
        delegate!(self, b => b.init(config, server).await)
    }

    async fn settings(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<ServerSettings, TicketError> {
        delegate!(self, b => b.settings(config, server).await)
    }
}
