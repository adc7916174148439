//! Where a node id comes from, as pure functions of what the host reports
//! (reading the host is the caller's job; see the `shardflake-host` crate).
//!
//! | source | rule | too wide for the field |
//! |---|---|---|
//! | explicit | the value given | error |
//! | host ordinal | the number after the last `-` (`ids-7` → 7), as a Kubernetes StatefulSet names pods | error |
//! | MAC hash | Java's `String.hashCode` of every MAC in upper-case hex, as the seed's `SequenceGenerator.createNodeId` | masked to the field, as the seed does |
//! | IP | the address's low bits, as Sonyflake takes the low 16 bits of a private IPv4 | masked to the field |
//!
//! Masked sources can collide between hosts; a lease from a coordination
//! store (the id service's etcd mode) cannot.

use std::net::IpAddr;

use crate::error::NodeIdError;
use crate::layout::{Layout, mask};

/// How a node id is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeIdSource {
    /// A value given by the operator.
    Explicit(u64),
    /// The ordinal at the end of the host name.
    HostOrdinal,
    /// A hash of the MAC addresses.
    MacHash,
    /// The low bits of an IP address.
    Ip,
}

impl NodeIdSource {
    /// The host source named `name`, as `serve --node-id-from` and `gen
    /// --node-from` take it: `hostname` (also `host-ordinal`, `ordinal`),
    /// `mac` (also `mac-hash`) or `ip`; `None` for any other name (say
    /// [`NodeIdSource::HOST_NAMES`]).
    ///
    /// ```
    /// use shardflake::node::NodeIdSource;
    /// assert_eq!(NodeIdSource::host("hostname"), Some(NodeIdSource::HostOrdinal));
    /// assert_eq!(NodeIdSource::host("mac-hash"), Some(NodeIdSource::MacHash));
    /// assert_eq!(NodeIdSource::host("disk"), None);
    /// ```
    pub fn host(name: &str) -> Option<NodeIdSource> {
        match name {
            "hostname" | "host-ordinal" | "ordinal" => Some(NodeIdSource::HostOrdinal),
            "mac" | "mac-hash" => Some(NodeIdSource::MacHash),
            "ip" => Some(NodeIdSource::Ip),
            _ => None,
        }
    }

    /// The host sources' names, for a message on a name
    /// [`NodeIdSource::host`] does not know.
    pub const HOST_NAMES: &'static str = "hostname, mac or ip";

    /// The source's short name: `explicit`, `hostname`, `mac` or `ip`.
    pub fn name(&self) -> &'static str {
        match self {
            NodeIdSource::Explicit(_) => "explicit",
            NodeIdSource::HostOrdinal => "hostname",
            NodeIdSource::MacHash => "mac",
            NodeIdSource::Ip => "ip",
        }
    }
}

/// The ordinal at the end of a host name: `ids-7` → 7, `web-0.svc` → 0.
///
/// ```
/// assert_eq!(shardflake::node::host_ordinal("ids-7"), Ok(7));
/// ```
pub fn host_ordinal(hostname: &str) -> Result<u64, NodeIdError> {
    let short = hostname.split('.').next().unwrap_or(hostname);
    short
        .rsplit_once('-')
        .and_then(|(_, n)| n.parse().ok())
        .ok_or_else(|| NodeIdError::NoOrdinal(hostname.to_string()))
}

/// Java's `String.hashCode` of the MACs in upper-case hex, as the seed does.
pub fn mac_hash(macs: &[[u8; 6]]) -> Result<u32, NodeIdError> {
    if macs.is_empty() {
        return Err(NodeIdError::NoMacAddress);
    }
    let hex: String = macs.iter().flatten().map(|b| format!("{b:02X}")).collect();
    Ok(hex
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b))))
}

/// The low `bits` bits of an address.
pub fn ip_low_bits(ip: IpAddr, bits: u32) -> u64 {
    let value = match ip {
        IpAddr::V4(v4) => u64::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6) as u64,
    };
    value & mask(bits)
}

impl Layout {
    /// A node field's value from a source, checked or masked as the table in
    /// [`crate::node`] says.
    pub fn node_id(
        &self,
        field: &str,
        source: &NodeIdSource,
        hostname: &str,
        macs: &[[u8; 6]],
        ip: Option<IpAddr>,
    ) -> Result<u64, NodeIdError> {
        // An unknown field fails in `check` below.
        let width = self.field(field).map_or(64, |f| f.bits());
        let value = match source {
            NodeIdSource::Explicit(v) => *v,
            NodeIdSource::HostOrdinal => host_ordinal(hostname)?,
            NodeIdSource::MacHash => u64::from(mac_hash(macs)?) & mask(width),
            NodeIdSource::Ip => ip_low_bits(ip.ok_or(NodeIdError::NoIpAddress)?, width),
        };
        Ok(self.check(field, value)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;

    #[test]
    fn ordinals() {
        assert_eq!(host_ordinal("ids-7"), Ok(7));
        assert_eq!(host_ordinal("my-app-12.ids.default.svc"), Ok(12));
        assert!(matches!(
            host_ordinal("ids"),
            Err(NodeIdError::NoOrdinal(_))
        ));
        assert!(matches!(
            host_ordinal("ids-x"),
            Err(NodeIdError::NoOrdinal(_))
        ));
    }

    #[test]
    fn mac_hash_is_javas_string_hash() {
        // "AB" in Java: 'A' * 31 + 'B' = 65 * 31 + 66.
        let h = mac_hash(&[[0xAB, 0, 0, 0, 0, 0]]).unwrap();
        let java = "AB0000000000"
            .bytes()
            .fold(0i32, |h, b| h.wrapping_mul(31).wrapping_add(b as i32));
        assert_eq!(h, java as u32);
        assert_eq!(mac_hash(&[]), Err(NodeIdError::NoMacAddress));
    }

    #[test]
    fn sources_fit_the_field() {
        let l = preset::by_name("snowflake").unwrap();
        let mac = [[0x02, 0x42, 0xac, 0x11, 0x00, 0x02]];
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let id = |s: NodeIdSource, host: &str| l.node_id("node", &s, host, &mac, Some(ip));
        assert_eq!(id(NodeIdSource::Explicit(1023), ""), Ok(1023));
        assert!(matches!(
            id(NodeIdSource::Explicit(1024), ""),
            Err(NodeIdError::OutOfRange(_))
        ));
        assert_eq!(id(NodeIdSource::HostOrdinal, "ids-7"), Ok(7));
        assert!(matches!(
            id(NodeIdSource::HostOrdinal, "ids-4096"),
            Err(NodeIdError::OutOfRange(_))
        ));
        assert_eq!(id(NodeIdSource::Ip, ""), Ok((2 << 8 | 3) & 1023));
        assert!(id(NodeIdSource::MacHash, "").unwrap() <= 1023);
        assert!(matches!(
            id(NodeIdSource::Ip, "").and(l.node_id("node", &NodeIdSource::Ip, "", &mac, None)),
            Err(NodeIdError::NoIpAddress)
        ));
        assert!(matches!(
            l.node_id("shard", &NodeIdSource::Explicit(1), "", &mac, None),
            Err(NodeIdError::OutOfRange(_))
        ));
    }
}
