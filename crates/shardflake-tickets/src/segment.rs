//! Segment mode (Meituan's Leaf-segment): a row per sequence on each server
//! holds the highest id that server has reserved (`max_id`); one round trip
//! reserves a block, the client serves it from memory, fetches the next in
//! the background once a share of the current one is used (double buffer:
//! `SegmentSequence`, which reserves through the failover loop,
//! `failover::Pool::reserve_block`), and doubles or halves the step to
//! keep a block lasting about `target_block_ms`.
//!
//! # Blocks of N servers never overlap
//!
//! The id space is cut into chunks of `C = chunk` ids: chunk `c` holds ids
//! `c·C + 1 ..= (c+1)·C`. With `N = increment`, the server of offset `o`
//! (1-based) owns the chunks `c ≡ o − 1 (mod N)` and nothing else, so the
//! ends of its chunks are the values `≡ o·C (mod N·C)`: its *lattice*.
//! Its row always holds a lattice value (starting at `(o − N)·C`, "chunk
//! −1"); a reservation of `m` chunks is
//!
//! ```sql
//! UPDATE shardflake_ticket_segments SET max_id = GREATEST(max_id, floor) + m·N·C …
//! ```
//!
//! with `floor` on the lattice too, so the row stays on it, and the block is
//! the `m` chunks of this server between the old and the new value: every
//! `N`-th chunk of `(old, new]`. Two servers' rows move on disjoint lattices,
//! so no chunk (hence no id) is ever reserved twice, at any step and any
//! number of clients. With `N = 1` this is Leaf's contiguous block.
//!
//! # Ids from one client increase
//!
//! A client asks for each new block with `floor` = the lattice point of the
//! server it asks whose next chunk starts above the end of the client's last
//! block ([`Lattice::row_above`]). Servers are asked in turn, and a server
//! that lags is pushed forward (its skipped chunks are never used: the cost
//! is ids, never uniqueness).
//!
//! # Rows and marks only go up
//!
//! On [`crate::TicketClient::shutdown`] the unused tail of each block is
//! skipped, never given back: every read of a row or mark (a checked
//! session, `check`) then stays a floor, so only a restore can put a row
//! below one (see `SegmentSequence::close`). Skipped ids are counted per server
//! ([`crate::ServerMetrics`]). The high-water of a server in segment mode
//! is the end of the last chunk the client entered.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

use crate::config::{Config, ServerConfig};
use crate::error::TicketError;
use crate::failover::Pool;

/// One server's lattice: where its row can be and which chunks it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lattice {
    offset: i128,
    n: i128,
    chunk: i128,
}

impl Lattice {
    /// The lattice of `server` under `config`.
    pub fn new(config: &Config, server: &ServerConfig) -> Lattice {
        Lattice {
            offset: server.offset as i128,
            n: config.increment as i128,
            chunk: config.segment.chunk as i128,
        }
    }

    /// Whether `row` is on this lattice (`≡ o·C (mod N·C)`): every row this
    /// server's reservations and raises leave is; another
    /// server's row is not (its table loaded from a peer's backup).
    pub fn holds(&self, row: i64) -> bool {
        (row as i128 - self.offset * self.chunk).rem_euclid(self.n * self.chunk) == 0
    }

    /// [`Lattice::holds`] as a refusal: blocks counted from a row off the
    /// lattice are another server's chunks.
    pub fn check_row(&self, server: &str, sequence: &str, row: i64) -> Result<(), TicketError> {
        if self.holds(row) {
            return Ok(());
        }
        Err(TicketError::misconfigured(
            server,
            format!(
                "the segment row of {sequence:?} is {row}, not on this server's lattice (≡ {} mod {}): the row is another server's (its segment table loaded from a peer's backup?), and blocks reserved from it would be that server's ids; run `shardflake tickets repair` to raise it onto this server's lattice past its marks",
                self.offset * self.chunk,
                self.n * self.chunk
            ),
        ))
    }

    /// `o·C mod N·C`: where this lattice's rows sit within a stride.
    pub fn residue(&self) -> i64 {
        (self.offset * self.chunk).rem_euclid(self.n * self.chunk) as i64
    }

    /// The row advances by this per chunk reserved: `N·C`.
    pub fn stride(&self) -> i64 {
        (self.n * self.chunk) as i64
    }

    /// The row's value before any reservation: the end of "chunk −1".
    fn base(&self) -> i128 {
        (self.offset - self.n) * self.chunk
    }

