//! 64-bit ids: composing from parts and decoding back, against a [`Layout`].

use std::fmt;

use crate::error::{ConvertError, IdError};
use crate::layout::Layout;
use crate::timestamp::rfc3339_ms;

/// A 64-bit id. It means nothing without the [`Layout`] that made it.
///
/// # Text and numbers
///
/// - [`Display`](fmt::Display) writes the unsigned decimal and
///   [`FromStr`](std::str::FromStr) reads exactly that back (strictly: ASCII digits only, no
///   sign, no spaces); `{:x}`/`{:X}` write hex.
/// - Every [`Format`](crate::Format) (decimal, hex, Crockford base32, base62) through one
///   call each: [`Id::format_as`] and [`Id::parse_as`]; [`Format::detect`](crate::Format::detect)
///   guesses the form of text of unknown origin.
/// - `u64` both ways with `From` (lossless).
/// - `i64`, as PostgreSQL and MySQL keep ids in a signed `BIGINT`: layouts
///   that use all 64 bits (Instagram's, after 2046) have ids at or above
///   2^63, which have no non-negative `i64`. Pick the meaning you want:
///   [`Id::to_i64_wrapping`]/[`Id::from_i64_wrapping`] are bit for bit (two's
///   complement; what a `BIGINT` column stores, negative above `i64::MAX`),
///   while `TryFrom<Id> for i64` and `TryFrom<i64> for Id` keep the number
///   and fail with a [`ConvertError`] where it does not fit.
///
/// ```
/// use shardflake::{preset, Id};
///
/// // A Java Snowflake with epoch 2015-01-01: node 786, sequence 3450 at
/// // 2018-06-09T10:00:00Z (the vector our source documents print).
/// let layout = shardflake::Layout::builder("java")
///     .epoch_ms(1_420_070_400_000)
///     .time(41).node("node", 10).sequence(12)
///     .build()?;
/// let nodes = layout.nodes(&[("node", 786)])?;
/// let id = layout.compose(1_528_538_400_000, &nodes, 3450)?;
/// assert_eq!(id.get(), 454_947_766_275_222_906);
/// let parts = id.decode(&layout)?;
/// assert_eq!(parts.timestamp(), "2018-06-09T10:00:00.000Z");
/// assert_eq!(parts.field("node"), Some(786));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Id(pub u64);

impl Id {
    /// The raw value.
    pub const fn get(self) -> u64 {
        self.0
    }
    /// The value as a signed `bigint` would store it (negative once the top
    /// bit is set); the same as [`Id::to_i64_wrapping`].
    pub const fn as_i64(self) -> i64 {
        self.to_i64_wrapping()
    }

    /// The id bit for bit as an `i64` (two's complement): what a signed
    /// `BIGINT` column in PostgreSQL or MySQL stores. Ids at or above 2^63
    /// (the sign bit set, as Instagram's layout makes from 2046) come out
    /// negative; [`Id::from_i64_wrapping`] turns them back. Never fails.
    ///
    /// ```
    /// use shardflake::Id;
    /// assert_eq!(Id(42).to_i64_wrapping(), 42);
    /// assert_eq!(Id(1 << 63).to_i64_wrapping(), i64::MIN);
    /// assert_eq!(Id(u64::MAX).to_i64_wrapping(), -1);
    /// // Checked instead: the number itself, or an error.
    /// assert!(i64::try_from(Id(u64::MAX)).is_err());
    /// ```
    pub const fn to_i64_wrapping(self) -> i64 {
        self.0 as i64
    }

    /// The id whose bits are those of `value` (two's complement): reads back
    /// what a signed `BIGINT` column stores, negative values included.
    /// Inverse of [`Id::to_i64_wrapping`]. Never fails.
    ///
    /// ```
    /// use shardflake::Id;
    /// assert_eq!(Id::from_i64_wrapping(-1), Id(u64::MAX));
    /// assert_eq!(Id::from_i64_wrapping(i64::MIN), Id(1 << 63));
    /// let id = Id(0x8000_0000_0000_1234);
    /// assert_eq!(Id::from_i64_wrapping(id.to_i64_wrapping()), id);
    /// // Checked instead: a negative number is an error.
    /// assert!(Id::try_from(-1i64).is_err());
    /// ```
    pub const fn from_i64_wrapping(value: i64) -> Id {
        Id(value as u64)
    }

