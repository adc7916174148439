//! Typed errors. Every public function reports bad input through one of
//! these; none panics on user input.

use thiserror::Error;

/// A layout that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    /// Names are 1 to 32 characters of `a-z`, `0-9`, `_` and `-`.
    #[error("invalid name {0:?}: use 1 to 32 characters of a-z, 0-9, '_' and '-'")]
    InvalidName(String),
    /// The fields' widths add up to more than 64.
    #[error("layout fields use {bits} bits; at most 64 fit in an id")]
    TooWide {
        /// Sum of the widths.
        bits: u64,
    },
    /// A field of width zero.
    #[error("field {0:?} has zero width")]
    ZeroWidth(String),
    /// Two fields with one name, or two time or sequence fields.
    #[error("field {0:?} appears twice")]
    DuplicateField(String),
    /// A node field named `time` or `sequence`.
    #[error("{0:?} is reserved for the time and sequence fields")]
    ReservedName(String),
    /// No time or no sequence field.
    #[error("layout has no {0} field")]
    Missing(&'static str),
    /// The sequence is more significant than the time, so ids would not sort by time.
    #[error(
        "the sequence field must come after (below) the time field, or ids do not sort by time"
    )]
    SequenceAboveTime,
    /// A tick of zero milliseconds.
    #[error("tick length must be at least 1 ms")]
    ZeroTick,
    /// A random start wider than the sequence field.
    #[error(
        "random start of {bits} bits is wider than the {sequence_bits}-bit sequence; use at most {sequence_bits}"
    )]
    RandomStartTooWide {
        /// The width asked for.
        bits: u32,
        /// The sequence field's width.
        sequence_bits: u32,
    },
    /// The epoch is later than now.
    #[error("epoch {epoch_ms} ms is in the future")]
    EpochInFuture {
        /// The epoch given.
        epoch_ms: u64,
    },
    /// The layout's last tick ends after the year 584 million (past `u64`
    /// milliseconds), so its times cannot be computed.
    #[error(
        "layout lasts past u64 milliseconds ({time_bits} time bits of {tick_ms} ms ticks); use fewer time bits or a shorter tick"
    )]
    TooLong {
        /// Width of the time field.
        time_bits: u32,
        /// Tick length.
        tick_ms: u64,
    },
    /// No preset of that name.
    #[error(
        "unknown layout {0:?}; presets: snowflake, twitter, discord, instagram, sonyflake, mysql-procedure, js-safe"
    )]
    UnknownPreset(String),
    /// A layout spec that does not read as `time 41 | node 10 | sequence 12`.
    #[error(
        "cannot read layout spec {spec:?}: {reason}; write a preset name or fields like \"time 41 | node 10 | sequence 12\", optionally followed by \"(epoch 1288834974657 ms, tick 1 ms)\""
    )]
    Spec {
        /// The spec given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// An id, or parts of one, that does not fit a layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdError {
    /// A field value wider than its field.
    #[error("{field} {value} is out of range for layout {layout} (0..={max})")]
    OutOfRange {
        /// Layout name.
        layout: String,
        /// Field name.
        field: String,
        /// The value given.
        value: u64,
        /// Largest value the field holds.
        max: u64,
    },
    /// A node field the layout does not have.
    #[error("layout {layout} has no field {field:?} (fields: {known})")]
    UnknownField {
        /// Layout name.
        layout: String,
        /// Field name given.
        field: String,
        /// The layout's node fields, comma separated.
        known: String,
    },
    /// A node field with no value.
    #[error("layout {layout} needs a value for {field:?}")]
    MissingField {
        /// Layout name.
        layout: String,
        /// Field name.
        field: String,
    },
    /// An id with bits set above the layout's fields.
    #[error("id {id} does not fit layout {layout}: it is above the layout's largest id {max}")]
    TooLarge {
        /// The id.
        id: u64,
        /// Layout name.
        layout: String,
        /// The layout's largest id.
        max: u64,
    },
    /// A time outside the layout's range.
    #[error(
        "time {unix_ms} ms is outside layout {layout}'s range (epoch {epoch_ms} ms, end {end_ms} ms)"
    )]
    TimeOutOfRange {
        /// Layout name.
        layout: String,
        /// The time given.
        unix_ms: u64,
        /// The layout's epoch.
        epoch_ms: u64,
        /// The layout's end of life.
        end_ms: u128,
    },
    /// A shard count of zero.
    #[error("the number of logical shards must be at least 1")]
    NoShards,
    /// More logical shards than a layout's shard field can number.
    #[error(
        "{shards} logical shards do not fit layout {layout}'s {bits}-bit {field} field (at most {max})"
    )]
    TooManyShards {
        /// Layout name.
        layout: String,
        /// Shard field name.
        field: String,
        /// Its width.
        bits: u32,
        /// Shards asked for.
        shards: u64,
        /// Most shards the field numbers.
        max: u64,
    },
}