    /// The smallest row value on the lattice whose next chunk starts above
    /// `past`: reserving from it hands out only ids `> past`.
    pub fn row_above(&self, past: u64) -> i64 {
        let stride = self.n * self.chunk;
        let need = past as i128 - (self.n - 1) * self.chunk - self.base();
        let row = if need <= 0 {
            self.base()
        } else {
            self.base() + stride * ((need + stride - 1) / stride)
        };
        row.min(i64::MAX as i128) as i64
    }

    /// The row whose [`Lattice::counter_of_row`] is `counter` (rounded down
    /// to a row value is not needed: only used as a lower bound).
    pub fn row_of_counter(&self, counter: u64) -> i64 {
        (counter as i128 - (self.n - 1) * self.chunk).clamp(i64::MIN as i128, i64::MAX as i128)
            as i64
    }

    /// The largest id a row value may have handed out, as seen from outside:
    /// every later id of this server is above it.
    pub fn counter_of_row(&self, row: i64) -> u64 {
        (row as i128 + (self.n - 1) * self.chunk).clamp(0, u64::MAX as i128) as u64
    }
}

/// A reserved block: `chunks` chunks of one server, served in order.
#[derive(Debug)]
pub(crate) struct Block {
    /// The server it came from.
    pub server: usize,
    /// The row's value right after the reservation.
    pub row: i64,
    chunks: i64,
    chunk: i64,
    stride: i64,
    /// Index of the chunk after the current one.
    next_chunk: i64,
    next_id: i64,
    chunk_end: i64,
    /// End of the chunk the last id handed out came from.
    last_used_chunk_end: Option<i64>,
    max_id: i64,
    /// Ids in the block.
    pub size: u64,
    /// Ids handed out from it.
    pub taken: u64,
}

/// What [`Block::take`] gives.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// An id, and the end of its chunk when it is the first of that chunk.
    Id(u64, Option<i64>),
    /// The block is used up.
    Empty,
    /// The next id would be above the sequence's maximum.
    Exhausted,
}

impl Block {
    pub fn new(server: usize, row: i64, chunks: i64, lattice: Lattice, max_id: u64) -> Block {
        let stride = lattice.stride();
        let chunk = lattice.chunk as i64;
        let first_end = row - (chunks - 1) * stride;
        Block {
            server,
            row,
            chunks,
            chunk,
            stride,
            next_chunk: 1,
            next_id: first_end - chunk + 1,
            chunk_end: first_end,
            last_used_chunk_end: None,
            max_id: max_id.min(i64::MAX as u64) as i64,
            size: (chunks * chunk) as u64,
            taken: 0,
        }
    }

    /// The next id.
    pub fn take(&mut self) -> Take {
        if self.next_id > self.chunk_end {
            if self.next_chunk >= self.chunks {
                return Take::Empty;
            }
            self.chunk_end = self.row - (self.chunks - 1 - self.next_chunk) * self.stride;
            self.next_id = self.chunk_end - self.chunk + 1;
            self.next_chunk += 1;
        }
        if self.next_id > self.max_id {
            return Take::Exhausted;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.taken += 1;
        let entered = (self.last_used_chunk_end != Some(self.chunk_end)).then_some(self.chunk_end);
        self.last_used_chunk_end = Some(self.chunk_end);
        Take::Id(id as u64, entered)
    }

    /// The end of the block's last chunk: every id in it is at or below.
    pub fn end(&self) -> u64 {
        self.row.max(0) as u64
    }

    /// Share of the block handed out.
    pub fn used_share(&self) -> f64 {
        self.taken as f64 / self.size as f64
    }
}

/// The double buffer of one segment sequence.
#[derive(Debug, Default)]
struct Buffers {
    current: Option<Block>,
    next: Option<Block>,
    /// A background fetch is under way.
    fetching: bool,
    /// The last fetch failed: the next caller that finds no block gets it.
    failure: Option<TicketError>,
    /// Chunks per block now (adapted between the bounds).
    chunks: i64,
    last_fetch: Option<Instant>,
    /// The end of the latest block fetched: the next is above it.
    floor: u64,
    /// Shut down: no more fetches.
    closed: bool,
}

/// One segment sequence in a client: its double buffer, filled from the
/// servers of `pool` in the background.
pub(crate) struct SegmentSequence {
    pool: Arc<Pool>,
    /// The sequence's index in the file.
    index: usize,
    buffers: Mutex<Buffers>,
    /// Woken when a fetch ends.
    fetched: Notify,
}

impl SegmentSequence {
    pub fn new(pool: Arc<Pool>, index: usize) -> SegmentSequence {
        let config = &pool.config;
        let buffers = Buffers {
            chunks: (config.segment.min_step / config.segment.chunk) as i64,
            floor: config.sequences[index].start.saturating_sub(1),
            ..Buffers::default()
        };
        SegmentSequence {
            pool,
            index,
            buffers: Mutex::new(buffers),
            fetched: Notify::new(),
        }
    }

