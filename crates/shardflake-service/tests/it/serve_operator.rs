//! What operators do to a running fleet (issue #29), in this process
//! (moved from the CLI crate's `serve_operator.rs`, which keeps what needs
//! the binary: restarts, kills, log lines, flags and environment): etcd
//! restored from a snapshot, a layout key deleted. Every id collected is
//! checked for duplicates, and what the service refuses is asserted by its
//! message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shardflake_service::config::{EtcdConfig, NodeSource, RawEtcd};
use shardflake_service::{Config, RawConfig};
use shardflake_testkit::{Etcd, Http, ids_until, no_duplicates};
use tokio::task::JoinHandle;

use crate::node::Node;

/// A leased node on `prefix` with a 3 s lease; `top`: top-level config
/// lines.
async fn leased(etcd: &Etcd, prefix: &str, top: &str) -> anyhow::Result<Node> {
    Node::start(&format!(
        "{top}\n[etcd]\nendpoints = {:?}\nprefix = {prefix:?}\nlease_ttl = \"3s\"",
        etcd.endpoints
    ))
    .await
}

/// The etcd place `prefix` as `shardflake fleet confirm` names it.
fn place(etcd: &Etcd, prefix: &str) -> anyhow::Result<EtcdConfig> {
    let raw = RawConfig {
        etcd: RawEtcd {
            endpoints: Some(etcd.endpoints.clone()),
            prefix: Some(prefix.to_string()),
            ..RawEtcd::default()
        },
        ..RawConfig::default()
    };
    match Config::load(raw)?.node {
        NodeSource::Etcd(cfg) => Ok(cfg),
        NodeSource::Static(_) => anyhow::bail!("no etcd endpoints"),
    }
}

/// Whether the node came up (`Ok(None)`) or exited refusing, with its
/// stderr; bounded.
async fn started_or_refused(s: &mut Node) -> anyhow::Result<Option<String>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut http = Http::new(&s.http);
    loop {
        if let Ok((200, _)) = http.get("/readyz").await {
            return Ok(None);
        }
        if s.exit(Duration::from_millis(1)).await.is_ok() {
            return Ok(Some(s.stderr()));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "neither ready nor exited: {}",
            s.stderr()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lets the loads run while `s` (started, refused or not) could issue: a
/// node that wrongly came up issues next to the others for `for_` first.
async fn run_beside(
    s: &mut Node,
    stop: &Arc<AtomicBool>,
    loads: &mut Vec<JoinHandle<Vec<u64>>>,
    for_: Duration,
) -> anyhow::Result<Option<String>> {
    let refused = started_or_refused(s).await?;
    if refused.is_none() {
        loads.push(ids_until(&s.http, stop));
        tokio::time::sleep(for_).await;
    }
    Ok(refused)
}

/// Reproduction 3, restored: etcd rolled back to a snapshot taken before
/// a node took its id; the node kept issuing while a new node took the
/// same id from the restored records. A new node without a state file is
/// refused until `fleet confirm`, then issues beside the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_restored_from_a_snapshot_does_not_repeat_ids() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = [tempfile::tempdir()?];
    // Takes after the restore wait out max_resume_wait for records not
    // taken since (each node's clock is this host's): 5 s, not a minute.
    let waits = "max_resume_wait = \"5s\"";
    // Some history first: a restored cluster shows its revision past its
    // raft index once the snapshot has more revisions than a new raft log
    // has entries (a few), so the restore is always seen.
    for i in 0..20 {
        etcd.etcdctl(&["put", &format!("/other/{i}"), "x"])?;
    }
    let a = leased(&etcd, "/rs", waits).await?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    let snapshot = d[0].path().join("snapshot.db");
    etcd.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    // After the snapshot: b takes id 1 and records its high-water.
    let b = leased(&etcd, "/rs", waits).await?;
    assert_eq!(b.ready(Duration::from_secs(20)).await?, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop), ids_until(&b.http, &stop)];
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| etcd.restore(&snapshot))?;
    // A new node: id 1 is free in the restored etcd, and has no record.
    // Without a state file of this place it cannot tell whether the
    // snapshot predates a fleet move, so it refuses until an operator
    // confirms the place.
    let mut c = leased(&etcd, "/rs", waits).await?;
    let refused = run_beside(&mut c, &stop, &mut loads, Duration::from_secs(3)).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("c took an id unconfirmed"))?;
    assert!(
        refused.contains("restored from a snapshot") && refused.contains("fleet confirm"),
        "{refused}"
    );
    shardflake_service::registry::confirm_place(&place(&etcd, "/rs")?).await?;
    // Confirmed: it takes an id beside a and b and repeats none of theirs.
    let mut c = leased(&etcd, "/rs", waits).await?;
    let refused = run_beside(&mut c, &stop, &mut loads, Duration::from_secs(3)).await?;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    assert!(refused.is_none(), "c refused after confirm: {refused:?}");
    Ok(())
}

/// Reproduction 4: `<prefix>/layout` deleted; a node with another layout
/// joined beside the running ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_layout_record_is_not_rewritten_by_another_layout() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let mut a = leased(&etcd, "/lay", "").await?;
    let b = leased(&etcd, "/lay", "").await?;
    a.ready(Duration::from_secs(20)).await?;
    b.ready(Duration::from_secs(20)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop), ids_until(&b.http, &stop)];
    etcd.etcdctl(&["del", "/lay/layout"])?;
    // Snowflake's fields with another epoch: the same bits mean other times.
    let other = "time 41 | node 10 | sequence 12 (epoch 1288834975657)";
    let mut c = leased(&etcd, "/lay", &format!("layout = {other:?}")).await?;
    let refused = run_beside(&mut c, &stop, &mut loads, Duration::from_secs(2)).await?;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("another layout joined"))?;
    assert!(refused.contains("no /lay/layout"), "{refused}");
    // The running nodes stop at their next record: their layout is gone.
    let status = a.exit(Duration::from_secs(15)).await?;
    assert!(!status.success());
    assert!(
        a.stderr().contains("etcdctl put /lay/layout"),
        "{}",
        a.stderr()
    );
    Ok(())
}
