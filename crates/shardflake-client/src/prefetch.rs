//! [`Prefetch`]: a buffer of ids fetched ahead in batches and handed out
//! locally.
//!
//! Background fetcher tasks keep *buffered + in flight* at or above the low
//! water mark, so while callers take ids more slowly than the nodes issue
//! them they never wait on the network; a call from the buffer is a mutex
//! lock and an index bump (tens of ns, see `docs/BENCHMARKS.md`).
//!
//! **What it costs.** An id's time field is the time its batch was fetched,
//! not the time it is handed out: a buffered id can be seconds (or, with a
//! slow consumer, much longer) older than the moment it is used. Ids from
//! two prefetching clients are therefore only roughly ordered: one client
//! may hand out an id stamped earlier than one the other handed out before
//! it. Ids still never repeat (each batch is a reservation on one node),
//! and ids buffered when a process exits are simply never used. Don't
//! prefetch when ids must sort by creation time across writers.
//!
//! **Order within one buffer.** With one fetcher (the default) the ids one
//! [`Prefetch`] hands out increase: batches arrive one after another, and
//! any id of a new batch not above the last id queued (possible after a
//! failover to a node whose clock is behind, or a tie on the same tick with
//! a lower node id) is dropped, never handed out. With several fetchers
//! (needed to get more than one node's cap, since each node issues at most
//! its layout's cap per second) batches from different nodes interleave:
//! ids increase within each batch only.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use shardflake::Id;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::client::Client;
use crate::error::ClientError;

/// How long a fetcher waits before retrying after every endpoint failed.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(100);

/// Settings for a [`Prefetch`]; see [`Client::prefetching`].
#[derive(Debug, Clone)]
pub struct PrefetchBuilder {
    client: Client,
    batch: u64,
    low_water: Option<u64>,
    fetchers: usize,
}

impl PrefetchBuilder {
    /// Fetch more once *buffered + in flight* drops below this many ids
    /// (default: `batch × fetchers`, so every fetcher stays busy while ids
    /// are taken faster than they arrive, and a full buffer holds about one
    /// batch per fetcher).
    pub fn low_water(mut self, ids: u64) -> Self {
        self.low_water = Some(ids);
        self
    }
    /// How many batches may be in flight at once (default 1). Fetcher `i`
    /// starts at endpoint `i` (then fails over), so with one fetcher per
    /// node every node works at once. Above 1, handed-out ids increase
    /// within each batch only (see the module docs).
    pub fn fetchers(mut self, fetchers: usize) -> Self {
        self.fetchers = fetchers;
        self
    }
    /// Starts the fetchers; must run inside a tokio runtime. They stop when
    /// the last handle to the [`Prefetch`] is dropped.
    pub fn start(self) -> Result<Prefetch, ClientError> {
        if self.batch == 0 {
            return Err(ClientError::InvalidConfig(
                "batch must be at least 1".into(),
            ));
        }
        if self.fetchers == 0 || self.fetchers > 1024 {
            return Err(ClientError::InvalidConfig(
                "fetchers must be from 1 to 1024".into(),
            ));
        }
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ClientError::InvalidConfig("Prefetch::start needs a tokio runtime".into())
        })?;
        let fetchers = self.fetchers;
        let low_water = self
            .low_water
            .unwrap_or_else(|| self.batch.saturating_mul(fetchers as u64));
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            data: Notify::new(),
            wake: (0..fetchers).map(|_| Notify::new()).collect(),
            batch: self.batch,
            low_water,
            ordered: fetchers == 1,
            wait: self.client.call_timeout() + RETRY_AFTER_ERROR,
        });
        let tasks = (0..fetchers)
            .map(|me| {
                let shared = Arc::clone(&shared);
                let client = self.client.clone();
                runtime.spawn(fetcher(shared, client, me))
            })
            .collect();
        Ok(Prefetch {
            shared,
            _tasks: Arc::new(Tasks(tasks)),
        })
    }
}

