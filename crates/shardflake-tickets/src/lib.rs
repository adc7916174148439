//! Flickr's ticket servers and Leaf-style segment allocation on MariaDB and
//! PostgreSQL, with failover that refuses a server restored behind ids it
//! already handed out.
//!
//! Sources: "Ticket Servers: Distributed Unique Primary Keys on the Cheap"
//! (Flickr engineering blog, 2010): a table per sequence, `REPLACE INTO
//! Tickets64 (stub) VALUES ('a')`, two servers with `auto-increment-increment
//! = 2` and offsets 1 and 2; and Meituan's "Leaf——美团点评分布式ID生成系统"
//! (Leaf: Meituan's distributed id generator): the segment mode, a row per
//! sequence whose `max_id` a client advances by a step to reserve a block,
//! served from memory with a double buffer.
//!
//! What this crate adds: on MariaDB, Flickr's one row per sequence
//! advanced by `UPDATE … SET id = LAST_INSERT_ID(id) + increment` instead
//! of `REPLACE` (no gap lock, no delete: no deadlock under concurrency);
//! N servers of either kind from one TOML file; the
//! increment and offset set by the client on its own sessions (a drifted
//! server cannot make it hand out another server's ids); blocks of N
//! servers that never overlap; failover with bounded timeouts; high-water
//! marks written ahead of every id on the peers (and etcd), a server
//! raised past them whenever it comes back, every answer compared with the
//! previous one and carrying the identity of its table or sequence (so a
//! dump loaded into a running server is seen by every client); each sequence's lattice recorded on the servers and checked
//! by every session; typed errors with stable codes, and no wrap at a
//! 32-bit sequence's end.
//!
//! # Map of the modules
//!
//! - [`config`]: the TOML file, validated ([`Config`], [`ConfigError`]),
//!   and the limits on one call.
//! - [`error`]: [`TicketError`] and its codes.
//! - `backend`: the `Backend` trait (what one session of a server offers),
//!   one file per database implementing it (`backend/mariadb.rs`,
//!   `backend/postgres.rs`): the SQL, one round trip per id or block; and
//!   what both share (the tables, the lattice record, what `check` reads).
//!   `session`: the enum over the two, a `Backend` by delegating, which
//!   the layers above call.
//! - [`segment`]: the residue classes of blocks, a block, the double buffer.
//! - [`failover`]: the failover loop every call runs through, and a
//!   server's sessions, breaker state, checks, metrics.
//! - [`high_water`]: [`HighWaterStore`] and the peers-backed [`PeersStore`].
//! - [`client`]: [`TicketClient`], what the CLI and the service call.
//! - [`admin`]: `init`, `check`, `repair`, `reshape`.
//!
//! The benchmark harness (`shardflake tickets bench`) is the CLI's.
//!
//! ```no_run
//! # async fn demo() -> Result<(), shardflake_tickets::TicketError> {
//! let config = shardflake_tickets::Config::load("tickets.toml")?;
//! let client = shardflake_tickets::TicketClient::connect(config).await?;
//! let id = client.next("photos").await?;
//! let ids = client.next_n("photos", 100).await?;
//! # let _ = (id, ids); Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod admin;
mod backend;
pub mod client;
pub mod config;
pub mod error;
pub mod etcd_marks;
pub mod failover;
pub mod high_water;
pub mod segment;
mod session;

pub use backend::{
    HW_TABLE, LATTICE_TABLE, LatticeRecord, SEGMENT_TABLE, SequenceState, ServerSettings,
    VERSION_TABLE,
};
pub use client::{ShutdownReport, TicketClient};
pub use config::{
    Config, ConfigError, Kind, MAX_COUNT, MAX_PER_ID_COUNT, MarksConfig, Mode, PgTickets,
};
pub use error::{ServerFailure, Superseded, TicketError};
pub use failover::{Health, ServerMetrics};
pub use high_water::{HighWaterStore, PeersStore, ResidueClass};

/// The MariaDB/MySQL client this crate uses.
pub use mysql_async;
/// The PostgreSQL client this crate uses.
pub use tokio_postgres;
