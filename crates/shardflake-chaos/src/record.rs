//! What the load connections record: every id returned, exactly and
//! compactly, per connection, in the order it arrived.
//!
//! Ids are kept as runs of consecutive values that share every field but the
//! sequence (same tick, same node): a run `(start, len)` stands for exactly
//! the ids `start..start + len`, so nothing is sampled or lost. A batch of
//! 100,000 snowflake ids is ~25 runs (4,096 ids per tick), a single id is a
//! run of one; 16 bytes a run, so billions of ids in batches fit in memory and
//! sort in seconds. Judging them is the checker's job (`check.rs`): this
//! module only writes down what came back and when.

use std::time::Instant;

/// The protocol a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// HTTP/1.1 keep-alive: `GET /v1/id`, `GET /v1/ids?count=N`.
    Http,
    /// gRPC over one HTTP/2 connection: `NextId`, `NextIds`.
    Grpc,
    /// A MariaDB connection: `INSERT ... RETURNING id` (ids made by the
    /// server's trigger).
    MariaDb,
    /// A PostgreSQL connection: `INSERT ... RETURNING id` (ids made by a
    /// shard's `next_id()`).
    Postgres,
    /// A ticket client (`shardflake-tickets`) over its own connections to
    /// the ticket servers.
    Tickets,
}

impl Protocol {
    /// Lower-case name for tables and error codes.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
            Protocol::MariaDb => "mariadb",
            Protocol::Postgres => "postgres",
            Protocol::Tickets => "tickets",
        }
    }
}

/// Consecutive ids `start..start + len` with the same tick and node fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The first id.
    pub start: u64,
    /// How many ids (at least 1).
    pub len: u32,
    /// When the answer holding `start` arrived, in ms since the load began.
    pub received_ms: u32,
}

impl Run {
    /// The last id of the run.
    pub fn last(&self) -> u64 {
        self.start + u64::from(self.len) - 1
    }
}

/// One TCP connection's answers, from connect to close.
#[derive(Debug)]
pub struct ConnLog {
    /// The node slot (0-based; the spare is the last slot).
    pub slot: usize,
    /// Which process of that slot answered (counts restarts).
    pub incarnation: u32,
    /// HTTP or gRPC.
    pub protocol: Protocol,
    /// Every id, as runs, in arrival order.
    pub runs: Vec<Run>,
    /// Number of ids in `runs`.
    pub ids: u64,
    /// The bits that must match for an id to extend a run: all but the sequence.
    same_mask: u64,
}

impl ConnLog {
    /// An empty log; `sequence_mask` covers the layout's sequence field.
    pub fn new(slot: usize, incarnation: u32, protocol: Protocol, sequence_mask: u64) -> Self {
        ConnLog {
            slot,
            incarnation,
            protocol,
            runs: Vec::new(),
            ids: 0,
            same_mask: !sequence_mask,
        }
    }

    /// Appends one answer's ids, received `received` after `load_start`.
    pub fn record(&mut self, ids: &[u64], received_ms: u32) {
        for &id in ids {
            if let Some(run) = self.runs.last_mut() {
                let next = run.start.wrapping_add(u64::from(run.len));
                if id == next
                    && id & self.same_mask == run.start & self.same_mask
                    && run.len < u32::MAX
                {
                    run.len += 1;
                    continue;
                }
            }
            self.runs.push(Run {
                start: id,
                len: 1,
                received_ms,
            });
        }
        self.ids += ids.len() as u64;
    }
}

/// Milliseconds from `start` to now, saturating (a run is far shorter than 49 days).
pub fn ms_since(start: Instant) -> u32 {
    u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_at_gaps_and_at_a_sequence_wrap() {
        // 4 sequence bits: ids 14, 15 share a tick; 16 is the next tick's first.
        let mut log = ConnLog::new(0, 0, Protocol::Http, 0xF);
        log.record(&[14, 15, 16, 17], 5);
        log.record(&[18], 6);
        log.record(&[30, 29], 7);
        assert_eq!(
            log.runs,
            vec![
                Run {
                    start: 14,
                    len: 2,
                    received_ms: 5
                },
                Run {
                    start: 16,
                    len: 3,
                    received_ms: 5
                },
                Run {
                    start: 30,
                    len: 1,
                    received_ms: 7
                },
                Run {
                    start: 29,
                    len: 1,
                    received_ms: 7
                },
            ]
        );
        assert_eq!(log.ids, 7);
        assert_eq!(log.runs[1].last(), 18);
    }
}