    /// `count` ids, in increasing order.
    pub async fn take(self: &Arc<Self>, count: usize) -> Result<Vec<u64>, TicketError> {
        let config = &self.pool.config;
        let seq = &config.sequences[self.index];
        // Served from memory, a call completes without awaiting anything:
        // spend tokio's cooperative budget so that a caller in a loop still
        // lets the fetches, timers and other tasks on its worker run.
        tokio::task::consume_budget().await;
        let deadline = Instant::now() + config.failover.timeout();
        let mut ids = Vec::with_capacity(count);
        loop {
            let notified = self.fetched.notified();
            {
                let mut b = self
                    .buffers
                    .lock()
                    .map_err(|_| TicketError::db("*", "segment", "poisoned lock"))?;
                if b.closed {
                    return Err(TicketError::Unavailable {
                        sequence: seq.name.clone(),
                        failures: vec![],
                    });
                }
                loop {
                    if let Some(block) = b.current.as_mut() {
                        while ids.len() < count {
                            match block.take() {
                                Take::Id(id, _) => ids.push(id),
                                Take::Empty => break,
                                Take::Exhausted => {
                                    return Err(TicketError::Exhausted {
                                        sequence: seq.name.clone(),
                                        max: seq.max_id(),
                                    });
                                }
                            }
                        }
                        // `prefetch_at` 1 ([`Config::for_one_shot`]): none
                        // ahead, a block is fetched once one is used up.
                        let at = config.segment.prefetch_at;
                        let prefetch = at < 1.0 && block.used_share() >= at;
                        if prefetch && b.next.is_none() && !b.fetching {
                            self.start_fetch(&mut b);
                        }
                    }
                    if ids.len() == count {
                        return Ok(ids);
                    }
                    // The current block is used up.
                    if let Some(next) = b.next.take() {
                        b.current = Some(next);
                        continue;
                    }
                    if let Some(e) = b.failure.take() {
                        return Err(e);
                    }
                    if !b.fetching {
                        self.start_fetch(&mut b);
                    }
                    break;
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, notified).await.is_err() {
                return Err(TicketError::Unavailable {
                    sequence: seq.name.clone(),
                    failures: vec![],
                });
            }
        }
    }

    /// Starts a background reservation of the next block.
    fn start_fetch(self: &Arc<Self>, b: &mut Buffers) {
        b.fetching = true;
        let now = Instant::now();
        b.chunks = adapt(&self.pool.config, b.chunks, b.last_fetch.map(|t| now - t));
        b.last_fetch = Some(now);
        let (chunks, floor) = (b.chunks, b.floor);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let result = this.pool.reserve_block(this.index, chunks, floor).await;
            if let Ok(mut b) = this.buffers.lock() {
                b.fetching = false;
                match result {
                    Ok(block) => {
                        b.floor = b.floor.max(block.end());
                        if b.current.is_none() {
                            b.current = Some(block);
                        } else {
                            b.next = Some(block);
                        }
                    }
                    Err(e) => b.failure = Some(e),
                }
            }
            this.fetched.notify_waiters();
        });
    }

