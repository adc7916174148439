//! MariaDB shards with an owner (issue 37, B): the shard field is the key
//! (`user_id`) mod 2^shard_bits, not a server, so two servers inserting
//! rows of users whose ids are equal mod 1024 made identical ids (3,463 of
//! 46,448). Each server now records the shard values it makes ids for;
//! `apply` refuses values another server of the deployment records, and
//! the trigger and `generate_post_id` refuse a key outside them.

use std::time::{Duration, Instant};

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use shardflake::preset;
use shardflake_db::mysql::{self, Options};
use shardflake_testkit::MariaDbServer;

async fn conn(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).unwrap()).await.unwrap()
}

/// `mariadb-dump` of database `db` of `server`, with its triggers,
/// routines and events, into a file (its path).
fn dump(server: &MariaDbServer, db: &str, tag: &str) -> std::path::PathBuf {
    let out = std::process::Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", server.port))
        .args(["--triggers", "--routines", "--events", db])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let file = std::env::temp_dir().join(format!("sf-{tag}-{}.sql", std::process::id()));
    std::fs::write(&file, &out.stdout).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_never_make_ids_for_one_shard_value() {
    let (a, b) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let with = |shards: Option<(u64, u64)>, peers: &[&MariaDbServer]| Options {
        shards,
        peers: peers.iter().map(|s| s.url()).collect(),
        ..Options::default()
    };
    let (mut ca, mut cb) = (conn(&a.url()).await, conn(&b.url()).await);
    mysql::apply(&mut ca, &layout, &with(Some((0, 511)), &[]))
        .await
        .unwrap();
    // b may not take values a has, nor all of them (the default).
    for shards in [Some((500, 1023)), None] {
        let e = mysql::apply(&mut cb, &layout, &with(shards, &[&a]))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("shard values 0-511, which meets"), "{e}");
        assert!(e.contains("nothing was changed"), "{e}");
    }
    let installed: String = b
        .sql("SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'app'")
        .unwrap();
    assert_eq!(installed, "0", "a refused apply installs nothing");
    mysql::apply(&mut cb, &layout, &with(Some((512, 1023)), &[&a]))
        .await
        .unwrap();

    // Users 5 and 5 + 1024 share shard value 5: only a makes their ids.
    let names = Options::default().names;
    let id = mysql::insert(&mut ca, &names, 5, "x").await.unwrap();
    assert!(id > 0);
    let e = mysql::insert(&mut cb, &names, 5 + 1024, "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "shard value 5 (the key mod 1024) is not one this server makes ids for (512-1023)"
        ),
        "{e}"
    );
    let e = mysql::generate_post_id(&mut cb, "generate_post_id", 5)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard value 5"), "{e}");
    assert!(mysql::insert(&mut cb, &names, 600, "x").await.is_ok());
    assert!(
        mysql::generate_post_id(&mut cb, "generate_post_id", 600)
            .await
            .is_ok()
    );
    // The record holds: check and repair keep the range, apply without
    // --shards keeps it.
    let opts = Options::default();
    assert_eq!(
        mysql::check(&mut cb, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    mysql::repair(&mut cb, &layout, &opts).await.unwrap();
    mysql::apply(&mut cb, &layout, &opts).await.unwrap();
    assert!(mysql::insert(&mut cb, &names, 5, "x").await.is_err());
    assert_eq!(
        mysql::check(&mut cb, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    // A range outside the layout is refused.
    let e = mysql::apply(&mut ca, &layout, &with(Some((0, 1024)), &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a range within 0-1023"), "{e}");
}

/// E9 on MariaDB: the URL's database changed from `app` to `app2` on the
/// same server. Before, `apply` installed a second sequence and trigger
/// there for every shard value, and with writers on both databases the
/// two tables made the same ids. Now a first apply meeting the shard
/// values another database of the server makes ids of the same table for
/// is refused before anything changes; `--new-deployment` (a separate
/// table) or shard values of its own go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_changed_to_another_database_of_the_server_is_refused() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut app = conn(&server.url()).await;
    mysql::apply(&mut app, &layout, &Options::default())
        .await
        .unwrap();
    server.sql("CREATE DATABASE app2").unwrap();
    let url2 = server.url().replace("/app", "/app2");
    let mut app2 = conn(&url2).await;
    let refused = mysql::apply(&mut app2, &layout, &Options::default()).await;
    let installed: String = server
        .sql("SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'app2'")
        .unwrap();
    if installed != "0" {
        // What the old code let happen: both databases make ids.
        let names = Options::default().names;
        let mut same = 0;
        for user in 0..2000 {
            let x = mysql::insert(&mut app, &names, user, "x").await.unwrap();
            let y = mysql::insert(&mut app2, &names, user, "x").await.unwrap();
            same += usize::from(x == y);
        }
        panic!("apply installed the ids in app2 too ({same} of 2000 pairs of ids equal)");
    }
    let e = refused
        .expect_err("a second database of the server took the table's ids")
        .to_string();
    assert!(
        e.contains("nothing was changed")
            && e.contains(
                "database app of this server makes ids of app.posts for shard values 0-1023"
            )
            && e.contains("shardflake mysql apply --new-deployment"),
        "{e}"
    );
    // Shard values of its own: no id of app's can be made there.
    mysql::apply(
        &mut app,
        &layout,
        &Options {
            shards: Some((0, 511)),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    mysql::apply(
        &mut app2,
        &layout,
        &Options {
            shards: Some((512, 1023)),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    // A separate table in a third database: the operator's word.
    server.sql("CREATE DATABASE app3").unwrap();
    let mut app3 = conn(&server.url().replace("/app", "/app3")).await;
    let e = mysql::apply(&mut app3, &layout, &Options::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("database app2 of this server"), "{e}");
    let separate = Options {
        new_deployment: true,
        ..Options::default()
    };
    mysql::apply(&mut app3, &layout, &separate).await.unwrap();
    // Recorded now: a later apply there needs no flag.
    mysql::apply(&mut app3, &layout, &Options::default())
        .await
        .unwrap();
}

/// M3: one server's dump (its database and shardflake's records) restored
/// onto a second server with the same `server_id` (1, MariaDB's default):
/// the trigger's `@@server_id` test passes on both, so both made ids for
/// every shard value (236 common ids in the review). Nothing in a logical
/// copy tells the servers apart at insert time; what does is the record
/// of which server makes the ids (`@@hostname:@@port:@@datadir`): `check`
/// on the copy now names it, and `apply` there is refused until the
/// operator says which shard values it makes ids for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_restored_from_a_servers_dump_is_named_until_given_its_values() {
    let (x, y) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut cx = conn(&x.url()).await;
    mysql::apply(&mut cx, &layout, &Options::default())
        .await
        .unwrap();
    for user in 0..100 {
        mysql::insert(&mut cx, &names, user, "x").await.unwrap();
    }
    let out = std::process::Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", x.port))
        .args(["--triggers", "--routines", "--events"])
        .args(["--databases", "app", "shardflake"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let file = std::env::temp_dir().join(format!("sf-m3-{}.sql", std::process::id()));
    std::fs::write(&file, &out.stdout).unwrap();
    y.load(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let mut cy = conn(&y.url()).await;
    let problems = mysql::check(&mut cy, &layout, &Options::default())
        .await
        .unwrap();
    assert!(
        problems.iter().any(|p| p.contains("a copy of that server")
            && p.contains("shardflake mysql apply --shards LO-HI --peer")),
        "{problems:?}"
    );
    assert_eq!(
        mysql::check(&mut cx, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    let e = mysql::apply(&mut cy, &layout, &Options::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing was changed") && e.contains("a copy of that server"),
        "{e}"
    );
    // The operator splits the values: x keeps 0-511, the copy takes the rest.
    let with = |shards, peers: Vec<String>| Options {
        shards: Some(shards),
        peers,
        ..Options::default()
    };
    mysql::apply(&mut cx, &layout, &with((0, 511), Vec::new()))
        .await
        .unwrap();
    mysql::apply(&mut cy, &layout, &with((512, 1023), vec![x.url()]))
        .await
        .unwrap();
    assert_eq!(
        mysql::check(&mut cy, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    let e = mysql::insert(&mut cy, &names, 5, "y")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard value 5"), "{e}");
}

/// M11: a copy of a database within one server (`mariadb-dump app |
/// mariadb app9`). The copy's objects name the original's high-water
/// (`shardflake`.`app.posts_id_seq`): its clock event found its own
/// sequence below that high-water and moved it to the mark that refuses
/// every draw, so the original refused every insert ("below its
/// high-water ... run shardflake mysql repair"), again after each repair,
/// while the copy's event ran. Now the copy's event runs no loop and its
/// trigger, repair and check name the copy and its ways out; the
/// original keeps making ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_of_the_database_on_its_server_leaves_the_original_making_ids() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut app = conn(&server.url()).await;
    mysql::apply(&mut app, &layout, &Options::default())
        .await
        .unwrap();
    for user in 0..100 {
        mysql::insert(&mut app, &names, user, "x").await.unwrap();
    }
    let file = dump(&server, "app", "m11");
    server.sql("CREATE DATABASE app9").unwrap();
    let loaded = std::process::Command::new("mariadb")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", server.port))
        .arg("app9")
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(loaded.status.success(), "{loaded:?}");
    // The copy's event has fired; its start waits about a second, then a
    // loop would look at the high-water every millisecond or so.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fired: String = server
            .sql("SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = 'app9' AND LAST_EXECUTED IS NOT NULL")
            .unwrap();
        if fired == "1" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the copy's clock event never fired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let until = Instant::now() + Duration::from_secs(4);
    let mut made = 0;
    while Instant::now() < until {
        if let Err(e) = mysql::insert(&mut app, &names, made % 1024, "after the copy").await {
            panic!("the original refused an insert after {made} while its copy's event ran: {e}");
        }
        made += 1;
    }
    let url9 = server.url().replace("/app", "/app9");
    let mut app9 = conn(&url9).await;
    let e = mysql::insert(&mut app9, &names, 1, "copy")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("installed for database app, this is database app9")
            && e.contains("mysql apply --new-deployment"),
        "{e}"
    );
    let problems = mysql::check(&mut app9, &layout, &Options::default())
        .await
        .unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("was installed for database app: app9 is a copy of it")),
        "{problems:?}"
    );
    let e = mysql::repair(&mut app9, &layout, &Options::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing was changed") && e.contains("app9 is a copy of it"),
        "{e}"
    );
    assert_eq!(
        mysql::check(&mut app, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    // apply on the copy: refused for values app records; for values of
    // its own it makes ids for those only, and app keeps its own.
    let shards = |lo, hi| Options {
        shards: Some((lo, hi)),
        ..Options::default()
    };
    let e = mysql::apply(&mut app9, &layout, &shards(0, 10))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing was changed")
            && e.contains("database app of this server makes ids of app.posts"),
        "{e}"
    );
    mysql::apply(&mut app, &layout, &shards(0, 511))
        .await
        .unwrap();
    mysql::apply(&mut app9, &layout, &shards(600, 700))
        .await
        .unwrap();
    let copy_id = mysql::insert(&mut app9, &names, 600, "copy").await.unwrap();
    assert!(mysql::insert(&mut app9, &names, 5, "copy").await.is_err());
    let original_id = mysql::insert(&mut app, &names, 5, "original")
        .await
        .unwrap();
    assert_ne!(copy_id, original_id);
    // A separate table: the operator's word, and the copy makes ids.
    let separate = Options {
        new_deployment: true,
        ..shards(0, 1023)
    };
    mysql::apply(&mut app9, &layout, &separate).await.unwrap();
    mysql::insert(&mut app9, &names, 1, "copy").await.unwrap();
    mysql::insert(&mut app, &names, 1, "original")
        .await
        .unwrap();
}

/// M9: the application's database alone (`mariadb-dump app`) loaded into
/// another server: no high-water and no record of the shard values it
/// makes ids for. `mysql repair` made it insert for every shard value,
/// recording none (4,811 ids in common with the original in the review).
/// Now repair refuses there until given values (`--shards`), none a
/// `--peer` records, records them and reinstalls the trigger for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_alone_on_another_server_is_repaired_only_with_its_values() {
    let (x, y) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut cx = conn(&x.url()).await;
    mysql::apply(&mut cx, &layout, &Options::default())
        .await
        .unwrap();
    for user in 0..100 {
        mysql::insert(&mut cx, &names, user, "x").await.unwrap();
    }
    let file = dump(&x, "app", "m9");
    y.load(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let mut cy = conn(&y.url()).await;
    assert!(mysql::insert(&mut cy, &names, 1, "y").await.is_err());
    let e = mysql::repair(&mut cy, &layout, &Options::default())
        .await
        .expect_err("repair made the copy a server for every shard value, recording none")
        .to_string();
    assert!(
        e.contains("records no shard values")
            && e.contains("shardflake mysql repair --shards LO-HI --peer"),
        "{e}"
    );
    // The same state is what a repair racing an adopt or apply that has
    // not recorded them yet sees: the message says so, and to rerun.
    assert!(
        e.contains("is running at this moment") && e.contains("run this command again"),
        "{e}"
    );
    // apply there without --shards would record every value too.
    let e = mysql::apply(&mut cy, &layout, &Options::default())
        .await
        .expect_err("apply made the copy a server for every shard value")
        .to_string();
    assert!(
        e.contains("records no shard values")
            && e.contains("shardflake mysql apply --shards LO-HI --peer"),
        "{e}"
    );
    let with = |shards, peers: Vec<String>| Options {
        shards: Some(shards),
        peers,
        ..Options::default()
    };
    // x still makes ids for all of them.
    let e = mysql::repair(&mut cy, &layout, &with((512, 1023), vec![x.url()]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard values 0-1023, which meets"), "{e}");
    mysql::apply(&mut cx, &layout, &with((0, 511), Vec::new()))
        .await
        .unwrap();
    mysql::repair(&mut cy, &layout, &with((512, 1023), vec![x.url()]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut cy, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop on the copy");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        mysql::check(&mut cy, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    let e = mysql::insert(&mut cy, &names, 5, "y")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard value 5"), "{e}");
    mysql::insert(&mut cy, &names, 600, "y").await.unwrap();
    let recorded: String = y
        .sql("SELECT CONCAT(lo, '-', hi) FROM shardflake.serves WHERE db = 'app'")
        .unwrap();
    assert_eq!(recorded, "512-1023");
}

/// Issue 37: the record of which server makes the ids named the server by
/// `@@hostname:@@port:@@datadir`, so a healthy server whose hostname
/// changed (a renamed host, a container given a new name) failed `mysql
/// check` as "a copy of that server", and `mysql apply` there was refused.
/// The record now carries MariaDB's `server_uid` (a hash of the port and
/// the machine's MAC address) too: the same port and data directory with
/// the same `server_uid` is the same server, whatever its hostname. A
/// record of another machine (another hostname and `server_uid`), and one
/// written before it carried a `server_uid` under another hostname, are
/// still named. The hostname is changed in the record, as a record
/// written before the rename reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_host_is_the_same_server_and_another_machine_is_named() {
    let x = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut c = conn(&x.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    let check = async |c: &mut Conn| mysql::check(c, &layout, &Options::default()).await.unwrap();
    assert_eq!(check(&mut c).await, Vec::<String>::new());
    let recorded = x
        .sql("SELECT server FROM shardflake.serves WHERE tbl = 'posts'")
        .unwrap();
    let host = x.sql("SELECT @@hostname").unwrap();
    let rest = recorded
        .strip_prefix(&format!("{host}:"))
        .unwrap_or_else(|| panic!("{recorded:?} does not start with {host:?}"));
    let record = |server: &str| {
        x.sql(&format!(
            "UPDATE shardflake.serves SET server = '{server}' WHERE tbl = 'posts'"
        ))
        .unwrap();
    };

    // Written before the host was renamed: the same server.
    record(&format!("old-name-of-this-host:{rest}"));
    assert_eq!(
        check(&mut c).await,
        Vec::<String>::new(),
        "a hostname change alone made check fail"
    );
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();

    // Another machine, same port and data directory: named.
    let (place, _) = rest
        .rsplit_once(" (server_uid ")
        .unwrap_or_else(|| panic!("{rest:?} carries no server_uid"));
    for other in [
        format!("another-machine:{place} (server_uid AnotherMachinesUid=)"),
        // Written before records carried a server_uid.
        format!("another-machine:{place}"),
    ] {
        record(&other);
        let problems = check(&mut c).await;
        assert!(
            problems
                .iter()
                .any(|p| p.contains("a copy of that server") && p.contains("another-machine")),
            "{other}: {problems:?}"
        );
    }
}

/// Review 4a/4b/4d: shard values handed from a live server to one whose
/// clock is behind. The giver made ids for them up to its own clock; the
/// taker, its clock up to the bound behind the host's and the giver's
/// ahead, made ids from its own clock: the same ids for the same key
/// (158 of 24,886 at −0.45 s). Now `apply --peer` puts the taker's
/// sequence past the giver's (read after the giver let the values go),
/// refuses a giver further ahead than a draw may run, and refuses a
/// taker's clock past the bound, as `check` and `repair` do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_taken_from_a_live_peer_get_ids_above_the_peers_whatever_the_clocks() {
    let clock = |tag: &str, offset: &str| {
        let file = std::env::temp_dir().join(format!("sf-hand-{tag}-{}", std::process::id()));
        std::fs::write(&file, offset).unwrap();
        file
    };
    // Both inside the 0.5 s bound of this host, 0.8 s apart.
    let (giver_clock, taker_clock) = (clock("giver", "+0.4"), clock("taker", "-0.4"));
    let giver = MariaDbServer::start_with("", Some(&giver_clock)).unwrap();
    let taker = MariaDbServer::start_with("", Some(&taker_clock)).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let with = |shards, peers: &[&MariaDbServer]| Options {
        shards: Some(shards),
        peers: peers.iter().map(|s| s.url()).collect(),
        ..Options::default()
    };
    let (mut cg, mut ct) = (conn(&giver.url()).await, conn(&taker.url()).await);
    mysql::apply(&mut cg, &layout, &with((512, 1023), &[]))
        .await
        .unwrap();
    mysql::apply(&mut ct, &layout, &with((0, 511), &[&giver]))
        .await
        .unwrap();
    // Key 600 (shard value 600) on the giver, up to the hand-over.
    let mut given = Vec::new();
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        given.push(mysql::insert(&mut cg, &names, 600, "g").await.unwrap());
    }
    mysql::apply(&mut cg, &layout, &with((768, 1023), &[]))
        .await
        .unwrap();
    mysql::apply(&mut ct, &layout, &with((0, 767), &[&giver]))
        .await
        .unwrap();
    let mut taken = Vec::new();
    for _ in 0..2000 {
        taken.push(mysql::insert(&mut ct, &names, 600, "t").await.unwrap());
    }
    let last_given = *given.iter().max().unwrap();
    let seen: std::collections::HashSet<i64> = given.iter().copied().collect();
    assert!(
        taken.iter().all(|&id| id > last_given),
        "{} of {} ids of the taker at or below the giver's last, {} made twice",
        taken.iter().filter(|&&id| id <= last_given).count(),
        taken.len(),
        taken.iter().filter(|id| seen.contains(id)).count()
    );

    // A giver whose sequence ran further ahead of the taker's clock than
    // a draw may (its own clock ahead, or a burst borrowing time): the
    // taker would wait or refuse; apply refuses, changing nothing.
    mysql::apply(&mut ct, &layout, &with((0, 511), &[&giver]))
        .await
        .unwrap();
    let ahead: i64 = cg
        .query_first("SELECT next_not_cached_value + (3000 << 10) FROM posts_id_seq")
        .await
        .unwrap()
        .unwrap();
    cg.query_drop(format!("DO SETVAL(posts_id_seq, {ahead}, 0)"))
        .await
        .unwrap();
    let e = mysql::apply(&mut ct, &layout, &with((0, 767), &[&giver]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing was changed") && e.contains("ahead of this server's clock"),
        "{e}"
    );
    assert!(
        mysql::insert(&mut ct, &names, 600, "t").await.is_err(),
        "a refused apply keeps the values it had"
    );

    // The taker's clock 3 s behind this host's: apply refuses it, as
    // check names it.
    std::fs::write(&taker_clock, "-3").unwrap();
    let problems = mysql::check(&mut ct, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(problems.contains("behind this host's"), "{problems}");
    let e = mysql::apply(&mut ct, &layout, &with((0, 767), &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("behind this host's"), "{e}");
    for file in [giver_clock, taker_clock] {
        let _ = std::fs::remove_file(file);
    }
}

/// Calls every procedure `apply` installed in database `app` of `server`
/// for shard key `key`: each one's name and its answer.
async fn call_each_procedure(
    server: &MariaDbServer,
    c: &mut Conn,
    key: i64,
) -> Vec<(String, Result<i64, String>)> {
    let procedures = server
        .sql("SELECT GROUP_CONCAT(ROUTINE_NAME ORDER BY 1) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = 'app' AND ROUTINE_TYPE = 'PROCEDURE'")
        .unwrap();
    assert_eq!(procedures, "generate_post_id,generate_post_id_locked");
    let mut answers = Vec::new();
    for p in procedures.split(',') {
        let answer = mysql::generate_post_id(c, p, key)
            .await
            .map_err(|e| e.to_string());
        answers.push((p.to_string(), answer));
    }
    answers
}

/// Issue 37, A7: `generate_post_id_locked` made ids for shard values the
/// server did not record (P recording 0-511 answered `CALL
/// generate_post_id_locked(700, @id)`), so after a hand-over both servers
/// made ids for one value (314 of 18,539 twice). Every way of making an
/// id `apply` installs, the trigger and each procedure, now refuses a
/// value the server does not record, makes none while the clock event's
/// loop is stopped, and none on another `server_id` until `repair`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_of_making_an_id_applies_the_triggers_guards() {
    let server = MariaDbServer::start_with("--server-id=1", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut c = conn(&server.url()).await;
    let own = Options {
        shards: Some((0, 511)),
        ..Options::default()
    };
    mysql::apply(&mut c, &layout, &own).await.unwrap();
    for (p, answer) in call_each_procedure(&server, &mut c, 5).await {
        assert!(answer.is_ok(), "{p}: {answer:?}");
    }
    assert!(mysql::insert(&mut c, &names, 5, "x").await.is_ok());
    for (p, answer) in call_each_procedure(&server, &mut c, 700).await {
        let e = answer.unwrap_err();
        assert!(
            e.contains(
                "shard value 700 (the key mod 1024) is not one this server makes ids for (0-511)"
            ),
            "{p}: {e}"
        );
    }
    let e = mysql::insert(&mut c, &names, 700, "x").await.unwrap_err();
    assert!(e.to_string().contains("shard value 700"), "{e}");

    // The clock event's loop stopped: no id from any of them.
    c.query_drop("SET GLOBAL event_scheduler = OFF")
        .await
        .unwrap();
    let holder: Option<u64> = c
        .query_first::<Option<u64>, _>(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .unwrap()
        .flatten();
    if let Some(id) = holder {
        c.query_drop(format!("KILL CONNECTION {id}")).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while mysql::clock_running(&mut c, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "the clock loop never stopped");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (p, answer) in call_each_procedure(&server, &mut c, 5).await {
        let e = answer.unwrap_err();
        assert!(
            e.contains("the clock event posts_id_clock is not running"),
            "{p}: {e}"
        );
    }
    c.query_drop("SET GLOBAL event_scheduler = ON")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut c, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "the clock loop never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Another server_id (a promoted replica, a copy): none until repair.
    let was = identity(&server);
    server.sql("SET GLOBAL server_id = 2").unwrap();
    drop(c);
    let mut c = conn(&server.url()).await;
    assert_eq!(server.sql("SELECT @@server_id").unwrap(), "2");
    for (p, answer) in call_each_procedure(&server, &mut c, 5).await {
        let e = match answer {
            Ok(id) => panic!("{p} made id {id} on server_id 2"),
            Err(e) => e,
        };
        assert!(
            e.contains("installed for server_id 1, this is server_id 2"),
            "{p}: {e}"
        );
    }
    let gone = Options {
        old_server_gone: Some(was),
        ..Options::default()
    };
    mysql::repair(&mut c, &layout, &gone).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut c, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop after repair");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (p, answer) in call_each_procedure(&server, &mut c, 5).await {
        assert!(answer.is_ok(), "{p}: {answer:?}");
    }
    for (p, answer) in call_each_procedure(&server, &mut c, 700).await {
        assert!(answer.is_err(), "{p}: {answer:?}");
    }
}

/// Sessions of `servers` waiting in `GET_LOCK`.
fn waiting_for_a_lock(servers: &[&MariaDbServer]) -> usize {
    servers
        .iter()
        .map(|s| {
            s.sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT GET_LOCK(%' AND STATE = 'User lock'")
                .unwrap()
                .parse::<usize>()
                .unwrap()
        })
        .sum()
}

/// Issue 37, A2: two `apply --peer` started together (s3 taking 640-1023,
/// s2 taking 512-767, within 50 ms) each read the other's old record,
/// and both recorded 640-767: 35 of 213,145 ids twice, `check` ok on all
/// three. Both now take the table's deployment lock on every server they
/// name, in one order, before reading any record: the second reads the
/// first's new record and is refused. A lock held past its wait is
/// refused naming the session holding it, and `check --peer` reports
/// values two servers record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_applies_started_together_never_record_one_value_twice() {
    let (s1, s2, s3) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let with = |shards: (u64, u64), peers: &[&MariaDbServer]| Options {
        shards: Some(shards),
        peers: peers.iter().map(|s| s.url()).collect(),
        ..Options::default()
    };
    for (s, shards) in [(&s1, (0, 511)), (&s2, (512, 639)), (&s3, (896, 1023))] {
        let mut c = conn(&s.url()).await;
        mysql::apply(&mut c, &layout, &with(shards, &[]))
            .await
            .unwrap();
    }
    let lock = "SELECT GET_LOCK('shardflake ops posts', 0)";

    // The race: every server's lock held while both start, so both wait
    // at their first; released at once.
    let mut holders = Vec::new();
    for s in [&s1, &s2, &s3] {
        let mut h = conn(&s.url()).await;
        let held: Option<i64> = h.query_first(lock).await.unwrap();
        assert_eq!(held, Some(1));
        holders.push(h);
    }
    let run = |s: &MariaDbServer, opts: Options| {
        let (url, layout) = (s.url(), layout.clone());
        tokio::spawn(async move {
            let mut c = conn(&url).await;
            mysql::apply(&mut c, &layout, &opts)
                .await
                .map_err(|e| e.to_string())
        })
    };
    let on_s3 = run(&s3, with((640, 1023), &[&s1, &s2]));
    let on_s2 = run(&s2, with((512, 767), &[&s1, &s3]));
    let deadline = Instant::now() + Duration::from_secs(20);
    while waiting_for_a_lock(&[&s1, &s2, &s3])
        + usize::from(on_s3.is_finished())
        + usize::from(on_s2.is_finished())
        < 2
    {
        assert!(Instant::now() < deadline, "the applies never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for h in holders {
        h.disconnect().await.unwrap();
    }
    let (on_s3, on_s2) = (on_s3.await.unwrap(), on_s2.await.unwrap());
    let refused: Vec<&String> = [&on_s3, &on_s2]
        .into_iter()
        .filter_map(|r| r.as_ref().err())
        .collect();
    assert_eq!(refused.len(), 1, "s3: {on_s3:?}\ns2: {on_s2:?}");
    assert!(refused[0].contains("which meets"), "{}", refused[0]);
    let record = |s: &MariaDbServer| {
        let r = s
            .sql("SELECT CONCAT(lo, ' ', hi) FROM shardflake.serves")
            .unwrap();
        let (lo, hi) = r.split_once(' ').unwrap();
        (lo.parse::<u64>().unwrap(), hi.parse::<u64>().unwrap())
    };
    let ((lo2, hi2), (lo3, hi3)) = (record(&s2), record(&s3));
    assert!(hi2 < lo3 || hi3 < lo2, "s2 {lo2}-{hi2}, s3 {lo3}-{hi3}");

    // Another operator's command holds the lock on s1: refused in time,
    // naming its session, before anything changed.
    let recorded = s2
        .sql("SELECT CONCAT(lo, '-', hi) FROM shardflake.serves")
        .unwrap();
    let mut holder = conn(&s1.url()).await;
    let held: Option<i64> = holder.query_first(lock).await.unwrap();
    assert_eq!(held, Some(1));
    let started = Instant::now();
    let mut c2 = conn(&s2.url()).await;
    let e = mysql::apply(&mut c2, &layout, &with((512, 767), &[&s1, &s3]))
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(30), "{e}");
    for part in [
        "mysql: apply: nothing was changed: another shardflake mysql apply, repair or adopt of table posts is running",
        &format!("(connection {} of root@", holder.id()),
        "run shardflake mysql apply again; if none runs, end that session there: KILL ",
    ] {
        assert!(e.contains(part), "{part}: {e}");
    }
    assert_eq!(
        s2.sql("SELECT CONCAT(lo, '-', hi) FROM shardflake.serves")
            .unwrap(),
        recorded,
        "a refused apply changed the record"
    );
    holder.disconnect().await.unwrap();

    // check --peer: nothing to report, then values two servers record
    // (written by hand, as an older release's race left them).
    let mut c2 = conn(&s2.url()).await;
    let peers = Options {
        peers: vec![s1.url(), s3.url()],
        ..Options::default()
    };
    assert_eq!(
        mysql::check(&mut c2, &layout, &peers).await.unwrap(),
        Vec::<String>::new()
    );
    s3.sql(&format!(
        "UPDATE shardflake.serves SET lo = {lo2} WHERE tbl = 'posts'"
    ))
    .unwrap();
    let problems = mysql::check(&mut c2, &layout, &peers)
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains(&format!(
            "peer {} makes ids of app.posts for shard values {lo2}-",
            s3.url()
        )),
        "{problems}"
    );
    assert!(
        problems.contains("shardflake mysql apply --shards LO-HI --peer"),
        "{problems}"
    );
}

/// A copy of a server's whole directory (`scripts/mariadb.sh`'s: data,
/// port, options) started on another port; stopped and removed on drop.
struct CopiedServer {
    dir: std::path::PathBuf,
    url: String,
}

impl CopiedServer {
    /// Copies the directory of `server`, which must be stopped (killed),
    /// and starts the copy on a free port.
    fn start(server: &MariaDbServer, tag: &str) -> CopiedServer {
        let datadir = server.sql("SELECT @@datadir").unwrap();
        let from = std::path::Path::new(datadir.trim_end_matches('/'))
            .parent()
            .unwrap()
            .to_path_buf();
        server.kill().unwrap();
        let dir = std::env::temp_dir().join(format!("sf-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cp = std::process::Command::new("cp")
            .arg("-a")
            .arg(&from)
            .arg(&dir)
            .status()
            .unwrap();
        assert!(cp.success());
        let port = shardflake_testkit::free_port().unwrap();
        std::fs::write(dir.join("port"), format!("{port}\n")).unwrap();
        let out = Self::script("restart", &dir);
        let url = out.lines().next().unwrap().to_string();
        assert!(url.starts_with("mysql://"), "{out}");
        CopiedServer { dir, url }
    }

    fn script(command: &str, dir: &std::path::Path) -> String {
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mariadb.sh");
        let out = std::process::Command::new(script)
            .arg(command)
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for CopiedServer {
    fn drop(&mut self) {
        let _ = std::process::Command::new(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/mariadb.sh"),
        )
        .arg("stop")
        .arg(&self.dir)
        .output();
        // A whole data directory: the disk is shared.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Review: a MariaDB data directory copied and started beside its
/// original (another port, the same `server_id` from the same
/// configuration) took inserts for the same shard values as the original
/// (185 of 40,000 ids twice); only `mysql check` named the copy. The
/// trigger and the procedures now test the port and data directory they
/// were installed for: the copy refuses every id until given values of
/// its own, the original keeps making ids, and a restart on the same
/// port and directory changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datadir_copy_beside_its_original_makes_no_id_until_given_values() {
    let original = MariaDbServer::start_with("--server-id=1", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut c = conn(&original.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    mysql::insert(&mut c, &names, 5, "x").await.unwrap();
    drop(c);
    let copy = CopiedServer::start(&original, "copy");
    original.restart().unwrap();
    let (mut co, mut cc) = (conn(&original.url()).await, conn(&copy.url).await);
    for c in [&mut co, &mut cc] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !mysql::clock_running(c, &names).await.unwrap() {
            assert!(Instant::now() < deadline, "no clock loop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The copy: no id from the trigger or any procedure.
    let e = mysql::insert(&mut cc, &names, 5, "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("installed for the server on port"), "{e}");
    assert!(
        e.contains("a copy of that server started beside it, or the server moved"),
        "{e}"
    );
    assert!(
        e.contains("shardflake mysql apply --shards LO-HI --peer URL_OF_EACH_OTHER_SERVER"),
        "{e}"
    );
    // check names the copy and its ways out, not "re-run apply" on each
    // object that names the server it was made for (apply is refused).
    let problems = mysql::check(&mut cc, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(
        !problems.contains("differs from this version's"),
        "{problems}"
    );
    assert!(!problems.contains("re-run apply"), "{problems}");
    assert!(problems.contains("URL_OF_EACH_OTHER_SERVER"), "{problems}");
    assert!(problems.contains("--old-server-gone '1:"), "{problems}");
    // A dry run of adopt runs every check the real run makes.
    for dry_run in [true, false] {
        let e = mysql::adopt(
            &mut cc,
            &layout,
            &mysql::AdoptOptions {
                options: Options {
                    shards: Some((512, 1023)),
                    ..Options::default()
                },
                dry_run,
            },
        )
        .await
        .expect_err("adopt on a copy without proof")
        .to_string();
        assert!(e.contains("nothing was changed"), "dry run {dry_run}: {e}");
        assert!(
            e.contains("URL_OF_EACH_OTHER_SERVER"),
            "dry run {dry_run}: {e}"
        );
    }
    for p in ["generate_post_id", "generate_post_id_locked"] {
        let e = mysql::generate_post_id(&mut cc, p, 5)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("installed for the server on port"), "{p}: {e}");
    }
    // The original goes on, after a restart on the same port and directory too.
    assert!(mysql::insert(&mut co, &names, 5, "x").await.is_ok());
    drop(co);
    original.kill().unwrap();
    original.restart().unwrap();
    let mut co = conn(&original.url()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut co, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop after the restart");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(mysql::insert(&mut co, &names, 5, "x").await.is_ok());
    // The way out it names: values of its own on each.
    mysql::apply(
        &mut co,
        &layout,
        &Options {
            shards: Some((0, 511)),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    mysql::apply(
        &mut cc,
        &layout,
        &Options {
            shards: Some((512, 1023)),
            peers: vec![original.url()],
            ..Options::default()
        },
    )
    .await
    .unwrap();
    assert!(mysql::insert(&mut cc, &names, 600, "x").await.is_ok());
    assert!(mysql::insert(&mut cc, &names, 5, "x").await.is_err());
    assert!(mysql::insert(&mut co, &names, 5, "x").await.is_ok());
}

/// Review A7, the hand-over: ids P's `generate_post_id_locked` made for a
/// shard value before it let the value go, with its counter ahead of R's
/// clock (a burst, or P's clock ahead), were made again by R's once R
/// took the value. `apply --peer` now puts R's row-lock counter past
/// every peer's, as it puts the sequence past theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_taken_from_a_peer_get_locked_ids_above_the_peers() {
    let (p, r) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let (mut cp, mut cr) = (conn(&p.url()).await, conn(&r.url()).await);
    let shards = |lo, hi, peers: Vec<String>| Options {
        shards: Some((lo, hi)),
        peers,
        ..Options::default()
    };
    mysql::apply(&mut cp, &layout, &shards(0, 511, vec![]))
        .await
        .unwrap();
    mysql::apply(&mut cr, &layout, &shards(512, 1023, vec![p.url()]))
        .await
        .unwrap();
    // P's counter 5 s ahead of the clock (as after a burst), then an id
    // for shard value 400.
    p.sql("UPDATE sequences SET next_val = (TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'2023-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000 + 5000) * 1024 WHERE name = 'posts_id'")
        .unwrap();
    let before = mysql::generate_post_id(&mut cp, "generate_post_id_locked", 400)
        .await
        .unwrap();
    // The hand-over of 384-511, as the guide says.
    mysql::apply(&mut cp, &layout, &shards(0, 383, vec![]))
        .await
        .unwrap();
    assert!(
        mysql::generate_post_id(&mut cp, "generate_post_id_locked", 400)
            .await
            .is_err()
    );
    mysql::apply(&mut cr, &layout, &shards(384, 1023, vec![p.url()]))
        .await
        .unwrap();
    let after = mysql::generate_post_id(&mut cr, "generate_post_id_locked", 400)
        .await
        .unwrap();
    assert!(after > before, "{after} after {before}");
}

/// What `repair --old-server-gone` names for `server`:
/// `SERVER_ID:PORT:DATADIR`, as the refusals print it.
fn identity(server: &MariaDbServer) -> String {
    server
        .sql("SELECT CONCAT(@@server_id, ':', @@port, ':', @@datadir)")
        .unwrap()
}

/// Review E6: a data directory copied and started beside its running
/// original refused its first insert, which named plain `mysql repair`
/// as one way out; run on the copy, it recorded the copy for all the
/// original's shard values, `mysql check` on it said ok, and both served
/// (452 of 8,000 ids twice). Now `repair` there is refused, changing
/// nothing, unless the original is proven out of the way: a `--peer`
/// that is it (holding none of the copy's values), or
/// `--old-server-gone` naming exactly the server the ids were installed
/// for. `apply --shards` on the copy needs the same proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_on_a_copy_beside_its_running_original_takes_no_values_without_proof() {
    let original = MariaDbServer::start_with("--server-id=1", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut c = conn(&original.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    mysql::insert(&mut c, &names, 5, "x").await.unwrap();
    drop(c);
    let was = identity(&original);
    let copy = CopiedServer::start(&original, "e6");
    original.restart().unwrap();
    let (mut co, mut cc) = (conn(&original.url()).await, conn(&copy.url).await);
    for c in [&mut co, &mut cc] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !mysql::clock_running(c, &names).await.unwrap() {
            assert!(Instant::now() < deadline, "no clock loop");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Plain repair and wrong names of the original: each refused,
    // nothing changed; so is apply --shards without the original.
    let refused = [
        Options::default(),
        Options {
            old_server_gone: Some(format!("2:{}", &was[2..])),
            ..Options::default()
        },
        Options {
            old_server_gone: Some(was.replace(":/", ":/x/")),
            ..Options::default()
        },
    ];
    for opts in &refused {
        let e = match mysql::repair(&mut cc, &layout, opts).await {
            Ok(r) => panic!(
                "repair {:?} took the original's values on the copy: {r:?}",
                opts.old_server_gone
            ),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("nothing was changed"), "{e}");
        assert!(
            e.contains(&format!("installed for server {was}"))
                && e.contains(&format!("--old-server-gone '{was}'")),
            "{e}"
        );
    }
    // The copy's insert error and check name the proof, not plain repair.
    let e = mysql::insert(&mut cc, &names, 5, "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!(
            "shardflake mysql repair --old-server-gone '{was}'"
        )),
        "{e}"
    );
    let problems = mysql::check(&mut cc, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains(&format!("--old-server-gone '{was}'")),
        "{problems}"
    );
    assert!(
        !problems.contains("record this server with shardflake mysql apply"),
        "{problems}"
    );
    let e = mysql::apply(
        &mut cc,
        &layout,
        &Options {
            shards: Some((512, 1023)),
            ..Options::default()
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("--peer URL_OF_EACH_OTHER_SERVER (one --peer each)"),
        "{e}"
    );
    assert!(mysql::insert(&mut cc, &names, 600, "x").await.is_err());
    // The original still records every value: naming it is no proof yet.
    let e = mysql::repair(
        &mut cc,
        &layout,
        &Options {
            peers: vec![original.url()],
            ..Options::default()
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("which meets 0-1023"), "{e}");
    assert!(mysql::insert(&mut co, &names, 5, "x").await.is_ok());

    // The original retired: the exact name is the proof.
    drop(co);
    original.kill().unwrap();
    mysql::repair(
        &mut cc,
        &layout,
        &Options {
            old_server_gone: Some(was.clone()),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !mysql::clock_running(&mut cc, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "no clock loop after repair");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(mysql::insert(&mut cc, &names, 5, "x").await.is_ok());
    assert_eq!(
        mysql::check(&mut cc, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
}

/// Review 18/18b: only the first apply in a database was checked against
/// the server's other databases: `apply --shards 1023` in `shop`, after
/// `shop` had recorded values of its own, took `app`'s value (with or
/// without `--peer .../app`, which was skipped as this server), and
/// `check` passed on both: 100 of 5,800 ids twice. Every command that
/// records values now counts every other database of the server, and
/// `check` reports their overlaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_database_of_a_server_is_a_peer_of_every_command() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let shards = |lo, hi, peers: &[String]| Options {
        shards: Some((lo, hi)),
        peers: peers.to_vec(),
        ..Options::default()
    };
    let mut app = conn(&server.url()).await;
    mysql::apply(&mut app, &layout, &shards(1023, 1023, &[]))
        .await
        .unwrap();
    server.sql("CREATE DATABASE shop").unwrap();
    let shop_url = server.url().replace("/app", "/shop");
    let mut shop = conn(&shop_url).await;
    mysql::apply(&mut shop, &layout, &shards(500, 600, &[]))
        .await
        .unwrap();
    // shop records 500-600 now: apply, repair and adopt there are still
    // checked against app.
    for peers in [vec![], vec![server.url()]] {
        let refused = mysql::apply(&mut shop, &layout, &shards(1000, 1023, &peers)).await;
        let serves = server
            .sql("SELECT CONCAT(lo, '-', hi) FROM shardflake.serves WHERE db = 'shop'")
            .unwrap();
        if serves != "500-600" {
            let mut same = 0;
            for _ in 0..50 {
                let x = mysql::insert(&mut app, &names, 1023, "x").await.unwrap();
                let y = mysql::insert(&mut shop, &names, 1023, "x").await.unwrap();
                same += usize::from(x == y);
            }
            panic!(
                "shop took app's value 1023 (peers {peers:?}): records {serves}, {same} of 50 pairs of ids equal"
            );
        }
        let e = refused.expect_err("shop took app's value").to_string();
        assert!(
            e.contains("nothing was changed")
                && e.contains("database app of this server makes ids of app.posts for shard values 1023-1023, which meets 1000-1023 of shop.posts"),
            "{e}"
        );
    }
    let e = mysql::repair(&mut shop, &layout, &shards(1000, 1023, &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("nothing was changed"), "{e}");
    // This very database as a --peer: a wrong URL, refused.
    let e = mysql::apply(
        &mut shop,
        &layout,
        &shards(500, 600, std::slice::from_ref(&shop_url)),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("is this database itself (shop)"), "{e}");
    // A third database adopting its table for app's value.
    server
        .sql(
            "CREATE DATABASE legacy; CREATE TABLE legacy.posts (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT); \
             INSERT INTO legacy.posts (user_id, body) VALUES (1, 'old')",
        )
        .unwrap();
    let mut legacy = conn(&server.url().replace("/app", "/legacy")).await;
    for dry_run in [true, false] {
        let e = mysql::adopt(
            &mut legacy,
            &layout,
            &mysql::AdoptOptions {
                options: shards(1023, 1023, &[]),
                dry_run,
            },
        )
        .await
        .expect_err("legacy adopted app's value")
        .to_string();
        assert!(e.contains("database app of this server"), "{e}");
    }
    // check reports an overlap made behind the commands' backs, from
    // either database, with or without --peer.
    server
        .sql("UPDATE shardflake.serves SET lo = 1000, hi = 1023 WHERE db = 'shop'")
        .unwrap();
    for (c, peers) in [(&mut shop, vec![]), (&mut app, vec![shop_url.clone()])] {
        let problems = mysql::check(
            c,
            &layout,
            &Options {
                peers,
                ..Options::default()
            },
        )
        .await
        .unwrap()
        .join("\n");
        assert!(
            problems.contains("of this server makes ids of"),
            "{problems}"
        );
        assert!(problems.contains("which meets"), "{problems}");
    }
    // A separate deployment, by the operator's word, is recorded as one.
    server
        .sql("UPDATE shardflake.serves SET lo = 500, hi = 600 WHERE db = 'shop'")
        .unwrap();
    mysql::apply(
        &mut shop,
        &layout,
        &Options {
            new_deployment: true,
            ..shards(0, 1023, &[])
        },
    )
    .await
    .unwrap();
    mysql::apply(&mut shop, &layout, &Options::default())
        .await
        .unwrap();
    mysql::apply(&mut app, &layout, &Options::default())
        .await
        .unwrap();
    assert_eq!(
        mysql::check(&mut app, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
}

/// Review 19: `DROP DATABASE shop` while shop recorded 500-600: a peer
/// still counted it, the guide said it was not counted, nothing reported
/// it and no command released it. Its ids come back only with it (a
/// restore), so it counts until its record is deleted; `check` names it
/// with the statement that releases it, and the refusals name it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_databases_values_count_until_released() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let shards = |lo, hi| Options {
        shards: Some((lo, hi)),
        ..Options::default()
    };
    let mut app = conn(&server.url()).await;
    mysql::apply(&mut app, &layout, &shards(0, 499))
        .await
        .unwrap();
    server.sql("CREATE DATABASE shop").unwrap();
    let mut shop = conn(&server.url().replace("/app", "/shop")).await;
    mysql::apply(&mut shop, &layout, &shards(500, 600))
        .await
        .unwrap();
    drop(shop);
    server.sql("DROP DATABASE shop").unwrap();
    let release = "DELETE FROM shardflake.serves WHERE db = 'shop' AND tbl = 'posts'";
    let problems = mysql::check(&mut app, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains("database shop, dropped, is still recorded (shardflake.serves) as making ids of shop.posts for shard values 500-600")
            && problems.contains(release),
        "{problems}"
    );
    let e = mysql::apply(&mut app, &layout, &shards(0, 1023))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing was changed") && e.contains(release),
        "{e}"
    );
    // A peer counts it too, and says so.
    let other = MariaDbServer::start_with("", None).unwrap();
    let mut b = conn(&other.url()).await;
    let e = mysql::apply(
        &mut b,
        &layout,
        &Options {
            peers: vec![server.url()],
            ..shards(550, 560)
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("nothing was changed") && e.contains("was dropped there") && e.contains(release),
        "{e}"
    );
    // Released: the values are free.
    server.sql(release).unwrap();
    mysql::apply(&mut app, &layout, &shards(0, 1023))
        .await
        .unwrap();
    assert_eq!(
        mysql::check(&mut app, &layout, &Options::default())
            .await
            .unwrap(),
        Vec::<String>::new()
    );
}

/// Review: `repair --old-server-gone x` on a server whose ids were
/// installed for it was accepted and the flag ignored; `repair --shards
/// 1024` suggested `apply --shards 1024-1024`, which apply refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_that_proves_nothing_and_a_range_outside_the_layout_are_refused() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut c = conn(&server.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    for named in ["x", "9:9:/nonexistent/"] {
        let e = mysql::repair(
            &mut c,
            &layout,
            &Options {
                old_server_gone: Some(named.into()),
                ..Options::default()
            },
        )
        .await
        .expect_err("--old-server-gone ignored")
        .to_string();
        assert!(
            e.contains("nothing was changed")
                && e.contains("this server's ids were installed for it")
                && e.contains("without --old-server-gone"),
            "{e}"
        );
    }
    for (lo, hi) in [(1024, 1024), (5, 4)] {
        let e = mysql::repair(
            &mut c,
            &layout,
            &Options {
                shards: Some((lo, hi)),
                ..Options::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!(
                "shard values {lo}-{hi} are not a range within 0-1023"
            )),
            "{e}"
        );
        assert!(!e.contains("apply --shards"), "{e}");
    }
}

/// Review 5/6b: the refusal on a promoted replica named only the
/// original as the --peer (URL_OF_IT); a second copy following it
/// literally repeated ids with the servers not named. The texts now ask
/// for every other server, as check does, and say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_server_is_told_to_name_every_other_server() {
    let server = MariaDbServer::start_with("--server-id=1", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let names = Options::default().names;
    let mut c = conn(&server.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    // What a promoted replica sees: objects made for another server_id.
    server.sql("SET GLOBAL server_id = 2").unwrap();
    let mut c = conn(&server.url()).await;
    let e = mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap_err()
        .to_string();
    let e_insert = mysql::insert(&mut c, &names, 5, "x")
        .await
        .unwrap_err()
        .to_string();
    let problems = mysql::check(&mut c, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    server.sql("SET GLOBAL server_id = 1").unwrap();
    for text in [&e, &e_insert, &problems] {
        assert!(text.contains("--peer URL_OF_EACH_OTHER_SERVER"), "{text}");
        assert!(!text.contains("URL_OF_IT"), "{text}");
    }
    assert!(e.contains("one not named is not checked"), "{e}");
    assert!(
        e_insert.contains("one not named is not checked"),
        "{e_insert}"
    );
    assert!(
        !problems.contains("differs from this version's"),
        "{problems}"
    );
}

/// Review E8: a data directory copied and started beside its original
/// refused its first table's ids as a copy, yet `adopt --table orders`
/// (and its dry run) and `apply` of a new table there went through with
/// no proof and recorded 0-1023 for them, while the original did the
/// same (255 of 4,000 ids twice). A server any of whose objects were
/// made for another server is a copy for every table: each command that
/// records values or installs objects needs the same proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_datadir_copy_takes_no_new_table_without_proof() {
    let original = MariaDbServer::start_with("--server-id=1", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut c = conn(&original.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    c.query_drop(
        "CREATE TABLE orders (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT)",
    )
    .await
    .unwrap();
    drop(c);
    let was = identity(&original);
    let copy = CopiedServer::start(&original, "e8");
    original.restart().unwrap();
    let mut cc = conn(&copy.url).await;
    let table = |t: &str| Options {
        names: mysql::Names::new(t, "user_id", &format!("generate_{t}_id")).unwrap(),
        ..Options::default()
    };
    let refused = |e: shardflake_db::Error| {
        let e = e.to_string();
        assert!(e.contains("nothing was changed"), "{e}");
        assert!(e.contains(&format!("installed for server {was}")), "{e}");
        assert!(e.contains("--peer URL_OF_EACH_OTHER_SERVER"), "{e}");
    };
    for dry_run in [true, false] {
        let adopt = mysql::AdoptOptions {
            options: Options {
                locked: false,
                ..table("orders")
            },
            dry_run,
        };
        match mysql::adopt(&mut cc, &layout, &adopt).await {
            Ok(a) => panic!("adopt (dry run {dry_run}) on the copy took orders: {a:?}"),
            Err(e) => refused(e),
        }
    }
    match mysql::apply(&mut cc, &layout, &table("items")).await {
        Ok(a) => panic!("apply on the copy took items: {a:?}"),
        Err(e) => refused(e),
    }
    let recorded = cc
        .query_first::<i64, _>("SELECT COUNT(*) FROM shardflake.serves")
        .await
        .unwrap();
    assert_eq!(recorded, Some(1), "only posts' record, copied");
    // The proof the copy's own table needs is enough for a new one.
    mysql::apply(
        &mut cc,
        &layout,
        &Options {
            old_server_gone: Some(was.clone()),
            ..table("items")
        },
    )
    .await
    .unwrap();
    // Its repair too, while posts' objects still name the original.
    match mysql::repair(&mut cc, &layout, &table("items")).await {
        Ok(r) => panic!("plain repair of items on the copy: {r:?}"),
        Err(e) => refused(e),
    }
}

/// Review E4: app 0-511 and shop 512-1023 on one server; `DROP DATABASE
/// shop; CREATE DATABASE shop`, then `apply --new-deployment` in the new
/// shop freed the dropped one's values (app then took 0-1023, and the
/// old shop's dump restored made 100 of 4,400 ids twice); a plain
/// `apply` there took them back silently. A database made anew under a
/// dropped one's name neither inherits nor frees its record: only the
/// DELETE the refusal names does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_made_anew_neither_inherits_nor_frees_a_dropped_ones_values() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let shards = |lo, hi| Options {
        shards: Some((lo, hi)),
        ..Options::default()
    };
    let mut app = conn(&server.url()).await;
    mysql::apply(&mut app, &layout, &shards(0, 511))
        .await
        .unwrap();
    server.sql("CREATE DATABASE shop").unwrap();
    let shop_url = server.url().replace("/app", "/shop");
    let mut shop = conn(&shop_url).await;
    mysql::apply(&mut shop, &layout, &shards(512, 1023))
        .await
        .unwrap();
    drop(shop);
    server
        .sql("DROP DATABASE shop; CREATE DATABASE shop")
        .unwrap();
    let mut shop = conn(&shop_url).await;
    let release = "DELETE FROM shardflake.serves WHERE db = 'shop' AND tbl = 'posts'";
    let new_deployment = Options {
        new_deployment: true,
        ..Options::default()
    };
    for opts in [&new_deployment, &Options::default()] {
        let e = match mysql::apply(&mut shop, &layout, opts).await {
            Ok(a) => panic!(
                "apply (new deployment {}) in the new shop: {a:?}",
                opts.new_deployment
            ),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("nothing was changed")
                && e.contains("shop has no sequence posts_id_seq")
                && e.contains(release),
            "{e}"
        );
    }
    // The dropped shop's values are still taken.
    let e = mysql::apply(&mut app, &layout, &shards(0, 1023))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(release), "{e}");
    // Released by name: the new shop is a deployment of its own.
    server.sql(release).unwrap();
    mysql::apply(&mut shop, &layout, &new_deployment)
        .await
        .unwrap();
}

/// Review E6/E7: a dump taken before a server's values were narrowed,
/// restored after, brings back a trigger that makes ids for the wider
/// values (102 of 4,000 ids twice); `check` said only "differs from this
/// version's". It now names the values the trigger takes beyond the
/// record, and `apply` as the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_restored_trigger_wider_than_the_record() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut c = conn(&server.url()).await;
    mysql::apply(&mut c, &layout, &Options::default())
        .await
        .unwrap();
    let file = dump(&server, "app", "e7");
    mysql::apply(
        &mut c,
        &layout,
        &Options {
            shards: Some((0, 511)),
            ..Options::default()
        },
    )
    .await
    .unwrap();
    let load = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "mariadb --no-defaults -h 127.0.0.1 -u root -P{} app < {}",
            server.port,
            file.display()
        ))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(load.status.success(), "{load:?}");
    let problems = mysql::check(&mut c, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains("makes ids for shard values 0-1023, but this server records 0-511")
            && problems.contains("run shardflake mysql apply"),
        "{problems}"
    );
}
