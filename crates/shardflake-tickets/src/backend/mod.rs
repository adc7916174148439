//! The backend layer: [`Backend`], the operations one session of a ticket
//! server offers, each one round trip; one file per database implementing
//! it ([`mariadb`], [`postgres`]); and what both share: the tables every
//! server holds, the lattice record `init` writes and every session
//! checks, what `check` reads. The session ([`crate::session`]) is the
//! enum over the two, implementing [`Backend`] by delegating; nothing
//! here knows about failover, marks stores or clients.

use crate::config::{Config, Kind, Mode, PgTickets, SequenceConfig, ServerConfig};
use crate::error::TicketError;
use crate::segment::Lattice;

pub(crate) mod mariadb;
pub(crate) mod postgres;

/// One session of a ticket server, whatever its kind: what the client,
/// the high-water store and the admin commands ask of it. Each call is
/// one round trip unless it says otherwise.
pub(crate) trait Backend {
    /// Readies the session for handing out ids (PostgreSQL: verifies each
    /// per-id sequence's increment and residue, prepares the statements).
    async fn prepare(&mut self, server: &ServerConfig, config: &Config) -> Result<(), TicketError>;

    /// One per-id ticket of the sequence at `index`, with the identity of
    /// its table or sequence.
    async fn next_ticket(
        &mut self,
        index: usize,
        seq: &SequenceConfig,
    ) -> Result<Stamped<u64>, TicketError>;

    /// The identity of the table or sequence `seq` counts with (see
    /// [`Stamped`]).
    async fn identity(&mut self, seq: &SequenceConfig) -> Result<Option<i64>, TicketError>;

    /// Reserves a block (`max_id = GREATEST(max_id, floor) + step`): the
    /// row after it, or `Err(row)` when the row is below `seen` (the server
    /// went back); with the segment table's identity. A segment table
    /// without its guard is refused ([`unguarded`]), seen in the same round
    /// trip.
    async fn reserve(
        &mut self,
        seq: &SequenceConfig,
        floor: i64,
        step: i64,
        seen: i64,
    ) -> Result<Stamped<Result<i64, i64>>, TicketError>;

    /// The largest id the counter says may have been handed out: every
    /// later id is above it. `None`: not initialised.
    async fn counter(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
    ) -> Result<Option<u64>, TicketError>;

