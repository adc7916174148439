//! A server whose wall clock is stepped back 5 s while it runs (libfaketime,
//! `FAKETIME_TIMESTAMP_FILE` + `FAKETIME_NO_CACHE`): no duplicate, no id
//! out of order, and each rollback policy does what it says.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shardflake_testkit::{Etcd, Http, Serve, ServeOpts, error_code, id_of, metric};

use crate::shardflake_bin;

/// A server whose wall clock follows a libfaketime timestamp file (write
/// e.g. `-5s` into it to step the clock), with `args`; returns it and the file.
fn faked_with(args: &[&str]) -> anyhow::Result<(Serve, std::path::PathBuf)> {
    let libfaketime = shardflake_testkit::libfaketime()?;
    let dir = shardflake_testkit::tempdir()?;
    let stamp = dir.join("faketime");
    std::fs::write(&stamp, "+0s")?;
    let env = [
        ("LD_PRELOAD", libfaketime.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", stamp.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ];
    let s = Serve::start(
        shardflake_bin(),
        ServeOpts {
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            dir: Some(dir),
        },
    )?;
    Ok((s, stamp))
}

fn faked(policy: &str) -> anyhow::Result<(Serve, std::path::PathBuf)> {
    // The window must exceed how far `continue` may ride ahead.
    faked_with(&["--rollback", policy, "--workers", "1", "--window", "11s"])
}

/// Requests ids for `for_at_least` and until `until` holds; returns
/// (ids, refusal codes).
async fn load(
    c: &mut Http,
    for_at_least: Duration,
    until: impl Fn(&[u64], &[String]) -> bool,
) -> anyhow::Result<(Vec<u64>, Vec<String>)> {
    let started = Instant::now();
    let (mut ids, mut refused) = (Vec::new(), Vec::new());
    loop {
        let (st, body) = c.get("/v1/id").await?;
        if st == 200 {
            ids.push(id_of(&body)?);
        } else {
            refused.push(error_code(&body));
        }
        if started.elapsed() >= for_at_least && until(&ids, &refused) {
            return Ok((ids, refused));
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(30),
            "no progress in 30 s: {} ids, {} refused",
            ids.len(),
            refused.len()
        );
    }
}

fn assert_increasing(ids: &[u64]) {
    for w in ids.windows(2) {
        assert!(w[0] < w[1], "{} then {}", w[0], w[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_stepped_back_5s_no_duplicate_and_policy_followed() -> anyhow::Result<()> {
    let (err_srv, err_stamp) = faked("error")?;
    let (cont_srv, cont_stamp) = faked("continue:10s")?;
    err_srv.ready(Duration::from_secs(10)).await?;
    cont_srv.ready(Duration::from_secs(10)).await?;
    let (mut e, mut c) = (Http::new(&err_srv.http), Http::new(&cont_srv.http));
    let (mut err_ids, _) = load(&mut e, Duration::ZERO, |i, _| i.len() >= 200).await?;
    let (mut cont_ids, _) = load(&mut c, Duration::ZERO, |i, _| i.len() >= 200).await?;

    std::fs::write(&err_stamp, "-5s")?;
    std::fs::write(&cont_stamp, "-5s")?;
    let stepped = Instant::now();

    // `continue:10s`: rides through on the last tick, never refusing.
    let (ids, refused) = load(&mut c, Duration::from_secs(1), |i, _| i.len() >= 500).await?;
    assert!(refused.is_empty(), "{refused:?}");
    cont_ids.extend(ids);

    // Riding through shows as lead: ids stamped ~5 s ahead of the stepped clock.
    let (_, m) = c.get("/metrics").await?;
    let lead: f64 = m
        .lines()
        .find_map(|l| l.strip_prefix("shardflake_borrowed_lead_seconds "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(lead >= 3.0, "lead {lead}: {m}");
    // Readiness says so: a load balancer stops sending requests here.
    let (st, body) = e.get("/readyz").await?;
    assert_eq!(
        (st, error_code(&body).as_str()),
        (503, "clock_moved_backwards"),
        "{body}"
    );
    // `error`: refuses (503 clock_moved_backwards) until the clock has caught
    // up, then issues again, every id after the ones before the step.
    let (ids, refused) = load(&mut e, Duration::from_millis(500), |i, r| {
        !r.is_empty() && i.len() >= 50
    })
    .await?;
    assert!(
        refused.iter().all(|r| r == "clock_moved_backwards"),
        "{refused:?}"
    );
    assert!(refused.len() > 10, "refused while behind");
    let caught_up = stepped.elapsed();
    err_ids.extend(ids);
    assert!(
        caught_up >= Duration::from_secs(4),
        "issued again only once the clock caught up ({caught_up:?})"
    );

    for ids in [&err_ids, &cont_ids] {
        assert_increasing(ids);
    }
    let (st, body) = e.get("/readyz").await?;
    assert_eq!(st, 200, "ready again once the clock caught up: {body}");
    let (_, m) = e.get("/metrics").await?;
    assert!(
        !m.contains("shardflake_clock_rollback_refusals_total 0\n"),
        "{m}"
    );
    eprintln!(
        "error policy: issued again {caught_up:?} after the step; continue policy: {} ids, none refused",
        cont_ids.len()
    );
    Ok(())
}

/// The longest time any request of `path` took while `stop` was unset.
async fn slowest(
    addr: String,
    path: &'static str,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Duration> {
    let mut c = Http::new(&addr);
    let mut slowest = Duration::ZERO;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let (st, body) = c.get(path).await?;
        anyhow::ensure!(st == 200, "{path}: {st} {body}");
        slowest = slowest.max(started.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(slowest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_waits_never_hold_the_server() -> anyhow::Result<()> {
    // One worker thread: a request that slept on it would stall everything,
    // the lease keeper included.
    let etcd = Etcd::start(1)?;
    let urls = etcd.urls();
    let args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/t/waits",
        "--lease-ttl",
        "3s",
        "--rollback",
        "wait:5s",
        "--workers",
        "1",
    ];
    let (s, stamp) = tokio::task::block_in_place(|| faked_with(&args))?;
    s.ready(Duration::from_secs(15)).await?;
    let mut c = Http::new(&s.http);
    let before = id_of(&c.get("/v1/id").await?.1)?;
    let (_, m) = c.get("/metrics").await?;
    let renewals_before = metric(&m, "shardflake_lease_renewals_total").unwrap_or(0.0);

    // The clock 3 s back: every id and ObjectId request now waits ~2-3 s.
    std::fs::write(&stamp, "-3s")?;
    let stop = Arc::new(AtomicBool::new(false));
    let health = tokio::spawn(slowest(s.http.clone(), "/healthz", stop.clone()));
    let info = tokio::spawn(slowest(s.http.clone(), "/v1/info", stop.clone()));
    // Full rate: 32 connections, each waiting on the clock.
    let waiters: Vec<_> = (0..32)
        .map(|i| {
            let addr = s.http.clone();
            tokio::spawn(async move {
                let mut c = Http::new(&addr);
                let path = if i % 2 == 0 {
                    "/v1/id"
                } else {
                    "/v1/id?kind=objectid"
                };
                let mut answers = Vec::new();
                for _ in 0..2 {
                    answers.push(c.get(path).await?);
                }
                anyhow::Ok((path, answers))
            })
        })
        .collect();
    let mut ids = vec![before];
    for w in waiters {
        let (path, answers) = w.await??;
        for (st, body) in answers {
            assert_eq!(st, 200, "{path} waits out a 3 s step under wait:5s: {body}");
            if path == "/v1/id" {
                ids.push(id_of(&body)?);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (health, info) = (health.await??, info.await??);
    // Old: each request slept on the worker (2-3 s here); /healthz waited behind them.
    assert!(health < Duration::from_secs(1), "/healthz took {health:?}");
    assert!(info < Duration::from_secs(1), "/v1/info took {info:?}");
    let (_, m) = c.get("/metrics").await?;
    assert_eq!(
        metric(&m, "shardflake_lease_losses_total"),
        Some(0.0),
        "{m}"
    );
    assert!(
        metric(&m, "shardflake_lease_renewals_total").unwrap_or(0.0) > renewals_before,
        "the lease kept being renewed: {m}"
    );
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "no id twice");
    assert!(ids[0] == before, "every id after the one before the step");
    eprintln!("while requests waited on the clock: /healthz at most {health:?}, /v1/info {info:?}");
    Ok(())
}
