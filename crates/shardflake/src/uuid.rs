//! UUIDs (RFC 9562) through the `uuid` crate: versions 1, 3, 4, 5, 6, 7 and
//! nil (MISSION.md §2.5). The crate's `fast-rng` feature is on, so v4 and v7
//! do not make a system call per id.

pub use ::uuid::Uuid;

use crate::error::ParseError;
use crate::timestamp::rfc3339_ms;

/// A UUID name-space by its RFC 9562 §6.6 name (`dns`, `url`, `oid`,
/// `x500`) or as a UUID.
pub fn namespace(name: &str) -> Result<Uuid, ParseError> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "dns" => Uuid::NAMESPACE_DNS,
        "url" => Uuid::NAMESPACE_URL,
        "oid" => Uuid::NAMESPACE_OID,
        "x500" => Uuid::NAMESPACE_X500,
        _ => Uuid::parse_str(name).map_err(|_| ParseError::Unrecognised(name.to_string()))?,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_times() {
        let v7 = Uuid::now_v7();
        let info = UuidInfo::of(v7);
        assert_eq!(info.version, 7);
        let now = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
        assert!(info.unix_ms.unwrap().abs_diff(now) < 5_000);
        assert_eq!(UuidInfo::of(Uuid::new_v4()).unix_ms, None);
        assert_eq!(UuidInfo::of(Uuid::nil()).version, 0);
        // RFC 9562 appendix A.4: v5 of "www.example.com" in the DNS name-space.
        let v5 = Uuid::new_v5(&namespace("dns").unwrap(), b"www.example.com");
        assert_eq!(v5.to_string(), "2ed6657d-e927-568b-95e1-2665a8aea6a2");
        assert!(namespace("nope").is_err());
    }
}
