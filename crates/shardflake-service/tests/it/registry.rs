//! The etcd registry on a real etcd: a take records the new holder's first
//! high-water in its own transaction, always past the previous holder's.

use std::collections::HashSet;
use std::time::Duration;

use shardflake_service::config::NodeSource;
use shardflake_service::etcd::Op;
use shardflake_service::registry::{AcquireError, Claim, EtcdRegistry, Registry};
use shardflake_testkit::Etcd;

fn registry(etcd: &Etcd, prefix: &str) -> anyhow::Result<EtcdRegistry> {
    registry_with(etcd, prefix, "", "")
}

/// A registry whose configuration starts with the `top` lines and whose
/// `[etcd]` table also has the `extra` lines.
fn registry_with(
    etcd: &Etcd,
    prefix: &str,
    top: &str,
    extra: &str,
) -> anyhow::Result<EtcdRegistry> {
    let dir = tempfile::tempdir()?;
    let config = crate::config(
        &dir,
        &format!(
            "{top}\n[etcd]\nendpoints = [{:?}]\nprefix = {prefix:?}\n{extra}",
            etcd.urls()
        ),
    )?;
    let NodeSource::Etcd(cfg) = &config.node else {
        anyhow::bail!("not an etcd node source");
    };
    Ok(EtcdRegistry::new(cfg)?)
}

fn claim(now_ms: u64) -> Claim {
    Claim {
        max_node_id: 1023,
        ttl: Duration::from_secs(10),
        layout: b"test layout".to_vec(),
        earlier_layout: None,
        holder: "test".into(),
        now_ms,
        window_ms: 3_000,
        max_ahead_ms: 63_000,
        pinned: None,
        expected_registry: None,
        previous: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_records_the_first_high_water_past_the_previous_holders() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let r = registry(&etcd, "/r")?;
    let now = 1_800_000_000_000;
    // The cluster's first take: the layout record, id 0, no record before
    // it: a holder whose record was deleted may have stamped up to one
    // window past now, so the take resumes past that.
    let first = r.acquire(&claim(now)).await?;
    assert_eq!(
        (first.node_id, first.previous_high_water_ms),
        (0, now + 3_000)
    );
    assert_eq!(first.recorded_high_water_ms, Some(now + 6_000));
    assert_eq!(etcd.get("/r/hw/0").await?, Some((now + 6_000).to_string()));

    // Id 1 was used before, its holder's record ahead of our clock: the
    // take records past that record, never below it.
    etcd.put("/r/hw/1", &(now + 60_000).to_string()).await?;
    let second = r.acquire(&claim(now)).await?;
    assert_eq!(
        (second.node_id, second.previous_high_water_ms),
        (1, now + 60_000)
    );
    assert_eq!(second.recorded_high_water_ms, Some(now + 63_000));
    assert_eq!(etcd.get("/r/hw/1").await?, Some((now + 63_000).to_string()));

    // A corrupt record is refused before the id is taken.
    etcd.put("/r/hw/2", "yesterday").await?;
    let e = r.acquire(&claim(now)).await.unwrap_err();
    assert!(e.to_string().contains("yesterday"), "{e}");
    assert_eq!(etcd.keys("/r/node/").await?.len(), 2, "id 2 not taken");

    // After the previous holder's lease ends, the next take of its id
    // resumes after the record the take wrote.
    r.release(first.lease).await?;
    etcd.put("/r/hw/2", "0").await?;
    let again = r.acquire(&claim(now + 1)).await?;
    assert_eq!(
        (again.node_id, again.previous_high_water_ms),
        (0, now + 6_000)
    );
    assert_eq!(again.recorded_high_water_ms, Some(now + 9_000));
    Ok(())
}

/// A herd started together: distinct ids, the lowest ones (racing nodes
/// queue and each goes for the free id no node ahead of it is going for),
/// each id's record the one its take returned, and no node left queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_herd_takes_distinct_ids_each_with_its_own_record() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let now = 1_800_000_000_000;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let r = registry(&etcd, "/herd")?;
        tasks.push(tokio::spawn(async move { r.acquire(&claim(now)).await }));
    }
    let mut ids = HashSet::new();
    for task in tasks {
        let h = task.await??;
        assert!(ids.insert(h.node_id), "id {} taken twice", h.node_id);
        let record = etcd.get(&format!("/herd/hw/{}", h.node_id)).await?;
        assert_eq!(record, h.recorded_high_water_ms.map(|v| v.to_string()));
    }
    assert_eq!(ids, (0..32).collect::<HashSet<u64>>(), "the lowest 32 ids");
    assert_eq!(etcd.keys("/herd/queue/").await?, Vec::<String>::new());
    Ok(())
}

/// A node that finds others queued (they lost a race and are still trying)
/// goes behind them: with one queued, it takes the second lowest free id,
/// leaving the lowest to the node ahead. A queue key whose node died goes
/// with its lease, and then the lowest free id is taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_goes_behind_the_nodes_queued_before_it() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let r = registry(&etcd, "/q")?;
    let now = 1_800_000_000_000;
    assert_eq!(r.acquire(&claim(now)).await?.node_id, 0);
    // A node queued and still trying (its key attached to its lease).
    let client = etcd.client();
    let (waiting, _) = client.grant(30).await?;
    let key = format!("/q/queue/{waiting:x}").into_bytes();
    client
        .txn(&[], &[Op::Put(key, Vec::new(), waiting)], &[])
        .await?;
    assert_eq!(r.acquire(&claim(now)).await?.node_id, 2, "id 1 left to it");
    // It died: its key went with its lease.
    client.revoke(waiting).await?;
    assert_eq!(etcd.keys("/q/queue/").await?, Vec::<String>::new());
    assert_eq!(r.acquire(&claim(now)).await?.node_id, 1);
    Ok(())
}