/// A time, or span of time, that has no ids in a layout
/// ([`crate::Layout::id_range`], [`crate::Layout::min_id_at`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimeRangeError {
    /// A time before the layout's epoch.
    #[error(
        "time {unix_ms} ms is before layout {layout}'s epoch {epoch_ms} ms; give a time at or after the epoch"
    )]
    BeforeEpoch {
        /// Layout name.
        layout: String,
        /// The time given.
        unix_ms: u64,
        /// The layout's epoch.
        epoch_ms: u64,
    },
    /// A time at or after the layout's end of life.
    #[error(
        "time {unix_ms} ms is at or after layout {layout}'s end of life {end_ms} ms; give an earlier time"
    )]
    AfterEndOfLife {
        /// Layout name.
        layout: String,
        /// The time given.
        unix_ms: u64,
        /// The layout's end of life (the first time it cannot hold).
        end_ms: u128,
    },
    /// A span whose start is not before its end.
    #[error("the span {from_ms}..{to_ms} ms is empty: from must be before to")]
    NotBefore {
        /// Start of the span.
        from_ms: u64,
        /// End of the span (exclusive).
        to_ms: u64,
    },
    /// A node or shard field above the time field: ids do not sort by time
    /// across it, so a span of time is not one range of ids.
    #[error(
        "layout {layout} has field {field:?} above its time field, so a span of time is not one range of ids; use a layout with time as its top field"
    )]
    FieldAboveTime {
        /// Layout name.
        layout: String,
        /// The top field.
        field: String,
    },
}

/// A row's time the backfill cannot give an id ([`crate::backfill::Backfill`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BackfillError {
    /// A time in the present tick or later: live ids are made there.
    #[error(
        "time {unix_ms} ms is not in the past (now {now_ms} ms): a backfill takes times before the present tick; live ids are made from it on"
    )]
    NotInPast {
        /// The row's time.
        unix_ms: u64,
        /// The present the backfill was made with.
        now_ms: u64,
    },
    /// Every sequence value of the row's tick is used.
    #[error(
        "tick {tick} (time {unix_ms} ms) has no sequence value left: all {ids_per_tick} ids of the tick are used; spread these rows over more time or use a layout with a wider sequence"
    )]
    TickFull {
        /// The row's time.
        unix_ms: u64,
        /// Its tick.
        tick: u64,
        /// Ids one tick holds.
        ids_per_tick: u64,
    },
    /// A time before the epoch or after the end of life.
    #[error(transparent)]
    Time(#[from] TimeRangeError),
    /// A counter taken back from an earlier run that the layout cannot
    /// hold (a state of another layout).
    #[error(
        "counter of tick {tick} at {next} does not fit the layout (ticks 0..={max_tick}, {ids_per_tick} ids per tick); is the state of another layout?"
    )]
    BadCounter {
        /// The tick.
        tick: u64,
        /// Its next sequence value.
        next: u64,
        /// The layout's last tick.
        max_tick: u64,
        /// Ids one tick holds.
        ids_per_tick: u64,
    },
}

