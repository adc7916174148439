//! The TOML file that names the ticket servers, their offsets and the
//! sequences, validated into a [`Config`] with typed errors.
//!
//! ```toml
//! # increment = 2            # default: the number of servers
//! [[servers]]
//! name = "t1"
//! kind = "mariadb"           # or "postgres"
//! url = "mysql://root@127.0.0.1:3306/app"
//! offset = 1
//!
//! [[servers]]
//! name = "t2"
//! kind = "mariadb"
//! url = "mysql://root@127.0.0.1:3307/app"
//! offset = 2
//!
//! [[sequences]]
//! name = "photos"            # table tickets_photos
//! bits = 64                  # or 32
//! mode = "per-id"            # or "segment"
//! ```
//!
//! Server `j` with offset `o_j` hands out only ids `≡ o_j (mod increment)`
//! (per-id mode) or only its own residue class of blocks (segment mode, see
//! [`crate::segment`]). The offsets must be distinct and in `1..=increment`;
//! neither the offsets, the increment nor the segment `chunk` may change on a
//! deployment that has handed out ids: `init` records them on every server,
//! every session compares them with the file (`lattice_changed`), and
//! `shardflake tickets reshape` changes them safely.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// The largest id of a 32-bit sequence (`int unsigned`).
pub const MAX_32: u64 = u32::MAX as u64;
/// The largest id of a 64-bit sequence: `i64::MAX`, since PostgreSQL's
/// `bigint` and the segment rows are signed.
pub const MAX_64: u64 = i64::MAX as u64;

/// The most ids one [`TicketClient::next_n`](crate::TicketClient::next_n)
/// call returns from a segment sequence (served from memory).
pub const MAX_COUNT: usize = 100_000;

/// The most ids one [`TicketClient::next_n`](crate::TicketClient::next_n)
/// call takes from a per-id sequence. Each costs a round trip in turn (a
/// pair answers about 2,500 a second here), so a request stays well under a
/// second; a caller who wants more at once wants a segment sequence.
pub const MAX_PER_ID_COUNT: usize = 1_000;

/// A bad configuration file; every message names the offending entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The path.
        path: String,
        /// The OS error.
        message: String,
    },
    /// Not TOML, an unknown key, or a value of the wrong type (the message
    /// carries the line and column).
    #[error("bad tickets configuration: {0}")]
    Toml(String),
    /// No `[[servers]]`.
    #[error("no [[servers]]: name at least one ticket server")]
    NoServers,
    /// No `[[sequences]]`.
    #[error("no [[sequences]]: name at least one sequence")]
    NoSequences,
    /// A server or sequence name that is not `[a-z_][a-z0-9_]*`, 1 to 48 characters.
    #[error("{what} name {name:?} is not [a-z_][a-z0-9_]* (1 to 48 characters)")]
    BadName {
        /// `server` or `sequence`.
        what: &'static str,
        /// The name.
        name: String,
    },
    /// Two servers with one name.
    #[error("two servers are named {0:?}")]
    DuplicateServer(String),
    /// Two sequences with one name.
    #[error("two sequences are named {0:?}")]
    DuplicateSequence(String),
    /// Two servers with one offset would hand out the same ids.
    #[error(
        "servers {first:?} and {second:?} share offset {offset}: they would hand out the same ids"
    )]
    DuplicateOffset {
        /// The shared offset.
        offset: u64,
        /// The first server.
        first: String,
        /// The second server.
        second: String,
    },
    /// An offset outside `1..=increment`.
    #[error("server {server:?}: offset {offset} is not in 1..={increment}")]
    OffsetOutOfRange {
        /// The server.
        server: String,
        /// Its offset.
        offset: u64,
        /// The increment.
        increment: u64,
    },
    /// An increment below the number of servers or above MariaDB's 65535.
    #[error("increment {increment} must be in {servers}..=65535 (the number of servers and up)")]
    BadIncrement {
        /// The increment.
        increment: u64,
        /// The number of servers.
        servers: usize,
    },
    /// A server URL whose scheme does not match its kind.
    #[error("server {server:?}: url must start with {expected} for kind {kind}")]
    BadUrl {
        /// The server.
        server: String,
        /// `mysql://` or `postgres://`.
        expected: &'static str,
        /// The kind.
        kind: &'static str,
    },
    /// Bits other than 32 or 64.
    #[error("sequence {sequence:?}: bits must be 32 or 64, not {bits}")]
    BadBits {
        /// The sequence.
        sequence: String,
        /// The bits given.
        bits: u32,
    },
    /// A start value of 0 or past the sequence's maximum.
    #[error("sequence {sequence:?}: start {start} is not in 1..={max}")]
    BadStart {
        /// The sequence.
        sequence: String,
        /// The start value.
        start: u64,
        /// The sequence's maximum.
        max: u64,
    },
    /// Inconsistent `[segment]` or `[failover]` settings.
    #[error("{0}")]
    Bad(String),
}