    /// Raises (never lowers) the counter so that every later id is above
    /// `past`.
    async fn raise(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError>;

    /// Raises the counter past `past`, as [`Backend::raise`], and vouches
    /// for it: called only by a client that read the marks of every
    /// client (MariaDB's per-id guard gives its proof only for a row
    /// vouched for, `mariadb::guard_triggers`). Nothing to do elsewhere.
    async fn vouch(
        &mut self,
        _config: &Config,
        _server: &ServerConfig,
        _seq: &SequenceConfig,
        _past: u64,
    ) -> Result<(), TicketError> {
        Ok(())
    }

    /// Moves `seq` to the file's lattice, every later id above `past`.
    async fn reshape(
        &mut self,
        config: &Config,
        server: &ServerConfig,
        seq: &SequenceConfig,
        past: u64,
    ) -> Result<(), TicketError>;

    /// Raises (never lowers) high-water marks: `(class key, sequence, id)`.
    /// With `fence` (a client's write): only while this place records
    /// `fence.identity` as the class's holder, or no holder at all, read
    /// under a lock that a takeover ([`Backend::claim`]) waits for, and
    /// the lattice the fence names ([`lattice_fence`]). `Ok(false)`: not
    /// written, the class is another identity's here.
    async fn write_high_water(
        &mut self,
        marks: &[(String, String, u64)],
        fence: Option<MarkFence<'_>>,
    ) -> Result<bool, TicketError>;

    /// Who holds class `class` here (`None`: nobody recorded yet).
    async fn read_holder(&mut self, class: &str) -> Result<Option<Holder>, TicketError>;

    /// Makes `identity` (the server named `server` in the file) the holder
    /// of `class` here, by compare-and-set on `from` (what
    /// [`Backend::read_holder`] read): generation + 1, `from`'s identity
    /// added to the superseded. Waits for mark writes under way. Whether
    /// it took (`false`: another took the class meanwhile).
    async fn claim(
        &mut self,
        class: &str,
        identity: &str,
        server: &str,
        from: Option<&Holder>,
    ) -> Result<bool, TicketError>;

    /// The largest mark this server holds for `sequence`, of any class.
    async fn read_marks_of_sequence(&mut self, sequence: &str) -> Result<u64, TicketError>;

    /// Every server this server holds marks of (removed ones included).
    async fn high_water_servers(&mut self) -> Result<Vec<String>, TicketError>;

    /// The high-water marks this server holds under any of `holders` (a
    /// class key, a server's name): `(sequence, id)`, one row per holder.
    async fn read_high_water(
        &mut self,
        holders: &[&str],
    ) -> Result<Vec<(String, u64)>, TicketError>;

    /// The server's identity and start, as the database reports them.
    async fn identify(&mut self) -> Result<ServerIdentity, TicketError>;

    /// The tables of [`guarded_tables`] whose guard is missing or disabled.
    async fn unguarded(&mut self, config: &Config) -> Result<Vec<String>, TicketError>;

    /// Every lattice recorded on this server, by sequence (empty before
    /// `init`).
    async fn read_lattice(&mut self) -> Result<Vec<(String, LatticeRecord)>, TicketError>;

    /// The lattice's version on this server and whether a reshape is under
    /// way (or was interrupted); `None` before `init`.
    async fn lattice_version(&mut self) -> Result<Option<LatticeVersion>, TicketError>;

    /// Where the marks of this server's clients are kept, as `init`
    /// recorded it ([`MARKS_AT_TABLE`]; `None`: not recorded).
    async fn read_marks_at(&mut self) -> Result<Option<String>, TicketError>;

    /// Records where the marks are kept ([`crate::config::MarksConfig::places`]):
    /// only where none is recorded yet, or, with `replace` (`reshape`),
    /// over what is. Creates the table if needed.
    async fn write_marks_at(&mut self, places: &str, replace: bool) -> Result<(), TicketError>;

    /// Deletes the record of where the marks are kept where it is
    /// `places` (an `init` taking back what it wrote).
    async fn forget_marks_at(&mut self, places: &str) -> Result<(), TicketError>;

    /// Pins this session to lattice `version` (read before the lattice was
    /// checked): from then on the database refuses its every ticket and
    /// block once the server's version is another ([`VERSION_TABLE`]).
    /// Before [`Backend::prepare`].
    async fn pin_lattice(&mut self, version: i64) -> Result<(), TicketError>;

    /// Raises the lattice's version to `to` (at least one past its own)
    /// and marks a reshape under way, in one statement: every session
    /// pinned to the old version is refused at its next ticket or block,
    /// every new session at its start. `reshape` gives every server the
    /// same `to`, one past the highest any of them records, so the
    /// servers of one lattice record one version.
    async fn begin_reshape(&mut self, to: i64) -> Result<(), TicketError>;

    /// Ends a reshape: sessions may start again (those whose file's lattice
    /// is the one recorded).
    async fn end_reshape(&mut self) -> Result<(), TicketError>;

    /// Records (replaces) the lattice of `sequence`.
    async fn write_lattice(
        &mut self,
        sequence: &str,
        record: &LatticeRecord,
    ) -> Result<(), TicketError>;

    /// Creates what `config` needs, idempotently; returns what it did
    /// (several statements).
    async fn init(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<Vec<String>, TicketError>;

    /// What `check` reads (several statements).
    async fn settings(
        &mut self,
        config: &Config,
        server: &ServerConfig,
    ) -> Result<ServerSettings, TicketError>;
}

/// The segment rows: one per segment sequence.
pub const SEGMENT_TABLE: &str = "shardflake_ticket_segments";
/// The high-water marks of every server, kept on its peers.
pub const HW_TABLE: &str = "shardflake_ticket_hw";
/// Each sequence's lattice as `init` recorded it on this server.
pub const LATTICE_TABLE: &str = "shardflake_ticket_lattice";
/// Per residue class: the identity of the server that holds it, and those
/// it superseded.
pub const HOLDERS_TABLE: &str = "shardflake_ticket_holders";

/// `init`'s row in [`HOLDERS_TABLE`] (no class key is ''): a class is
/// taken over only in a table that holds it, so a client's takeover
/// between a dump's `CREATE TABLE` and its rows (a live whole-database
/// restore) is not held on that server, as when it is down, and the
/// dump's rows go in.
pub(crate) const HOLDERS_INIT_ROW: &str = "('', '', 0, '', '')";

/// A takeover on a server whose [`HOLDERS_TABLE`] lacks `init`'s row.
pub(crate) fn holders_empty(server: &str) -> TicketError {
    TicketError::db(
        server,
        "take the class over",
        format!(
            "{HOLDERS_TABLE} is empty (recreated by a restore under way, or never given its init row: run `shardflake tickets init`): no class is taken over in it"
        ),
    )
}

/// Who answers for a residue class, as one place records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its identity ([`ServerIdentity::id`]).
    pub identity: String,
    /// Raised by one at every takeover.
    pub generation: u64,
    /// The identities that held the class before, refused from then on.
    pub superseded: Vec<String>,
}

impl Holder {
    /// Whether `identity` held the class and was taken over since.
    pub fn supersedes(&self, identity: &str) -> bool {
        self.identity != identity && self.superseded.iter().any(|s| s == identity)
    }
}

/// A server as the database reports it, never from the file. `id` is
/// the same across a restart and differs for a copy of its data on
/// another host or port, or a promoted standby. MariaDB (10.11 has no
/// `@@server_uuid`): host name, port, data directory, `server_id`,
/// database. PostgreSQL: system identifier, timeline, database oid, data
/// directory, port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    /// When it started, in unix seconds (to the second).
    pub started: i64,
    /// Its identity: printable, no quote (see [`clean_identity`]).
    pub id: String,
}

