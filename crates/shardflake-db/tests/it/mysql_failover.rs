//! MariaDB failover (issue 37, F2 and PR): a replica whose clock runs 4 s
//! behind its primary's (libfaketime), replication stopped while the
//! primary goes on making ids for 3 s, the primary killed, the replica
//! promoted (`STOP SLAVE; RESET SLAVE ALL`). Its sequence is as of the last
//! change it received, within its own clock's band: before, it made ids
//! the primary had made at once. Its clock event is `SLAVESIDE_DISABLED`
//! (no loop ran there until `mysql apply`). Now every insert is refused
//! until `mysql repair`, which refuses while its clock is off, then puts
//! the sequence past every id the primary made and starts the clock event.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use mysql_async::{Conn, Opts};
use shardflake::preset;
use shardflake_db::mysql::{self, Options};
use shardflake_testkit::MariaDbServer;

async fn conn(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).unwrap()).await.unwrap()
}

/// Waits, bounded, until the replica holds every row the primary holds
/// (and so every change of the sequence made before them).
fn wait_replicated(primary: &MariaDbServer, replica: &MariaDbServer) {
    let rows = "SELECT COUNT(*), MAX(id) FROM posts";
    let target = primary.sql(rows).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while replica.sql(rows).ok().as_deref() != Some(target.as_str()) {
        assert!(
            Instant::now() < deadline,
            "not replicated after 30 s: {}",
            replica.sql("SHOW SLAVE STATUS").unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_promoted_with_a_clock_behind_makes_no_id_the_old_primary_made() {
    let primary = MariaDbServer::start_with("--log-bin --server-id=1", None).unwrap();
    let clock = std::env::temp_dir().join(format!("s37-replica-clock-{}", std::process::id()));
    std::fs::write(&clock, "-4s").unwrap();
    let replica = MariaDbServer::start_with("--server-id=2", Some(&clock)).unwrap();
    let status = primary.sql("SHOW MASTER STATUS").unwrap();
    let mut fields = status.split('\t');
    let (file, pos) = (fields.next().unwrap(), fields.next().unwrap());
    replica
        .sql(&format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='root', \
             MASTER_PASSWORD='', MASTER_LOG_FILE='{file}', MASTER_LOG_POS={pos}; START SLAVE",
            primary.port
        ))
        .unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let opts = Options::default();
    let mut cp = conn(&primary.url()).await;
    mysql::apply(&mut cp, &layout, &opts).await.unwrap();
    let mut made = Vec::new();
    for _ in 0..200 {
        made.push(mysql::insert(&mut cp, &opts.names, 42, "x").await.unwrap());
    }
    wait_replicated(&primary, &replica);
    // Replication stops; the primary goes on for 3 s, then dies.
    replica.sql("STOP SLAVE").unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        made.push(mysql::insert(&mut cp, &opts.names, 42, "x").await.unwrap());
    }
    drop(cp);
    let was = identity(&primary);
    primary.kill().unwrap();
    replica.sql("RESET SLAVE ALL").unwrap();
    let max_made = *made.iter().max().unwrap();

    // Before any operator step: no id (on the old code, the primary's).
    let mut cr = conn(&replica.url()).await;
    match mysql::insert(&mut cr, &opts.names, 42, "x").await {
        Err(e) => assert!(e.to_string().contains("server_id"), "{e}"),
        Ok(first) => {
            let mut ids = vec![first];
            for _ in 0..200 {
                match mysql::insert(&mut cr, &opts.names, 42, "x").await {
                    Ok(id) => ids.push(id),
                    Err(_) => break,
                }
            }
            let seen: HashSet<i64> = made.iter().copied().collect();
            panic!(
                "the promoted replica made ids at once: {} of {} at or below the old primary's last, {} repeated",
                ids.iter().filter(|&&id| id <= max_made).count(),
                ids.len(),
                ids.iter().filter(|id| seen.contains(id)).count()
            );
        }
    }
    let e = mysql::generate_post_id(&mut cr, "generate_post_id", 42)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("server_id"), "{e}");
    let problems = mysql::check(&mut cr, &layout, &opts)
        .await
        .unwrap()
        .join("\n");
    for what in [
        "server_id 1, and this server is server_id 2",
        "behind this host's",
    ] {
        assert!(problems.contains(what), "{what}: {problems}");
    }
    // apply cannot lift it; repair refuses the clock 4 s behind (the
    // old primary named gone: it was killed).
    let e = mysql::apply(&mut cr, &layout, &opts).await.unwrap_err();
    assert!(e.to_string().contains("mysql repair"), "{e}");
    let gone = Options {
        old_server_gone: Some(was),
        ..Options::default()
    };
    let e = mysql::repair(&mut cr, &layout, &gone).await.unwrap_err();
    assert!(e.to_string().contains("behind this host's"), "{e}");
    // The clock corrected, repair puts the sequence past every id the old
    // primary made and starts the clock event there.
    std::fs::write(&clock, "+0").unwrap();
    mysql::repair(&mut cr, &layout, &gone).await.unwrap();
    let mut after = Vec::new();
    for _ in 0..200 {
        after.push(mysql::insert(&mut cr, &opts.names, 42, "x").await.unwrap());
    }
    after.push(
        mysql::generate_post_id(&mut cr, "generate_post_id", 42)
            .await
            .unwrap(),
    );
    assert!(
        after.iter().all(|&id| id > max_made),
        "ids at or below the old primary's last: {}",
        after.iter().filter(|&&id| id <= max_made).count()
    );
    assert!(
        mysql::clock_running(&mut cr, &opts.names).await.unwrap(),
        "the clock event runs on the promoted replica"
    );
    assert_eq!(
        mysql::check(&mut cr, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    let _ = std::fs::remove_file(&clock);
}

/// Review 3: `mysql check` on a promoted server named `mysql repair (not
/// mysql apply)`, then "re-run apply" for the trigger made for the old
/// `server_id` (apply is refused there). Now every line names repair,
/// and repair with values of its own (`--shards`, where the server it
/// copies still makes ids) records them. The promotion is a
/// `server_id` changed under the installed trigger, as a replica's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_server_is_told_one_way_out_and_it_works() {
    let server = MariaDbServer::start_with("--server-id=1", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let opts = Options::default();
    let mut c = conn(&server.url()).await;
    mysql::apply(&mut c, &layout, &opts).await.unwrap();
    let was = identity(&server);
    server.sql("SET GLOBAL server_id = 2").unwrap();
    // A session keeps the server_id it started with.
    drop(c);
    let mut c = conn(&server.url()).await;
    let problems = mysql::check(&mut c, &layout, &opts)
        .await
        .unwrap()
        .join("\n");
    assert!(problems.contains("shardflake mysql repair"), "{problems}");
    for misleading in [
        "re-run apply",
        "record this server with shardflake mysql apply",
    ] {
        assert!(!problems.contains(misleading), "{misleading}: {problems}");
    }
    let e = mysql::apply(&mut c, &layout, &opts).await.unwrap_err();
    assert!(e.to_string().contains("mysql repair"), "{e}");
    let own = Options {
        shards: Some((0, 511)),
        ..Options::default()
    };
    // Values of its own on its word alone: the server of server_id 1 may
    // still make ids for them.
    let e = mysql::repair(&mut c, &layout, &own).await.unwrap_err();
    assert!(e.to_string().contains("--old-server-gone"), "{e}");
    // Server_id 1 is gone: this is it, its server_id changed.
    let own = Options {
        old_server_gone: Some(was),
        ..own
    };
    mysql::repair(&mut c, &layout, &own).await.unwrap();
    assert_eq!(
        server
            .sql("SELECT CONCAT(lo, '-', hi) FROM shardflake.serves WHERE db = 'app'")
            .unwrap(),
        "0-511"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut c, &opts.names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop after repair");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        mysql::check(&mut c, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    assert!(mysql::insert(&mut c, &opts.names, 5, "x").await.is_ok());
    assert!(mysql::insert(&mut c, &opts.names, 600, "x").await.is_err());
}

/// How far, in ms, `server`'s id sequence runs ahead of its clock.
fn sequence_lead_ms(server: &MariaDbServer) -> i64 {
    server
        .sql("SELECT (next_not_cached_value DIV 1024) - (TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'2023-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000) FROM app.posts_id_seq")
        .unwrap()
        .parse()
        .unwrap()
}

/// Review A8c: `mysql repair --peer P` (no `--shards`) on a promoted
/// server whose record meets P's logged that it moved the sequence, then
/// failed with "apply: nothing was changed: peer ... meets": it was
/// `repair`, and the sequence and high-water had moved. Now it is
/// refused before any change, as `repair`, and `--shards` of its own is
/// the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_with_a_peer_meeting_its_values_is_refused_before_any_change() {
    let (r, p) = (
        MariaDbServer::start_with("--server-id=1", None).unwrap(),
        MariaDbServer::start_with("--server-id=7", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut cr = conn(&r.url()).await;
    mysql::apply(&mut cr, &layout, &Options::default())
        .await
        .unwrap();
    let mut cp = conn(&p.url()).await;
    let own = Options {
        shards: Some((0, 383)),
        ..Options::default()
    };
    mysql::apply(&mut cp, &layout, &own).await.unwrap();
    // r promoted: its trigger was made for server_id 1.
    let was = identity(&r);
    r.sql("SET GLOBAL server_id = 2").unwrap();
    drop(cr);
    let mut cr = conn(&r.url()).await;
    let with_peer = Options {
        peers: vec![p.url()],
        ..Options::default()
    };
    let e = mysql::repair(&mut cr, &layout, &with_peer)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!(
            "mysql: repair: nothing was changed: peer {} makes ids of app.posts for shard values 0-383, which meets 0-1023",
            p.url()
        )),
        "{e}"
    );
    // Nothing moved: repair would have put it past the clock + 1.5 s.
    assert!(sequence_lead_ms(&r) < 500, "{}", sequence_lead_ms(&r));
    let e = mysql::insert(&mut cr, &own.names, 400, "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("installed for server_id 1"), "{e}");
    // The way out it names: values of its own.
    let rest = Options {
        shards: Some((384, 1023)),
        peers: vec![p.url()],
        old_server_gone: Some(was),
        ..Options::default()
    };
    mysql::repair(&mut cr, &layout, &rest).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut cr, &rest.names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop after repair");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(mysql::insert(&mut cr, &rest.names, 400, "x").await.is_ok());
    assert!(mysql::insert(&mut cr, &rest.names, 5, "x").await.is_err());
}

/// What `repair --old-server-gone` names for `server`:
/// `SERVER_ID:PORT:DATADIR`, as the refusals print it.
fn identity(server: &MariaDbServer) -> String {
    server
        .sql("SELECT CONCAT(@@server_id, ':', @@port, ':', @@datadir)")
        .unwrap()
}

/// A primary (`server_id` 1, binary log) and a replica of it (2),
/// replicating, with the ids applied on the primary and replicated.
async fn primary_and_replica() -> (MariaDbServer, MariaDbServer) {
    let primary = MariaDbServer::start_with("--log-bin --server-id=1", None).unwrap();
    let replica = MariaDbServer::start_with("--server-id=2", None).unwrap();
    let status = primary.sql("SHOW MASTER STATUS").unwrap();
    let mut fields = status.split('\t');
    let (file, pos) = (fields.next().unwrap(), fields.next().unwrap());
    replica
        .sql(&format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={}, MASTER_USER='root', \
             MASTER_PASSWORD='', MASTER_LOG_FILE='{file}', MASTER_LOG_POS={pos}; START SLAVE",
            primary.port
        ))
        .unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let opts = Options::default();
    let mut cp = conn(&primary.url()).await;
    mysql::apply(&mut cp, &layout, &opts).await.unwrap();
    for _ in 0..20 {
        mysql::insert(&mut cp, &opts.names, 42, "x").await.unwrap();
    }
    wait_replicated(&primary, &replica);
    (primary, replica)
}

/// Review E7: a replica promoted while its old primary still ran; a
/// plain `mysql repair` on it recorded it for all the primary's shard
/// values, and both served (454 of 8,000 ids twice). Now `repair` there
/// is refused, changing nothing, unless the old primary is proven out of
/// the way: named with `--peer` once it holds none of the values the
/// replica takes, or named gone, exactly, with `--old-server-gone`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_on_a_replica_promoted_beside_its_running_primary_needs_proof() {
    let (primary, replica) = primary_and_replica().await;
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let was = identity(&primary);
    replica.sql("STOP SLAVE; RESET SLAVE ALL").unwrap();
    let mut cr = conn(&replica.url()).await;
    // Plain repair, values of its own named on its word alone, a wrong
    // name, and the primary named while it still records every value.
    let refused = [
        Options::default(),
        Options {
            shards: Some((512, 1023)),
            ..Options::default()
        },
        Options {
            old_server_gone: Some(identity(&replica)),
            ..Options::default()
        },
        Options {
            peers: vec![primary.url()],
            ..Options::default()
        },
    ];
    for opts in &refused {
        let e = match mysql::repair(&mut cr, &layout, opts).await {
            Ok(r) => panic!(
                "repair (shards {:?}, peers {:?}, gone {:?}) took the running primary's values: {r:?}",
                opts.shards, opts.peers, opts.old_server_gone
            ),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("nothing was changed"), "{e}");
        assert!(mysql::insert(&mut cr, &names, 42, "x").await.is_err());
    }
    let e = mysql::insert(&mut cr, &names, 42, "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "shardflake mysql repair --old-server-gone '{was}'"
        )),
        "{e}"
    );
    let problems = mysql::check(&mut cr, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains(&format!("--old-server-gone '{was}'")),
        "{problems}"
    );
    // The proof: the primary keeps 0-511, the replica takes the rest
    // naming it.
    let mut cp = conn(&primary.url()).await;
    mysql::apply(
        &mut cp,
        &layout,
        &Options {
            shards: Some((0, 511)),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    mysql::repair(
        &mut cr,
        &layout,
        &Options {
            shards: Some((512, 1023)),
            peers: vec![primary.url()],
            ..Options::default()
        },
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut cr, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop after repair");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(mysql::insert(&mut cr, &names, 600, "x").await.is_ok());
    assert!(mysql::insert(&mut cr, &names, 42, "x").await.is_err());
    assert!(mysql::insert(&mut cp, &names, 42, "x").await.is_ok());
    assert!(mysql::insert(&mut cp, &names, 600, "x").await.is_err());
}
