//! `shardflake serve --etcd`: node ids leased from a real etcd, fenced.
//! Every test starts its own etcd (scripts/etcd.sh) and servers on free
//! ports, and kills them on drop. These need the process (signals to it,
//! libfaketime, its log lines); the rest run in-process
//! in `crates/shardflake-service/tests/it/serve_etcd.rs`.

use std::time::{Duration, Instant};

use shardflake_testkit::{
    Etcd, Http, Queued, Serve, ServeOpts, error_code, id_of, metric, snowflake_node, take_ids,
};

use crate::shardflake_bin;

fn node(etcd: &Etcd, prefix: &str, extra: &[&str]) -> anyhow::Result<Serve> {
    node_env(etcd, prefix, extra, &[])
}

/// A node with extra environment (libfaketime). Starting waits for the
/// process to print its ports: off the async workers.
fn node_env(
    etcd: &Etcd,
    prefix: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Serve> {
    let ttl = if extra.contains(&"--lease-ttl") {
        &[][..]
    } else {
        &["--lease-ttl", "3s"][..]
    };
    let mut args: Vec<String> = [
        "--etcd",
        &etcd.urls(),
        "--etcd-prefix",
        prefix,
        "--workers",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(ttl.iter().chain(extra).map(|s| s.to_string()));
    let opts = ServeOpts {
        args,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    tokio::task::block_in_place(|| Serve::start(shardflake_bin(), opts))
}

/// libfaketime setting this process's wall clock `offset` (e.g. "-10s")
/// from real time; `Instant` keeps running normally.
fn clock_offset(offset: &str) -> anyhow::Result<[(&'static str, String); 3]> {
    let libfaketime = shardflake_testkit::libfaketime()?;
    Ok([
        ("LD_PRELOAD", libfaketime.display().to_string()),
        ("FAKETIME", offset.into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ])
}

/// The Unix ms an id of a layout with `low_bits` below its time field was
/// stamped in, for an epoch.
fn id_ms(id: u64, low_bits: u32, epoch_ms: u64) -> u64 {
    (id >> low_bits) + epoch_ms
}

/// Waits (bounded) until etcd no longer has `key`.
async fn until_gone(etcd: &Etcd, key: &str, within: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if etcd.get(key).await?.is_none() {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < within,
            "{key} still there after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkilled_nodes_id_is_reclaimed_after_the_ttl_and_sorts_after() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let mut a = node(&etcd, "/t/kill", &[])?;
    assert_eq!(a.ready(Duration::from_secs(15)).await?, 0);
    let before = take_ids(&mut Http::new(&a.http), 500).await?;
    a.kill();
    let gone = until_gone(&etcd, "/t/kill/node/0", Duration::from_secs(10)).await?;
    eprintln!("node id 0 free {gone:?} after SIGKILL (TTL 2s)");
    // The new holder's clock is 10 s behind: elapsed time alone would give
    // it smaller ids. Only waiting out A's recorded high-water (hw/0, read
    // when taking the id) makes them sort after A's.
    let env = clock_offset("-10s")?;
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let b = node_env(&etcd, "/t/kill", &[], &env)?;
    assert_eq!(
        b.ready(Duration::from_secs(30)).await?,
        0,
        "the id is reclaimed"
    );
    let after = take_ids(&mut Http::new(&b.http), 500).await?;
    let max_before = *before.iter().max().unwrap();
    assert!(
        after[0] > max_before,
        "new holder's first id {} after the old holder's largest {max_before}",
        after[0]
    );
    assert!(after.windows(2).all(|w| w[0] < w[1]));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstopped_node_issues_nothing_with_its_old_id_after_waking() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let a = node(&etcd, "/t/stop", &[])?;
    assert_eq!(a.ready(Duration::from_secs(15)).await?, 0);
    let before = take_ids(&mut Http::new(&a.http), 200).await?;
    a.signal(libc::SIGSTOP);
    until_gone(&etcd, "/t/stop/node/0", Duration::from_secs(10)).await?;
    let b = node(&etcd, "/t/stop", &[])?;
    assert_eq!(
        b.ready(Duration::from_secs(15)).await?,
        0,
        "B takes the expired id"
    );
    let b_ids = take_ids(&mut Http::new(&b.http), 200).await?;
    assert!(b_ids[0] > *before.iter().max().unwrap());

    // Requests queued at A while it is stopped: connected and written (the
    // kernel buffers them), so A finds them the moment it wakes, before its
    // keeper has noticed anything: they meet the lease fence itself.
    let mut queued = Vec::new();
    for _ in 0..16 {
        queued.push(Queued::send(&a.http, "/v1/id").await?);
    }
    a.signal(libc::SIGCONT);
    let (mut refused, mut issued) = (0, 0);
    for q in queued {
        match q.response(Duration::from_secs(10)).await? {
            (200, body) => {
                let id = id_of(&body)?;
                assert_ne!(
                    snowflake_node(id),
                    0,
                    "A issued {id} with its old node id after waking"
                );
                issued += 1;
            }
            (st, body) => {
                assert_eq!((st, error_code(&body).as_str()), (503, "no_lease"));
                refused += 1;
            }
        }
    }
    // A re-leases another id (B holds 0).
    let new_id = a.ready(Duration::from_secs(20)).await?;
    assert_ne!(new_id, 0);
    let mut ca = Http::new(&a.http);
    assert!(
        take_ids(&mut ca, 20)
            .await?
            .iter()
            .all(|id| snowflake_node(*id) == new_id)
    );
    // Without the issuing path's fence check, queued requests served while
    // the keeper's first keep-alive round trip is in flight would carry node
    // id 0 (asserted above). Which refuses them first after SIGCONT, that
    // fence or the keeper withdrawing the identity, is up to the scheduler
    // (counted below, not asserted: it failed runs on a loaded machine).
    assert_eq!(refused + issued, 16);
    let (_, m) = ca.get("/metrics").await?;
    let fenced = metric(&m, "shardflake_refused_fenced_total").unwrap_or(0.0);
    eprintln!(
        "after SIGCONT: {refused} refused (503 no_lease, {fenced} by the fence), {issued} issued with node id {new_id}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_or_far_future_high_water_refuses_the_id() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    // Read as 0 (the old behaviour), "garbage" would let this node reissue
    // the old holder's ticks.
    seed_layout(&etcd, "/t/badhw").await?;
    etcd.put("/t/badhw/hw/0", "garbage").await?;
    let mut a = node(&etcd, "/t/badhw", &[])?;
    assert!(!a.exit(Duration::from_secs(20)).await?.success());
    assert!(
        a.stderr().contains("not a Unix ms high-water"),
        "{}",
        a.stderr()
    );
    assert_eq!(etcd.get("/t/badhw/node/0").await?, None, "id released");
    assert_eq!(etcd.get("/t/badhw/hw/0").await?.as_deref(), Some("garbage"));

    // A record an hour ahead: the id is skipped before anything is
    // written (caught: waiting for it, 503 for an hour while holding the
    // id; then: refusing to start although other ids were free), and the
    // node takes the next one. Another cluster: a fleet of /t/badhw's
    // layout is registered on this one.
    let etcd = Etcd::start(1)?;
    seed_layout(&etcd, "/t/ahead").await?;
    let hour_ahead = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?
        + Duration::from_secs(3600))
    .as_millis();
    etcd.put("/t/ahead/hw/0", &hour_ahead.to_string()).await?;
    let b = node(&etcd, "/t/ahead", &["--max-resume-wait", "5s"])?;
    assert_eq!(b.ready(Duration::from_secs(20)).await?, 1);
    assert!(b.stderr().contains("skipping node id 0"), "{}", b.stderr());
    assert_eq!(etcd.get("/t/ahead/node/0").await?, None, "id 0 not taken");
    assert_eq!(
        etcd.get("/t/ahead/hw/0").await?,
        Some(hour_ahead.to_string()),
        "its record not raised"
    );
    Ok(())
}

/// Starts and stops a node on `prefix` so that it holds a layout record
/// (a prefix with high-water records and no layout record is refused).
async fn seed_layout(etcd: &Etcd, prefix: &str) -> anyhow::Result<()> {
    let mut n = node(etcd, prefix, &[])?;
    n.ready(Duration::from_secs(20)).await?;
    n.signal(libc::SIGTERM);
    anyhow::ensure!(
        n.exit(Duration::from_secs(10)).await?.success(),
        "{}",
        n.stderr()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_the_first_acquisition_revokes_the_lease() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    // The previous holder's record is 8 s ahead: start holds id 0 and waits.
    seed_layout(&etcd, "/t/termstart").await?;
    let ahead = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?
        + Duration::from_secs(8))
    .as_millis();
    etcd.put("/t/termstart/hw/0", &ahead.to_string()).await?;
    let mut a = node(&etcd, "/t/termstart", &["--lease-ttl", "20s"])?;
    let started = Instant::now();
    while etcd.get("/t/termstart/node/0").await?.is_none() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(6),
            "id 0 never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.signal(libc::SIGTERM);
    assert!(
        a.exit(Duration::from_secs(10)).await?.success(),
        "{}",
        a.stderr()
    );
    // Caught: the start dropped mid-wait, its lease left to its 20 s TTL.
    until_gone(&etcd, "/t/termstart/node/0", Duration::from_secs(2)).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_long_batch_then_revokes_and_records() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    // 16 ids per ms: a batch of 64,000 waits ~4 s for its ticks, longer
    // than the lease fence lasts without renewals (TTL 3 s − 0.6 s margin).
    let epoch = 1_288_834_974_657u64;
    let spec = format!("slow: time 41 | node 10 | sequence 4 (epoch {epoch} ms)");
    let mut a = node(
        &etcd,
        "/t/term",
        &["--layout", &spec, "--max-batch", "64000"],
    )?;
    let node_id = a.ready(Duration::from_secs(15)).await?;
    let mut c = Http::new(&a.http);
    let (st, _) = c.get("/v1/id").await?; // the generator's state is now
    assert_eq!(st, 200);
    let addr = a.http.clone();
    let batch = tokio::spawn(async move {
        Http::new(&addr)
            .get("/v1/ids?count=64000&numbers=true")
            .await
    });
    // SIGTERM once the batch is being reserved (the server says so).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, m) = c.get("/metrics").await?;
        if metric(&m, "shardflake_batches_in_flight") == Some(1.0) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "batch never in flight: {m}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.signal(libc::SIGTERM);
    // Caught: keep-alives stopping at SIGTERM (the batch would end fenced,
    // 503, and the revoke would fail: exit 1).
    let (st, body) = batch.await??;
    assert_eq!(st, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let last = v["ids"]
        .as_array()
        .and_then(|ids| ids.last())
        .and_then(|id| id.as_u64())
        .ok_or_else(|| anyhow::anyhow!("no ids in {body}"))?;
    let status = a.exit(Duration::from_secs(20)).await?;
    assert!(status.success(), "{status}: {}", a.stderr());
    // Revoked, not left to expire.
    let prefix = "/t/term";
    assert_eq!(etcd.get(&format!("{prefix}/node/{node_id}")).await?, None);
    let hw: u64 = etcd
        .get(&format!("{prefix}/hw/{node_id}"))
        .await?
        .unwrap_or_default()
        .parse()?;
    let last_ms = id_ms(last, 14, epoch);
    assert!(hw >= last_ms, "hw {hw} below the last id's ms {last_ms}");
    Ok(())
}