/// `raw` with every character outside `[A-Za-z0-9_.:/@-]` replaced by
/// `_`: an identity goes into SQL text and error messages as is.
pub(crate) fn clean_identity(raw: &str) -> String {
    raw.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '.' | ':' | '/' | '@' | '-' => c,
            _ => '_',
        })
        .collect()
}

/// What a client's mark write must find on a place: `identity` holding
/// `class` there (or nobody), and the lattice at `lattice`, the version
/// the client's session of the class's server is pinned to (`None`: any).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MarkFence<'a> {
    /// The class key.
    pub class: &'a str,
    /// The identity the marks are written as.
    pub identity: &'a str,
    /// The lattice version they are written under.
    pub lattice: Option<i64>,
}

/// The SQL condition a client's mark write needs besides its holder: no
/// reshape under way on this place (`lock` makes the read wait for, and
/// hold off, `begin_reshape`), this place at the lattice version the
/// client's session of the class's server is pinned to (every reshape
/// raises it, whatever it changed: a chunk alone too), and, for a class
/// key (`@<offset>of<inc>`), the lattice this place records for the
/// marks' sequences has the class's increment. So a client on the file of
/// before a reshape, a server the new file removed included, and a server
/// given back its dump of before it, can write no mark on a place past the
/// reshape (nor a client of the current file on a place gone back before
/// it): no id goes out past the marks the reshape raised every server past.
pub(crate) fn lattice_fence(
    class: &str,
    version: Option<i64>,
    marks: &[(String, String, u64)],
    lock: &str,
) -> String {
    let at = version
        .map(|v| format!(" AND version = {v}"))
        .unwrap_or_default();
    let mut sql = format!("EXISTS (SELECT 1 FROM {VERSION_TABLE} WHERE NOT reshaping{at} {lock})");
    if let Some(increment) = class_increment(class) {
        let sequences = marks
            .iter()
            .map(|(_, q, _)| format!("'{q}'"))
            .collect::<Vec<_>>()
            .join(", ");
        sql.push_str(&format!(
            " AND NOT EXISTS (SELECT 1 FROM {LATTICE_TABLE} WHERE increment <> {increment} AND sequence_name IN ({sequences}))"
        ));
    }
    sql
}

