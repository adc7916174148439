//! UUIDs (RFC 9562) through the `uuid` crate: versions 1, 3, 4, 5, 6, 7 and
//! nil (RFC 9562 §5.1, §5.3–§5.7 and §5.9). The crate's `fast-rng` feature
//! is on, so v4 and v7
//! do not make a system call per id.

pub use ::uuid::Uuid;

use std::sync::OnceLock;

use crate::error::{ParseError, UuidError};
use crate::kind::Kind;

pub use crate::uuid_info::UuidInfo;

/// A new UUID of `kind`; v3 and v5 hash `name` in its name-space.
///
/// v1 and v6 carry a node id: a random one per process with the multicast
/// bit set, as RFC 9562 §6.10 allows, so no MAC address leaks.
///
/// ```
/// use shardflake::{Kind, uuid::{generate, namespace}};
/// let v7 = generate(Kind::UuidV7, None)?;
/// assert_eq!(v7.get_version_num(), 7);
/// let v5 = generate(Kind::UuidV5, Some((namespace("dns")?, b"www.example.com")))?;
/// assert_eq!(v5.to_string(), "2ed6657d-e927-568b-95e1-2665a8aea6a2");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate(kind: Kind, name: Option<(Uuid, &[u8])>) -> Result<Uuid, UuidError> {
    let named = |f: fn(&Uuid, &[u8]) -> Uuid| {
        name.map(|(ns, n)| f(&ns, n))
            .ok_or(UuidError::MissingName(kind.name()))
    };
    Ok(match kind {
        Kind::UuidV1 => Uuid::now_v1(node_id()),
        Kind::UuidV3 => named(Uuid::new_v3)?,
        Kind::UuidV4 => Uuid::new_v4(),
        Kind::UuidV5 => named(Uuid::new_v5)?,
        Kind::UuidV6 => Uuid::now_v6(node_id()),
        Kind::UuidV7 => Uuid::now_v7(),
        Kind::UuidNil => Uuid::nil(),
        Kind::Layout | Kind::ObjectId => return Err(UuidError::NotUuid(kind.name())),
    })
}

fn node_id() -> &'static [u8; 6] {
    static NODE: OnceLock<[u8; 6]> = OnceLock::new();
    NODE.get_or_init(|| {
        let mut node = *Uuid::new_v4()
            .as_bytes()
            .first_chunk::<6>()
            .unwrap_or(&[0; 6]);
        node[0] |= 0x01;
        node
    })
}

/// A UUID name-space by its RFC 9562 §6.6 name (`dns`, `url`, `oid`,
/// `x500`) or as a UUID.
pub fn namespace(name: &str) -> Result<Uuid, ParseError> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "dns" => Uuid::NAMESPACE_DNS,
        "url" => Uuid::NAMESPACE_URL,
        "oid" => Uuid::NAMESPACE_OID,
        "x500" => Uuid::NAMESPACE_X500,
        _ => Uuid::parse_str(name).map_err(|_| ParseError::UnknownNamespace(name.to_string()))?,
    })
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
        assert!(matches!(
            namespace("nope"),
            Err(ParseError::UnknownNamespace(_))
        ));
        assert_eq!(
            generate(Kind::UuidV3, None),
            Err(UuidError::MissingName("uuidv3"))
        );
        assert_eq!(
            generate(Kind::ObjectId, None),
            Err(UuidError::NotUuid("objectid"))
        );
        for (kind, version) in [
            (Kind::UuidV1, 1),
            (Kind::UuidV4, 4),
            (Kind::UuidV6, 6),
            (Kind::UuidNil, 0),
        ] {
            assert_eq!(generate(kind, None).unwrap().get_version_num(), version);
        }
        let a = generate(Kind::UuidV6, None).unwrap();
        let b = generate(Kind::UuidV6, None).unwrap();
        assert!(a < b, "v6 sorts by time");
    }
}