impl Client {
    /// A [`PrefetchBuilder`] fetching `batch` ids per request (up to the
    /// service's `--max-batch`).
    ///
    /// ```no_run
    /// use shardflake_client::Client;
    ///
    /// # async fn demo() -> Result<(), shardflake_client::ClientError> {
    /// let client = Client::builder()
    ///     .endpoints(["http://10.0.0.1:8080", "http://10.0.0.2:8080"])
    ///     .build()?;
    /// let ids = client.prefetching(10_000).start()?;
    /// let id = ids.next_id().await?; // waits only when the buffer is empty
    /// if let Some(id) = ids.try_next() {
    ///     // from the buffer, no await
    /// #   let _ = id;
    /// }
    /// # let _ = id;
    /// # Ok(()) }
    /// ```
    pub fn prefetching(&self, batch: u64) -> PrefetchBuilder {
        PrefetchBuilder {
            client: self.clone(),
            batch,
            low_water: None,
            fetchers: 1,
        }
    }
}

/// A buffer of prefetched ids, refilled in the background. Cheap to clone
/// (clones share the buffer); use from any number of tasks or threads.
#[derive(Debug, Clone)]
pub struct Prefetch {
    shared: Arc<Shared>,
    _tasks: Arc<Tasks>,
}

#[derive(Debug)]
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Ids arrived, or a fetch failed: wakes callers of `next_id`.
    data: Notify,
    /// One per fetcher: the buffer dropped below the low water mark.
    wake: Vec<Notify>,
    batch: u64,
    low_water: u64,
    ordered: bool,
    /// How long `next_id` waits for ids.
    wait: Duration,
}

#[derive(Debug, Default)]
struct State {
    /// The batch being handed out, from `pos`.
    cur: Vec<Id>,
    pos: usize,
    /// Batches waiting behind it.
    ready: VecDeque<Vec<Id>>,
    /// Ids in `cur[pos..]` and `ready`.
    buffered: u64,
    /// Ids asked for by fetches in flight.
    pending: u64,
    /// Fetchers parked until the buffer drops below the low water mark.
    idle: Vec<usize>,
    /// The last id queued (one fetcher: later ids must be above it).
    last: Option<Id>,
    /// The last fetch's error, until a fetch succeeds.
    error: Option<ClientError>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Prefetch {
    /// An id from the buffer, or `None` when it is empty (never waits).
    #[inline]
    pub fn try_next(&self) -> Option<Id> {
        let sh = &*self.shared;
        let mut s = sh.lock();
        let id = if let Some(&id) = s.cur.get(s.pos) {
            s.pos += 1;
            id
        } else {
            let next = s.ready.pop_front()?;
            let old = std::mem::replace(&mut s.cur, next);
            s.pos = 1;
            let id = s.cur[0];
            // Free the spent batch outside the lock.
            let wake = sh.take_ids(&mut s);
            drop(s);
            drop(old);
            sh.notify(wake);
            return Some(id);
        };
        let wake = sh.take_ids(&mut s);
        drop(s);
        sh.notify(wake);
        Some(id)
    }

    /// An id, waiting for the fetchers when the buffer is empty: at most
    /// the client's call timeout (then the fetch's error, or
    /// [`ClientError::Timeout`]).
    pub async fn next_id(&self) -> Result<Id, ClientError> {
        if let Some(id) = self.try_next() {
            return Ok(id);
        }
        let sh = &*self.shared;
        let deadline = tokio::time::Instant::now() + sh.wait;
        loop {
            let notified = sh.data.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(id) = self.try_next() {
                return Ok(id);
            }
            if let Some(e) = sh.lock().error.clone() {
                return Err(e);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(ClientError::Timeout(sh.wait));
            }
        }
    }

    /// A buffer holding `ids` (ascending) and no fetchers: once they are
    /// handed out, `try_next` gives `None` and `next_id`
    /// [`ClientError::Timeout`] at once. For tests, benchmarks, or ids
    /// obtained elsewhere.
    pub fn from_ids(ids: Vec<Id>) -> Prefetch {
        let shared = Shared {
            state: Mutex::new(State::default()),
            data: Notify::new(),
            wake: Vec::new(),
            batch: 0,
            low_water: 0,
            ordered: false,
            wait: Duration::ZERO,
        };
        {
            let mut s = shared.lock();
            shared.push(&mut s, ids);
        }
        Prefetch {
            shared: Arc::new(shared),
            _tasks: Arc::new(Tasks(Vec::new())),
        }
    }

    /// Ids in the buffer now.
    pub fn buffered(&self) -> u64 {
        self.shared.lock().buffered
    }
}

impl Shared {
    /// Counts one id taken; the fetcher to wake, if the buffer dropped below
    /// the low water mark and one is parked.
    #[inline]
    fn take_ids(&self, s: &mut State) -> Option<usize> {
        s.buffered -= 1;
        if s.buffered + s.pending < self.low_water {
            s.idle.pop()
        } else {
            None
        }
    }