/// The database behind a ticket server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// MariaDB (or MySQL): a counter row per sequence (Flickr's table,
    /// advanced by `UPDATE` rather than `REPLACE INTO`).
    Mariadb,
    /// PostgreSQL: a sequence or Flickr's table, see [`PgTickets`].
    Postgres,
}

impl Kind {
    /// `mariadb` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Mariadb => "mariadb",
            Kind::Postgres => "postgres",
        }
    }
}

/// How a PostgreSQL server keeps a per-id ticket sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PgTickets {
    /// `CREATE SEQUENCE … INCREMENT BY n START WITH k NO CYCLE`, one
    /// `nextval` per id: measured faster (`docs/BENCHMARKS.md`), but a
    /// `setval` that sets it back in place (a data-only dump restored)
    /// while clients run is neither refused nor seen by a client whose
    /// last answer was below it.
    Sequence,
    /// Flickr's table, `INSERT … ON CONFLICT (stub) DO UPDATE SET id = id + n
    /// RETURNING id` (the default): its guard refuses to set it back in
    /// place, and a table recreated or truncated is seen.
    #[default]
    Table,
}

/// How a sequence hands out ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// One database round trip per id (Flickr).
    #[default]
    PerId,
    /// Blocks reserved in one round trip, served from memory (Leaf-segment).
    Segment,
}

impl Mode {
    /// `per-id` or `segment`, as in the file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::PerId => "per-id",
            Mode::Segment => "segment",
        }
    }

    /// The most ids one [`TicketClient::next_n`](crate::TicketClient::next_n)
    /// call returns in this mode.
    pub const fn max_count(self) -> usize {
        match self {
            Mode::PerId => MAX_PER_ID_COUNT,
            Mode::Segment => MAX_COUNT,
        }
    }
}

/// One ticket server.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    /// Its name in errors, metrics and the high-water table.
    pub name: String,
    /// MariaDB or PostgreSQL.
    pub kind: Kind,
    /// `mysql://user@host:port/db` or `postgres://user@host:port/db`.
    pub url: String,
    /// Its residue: it hands out ids `≡ offset (mod increment)`, 1-based.
    pub offset: u64,
    /// Connections the client keeps to it (default 4).
    #[serde(default = "default_connections")]
    pub connections: usize,
}

fn default_connections() -> usize {
    4
}

/// One ticket sequence (a table per sequence, as Flickr's photos, accounts, …).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SequenceConfig {
    /// Its name: table `tickets_<name>`, segment row `<name>`.
    pub name: String,
    /// 32 (`int unsigned`, up to 4,294,967,295) or 64 (up to `i64::MAX`).
    #[serde(default = "default_bits")]
    pub bits: u32,
    /// Per-id or segment.
    #[serde(default)]
    pub mode: Mode,
    /// The smallest id `init` lets it hand out (default 1).
    #[serde(default = "default_start")]
    pub start: u64,
    /// MariaDB per id: an existing Flickr ticket table to adopt (such as
    /// `Tickets64`, `id` its `AUTO_INCREMENT` column) instead of
    /// `tickets_<name>`. Its applications' own `REPLACE INTO` keeps
    /// working: this client runs the same statement, so both draw from the
    /// table's one `AUTO_INCREMENT` counter (see `backend::mariadb`).
    #[serde(default)]
    pub table: Option<String>,
    /// The adopted table's stub value, `a` by default (Flickr's).
    #[serde(default)]
    pub stub: Option<String>,
}

