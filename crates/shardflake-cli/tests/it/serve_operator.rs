//! What operators do to a running fleet (issue #29): another prefix or etcd
//! cluster, static ids moved to etcd, records deleted, a high-water far
//! ahead, a lost holder whose clock ran ahead forgotten by an etcd restore,
//! options that mean "static node 0", and static nodes restarted
//! with another layout, another node's state file or none. Real processes
//! (restarts, kills, their log lines, flags and environment) and etcd; an
//! etcd restored from a snapshot and a deleted layout key run in-process in
//! `crates/shardflake-service/tests/it/serve_operator.rs`. every id collected is checked for
//! duplicates, and what the service refuses is asserted by its message.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shardflake_testkit::{
    Etcd, Http, Serve, ServeOpts, error_code, ids_until, no_duplicates, tempdir,
};
use tokio::task::JoinHandle;

use crate::shardflake_bin;

/// A `serve` with `args` in `dir` (its state file lives there across
/// restarts); starting waits for the ports line, off the async workers.
fn serve_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Serve> {
    let mut all = vec!["--workers", "1"];
    all.extend(args);
    let opts = ServeOpts {
        args: all.iter().map(|s| s.to_string()).collect(),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        dir: Some(dir.to_path_buf()),
    };
    tokio::task::block_in_place(|| Serve::start(shardflake_bin(), opts))
}

/// A leased node on `prefix` with a 3 s lease.
fn leased(etcd: &Etcd, prefix: &str, dir: &Path, extra: &[&str]) -> anyhow::Result<Serve> {
    let urls = etcd.urls();
    let mut args = vec![
        "--etcd",
        &urls,
        "--etcd-prefix",
        prefix,
        "--lease-ttl",
        "3s",
    ];
    args.extend(extra);
    serve_in(dir, &args, &[])
}

/// Whether the node came up (`Ok(None)`) or exited refusing, with its
/// stderr; bounded.
async fn started_or_refused(s: &mut Serve) -> anyhow::Result<Option<String>> {
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

async fn stop_cleanly(s: &mut Serve) -> anyhow::Result<()> {
    s.signal(libc::SIGTERM);
    let status = s.exit(Duration::from_secs(15)).await?;
    anyhow::ensure!(status.success(), "{}", s.stderr());
    Ok(())
}

/// Lets the loads run while `s` (started, refused or not) could issue: a
/// node that wrongly came up issues next to the others for `for_` first.
async fn run_beside(
    s: &mut Serve,
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

fn dirs(n: usize) -> anyhow::Result<Vec<PathBuf>> {
    (0..n).map(|_| tempdir()).collect()
}

/// Reproduction 1: two of a fleet's nodes restarted under another prefix,
/// or against a new etcd cluster, took node ids still held by the nodes
/// that kept running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_under_another_prefix_or_cluster_is_refused() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let a = leased(&etcd, "/split", &d[0], &[])?;
    let mut b = leased(&etcd, "/split", &d[1], &[])?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    assert_eq!(b.ready(Duration::from_secs(20)).await?, 1);

    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop)];
    stop_cleanly(&mut b).await?;
    let mut moved = leased(&etcd, "/split2", &d[1], &[])?;
    let refused = run_beside(&mut moved, &stop, &mut loads, Duration::from_millis(1500)).await?;
    moved.kill();
    // A new, empty etcd cluster under the same prefix.
    let other = Etcd::start(1)?;
    let mut elsewhere = leased(&other, "/split", &d[1], &[])?;
    let refused_cluster = run_beside(
        &mut elsewhere,
        &stop,
        &mut loads,
        Duration::from_millis(1500),
    )
    .await?;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("started under /split2"))?;
    // Neither place holds the fleet id its state file names.
    assert!(
        refused.contains("etcd prefix /split2 holds no fleet id"),
        "{refused}"
    );
    let refused = refused_cluster.ok_or_else(|| anyhow::anyhow!("started on a new cluster"))?;
    assert!(
        refused.contains("etcd prefix /split holds no fleet id"),
        "{refused}"
    );
    // The prefix shows at start and in /v1/info.
    let line = std::fs::read_to_string(a.dir.join("stdout.log"))?;
    assert!(line.contains("node=etcd:/split"), "{line}");
    let (_, info) = Http::new(&a.http).get("/v1/info").await?;
    assert!(info.contains(r#""etcd_prefix":"/split""#), "{info}");
    Ok(())
}

/// Nodes given different endpoint lists: the fleet's nodes list cluster
/// X's members, another node only cluster Y's. A node whose state file was
/// written on X is refused on Y (the test above), but a fresh node with a
/// fresh state file finds an empty prefix on Y and starts a fleet of its
/// own there, on node id 0 beside the fleet's node 0: nothing in Y knows
/// of X, and nothing in the node knew of its fleet. Given the fleet's id
/// (`--fleet`, `SHARDFLAKE_FLEET`), a node takes an id only where etcd
/// holds it: refused on Y without advice to put anything there, started
/// on X; a `--fleet` other than its state file's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_given_another_clusters_endpoints_is_refused_by_its_fleet_id()
-> anyhow::Result<()> {
    let x = Etcd::start(1)?;
    let y = Etcd::start(1)?;
    let d = dirs(3)?;
    let quick = ["--window", "1s", "--etcd-timeout", "300ms"];
    let first = leased(&x, "/apart", &d[0], &quick)?;
    assert_eq!(first.ready(Duration::from_secs(20)).await?, 0);
    let fleet = x
        .get("/apart/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id on X"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&first.http, &stop)];
    // Y's endpoints, the fleet's id, a fresh state file.
    let y_urls = y.urls();
    let mut args = vec![
        "--etcd",
        &y_urls,
        "--etcd-prefix",
        "/apart",
        "--lease-ttl",
        "3s",
    ];
    args.extend(quick);
    let mut on_y = serve_in(&d[1], &args, &[("SHARDFLAKE_FLEET", &fleet)])?;
    let refused_y = run_beside(&mut on_y, &stop, &mut loads, Duration::from_secs(2)).await?;
    on_y.kill();
    // X's endpoints and the fleet's id: it joins the fleet.
    let mut with_fleet = quick.to_vec();
    with_fleet.extend(["--fleet", &fleet]);
    let mut second = leased(&x, "/apart", &d[2], &with_fleet)?;
    let refused_x = run_beside(&mut second, &stop, &mut loads, Duration::from_millis(500)).await?;
    stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(loads).await?;
    let refused_y = refused_y
        .ok_or_else(|| anyhow::anyhow!("a node given the fleet's id started on another cluster"))?;
    assert!(
        refused_y.contains("holds no fleet id, and this node was started with --fleet")
            && refused_y.contains(&fleet)
            && !refused_y.contains("etcdctl put"),
        "{refused_y}"
    );
    assert_eq!(y.get("/apart/fleet").await?, None);
    // Started there again, it is refused the same way: the refusal left
    // no state file that would name the fleet as run there.
    let again = refused(&d[1], &args, &[("SHARDFLAKE_FLEET", &fleet)]).await?;
    assert!(
        again.contains("holds no fleet id, and this node was started with --fleet"),
        "{again}"
    );
    if let Some(e) = refused_x {
        anyhow::bail!("refused on its fleet's cluster: {e}");
    }
    eprintln!("{total} ids, no duplicate");
    // Its state file now names the fleet: another --fleet is refused.
    stop_cleanly(&mut second).await?;
    let other = "0123456789abcdef0123456789abcdef";
    let mut wrong = quick.to_vec();
    wrong.extend(["--fleet", other]);
    let urls = x.urls();
    let mut args = vec![
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/apart",
        "--lease-ttl",
        "3s",
    ];
    args.extend(wrong);
    let said = refused(&d[2], &args, &[]).await?;
    assert!(
        said.contains(&format!("--fleet {other}, but the state file"))
            && said.contains(&format!("records fleet {fleet}")),
        "{said}"
    );
    Ok(())
}

/// A snapshot of a fleet's first seconds, restored into a second etcd
/// cluster (its own name, peer URL and token: another cluster id) while
/// the fleet runs on the first. Such a young snapshot holds fewer
/// revisions than the restored cluster's new raft log has entries, so the
/// copy does not look restored: a fresh node there took node id 1 beside
/// the fleet's node 1 (936,000 of 12,002,000 ids twice). Now the fleet's
/// records name the cluster they were written in (`<prefix>/cluster`), and
/// a take in another is refused as a copy; the way out the refusal names,
/// a move on the copy raised as after a restore, works once the first
/// cluster no longer runs the fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_a_fleets_first_seconds_in_another_cluster_issues_no_id_twice()
-> anyhow::Result<()> {
    let x = Etcd::start(1)?;
    let y = Etcd::start(1)?;
    let d = dirs(5)?;
    let first = leased(&x, "/young", &d[0], &[])?;
    assert_eq!(first.ready(Duration::from_secs(20)).await?, 0);
    let snapshot = d[3].join("snapshot.db");
    x.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    let second = leased(&x, "/young", &d[1], &[])?;
    assert_eq!(second.ready(Duration::from_secs(20)).await?, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![
        ids_until(&first.http, &stop),
        ids_until(&second.http, &stop),
    ];
    tokio::task::block_in_place(|| y.restore(&snapshot))?;
    let x_id = x.client().range_header(b"/").await?.cluster_id;
    let y_id = y.client().range_header(b"/").await?.cluster_id;
    anyhow::ensure!(x_id != y_id, "the copy has the first cluster's id");
    let mut fresh = leased(&y, "/young", &d[2], &[])?;
    let refused = run_beside(&mut fresh, &stop, &mut loads, Duration::from_secs(4)).await?;
    fresh.kill();
    let Some(refused) = refused else {
        stop.store(true, Ordering::Relaxed);
        let checked = no_duplicates(loads).await;
        anyhow::bail!("a fresh node started on the copy: {checked:?}");
    };
    let copy = format!(
        "holds records written in etcd cluster={x_id:x} (its /young/cluster), but this is etcd cluster={y_id:x}: a copy"
    );
    assert!(
        refused.contains(&copy) && !refused.contains("fleet confirm"),
        "{refused}"
    );
    // Review J/J2, 5, 7/8: every other command that reads the place
    // runs the same check, the fleet still running on the first cluster.
    // `fleet confirm` said "etcd shows no restore" and confirmed it.
    let y_urls = y.urls();
    let (ok, said) = fleet_cmd("confirm", &["--etcd", &y_urls, "--etcd-prefix", "/young"])?;
    assert!(
        !ok && said.contains(&copy) && said.contains("nothing was confirmed"),
        "{said}"
    );
    // The node keys the copy brought back last their leases' TTL.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !y.client().range_prefix(b"/young/node/").await?.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "the copy's node keys stay");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `--previous-prefix` retired the copy's place and started a new
    // fleet issuing the first cluster's ids.
    let mut carried = leased(
        &y,
        "/young-b",
        &d[4],
        &["--previous-prefix", "/young", "--max-resume-wait", "3s"],
    )?;
    let refused = run_beside(&mut carried, &stop, &mut loads, Duration::from_secs(4)).await?;
    carried.kill();
    let Some(refused) = refused else {
        stop.store(true, Ordering::Relaxed);
        let checked = no_duplicates(loads).await;
        anyhow::bail!("--previous-prefix carried the copy: {checked:?}");
    };
    assert!(refused.contains(&copy), "{refused}");
    let mv = |raise: &str, gone: Option<&str>| -> anyhow::Result<(bool, String)> {
        let mut args = vec![
            "--etcd",
            &y_urls,
            "--etcd-prefix",
            "/young",
            "--to-prefix",
            "/young2",
            "--raise",
            raise,
            "--max-resume-wait",
            "3s",
        ];
        if let Some(gone) = gone {
            args.extend(["--copy-of-gone-cluster", gone]);
        }
        // The node key the copy brought back lasts its lease's TTL.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (ok, said) = fleet_move(&args)?;
            if ok || !said.contains("a node of the fleet") || Instant::now() > deadline {
                return Ok((ok, said));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // `fleet move` asked only for a larger --raise, then moved.
    let (ok, said) = mv("3s", None)?;
    let gone = format!("--copy-of-gone-cluster {x_id:x}");
    assert!(
        !ok && said.contains(&copy) && said.contains(&gone) && said.contains("nothing was moved"),
        "{said}"
    );
    stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(loads).await?;
    eprintln!("{total} ids, no duplicate");
    // The way out the refusal names, once the first cluster no longer
    // runs the fleet: a move on the copy naming that cluster gone, raised
    // as after a restore.
    let (mut first, mut second) = (first, second);
    first.kill();
    second.kill();
    let x_hex = format!("{x_id:x}");
    let (ok, said) = mv("2s", Some(&x_hex))?;
    assert!(!ok && said.contains("--raise at least"), "{said}");
    let (ok, said) = mv("3s", Some(&x_hex))?;
    assert!(ok, "{said}");
    assert_eq!(y.get("/young2/cluster").await?, Some(format!("{y_id:x}")));
    let moved = leased(&y, "/young2", &d[2], &["--max-resume-wait", "3s"])?;
    moved.ready(Duration::from_secs(30)).await?;
    Ok(())
}

/// Review E4 and E5: a snapshot of a fleet's first seconds restored into
/// another etcd cluster while the fleet runs on the first; on the copy the
/// operator deletes `<prefix>/cluster` by hand, and a fresh node there took
/// ids the fleet holds (118,000 of 2,642,000 twice); after `etcdctl del
/// --prefix` on the copy, the floor and fleet id put back as the refusal
/// advised gave 106,000 of 6,384,000 twice. Every record of the fleet now
/// names the cluster it was written in: whichever is deleted on the copy
/// (the cluster record, the stamps, the prefix, the registration), the
/// others still tell a copy, and a put-back place there is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_stays_a_copy_whatever_record_is_deleted_on_it() -> anyhow::Result<()> {
    let x = Etcd::start(1)?;
    let y = Etcd::start(1)?;
    let d = dirs(4)?;
    let first = leased(&x, "/e4", &d[0], &[])?;
    assert_eq!(first.ready(Duration::from_secs(20)).await?, 0);
    let snapshot = d[3].join("snapshot.db");
    x.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    let mut second = leased(&x, "/e4", &d[1], &[])?;
    assert_eq!(second.ready(Duration::from_secs(20)).await?, 1);
    let fleet = x
        .get("/e4/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let loads = vec![
        ids_until(&first.http, &stop),
        ids_until(&second.http, &stop),
    ];
    tokio::task::block_in_place(|| y.restore(&snapshot))?;
    let x_id = format!("{:x}", x.client().range_header(b"/").await?.cluster_id);
    let y_id = format!("{:x}", y.client().range_header(b"/").await?.cluster_id);
    anyhow::ensure!(x_id != y_id, "the copy has the first cluster's id");
    let mut copy = Copy {
        refusal: format!("holds records written in etcd cluster={x_id} ("),
        here: format!("but this is etcd cluster={y_id}: a copy"),
        stop: stop.clone(),
        loads,
    };
    // A node on the copy, given time to issue beside the fleet should it
    // start: refused as a copy, naming the record that tells it.
    let quick = ["--max-resume-wait", "3s"];
    let on_copy = |dir: &Path| leased(&y, "/e4", dir, &quick);
    // The cluster record deleted, then every take's stamp too.
    y.etcdctl(&["del", "/e4/cluster"])?;
    copy.refused(on_copy(&d[2])?, "del /e4/cluster", "(/e4/taken/0)")
        .await?;
    y.etcdctl(&["del", "--prefix", "/e4/taken/"])?;
    let registration = format!("(shardflake.fleets/{fleet})");
    copy.refused(on_copy(&d[2])?, "del --prefix /e4/taken/", &registration)
        .await?;
    // The whole prefix; then the floor and the fleet id put back, as an
    // earlier refusal advised.
    y.etcdctl(&["del", "--prefix", "/e4"])?;
    copy.refused(on_copy(&d[2])?, "del --prefix /e4", &registration)
        .await?;
    y.put("/e4/floor", &(now_ms()? + 6_000).to_string()).await?;
    y.put("/e4/fleet", &fleet).await?;
    copy.refused(
        on_copy(&d[2])?,
        "floor and fleet id put back",
        &registration,
    )
    .await?;
    // The registration deleted too: the fleet's own node, its state file
    // naming the first cluster, pointed at the copy.
    y.etcdctl(&["del", &format!("shardflake.fleets/{fleet}")])?;
    stop_cleanly(&mut second).await?;
    copy.refused(
        on_copy(&d[1])?,
        "the registration deleted, a node of the fleet",
        "(this node's state file)",
    )
    .await?;
    copy.stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(copy.loads).await?;
    eprintln!("{total} ids, no duplicate");
    Ok(())
}

/// Outside review, exp. 2b/3: a snapshot of a fleet's cluster restored
/// into a new cluster while the fleet runs; on the copy the operator
/// deleted `<prefix>/cluster`, the `taken/` stamps and the fleet's
/// registration, keeping its fleet id, layout and high-waters. A fresh
/// node there joined the fleet and wrote the registration with the copy's
/// cluster (4,000 of 1,236,000 ids twice); `--fleet` nodes, one with its
/// clock 10 s ahead, took the ids the fleet's nodes held (10,000 of
/// 3,443,000). A fleet id this cluster does not register is refused at
/// every take, the copy case first in the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_id_this_cluster_never_registered_is_refused() -> anyhow::Result<()> {
    let x = Etcd::start(1)?;
    let y = Etcd::start(1)?;
    let d = dirs(5)?;
    let first = leased(&x, "/e2b", &d[0], &[])?;
    assert_eq!(first.ready(Duration::from_secs(20)).await?, 0);
    let snapshot = d[3].join("snapshot.db");
    x.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    let mut second = leased(&x, "/e2b", &d[1], &[])?;
    assert_eq!(second.ready(Duration::from_secs(20)).await?, 1);
    let fleet = x
        .get("/e2b/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let loads = vec![
        ids_until(&first.http, &stop),
        ids_until(&second.http, &stop),
    ];
    tokio::task::block_in_place(|| y.restore(&snapshot))?;
    let y_id = format!("{:x}", y.client().range_header(b"/").await?.cluster_id);
    y.etcdctl(&["del", "/e2b/cluster"])?;
    y.etcdctl(&["del", "--prefix", "/e2b/taken/"])?;
    y.etcdctl(&["del", &format!("shardflake.fleets/{fleet}")])?;
    let mut copy = Copy {
        refusal: format!("holds fleet {fleet}, but this etcd cluster={y_id} does not register it"),
        here: "If this etcd was restored or copied from another etcd cluster".into(),
        stop: stop.clone(),
        loads,
    };
    let missing = format!("(shardflake.fleets/{fleet} is missing)");
    let urls = y.urls();
    let on_copy = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/e2b",
        "--lease-ttl",
        "3s",
    ];
    let fresh = serve_in(&d[2], &on_copy, &[])?;
    copy.refused(fresh, "a fresh node", &missing).await?;
    // A node given the fleet id, its clock 10 s ahead.
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+10s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let mut given = on_copy.to_vec();
    given.extend(["--fleet", &fleet]);
    let fleet_node = serve_in(&d[4], &given, &ahead)?;
    copy.refused(fleet_node, "a --fleet node", &missing).await?;
    anyhow::ensure!(
        y.get(&format!("shardflake.fleets/{fleet}"))
            .await?
            .is_none(),
        "a refused take registered the fleet on the copy"
    );
    // Exp. 4g: the prefix deleted too, and a node of the fleet whose state
    // file lost its path and registry lines: refused, the copy case first;
    // the floor and fleet id put back as its last words say: refused
    // still, as the cluster registers no such fleet.
    y.etcdctl(&["del", "--prefix", "/e2b"])?;
    stop_cleanly(&mut second).await?;
    let state = d[1].join("shardflake.state");
    let text = std::fs::read_to_string(&state)?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("registry ") && !l.starts_with("path "))
        .collect();
    std::fs::write(&state, kept.join("\n") + "\n")?;
    let mut own = serve_in(&d[1], &on_copy, &[])?;
    let refused = run_beside(
        &mut own,
        &copy.stop,
        &mut copy.loads,
        Duration::from_secs(4),
    )
    .await?;
    own.kill();
    let Some(refused) = refused else {
        copy.stop.store(true, Ordering::Relaxed);
        let checked = no_duplicates(std::mem::take(&mut copy.loads)).await;
        anyhow::bail!("a node of the fleet started on the emptied copy: {checked:?}");
    };
    let copy_case = refused.find("restored or copied from another etcd cluster");
    let put_back = refused.find("etcdctl put /e2b/floor");
    assert!(
        refused.contains("holds no fleet id") && copy_case.is_some() && copy_case < put_back,
        "{refused}"
    );
    y.put("/e2b/floor", &(now_ms()? + 4_000).to_string())
        .await?;
    y.put("/e2b/fleet", &fleet).await?;
    // In a directory of its own: a serve's stderr file keeps the earlier
    // refusal's words.
    std::fs::copy(&state, d[3].join("shardflake.state"))?;
    let own = serve_in(&d[3], &on_copy, &[])?;
    copy.refused(own, "the floor and fleet id put back", &missing)
        .await?;
    copy.stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(copy.loads).await?;
    eprintln!("{total} ids, no duplicate");
    Ok(())
}

