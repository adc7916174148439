//! Bit layouts: the single source of truth for what a 64-bit id means.
//!
//! A [`Layout`] is an epoch, a tick length and an ordered list of named
//! fields, most significant first: one `time` field, one `sequence` field and
//! any number of node or shard fields, in any order as long as time is more
//! significant than the sequence (otherwise ids would not sort by time).
//! Twitter Snowflake ("Announcing Snowflake", 2010) is `time 41 | node 10 | sequence 12`;
//! Sonyflake puts its machine id last, below the sequence.
//!
//! Bits above the fields are zero. A layout whose fields use all 64 bits
//! (Instagram's, §2.2) makes ids that turn negative as a signed `bigint` once
//! the top time bit is set; [`Layout::negative_from_ms`] says when.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::LayoutError;

/// Name of the time field in every layout.
pub const TIME: &str = "time";
/// Name of the sequence field in every layout.
pub const SEQUENCE: &str = "sequence";

/// What a field of a layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// Ticks since the layout's epoch.
    Time,
    /// Per-tick counter.
    Sequence,
    /// A node, worker, datacenter or shard number, fixed per generator.
    Node,
}

/// One named field of a layout.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Field {
    name: String,
    kind: FieldKind,
    bits: u32,
    shift: u32,
}

impl Field {
    /// The field's name (`time`, `sequence`, `node`, `shard`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// What the field holds.
    pub fn kind(&self) -> FieldKind {
        self.kind
    }
    /// Width in bits.
    pub fn bits(&self) -> u32 {
        self.bits
    }
    /// Position of the field's lowest bit in the id.
    pub fn shift(&self) -> u32 {
        self.shift
    }
    /// Largest value the field holds.
    pub fn max(&self) -> u64 {
        mask(self.bits)
    }
    /// This field's value in `id`.
    pub fn extract(&self, id: u64) -> u64 {
        (id >> self.shift) & mask(self.bits)
    }
}

/// `bits` ones, for `bits` in 0..=64.
pub(crate) const fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// A validated bit layout. Build one with [`Layout::builder`] or take a
/// preset from [`crate::preset`].
///
/// ```
/// use shardflake::Layout;
///
/// let layout = Layout::builder("snowflake")
///     .epoch_ms(1_288_834_974_657)
///     .time(41)
///     .node("node", 10)
///     .sequence(12)
///     .build()?;
/// assert_eq!(layout.ids_per_tick(), 4096);
/// assert_eq!(layout.node_count(), 1024);
/// assert_eq!(layout.negative_from_ms(), None);
/// # Ok::<(), shardflake::LayoutError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    name: String,
    epoch_ms: u64,
    tick_ms: u64,
    fields: Vec<Field>,
    time: usize,
    sequence: usize,
    random_start_bits: u32,
}

impl Layout {
    /// Starts a layout; add fields most significant first.
    pub fn builder(name: impl Into<String>) -> LayoutBuilder {
        LayoutBuilder {
            name: name.into(),
            epoch_ms: 0,
            tick_ms: 1,
            fields: Vec::new(),
            random_start_bits: 0,
        }
    }