fn default_bits() -> u32 {
    64
}

fn default_start() -> u64 {
    1
}

impl SequenceConfig {
    /// Its largest id.
    pub fn max_id(&self) -> u64 {
        if self.bits == 32 { MAX_32 } else { MAX_64 }
    }

    /// Its per-id table (MariaDB, PostgreSQL table style) or sequence:
    /// the adopted table where the file names one.
    pub fn table(&self) -> String {
        match &self.table {
            Some(table) => table.clone(),
            None => format!("tickets_{}", self.name),
        }
    }

    /// Whether it is an adopted Flickr table ([`SequenceConfig::table`]
    /// named in the file), handed out by `REPLACE INTO`.
    pub fn adopted(&self) -> bool {
        self.table.is_some()
    }

    /// The stub value of its row: the file's, or Flickr's `a`.
    pub fn stub(&self) -> &str {
        self.stub.as_deref().unwrap_or("a")
    }
}

/// Timeouts and probing.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverConfig {
    /// One attempt on one server (connect included), in ms (default 500).
    pub attempt_timeout_ms: u64,
    /// One call, all failovers included, in ms (default 2000): after it the
    /// caller gets `unavailable`.
    pub timeout_ms: u64,
    /// How often a server that is down (or refused) is probed, in ms (default 200).
    pub probe_interval_ms: u64,
    /// How often the background writer re-writes the high-water marks (to
    /// places that missed a write) and extends per-id reservations, in ms
    /// (default 100; 0 is refused: a write per millisecond under load).
    pub high_water_interval_ms: u64,
    /// Per-id: how many ids of one server a client may hand out past the
    /// mark it last wrote (default 1000). Marks are written ahead: every id
    /// a client hands out is at or below a mark already written, so a
    /// server that comes back behind is raised past it; each new checked
    /// session skips at most this many of the server's ids.
    pub mark_ahead: u64,
    /// One place holding marks (a peer, etcd) gets this long per read or
    /// write, in ms (default 150): places are asked together, so a stalled
    /// peer costs a call at most this, never the whole attempt.
    pub marks_timeout_ms: u64,
    /// `init`, `check`, `repair`, `reshape`: how long one statement may
    /// wait for a lock or an answer, in ms (default 5000; the server is
    /// told too: `lock_wait_timeout`, `lock_timeout`).
    pub admin_timeout_ms: u64,
    /// When no place holding a server's marks answers and the client has
    /// none of its own, use the server anyway (default false: refuse it
    /// with `no_high_water`). Availability over safety: a server restored
    /// from a backup then hands out its ids again.
    pub allow_without_marks: bool,
}

impl Default for FailoverConfig {
    fn default() -> Self {
        FailoverConfig {
            attempt_timeout_ms: 500,
            timeout_ms: 2000,
            probe_interval_ms: 200,
            high_water_interval_ms: 100,
            mark_ahead: 1000,
            marks_timeout_ms: 150,
            admin_timeout_ms: 5000,
            allow_without_marks: false,
        }
    }
}

impl FailoverConfig {
    /// [`FailoverConfig::attempt_timeout_ms`].
    pub fn attempt_timeout(&self) -> Duration {
        Duration::from_millis(self.attempt_timeout_ms)
    }
    /// [`FailoverConfig::timeout_ms`].
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    /// [`FailoverConfig::probe_interval_ms`].
    pub fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.probe_interval_ms)
    }
    /// [`FailoverConfig::high_water_interval_ms`].
    pub fn high_water_interval(&self) -> Duration {
        Duration::from_millis(self.high_water_interval_ms)
    }
    /// [`FailoverConfig::marks_timeout_ms`].
    pub fn marks_timeout(&self) -> Duration {
        Duration::from_millis(self.marks_timeout_ms)
    }
    /// [`FailoverConfig::admin_timeout_ms`].
    pub fn admin_timeout(&self) -> Duration {
        Duration::from_millis(self.admin_timeout_ms)
    }
}