/// Two herds with different layouts start together on an empty prefix:
/// the takes that write the layout record compare it absent, so exactly one
/// layout wins; every node of the other is refused, never given an id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herds_of_two_layouts_on_an_empty_prefix_leave_one_layout_holding_ids() -> anyhow::Result<()>
{
    let etcd = Etcd::start(1)?;
    let now = 1_800_000_000_000;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let r = registry(&etcd, "/two")?;
        let mut c = claim(now);
        c.layout = if i % 2 == 0 { b"layout a" } else { b"layout b" }.to_vec();
        tasks.push(tokio::spawn(async move {
            let held = r.acquire(&c).await;
            (c.layout, held)
        }));
    }
    let mut winners = Vec::new();
    let mut ids = HashSet::new();
    for task in tasks {
        match task.await? {
            (layout, Ok(h)) => {
                assert!(ids.insert(h.node_id), "id {} taken twice", h.node_id);
                winners.push(layout);
            }
            (_, Err(e)) => assert!(
                matches!(e, AcquireError::LayoutMismatch { .. }),
                "unexpected error: {e}"
            ),
        }
    }
    let record = etcd.get("/two/layout").await?.expect("a layout record");
    assert!(!winners.is_empty());
    for layout in &winners {
        assert_eq!(
            layout,
            record.as_bytes(),
            "a node holds an id under another layout"
        );
    }
    assert_eq!(etcd.keys("/two/node/").await?.len(), winners.len());
    Ok(())
}

/// Least privilege: a user whose role may read and write only under the
/// prefix (and the fleets' registry) takes ids there in a herd (losers queue under the prefix too),
/// and is refused, saying why, under another prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_allowed_only_the_prefix_takes_ids_there() -> anyhow::Result<()> {
    let mut etcd = Etcd::start(1)?;
    etcd.enable_auth("root-pw")?;
    for command in [
        "user add node --interactive=false --new-user-password=node-pw",
        "role add shardflake",
        "role grant-permission shardflake readwrite /least/ --prefix=true",
        "role grant-permission shardflake readwrite shardflake.fleets/ --prefix=true",
        "role grant-permission shardflake readwrite /shardflake.fleets/ --prefix=true",
        "user grant-role node shardflake",
    ] {
        etcd.etcdctl(&command.split(' ').collect::<Vec<_>>())?;
    }
    // Each client's first call logs in, a bcrypt check at etcd (16 clients
    // logging in together here went past the default 1 s timeout while each
    // call made a login of its own; etcd_login.rs has the herd now): a small
    // herd, the longest timeout the default TTL allows, and each client
    // logs in first (a renewal of no lease) so that the takes race.
    let (top, as_node) = (
        "window = \"6s\"",
        "user = \"node\"\npassword = \"node-pw\"\ntimeout = \"2s\"",
    );
    let now = 1_800_000_000_000;
    let mut tasks = Vec::new();
    let mut herd = Vec::new();
    for _ in 0..4 {
        let r = registry_with(&etcd, "/least", top, as_node)?;
        r.renew(0).await?;
        herd.push(r);
    }
    for r in herd {
        tasks.push(tokio::spawn(async move { r.acquire(&claim(now)).await }));
    }
    let mut ids = HashSet::new();
    for task in tasks {
        ids.insert(task.await??.node_id);
    }
    assert_eq!(ids, (0..4).collect::<HashSet<u64>>());
    assert_eq!(etcd.keys("/least/queue/").await?, Vec::<String>::new());
    let elsewhere = registry_with(&etcd, "/other", top, as_node)?;
    let e = elsewhere.acquire(&claim(now)).await.unwrap_err();
    assert!(e.to_string().contains("permission denied"), "{e}");
    assert!(
        e.to_string()
            .contains("readwrite on the whole --etcd-prefix"),
        "{e}"
    );
    Ok(())
}

/// A fleet whose layout record an earlier version wrote (no fixed fields):
/// a node whose record would name them takes ids there and keeps them
/// (its records compare the record as found); a node whose fixed fields
/// differ from a record that names them is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_layout_record_is_accepted_and_fixed_fields_compared()
-> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let now = 1_800_000_000_000;
    let dc = |n: u64| Claim {
        layout: format!("L; node id in field worker; fixed fields datacenter={n}").into_bytes(),
        earlier_layout: Some(b"L; node id in field worker".to_vec()),
        ..claim(now)
    };
    etcd.put("/old/layout", "L; node id in field worker")
        .await?;
    let r = registry(&etcd, "/old")?;
    let held = r.acquire(&dc(1)).await?;
    r.record_high_water(&held, now + 9_000).await?;
    assert_eq!(
        etcd.get("/old/layout").await?.as_deref(),
        Some("L; node id in field worker"),
        "the record is left as it is"
    );

    // Another cluster: on this one, /old's fleet names no fixed field, so
    // a fleet of this layout under another prefix could share its ids.
    let etcd = Etcd::start(1)?;
    let r = registry(&etcd, "/new")?;
    r.acquire(&dc(1)).await?;
    let other = registry(&etcd, "/new")?.acquire(&dc(2)).await;
    assert!(
        matches!(other, Err(AcquireError::LayoutMismatch { .. })),
        "{other:?}"
    );
    Ok(())
}
