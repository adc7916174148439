//! Unique 64-bit, time-ordered ids for sharded and distributed databases.
//!
//! shardflake speaks the layouts of Twitter Snowflake, Instagram's PostgreSQL
//! shard ids, Sonyflake, Discord and the MySQL procedure variant, and makes
//! UUIDs and MongoDB ObjectIds on request. This crate is the core: pure id
//! logic, no I/O and no async. The service and database crates build on it.
//!
//! ```
//! use shardflake::{Generator, preset};
//!
//! let layout = preset::by_name("snowflake")?;
//! let generator = Generator::builder(layout.clone()).node("node", 5).build()?;
//! let a = generator.next_id()?;
//! let b = generator.next_id()?;
//! assert!(a < b);
//! assert_eq!(a.decode(&layout)?.field("node"), Some(5));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Map of the modules
//!
//! - [`layout`]: [`Layout`], the bit layout every other part reads; built and
//!   validated once.
//! - [`preset`]: the named layouts (`snowflake`, `twitter`, `instagram`, ...).
//! - [`id`]: [`Id`], decoding into [`Parts`] and composing from them.
//! - [`format`](mod@format): text forms (decimal, hex, Crockford base32, base62).
//! - [`clock`]: where time comes from ([`SystemClock`], [`MonotonicClock`],
//!   [`ManualClock`]).
//! - [`generator`]: the lock-free [`Generator`] and its policies.
//! - [`node`]: node ids from host names, MAC addresses and IPs.
//! - [`plan`]: capacity of a layout and a suggested layout for a need.
//! - [`range`]: ids by time ([`Layout::id_range`], [`Layout::min_id_at`])
//!   and the time a layout has left.
//! - [`backfill`]: ids for rows from the past, at each row's own time
//!   ([`Backfill`]).
//! - [`uuid`], [`objectid`], [`kind`]: the other id kinds, and recognising
//!   any of them in text.
//! - [`wait`]: waits for the clock, left to the caller by the `try_` calls
//!   (so an async server never blocks a worker thread).
//! - [`timestamp`]: RFC 3339 formatting shared by everything that shows time.
//! - [`error`]: one typed error per job.
//! - `serde` (feature `serde`, on by default): ids as strings.
//! - `postgres` (feature `postgres`): [`Id`] as a PostgreSQL `bigint` in
//!   `tokio-postgres`/`postgres`.
//! - `sqlx` (feature `sqlx`): [`Id`] in sqlx, for PostgreSQL and
//!   MySQL/MariaDB.

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backfill;
pub mod clock;
pub mod error;
pub mod format;
pub mod generator;
pub mod id;
pub mod kind;
pub mod layout;
pub mod node;
pub mod objectid;
mod parse;
pub mod plan;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
pub mod preset;
pub mod range;
#[cfg(feature = "serde")]
pub mod serde;
#[cfg(feature = "sqlx")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlx")))]
pub mod sqlx;
mod sync;
pub mod timestamp;
pub mod uuid;
mod uuid_info;
pub mod wait;

pub use backfill::Backfill;
pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock};
pub use error::{
    BackfillError, ConvertError, GenerateError, IdError, LayoutError, NodeIdError, ParseError,
    TimeRangeError, UuidError,
};
pub use format::Format;
pub use generator::{
    Batch, ExhaustedPolicy, Generator, GeneratorBuilder, LocalGenerator, RollbackPolicy, Stats,
};
pub use id::{Id, NodeBits, Parts};
pub use kind::{Kind, Recognised};
pub use layout::{Field, FieldKind, Layout, LayoutBuilder};
pub use objectid::{ObjectId, ObjectIdGenerator};
pub use range::IdRange;
pub use wait::{Attempt, Step};

// The library guide's Rust examples run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide/library.md")]
struct GuideLibrary;
