//! `Maintenance.Status`: a member's revision and raft index, read together.
//!
//! etcd's snapshot restore (`etcdctl snapshot restore`, `etcdutl` in 3.5)
//! keeps the snapshot's revision but starts a new raft log, so from then on
//! the revision runs ahead of the raft index. A cluster that was never
//! restored cannot show that: every revision is made by one raft entry
//! ([`Status::restored`]).

use crate::connection::Client;
use crate::error::EtcdError;
use crate::{rpc, with_token};
use rpc::maintenance_client::MaintenanceClient;

/// What one member said of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The member's key-value store revision (read first).
    pub revision: i64,
    /// The member's raft committed index (read after the revision).
    pub raft_index: u64,
}

impl Status {
    /// Whether this cluster was restored from a snapshot at some time: its
    /// revision is past its raft index. Each revision is made by applying
    /// one raft entry, and a member reads its revision before its
    /// committed index, so a cluster that never restored has
    /// `revision <= raft_index + 1` (the first revision is 1).
    pub fn restored(&self) -> bool {
        self.revision
            > i64::try_from(self.raft_index)
                .unwrap_or(i64::MAX)
                .saturating_add(1)
    }

    /// Whether the cluster state `earlier` (an earlier [`Status`] of this
    /// cluster, recorded beside something written then) is in this one's
    /// past, with no restore between: the index did not go back, and no
    /// more revisions were made since than raft entries (a restore keeps a
    /// snapshot's revision under a new, shorter log).
    pub fn descends_from(&self, earlier: &Status) -> bool {
        let (Ok(now_index), Ok(then_index)) = (
            i64::try_from(self.raft_index),
            i64::try_from(earlier.raft_index),
        ) else {
            return false;
        };
        now_index >= then_index
            && self.revision.saturating_sub(earlier.revision)
                <= now_index.saturating_sub(then_index).saturating_add(1)
    }
}

impl Client {
    /// The status of the member that answers (`Maintenance.Status`).
    pub async fn status(&self) -> Result<Status, EtcdError> {
        let answer = self
            .call("Maintenance.Status", |ch, token| {
                let req = with_token(rpc::StatusRequest {}, token);
                async move { MaintenanceClient::new(ch).status(req).await }
            })
            .await?
            .into_inner();
        Ok(Status {
            revision: answer.header.map_or(0, |h| h.revision),
            raft_index: answer.raft_index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Status;

    fn at(revision: i64, raft_index: u64) -> Status {
        Status {
            revision,
            raft_index,
        }
    }

    #[test]
    fn a_revision_past_the_raft_index_is_a_restore() {
        // Measured on etcd 3.4.23: 200 puts, then restored from a snapshot
        // of them.
        assert!(!at(201, 205).restored());
        assert!(at(201, 4).restored());
        assert!(!at(1, 0).restored());
        assert!(!at(2, 1).restored());
        assert!(at(3, 1).restored());
    }

    #[test]
    fn a_status_descends_from_its_past_only_without_a_restore_between() {
        let then = at(201, 205);
        assert!(at(251, 255).descends_from(&then));
        assert!(at(251, 300).descends_from(&then));
        assert!(then.descends_from(&then));
        // Restored from a snapshot at revision 201: a new log from index 4.
        assert!(!at(221, 24).descends_from(&then));
        // ... even once the new log is longer than the old one was: a
        // stamp at (9000, 9002), a snapshot at revision 9100, restored,
        // then 10,000 writes.
        assert!(!at(19_100, 10_004).descends_from(&at(9_000, 9_002)));
        // More revisions than entries since: not this cluster's past.
        assert!(!at(300, 206).descends_from(&then));
    }
}