/// The SQL that says whether [`lattice_fence`] refuses (1) or not (0), or
/// finds no lattice version ([`NO_VERSION`]).
pub(crate) fn lattice_fence_refuses(
    class: &str,
    version: Option<i64>,
    marks: &[(String, String, u64)],
) -> String {
    format!(
        "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM {VERSION_TABLE}) THEN {NO_VERSION} WHEN {} THEN 0 ELSE 1 END",
        lattice_fence(class, version, marks, "")
    )
}

/// [`lattice_fence_refuses`]: the place records no lattice version, as
/// while a dump recreates its table. No reshape refuses the mark: the
/// place just does not take it (as when it is down), so the write stands
/// or falls by the other places, and the class's server is not refused.
pub(crate) const NO_VERSION: i32 = 2;

/// A mark not taken by `server`, which records no lattice version.
pub(crate) fn no_version(server: &str) -> TicketError {
    TicketError::db(
        server,
        "write high-water marks",
        "it takes no mark while it records no lattice version: a restore in progress (a dump recreates each table empty before its rows), or initialised by an older shardflake; if it stays, run `shardflake tickets init`",
    )
}

/// The increment of a class key `@<offset>of<increment>`; `None` for a
/// server's name (marks of before residue classes).
fn class_increment(class: &str) -> Option<u64> {
    let (_, increment) = class.strip_prefix('@')?.split_once("of")?;
    increment.parse().ok()
}

/// A mark write refused by [`lattice_fence`] on `server`.
pub(crate) fn lattice_fenced(server: &str, class: &str, version: Option<i64>) -> TicketError {
    let at = version
        .map(|v| format!(" written under lattice version {v}"))
        .unwrap_or_default();
    TicketError::LatticeChanged {
        server: server.to_string(),
        sequence: String::new(),
        change: format!(
            "it takes no mark of residue class {class}{at}: the lattice it records is another (another version, or no such class), or a reshape is under way there. Either this client runs on a file of before a `shardflake tickets reshape` and would hand out ids twice (restart it with the file reshape was given), or this server went back to before the reshape this client's file comes from (its own dump of before it loaded: run `shardflake tickets reshape --config FILE` again with the current file, not a reshape back)"
        ),
    }
}

/// The SQL condition a fenced mark write of `class` by `identity` needs:
/// no holder recorded, or `identity` (`lock`: the clause that makes the
/// read wait for, and hold off, a takeover).
pub(crate) fn holder_fence(class: &str, identity: &str, lock: &str) -> String {
    format!(
        "(NOT EXISTS (SELECT 1 FROM {HOLDERS_TABLE} WHERE class_key = '{class}' {lock}) OR EXISTS (SELECT 1 FROM {HOLDERS_TABLE} WHERE class_key = '{class}' AND identity = '{identity}' {lock}))"
    )
}

/// A holder row read back: `superseded` is space-separated.
pub(crate) fn holder_of(identity: String, generation: u64, superseded: &str) -> Holder {
    Holder {
        identity,
        generation,
        superseded: superseded.split_whitespace().map(str::to_string).collect(),
    }
}

/// The lattice's version on this server (one row): `reshape` raises it, and
/// the database compares it with the version each client session was
/// pinned to when it opened, in every ticket's and every block's own
/// statement (MariaDB per id: the guard's `…_ctr_u` trigger against the
/// session's `@shardflake_lattice`; segment rows and PostgreSQL: a
/// condition of the statement). So a client still running on the file of
/// before a reshape is refused at its next call on a pooled session, not
/// only at its next session.
pub const VERSION_TABLE: &str = "shardflake_ticket_lattice_version";