    #[inline]
    fn notify(&self, wake: Option<usize>) {
        if let Some(i) = wake {
            self.wake[i].notify_one();
        }
    }

    /// Queues a fetched batch (ascending); with one fetcher, only the ids
    /// above the last one queued. Returns a spent batch to free outside the
    /// lock.
    fn push(&self, s: &mut State, mut ids: Vec<Id>) -> Vec<Id> {
        if self.ordered
            && let Some(last) = s.last
        {
            let cut = ids.partition_point(|&id| id <= last);
            if cut > 0 {
                ids.drain(..cut);
            }
        }
        let Some(&top) = ids.last() else {
            return Vec::new();
        };
        s.last = Some(s.last.map_or(top, |l| l.max(top)));
        s.buffered += ids.len() as u64;
        if s.pos >= s.cur.len() && s.ready.is_empty() {
            s.pos = 0;
            std::mem::replace(&mut s.cur, ids)
        } else {
            s.ready.push_back(ids);
            Vec::new()
        }
    }
}

async fn fetcher(shared: Arc<Shared>, client: Client, me: usize) {
    let start = me % client.endpoint_count();
    loop {
        let go = {
            let mut s = shared.lock();
            if s.buffered + s.pending < shared.low_water {
                s.pending += shared.batch;
                true
            } else {
                s.idle.push(me);
                false
            }
        };
        if !go {
            // A permit stored by notify_one before this await is not lost.
            shared.wake[me].notified().await;
            continue;
        }
        let answer = client.next_ids_from(Some(start), shared.batch).await;
        let failed = answer.is_err();
        let spent = {
            let mut s = shared.lock();
            s.pending -= shared.batch;
            match answer {
                Ok(ids) => {
                    s.error = None;
                    shared.push(&mut s, ids)
                }
                Err(e) => {
                    s.error = Some(e);
                    Vec::new()
                }
            }
        };
        drop(spent);
        shared.data.notify_waiters();
        if failed {
            tokio::time::sleep(RETRY_AFTER_ERROR).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(ordered: bool) -> Shared {
        Shared {
            state: Mutex::new(State::default()),
            data: Notify::new(),
            wake: vec![Notify::new()],
            batch: 4,
            low_water: 0,
            ordered,
            wait: Duration::from_secs(1),
        }
    }

    #[test]
    fn ordered_push_drops_ids_not_above_the_last() {
        let sh = shared(true);
        let mut s = sh.lock();
        sh.push(&mut s, vec![Id(10), Id(11), Id(12)]);
        sh.push(&mut s, vec![Id(5), Id(12), Id(13), Id(14)]);
        sh.push(&mut s, vec![Id(1), Id(2)]);
        assert_eq!(s.buffered, 5);
        assert_eq!(s.cur, vec![Id(10), Id(11), Id(12)]);
        assert_eq!(s.ready, VecDeque::from([vec![Id(13), Id(14)]]));
    }

    #[test]
    fn unordered_push_keeps_everything() {
        let sh = shared(false);
        let mut s = sh.lock();
        sh.push(&mut s, vec![Id(10), Id(11)]);
        sh.push(&mut s, vec![Id(5), Id(6)]);
        assert_eq!(s.buffered, 4);
    }

    #[test]
    fn start_needs_a_runtime_and_sane_settings() {
        let c = Client::builder()
            .endpoints(["127.0.0.1:1"])
            .build()
            .unwrap();
        assert!(matches!(
            c.prefetching(10).start(),
            Err(ClientError::InvalidConfig(_))
        ));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(c.prefetching(0).start().is_err());
            assert!(c.prefetching(10).fetchers(0).start().is_err());
            let p = c.prefetching(10).start().unwrap();
            assert_eq!(p.try_next(), None);
            // Nothing listens: the fetch's typed error reaches the caller.
            assert!(matches!(
                p.next_id().await,
                Err(ClientError::AllFailed { .. })
            ));
        });
    }
}