/// Segment mode (Leaf-segment) settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SegmentConfig {
    /// Ids per chunk: the unit of the residue classes (default 100).
    /// Never change it on a deployment that has handed out ids.
    pub chunk: u64,
    /// Smallest block, in ids (a multiple of `chunk`; default 1000).
    pub min_step: u64,
    /// Largest block, in ids (a multiple of `chunk`; default 1,000,000).
    pub max_step: u64,
    /// Share of the current block used when the next is fetched (default
    /// 0.1, as Leaf); a file's is in (0, 1). 1 ([`Config::for_one_shot`]):
    /// never ahead, the next block is reserved once one is used up.
    pub prefetch_at: f64,
    /// The step doubles when a block lasted less than half this, halves when
    /// it lasted more than twice this, in ms (default 10,000).
    pub target_block_ms: u64,
}

impl Default for SegmentConfig {
    fn default() -> Self {
        SegmentConfig {
            chunk: 100,
            min_step: 1000,
            max_step: 1_000_000,
            prefetch_at: 0.1,
            target_block_ms: 10_000,
        }
    }
}

/// `[marks]`: where every client keeps the servers' high-water marks
/// besides the peers (always used). Every client of the file (the library,
/// every `shardflake tickets` command, `serve --tickets`) uses the same.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MarksConfig {
    /// etcd endpoints (`http://host:port`): marks kept in etcd too, which no
    /// restore of the ticket servers sets back. Empty: the peers only.
    pub etcd: Vec<String>,
    /// The key prefix in etcd (default `/shardflake/default`, the service's
    /// default prefix): marks live under `<prefix>/tickets/hw/`.
    pub etcd_prefix: String,
}

impl Default for MarksConfig {
    fn default() -> Self {
        MarksConfig {
            etcd: Vec::new(),
            etcd_prefix: "/shardflake/default".into(),
        }
    }
}

impl MarksConfig {
    /// Where the marks are kept, as `init` records it on every server and
    /// every session compares: `peers`, or `peers + etcd <prefix> at
    /// <endpoints>` (sorted, so their order in the file does not matter).
    /// Two files that differ here keep their marks apart, so neither's
    /// clients see the other's: one of them is refused.
    pub fn places(&self) -> String {
        if self.etcd.is_empty() {
            return "peers".into();
        }
        let mut endpoints: Vec<&str> = self.etcd.iter().map(|e| e.trim_end_matches('/')).collect();
        endpoints.sort_unstable();
        endpoints.dedup();
        format!(
            "peers + etcd {} at {}",
            self.etcd_prefix,
            endpoints.join(",")
        )
    }

