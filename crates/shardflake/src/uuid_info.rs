//! [`UuidInfo`]: what a UUID says about itself (version, embedded time);
//! shown at [`crate::uuid::UuidInfo`]. Apart from making UUIDs so that
//! recognising one (`kind.rs`) needs nothing of the making.

use ::uuid::Uuid;

use crate::timestamp::rfc3339_ms;

/// What a UUID says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UuidInfo {
    /// The UUID.
    pub uuid: Uuid,
    /// Version number, 0 for nil and 15 for max.
    pub version: usize,
    /// The embedded time, Unix ms, for v1, v6 and v7.
    pub unix_ms: Option<u64>,
}

impl UuidInfo {
    /// Reads the version and embedded time.
    pub fn of(uuid: Uuid) -> Self {
        let unix_ms = uuid.get_timestamp().map(|ts| {
            let (secs, nanos) = ts.to_unix();
            secs * 1000 + u64::from(nanos) / 1_000_000
        });
        UuidInfo {
            uuid,
            version: uuid.get_version_num(),
            unix_ms,
        }
    }
    /// The embedded time as RFC 3339.
    pub fn timestamp(&self) -> Option<String> {
        self.unix_ms.map(rfc3339_ms)
    }
}
