//! `shardflake serve --etcd`: node ids leased from a real etcd, fenced.
//! Every test starts its own etcd (scripts/etcd.sh) and servers on free
//! ports, and kills them on drop.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shardflake_service::etcd::Client;
use shardflake_service::testkit::{
    Etcd, Http, Serve, ServeOpts, error_code, id_of, snowflake_node,
};

const BIN: &str = env!("CARGO_BIN_EXE_shardflake");

fn node(etcd: &Etcd, prefix: &str, extra: &[&str]) -> anyhow::Result<Serve> {
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
    Serve::start(
        BIN,
        ServeOpts {
            args,
            ..Default::default()
        },
    )
}

/// Waits (bounded) until etcd no longer has `key`.
async fn until_gone(etcd: &Etcd, key: &str, within: Duration) -> anyhow::Result<Duration> {
    let client = Client::new(&etcd.endpoints, Duration::from_secs(1));
    let started = Instant::now();
    loop {
        if client
            .range_prefix(key.as_bytes())
            .await?
            .iter()
            .all(|kv| kv.key != key.as_bytes())
        {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < within,
            "{key} still there after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` ids; a 503 (fenced while etcd is slow on a loaded machine) is retried
/// for a bounded time: these tests check which ids come out, not uptime.
async fn take_ids(c: &mut Http, n: usize) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        let (st, body) = c.get("/v1/id").await?;
        match st {
            200 => out.push(id_of(&body)?),
            503 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(20)).await,
            _ => anyhow::bail!("{st} {body}"),
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_get_distinct_ids_and_cluster_full_is_clear() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let a = node(&etcd, "/t/two", &[])?;
    let b = node(&etcd, "/t/two", &[])?;
    let (na, nb) = (
        a.ready(Duration::from_secs(15)).await?,
        b.ready(Duration::from_secs(15)).await?,
    );
    assert_ne!(na, nb);
    assert_eq!([na.min(nb), na.max(nb)], [0, 1], "lowest free ids");
    let mut ca = Http::new(&a.http);
    assert!(
        take_ids(&mut ca, 10)
            .await?
            .iter()
            .all(|id| snowflake_node(*id) == na)
    );

    // A 1-bit node field holds two nodes; the third is told why it cannot start.
    let spec = "tiny: time 41 | node 1 | sequence 12 (epoch 1288834974657 ms)";
    let _x = node(&etcd, "/t/tiny", &["--layout", spec])?;
    let _y = node(&etcd, "/t/tiny", &["--layout", spec])?;
    _x.ready(Duration::from_secs(15)).await?;
    _y.ready(Duration::from_secs(15)).await?;
    let mut z = node(&etcd, "/t/tiny", &["--layout", spec])?;
    let status = z.wait_exit(Duration::from_secs(20))?;
    assert!(!status.success());
    assert!(z.stderr().contains("cluster full"), "{}", z.stderr());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_nodes_started_together_get_distinct_ids_quickly() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let started = Instant::now();
    let mut nodes = Vec::new();
    for _ in 0..100 {
        nodes.push(node(
            &etcd,
            "/t/hundred",
            &["--lease-ttl", "10s", "--etcd-timeout", "2s"],
        )?);
    }
    let mut ids = HashSet::new();
    for n in &nodes {
        ids.insert(n.ready(Duration::from_secs(60)).await?);
    }
    let took = started.elapsed();
    assert_eq!(ids.len(), 100, "every node its own id");
    let highest = ids.iter().max().copied().unwrap_or(0);
    // Racing nodes spread over the lowest free ids (see lease::take_lowest).
    assert!(highest < 256, "ids stay low: highest {highest}");
    eprintln!("100 nodes ready with distinct ids (highest {highest}) in {took:?}");
    assert!(took < Duration::from_secs(60));
    Ok(())
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
    let b = node(&etcd, "/t/kill", &[])?;
    assert_eq!(
        b.ready(Duration::from_secs(15)).await?,
        0,
        "the id is reclaimed"
    );
    let after = take_ids(&mut Http::new(&b.http), 500).await?;
    let max_before = *before.iter().max().unwrap();
    assert!(
        after.iter().all(|id| *id > max_before),
        "new holder's ids sort after the old holder's"
    );
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

    // Requests queued at A while it is stopped, then A wakes.
    let mut clients = Vec::new();
    let done = Arc::new(AtomicBool::new(false));
    for _ in 0..4 {
        let (addr, done) = (a.http.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let mut c = Http::new(&addr);
            let mut got = Vec::new();
            while !done.load(Ordering::Relaxed) {
                match c.get("/v1/id").await {
                    Ok((200, body)) => got.push(Ok(id_of(&body).unwrap())),
                    Ok((_, body)) => got.push(Err(error_code(&body))),
                    Err(e) => got.push(Err(e.to_string())),
                }
            }
            got
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.signal(libc::SIGCONT);
    // A re-leases another id (B holds 0); keep the load on until then.
    let new_id = a.ready(Duration::from_secs(20)).await?;
    assert_ne!(new_id, 0);
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(200) {
        tokio::task::yield_now().await;
    }
    done.store(true, Ordering::Relaxed);
    let mut refused = 0;
    let mut issued = 0;
    for c in clients {
        for r in c.await? {
            match r {
                Ok(id) => {
                    assert_ne!(
                        snowflake_node(id),
                        0,
                        "A issued {id} with its old node id after waking"
                    );
                    issued += 1;
                }
                Err(code) => {
                    assert_eq!(code, "no_lease");
                    refused += 1;
                }
            }
        }
    }
    assert!(refused > 0, "A refused while it held no id");
    eprintln!(
        "after SIGCONT: {refused} refused (503 no_lease), {issued} issued with node id {new_id}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_under_load_service_continues_without_duplicates() -> anyhow::Result<()>
{
    let etcd = Etcd::start(3)?;
    let n1 = node(
        &etcd,
        "/t/leader",
        &["--lease-ttl", "6s", "--etcd-timeout", "300ms"],
    )?;
    let n2 = node(
        &etcd,
        "/t/leader",
        &["--lease-ttl", "6s", "--etcd-timeout", "300ms"],
    )?;
    n1.ready(Duration::from_secs(15)).await?;
    n2.ready(Duration::from_secs(15)).await?;
    let done = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for addr in [&n1.http, &n2.http, &n1.http, &n2.http] {
        let (addr, done) = (addr.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = Http::new(&addr);
            let mut got = Vec::new();
            let mut errors = 0u64;
            while !done.load(Ordering::Relaxed) {
                match c.get("/v1/id").await {
                    Ok((200, body)) => got.push((Instant::now(), id_of(&body).unwrap())),
                    _ => errors += 1,
                }
            }
            (got, errors)
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let leader = etcd.leader()?;
    let killed_at = Instant::now();
    etcd.kill(leader)?;
    // Bounded: wait for a new leader, then keep the load on a little longer.
    let deadline = Instant::now() + Duration::from_secs(20);
    while etcd.leader().is_err() {
        anyhow::ensure!(Instant::now() < deadline, "no new etcd leader");
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    done.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    let mut after_kill = 0;
    let mut errors = 0;
    for t in tasks {
        let (got, e) = t.await?;
        errors += e;
        for (at, id) in got {
            after_kill += usize::from(at > killed_at + Duration::from_secs(2));
            all.push(id);
        }
    }
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "duplicates");
    assert!(
        after_kill > 100,
        "service continued after the leader was killed ({after_kill} ids)"
    );
    eprintln!(
        "{n} ids, {after_kill} more than 2 s after killing etcd leader m{leader}, {errors} refused"
    );
    n1.ready(Duration::from_secs(1)).await?;
    n2.ready(Duration::from_secs(1)).await?;
    Ok(())
}