    /// The layout's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The epoch, in milliseconds since the Unix epoch.
    pub fn epoch_ms(&self) -> u64 {
        self.epoch_ms
    }
    /// Length of one tick of the time field, in milliseconds.
    pub fn tick_ms(&self) -> u64 {
        self.tick_ms
    }
    /// Width of each tick's random start (0: every tick starts at sequence
    /// 0); see [`LayoutBuilder::random_start`].
    pub fn random_start_bits(&self) -> u32 {
        self.random_start_bits
    }
    /// Every field, most significant first.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }
    /// The time field.
    pub fn time(&self) -> &Field {
        &self.fields[self.time]
    }
    /// The sequence field.
    pub fn sequence(&self) -> &Field {
        &self.fields[self.sequence]
    }
    /// The node and shard fields, most significant first.
    pub fn node_fields(&self) -> impl Iterator<Item = &Field> {
        self.fields.iter().filter(|f| f.kind == FieldKind::Node)
    }
    /// A field by name.
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }
    /// Bits used by all fields together; the bits above are always zero.
    pub fn total_bits(&self) -> u32 {
        self.fields.iter().map(|f| f.bits).sum()
    }
    /// Largest id the layout can make.
    pub fn max_id(&self) -> u64 {
        mask(self.total_bits())
    }
    /// Sequence values per tick per node.
    pub fn ids_per_tick(&self) -> u64 {
        1u64 << self.sequence().bits
    }
    /// The most ids one node can make per second.
    pub fn ids_per_second(&self) -> f64 {
        self.ids_per_tick() as f64 * 1000.0 / self.tick_ms as f64
    }
    /// How many distinct nodes (all node fields together) the layout addresses.
    pub fn node_count(&self) -> u128 {
        1u128 << self.node_fields().map(|f| f.bits).sum::<u32>()
    }
    /// Last tick the time field can hold.
    pub fn max_tick(&self) -> u64 {
        self.time().max()
    }
    /// First Unix millisecond the layout can no longer represent.
    pub fn end_of_life_ms(&self) -> u128 {
        self.epoch_ms as u128 + (self.max_tick() as u128 + 1) * self.tick_ms as u128
    }
    /// Whether the fields use the sign bit of a signed 64-bit integer.
    pub fn uses_sign_bit(&self) -> bool {
        self.total_bits() == 64
    }
    /// First Unix millisecond whose ids are negative as a signed `bigint`, for
    /// layouts that use the sign bit with time on top (Instagram: 2046-06-27).
    /// `Some(epoch)` when a non-time field holds the sign bit, since then some
    /// ids are negative from the start.
    pub fn negative_from_ms(&self) -> Option<u64> {
        if !self.uses_sign_bit() {
            return None;
        }
        let top = &self.fields[0];
        if top.kind != FieldKind::Time {
            return Some(self.epoch_ms);
        }
        let first_negative_tick = 1u64 << (top.bits - 1);
        Some(self.tick_to_unix_ms(first_negative_tick))
    }
    /// First Unix millisecond whose ids reach 2^53 (JavaScript's
    /// `Number.MAX_SAFE_INTEGER + 1`); `None` if every id stays below it.
    pub fn js_unsafe_from_ms(&self) -> Option<u64> {
        const JS_SAFE: u64 = 1 << 53;
        if self.max_id() < JS_SAFE {
            return None;
        }
        let time = self.time();
        // Largest possible id with time t is (t << shift) | all lower ones.
        let lower = mask(time.shift);
        if lower >= JS_SAFE {
            return Some(self.epoch_ms);
        }
        let first_tick = (JS_SAFE - lower).div_ceil(1u64 << time.shift);
        Some(self.tick_to_unix_ms(first_tick))
    }

    /// The tick for a Unix millisecond, or `None` before the epoch.
    pub fn unix_ms_to_tick(&self, unix_ms: u64) -> Option<u64> {
        unix_ms
            .checked_sub(self.epoch_ms)
            .map(|ms| ms / self.tick_ms)
    }
    /// The Unix millisecond a tick starts at (saturating).
    pub fn tick_to_unix_ms(&self, tick: u64) -> u64 {
        tick.saturating_mul(self.tick_ms)
            .saturating_add(self.epoch_ms)
    }
}

impl fmt::Display for Layout {
    /// `snowflake: time 41 | node 10 | sequence 12 (epoch 1288834974657 ms, tick 1 ms)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.name)?;
        for (i, field) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(" | ")?;
            }
            write!(f, "{} {}", field.name, field.bits)?;
        }
        write!(f, " (epoch {} ms, tick {} ms", self.epoch_ms, self.tick_ms)?;
        if self.random_start_bits > 0 {
            write!(f, ", random start {} bits", self.random_start_bits)?;
        }
        if let Some(ms) = self.negative_from_ms() {
            write!(
                f,
                ", negative as signed bigint from {}",
                crate::timestamp::rfc3339_ms(ms)
            )?;
        }
        f.write_str(")")
    }
}

/// Builds a [`Layout`]; see [`Layout::builder`].
#[derive(Debug, Clone)]
pub struct LayoutBuilder {
    name: String,
    epoch_ms: u64,
    tick_ms: u64,
    fields: Vec<(String, FieldKind, u32)>,
    random_start_bits: u32,
}