/// The fleet's own cluster with only its registration deleted by hand:
/// a node without a state file is refused there as at a copy, and a node
/// of the fleet restarted with its own state file (naming this cluster
/// and prefix) takes its id and registers the fleet again, after which a
/// fresh node joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_registration_is_written_again_only_by_a_node_that_ran_there()
-> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    let mut node = leased(&etcd, "/reg", &d[0], &[])?;
    assert_eq!(node.ready(Duration::from_secs(20)).await?, 0);
    stop_cleanly(&mut node).await?;
    let fleet = etcd
        .get("/reg/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    let key = format!("shardflake.fleets/{fleet}");
    etcd.etcdctl(&["del", &key])?;
    let mut fresh = leased(&etcd, "/reg", &d[1], &[])?;
    let refused = started_or_refused(&mut fresh).await?;
    fresh.kill();
    let refused = refused.ok_or_else(|| anyhow::anyhow!("a fresh node joined"))?;
    assert!(refused.contains("does not register it"), "{refused}");
    // Review exp. 11: the way out gave this cluster's id as the registry
    // line to have, read as a line to write into a state file.
    assert!(
        refused.contains("never edited by hand")
            && refused.contains("names another etcd cluster than this one is refused here: that means this etcd is a copy")
            && !refused.contains("registry line naming etcd cluster="),
        "{refused}"
    );
    assert!(
        etcd.get(&key).await?.is_none(),
        "registered by a refused take"
    );
    let own = leased(&etcd, "/reg", &d[0], &[])?;
    own.ready(Duration::from_secs(20)).await?;
    assert!(etcd.get(&key).await?.is_some(), "not registered again");
    let joined = leased(&etcd, "/reg", &d[2], &[])?;
    assert_eq!(joined.ready(Duration::from_secs(20)).await?, 1);
    Ok(())
}

/// Outside review, exp. 22: a prefix holding a fleet's leftovers (its
/// layout and a high-water) but no fleet id, cluster record, stamps or
/// registration. A fresh node started a new fleet there, resuming past
/// the one high-water left. Refused now, the copy case first; the
/// fleet's own node, with its floor and fleet id put back as told, takes
/// its id and registers the fleet again; a prefix wiped entirely starts
/// a new fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_with_a_fleets_leftovers_but_no_fleet_id_starts_no_fleet() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    let mut node = leased(&etcd, "/lo", &d[0], &[])?;
    assert_eq!(node.ready(Duration::from_secs(20)).await?, 0);
    stop_cleanly(&mut node).await?;
    let fleet = etcd
        .get("/lo/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "/lo/cluster"])?;
    etcd.etcdctl(&["del", "--prefix", "/lo/taken/"])?;
    etcd.etcdctl(&["del", "/lo/fleet"])?;
    etcd.etcdctl(&["del", &format!("shardflake.fleets/{fleet}")])?;
    anyhow::ensure!(etcd.get("/lo/hw/0").await?.is_some(), "no high-water left");
    let mut fresh = leased(&etcd, "/lo", &d[1], &[])?;
    let refused = started_or_refused(&mut fresh).await?;
    fresh.kill();
    let refused = refused.ok_or_else(|| anyhow::anyhow!("a fresh node started a new fleet"))?;
    let copy_case = refused.find("restored or copied from another etcd cluster");
    let put_back = refused.find("etcdctl put /lo/floor");
    assert!(
        refused.contains("holds no fleet id, but it holds a fleet's records")
            && refused.contains("/lo/hw/0")
            && copy_case.is_some()
            && copy_case < put_back,
        "{refused}"
    );
    assert!(
        etcd.get("/lo/fleet").await?.is_none(),
        "a refused take wrote a fleet id"
    );
    // The way out on the fleet's own cluster: floor and fleet id put back.
    etcd.put("/lo/floor", &(now_ms()? + 2_000).to_string())
        .await?;
    etcd.put("/lo/fleet", &fleet).await?;
    let mut own = leased(&etcd, "/lo", &d[0], &[])?;
    assert_eq!(own.ready(Duration::from_secs(20)).await?, 0);
    stop_cleanly(&mut own).await?;
    assert!(
        etcd.get(&format!("shardflake.fleets/{fleet}"))
            .await?
            .is_some(),
        "not registered again"
    );
    // Still passes: a prefix with no records at all is a new fleet's.
    etcd.etcdctl(&["del", "--prefix", "/lo/"])?;
    etcd.etcdctl(&["del", &format!("shardflake.fleets/{fleet}")])?;
    let new = leased(&etcd, "/lo", &d[2], &[])?;
    assert_eq!(new.ready(Duration::from_secs(20)).await?, 0);
    Ok(())
}

/// Outside review, exp. 14: a copy of a fleet's cluster with only the
/// fleet's registration deleted (its prefix kept, its records naming the
/// first cluster). A fresh node on another prefix started a new fleet
/// beside the copied one, which runs on the first cluster: it is refused
/// as a copy now, whichever prefix it starts on. A cluster wiped
/// entirely is an empty cluster to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_fleet_on_another_prefix_of_a_copy_is_refused() -> anyhow::Result<()> {
    let x = Etcd::start(1)?;
    let y = Etcd::start(1)?;
    let d = dirs(4)?;
    let mut first = leased(&x, "/c14", &d[0], &[])?;
    assert_eq!(first.ready(Duration::from_secs(20)).await?, 0);
    let fleet = x
        .get("/c14/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    let snapshot = d[2].join("snapshot.db");
    x.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    tokio::task::block_in_place(|| y.restore(&snapshot))?;
    y.etcdctl(&["del", &format!("shardflake.fleets/{fleet}")])?;
    let x_id = format!("{:x}", x.client().range_header(b"/").await?.cluster_id);
    let mut fresh = leased(&y, "/other14", &d[1], &[])?;
    let refused = started_or_refused(&mut fresh).await?;
    fresh.kill();
    let refused = refused
        .ok_or_else(|| anyhow::anyhow!("a new fleet started on another prefix of a copy"))?;
    assert!(
        refused.contains(&format!(
            "etcd prefix /c14 holds records written in etcd cluster={x_id}"
        )),
        "{refused}"
    );
    anyhow::ensure!(
        y.get("/other14/fleet").await?.is_none(),
        "a refused take wrote a fleet id"
    );
    // Still passes: every record deleted, the copy is an empty cluster.
    // `fleet confirm` there says so, and writes nothing.
    y.etcdctl(&["del", "--prefix", ""])?;
    let (ok, said) = fleet_cmd("confirm", &["--etcd", &y.urls(), "--etcd-prefix", "/c14"])?;
    assert!(
        ok && said.contains("/c14: no fleet records here; nothing to confirm"),
        "{said}"
    );
    assert!(!said.contains("etcd shows no restore"), "{said}");
    anyhow::ensure!(
        y.get("/c14/confirmed").await?.is_none(),
        "confirm wrote on an empty prefix"
    );
    let mut new = leased(&y, "/other14", &d[3], &[])?;
    assert_eq!(new.ready(Duration::from_secs(20)).await?, 0);
    stop_cleanly(&mut new).await?;
    stop_cleanly(&mut first).await?;
    Ok(())
}

/// Outside review, exp. e1: a node waiting for its clock to pass the
/// high-water of a node id no holder ever recorded was told it waited
/// for the one "recorded for node id N by its previous holder". The wait
/// names what it waits for: here, one window past the clock, since the
/// id holds no record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_an_id_never_held_names_no_previous_holder() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(1)?;
    let mut node = leased(&etcd, "/words", &d[0], &[])?;
    assert_eq!(node.ready(Duration::from_secs(20)).await?, 0);
    stop_cleanly(&mut node).await?;
    let log = node.stderr();
    assert!(
        log.contains(
            "set one window past this clock for node id 0, which holds no high-water record here"
        ) && !log.contains("by its previous holder"),
        "{log}"
    );
    Ok(())
}

/// A fleet running on one cluster, and the nodes started on its copy.
struct Copy {
    /// The start of the refusal naming the first cluster.
    refusal: String,
    /// Its words naming the copy's.
    here: String,
    stop: Arc<AtomicBool>,
    loads: Vec<JoinHandle<Vec<u64>>>,
}

impl Copy {
    /// `node`, started on the copy after `what`, must be refused as a
    /// copy by `evidence`, with nothing to put back; one that starts
    /// issues beside the fleet for 4 s, then fails the test with the ids
    /// it made twice.
    async fn refused(&mut self, mut node: Serve, what: &str, evidence: &str) -> anyhow::Result<()> {
        let refused = run_beside(
            &mut node,
            &self.stop,
            &mut self.loads,
            Duration::from_secs(4),
        )
        .await?;
        node.kill();
        let Some(refused) = refused else {
            self.stop.store(true, Ordering::Relaxed);
            let checked = no_duplicates(std::mem::take(&mut self.loads)).await;
            anyhow::bail!("started on the copy after {what}: {checked:?}");
        };
        assert!(
            refused.contains(&self.refusal)
                && refused.contains(&self.here)
                && refused.contains(evidence)
                && !refused.contains("etcdctl put"),
            "after {what}: {refused}"
        );
        Ok(())
    }
}