/// Text that is not an id in the format asked for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// Empty input.
    #[error("empty id")]
    Empty,
    /// A character outside the format's alphabet.
    #[error("invalid {format} id {input:?}: unexpected character {ch:?}")]
    InvalidChar {
        /// Format name.
        format: &'static str,
        /// The input.
        input: String,
        /// The first bad character.
        ch: char,
    },
    /// A value above 2^64 - 1 (or below -2^63).
    #[error("{format} id {input:?} does not fit in 64 bits")]
    Overflow {
        /// Format name.
        format: &'static str,
        /// The input.
        input: String,
    },
    /// Unknown format name.
    #[error("unknown format {0:?}; use dec, hex, base32 or base62")]
    UnknownFormat(String),
    /// Text that is no kind of id known.
    #[error("{0:?} is not a 64-bit id, UUID or ObjectId")]
    Unrecognised(String),
    /// Unknown kind name.
    #[error(
        "unknown kind {0:?}; kinds: layout, uuidv1, uuidv3, uuidv4, uuidv5, uuidv6, uuidv7, uuid-nil, objectid"
    )]
    UnknownKind(String),
    /// Unknown UUID name-space.
    #[error("unknown UUID name-space {0:?}; use dns, url, oid, x500 or a UUID")]
    UnknownNamespace(String),
    /// Text of the wrong length for a fixed-width form (an ObjectId is 24
    /// hex digits).
    #[error("invalid {kind} {input:?}: expected {expected} characters, found {found}")]
    WrongLength {
        /// Kind or format name.
        kind: &'static str,
        /// The input.
        input: String,
        /// Characters the form has.
        expected: usize,
        /// Characters given.
        found: usize,
    },
}

/// A number or byte string that is not an id, or an id that does not fit the
/// type asked for. Made by the `TryFrom` conversions of [`crate::Id`] and
/// [`crate::ObjectId`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConvertError {
    /// A negative `i64` given where an id is read as a number. A signed
    /// `BIGINT` column stores ids at or above 2^63 as negative numbers: read
    /// those with [`crate::Id::from_i64_wrapping`].
    #[error(
        "{0} is negative; ids are unsigned (for a signed BIGINT column use Id::from_i64_wrapping)"
    )]
    Negative(i64),
    /// An id at or above 2^63 asked for as an `i64`. Store it bit for bit,
    /// negative, with [`crate::Id::to_i64_wrapping`].
    #[error(
        "id {0} is above i64::MAX (it uses the sign bit; for a signed BIGINT column use Id::to_i64_wrapping)"
    )]
    AboveI64Max(u64),
    /// A byte string of the wrong length.
    #[error("{kind} needs {expected} bytes, got {found}")]
    WrongLength {
        /// Kind name.
        kind: &'static str,
        /// Bytes the kind has.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
}

/// Why a UUID could not be made.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UuidError {
    /// The kind is not a UUID version.
    #[error("{0} is not a UUID kind")]
    NotUuid(&'static str),
    /// v3 and v5 hash a name in a name-space; none was given.
    #[error("{0} needs a name-space and a name (for example --namespace dns --name example.com)")]
    MissingName(&'static str),
}

/// Why a generator could not issue an id.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GenerateError {
    /// The clock is behind the last issued tick by more than the policy allows.
    #[error("clock moved backwards; refusing to generate ids for {behind_ms} ms")]
    ClockMovedBackwards {
        /// How far behind, in milliseconds.
        behind_ms: u64,
    },
    /// The clock did not advance while the generator waited for it.
    #[error("clock did not advance for {waited_ms} ms while waiting for the next tick")]
    ClockStalled {
        /// How long the generator waited.
        waited_ms: u64,
    },
    /// The clock reads before the layout's epoch.
    #[error("clock reads {now_ms} ms, before the layout's epoch {epoch_ms} ms")]
    BeforeEpoch {
        /// Clock reading.
        now_ms: u64,
        /// Layout epoch.
        epoch_ms: u64,
    },
    /// The time field is full: the layout's life is over.
    #[error("layout {layout} ran out of time bits (end of life {end_ms} ms)")]
    EpochExhausted {
        /// Layout name.
        layout: String,
        /// End of life, Unix ms.
        end_ms: u128,
    },
    /// A batch of zero ids, or more than the generator allows.
    #[error("batch size {requested} is invalid: ask for 1 to {max} ids")]
    InvalidCount {
        /// Count asked for.
        requested: u64,
        /// Largest batch allowed.
        max: u64,
    },
}

/// A node id source that found nothing usable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NodeIdError {
    /// No network interface had a hardware address.
    #[error("no network interface has a MAC address; give the node id explicitly")]
    NoMacAddress,
    /// No usable IP address.
    #[error("no non-loopback IP address found; give the node id explicitly")]
    NoIpAddress,
    /// The host name does not end in `-N`.
    #[error("host name {0:?} does not end in an ordinal like 'ids-7'")]
    NoOrdinal(String),
    /// The value does not fit the layout's field.
    #[error(transparent)]
    OutOfRange(#[from] IdError),
}