/// Where the marks of a server's clients are kept (one row, `places`:
/// [`crate::config::MarksConfig::places`]), recorded by `init` and moved
/// only by `reshape`. Every session compares it with its file's
/// (`check_marks_at`): two files whose `[marks]` differ keep their marks
/// apart (another etcd prefix or cluster), so a client of one would never
/// see the marks of the other's clients and would hand out their ids again.
pub const MARKS_AT_TABLE: &str = "shardflake_ticket_marks_at";

/// Compares where the server records its marks are kept (`recorded`) with
/// the file's `[marks]`: a session, `init` and `check` refuse another
/// place, and a server with none recorded (no `init` completed there: two
/// at once with different places took theirs back, or an older
/// shardflake's). `version`: the server's lattice version, where read.
/// The way out named is the recorded place's file, never a reshape to
/// this file's place: two operators each following that would move the
/// marks back and forth, each move refusing the other's clients.
pub(crate) fn check_marks_at(
    config: &Config,
    server: &str,
    recorded: Option<&str>,
    version: Option<i64>,
) -> Result<(), TicketError> {
    let file = config.marks.places();
    let version = version
        .map(|v| format!(" (lattice version {v})"))
        .unwrap_or_default();
    match recorded {
        Some(at) if at == file => Ok(()),
        Some(at) => Err(TicketError::misconfigured(
            server,
            format!(
                "this server's clients keep their marks in {at}, the current place{version} (recorded by the last `shardflake tickets init` or `reshape`), but this file's [marks] names {file}: a client of this file would not see their marks and would hand out their ids again; use the file naming {at} (if the marks were moved away from there by `shardflake tickets reshape`, its clients are refused and name where they moved). Do not reshape to this file's place to get past this refusal: that moves the marks from under the clients of the file naming {at}, which are then refused in turn; move them with `shardflake tickets reshape --config NEW_FILE` only as a planned change, once every client's file names the new place"
            ),
        )),
        None => Err(TicketError::missing_record(
            server,
            "the record of where its clients keep their marks (no `shardflake tickets init` has completed on it: two inits run at once with files naming different places each take back what they recorded; a server set up by a shardflake from before the record has none either; then run `shardflake tickets init --config FILE` once, with the file every client uses)",
        )),
    }
}

/// The lattice version `init` records (both backends write 1); every
/// `reshape` raises it.
pub(crate) const INITIAL_VERSION: i64 = 1;

/// What [`VERSION_TABLE`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatticeVersion {
    /// Raised by every `reshape`.
    pub version: i64,
    /// A reshape began and has not ended: no session starts.
    pub reshaping: bool,
}

/// What the database says when a session's lattice version is not the
/// server's (matched by the client to [`lattice_moved`]).
pub(crate) const LATTICE_MOVED: &str =
    "shardflake: the lattice was changed by tickets reshape since this session opened";

/// A session pinned to a lattice version the server no longer has: its
/// client runs on the file of before a `reshape`.
pub(crate) fn lattice_moved(server: &str, sequence: &str) -> TicketError {
    TicketError::LatticeChanged {
        server: server.to_string(),
        sequence: sequence.to_string(),
        change: "the servers' lattice was changed by `shardflake tickets reshape` after this client's session opened, so this client runs on the file of before it and would hand out ids twice; restart it with the file reshape was given".to_string(),
    }
}

/// A server whose reshape began and has not ended refuses new sessions.
pub(crate) fn reshaping(server: &str) -> TicketError {
    TicketError::LatticeChanged {
        server: server.to_string(),
        sequence: String::new(),
        change: "a `shardflake tickets reshape` is under way on this server, or was interrupted; no session starts until it ends: wait for it, or run `shardflake tickets reshape --config NEW_FILE` again".to_string(),
    }
}