impl LayoutBuilder {
    /// Epoch in milliseconds since the Unix epoch (default 0).
    pub fn epoch_ms(mut self, epoch_ms: u64) -> Self {
        self.epoch_ms = epoch_ms;
        self
    }
    /// Tick length in milliseconds (default 1; Sonyflake uses 10).
    pub fn tick_ms(mut self, tick_ms: u64) -> Self {
        self.tick_ms = tick_ms;
        self
    }
    /// Starts each tick's sequence at a random value below `2^bits`
    /// instead of 0 (default 0: off), so that ids made at low rates do not
    /// all share their low bits and `id % N` spreads evenly for any `N`
    /// dividing `2^bits`. A tick's sequence then runs from its start to the
    /// top, never wrapping, so a tick holds at worst `2^bits - 1` fewer ids
    /// than the sequence field allows (half that on average); a tick that
    /// a batch or a waiting call enters from the one before starts at its
    /// random start too. At most the sequence's width.
    pub fn random_start(mut self, bits: u32) -> Self {
        self.random_start_bits = bits;
        self
    }
    /// Appends the time field.
    pub fn time(self, bits: u32) -> Self {
        self.field(TIME, FieldKind::Time, bits)
    }
    /// Appends the sequence field.
    pub fn sequence(self, bits: u32) -> Self {
        self.field(SEQUENCE, FieldKind::Sequence, bits)
    }
    /// Appends a node or shard field.
    pub fn node(self, name: impl Into<String>, bits: u32) -> Self {
        self.field(name, FieldKind::Node, bits)
    }
    /// Appends a field of any kind.
    pub fn field(mut self, name: impl Into<String>, kind: FieldKind, bits: u32) -> Self {
        self.fields.push((name.into(), kind, bits));
        self
    }

    /// Validates against the system clock (the epoch may not be in the future).
    pub fn build(self) -> Result<Layout, LayoutError> {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.build_at(now_ms)
    }

