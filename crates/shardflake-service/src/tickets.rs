//! Ticket sequences in the service (`--tickets FILE`): the client made at
//! start, and, with `--etcd`, a high-water store in etcd next to the node
//! leases.
//!
//! Why etcd too: the peers' marks (`shardflake_tickets::PeersStore`) are
//! rolled back with the peers. A lone server restored from a backup takes
//! its own marks back with it; two servers restored from one night's
//! backups agree with each other. etcd is restored with neither, so a
//! server that comes back behind is refused whatever happened to the
//! ticket servers (issue: "keep each server's high-water somewhere that
//! survives that server: its peers, and etcd").

use std::sync::Arc;

use shardflake_tickets::etcd_marks::{EtcdAndPeers, EtcdHighWater};
use shardflake_tickets::{Config, HighWaterStore, PeersStore};

use crate::config::NodeSource;
use crate::etcd::EtcdError;

/// Where the service keeps the ticket servers' high-water marks: on the
/// peers, and in etcd as well when the node id comes from etcd. `shardflake
/// tickets check|repair --etcd` read the same.
pub fn high_water_store(
    config: &Config,
    node: &NodeSource,
) -> Result<Arc<dyn HighWaterStore>, EtcdError> {
    with_peers(PeersStore::new(config.clone()), node)
}

/// The same marks for the admin commands (`shardflake tickets
/// check|repair|reshape`): each peer given `admin_timeout_ms`, as every
/// admin statement is, not the clients' `marks_timeout_ms` (a peer slow
/// under load is waited for, not taken for absent).
pub fn admin_high_water_store(
    config: &Config,
    node: &NodeSource,
) -> Result<Arc<dyn HighWaterStore>, EtcdError> {
    let timeout = config.failover.admin_timeout();
    with_peers(PeersStore::with_timeout(config.clone(), timeout), node)
}

/// The stores the tickets file names (`[marks]`); when it names no etcd
/// and the node id comes from etcd, the service's etcd as well (every other
/// client of the file then writes no marks there: the service says so).
fn with_peers(peers: PeersStore, node: &NodeSource) -> Result<Arc<dyn HighWaterStore>, EtcdError> {
    let config = peers.config();
    Ok(match node {
        NodeSource::Etcd(cfg) if config.marks.etcd.is_empty() => {
            tracing::warn!(
                "the tickets file names no etcd for its marks ([marks] etcd): the service keeps them in its own etcd too, but `shardflake tickets next` and other clients of the file do not; name it in the file"
            );
            Arc::new(EtcdAndPeers {
                etcd: EtcdHighWater::new(crate::registry::etcd_client(cfg)?, cfg.prefix.clone()),
                peers,
            })
        }
        _ => shardflake_tickets::high_water::stores(peers),
    })
}
