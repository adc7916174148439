//! serde support (feature `serde`): ids serialise as decimal strings,
//! because JavaScript's numbers lose integers above 2^53; they deserialise
//! from a string or a number. `#[serde(with = "shardflake::serde::number")]`
//! opts a field into plain numbers.

use ::serde::de::{self, Visitor};
use ::serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

use crate::format::Format;
use crate::id::Id;
use crate::objectid::ObjectId;

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a 64-bit id as a decimal string or a number")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id, E> {
                Ok(Id(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id, E> {
                Ok(Id(v as u64))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id, E> {
                Format::Dec.parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

impl Serialize for ObjectId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ObjectId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map_err(de::Error::custom)
    }
}

/// Serialises an [`Id`] as a JSON number: `#[serde(with = "shardflake::serde::number")]`.
pub mod number {
    use super::*;

    /// Writes the id as a number.
    pub fn serialize<S: Serializer>(id: &Id, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(id.get())
    }
    /// Reads a number or a string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Id, D::Error> {
        Id::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(::serde::Serialize, ::serde::Deserialize, PartialEq, Debug)]
    #[serde(crate = "::serde")]
    struct Row {
        id: Id,
        #[serde(with = "number")]
        n: Id,
    }

    #[test]
    fn strings_by_default_numbers_on_request() {
        let row = Row {
            id: Id(454_947_766_275_222_906),
            n: Id(7),
        };
        let json = serde_json::to_string(&row).unwrap();
        assert_eq!(json, r#"{"id":"454947766275222906","n":7}"#);
        assert_eq!(serde_json::from_str::<Row>(&json).unwrap(), row);
        assert_eq!(serde_json::from_str::<Id>("12").unwrap(), Id(12));
        assert!(serde_json::from_str::<Id>(r#""12x""#).is_err());
        let oid: ObjectId = "6553f1000102030405fffffe".parse().unwrap();
        assert_eq!(
            serde_json::to_string(&oid).unwrap(),
            r#""6553f1000102030405fffffe""#
        );
    }
}