/// Reproduction 2: static nodes 0, 1, 2; node 2 restarted with --etcd
/// took etcd node 0. Then the migration the docs give, both kinds issuing
/// throughout: each static node restarted with its --node-id and --etcd
/// (its id reserved in etcd, its marks brought along), then without
/// --node-id. A second node with a reserved id already held is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_nodes_move_to_etcd_while_both_kinds_issue() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let urls = etcd.urls();
    let d = dirs(4)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    let mut nodes = Vec::new();
    for (i, dir) in d.iter().take(3).enumerate() {
        let first_start = ["--node-id", &i.to_string(), "--resume-after", "now"];
        let s = serve_in(dir, &first_start, &[])?;
        assert_eq!(s.ready(Duration::from_secs(20)).await?, i as u64);
        loads.push(ids_until(&s.http, &stop));
        nodes.push(s);
    }
    let etcd_args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/mig",
        "--lease-ttl",
        "3s",
    ];

    // Node 2 restarted with --etcd alone, as the old deploy docs said.
    stop_cleanly(&mut nodes[2]).await?;
    let mut wrong = serve_in(&d[2], &etcd_args, &[])?;
    let refused = run_beside(&mut wrong, &stop, &mut loads, Duration::from_millis(1500)).await?;
    wrong.kill();
    let refused = match refused {
        Some(r) => r,
        None => {
            stop.store(true, Ordering::Relaxed);
            no_duplicates(loads).await?;
            anyhow::bail!("node 2 moved to etcd without its id")
        }
    };
    assert!(refused.contains("static node id 2"), "{refused}");

    // The migration: one node at a time, the others issuing.
    for i in [2usize, 0, 1] {
        if i != 2 {
            stop_cleanly(&mut nodes[i]).await?;
        }
        let id = i.to_string();
        let mut args = vec!["--node-id", id.as_str()];
        args.extend(etcd_args);
        let s = serve_in(&d[i], &args, &[])?;
        assert_eq!(s.ready(Duration::from_secs(20)).await?, i as u64);
        loads.push(ids_until(&s.http, &stop));
        nodes[i] = s;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Another node given --node-id 1 (a copied configuration): refused.
    let mut copy = serve_in(
        &d[3],
        &[
            "--node-id",
            "1",
            "--etcd",
            &urls,
            "--etcd-prefix",
            "/mig",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )?;
    let refused_copy =
        run_beside(&mut copy, &stop, &mut loads, Duration::from_millis(1000)).await?;
    copy.kill();
    // Last step: node 2 drops --node-id and takes the lowest free id.
    stop_cleanly(&mut nodes[2]).await?;
    let s = serve_in(&d[2], &etcd_args, &[])?;
    s.ready(Duration::from_secs(20)).await?;
    loads.push(ids_until(&s.http, &stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused = refused_copy.ok_or_else(|| anyhow::anyhow!("two nodes held node id 1"))?;
    assert!(refused.contains("node id 1 is held"), "{refused}");
    Ok(())
}

/// Reproduction 3 and review E13/E14: `etcdctl del --prefix` under load,
/// the holder's clock 8 s ahead, then a node without a state file. Before,
/// it started a new fleet at once, took node 0 one window past its own
/// clock and made the holder's ids again. The cluster still registers the
/// fleet under the prefix: the new node is refused, told to put back a
/// floor and the fleet id, and issues nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_node_on_a_deleted_prefix_is_refused() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+8s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/del",
        "--lease-ttl",
        "3s",
        "--window",
        "1s",
        "--etcd-timeout",
        "300ms",
    ];
    let a = serve_in(&d[0], &args, &ahead)?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop)];
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let fleet = etcd
        .get("/del/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "--prefix", "/del"])?;
    // Whatever b does, it must not issue a's ids: it would reach the
    // times a stamped (8 s ahead) within 9 s.
    let mut b = serve_in(&d[1], &args, &[])?;
    let refused = run_beside(&mut b, &stop, &mut loads, Duration::from_secs(9)).await?;
    b.kill();
    stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("a fresh node started on /del"))?;
    assert!(
        refused.contains("etcd prefix /del holds no fleet id")
            && refused.contains(&format!("fleet {fleet} is registered"))
            && refused.contains("etcdctl put /del/floor")
            && refused.contains(&format!("etcdctl put /del/fleet {fleet}")),
        "{refused}"
    );
    // Review E5: the copy case first, where nothing put back is safe.
    let copy = refused
        .find("If this etcd was restored or copied from another etcd cluster where that fleet may still run: put nothing back here and start no fleet here")
        .ok_or_else(|| anyhow::anyhow!("no copy case: {refused}"))?;
    assert!(copy < refused.find("etcdctl put").unwrap_or(0), "{refused}");
    // The old holder noticed its records were gone.
    assert!(a.stderr().contains("node id withdrawn"), "{}", a.stderr());
    eprintln!("{total} ids, no duplicate");
    Ok(())
}

/// Outside review: `etcdctl del --prefix <prefix>/hw/` (the high-water
/// records only) after a holder whose clock ran ahead was killed; a fresh
/// node took its id one window past its own clock and made its ids again
/// (5,140,704 ids twice with the holder +30 s). Every take stamps the id
/// at `<prefix>/taken/<id>`, which that delete leaves: an id taken before
/// with no high-water record is waited out `--max-resume-wait` past the
/// clock. Here the holder runs 8 s ahead, the wait is 12 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_never_reissues_ids_of_a_holder_whose_high_water_was_deleted() -> anyhow::Result<()>
{
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+8s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/hwdel",
        "--lease-ttl",
        "3s",
        "--window",
        "1s",
        "--etcd-timeout",
        "300ms",
        "--max-resume-wait",
        "12s",
    ];
    let mut a = serve_in(&d[0], &args, &ahead)?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop)];
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Killed: its lease, and so its node key, lasts until its TTL.
    a.kill();
    etcd.etcdctl(&["del", "--prefix", "/hwdel/hw/"])?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while etcd.get("/hwdel/node/0").await?.is_some() {
        anyhow::ensure!(Instant::now() < deadline, "node 0's lease never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Before, b resumed one window past its clock and reached the times
    // a stamped (8 s ahead) within 9 s.
    let mut b = serve_in(&d[1], &args, &[])?;
    let refused = run_beside(&mut b, &stop, &mut loads, Duration::from_secs(9)).await?;
    let took = b.ready(Duration::from_secs(1)).await;
    b.kill();
    stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(loads).await?;
    assert!(refused.is_none(), "{refused:?}");
    assert_eq!(took?, 0);
    assert!(
        b.stderr()
            .contains("/hwdel/hw/0 is missing, but node id 0 was taken before"),
        "{}",
        b.stderr()
    );
    eprintln!("{total} ids, no duplicate");
    Ok(())
}

/// Review E11: `etcdctl del --prefix /shardflake` beside a fleet on
/// /shardflake/prod also deleted the fleets' registry, then at
/// /shardflake.fleets/ (etcd prefixes are bytes), so a fresh node started
/// a new fleet there. The registry is now at shardflake.fleets/, which no
/// `/…` string begins: the registration stays and the node is refused.
/// An earlier version's registration (/shardflake.fleets/) is read too,
/// and written where this version reads it by the fleet's next take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_string_a_prefix_begins_with_keeps_the_fleets_registered() -> anyhow::Result<()>
{
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    let mut a = leased(&etcd, "/shardflake/prod", &d[0], &[])?;
    a.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut a).await?;
    let fleet = etcd
        .get("/shardflake/prod/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "--prefix", "/shardflake"])?;
    let urls = etcd.urls();
    let args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/shardflake/prod",
        "--lease-ttl",
        "3s",
    ];
    let e = refused(&d[1], &args, &[]).await?;
    assert!(e.contains(&format!("fleet {fleet} is registered")), "{e}");

    // An earlier version registered its fleets at /shardflake.fleets/.
    let record = etcd.get(&format!("shardflake.fleets/{fleet}")).await?;
    let record = record.ok_or_else(|| anyhow::anyhow!("not registered"))?;
    etcd.etcdctl(&["del", &format!("shardflake.fleets/{fleet}")])?;
    etcd.put(&format!("/shardflake.fleets/{fleet}"), &record)
        .await?;
    let e = refused(&d[1], &args, &[]).await?;
    assert!(e.contains(&format!("fleet {fleet} is registered")), "{e}");
    // Put back as told, the fleet's node registers it here again.
    etcd.put("/shardflake/prod/floor", &now_ms()?.to_string())
        .await?;
    etcd.put("/shardflake/prod/fleet", &fleet).await?;
    let mut again = leased(&etcd, "/shardflake/prod", &d[0], &[])?;
    again.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut again).await?;
    assert_eq!(
        etcd.get(&format!("shardflake.fleets/{fleet}")).await?,
        Some(record)
    );
    Ok(())
}

/// The floor a refusal on a deleted prefix tells to put back, as Unix ms
/// (the command's argument, evaluated by bash as the operator would).
fn advised_floor(refusal: &str, prefix: &str) -> anyhow::Result<u64> {
    let command = format!("etcdctl put {prefix}/floor ");
    let at = refusal
        .find(&command)
        .ok_or_else(|| anyhow::anyhow!("no floor advised: {refusal}"))?;
    let rest = &refusal[at + command.len()..];
    let value = rest.split(" (").next().unwrap_or(rest);
    let out = std::process::Command::new("bash")
        .args(["-c", &format!("echo {value}")])
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

/// Review E3b: the floor advised after a delete was now + 60 s, whatever
/// the fleet allows: a node 90 s ahead (the fleet's --max-resume-wait
/// 100 s) had stamped past it, and a node resuming there made 904 of its
/// ids again. The advised floor is now this clock plus window and
/// --max-resume-wait: past every id of that node, for the node refused
/// with its state file and for one without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_advised_after_a_delete_is_past_a_fast_clocks_ids() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+90s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/e3b",
        "--lease-ttl",
        "3s",
        "--max-resume-wait",
        "100s",
    ];
    let mut sound = serve_in(&d[0], &args, &[])?;
    assert_eq!(sound.ready(Duration::from_secs(20)).await?, 0);
    let mut fast = serve_in(&d[1], &args, &ahead)?;
    assert_eq!(fast.ready(Duration::from_secs(20)).await?, 1);
    let ids = load_for(&fast, Duration::from_millis(500)).await?;
    let last = ids.iter().max().ok_or_else(|| anyhow::anyhow!("no id"))?;
    // snowflake: 22 bits below the time, epoch 1288834974657 ms.
    let stamped = (last >> 22) + 1_288_834_974_657;
    stop_cleanly(&mut fast).await?;
    stop_cleanly(&mut sound).await?;
    etcd.etcdctl(&["del", "--prefix", "/e3b"])?;
    for dir in [&d[0], &d[2]] {
        let e = refused(dir, &args, &[]).await?;
        let floor = advised_floor(&e, "/e3b")?;
        assert!(
            floor > stamped,
            "advised floor {floor} at or before {stamped}, stamped by the fast node: {e}"
        );
    }
    Ok(())
}

/// The refusal above must not refuse a fleet's first nodes: fresh nodes
/// started together on an empty prefix read it before any of them
/// registered the fleet, and the fleet registered by the winner of the
/// race may be newer than another's read of the prefix. Every one comes
/// up, each with its own node id, in one fleet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_nodes_started_together_on_an_empty_prefix_all_come_up() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    for round in 0..3 {
        let prefix = format!("/herd{round}");
        let d = dirs(4)?;
        // Spawned without waiting for each to start, so that their first
        // reads of the empty prefix meet.
        let starting: Vec<_> = d
            .iter()
            .map(|dir| {
                let (urls, prefix, dir) = (etcd.urls(), prefix.clone(), dir.clone());
                // A fleet of its own per round: a fixed field tells them apart.
                let datacenter = format!("datacenter={round}");
                std::thread::spawn(move || {
                    let args = [
                        "--workers",
                        "1",
                        "--etcd",
                        &urls,
                        "--etcd-prefix",
                        &prefix,
                        "--lease-ttl",
                        "3s",
                        "--layout",
                        "twitter",
                        "--node-field",
                        "worker",
                        "--field",
                        &datacenter,
                    ];
                    let opts = ServeOpts {
                        args: args.iter().map(|s| s.to_string()).collect(),
                        dir: Some(dir),
                        ..ServeOpts::default()
                    };
                    Serve::start(shardflake_bin(), opts)
                })
            })
            .collect();
        let mut nodes = Vec::new();
        for t in starting {
            let s = tokio::task::block_in_place(|| t.join())
                .map_err(|_| anyhow::anyhow!("start panicked"))??;
            nodes.push(s);
        }
        let mut ids = std::collections::HashSet::new();
        for s in &mut nodes {
            let refused = started_or_refused(s).await?;
            assert!(refused.is_none(), "{prefix}: refused: {refused:?}");
            anyhow::ensure!(ids.insert(s.ready(Duration::from_secs(20)).await?));
        }
        for s in &mut nodes {
            stop_cleanly(s).await?;
        }
    }
    let fleets = etcd.keys("shardflake.fleets/").await?;
    assert_eq!(fleets.len(), 3, "one fleet per prefix: {fleets:?}");
    Ok(())
}

/// Reproduction 3, a clock ahead: after a snapshot, a node whose clock ran
/// 6 s ahead took id 0, issued, and stopped; etcd was restored from the
/// snapshot (the node's records gone); a brand-new node with a right clock
/// took id 0 from the restored records and issued the same ids, for it
/// resumed one window past its own clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_holder_whose_clock_ran_ahead_is_waited_out_after_a_restore() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    // Some history first: a restored cluster shows its revision past its
    // raft index once the snapshot has more revisions than a new raft log
    // has entries (a few).
    for i in 0..20 {
        etcd.etcdctl(&["put", &format!("/other/{i}"), "x"])?;
    }
    let snapshot = d[2].join("snapshot.db");
    etcd.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let urls = etcd.urls();
    let waits = ["--window", "2s", "--max-resume-wait", "8s"];
    let mut args = vec![
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/ahead",
        "--lease-ttl",
        "3s",
    ];
    args.extend(waits);
    let mut ahead = serve_in(
        &d[0],
        &args,
        &[
            ("LD_PRELOAD", libfaketime.as_str()),
            ("FAKETIME", "+6s"),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )?;
    assert_eq!(ahead.ready(Duration::from_secs(20)).await?, 0);
    let mut ids = load_for(&ahead, Duration::from_secs(1)).await?;
    stop_cleanly(&mut ahead).await?;
    tokio::task::block_in_place(|| etcd.restore(&snapshot))?;
    // A node without a state file of the place is refused until the
    // operator says the snapshot is newer than the fleet's last move.
    let e = refused(
        &d[1],
        &[
            "--etcd",
            &urls,
            "--etcd-prefix",
            "/ahead",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )
    .await?;
    assert!(
        e.contains("restored from a snapshot") && e.contains("shardflake fleet confirm"),
        "{e}"
    );
    // Review: a snapshot restored into a second cluster, confirmed while
    // the first ran, made 1,468,096 ids twice.
    assert!(
        e.contains("never confirm a copy while the cluster it was copied from runs")
            && e.contains("shardflake fleet move"),
        "{e}"
    );
    let (ok, said) = fleet_cmd("confirm", &["--etcd", &urls, "--etcd-prefix", "/ahead"])?;
    assert!(ok && said.contains("confirmed /ahead"), "{said}");
    let mut b = leased(&etcd, "/ahead", &d[1], &waits)?;
    let refused = started_or_refused(&mut b).await?;
    assert_eq!(refused, None);
    assert_eq!(b.ready(Duration::from_secs(5)).await?, 0);
    // Past the lost holder's last stamp, whatever b waited.
    ids.extend(load_for(&b, Duration::from_secs(4)).await?);
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "{} duplicate ids", total - ids.len());
    let err = b.stderr();
    assert!(err.contains("was not recorded since"), "{err}");
    Ok(())
}

