//! 64-bit ids: composing from parts and decoding back, against a [`Layout`].

use std::fmt;

use crate::error::IdError;
use crate::layout::Layout;
use crate::timestamp::rfc3339_ms;

/// A 64-bit id. It means nothing without the [`Layout`] that made it.
///
/// ```
/// use shardflake::{preset, Id};
///
/// // MISSION.md §2.1: epoch 2015-01-01, node 786, sequence 3450.
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
    /// bit is set).
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
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

impl From<u64> for Id {
    fn from(v: u64) -> Self {
        Id(v)
    }
}

impl From<Id> for u64 {
    fn from(id: Id) -> Self {
        id.0
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
        // MISSION.md §2.2: 1387263000 ms after the epoch, shard 1341, sequence 5001 % 1024.
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
