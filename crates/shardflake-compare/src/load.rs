//! The insert phase both servers share: `clients` connections, each taking
//! batches of rows from one shared budget until the rows, the time or the
//! user (Ctrl-C) run out, checking every id it gets back for order.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::error::CompareError;
use crate::ids::ClientIds;
use crate::report::SchemeResult;
use crate::scheme::ServerKind;
use crate::{Options, Progress};

/// How long the generator alone is measured.
pub(crate) const GENERATOR_TIME: Duration = Duration::from_millis(500);

/// What one batch did.
#[derive(Debug, Default)]
pub(crate) struct Written {
    /// Rows the server stored (a duplicate key is skipped, not stored).
    pub inserted: u64,
    /// The ids, in the order this client got them (empty where the server
    /// made them and the scheme cannot return them).
    pub keys: Vec<u128>,
}

/// One connection's way of storing rows of a scheme.
pub(crate) trait Writer: Send + 'static {
    /// Inserts `n` rows.
    fn write(&mut self, n: usize) -> impl Future<Output = Result<Written, CompareError>> + Send;
    /// Takes `n` ids without storing them (ticket and segment schemes, to
    /// measure the generator alone); `None` where the database makes ids.
    fn take_ids(
        &mut self,
        n: usize,
    ) -> impl Future<Output = Option<Result<(), CompareError>>> + Send;
}

/// What the insert phase did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Loaded {
    pub attempted: u64,
    pub inserted: u64,
    pub seconds: f64,
    /// Ids not above the one before from the same connection.
    pub inversions: u64,
    /// Ids checked for order.
    pub ordered: u64,
}

pub(crate) struct Budget {
    pub rows: u64,
    pub batch: usize,
    pub within: Duration,
    pub cancel: Arc<AtomicBool>,
}

fn budget(opts: &Options, rows: u64) -> Budget {
    Budget {
        rows,
        batch: opts.batch,
        within: Duration::from_secs(opts.seconds),
        cancel: opts.cancel.clone(),
    }
}

/// The generator alone (in the client on one thread, or through the
/// writers from the ticket server), then the insert phase: fills `r` and
/// gives the writers back.
pub(crate) async fn generate_and_insert<W: Writer>(
    mut writers: Vec<W>,
    client_ids: Option<&Arc<ClientIds>>,
    kind: ServerKind,
    opts: &Options,
    progress: &Arc<dyn Progress>,
    r: &mut SchemeResult,
) -> Result<Vec<W>, CompareError> {
    let scheme = r.scheme;
    r.generator_ids_per_s = match client_ids {
        Some(ids) => {
            let ids = ids.clone();
            Some(
                tokio::task::spawn_blocking(move || ids.rate(scheme, GENERATOR_TIME))
                    .await
                    .map_err(|e| CompareError::Invalid(format!("generator thread: {e}")))??,
            )
        }
        None => {
            let (w, rate) =
                take_rate(writers, opts.rows.min(100_000), GENERATOR_TIME, opts.batch).await?;
            writers = w;
            rate
        }
    };
    progress.start(kind, &r.label, opts.rows);
    let (writers, loaded) = insert(writers, &budget(opts, opts.rows), progress).await?;
    r.rows = loaded.attempted;
    r.inserted = loaded.inserted;
    r.seconds = loaded.seconds;
    r.rows_per_s = loaded.inserted as f64 / loaded.seconds.max(1e-9);
    r.ordered = loaded.ordered;
    r.inversions = loaded.inversions;
    r.duplicates = loaded.attempted - loaded.inserted;
    Ok(writers)
}

/// The churn's second half: as many rows inserted as were deleted.
pub(crate) async fn reinsert<W: Writer>(
    writers: Vec<W>,
    deleted: u64,
    opts: &Options,
    progress: &Arc<dyn Progress>,
    r: &mut SchemeResult,
) -> Result<(), CompareError> {
    let (_writers, again) = insert(writers, &budget(opts, deleted), progress).await?;
    r.churned = again.inserted;
    r.duplicates += again.attempted - again.inserted;
    Ok(())
}

/// Runs every writer until the budget is spent; returns them for reuse.
pub(crate) async fn insert<W: Writer>(
    writers: Vec<W>,
    budget: &Budget,
    progress: &Arc<dyn Progress>,
) -> Result<(Vec<W>, Loaded), CompareError> {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + budget.within;
    let mut tasks = Vec::new();
    for mut w in writers {
        let (next, cancel, progress) = (next.clone(), budget.cancel.clone(), progress.clone());
        let (rows, batch) = (budget.rows, budget.batch as u64);
        tasks.push(tokio::spawn(async move {
            let mut done = Loaded::default();
            let mut last: Option<u128> = None;
            while Instant::now() < deadline && !cancel.load(Ordering::Relaxed) {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= rows {
                    break;
                }
                let n = batch.min(rows - first);
                let written = match w.write(n as usize).await {
                    Ok(written) => written,
                    Err(e) => return (w, Err(e)),
                };
                done.attempted += n;
                done.inserted += written.inserted;
                for k in written.keys {
                    if last.is_some_and(|l| k <= l) {
                        done.inversions += 1;
                    }
                    done.ordered += 1;
                    last = Some(k);
                }
                progress.rows(n);
            }
            (w, Ok(done))
        }));
    }
    let mut writers = Vec::new();
    let mut total = Loaded::default();
    let mut first_error = None;
    for t in tasks {
        let (w, done) = t
            .await
            .map_err(|e| CompareError::Invalid(format!("a writer panicked: {e}")))?;
        writers.push(w);
        match done {
            Ok(d) => {
                total.attempted += d.attempted;
                total.inserted += d.inserted;
                total.inversions += d.inversions;
                total.ordered += d.ordered;
            }
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    total.seconds = start.elapsed().as_secs_f64();
    match first_error {
        Some(e) => Err(e),
        None => Ok((writers, total)),
    }
}

/// Ids per second the writers take without storing them (all together),
/// for up to `max` ids or `within`; `None` where the database makes ids.
pub(crate) async fn take_rate<W: Writer>(
    writers: Vec<W>,
    max: u64,
    within: Duration,
    batch: usize,
) -> Result<(Vec<W>, Option<f64>), CompareError> {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + within;
    let mut tasks = Vec::new();
    for mut w in writers {
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut taken = 0u64;
            while Instant::now() < deadline {
                let first = next.fetch_add(batch as u64, Ordering::Relaxed);
                if first >= max {
                    break;
                }
                let n = (batch as u64).min(max - first) as usize;
                match w.take_ids(n).await {
                    None => return (w, Ok(None)),
                    Some(Err(e)) => return (w, Err(e)),
                    Some(Ok(())) => taken += n as u64,
                }
            }
            (w, Ok(Some(taken)))
        }));
    }
    let mut writers = Vec::new();
    let mut taken: Option<u64> = None;
    let mut first_error = None;
    for t in tasks {
        let (w, r) = t
            .await
            .map_err(|e| CompareError::Invalid(format!("a writer panicked: {e}")))?;
        writers.push(w);
        match r {
            Ok(Some(n)) => taken = Some(taken.unwrap_or(0) + n),
            Ok(None) => {}
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    Ok((writers, taken.map(|n| n as f64 / secs)))
}

/// Runs `fut`, failing with [`CompareError::Timeout`] after `limit`.
pub(crate) async fn bounded<T>(
    server: &'static str,
    what: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T, CompareError>>,
) -> Result<T, CompareError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(CompareError::Timeout {
            server,
            what: what.to_string(),
            after: limit,
        }),
    }
}