/// Issue 38 (F9, item 3): restore detection that does not fade. As above,
/// a lost holder whose clock ran 6 s ahead took id 0 after the snapshot;
/// after the restore a node looked (it took id 7, pinned), then 10,000
/// lease grants (raft entries that make no revision) erased the gap
/// between revision and raft index; a new node taking id 0 still waits
/// out what the lost holder could have stamped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_is_still_seen_after_ten_thousand_lease_grants() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(4)?;
    for i in 0..20 {
        etcd.etcdctl(&["put", &format!("/other/{i}"), "x"])?;
    }
    let snapshot = d[2].join("snapshot.db");
    etcd.etcdctl(&["snapshot", "save", &snapshot.display().to_string()])?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let waits = ["--window", "2s", "--max-resume-wait", "8s"];
    let ahead_clock = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+6s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let mut args = vec![
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/fade",
        "--lease-ttl",
        "3s",
    ];
    args.extend(waits);
    let mut ahead = serve_in(&d[0], &args, &ahead_clock)?;
    assert_eq!(ahead.ready(Duration::from_secs(20)).await?, 0);
    let mut ids = load_for(&ahead, Duration::from_secs(1)).await?;
    stop_cleanly(&mut ahead).await?;
    tokio::task::block_in_place(|| etcd.restore(&snapshot))?;
    let (ok, said) = fleet_cmd("confirm", &["--etcd", &urls, "--etcd-prefix", "/fade"])?;
    assert!(ok, "{said}");

    let looks = [
        "--node-id",
        "7",
        "--window",
        "2s",
        "--max-resume-wait",
        "1s",
    ];
    let mut looker = leased(&etcd, "/fade", &d[3], &looks)?;
    assert_eq!(looker.ready(Duration::from_secs(20)).await?, 7);
    stop_cleanly(&mut looker).await?;

    let mut granting = Vec::new();
    for _ in 0..8 {
        let client = etcd.client();
        granting.push(tokio::spawn(async move {
            for _ in 0..1250 {
                client.grant(60).await?;
            }
            anyhow::Ok(())
        }));
    }
    for g in granting {
        g.await??;
    }
    let status = etcd.client().status().await?;
    assert!(
        !status.restored(),
        "the gap is still there: revision {} raft index {}",
        status.revision,
        status.raft_index
    );

    let mut b = leased(&etcd, "/fade", &d[1], &waits)?;
    assert_eq!(started_or_refused(&mut b).await?, None);
    assert_eq!(b.ready(Duration::from_secs(5)).await?, 0);
    ids.extend(load_for(&b, Duration::from_secs(4)).await?);
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "{} duplicate ids", total - ids.len());
    let err = b.stderr();
    assert!(err.contains("was not recorded since"), "{err}");
    Ok(())
}

/// Reproduction 5: a node with a long window SIGKILLed; every node taking
/// that id exited (blaming its own clock), each refused try raising the
/// record by a window, though ids 1..1023 were free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_whose_high_water_is_far_ahead_is_skipped_not_raised() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    // First a normal holder of id 0, stopped: the id has a record now.
    let mut first = leased(&etcd, "/far", &d[0], &[])?;
    first.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut first).await?;
    let mut long = leased(&etcd, "/far", &d[0], &["--window", "120s"])?;
    assert_eq!(long.ready(Duration::from_secs(20)).await?, 0);
    long.kill();
    // Its lease ends after the TTL: then id 0 is free, its record far ahead.
    let deadline = Instant::now() + Duration::from_secs(10);
    while etcd.get("/far/node/0").await?.is_some() {
        anyhow::ensure!(Instant::now() < deadline, "id 0 still held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record = etcd.get("/far/hw/0").await?;
    for (i, dir) in d.iter().enumerate().skip(1) {
        let mut n = leased(&etcd, "/far", dir, &[])?;
        let refused = started_or_refused(&mut n).await?;
        assert_eq!(refused, None, "try {i}");
        assert_eq!(n.ready(Duration::from_secs(5)).await?, i as u64);
        let err = n.stderr();
        assert!(err.contains("skipping node id 0"), "{err}");
        assert_eq!(etcd.get("/far/hw/0").await?, record, "record raised");
    }
    Ok(())
}

/// Reproduction 6: inputs that silently meant "static node 0".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_that_would_mean_static_node_0_are_refused_or_logged() -> anyhow::Result<()> {
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 4] = [
        (
            &["--lease-ttl", "5s"],
            &[],
            "lease TTL given without etcd endpoints",
        ),
        (
            &[],
            &[("SHARDFLAKE_ETCD_PREFIX", "/p")],
            "etcd prefix given without etcd endpoints",
        ),
        (&[], &[("SHARDFLAKE_NODEID", "3")], "SHARDFLAKE_NODEID"),
        (
            &[],
            &[("SHARDFLAKE_ETCD_ENDPOINTS", "http://127.0.0.1:2379")],
            "SHARDFLAKE_ETCD_ENDPOINTS",
        ),
    ];
    for (args, env, want) in cases {
        let dir = tempdir()?;
        match serve_in(&dir, args, env) {
            Err(e) => assert!(e.to_string().contains(want), "{want}: {e}"),
            Ok(mut s) => {
                let refused = started_or_refused(&mut s).await?;
                let refused =
                    refused.ok_or_else(|| anyhow::anyhow!("started: {args:?} {env:?}"))?;
                assert!(refused.contains(want), "{want}: {refused}");
            }
        }
    }
    // The default is said out loud.
    let s = serve_in(&tempdir()?, &[], &[])?;
    s.ready(Duration::from_secs(20)).await?;
    let line = std::fs::read_to_string(s.dir.join("stdout.log"))?;
    assert!(line.contains("node=static:0"), "{line}");
    assert!(
        s.stderr().contains("static node 0 by default"),
        "{}",
        s.stderr()
    );
    Ok(())
}

fn now_ms() -> anyhow::Result<u64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64)
}

/// Reproduction 7: a static node restarted with a later epoch, with
/// another node's state file, or with none and its clock 43 s back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_node_restarted_as_something_else_is_refused() -> anyhow::Result<()> {
    let d = dirs(2)?;
    let first_start = ["--resume-after", "now"];
    let mut seven = serve_in(
        &d[0],
        &["--node-id", "7", first_start[0], first_start[1]],
        &[],
    )?;
    seven.ready(Duration::from_secs(20)).await?;
    let mut issued = load_for(&seven, Duration::from_millis(300)).await?;
    stop_cleanly(&mut seven).await?;
    // Nothing can see a second node 7 on another host: it says so.
    let said = seven.stderr();
    assert!(said.contains("static node 7: no registry checks"), "{said}");
    let mut eight = serve_in(
        &d[1],
        &["--node-id", "8", first_start[0], first_start[1]],
        &[],
    )?;
    eight.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut eight).await?;

    let later_epoch = "time 41 | node 10 | sequence 12 (epoch 1288834982657)";
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let clock_back: [(&str, &str); 3] = [
        ("LD_PRELOAD", &libfaketime),
        ("FAKETIME", "-43s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let state = d[0].join("shardflake.state");
    let kept = std::fs::read(&state)?;
    type Setup<'a> = (
        &'a str,
        Vec<&'a str>,
        &'a [(&'a str, &'a str)],
        Option<Vec<u8>>,
    );
    let cases: [Setup; 3] = [
        ("layout", vec!["--layout", later_epoch], &[], None),
        (
            "node id",
            vec![],
            &[],
            Some(std::fs::read(d[1].join("shardflake.state"))?),
        ),
        ("is missing", vec![], &clock_back, Some(Vec::new())),
    ];
    for (want, extra, env, file) in cases {
        match file {
            Some(f) if f.is_empty() => std::fs::remove_file(&state)?,
            Some(f) => std::fs::write(&state, f)?,
            None => std::fs::write(&state, &kept)?,
        }
        let mut args = vec!["--node-id", "7"];
        args.extend(extra);
        let mut s = serve_in(&d[0], &args, env)?;
        match started_or_refused(&mut s).await? {
            Some(refused) => assert!(refused.contains(want), "{want}: {refused}"),
            None => {
                let ids = load_for(&s, Duration::from_millis(500)).await?;
                let last = issued.iter().max().copied().unwrap_or(0);
                let below = ids.iter().filter(|&&id| id <= last).count();
                issued.extend(ids);
                let n = issued.len();
                issued.sort_unstable();
                issued.dedup();
                anyhow::bail!(
                    "started ({want}): {below} ids at or below the last one issued, {} duplicates",
                    n - issued.len()
                );
            }
        }
    }

    // A second process on the same state file: refused before it prints
    // its addresses.
    std::fs::write(&state, &kept)?;
    let mut running = serve_in(&d[0], &["--node-id", "7"], &[])?;
    running.ready(Duration::from_secs(20)).await?;
    let second = serve_in(&d[0], &["--node-id", "7"], &[]);
    let e = second.expect_err("a second process on one state file started");
    assert!(e.to_string().contains("in use by another"), "{e}");
    // (The launcher gave the second process a fresh stdout.log.)
    let printed = std::fs::read_to_string(d[0].join("stdout.log"))?;
    assert!(!printed.contains("shardflake serve:"), "{printed}");
    stop_cleanly(&mut running).await?;

    // A static node waiting out its own record says so.
    let ahead = now_ms()? + 3_000;
    std::fs::write(
        &state,
        format!("shardflake-state 1\nhigh_water_ms {ahead}\nnode_id 7\n"),
    )?;
    // Written by hand, so no path line: taken as node 7's own only on the
    // operator's --resume-after.
    let ahead_text = ahead.to_string();
    let s = serve_in(
        &d[0],
        &["--node-id", "7", "--resume-after", &ahead_text],
        &[],
    )?;
    let mut http = Http::new(&s.http);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut codes = Vec::new();
    while Instant::now() < deadline {
        let (status, body) = http.get("/v1/id").await?;
        codes.push((status, error_code(&body)));
        if codes.last() == Some(&(503, "waiting_for_clock".into())) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        codes.last(),
        Some(&(503, "waiting_for_clock".into())),
        "{codes:?}"
    );
    s.ready(Duration::from_secs(20)).await?;
    Ok(())
}

/// Ids from one node for `for_`.
async fn load_for(s: &Serve, for_: Duration) -> anyhow::Result<Vec<u64>> {
    let stop = Arc::new(AtomicBool::new(false));
    let l = ids_until(&s.http, &stop);
    tokio::time::sleep(for_).await;
    stop.store(true, Ordering::Relaxed);
    Ok(l.await?)
}

/// A second process refused, before or after it prints its addresses:
/// its stderr.
async fn refused(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<String> {
    match serve_in(dir, args, env) {
        Err(e) => Ok(e.to_string()),
        Ok(mut s) => {
            let refused = started_or_refused(&mut s).await?;
            s.kill();
            refused.ok_or_else(|| anyhow::anyhow!("started: {args:?} {env:?}"))
        }
    }
}

/// Issue 38 (F1, F10): one state file, one process, by the file and not
/// its path: a second static node 5 given a symlink to the running one's
/// state file, or a hard link to it (to the inode the running node holds,
/// or to one it has since replaced), is refused. A static node whose state
/// file was lost with everything beside it (`rm shardflake.state*`), its
/// clock 15 s back, does not start fresh: it must be told when to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_is_held_by_one_process_and_a_lost_one_is_refused() -> anyhow::Result<()> {
    let d = dirs(2)?;
    let state = d[0].join("shardflake.state");
    // The first start of a static node is an explicit act.
    let mut five = serve_in(&d[0], &["--node-id", "5", "--resume-after", "now"], &[])?;
    five.ready(Duration::from_secs(20)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&five.http, &stop)];

    let symlink = d[1].join("symlink.state");
    std::os::unix::fs::symlink(&state, &symlink)?;
    let via_symlink = ["--node-id", "5", "--state-file", "symlink.state"];
    let mut second = serve_in(&d[1], &via_symlink, &[]);
    if let Ok(s) = &mut second
        && started_or_refused(s).await?.is_none()
    {
        loads.push(ids_until(&s.http, &stop));
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        no_duplicates(loads).await?;
        anyhow::bail!("a second node 5 ran on a symlink to the first's state file");
    }
    let e = match second {
        Err(e) => e.to_string(),
        Ok(s) => s.stderr(),
    };
    assert!(e.contains("in use by another"), "{e}");

    // A hard link to the inode the node holds: made while it is stopped,
    // so that it cannot replace the file in between.
    let hard = d[1].join("hard.state");
    five.signal(libc::SIGSTOP);
    std::fs::hard_link(&state, &hard)?;
    let via_hard_link = ["--node-id", "5", "--state-file", "hard.state"];
    let e = refused(&d[1], &via_hard_link, &[]).await;
    five.signal(libc::SIGCONT);
    let e = e?;
    assert!(e.contains("in use by another"), "{e}");
    // The node replaces its file (each record is a new file): the link
    // now names a copy of an older record, its own inode.
    use std::os::unix::fs::MetadataExt;
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::metadata(&state)?.ino() == std::fs::metadata(&hard)?.ino() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the state file was not rewritten"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let e = refused(&d[1], &via_hard_link, &[]).await?;
    assert!(e.contains("written for"), "{e}");
    // Its way out for a moved file is not to delete the path line.
    let hard_link_refusal = e;
    // #17: a copy of the running node's file with its `path` line deleted
    // (what an earlier refusal advised for a moved file): before, it ran
    // beside node 5 as a second node 5 (904 ids twice in a review).
    let copied = d[1].join("copy.state");
    let without_path: String = std::fs::read_to_string(&state)?
        .lines()
        .filter(|l| !l.starts_with("path "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&copied, without_path)?;
    let via_copy = ["--node-id", "5", "--state-file", "copy.state"];
    let mut copy = serve_in(&d[1], &via_copy, &[]);
    if let Ok(s) = &mut copy
        && started_or_refused(s).await?.is_none()
    {
        loads.push(ids_until(&s.http, &stop));
        tokio::time::sleep(Duration::from_millis(1000)).await;
        s.kill();
        stop.store(true, Ordering::Relaxed);
        let checked = no_duplicates(loads).await;
        anyhow::bail!("a copy of node 5's file without its path line ran: {checked:?}");
    }
    let e = match copy {
        Err(e) => e.to_string(),
        Ok(s) => s.stderr(),
    };
    assert!(
        e.contains("records no line \"path ...\"") && e.contains("--resume-after"),
        "{e}"
    );
    assert!(
        !hard_link_refusal.contains("delete its line"),
        "{hard_link_refusal}"
    );
    stop.store(true, Ordering::Relaxed);
    let mut issued: Vec<u64> = Vec::new();
    for l in loads {
        issued.extend(l.await?);
    }
    stop_cleanly(&mut five).await?;

    // F10: the state file and everything beside it gone, the clock 15 s back.
    for entry in std::fs::read_dir(&d[0])? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("shardflake.state") {
            std::fs::remove_file(&path)?;
        }
    }
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let clock_back: [(&str, &str); 3] = [
        ("LD_PRELOAD", &libfaketime),
        ("FAKETIME", "-15s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let mut s = serve_in(&d[0], &["--node-id", "5"], &clock_back)?;
    match started_or_refused(&mut s).await? {
        Some(refused) => assert!(refused.contains("--resume-after"), "{refused}"),
        None => {
            let ids = load_for(&s, Duration::from_millis(500)).await?;
            let last = issued.iter().max().copied().unwrap_or(0);
            let below = ids.iter().filter(|&&id| id <= last).count();
            anyhow::bail!("started fresh: {below} ids at or below the last one issued");
        }
    }
    Ok(())
}

/// Issue 38 (F11, F4): one fleet per datacenter (`twitter`, the node id in
/// `worker`, `--field datacenter=N`): a DC1 node started with DC2's
/// `--field datacenter=2` on DC1's prefix is refused by the layout record,
/// and a static node by its state file. A prefix without its leading
/// slash is refused, and the default prefix is said out loud.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_fleets_fixed_fields_or_prefix_is_refused() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(5)?;
    let dc = |n: &'static str| {
        [
            "--layout",
            "twitter",
            "--node-field",
            "worker",
            "--field",
            n,
        ]
    };
    let dc1 = leased(&etcd, "/dc1", &d[0], &dc("datacenter=1"))?;
    assert_eq!(dc1.ready(Duration::from_secs(20)).await?, 0);
    let recorded = etcd.get("/dc1/layout").await?.unwrap_or_default();
    assert!(recorded.contains("fixed fields datacenter=1"), "{recorded}");
    let e = refused(
        &d[1],
        &[
            "--etcd",
            &etcd.urls(),
            "--etcd-prefix",
            "/dc1",
            "--lease-ttl",
            "3s",
            "--layout",
            "twitter",
            "--node-field",
            "worker",
            "--field",
            "datacenter=2",
        ],
        &[],
    )
    .await?;
    assert!(e.contains("another layout"), "{e}");

    // A static node: its state file names its fixed fields.
    let mut first = dc("datacenter=1").to_vec();
    first.extend(["--node-id", "3", "--resume-after", "now"]);
    let mut s = serve_in(&d[2], &first, &[])?;
    s.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut s).await?;
    let mut other = dc("datacenter=2").to_vec();
    other.extend(["--node-id", "3"]);
    let e = refused(&d[2], &other, &[]).await?;
    assert!(e.contains("was written with layout"), "{e}");

    // Another cluster: snowflake's ids could be /dc1's, registered here.
    let etcd = Etcd::start(1)?;
    let urls = etcd.urls();
    let e = refused(&d[3], &["--etcd", &urls, "--etcd-prefix", "dc1"], &[]).await?;
    assert!(e.contains("must start with /"), "{e}");
    let mut default = serve_in(&d[4], &["--etcd", &urls, "--lease-ttl", "3s"], &[])?;
    default.ready(Duration::from_secs(20)).await?;
    let said = default.stderr();
    assert!(
        said.contains("etcd prefix /shardflake/default: the default"),
        "{said}"
    );
    default.kill();
    Ok(())
}