    /// Validates, taking `now_ms` as the current Unix time.
    pub fn build_at(self, now_ms: u64) -> Result<Layout, LayoutError> {
        if !valid_name(&self.name) {
            return Err(LayoutError::InvalidName(self.name));
        }
        if self.tick_ms == 0 {
            return Err(LayoutError::ZeroTick);
        }
        if self.epoch_ms > now_ms {
            return Err(LayoutError::EpochInFuture {
                epoch_ms: self.epoch_ms,
            });
        }
        let total: u64 = self.fields.iter().map(|(_, _, b)| u64::from(*b)).sum();
        if total > 64 {
            return Err(LayoutError::TooWide { bits: total });
        }
        let mut time = None;
        let mut sequence = None;
        for (i, (name, kind, bits)) in self.fields.iter().enumerate() {
            if !valid_name(name) {
                return Err(LayoutError::InvalidName(name.clone()));
            }
            if self.fields[..i].iter().any(|(n, _, _)| n == name) {
                return Err(LayoutError::DuplicateField(name.clone()));
            }
            if *bits == 0 {
                return Err(LayoutError::ZeroWidth(name.clone()));
            }
            let slot = match kind {
                FieldKind::Time => &mut time,
                FieldKind::Sequence => &mut sequence,
                FieldKind::Node => {
                    if name == TIME || name == SEQUENCE {
                        return Err(LayoutError::ReservedName(name.clone()));
                    }
                    continue;
                }
            };
            if slot.replace(i).is_some() {
                return Err(LayoutError::DuplicateField(name.clone()));
            }
        }
        let time = time.ok_or(LayoutError::Missing(TIME))?;
        let sequence = sequence.ok_or(LayoutError::Missing(SEQUENCE))?;
        if sequence < time {
            return Err(LayoutError::SequenceAboveTime);
        }
        let sequence_bits = self.fields[sequence].2;
        if self.random_start_bits > sequence_bits {
            return Err(LayoutError::RandomStartTooWide {
                bits: self.random_start_bits,
                sequence_bits,
            });
        }
        // Every time in the layout's life must be a u64 of Unix ms, so tick
        // arithmetic (ticks × tick length + epoch) can never overflow.
        let time_bits = self.fields[time].2;
        let end = (u128::from(mask(time_bits)) + 1) * u128::from(self.tick_ms)
            + u128::from(self.epoch_ms);
        if end > u128::from(u64::MAX) {
            return Err(LayoutError::TooLong {
                time_bits,
                tick_ms: self.tick_ms,
            });
        }
        let mut shift = total as u32;
        let fields = self
            .fields
            .into_iter()
            .map(|(name, kind, bits)| {
                shift -= bits;
                Field {
                    name,
                    kind,
                    bits,
                    shift,
                }
            })
            .collect();
        Ok(Layout {
            name: self.name,
            epoch_ms: self.epoch_ms,
            tick_ms: self.tick_ms,
            fields,
            time,
            sequence,
            random_start_bits: self.random_start_bits,
        })
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b() -> LayoutBuilder {
        Layout::builder("t").epoch_ms(1_000)
    }

    #[test]
    fn shifts_follow_field_order() {
        let l = b()
            .time(39)
            .sequence(8)
            .node("machine", 16)
            .build()
            .unwrap();
        assert_eq!(l.time().shift(), 24);
        assert_eq!(l.sequence().shift(), 16);
        assert_eq!(l.field("machine").unwrap().shift(), 0);
        assert_eq!(l.total_bits(), 63);
    }

    #[test]
    fn invalid_layouts_are_typed_errors() {
        use LayoutError::*;
        let cases: Vec<(LayoutBuilder, LayoutError)> = vec![
            (
                b().time(41).node("n", 12).sequence(12),
                TooWide { bits: 65 },
            ),
            (b().time(0).sequence(12), ZeroWidth("time".into())),
            (b().time(41).sequence(0), ZeroWidth("sequence".into())),
            (
                b().time(41).node("a", 2).node("a", 2).sequence(3),
                DuplicateField("a".into()),
            ),
            (
                b().time(41).time(3).sequence(3),
                DuplicateField("time".into()),
            ),
            (b().sequence(12), Missing("time")),
            (b().time(41), Missing("sequence")),
            (b().sequence(12).time(41), SequenceAboveTime),
            (
                b().time(41).node("time", 2).sequence(3),
                DuplicateField("time".into()),
            ),
            (
                b().time(41).node("Bad Name", 2).sequence(3),
                InvalidName("Bad Name".into()),
            ),
            (b().tick_ms(0).time(41).sequence(3), ZeroTick),
            (
                b().tick_ms(10).time(62).sequence(2),
                TooLong {
                    time_bits: 62,
                    tick_ms: 10,
                },
            ),
            (
                Layout::builder("t").epoch_ms(5_000).time(41).sequence(3),
                EpochInFuture { epoch_ms: 5_000 },
            ),
        ];
        for (builder, want) in cases {
            assert_eq!(builder.build_at(2_000).unwrap_err(), want);
        }
        let err = b()
            .time(41)
            .node("seq", 2)
            .field("sequence", FieldKind::Node, 3)
            .sequence(1);
        assert_eq!(
            err.build_at(2_000).unwrap_err(),
            ReservedName("sequence".into())
        );
    }

    #[test]
    fn messages_are_clear() {
        let e = b()
            .time(41)
            .node("n", 12)
            .sequence(12)
            .build_at(2_000)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "layout fields use 65 bits; at most 64 fit in an id"
        );
    }

    #[test]
    fn all_64_bits_with_time_on_top_turn_negative_halfway() {
        let l = b()
            .time(41)
            .node("shard", 13)
            .sequence(10)
            .build_at(2_000)
            .unwrap();
        assert!(l.uses_sign_bit());
        assert_eq!(l.negative_from_ms(), Some(1_000 + (1u64 << 40)));
        let l = b()
            .node("shard", 1)
            .time(40)
            .node("n", 13)
            .sequence(10)
            .build_at(2_000)
            .unwrap();
        assert_eq!(l.negative_from_ms(), Some(1_000));
    }

    #[test]
    fn end_of_life_and_js_safety() {
        let l = b()
            .tick_ms(10)
            .time(39)
            .sequence(8)
            .node("m", 16)
            .build_at(2_000)
            .unwrap();
        assert_eq!(l.end_of_life_ms(), 1_000 + (1u128 << 39) * 10);
        // ids reach 2^53 once time << 24 does, i.e. at tick 2^29 minus the low bits.
        let first = l.js_unsafe_from_ms().unwrap();
        let tick = (first - 1_000) / 10;
        assert!(((tick << 24) | mask(24)) >= 1 << 53);
        assert!((((tick - 1) << 24) | mask(24)) < 1 << 53);
        let small = b()
            .time(41)
            .node("n", 2)
            .sequence(10)
            .build_at(2_000)
            .unwrap();
        assert_eq!(small.js_unsafe_from_ms(), None);
    }
}