    /// The etcd that [`MarksConfig::places`] wrote `places` for (`None`: the
    /// peers only, or not such a text).
    pub fn etcd_of_places(places: &str) -> Option<MarksConfig> {
        let (prefix, endpoints) = places.strip_prefix("peers + etcd ")?.rsplit_once(" at ")?;
        Some(MarksConfig {
            etcd: endpoints.split(',').map(str::to_string).collect(),
            etcd_prefix: prefix.to_string(),
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    increment: Option<u64>,
    #[serde(default)]
    postgres_tickets: PgTickets,
    #[serde(default)]
    failover: FailoverConfig,
    #[serde(default)]
    segment: SegmentConfig,
    #[serde(default)]
    marks: MarksConfig,
    #[serde(default)]
    servers: Vec<ServerConfig>,
    #[serde(default)]
    sequences: Vec<SequenceConfig>,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The step between a server's ids (default: the number of servers).
    pub increment: u64,
    /// How PostgreSQL servers keep per-id sequences.
    pub postgres_tickets: PgTickets,
    /// Timeouts and probing.
    pub failover: FailoverConfig,
    /// Segment mode settings.
    pub segment: SegmentConfig,
    /// Where the marks are kept besides the peers.
    pub marks: MarksConfig,
    /// The servers, in file order.
    pub servers: Vec<ServerConfig>,
    /// The sequences, in file order.
    pub sequences: Vec<SequenceConfig>,
}

/// An adopted table's name as MariaDB spells it unquoted, at most 56
/// characters (a trigger's name is the table's and 6 more, at most 64).
fn valid_table(name: &str) -> bool {
    let mut chars = name.chars();
    (1..=56).contains(&name.len())
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    (1..=48).contains(&name.len())
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

impl Config {
    /// These settings for a process that takes `count` ids and stops
    /// (`shardflake tickets next`): each segment sequence's blocks hold
    /// `count` ids rounded up to a chunk (at most the file's `max_step`),
    /// always, and none is fetched ahead. A client that stops skips the
    /// unused rest of the blocks it holds (rows only go up): with the
    /// default blocks (1,000 ids, the next fetched once a tenth of one is
    /// used) up to about 2,000 ids a run, here less than a chunk (and,
    /// for `count` above `max_step`, the rest of the last block).
    pub fn for_one_shot(mut self, count: u64) -> Config {
        let seg = &mut self.segment;
        let step = count
            .max(1)
            .div_ceil(seg.chunk)
            .saturating_mul(seg.chunk)
            .min(seg.max_step);
        seg.min_step = step;
        seg.max_step = step;
        seg.prefetch_at = 1.0;
        self
    }

    /// Reads and validates a file.
    pub fn load(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Config::parse(&text)
    }

    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Toml(e.to_string()))?;
        if raw.servers.is_empty() {
            return Err(ConfigError::NoServers);
        }
        if raw.sequences.is_empty() {
            return Err(ConfigError::NoSequences);
        }
        let increment = raw.increment.unwrap_or(raw.servers.len() as u64);
        if increment < raw.servers.len() as u64 || increment > 65535 {
            return Err(ConfigError::BadIncrement {
                increment,
                servers: raw.servers.len(),
            });
        }
        let mut names = HashSet::new();
        for (i, s) in raw.servers.iter().enumerate() {
            if !valid_name(&s.name) {
                return Err(ConfigError::BadName {
                    what: "server",
                    name: s.name.clone(),
                });
            }
            if !names.insert(s.name.as_str()) {
                return Err(ConfigError::DuplicateServer(s.name.clone()));
            }
            if s.offset == 0 || s.offset > increment {
                return Err(ConfigError::OffsetOutOfRange {
                    server: s.name.clone(),
                    offset: s.offset,
                    increment,
                });
            }
            if let Some(first) = raw.servers[..i].iter().find(|o| o.offset == s.offset) {
                return Err(ConfigError::DuplicateOffset {
                    offset: s.offset,
                    first: first.name.clone(),
                    second: s.name.clone(),
                });
            }
            let expected = match s.kind {
                Kind::Mariadb => "mysql://",
                Kind::Postgres => "postgres://",
            };
            let postgresql = s.kind == Kind::Postgres && s.url.starts_with("postgresql://");
            if !s.url.starts_with(expected) && !postgresql {
                return Err(ConfigError::BadUrl {
                    server: s.name.clone(),
                    expected,
                    kind: s.kind.as_str(),
                });
            }
            if s.connections == 0 || s.connections > 64 {
                return Err(ConfigError::Bad(format!(
                    "server {:?}: connections must be in 1..=64",
                    s.name
                )));
            }
        }
        let mut names = HashSet::new();
        for q in &raw.sequences {
            if !valid_name(&q.name) {
                return Err(ConfigError::BadName {
                    what: "sequence",
                    name: q.name.clone(),
                });
            }
            if !names.insert(q.name.as_str()) {
                return Err(ConfigError::DuplicateSequence(q.name.clone()));
            }
            if q.bits != 32 && q.bits != 64 {
                return Err(ConfigError::BadBits {
                    sequence: q.name.clone(),
                    bits: q.bits,
                });
            }
            if q.start == 0 || q.start > q.max_id() {
                return Err(ConfigError::BadStart {
                    sequence: q.name.clone(),
                    start: q.start,
                    max: q.max_id(),
                });
            }
            if let Some(table) = &q.table {
                if !valid_table(table) {
                    return Err(ConfigError::Bad(format!(
                        "sequence {:?}: table {table:?} is not [A-Za-z_][A-Za-z0-9_]* (1 to 56 characters)",
                        q.name
                    )));
                }
                if q.mode != Mode::PerId || raw.servers.iter().any(|s| s.kind != Kind::Mariadb) {
                    return Err(ConfigError::Bad(format!(
                        "sequence {:?}: an adopted table ({table}) is per-id on MariaDB servers only; remove `table` to use tickets_{}",
                        q.name, q.name
                    )));
                }
                if let Some(other) = raw
                    .sequences
                    .iter()
                    .find(|o| o.name != q.name && o.table() == *table)
                {
                    return Err(ConfigError::Bad(format!(
                        "sequences {:?} and {:?} both use table {table}: they would hand out the same ids",
                        other.name, q.name
                    )));
                }
            }
            if let Some(stub) = &q.stub
                && (q.table.is_none()
                    || !(1..=8).contains(&stub.len())
                    || !stub.chars().all(|c| c.is_ascii_alphanumeric()))
            {
                return Err(ConfigError::Bad(format!(
                    "sequence {:?}: stub {stub:?} must be 1 to 8 letters or digits, and only beside `table`",
                    q.name
                )));
            }
        }
        let seg = &raw.segment;
        if seg.chunk == 0
            || seg.min_step == 0
            || !seg.min_step.is_multiple_of(seg.chunk)
            || !seg.max_step.is_multiple_of(seg.chunk)
            || seg.min_step > seg.max_step
            || seg.max_step > 1 << 40
        {
            return Err(ConfigError::Bad(format!(
                "[segment]: need 0 < min_step <= max_step <= 2^40, both multiples of chunk ({}); got min_step {}, max_step {}",
                seg.chunk, seg.min_step, seg.max_step
            )));
        }
        if !(seg.prefetch_at > 0.0 && seg.prefetch_at < 1.0) {
            return Err(ConfigError::Bad(format!(
                "[segment]: prefetch_at must be in (0, 1), not {}",
                seg.prefetch_at
            )));
        }
        let f = &raw.failover;
        if f.attempt_timeout_ms == 0
            || f.timeout_ms == 0
            || f.probe_interval_ms == 0
            || f.high_water_interval_ms == 0
            || f.marks_timeout_ms == 0
            || f.admin_timeout_ms == 0
        {
            return Err(ConfigError::Bad(
                "[failover]: timeouts and intervals must be above 0 ms".into(),
            ));
        }
        if f.marks_timeout_ms >= f.attempt_timeout_ms {
            return Err(ConfigError::Bad(format!(
                "[failover]: marks_timeout_ms ({}) must be below attempt_timeout_ms ({}): a stalled place holding marks must leave the attempt time to answer",
                f.marks_timeout_ms, f.attempt_timeout_ms
            )));
        }
        if f.mark_ahead == 0 || f.mark_ahead > 1 << 32 {
            return Err(ConfigError::Bad(format!(
                "[failover]: mark_ahead must be in 1..=2^32, not {}",
                f.mark_ahead
            )));
        }
        let m = &raw.marks;
        if let Some(bad) = m.etcd.iter().find(|e| !e.starts_with("http://")) {
            return Err(ConfigError::Bad(format!(
                "[marks]: etcd endpoint {bad:?} is not http://host:port (for TLS or a user, give the service's --etcd; the file names plain endpoints)"
            )));
        }
        if !m.etcd_prefix.starts_with('/') || m.etcd_prefix.ends_with('/') {
            return Err(ConfigError::Bad(format!(
                "[marks]: etcd_prefix {:?} must start with / and not end with one",
                m.etcd_prefix
            )));
        }
        Ok(Config {
            increment,
            postgres_tickets: raw.postgres_tickets,
            failover: raw.failover,
            segment: raw.segment,
            marks: raw.marks,
            servers: raw.servers,
            sequences: raw.sequences,
        })
    }

    /// The sequence named `name`, with its index.
    pub fn sequence(&self, name: &str) -> Option<(usize, &SequenceConfig)> {
        self.sequences
            .iter()
            .enumerate()
            .find(|(_, q)| q.name == name)
    }
}

/// The smallest value `>= from` that is `≡ offset (mod increment)`.
pub(crate) fn first_of_residue(from: u64, offset: u64, increment: u64) -> u64 {
    let r = offset % increment;
    let m = from % increment;
    from + (r + increment - m) % increment
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAIR: &str = r#"
        [[servers]]
        name = "a"
        kind = "mariadb"
        url = "mysql://root@127.0.0.1:1/app"
        offset = 1
        [[servers]]
        name = "b"
        kind = "postgres"
        url = "postgres://postgres@127.0.0.1:2/postgres"
        offset = 2
        [[sequences]]
        name = "photos"
        [[sequences]]
        name = "small"
        bits = 32
        mode = "segment"
    "#;

    #[test]
    fn a_pair_parses_with_defaults() {
        let c = Config::parse(PAIR).unwrap();
        assert_eq!(c.increment, 2);
        assert_eq!(c.servers[1].kind, Kind::Postgres);
        assert_eq!(c.sequences[0].bits, 64);
        assert_eq!(c.sequences[0].mode, Mode::PerId);
        assert_eq!(c.sequences[1].mode, Mode::Segment);
        assert_eq!(c.sequences[1].max_id(), 4_294_967_295);
        assert_eq!(c.postgres_tickets, PgTickets::Table);
        assert_eq!(c.sequence("small").unwrap().0, 1);
    }

    #[test]
    fn malformed_toml_names_the_line() {
        let e = Config::parse("[[servers]\nname = 1").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Toml(m) if m.contains("line 1")),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        let e = Config::parse(&PAIR.replace("offset = 2", "offset = 2\nofset = 3")).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Toml(m) if m.contains("ofset")),
            "{e}"
        );
        let e = Config::parse(&format!("colour = 1\n{PAIR}")).unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn duplicate_offsets_are_refused() {
        let e = Config::parse(&PAIR.replace("offset = 2", "offset = 1")).unwrap_err();
        assert_eq!(
            e,
            ConfigError::DuplicateOffset {
                offset: 1,
                first: "a".into(),
                second: "b".into()
            }
        );
        assert!(e.to_string().contains("share offset 1"));
    }