/// The snowflake layout with its epoch moved by `ms` (negative: earlier).
fn snowflake_epoch_moved(ms: i64) -> String {
    let epoch = 1_288_834_974_657_i64 + ms;
    format!("snowflake: time 41 | node 10 | sequence 12 (epoch {epoch} ms)")
}

/// Issue 38, F2 and F2b: a layout change (a new prefix, new state files)
/// with the epoch 15 s later made the new fleet issue the old fleet's ids
/// of 15 s before; a node refused for its layout, restarted under another
/// prefix as the refusal advised, issued beside the running fleet. Now the
/// refusal names `--previous-prefix`, which refuses while the old fleet
/// runs and refuses a layout whose ids are not above the old fleet's; the
/// change that is allowed retires the old prefix, so its nodes are
/// refused there afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_change_never_reissues_an_id() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(6)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut old = Vec::new();
    let mut loads = Vec::new();
    for dir in &d[..2] {
        let s = leased(&etcd, "/lay1", dir, &[])?;
        s.ready(Duration::from_secs(20)).await?;
        loads.push(ids_until(&s.http, &stop));
        old.push(s);
    }
    // F2b: another layout on the running fleet's prefix is refused, and
    // the advice it gives, followed while the fleet runs, refused too.
    let later = snowflake_epoch_moved(15_000);
    let mut other = leased(&etcd, "/lay1", &d[2], &["--layout", &later])?;
    let refused = run_beside(&mut other, &stop, &mut loads, Duration::from_millis(1500))
        .await?
        .ok_or_else(|| anyhow::anyhow!("another layout started on /lay1"))?;
    assert!(
        refused.contains("--previous-prefix /lay1") && refused.contains("stop every node"),
        "{refused}"
    );
    let mut advised = leased(
        &etcd,
        "/lay2",
        &d[2],
        &["--layout", &later, "--previous-prefix", "/lay1"],
    )?;
    let refused = run_beside(&mut advised, &stop, &mut loads, Duration::from_millis(1500))
        .await?
        .ok_or_else(|| anyhow::anyhow!("started beside the running fleet"))?;
    assert!(refused.contains("/lay1/node/"), "{refused}");

    // F2: the old fleet stopped, the epoch 15 s later is refused before a
    // single id (its ids would be the old fleet's of 15 s before).
    tokio::time::sleep(Duration::from_millis(500)).await;
    for s in &mut old {
        stop_cleanly(s).await?;
    }
    stop.store(true, Ordering::Relaxed);
    let mut old_ids = Vec::new();
    for l in loads.drain(..) {
        old_ids.extend(l.await?);
    }
    anyhow::ensure!(!old_ids.is_empty(), "the old fleet issued nothing");
    let mut refused = leased(
        &etcd,
        "/lay2",
        &d[3],
        &["--layout", &later, "--previous-prefix", "/lay1"],
    )?;
    let why = started_or_refused(&mut refused)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the later epoch started"))?;
    assert!(
        why.contains("not above every id the fleet under /lay1 made"),
        "{why}"
    );

    // An earlier epoch is above: the new fleet starts, retires /lay1, and
    // every id it issues is above every id the old fleet issued.
    let stop = Arc::new(AtomicBool::new(false));
    let earlier = snowflake_epoch_moved(-15_000);
    let mut new = Vec::new();
    for dir in &d[4..6] {
        let s = leased(
            &etcd,
            "/lay2",
            dir,
            &["--layout", &earlier, "--previous-prefix", "/lay1"],
        )?;
        s.ready(Duration::from_secs(20)).await?;
        loads.push(ids_until(&s.http, &stop));
        new.push(s);
    }
    // A node of the old fleet, restarted on its state file, is refused.
    let mut back = leased(&etcd, "/lay1", &d[0], &[])?;
    let refused = run_beside(&mut back, &stop, &mut loads, Duration::from_millis(1500))
        .await?
        .ok_or_else(|| anyhow::anyhow!("the old fleet's node started again"))?;
    assert!(
        refused.contains("etcd prefix /lay1 is retired") && refused.contains("/lay2"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let old_max = old_ids.iter().max().copied().unwrap_or(0);
    let mut new_ids = Vec::new();
    for l in loads {
        new_ids.extend(l.await?);
    }
    anyhow::ensure!(!new_ids.is_empty(), "the new fleet issued nothing");
    let below = new_ids.iter().filter(|&&id| id <= old_max).count();
    assert_eq!(below, 0, "new ids at or below the old fleet's largest");
    let total = new_ids.len() + old_ids.len();
    let mut all: Vec<u64> = old_ids.into_iter().chain(new_ids).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "duplicates");
    Ok(())
}

/// Review E5: a layout change the take refused after it had retired the
/// previous prefix stranded the fleet: its old prefix refused its own
/// nodes (retired) and the new one refused every node. Two fleets, one
/// per datacenter (twitter, `--field datacenter=N`); dc1 changed to an
/// earlier epoch, whose ids dc2's registered fleet could make: refused,
/// and now before anything is retired, so dc1's node starts again where
/// it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_layout_change_leaves_the_previous_fleet_where_it_was() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(3)?;
    let mut a = leased(&etcd, "/e5dc1", &d[0], &dc("datacenter=1"))?;
    a.ready(Duration::from_secs(20)).await?;
    let mut b = leased(&etcd, "/e5dc2", &d[1], &dc("datacenter=2"))?;
    b.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut a).await?;
    let recorded = etcd.get("/e5dc1/layout").await?.unwrap_or_default();
    let earlier = format!(
        "twitter: time 41 | datacenter 5 | worker 5 | sequence 12 (epoch {} ms)",
        1_288_834_974_657_i64 - 15_000
    );
    let urls = etcd.urls();
    let e = refused(
        &d[2],
        &[
            "--etcd",
            &urls,
            "--etcd-prefix",
            "/e5new",
            "--lease-ttl",
            "3s",
            "--layout",
            &earlier,
            "--node-field",
            "worker",
            "--field",
            "datacenter=1",
            "--previous-prefix",
            "/e5dc1",
        ],
        &[],
    )
    .await?;
    assert!(
        e.contains("etcd prefix /e5new") && e.contains("would share ids with fleet"),
        "{e}"
    );
    let after = etcd.get("/e5dc1/layout").await?.unwrap_or_default();
    assert_eq!(after, recorded, "the previous prefix was retired");
    let mut again = leased(&etcd, "/e5dc1", &d[0], &dc("datacenter=1"))?;
    let refused = started_or_refused(&mut again).await?;
    assert!(refused.is_none(), "dc1's node refused: {refused:?}");
    stop_cleanly(&mut again).await?;
    stop_cleanly(&mut b).await?;
    Ok(())
}

/// Deletes the `registry …` line of a state file (what the guide once said
/// to do to move a fleet to another prefix).
fn drop_registry_line(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join("shardflake.state");
    let text = std::fs::read_to_string(&path)?;
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("registry "))
        .collect();
    std::fs::write(&path, kept.join("\n") + "\n")?;
    Ok(())
}

/// Issue 38, F3: the prefix change as the guide once said (stop every
/// node, delete the `registry` lines, start on the new prefix) with one
/// host's clock 20 s ahead: the nodes swapped ids on the empty prefix and
/// waited one window, so the node with the slow clock issued what the
/// fast one had issued under its id. Now a node whose state file names its
/// fleet refuses a place without its fleet id; moved with
/// `--previous-prefix`, the fleet id comes along and every node waits past
/// the old fleet's highest high-water, whatever its clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_moved_to_another_prefix_never_swaps_ids_whatever_its_clocks() -> anyhow::Result<()>
{
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+20s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let on = |prefix: &'static str, extra: &'static [&'static str]| {
        let mut args = vec![
            "--etcd".to_string(),
            urls.clone(),
            "--etcd-prefix".into(),
            prefix.into(),
            "--lease-ttl".into(),
            "3s".into(),
            "--window".into(),
            "2s".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let start = |dir: &Path, args: &[String], env: &[(&str, &str)]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        serve_in(dir, &args, env)
    };
    // Node 0 on a sound clock, node 1 20 s ahead.
    let a = start(&d[0], &on("/mv1", &[]), &[])?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    let b = start(&d[1], &on("/mv1", &[]), &ahead)?;
    assert_eq!(b.ready(Duration::from_secs(20)).await?, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop), ids_until(&b.http, &stop)];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut old_ids = Vec::new();
    for l in loads.drain(..) {
        old_ids.extend(l.await?);
    }
    for mut s in [a, b] {
        stop_cleanly(&mut s).await?;
    }
    for dir in &d {
        drop_registry_line(dir)?;
    }

    // As the guide once said: the fast node first (it takes id 0), then
    // the sound one (id 1, the fast node's old id).
    let stop = Arc::new(AtomicBool::new(false));
    let mut swapped = start(&d[1], &on("/mv2", &[]), &ahead)?;
    let fast = run_beside(&mut swapped, &stop, &mut loads, Duration::ZERO).await?;
    let mut sound = start(&d[0], &on("/mv2", &[]), &[])?;
    let slow = run_beside(&mut sound, &stop, &mut loads, Duration::from_secs(20)).await?;
    swapped.kill();
    sound.kill();
    stop.store(true, Ordering::Relaxed);
    let mut ids = old_ids.clone();
    for l in loads.drain(..) {
        ids.extend(l.await?);
    }
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "{} duplicates", total - ids.len());
    for refused in [fast, slow] {
        let refused = refused.ok_or_else(|| anyhow::anyhow!("started on an empty prefix"))?;
        assert!(refused.contains("holds no fleet id"), "{refused}");
    }

    // Moved: both wait past the fast clock's last high-water.
    let moved = on("/mv2", &["--previous-prefix", "/mv1"]);
    let stop = Arc::new(AtomicBool::new(false));
    let fast = start(&d[1], &moved, &ahead)?;
    let sound = start(&d[0], &moved, &[])?;
    let mut ready = Vec::new();
    for s in [&fast, &sound] {
        ready.push(s.ready(Duration::from_secs(40)).await?);
        loads.push(ids_until(&s.http, &stop));
    }
    ready.sort_unstable();
    assert_eq!(ready, [0, 1]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let old_max = old_ids.iter().max().copied().unwrap_or(0);
    let mut new_ids = Vec::new();
    for l in loads {
        new_ids.extend(l.await?);
    }
    anyhow::ensure!(!new_ids.is_empty(), "the moved fleet issued nothing");
    let below = new_ids.iter().filter(|&&id| id <= old_max).count();
    assert_eq!(below, 0, "moved fleet's ids at or below the old fleet's");
    // The fleet id came along.
    let fleet = etcd.get("/mv1/fleet").await?;
    assert!(fleet.is_some());
    assert_eq!(etcd.get("/mv2/fleet").await?, fleet);
    Ok(())
}

