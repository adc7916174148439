//! Every kind of id the product makes, and recognising one from its text.

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;
use crate::format::Format;
use crate::id::Id;
use crate::objectid::ObjectId;
use crate::uuid_info::UuidInfo;
use ::uuid::Uuid;

/// A kind of id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A 64-bit id of a [`crate::Layout`].
    Layout,
    /// UUID version 1 (time and node).
    UuidV1,
    /// UUID version 3 (MD5 of name-space and name).
    UuidV3,
    /// UUID version 4 (random).
    UuidV4,
    /// UUID version 5 (SHA-1 of name-space and name).
    UuidV5,
    /// UUID version 6 (v1 reordered to sort by time).
    UuidV6,
    /// UUID version 7 (Unix ms and random; sorts by time).
    UuidV7,
    /// The nil UUID.
    UuidNil,
    /// MongoDB ObjectId.
    ObjectId,
}

impl Kind {
    /// Every kind, for listings.
    pub const ALL: [Kind; 9] = [
        Kind::Layout,
        Kind::UuidV1,
        Kind::UuidV3,
        Kind::UuidV4,
        Kind::UuidV5,
        Kind::UuidV6,
        Kind::UuidV7,
        Kind::UuidNil,
        Kind::ObjectId,
    ];
    /// The kind's name as the CLI and the service take it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Layout => "layout",
            Kind::UuidV1 => "uuidv1",
            Kind::UuidV3 => "uuidv3",
            Kind::UuidV4 => "uuidv4",
            Kind::UuidV5 => "uuidv5",
            Kind::UuidV6 => "uuidv6",
            Kind::UuidV7 => "uuidv7",
            Kind::UuidNil => "uuid-nil",
            Kind::ObjectId => "objectid",
        }
    }
    /// Whether the kind needs a name-space and a name.
    pub fn is_name_based(self) -> bool {
        matches!(self, Kind::UuidV3 | Kind::UuidV5)
    }
    /// Size in bytes.
    pub fn bytes(self) -> usize {
        match self {
            Kind::Layout => 8,
            Kind::ObjectId => 12,
            _ => 16,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let s = s.to_ascii_lowercase();
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s || (s == "snowflake" && *k == Kind::Layout))
            .ok_or(ParseError::UnknownKind(s))
    }
}

/// An id recognised from text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recognised {
    /// A 64-bit id (decode it against a layout).
    Id(Id),
    /// A UUID with its version and embedded time.
    Uuid(UuidInfo),
    /// An ObjectId.
    ObjectId(ObjectId),
}

/// Recognises a UUID (36 or 32 hex characters), an ObjectId (24 hex
/// characters) or a 64-bit id in `format`.
///
/// ```
/// use shardflake::{kind::{recognise, Recognised}, Format};
/// assert!(matches!(recognise("00000000-0000-0000-0000-000000000000", Format::Dec), Ok(Recognised::Uuid(_))));
/// assert!(matches!(recognise("6553f1000102030405fffffe", Format::Dec), Ok(Recognised::ObjectId(_))));
/// assert!(matches!(recognise("11637205501278089", Format::Dec), Ok(Recognised::Id(_))));
/// ```
pub fn recognise(text: &str, format: Format) -> Result<Recognised, ParseError> {
    let t = text.trim();
    let hex = t.bytes().all(|b| b.is_ascii_hexdigit());
    if t.len() == 36 || (t.len() == 32 && hex) {
        return Uuid::parse_str(t)
            .map(|u| Recognised::Uuid(UuidInfo::of(u)))
            .map_err(|_| ParseError::Unrecognised(t.to_string()));
    }
    if t.len() == 24 && hex {
        return t.parse().map(Recognised::ObjectId);
    }
    format.parse(t).map(Recognised::Id)
}