    /// Stops fetching (later takes fail with `unavailable`): the ids of the
    /// blocks held back that were never handed out, skipped.
    ///
    /// A tail is never given back. Lowering a row takes it below what
    /// another client may have read meanwhile (its checked session reads
    /// every row and mark): that client holds the read as a floor and
    /// writes it again as a mark, and its next reservation and `check`
    /// then say the server went back, with nothing restored. Rows and
    /// marks only going up, any read of them stays a floor, and a real
    /// restore is still told apart.
    pub async fn close(&self) -> u64 {
        // A fetch under way lands in `next` first, to be counted too.
        let deadline = Instant::now() + self.pool.config.failover.timeout();
        let (current, next) = loop {
            let fetched = self.fetched.notified();
            {
                let Ok(mut b) = self.buffers.lock() else {
                    break (None, None);
                };
                b.closed = true;
                if !b.fetching || Instant::now() >= deadline {
                    break (b.current.take(), b.next.take());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(left, fetched).await;
        };
        let mut skipped = 0;
        for block in [next, current].into_iter().flatten() {
            let unused = block.size - block.taken;
            skipped += unused;
            self.pool.servers[block.server]
                .skipped
                .fetch_add(unused, Ordering::Relaxed);
        }
        skipped
    }
}

/// The next step, in chunks: doubled when the last block went faster than
/// half the target, halved when slower than twice it.
pub(crate) fn adapt(config: &Config, chunks: i64, since_last: Option<std::time::Duration>) -> i64 {
    let min = (config.segment.min_step / config.segment.chunk) as i64;
    let max = (config.segment.max_step / config.segment.chunk) as i64;
    let target = config.segment.target_block_ms as u128;
    let next = match since_last {
        Some(d) if d.as_millis() * 2 < target => chunks * 2,
        Some(d) if d.as_millis() > target * 2 => chunks / 2,
        _ => chunks,
    };
    next.clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn lattice(offset: i128, n: i128, chunk: i128) -> Lattice {
        Lattice { offset, n, chunk }
    }

    fn drain(b: &mut Block) -> Vec<u64> {
        let mut ids = Vec::new();
        while let Take::Id(id, _) = b.take() {
            ids.push(id);
        }
        ids
    }

    #[test]
    fn row_above_lands_on_the_lattice_with_every_id_above() {
        let l = lattice(1, 2, 10);
        assert_eq!(l.base(), -10);
        assert_eq!(l.row_above(0), -10);
        assert_eq!(l.row_above(20), 10); // next chunk 21..=30
        assert_eq!(l.row_above(25), 30); // next chunk 41..=50
        let l2 = lattice(2, 2, 10);
        assert_eq!(l2.row_above(0), 0); // first chunk 11..=20
        for past in 0..200u64 {
            for l in [l, l2, lattice(3, 3, 7)] {
                let row = l.row_above(past) as i128;
                assert_eq!((row - l.offset * l.chunk).rem_euclid(l.n * l.chunk), 0);
                let next_start = row + l.n * l.chunk - l.chunk + 1;
                assert!(next_start > past as i128);
                // The smallest such: one stride less would not do.
                assert!(row == l.base() || next_start - l.n * l.chunk <= past as i128);
                assert!(l.counter_of_row(row as i64) >= past);
            }
        }
    }

    #[test]
    fn blocks_of_two_servers_never_overlap() {
        let (a, b) = (lattice(1, 2, 10), lattice(2, 2, 10));
        let (mut row_a, mut row_b) = (a.base() as i64, b.base() as i64);
        let mut seen = HashSet::new();
        for chunks in [1, 3, 2, 5, 1] {
            row_a += chunks * a.stride();
            row_b += chunks * b.stride();
            for (row, l, s) in [(row_a, a, 0), (row_b, b, 1)] {
                let mut block = Block::new(s, row, chunks, l, u64::MAX);
                let ids = drain(&mut block);
                assert_eq!(ids.len() as u64, block.size);
                assert!(ids.windows(2).all(|w| w[0] < w[1]));
                for id in ids {
                    assert!(seen.insert(id), "id {id} twice");
                    let chunk = (id - 1) / 10;
                    assert_eq!(chunk % 2, s as u64, "id {id} in the other server's chunk");
                }
            }
        }
    }

    #[test]
    fn a_block_stops_at_the_maximum() {
        let l = lattice(1, 1, 10);
        let mut block = Block::new(0, 4_294_967_300, 1, l, 4_294_967_295);
        let ids = drain(&mut block);
        assert_eq!(ids, (4_294_967_291..=4_294_967_295).collect::<Vec<_>>());
        assert_eq!(block.take(), Take::Exhausted);
    }

    #[test]
    fn the_step_adapts_within_bounds() {
        let config = Config::parse(
            "[segment]\nchunk = 10\nmin_step = 10\nmax_step = 40\ntarget_block_ms = 1000\n[[servers]]\nname = \"a\"\nkind = \"mariadb\"\nurl = \"mysql://x\"\noffset = 1\n[[sequences]]\nname = \"s\"",
        )
        .unwrap();
        let fast = Some(std::time::Duration::from_millis(10));
        let slow = Some(std::time::Duration::from_millis(5000));
        assert_eq!(adapt(&config, 1, fast), 2);
        assert_eq!(adapt(&config, 4, fast), 4);
        assert_eq!(adapt(&config, 4, slow), 2);
        assert_eq!(adapt(&config, 1, slow), 1);
        assert_eq!(adapt(&config, 2, None), 2);
    }
}