/// Issue 38, F8: an `--etcd` list with members of two clusters (old and
/// new during a move): fresh nodes started on random endpoints and the
/// fleet split between the clusters, each holding the same ids. Now a
/// node asks every member before its first take and is refused, naming
/// the member that disagreed; each list of one cluster still starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_list_mixing_two_clusters_is_refused() -> anyhow::Result<()> {
    let a = Etcd::start(1)?;
    let b = Etcd::start(1)?;
    let d = dirs(3)?;
    let mixed = format!("{},{}", a.urls(), b.urls());
    let args = [
        "--etcd",
        &mixed,
        "--etcd-prefix",
        "/mixed",
        "--lease-ttl",
        "3s",
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    let mut refusals = Vec::new();
    let mut nodes = Vec::new();
    for dir in &d[..2] {
        let mut s = serve_in(dir, &args, &[])?;
        refusals.push(run_beside(&mut s, &stop, &mut loads, Duration::from_millis(500)).await?);
        nodes.push(s);
    }
    stop.store(true, Ordering::Relaxed);
    for mut s in nodes {
        s.kill();
    }
    if !loads.is_empty() {
        no_duplicates(loads).await?;
    }
    for refused in refusals {
        let refused = refused.ok_or_else(|| anyhow::anyhow!("started on a mixed endpoint list"))?;
        assert!(
            refused.contains("answer for different etcd clusters or fleets")
                && refused.contains(&a.urls())
                && refused.contains(&b.urls()),
            "{refused}"
        );
    }
    // One cluster's members only: starts.
    let one = leased(&a, "/mixed", &d[2], &[])?;
    assert_eq!(one.ready(Duration::from_secs(20)).await?, 0);
    Ok(())
}

/// #16: a member that did not answer the endpoint check was not counted:
/// a fresh node given one member of each of two clusters, started while
/// the fleet's cluster was down, took the fleet's node id 0 in the other
/// (3,767,680 ids twice in a review). Now a majority of the endpoints must
/// answer (and agree) before the first take: the node waits, and is
/// refused once the silent member answers for another cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_silent_at_start_is_checked_before_the_first_take() -> anyhow::Result<()> {
    let a = Etcd::start(1)?;
    let b = Etcd::start(1)?;
    let d = dirs(2)?;
    let quick = ["--window", "1s", "--etcd-timeout", "300ms"];
    let fleet = leased(&a, "/silent", &d[0], &quick)?;
    assert_eq!(fleet.ready(Duration::from_secs(20)).await?, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&fleet.http, &stop)];
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| a.kill(0))?;
    let mixed = format!("{},{}", a.urls(), b.urls());
    let mut args = vec![
        "--etcd",
        &mixed,
        "--etcd-prefix",
        "/silent",
        "--lease-ttl",
        "3s",
    ];
    args.extend(quick);
    let mut fresh = serve_in(&d[1], &args, &[])?;
    // The fleet's cluster answers again while the fresh node starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| a.restart(0))?;
    let refused = run_beside(&mut fresh, &stop, &mut loads, Duration::from_secs(6)).await?;
    fresh.kill();
    stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("started on a mixed endpoint list"))?;
    assert!(
        refused.contains("answer for different etcd clusters or fleets"),
        "{refused}"
    );
    eprintln!("{total} ids, no duplicate");
    Ok(())
}

/// 3b (outside review): a fresh node's list named another cluster's one
/// member twice, as `127.0.0.1:P` and `localhost:P`, and the fleet's
/// member once; started while the fleet's member was down, the two URLs
/// of one member counted as 2 of 3 and the node took node id 0 in the
/// other cluster beside the fleet's node 0 (855,500 ids twice). Now the
/// majority counts members (etcd's member id in each answer): one member
/// against one silent endpoint is no majority, so the node waits and is
/// refused once the fleet's member answers; one member listed twice, and
/// nothing else, still starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_listed_twice_counts_once_for_the_majority() -> anyhow::Result<()> {
    let a = Etcd::start(1)?;
    let b = Etcd::start(1)?;
    let d = dirs(3)?;
    let quick = ["--window", "1s", "--etcd-timeout", "300ms"];
    let fleet = leased(&a, "/twice", &d[0], &quick)?;
    assert_eq!(fleet.ready(Duration::from_secs(20)).await?, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&fleet.http, &stop)];
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::block_in_place(|| a.kill(0))?;
    let b_by_name = b.urls().replace("127.0.0.1", "localhost");
    anyhow::ensure!(b_by_name != b.urls(), "{}", b.urls());
    let list = format!("{},{b_by_name},{}", b.urls(), a.urls());
    let mut args = vec![
        "--etcd",
        &list,
        "--etcd-prefix",
        "/twice",
        "--lease-ttl",
        "3s",
    ];
    args.extend(quick);
    let mut fresh = serve_in(&d[1], &args, &[])?;
    // The fleet's member answers again while the fresh node starts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::block_in_place(|| a.restart(0))?;
    let refused = run_beside(&mut fresh, &stop, &mut loads, Duration::from_secs(6)).await?;
    fresh.kill();
    stop.store(true, Ordering::Relaxed);
    let total = no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| {
        anyhow::anyhow!("started with one member listed twice and the fleet's member silent")
    })?;
    assert!(
        refused.contains("answer for different etcd clusters or fleets")
            && refused.contains(&a.urls()),
        "{refused}"
    );
    eprintln!("{total} ids, no duplicate");
    // One member under two names, nothing else: one member, none silent.
    let a_by_name = a.urls().replace("127.0.0.1", "localhost");
    let own = format!("{},{a_by_name}", a.urls());
    let mut args = vec![
        "--etcd",
        &own,
        "--etcd-prefix",
        "/twice",
        "--lease-ttl",
        "3s",
    ];
    args.extend(quick);
    let again = serve_in(&d[2], &args, &[])?;
    again.ready(Duration::from_secs(20)).await?;
    Ok(())
}

/// `shardflake fleet move ARGS`: whether it succeeded, and what it said.
fn fleet_move(args: &[&str]) -> anyhow::Result<(bool, String)> {
    fleet_cmd("move", args)
}

/// `shardflake fleet <command> <args>`: whether it succeeded, and what it
/// said.
fn fleet_cmd(command: &str, args: &[&str]) -> anyhow::Result<(bool, String)> {
    let out = std::process::Command::new(shardflake_bin())
        .args(["fleet", command])
        .args(args)
        .output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), said))
}

/// One fleet per datacenter: the `twitter` layout, the node id in
/// `worker`, `--field datacenter=N`.
fn dc(n: &'static str) -> [&'static str; 6] {
    [
        "--layout",
        "twitter",
        "--node-field",
        "worker",
        "--field",
        n,
    ]
}

/// Issue 38 item 1: an outside reviewer started nodes on another prefix of
/// the same etcd with the same layout: they took the same node ids and
/// issued 41,000 of 100,000 ids twice. Each fleet is registered in the
/// cluster (shardflake.fleets/<fleet id>, with its prefix and layout): a
/// new fleet whose ids a registered one could make is refused, naming it
/// and the ways out; a fleet told apart by a fixed field starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fleets_on_one_etcd_never_share_ids() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(4)?;
    let a = leased(&etcd, "/fleet-a", &d[0], &dc("datacenter=1"))?;
    let a2 = leased(&etcd, "/fleet-a", &d[1], &dc("datacenter=1"))?;
    a.ready(Duration::from_secs(20)).await?;
    a2.ready(Duration::from_secs(20)).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop), ids_until(&a2.http, &stop)];
    // A fleet that runs is not moved, nor one that is not there.
    let urls = etcd.urls();
    let (ok, said) = fleet_move(&[
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/fleet-a",
        "--to-prefix",
        "/x",
    ])?;
    assert!(
        !ok && said.contains("a node of the fleet under /fleet-a runs"),
        "{said}"
    );
    let (ok, said) = fleet_move(&[
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/none",
        "--to-prefix",
        "/x",
    ])?;
    assert!(
        !ok && said.contains("etcd prefix /none holds no fleet"),
        "{said}"
    );
    // The same layout and datacenter under another prefix: the same ids.
    let mut b = leased(&etcd, "/fleet-b", &d[2], &dc("datacenter=1"))?;
    let refused = run_beside(&mut b, &stop, &mut loads, Duration::from_millis(1500)).await?;
    b.kill();
    // Another datacenter: its ids are its own.
    let c = leased(&etcd, "/fleet-c", &d[3], &dc("datacenter=2"))?;
    c.ready(Duration::from_secs(20)).await?;
    loads.push(ids_until(&c.http, &stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("started beside /fleet-a"))?;
    assert!(
        refused.contains("etcd prefix /fleet-b")
            && refused.contains("would share ids with fleet")
            && refused.contains("registered in this etcd cluster under /fleet-a")
            && refused.contains("shardflake fleet move"),
        "{refused}"
    );
    // Review: putting back only the fleet id is not safe (a fresh node on
    // /fleet-a resumes one window past its own clock); the way back is
    // the refusal on /fleet-a, the floor first.
    assert!(
        refused.contains("start a node on /fleet-a: its refusal says what to put back")
            && !refused.contains("etcdctl put /fleet-a/fleet"),
        "{refused}"
    );
    let fleets = etcd.keys("shardflake.fleets/").await?;
    assert_eq!(fleets.len(), 2, "{fleets:?}");
    Ok(())
}

