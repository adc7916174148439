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
    // A separate table: the operator's word, and the copy makes ids.
    let separate = Options {
        new_deployment: true,
        ..Options::default()
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