/// The trigger (MariaDB: one per event, named after it and its table) that
/// refuses to set a counter back in place: the segment table's rows, and
/// the per-id ticket tables (MariaDB: the counter row is never set lower
/// or deleted, and no row is inserted; every ticket's answer carries the
/// proof that the update's trigger ran). A restore that keeps the table (an
/// `UPDATE`, a `DELETE` and rows again, a data-only dump loaded as
/// `REPLACE`) keeps its identity, so a client whose last answer was below the
/// restored value could not see it and would hand out ids again; a table
/// dropped and created again is seen (every answer carries its identity).
pub const GUARD: &str = "shardflake_ticket_guard";

/// What the guard says, for `table` and the way `flag` is set.
pub(crate) fn guard_refusal(table: &str, flag: &str) -> String {
    format!(
        "shardflake: {table} is never set back in place (running ticket clients cannot see it and would hand out ids again): restore the table whole (dropped and created, as mariadb-dump and pg_dump --clean do), which clients see; to set it back anyway, stop every client, {flag} in that session, then run shardflake tickets repair"
    )
}

/// What `check` and a refused session say of a table without its guard.
/// A dump being loaded makes a table's triggers after its rows, so for a
/// moment this is most often a restore under way, which clears by itself:
/// said first, `init` only if it stays.
pub(crate) const GUARD_MISSING: &str = "no guard against setting it back in place: a restore in progress (a dump makes a table's triggers after its rows), or a restore made without triggers (such as mariadb-dump --skip-triggers), a trigger dropped or disabled, or made by an older shardflake; if it stays, run `shardflake tickets init`";

/// A session refuses a table without its guard: a restore that then sets
/// it back in place would not be seen by a client whose last answer was
/// below the restored value.
pub(crate) fn unguarded(server: &str, table: &str) -> TicketError {
    TicketError::misconfigured(
        server,
        format!("{table}: {GUARD_MISSING}; the server is not used until then"),
    )
}

/// The tables of `config` its guard watches on a server of `kind`: the
/// segment table (when a sequence is in segment mode) and each per-id
/// table (not a PostgreSQL sequence: no trigger fires on one).
pub(crate) fn guarded_tables(config: &Config, kind: Kind) -> Vec<String> {
    let mut tables = Vec::new();
    if config.sequences.iter().any(|q| q.mode == Mode::Segment) {
        tables.push(SEGMENT_TABLE.to_string());
    }
    if kind == Kind::Mariadb || config.postgres_tickets == PgTickets::Table {
        tables.extend(
            config
                .sequences
                .iter()
                .filter(|q| q.mode == Mode::PerId)
                .map(|q| q.table()),
        );
    }
    tables
}

/// `UPDATE` of a segment row so that every later block is above `past`:
/// to the lattice point [`Lattice::row_above`] `past`, or, where the row
/// is above that, the row rounded up to the lattice (a row off it, such as
/// one left by a reshape to more servers, is never kept). Only raises, on
/// both databases (`MOD` of a negative number is negative on both).
pub(crate) fn raise_segment_sql(lattice: Lattice, seq: &SequenceConfig, past: u64) -> String {
    let (to, residue, stride) = (lattice.row_above(past), lattice.residue(), lattice.stride());
    format!(
        "UPDATE {SEGMENT_TABLE} SET max_id = GREATEST({to}, max_id + MOD(MOD({residue} - max_id, {stride}) + {stride}, {stride})) WHERE sequence_name = '{}'",
        seq.name
    )
}

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
/// sequence whose record is missing or differs is an error. `version`: the
/// server's lattice version, read before the records (above the one `init`
/// records, a `reshape` recorded them: the error says so, rather than
/// that the file was edited).
pub(crate) fn check_lattice(
    config: &Config,
    server: &ServerConfig,
    recorded: &[(String, LatticeRecord)],
    version: Option<&LatticeVersion>,
) -> Result<(), TicketError> {
    if let Some(seq) = config
        .sequences
        .iter()
        .find(|seq| !recorded.iter().any(|(name, _)| *name == seq.name))
    {
        return Err(TicketError::missing_record(
            &server.name,
            &format!("the lattice record of sequence {:?}", seq.name),
        ));
    }
    check_recorded_lattice(config, server, recorded, version)
}