    #[test]
    fn an_adopted_table_is_per_id_on_mariadb_only() {
        let maria = PAIR
            .replace("kind = \"postgres\"", "kind = \"mariadb\"")
            .replace(
                "postgres://postgres@127.0.0.1:2/postgres",
                "mysql://root@127.0.0.1:2/app",
            );
        let adopted = maria.replace(
            "name = \"photos\"",
            "name = \"photos\"\ntable = \"Tickets64\"\nstub = \"b\"",
        );
        let c = Config::parse(&adopted).unwrap();
        assert_eq!(c.sequences[0].table(), "Tickets64");
        assert_eq!(c.sequences[0].stub(), "b");
        assert!(c.sequences[0].adopted() && !c.sequences[1].adopted());
        assert_eq!(c.sequences[1].table(), "tickets_small");
        for (from, to, says) in [
            ("Tickets64", "Tickets-64", "is not [A-Za-z_]"),
            ("stub = \"b\"", "stub = \"b c\"", "1 to 8 letters or digits"),
            (
                "\"small\"\n",
                "\"small\"\ntable = \"Tickets64\"\n",
                "both use table Tickets64",
            ),
            (
                "\"small\"\n",
                "\"small\"\ntable = \"Other\"\n",
                "per-id on MariaDB",
            ),
        ] {
            let e = Config::parse(&adopted.replace(from, to)).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        let e =
            Config::parse(&PAIR.replace("name = \"photos\"", "name = \"photos\"\ntable = \"T\""))
                .unwrap_err();
        assert!(
            e.to_string().contains("per-id on MariaDB servers only"),
            "{e}"
        );
        let e =
            Config::parse(&maria.replace("name = \"photos\"", "name = \"photos\"\nstub = \"b\""))
                .unwrap_err();
        assert!(e.to_string().contains("only beside `table`"), "{e}");
    }

    #[test]
    fn other_mistakes_are_typed() {
        let e = Config::parse(&PAIR.replace("bits = 32", "bits = 16")).unwrap_err();
        assert!(matches!(e, ConfigError::BadBits { bits: 16, .. }));
        let e = Config::parse(&format!("increment = 1\n{PAIR}")).unwrap_err();
        assert!(matches!(e, ConfigError::BadIncrement { .. }));
        let e = Config::parse(&PAIR.replace("offset = 2", "offset = 3")).unwrap_err();
        assert!(matches!(e, ConfigError::OffsetOutOfRange { offset: 3, .. }));
        let e = Config::parse(&PAIR.replace("\"photos\"", "\"Photos\"")).unwrap_err();
        assert!(matches!(e, ConfigError::BadName { .. }));
        let e = Config::parse(&PAIR.replace("mysql://", "http://")).unwrap_err();
        assert!(matches!(e, ConfigError::BadUrl { .. }));
        let e = Config::parse(&format!("[segment]\nmin_step = 1550\n{PAIR}")).unwrap_err();
        assert!(matches!(e, ConfigError::Bad(_)));
        let e =
            Config::parse(&PAIR.replace("bits = 32", "bits = 32\nstart = 4294967296")).unwrap_err();
        assert!(matches!(e, ConfigError::BadStart { .. }));
        assert_eq!(Config::parse("").unwrap_err(), ConfigError::NoServers);
        let e =
            Config::parse(&format!("[failover]\nhigh_water_interval_ms = 0\n{PAIR}")).unwrap_err();
        assert!(e.to_string().contains("above 0 ms"), "{e}");
        let e = Config::parse(&format!("[failover]\nmarks_timeout_ms = 500\n{PAIR}")).unwrap_err();
        assert!(e.to_string().contains("marks_timeout_ms"), "{e}");
        let e =
            Config::parse(&format!("[marks]\netcd = [\"https://e:2379\"]\n{PAIR}")).unwrap_err();
        assert!(e.to_string().contains("http://host:port"), "{e}");
        let e = Config::parse(&format!("[marks]\netcd_prefix = \"p/\"\n{PAIR}")).unwrap_err();
        assert!(e.to_string().contains("etcd_prefix"), "{e}");
    }

    #[test]
    fn marks_name_etcd_for_every_client() {
        let c = Config::parse(PAIR).unwrap();
        assert!(c.marks.etcd.is_empty());
        assert_eq!(c.marks.etcd_prefix, "/shardflake/default");
        let c = Config::parse(&format!(
            "[marks]\netcd = [\"http://e:2379\"]\netcd_prefix = \"/p\"\n{PAIR}"
        ))
        .unwrap();
        assert_eq!(c.marks.etcd, ["http://e:2379"]);
        assert_eq!(c.marks.etcd_prefix, "/p");
    }

    #[test]
    fn the_places_of_the_marks_ignore_only_the_order_of_endpoints() {
        let places = |marks: &str| {
            Config::parse(&format!("{marks}{PAIR}"))
                .unwrap()
                .marks
                .places()
        };
        assert_eq!(places(""), "peers");
        let one = places("[marks]\netcd = [\"http://b:2379\", \"http://a:2379/\"]\n");
        assert_eq!(
            one,
            "peers + etcd /shardflake/default at http://a:2379,http://b:2379"
        );
        assert_eq!(
            one,
            places("[marks]\netcd = [\"http://a:2379\", \"http://b:2379\"]\n")
        );
        assert_ne!(
            one,
            places(
                "[marks]\netcd = [\"http://a:2379\", \"http://b:2379\"]\netcd_prefix = \"/p\"\n"
            )
        );
        assert_ne!(one, places("[marks]\netcd = [\"http://a:2379\"]\n"));
        let back = MarksConfig::etcd_of_places(&one).unwrap();
        assert_eq!(back.etcd, ["http://a:2379", "http://b:2379"]);
        assert_eq!(back.etcd_prefix, "/shardflake/default");
        assert_eq!(back.places(), one);
        assert_eq!(MarksConfig::etcd_of_places("peers"), None);
    }

    #[test]
    fn residues() {
        assert_eq!(first_of_residue(1, 1, 2), 1);
        assert_eq!(first_of_residue(1, 2, 2), 2);
        assert_eq!(first_of_residue(10, 1, 2), 11);
        assert_eq!(first_of_residue(10, 3, 3), 12);
        assert_eq!(first_of_residue(7, 1, 1), 7);
    }
}