    /// Splits the id into its parts.
    pub fn decode(self, layout: &Layout) -> Result<Parts, IdError> {
        if self.0 > layout.max_id() {
            return Err(IdError::TooLarge {
                id: self.0,
                layout: layout.name().to_string(),
                max: layout.max_id(),
            });
        }
        let tick = layout.time().extract(self.0);
        Ok(Parts {
            id: self,
            layout: layout.name().to_string(),
            tick,
            unix_ms: layout.tick_to_unix_ms(tick),
            fields: layout
                .node_fields()
                .map(|f| (f.name().to_string(), f.extract(self.0)))
                .collect(),
            sequence: layout.sequence().extract(self.0),
        })
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Hex without padding or prefix, as for `u64`: `{:016x}` is [`Format::Hex`](crate::Format::Hex).
impl fmt::LowerHex for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// Upper-case hex, as for `u64`.
impl fmt::UpperHex for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::UpperHex::fmt(&self.0, f)
    }
}

/// Lossless.
impl From<u64> for Id {
    fn from(v: u64) -> Self {
        Id(v)
    }
}

/// Lossless.
impl From<Id> for u64 {
    fn from(id: Id) -> Self {
        id.0
    }
}

/// Lossless.
impl From<Id> for u128 {
    fn from(id: Id) -> Self {
        u128::from(id.0)
    }
}

/// Lossless: ids at or above 2^63 stay positive (unlike an `i64`).
impl From<Id> for i128 {
    fn from(id: Id) -> Self {
        i128::from(id.0)
    }
}

/// The number itself; a negative number is [`ConvertError::Negative`]. To
/// read a signed `BIGINT` column bit for bit, negative ids included, use
/// [`Id::from_i64_wrapping`].
///
/// ```
/// use shardflake::{ConvertError, Id};
/// assert_eq!(Id::try_from(i64::MAX), Ok(Id(i64::MAX as u64)));
/// assert_eq!(Id::try_from(-5i64), Err(ConvertError::Negative(-5)));
/// ```
impl TryFrom<i64> for Id {
    type Error = ConvertError;
    fn try_from(value: i64) -> Result<Self, ConvertError> {
        u64::try_from(value)
            .map(Id)
            .map_err(|_| ConvertError::Negative(value))
    }
}

/// The number itself; an id above `i64::MAX` (the sign bit set) is
/// [`ConvertError::AboveI64Max`]. To store any id in a signed `BIGINT`
/// column bit for bit, use [`Id::to_i64_wrapping`].
///
/// ```
/// use shardflake::{ConvertError, Id};
/// assert_eq!(i64::try_from(Id(7)), Ok(7));
/// assert_eq!(i64::try_from(Id(1 << 63)), Err(ConvertError::AboveI64Max(1 << 63)));
/// ```
impl TryFrom<Id> for i64 {
    type Error = ConvertError;
    fn try_from(id: Id) -> Result<Self, ConvertError> {
        i64::try_from(id.0).map_err(|_| ConvertError::AboveI64Max(id.0))
    }
}

/// An id split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parts {
    /// The id.
    pub id: Id,
    /// The layout's name.
    pub layout: String,
    /// The time field's value, in ticks since the epoch.
    pub tick: u64,
    /// The start of that tick, in Unix milliseconds.
    pub unix_ms: u64,
    /// Node and shard fields, most significant first.
    pub fields: Vec<(String, u64)>,
    /// The sequence field.
    pub sequence: u64,
}

impl Parts {
    /// The time as RFC 3339, UTC, milliseconds.
    pub fn timestamp(&self) -> String {
        rfc3339_ms(self.unix_ms)
    }
    /// The time as a UTC instant (the start of the id's tick).
    pub fn time(&self) -> std::time::SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(self.unix_ms)
    }
    /// A node or shard field by name.
    pub fn field(&self, name: &str) -> Option<u64> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
}