/// [`check_lattice`] of the sequences recorded only (what `init` checks
/// before it records the others): one recorded by a `reshape` is refused
/// as a file of before it, never with the advice to reshape, which would
/// undo that reshape.
pub(crate) fn check_recorded_lattice(
    config: &Config,
    server: &ServerConfig,
    recorded: &[(String, LatticeRecord)],
    version: Option<&LatticeVersion>,
) -> Result<(), TicketError> {
    let reshaped = version.is_some_and(|v| v.version > INITIAL_VERSION);
    for seq in &config.sequences {
        let file = LatticeRecord::of(config, server, seq);
        match recorded.iter().find(|(name, _)| *name == seq.name) {
            Some((_, r)) if *r != file && reshaped => {
                return Err(TicketError::lattice_reshaped(
                    &server.name,
                    &seq.name,
                    r,
                    &file,
                    version.map_or(INITIAL_VERSION, |v| v.version),
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
            _ => {}
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

/// `('class', 'sequence', id), ...`: the rows of a high-water upsert.
/// Class keys (`@1of2`) and sequence names (plain identifiers: the config
/// checks them) need no escaping.
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
    /// Durability settings that can make a crash hand out ids again, and
    /// settings only clients outside shardflake use (`check`'s warnings).
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
    TicketError::missing_record(server, &format!("the counter of sequence {:?}", seq.name))
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

/// `'a', 'b'`: holders of marks (class keys, server names: no quote in
/// either) for an `IN (...)`.
pub(crate) fn holders_list(holders: &[&str]) -> String {
    holders
        .iter()
        .map(|h| format!("'{h}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_keeps_only_characters_safe_in_sql() {
        assert_eq!(
            clean_identity("mariadb:vm:3306:/var/lib/my sql/:1:app'; --"),
            "mariadb:vm:3306:/var/lib/my_sql/:1:app___--"
        );
    }

    /// Two operators, each on a file naming another place for the marks,
    /// each following the refusal: it names the place recorded as the
    /// current one and its file, and no longer tells them to reshape to
    /// their own file (each would move the marks back from under the
    /// other's clients). Before: "… or, to keep the marks where this file
    /// says, run `shardflake tickets reshape --config FILE` with this file".
    #[test]
    fn a_file_naming_another_marks_place_is_sent_to_the_current_one() {
        let config = Config::parse(
            r#"
            [[servers]]
            name = "a"
            kind = "mariadb"
            url = "mysql://root@127.0.0.1:1/app"
            offset = 1
            [[sequences]]
            name = "photos"
            [marks]
            etcd = ["http://127.0.0.1:2379"]
            etcd_prefix = "/b"
            "#,
        )
        .unwrap();
        let at = "peers + etcd /a at http://127.0.0.1:2379";
        let e = check_marks_at(&config, "a", Some(at), Some(3))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "keep their marks in {at}, the current place (lattice version 3)"
            )) && e.contains(&format!("use the file naming {at}"))
                && e.contains("Do not reshape to this file's place to get past this refusal")
                && !e.contains("with this file"),
            "{e}"
        );
        let e = check_marks_at(&config, "a", None, Some(1))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no `shardflake tickets init` has completed on it")
                && !e.contains("initialised by an older shardflake"),
            "{e}"
        );
    }

    #[test]
    fn only_an_identity_taken_over_is_superseded() {
        let holder = holder_of("c".into(), 3, "a b");
        assert!(holder.supersedes("a") && holder.supersedes("b"));
        // The holder itself (re-admitted after it was taken over) and an
        // identity never seen are not.
        assert!(!holder_of("a".into(), 4, "a b").supersedes("a"));
        assert!(!holder.supersedes("c") && !holder.supersedes("d"));
    }
}