/// A fleet's nodes (one per dir) started under `prefix`, each issuing for
/// a while (its ids into `loads`), then stopped cleanly.
async fn run_fleet(
    etcd: &Etcd,
    prefix: &str,
    dirs: &[PathBuf],
    stop: &Arc<AtomicBool>,
    loads: &mut Vec<JoinHandle<Vec<u64>>>,
) -> anyhow::Result<()> {
    let mut nodes = Vec::new();
    for dir in dirs {
        let s = leased(etcd, prefix, dir, &[])?;
        s.ready(Duration::from_secs(30)).await?;
        loads.push(ids_until(&s.http, stop));
        nodes.push(s);
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    for s in &mut nodes {
        stop_cleanly(s).await?;
    }
    Ok(())
}

/// Issue 38 item 2: `shardflake fleet move` carries a stopped fleet (its
/// fleet id, layout and every id's high-water, raised) to another prefix,
/// then to another etcd cluster; its nodes restart there on their state
/// files, and no id is issued twice. A node of the fleet started where its
/// fleet id is not is refused with the command; one started at the old
/// place is refused (retired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_moved_with_the_move_command_restarts_there_and_nowhere_else() -> anyhow::Result<()>
{
    let one = Etcd::start(1)?;
    let two = Etcd::start(1)?;
    let d = dirs(2)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    run_fleet(&one, "/mv", &d, &stop, &mut loads).await?;
    // Not moved yet: the fleet's node is refused on the other cluster,
    // told the command.
    let e = refused(
        &d[0],
        &[
            "--etcd",
            &two.urls(),
            "--etcd-prefix",
            "/mv3",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )
    .await?;
    assert!(
        e.contains("holds no fleet id") && e.contains("shardflake fleet move"),
        "{e}"
    );
    let (ok, said) = fleet_move(&[
        "--etcd",
        &one.urls(),
        "--etcd-prefix",
        "/mv",
        "--to-prefix",
        "/mv2",
    ])?;
    assert!(ok && said.contains("moved: /mv -> /mv2"), "{said}");
    run_fleet(&one, "/mv2", &d, &stop, &mut loads).await?;
    let e = refused(
        &d[0],
        &[
            "--etcd",
            &one.urls(),
            "--etcd-prefix",
            "/mv",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )
    .await?;
    assert!(e.contains("etcd prefix /mv is retired"), "{e}");
    let to_two = [
        "--etcd",
        &one.urls(),
        "--etcd-prefix",
        "/mv2",
        "--to-etcd",
        &two.urls(),
        "--to-prefix",
        "/mv3",
    ];
    let (ok, said) = fleet_move(&to_two)?;
    assert!(ok && said.contains("moved: /mv2 -> /mv3"), "{said}");
    // Run again: nothing more to do.
    let (ok, said) = fleet_move(&to_two)?;
    assert!(ok && said.contains("was already there"), "{said}");
    run_fleet(&two, "/mv3", &d, &stop, &mut loads).await?;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let hws = two.keys("/mv3/hw/").await?;
    assert_eq!(hws.len(), 2, "{hws:?}");
    // A restore recorded where the fleet is: a record there may be older
    // than what its holder stamped, up to --max-resume-wait past its
    // clock; the move raises the records at least a minute.
    two.put("/mv3/restored", "revision 1 raft_index 1").await?;
    let urls = two.urls();
    let onward = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/mv3",
        "--to-prefix",
        "/mv4",
    ];
    let (ok, said) = fleet_move(&onward)?;
    assert!(!ok && said.contains("--raise at least"), "{said}");
    let mut raised = onward.to_vec();
    raised.extend(["--raise", "60s"]);
    let (ok, said) = fleet_move(&raised)?;
    assert!(ok && said.contains("moved: /mv3 -> /mv4"), "{said}");
    let floor: u64 = two.get("/mv4/floor").await?.unwrap_or_default().parse()?;
    assert!(
        floor >= now_ms()? + 50_000,
        "floor {floor} not a minute ahead"
    );
    Ok(())
}

/// The move refused a floor further ahead of its clock than the fleet's
/// `--max-resume-wait`, while a take at the new place waits window +
/// `--max-resume-wait`: a `--raise` between the two was refused though
/// every node would have waited it out. Now the move compares with the
/// take's own limit (`--window`, 3 s by default, as `serve`'s): such a
/// move goes through and the node starts past the floor; a `--raise`
/// past the limit is refused, nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_raises_as_far_as_its_nodes_wait_and_no_further() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let urls = etcd.urls();
    let d = dirs(1)?;
    // Nodes wait at most window (3 s, the default) + 3 s.
    let wait = ["--max-resume-wait", "3s"];
    let mut s = leased(&etcd, "/rw", &d[0], &wait)?;
    s.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut s).await?;
    let to = |from: &str, to: &str, raise: &str| -> anyhow::Result<(bool, String)> {
        let args = [
            "--etcd",
            &urls,
            "--etcd-prefix",
            from,
            "--to-prefix",
            to,
            "--raise",
            raise,
            "--max-resume-wait",
            "3s",
        ];
        // Its lease is revoked as it stops; bounded by the lease's TTL.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (ok, said) = fleet_move(&args)?;
            if ok || !said.contains("a node of the fleet") || Instant::now() > deadline {
                return Ok((ok, said));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // 5 s: past --max-resume-wait, within window + --max-resume-wait.
    let (ok, said) = to("/rw", "/rw2", "5s")?;
    assert!(ok && said.contains("moved: /rw -> /rw2"), "{said}");
    let floor: u64 = etcd
        .get("/rw2/floor")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no floor at /rw2"))?
        .parse()?;
    let mut s = leased(&etcd, "/rw2", &d[0], &wait)?;
    if let Some(e) = started_or_refused(&mut s).await? {
        anyhow::bail!("refused after the move: {e}");
    }
    let ids = load_for(&s, Duration::from_millis(300)).await?;
    // snowflake: 22 bits below the time, epoch 1288834974657 ms.
    let first = ids.iter().min().ok_or_else(|| anyhow::anyhow!("no id"))?;
    let stamped = (first >> 22) + 1_288_834_974_657;
    assert!(stamped > floor, "stamped {stamped}, floor {floor}");
    stop_cleanly(&mut s).await?;
    // 7 s: past window + --max-resume-wait, refused, nothing written.
    let (ok, said) = to("/rw2", "/rw3", "7s")?;
    assert!(
        !ok && said.contains("more than the fleet's window + --max-resume-wait (6000 ms)")
            && said.contains("Nothing was changed")
            && said.contains("Run the move again with --raise 6000ms or less"),
        "{said}"
    );
    let layout = etcd.get("/rw2/layout").await?.unwrap_or_default();
    assert!(!layout.starts_with("retired"), "{layout}");
    assert!(etcd.keys("/rw3/").await?.is_empty());
    Ok(())
}

/// `fleet move` after a prefix deleted and its floor put back (chaos,
/// seed 7): a node stopped while it waited out the floor left its
/// high-water a window past the floor, ahead of the clock. The move added
/// `--raise` on top of that record and made the floor past it, and every
/// node at the new place was refused as too far ahead (window +
/// `--max-resume-wait`): the fleet had nowhere to run. Now `--raise` goes
/// past the clock and a record further ahead is carried as it is: the node
/// starts there, past the old record. A `--raise` past window +
/// `--max-resume-wait` is refused before anything is written, naming the
/// way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_after_a_floor_put_back_leaves_the_fleet_able_to_start() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let urls = etcd.urls();
    let d = dirs(1)?;
    // Nodes wait at most window + --max-resume-wait: 10 s.
    let wait = ["--window", "2s", "--max-resume-wait", "8s"];
    let mut s = leased(&etcd, "/st", &d[0], &wait)?;
    s.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut s).await?;
    let fleet = etcd
        .get("/st/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "--prefix", "/st/"])?;
    // As the refusal says: a floor, then the fleet id.
    let floor = now_ms()? + 8_000;
    etcd.put("/st/floor", &floor.to_string()).await?;
    etcd.put("/st/fleet", &fleet).await?;
    // Restarted, the node takes its id past the floor and waits it out;
    // stopped while it waits, its record stays a window past the floor.
    let mut s = leased(&etcd, "/st", &d[0], &wait)?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let recorded: u64 = loop {
        if let Some(v) = etcd.get("/st/hw/0").await? {
            break v.parse()?;
        }
        anyhow::ensure!(Instant::now() < deadline, "no take: {}", s.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(recorded > floor, "recorded {recorded}, floor {floor}");
    s.signal(libc::SIGTERM);
    s.exit(Duration::from_secs(15)).await?;
    let to = |from: &str,
              to: &str,
              raise: &str,
              wait: &str,
              window: &str|
     -> anyhow::Result<(bool, String)> {
        let args = [
            "--etcd",
            &urls,
            "--etcd-prefix",
            from,
            "--to-prefix",
            to,
            "--raise",
            raise,
            "--max-resume-wait",
            wait,
            "--window",
            window,
        ];
        // Its lease is revoked as it stops; bounded by the lease's TTL.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (ok, said) = fleet_move(&args)?;
            if ok || !said.contains("a node of the fleet") || Instant::now() > deadline {
                return Ok((ok, said));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // That floor is further ahead than a window of 100 ms and a
    // --max-resume-wait of 1 s: a move now is refused with nothing
    // written, told when to run it again.
    let (ok, said) = to("/st", "/st0", "1s", "1s", "100ms")?;
    assert!(
        !ok && said.contains("the old place's /st/floor")
            && said.contains("Nothing was changed")
            && said.contains("Run the move again after"),
        "{said}"
    );
    assert!(etcd.keys("/st0/").await?.is_empty());
    let (ok, said) = to("/st", "/st2", "8s", "8s", "2s")?;
    assert!(ok && said.contains("moved: /st -> /st2"), "{said}");
    let carried: u64 = etcd.get("/st2/hw/0").await?.unwrap_or_default().parse()?;
    assert!(
        carried >= recorded,
        "carried {carried}, recorded {recorded}"
    );
    let mut s = leased(&etcd, "/st2", &d[0], &wait)?;
    if let Some(e) = started_or_refused(&mut s).await? {
        anyhow::bail!("refused after the move: {e}");
    }
    let ids = load_for(&s, Duration::from_millis(300)).await?;
    // snowflake: 22 bits below the time, epoch 1288834974657 ms.
    let first = ids.iter().min().ok_or_else(|| anyhow::anyhow!("no id"))?;
    let stamped = (first >> 22) + 1_288_834_974_657;
    assert!(stamped > recorded, "stamped {stamped}, recorded {recorded}");
    stop_cleanly(&mut s).await?;
    // A raise past the fleet's window + --max-resume-wait: refused,
    // nothing written.
    let (ok, said) = to("/st2", "/st3", "11s", "8s", "2s")?;
    assert!(
        !ok && said.contains("more than the fleet's window + --max-resume-wait")
            && said.contains("Nothing was changed")
            && said.contains("Run the move again with --raise 10000ms or less"),
        "{said}"
    );
    let layout = etcd.get("/st2/layout").await?.unwrap_or_default();
    assert!(!layout.starts_with("retired"), "{layout}");
    assert!(etcd.keys("/st3/").await?.is_empty());
    Ok(())
}

/// A one-member etcd built again with the same flags and an empty data
/// directory (so the same cluster id); returns once it answers.
async fn rebuild_empty(etcd: &Etcd) -> anyhow::Result<()> {
    etcd.kill(0)?;
    let args = std::fs::read_to_string(etcd.dir.join("m0.args"))?;
    let lines: Vec<&str> = args.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "--data-dir")
        .ok_or_else(|| anyhow::anyhow!("m0.args names no --data-dir"))?;
    // The kill is sent, not waited for: the data goes once it is gone.
    let pid = std::fs::read_to_string(etcd.dir.join("m0.pid"))?;
    let status = format!("/proc/{}/status", pid.trim());
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(&status).is_ok_and(|s| !s.contains("zombie")) {
        anyhow::ensure!(Instant::now() < deadline, "etcd member still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::remove_dir_all(lines[at + 1])?;
    etcd.restart(0)?;
    while etcd.etcdctl(&["--command-timeout=2s", "get", "/"]).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "etcd not back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Brief item 5a: the fleet's etcd wiped and built again with the same
/// flags (the same cluster id), and the state file of its node whose
/// clock runs 8 s ahead lost. Started with the fleet's id (`--fleet`),
/// that node is refused on the empty prefix instead of founding a new
/// fleet; the other node, with its state file, is refused with a floor to
/// put back; put back as told, the other node takes the fast node's old
/// id past the floor, the fast node waits for `fleet confirm` (the other
/// node took the rebuilt cluster for a restored one) and then takes
/// another: no id twice, before the wipe or after. (Without `--fleet`, the fast node would have started a
/// new fleet there: the guide's endpoint row says what that leaves open.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_cluster_with_a_fast_nodes_state_file_lost_issues_no_id_twice()
-> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+8s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let base = vec![
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/wiped",
        "--lease-ttl",
        "3s",
        "--window",
        "1s",
        "--etcd-timeout",
        "300ms",
        "--max-resume-wait",
        "12s",
    ];
    let mut fast = serve_in(&d[0], &base, &ahead)?;
    assert_eq!(fast.ready(Duration::from_secs(20)).await?, 0);
    let fleet = etcd
        .get("/wiped/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    let mut with_fleet = base.clone();
    with_fleet.extend(["--fleet", &fleet]);
    let mut slow = serve_in(&d[1], &with_fleet, &[])?;
    assert_eq!(slow.ready(Duration::from_secs(20)).await?, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut before = vec![ids_until(&fast.http, &stop), ids_until(&slow.http, &stop)];
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut ids = Vec::new();
    for l in before.drain(..) {
        ids.extend(l.await?);
    }
    stop_cleanly(&mut fast).await?;
    stop_cleanly(&mut slow).await?;
    rebuild_empty(&etcd).await?;
    for entry in std::fs::read_dir(&d[0])? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("shardflake.state"))
        {
            std::fs::remove_file(path)?;
        }
    }
    let said = refused(&d[0], &with_fleet, &ahead).await?;
    assert!(
        said.contains(&format!("was started with --fleet {fleet}")),
        "{said}"
    );
    let said = refused(&d[1], &with_fleet, &[]).await?;
    assert!(said.contains("holds no fleet id"), "{said}");
    let floor = advised_floor(&said, "/wiped")?;
    etcd.put("/wiped/floor", &floor.to_string()).await?;
    etcd.put("/wiped/fleet", &fleet).await?;
    let slow = serve_in(&d[1], &with_fleet, &[])?;
    assert_eq!(slow.ready(Duration::from_secs(40)).await?, 0);
    // The node whose state file remembers a later revision took the
    // rebuilt cluster for a restored one, and recorded it: a node without
    // a state file of the place waits for the operator's word, which is
    // right here (the fleet never left this place).
    let said = refused(&d[0], &with_fleet, &ahead).await?;
    assert!(said.contains("shardflake fleet confirm"), "{said}");
    let (ok, said) = fleet_cmd("confirm", &["--etcd", &urls, "--etcd-prefix", "/wiped"])?;
    assert!(ok, "{said}");
    let fast = serve_in(&d[0], &with_fleet, &ahead)?;
    assert_eq!(fast.ready(Duration::from_secs(40)).await?, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let after = vec![ids_until(&fast.http, &stop), ids_until(&slow.http, &stop)];
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut seen: std::collections::HashSet<u64> = ids.into_iter().collect();
    let before_count = seen.len();
    let mut twice = 0;
    for l in after {
        for id in l.await? {
            if !seen.insert(id) {
                twice += 1;
            }
        }
    }
    assert_eq!(twice, 0, "ids made twice ({before_count} before the wipe)");
    Ok(())
}

/// Issue 38, F16: a second cluster built with the same member names, peer
/// URLs and token has the same cluster id (etcd derives it from those
/// alone); another application's writes took its revision past the one
/// the node remembered. The node, restarted on it with its state file, is
/// refused: the fleet id it expects is not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_cluster_with_the_same_cluster_id_is_refused() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(1)?;
    let cluster_id = etcd.client().range_header(b"/").await?.cluster_id;
    let mut s = leased(&etcd, "/f16", &d[0], &[])?;
    s.ready(Duration::from_secs(20)).await?;
    let first = load_for(&s, Duration::from_millis(500)).await?;
    stop_cleanly(&mut s).await?;
    rebuild_empty(&etcd).await?;
    assert_eq!(
        etcd.client().range_header(b"/").await?.cluster_id,
        cluster_id
    );
    for i in 0..200 {
        etcd.put(&format!("/app/{i}"), "x").await?;
    }
    let mut again = leased(&etcd, "/f16", &d[0], &[])?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    let refused = run_beside(&mut again, &stop, &mut loads, Duration::from_millis(500)).await?;
    again.kill();
    stop.store(true, Ordering::Relaxed);
    let mut seen: std::collections::HashSet<u64> = first.into_iter().collect();
    for l in loads {
        for id in l.await? {
            anyhow::ensure!(seen.insert(id), "id {id} issued twice");
        }
    }
    let refused = refused.ok_or_else(|| anyhow::anyhow!("started on the recreated cluster"))?;
    assert!(
        refused.contains("etcd prefix /f16 holds no fleet id")
            && refused.contains("shardflake fleet move"),
        "{refused}"
    );
    Ok(())
}

/// Review e5: a fleet moved to another etcd cluster with `fleet move`,
/// one node restarted there; the old cluster re-created empty. The other
/// node, restarted on it with its state file (which names the old
/// cluster), is refused, told that cluster and the move command, and not
/// told to put the fleet id back (before: told so, it then took node id 0
/// beside the moved node 0: 8,000 ids twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_a_fleet_moved_away_is_refused_on_its_old_cluster_recreated() -> anyhow::Result<()>
{
    let one = Etcd::start(1)?;
    let two = Etcd::start(1)?;
    let d = dirs(2)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    run_fleet(&one, "/e5", &d, &stop, &mut loads).await?;
    let (ok, said) = fleet_move(&[
        "--etcd",
        &one.urls(),
        "--etcd-prefix",
        "/e5",
        "--to-etcd",
        &two.urls(),
        "--to-prefix",
        "/e5",
    ])?;
    assert!(ok, "{said}");
    let mut a = leased(&two, "/e5", &d[0], &[])?;
    assert_eq!(a.ready(Duration::from_secs(30)).await?, 0);
    loads.push(ids_until(&a.http, &stop));
    // The old cluster, re-created empty (another cluster id).
    let recreated = Etcd::start(1)?;
    let mut b = leased(&recreated, "/e5", &d[1], &[])?;
    let refused = run_beside(&mut b, &stop, &mut loads, Duration::from_millis(1500)).await?;
    b.kill();
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    stop_cleanly(&mut a).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("started on the re-created cluster"))?;
    assert!(
        refused.contains("etcd prefix /e5 holds no fleet id")
            && refused.contains("names another etcd cluster")
            && refused.contains("shardflake fleet move")
            && !refused.contains("etcdctl put"),
        "{refused}"
    );
    Ok(())
}

/// Review e1c: a prefix deleted under its fleet. The refusal's advice puts
/// back a floor before the fleet id, and a node restarted then resumes
/// past the floor, not one window past its own clock (which, under a node
/// id whose holder's clock ran ahead, reissued that holder's ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_prefix_is_started_again_past_a_floor() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(1)?;
    let mut s = leased(&etcd, "/e1", &d[0], &[])?;
    s.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut s).await?;
    let fleet = etcd
        .get("/e1/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "--prefix", "/e1"])?;
    let e = refused(
        &d[0],
        &[
            "--etcd",
            &etcd.urls(),
            "--etcd-prefix",
            "/e1",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )
    .await?;
    assert!(
        e.contains("holds no fleet id")
            && e.contains("etcdctl put /e1/floor")
            && e.contains(&format!("etcdctl put /e1/fleet {fleet}")),
        "{e}"
    );
    // Review E5: the copy case first, where nothing put back is safe.
    let copy = e
        .find("If this etcd was restored or copied from another etcd cluster where the fleet may still run: put nothing back here")
        .ok_or_else(|| anyhow::anyhow!("no copy case: {e}"))?;
    assert!(copy < e.find("etcdctl put").unwrap_or(0), "{e}");
    // As the refusal says: the floor first, then the fleet id.
    let floor = now_ms()? + 7_000;
    etcd.put("/e1/floor", &floor.to_string()).await?;
    etcd.put("/e1/fleet", &fleet).await?;
    let s = leased(&etcd, "/e1", &d[0], &[])?;
    s.ready(Duration::from_secs(30)).await?;
    // Review R5: the wait on the floor is said, why and how long, at its
    // start and every few seconds.
    let log = s.stderr();
    assert!(
        log.contains("/e1/floor is ahead of this clock")
            && log.contains("ms for this clock to pass the high-water of the fleet's floor")
            && log.contains("still waiting"),
        "{log}"
    );
    let ids = load_for(&s, Duration::from_millis(300)).await?;
    // snowflake: 22 bits below the time, epoch 1288834974657 ms.
    let first = ids.iter().min().ok_or_else(|| anyhow::anyhow!("no id"))?;
    let stamped = (first >> 22) + 1_288_834_974_657;
    assert!(stamped > floor, "stamped {stamped}, floor {floor}");
    Ok(())
}

/// Review e1c: node 0 on a sound clock, node 1 20 s ahead; the prefix
/// deleted under them. Started again as the refusal says (a floor put back
/// before the fleet id), the fast node first (it takes id 0), then the
/// sound one (id 1, the fast node's old id): the sound one resumes past
/// the floor, not one window past its own clock, and no id repeats
/// (before, with the fleet id alone put back: 2,000 of the fast node's ids
/// issued again; here 613,500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_prefix_started_again_as_told_never_reissues_a_fast_clocks_ids()
-> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let libfaketime = shardflake_testkit::libfaketime()?.display().to_string();
    let ahead = [
        ("LD_PRELOAD", libfaketime.as_str()),
        ("FAKETIME", "+20s"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let urls = etcd.urls();
    let args = [
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/e1c",
        "--lease-ttl",
        "3s",
        "--window",
        "2s",
    ];
    let a = serve_in(&d[0], &args, &[])?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    let b = serve_in(&d[1], &args, &ahead)?;
    assert_eq!(b.ready(Duration::from_secs(20)).await?, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop), ids_until(&b.http, &stop)];
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut ids = Vec::new();
    for l in loads.drain(..) {
        ids.extend(l.await?);
    }
    for mut s in [a, b] {
        stop_cleanly(&mut s).await?;
    }
    let fleet = etcd
        .get("/e1c/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "--prefix", "/e1c"])?;
    // The floor: now plus the largest clock difference and the window.
    etcd.put("/e1c/floor", &(now_ms()? + 23_000).to_string())
        .await?;
    etcd.put("/e1c/fleet", &fleet).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let mut fast = serve_in(&d[1], &args, &ahead)?;
    let refused_fast = run_beside(&mut fast, &stop, &mut loads, Duration::ZERO).await?;
    let mut sound = serve_in(&d[0], &args, &[])?;
    let refused_sound = run_beside(&mut sound, &stop, &mut loads, Duration::from_secs(20)).await?;
    fast.kill();
    sound.kill();
    stop.store(true, Ordering::Relaxed);
    assert!(refused_fast.is_none(), "{refused_fast:?}");
    assert!(refused_sound.is_none(), "{refused_sound:?}");
    for l in loads.drain(..) {
        ids.extend(l.await?);
    }
    let total = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), total, "{} duplicates", total - ids.len());
    Ok(())
}

/// Review e3: a fleet moved to another etcd cluster with `fleet move`, its
/// nodes restarted there; the old cluster then restored from a snapshot
/// taken before the move, so its place is back, unretired. A node of the
/// moved fleet started there with its state file is refused for the
/// generation it remembers, and a brand-new node is refused until an
/// operator confirms the place (before: both took node ids there beside the
/// moved nodes and issued the same ids).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_cluster_restored_from_before_a_move_is_refused() -> anyhow::Result<()> {
    let one = Etcd::start(1)?;
    let two = Etcd::start(1)?;
    let d = dirs(4)?;
    // Some history, so that the restore shows (revision past raft index).
    for i in 0..20 {
        one.etcdctl(&["put", &format!("/other/{i}"), "x"])?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    run_fleet(&one, "/e3", &d[..2], &stop, &mut loads).await?;
    let snapshot = d[3].join("snapshot.db");
    tokio::task::block_in_place(|| one.snapshot(&snapshot))?;
    let (ok, said) = fleet_move(&[
        "--etcd",
        &one.urls(),
        "--etcd-prefix",
        "/e3",
        "--to-etcd",
        &two.urls(),
        "--to-prefix",
        "/e3",
    ])?;
    assert!(ok, "{said}");
    // Both nodes restart on the new cluster; node 1 then stops there.
    let a = leased(&two, "/e3", &d[0], &[])?;
    assert_eq!(a.ready(Duration::from_secs(30)).await?, 0);
    let mut b = leased(&two, "/e3", &d[1], &[])?;
    assert_eq!(b.ready(Duration::from_secs(30)).await?, 1);
    stop_cleanly(&mut b).await?;
    loads.push(ids_until(&a.http, &stop));
    tokio::task::block_in_place(|| one.restore(&snapshot))?;
    // Short waits: a node that wrongly starts issues beside a soon.
    let waits = ["--window", "2s", "--max-resume-wait", "1s"];
    let mut b = leased(&one, "/e3", &d[1], &waits)?;
    let refused_b = run_beside(&mut b, &stop, &mut loads, Duration::from_secs(4)).await?;
    b.kill();
    let mut fresh = leased(&one, "/e3", &d[2], &waits)?;
    let refused_fresh = run_beside(&mut fresh, &stop, &mut loads, Duration::from_secs(4)).await?;
    fresh.kill();
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused_b = refused_b.ok_or_else(|| anyhow::anyhow!("node 1 started at the old place"))?;
    assert!(
        refused_b.contains("holds generation 0 of fleet")
            && refused_b.contains("remembers generation 1"),
        "{refused_b}"
    );
    let refused_fresh =
        refused_fresh.ok_or_else(|| anyhow::anyhow!("a new node started at the old place"))?;
    assert!(
        refused_fresh.contains("restored from a snapshot")
            && refused_fresh.contains("shardflake fleet confirm --etcd URLS --etcd-prefix /e3"),
        "{refused_fresh}"
    );
    Ok(())
}

/// Review e4: a layout change (a new prefix, --previous-prefix, an epoch
/// 10 s earlier: ids above the old fleet's), the new fleet issuing; etcd
/// then restored from a snapshot taken before the change, so the old
/// prefix is back unretired and the new one gone. A brand-new node of the
/// old layout on the old prefix is refused until an operator confirms it
/// (before: it waited the restore out, then made the ids the new fleet
/// had made 10 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_layout_restored_from_before_a_layout_change_is_refused() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(4)?;
    for i in 0..20 {
        etcd.etcdctl(&["put", &format!("/other/{i}"), "x"])?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    run_fleet(&etcd, "/e4a", &d[..1], &stop, &mut loads).await?;
    let snapshot = d[3].join("snapshot.db");
    tokio::task::block_in_place(|| etcd.snapshot(&snapshot))?;
    // snowflake's fields, the epoch 10 s earlier.
    let layout = "time 41 | node 10 | sequence 12 (epoch 1288834964657)";
    let mut new = leased(
        &etcd,
        "/e4b",
        &d[1],
        &["--layout", layout, "--previous-prefix", "/e4a"],
    )?;
    assert_eq!(new.ready(Duration::from_secs(30)).await?, 0);
    loads.push(ids_until(&new.http, &stop));
    // The new layout's ids of these 10 s are the old one's of 10 s later.
    tokio::time::sleep(Duration::from_secs(10)).await;
    // Stopped (a node of it restarted after the restore would make the
    // layout change again, retiring the old prefix once more).
    stop_cleanly(&mut new).await?;
    tokio::task::block_in_place(|| etcd.restore(&snapshot))?;
    let waits = ["--window", "2s", "--max-resume-wait", "1s"];
    let mut old = leased(&etcd, "/e4a", &d[2], &waits)?;
    let refused_old = run_beside(&mut old, &stop, &mut loads, Duration::from_secs(6)).await?;
    old.kill();
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused_old =
        refused_old.ok_or_else(|| anyhow::anyhow!("a node of the old layout started"))?;
    assert!(
        refused_old.contains("restored from a snapshot")
            && refused_old.contains("shardflake fleet confirm --etcd URLS --etcd-prefix /e4a"),
        "{refused_old}"
    );
    Ok(())
}

/// An id's high-water deleted by hand (`etcdctl del <prefix>/hw/0`), its
/// `taken/0` stamp left: a take at the old place waits `--max-resume-wait`
/// past its clock for it (its holder may have stamped as far ahead as its
/// clock ran). `fleet move` carried no record for it and no stamp, so a
/// take at the new place waited only `--raise`. Now the move writes the
/// id's record `--max-resume-wait` past the clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_carries_the_wait_for_an_id_whose_record_was_deleted() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let urls = etcd.urls();
    let d = dirs(1)?;
    let mut s = leased(&etcd, "/tk", &d[0], &[])?;
    s.ready(Duration::from_secs(20)).await?;
    stop_cleanly(&mut s).await?;
    anyhow::ensure!(etcd.get("/tk/taken/0").await?.is_some(), "no stamp");
    etcd.etcdctl(&["del", "/tk/hw/0"])?;
    let before = now_ms()?;
    let (ok, said) = fleet_move(&[
        "--etcd",
        &urls,
        "--etcd-prefix",
        "/tk",
        "--to-prefix",
        "/tk2",
        "--raise",
        "2s",
        "--max-resume-wait",
        "7s",
    ])?;
    assert!(ok && said.contains("1 high-waters"), "{said}");
    let carried: u64 = etcd
        .get("/tk2/hw/0")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no record carried for node id 0"))?
        .parse()?;
    assert!(
        carried >= before + 7_000,
        "carried {carried}, moved at {before}"
    );
    Ok(())
}

/// A layout change (`/l1` to `/l2`), then etcd restored from a snapshot
/// taken after it: a new node without a state file on the new prefix
/// (`--previous-prefix` as the guide says, or without) cannot tell that
/// the fleet did not leave `/l2` after the snapshot, and is refused, told
/// `shardflake fleet confirm` for `/l2`; once confirmed, it starts there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_node_on_a_changed_layouts_prefix_after_a_restore_waits_for_confirm()
-> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(4)?;
    // A snapshot with some history: restored, its revision is past its
    // raft index.
    for i in 0..20 {
        etcd.etcdctl(&["put", &format!("/other/{i}"), "x"])?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    run_fleet(&etcd, "/l1", &d[..1], &stop, &mut loads).await?;
    // snowflake's fields, the epoch 10 s earlier: ids above the old ones.
    let layout = "time 41 | node 10 | sequence 12 (epoch 1288834964657)";
    let new_fleet = [
        "--layout",
        layout,
        "--previous-prefix",
        "/l1",
        "--window",
        "2s",
        "--max-resume-wait",
        "1s",
    ];
    let mut s = leased(&etcd, "/l2", &d[1], &new_fleet)?;
    s.ready(Duration::from_secs(30)).await?;
    loads.push(ids_until(&s.http, &stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_cleanly(&mut s).await?;
    let snapshot = d[3].join("snapshot.db");
    tokio::task::block_in_place(|| etcd.snapshot(&snapshot))?;
    tokio::task::block_in_place(|| etcd.restore(&snapshot))?;
    let urls = etcd.urls();
    let mut with_previous = vec!["--etcd", &urls, "--etcd-prefix", "/l2", "--lease-ttl", "3s"];
    with_previous.extend(new_fleet);
    let e = refused(&d[2], &with_previous, &[]).await?;
    assert!(
        e.contains("restored from a snapshot")
            && e.contains("shardflake fleet confirm --etcd URLS --etcd-prefix /l2"),
        "{e}"
    );
    let e = refused(&d[2], &with_previous[..with_previous.len() - 6], &[]).await?;
    assert!(
        e.contains("shardflake fleet confirm --etcd URLS --etcd-prefix /l2"),
        "{e}"
    );
    let (ok, said) = fleet_cmd("confirm", &["--etcd", &urls, "--etcd-prefix", "/l2"])?;
    assert!(ok && said.contains("confirmed /l2"), "{said}");
    let mut s = leased(&etcd, "/l2", &d[2], &new_fleet)?;
    if let Some(e) = started_or_refused(&mut s).await? {
        anyhow::bail!("refused after fleet confirm: {e}");
    }
    loads.push(ids_until(&s.http, &stop));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    stop_cleanly(&mut s).await?;
    Ok(())
}

/// Review: `etcdctl del --prefix shardflake` (no leading `/`) deleted the
/// fleets' registry under a running fleet, whose nodes never wrote it
/// back (only takes did): a second fleet of the same layout on another
/// prefix was accepted beside it (1,808,352 ids twice). A running node
/// now puts its fleet's registration back with its next high-water
/// record, and the second fleet is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_deleted_under_a_running_fleet_is_written_back() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let d = dirs(2)?;
    let a = leased(&etcd, "/reg-a", &d[0], &[])?;
    assert_eq!(a.ready(Duration::from_secs(20)).await?, 0);
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = vec![ids_until(&a.http, &stop)];
    let fleet = etcd
        .get("/reg-a/fleet")
        .await?
        .ok_or_else(|| anyhow::anyhow!("no fleet id"))?;
    etcd.etcdctl(&["del", "--prefix", "shardflake"])?;
    // Written back by the running node (it records every window or so).
    let key = format!("shardflake.fleets/{fleet}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while etcd.get(&key).await?.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{key} not written back by the running node in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut b = leased(&etcd, "/reg-b", &d[1], &[])?;
    let refused = run_beside(&mut b, &stop, &mut loads, Duration::from_millis(1500)).await?;
    b.kill();
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    let refused = refused.ok_or_else(|| anyhow::anyhow!("a second fleet started beside /reg-a"))?;
    assert!(
        refused.contains(&format!("would share ids with fleet {fleet}"))
            && refused.contains("under /reg-a"),
        "{refused}"
    );
    Ok(())
}

/// Review: after `fleet move` to another cluster, the old place cleaned
/// (`etcdctl del --prefix`), a fresh node there was refused with the
/// floor-and-fleet advice, which brought the fleet alive on both clusters
/// (1,086,592 ids twice). The move marks the fleet's registration in the
/// old cluster as moved, which outlives the delete: the fresh node is
/// told where the fleet went, and no floor to put back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_moved_to_another_cluster_is_not_started_again_where_it_was() -> anyhow::Result<()>
{
    let one = Etcd::start(1)?;
    let two = Etcd::start(1)?;
    let d = dirs(3)?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    run_fleet(&one, "/gone", &d[..1], &stop, &mut loads).await?;
    let (ok, said) = fleet_move(&[
        "--etcd",
        &one.urls(),
        "--etcd-prefix",
        "/gone",
        "--to-etcd",
        &two.urls(),
        "--to-prefix",
        "/gone",
    ])?;
    assert!(ok && said.contains("moved: /gone -> /gone"), "{said}");
    one.etcdctl(&["del", "--prefix", "/gone"])?;
    let e = refused(
        &d[1],
        &[
            "--etcd",
            &one.urls(),
            "--etcd-prefix",
            "/gone",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )
    .await?;
    assert!(
        e.contains("moved to /gone on etcd cluster=")
            && e.contains("start nodes there")
            && !e.contains("etcdctl put /gone/floor"),
        "{e}"
    );
    // A new fleet of its layout on another prefix there would make the
    // moved fleet's ids: refused, with advice that fits a fleet gone to
    // another cluster (before: "use --etcd-prefix /gone", a move from
    // /gone and --previous-prefix /gone, each refused there now).
    let e = refused(
        &d[2],
        &[
            "--etcd",
            &one.urls(),
            "--etcd-prefix",
            "/beside",
            "--lease-ttl",
            "3s",
        ],
        &[],
    )
    .await?;
    assert!(
        e.contains("would share ids with fleet")
            && e.contains("and moved to /gone on etcd cluster=")
            && e.contains("A node of that fleet: start it there")
            && e.contains("etcdctl del shardflake.fleets/")
            && !e.contains("--etcd-prefix /gone")
            && !e.contains("--previous-prefix /gone"),
        "{e}"
    );
    // The fleet runs where it went.
    run_fleet(&two, "/gone", &d[..1], &stop, &mut loads).await?;
    stop.store(true, Ordering::Relaxed);
    no_duplicates(loads).await?;
    Ok(())
}