/// The node and shard fields of one generator, checked against a layout and
/// packed into their bit positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NodeBits(u64);

impl NodeBits {
    /// The packed bits, ready to OR into an id.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl Layout {
    /// Checks a value for every node field and packs them.
    ///
    /// Every node field needs a value; names the layout lacks and values
    /// wider than their field are errors.
    pub fn nodes(&self, values: &[(&str, u64)]) -> Result<NodeBits, IdError> {
        for (name, _) in values {
            if !self.node_fields().any(|f| f.name() == *name) {
                return Err(IdError::UnknownField {
                    layout: self.name().to_string(),
                    field: name.to_string(),
                    known: self
                        .node_fields()
                        .map(|f| f.name())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
        }
        let mut bits = 0;
        for field in self.node_fields() {
            let value = values
                .iter()
                .rev()
                .find(|(n, _)| *n == field.name())
                .map(|(_, v)| *v)
                .ok_or_else(|| IdError::MissingField {
                    layout: self.name().to_string(),
                    field: field.name().to_string(),
                })?;
            bits |= self.check(field.name(), value)? << field.shift();
        }
        Ok(NodeBits(bits))
    }

    /// The value itself if it fits the named field.
    pub fn check(&self, field: &str, value: u64) -> Result<u64, IdError> {
        let f = self.field(field).ok_or_else(|| IdError::UnknownField {
            layout: self.name().to_string(),
            field: field.to_string(),
            known: self
                .fields()
                .iter()
                .map(|f| f.name())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        if value > f.max() {
            return Err(IdError::OutOfRange {
                layout: self.name().to_string(),
                field: field.to_string(),
                value,
                max: f.max(),
            });
        }
        Ok(value)
    }

    /// An id from a Unix time, node bits and a sequence value.
    pub fn compose(&self, unix_ms: u64, nodes: &NodeBits, sequence: u64) -> Result<Id, IdError> {
        let tick = self
            .unix_ms_to_tick(unix_ms)
            .filter(|t| *t <= self.max_tick())
            .ok_or_else(|| IdError::TimeOutOfRange {
                layout: self.name().to_string(),
                unix_ms,
                epoch_ms: self.epoch_ms(),
                end_ms: self.end_of_life_ms(),
            })?;
        self.compose_tick(tick, nodes, sequence)
    }

    /// An id from a tick, node bits and a sequence value.
    pub fn compose_tick(&self, tick: u64, nodes: &NodeBits, sequence: u64) -> Result<Id, IdError> {
        let tick = self.check(crate::layout::TIME, tick)?;
        let sequence = self.check(crate::layout::SEQUENCE, sequence)?;
        Ok(Id(self.pack(tick, sequence) | nodes.get()))
    }

    /// Time and sequence in their positions (no checks).
    pub(crate) fn pack(&self, tick: u64, sequence: u64) -> u64 {
        (tick << self.time().shift()) | (sequence << self.sequence().shift())
    }

    /// The smallest id of a Unix millisecond, for range scans
    /// (`WHERE id >= layout.first_id_at(t)`).
    pub fn first_id_at(&self, unix_ms: u64) -> Result<Id, IdError> {
        self.compose(unix_ms, &NodeBits(0), 0)
    }

    /// Logical shard of a sharding key with `shards` logical shards
    /// (Instagram: user 31341 of 2000 shards is shard 1341).
    pub fn shard_of(key: u64, shards: u64) -> Result<u64, IdError> {
        key.checked_rem(shards).ok_or(IdError::NoShards)
    }

    /// [`Layout::shard_of`], checking that `shards` logical shards fit the
    /// layout's `field`.
    ///
    /// ```
    /// let layout = shardflake::preset::by_name("instagram")?;
    /// assert_eq!(layout.shard_for_key("shard", 31341, 2000)?, 1341);
    /// assert!(layout.shard_for_key("shard", 31341, 9000).is_err()); // 13 bits: 8192 at most
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shard_for_key(&self, field: &str, key: u64, shards: u64) -> Result<u64, IdError> {
        let f = self.field(field).ok_or_else(|| IdError::UnknownField {
            layout: self.name().to_string(),
            field: field.to_string(),
            known: self
                .node_fields()
                .map(|f| f.name().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        if shards.saturating_sub(1) > f.max() {
            return Err(IdError::TooManyShards {
                layout: self.name().to_string(),
                field: field.to_string(),
                bits: f.bits(),
                shards,
                max: f.max().saturating_add(1),
            });
        }
        Self::shard_of(key, shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;

    #[test]
    fn instagram_vector() {
        // "Sharding & IDs at Instagram" (Instagram Engineering, 2012): 1387263000 ms
        // after the epoch, shard 1341, sequence 5001 % 1024.
        let l = preset::by_name("instagram").unwrap();
        let nodes = l.nodes(&[("shard", 1341)]).unwrap();
        let id = l.compose_tick(1_387_263_000, &nodes, 5001 % 1024).unwrap();
        assert_eq!(id.get(), 11_637_205_501_278_089);
        let p = id.decode(&l).unwrap();
        assert_eq!(
            (p.tick, p.field("shard"), p.sequence),
            (1_387_263_000, Some(1341), 5001 % 1024)
        );
        assert_eq!(Layout::shard_of(31341, 2000), Ok(1341));
        assert_eq!(Layout::shard_of(1, 0), Err(IdError::NoShards));
    }

    #[test]
    fn snowflake_vector_before_and_after_sequence() {
        let l = Layout::builder("java")
            .epoch_ms(preset::DISCORD_EPOCH_MS)
            .time(41)
            .node("node", 10)
            .sequence(12)
            .build()
            .unwrap();
        let n = l.nodes(&[("node", 786)]).unwrap();
        assert_eq!(
            l.compose(1_528_538_400_000, &n, 0).unwrap().get(),
            454_947_766_275_219_456
        );
        let id = l.compose(1_528_538_400_000, &n, 3450).unwrap();
        assert_eq!(id.get(), 454_947_766_275_222_906);
        let parts = id.decode(&l).unwrap();
        let since_epoch = parts.time().duration_since(std::time::UNIX_EPOCH);
        assert_eq!(since_epoch.unwrap().as_millis(), 1_528_538_400_000);
        assert_eq!(parts.timestamp(), "2018-06-09T10:00:00.000Z");
    }

    #[test]
    fn out_of_range_parts_are_errors() {
        let l = preset::by_name("twitter").unwrap();
        assert!(matches!(
            l.nodes(&[("datacenter", 32), ("worker", 0)]),
            Err(IdError::OutOfRange { max: 31, .. })
        ));
        assert!(matches!(
            l.nodes(&[("datacenter", 1)]),
            Err(IdError::MissingField { .. })
        ));
        assert!(matches!(
            l.nodes(&[("datacenter", 1), ("worker", 1), ("node", 1)]),
            Err(IdError::UnknownField { .. })
        ));
        let n = l.nodes(&[("datacenter", 31), ("worker", 31)]).unwrap();
        assert!(matches!(
            l.compose_tick(0, &n, 4096),
            Err(IdError::OutOfRange { .. })
        ));
        assert!(matches!(
            l.compose(0, &n, 0),
            Err(IdError::TimeOutOfRange { .. })
        ));
        let end = l.end_of_life_ms() as u64;
        assert!(matches!(
            l.compose(end, &n, 0),
            Err(IdError::TimeOutOfRange { .. })
        ));
        // The last millisecond, max node, max sequence: the largest id.
        assert_eq!(l.compose(end - 1, &n, 4095).unwrap().get(), l.max_id());
        assert!(matches!(
            Id(u64::MAX).decode(&l),
            Err(IdError::TooLarge { .. })
        ));
    }

    #[test]
    fn instagram_ids_go_negative_at_2046() {
        let l = preset::by_name("instagram").unwrap();
        let at = l.negative_from_ms().unwrap();
        let n = l.nodes(&[("shard", 0)]).unwrap();
        assert!(l.compose(at - 1, &n, 1023).unwrap().as_i64() > 0);
        assert!(l.compose(at, &n, 0).unwrap().as_i64() < 0);
    }
}
