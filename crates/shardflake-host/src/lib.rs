//! Reads the facts about this host that node-id sources use.
//!
//! The core crate turns facts into node ids with pure functions
//! ([`shardflake::node`]); this crate does the I/O: the host name (as a
//! Kubernetes StatefulSet pod sees it), the MAC addresses of the network
//! interfaces (from `/sys/class/net`, as the seed's Java enumerates
//! `NetworkInterface`s) and the address the host would send from.

use std::fs;
use std::net::{IpAddr, UdpSocket};
use std::path::Path;

use shardflake::node::NodeIdSource;
use shardflake::{Layout, NodeIdError};

/// What this host reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInfo {
    /// The host name; empty when none can be read.
    pub hostname: String,
    /// MAC addresses of the non-loopback interfaces, in interface-name order.
    pub macs: Vec<[u8; 6]>,
    /// The address outgoing traffic would use, if any route exists.
    pub ip: Option<IpAddr>,
}

impl HostInfo {
    /// Reads the host.
    pub fn read() -> Self {
        HostInfo {
            hostname: hostname(),
            macs: mac_addresses(),
            ip: primary_ip(),
        }
    }

    /// The value of a layout's node field from `source`.
    ///
    /// ```
    /// use shardflake::{node::NodeIdSource, preset};
    /// use shardflake_host::HostInfo;
    ///
    /// let host = HostInfo { hostname: "ids-7".into(), macs: vec![], ip: None };
    /// let layout = preset::by_name("snowflake")?;
    /// assert_eq!(host.node_id(&layout, "node", &NodeIdSource::HostOrdinal)?, 7);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn node_id(
        &self,
        layout: &Layout,
        field: &str,
        source: &NodeIdSource,
    ) -> Result<u64, NodeIdError> {
        layout.node_id(field, source, &self.hostname, &self.macs, self.ip)
    }
}

/// The host name: `$HOSTNAME` when set (what a pod's environment says),
/// else the kernel's.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// MAC addresses of the non-loopback interfaces that have one.
pub fn mac_addresses() -> Vec<[u8; 6]> {
    mac_addresses_in(Path::new("/sys/class/net"))
}

/// MAC addresses under a `/sys/class/net`-shaped directory (one folder per
/// interface, each with an `address` file), in interface-name order; all-zero
/// addresses (loopback) and unreadable ones are left out.
pub fn mac_addresses_in(dir: &Path) -> Vec<[u8; 6]> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut named: Vec<(String, [u8; 6])> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = fs::read_to_string(e.path().join("address")).ok()?;
            Some((name, parse_mac(text.trim())?))
        })
        .filter(|(_, mac)| mac.iter().any(|&b| b != 0))
        .collect();
    named.sort();
    named.into_iter().map(|(_, mac)| mac).collect()
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The local address of a UDP socket "connected" to a private address:
/// connecting sends nothing, it only asks the kernel for a route.
pub fn primary_ip() -> Option<IpAddr> {
    let socket = UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("10.254.254.254:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_macs() {
        assert_eq!(
            parse_mac("02:42:ac:11:00:02"),
            Some([0x02, 0x42, 0xac, 0x11, 0x00, 0x02])
        );
        assert_eq!(parse_mac("02:42:ac:11:00"), None);
        assert_eq!(parse_mac("02:42:ac:11:00:02:03"), None);
        assert_eq!(parse_mac("zz:42:ac:11:00:02"), None);
    }

    #[test]
    fn reads_this_host() {
        let host = HostInfo::read();
        assert!(!host.hostname.is_empty());
    }

    #[test]
    fn macs_are_read_in_interface_order_without_loopback_or_garbage() {
        let dir = std::env::temp_dir().join(format!("shardflake-host-{}", std::process::id()));
        let iface = |name: &str, address: Option<&str>| {
            let d = dir.join(name);
            fs::create_dir_all(&d).unwrap();
            if let Some(a) = address {
                fs::write(d.join("address"), format!("{a}\n")).unwrap();
            }
        };
        iface("lo", Some("00:00:00:00:00:00"));
        iface("eth1", Some("02:00:00:00:00:02"));
        iface("eth0", Some("02:00:00:00:00:01"));
        iface("tun0", Some("not a mac"));
        iface("bond0", None);
        let macs = mac_addresses_in(&dir);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(macs, vec![[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]]);
        assert!(
            mac_addresses_in(&dir).is_empty(),
            "a missing directory is no MACs"
        );
    }
}
