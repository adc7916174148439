//! What `init`, `check` and the clients say, where the text is what an
//! operator acts on: each on real servers.

use std::time::{Duration, Instant};

use shardflake_tickets::{Config, PeersStore, TicketClient, admin};

use super::repro::{FIXED, dump, pair, restore, signal};
use super::{assert_unique, init_ok, maria, server_toml};

/// The lines `init` printed for `server`.
async fn init_lines(config: &shardflake_tickets::Config, server: &str) -> String {
    admin::init(config)
        .await
        .into_iter()
        .find(|s| s.server == server)
        .unwrap()
        .result
        .unwrap_or_else(|e| panic!("init {server}: {e}"))
        .join("\n")
}

/// A dead server put back as a fresh, empty one (same name and offset):
/// `init` makes its counter row at the sequence's start, but no client
/// hands out an id from it below its residue class's marks (each raises
/// it past them at its first session there). `init` says so, and where its
/// ids will start. Before: "photos: table tickets_photos (bigint
/// unsigned), ids from 1 on", ids the dead server had handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_on_a_fresh_replacement_says_where_its_ids_start_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.extend(client.next_n("photos", 200).await.unwrap());
    }
    client.shutdown().await;
    drop(a);
    let mark: u64 = b
        .sql("SELECT MAX(high_water) FROM shardflake_ticket_hw WHERE server_name = '@1of2' AND sequence_name = 'photos'")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(mark > 3000, "a's marks only reach {mark}");
    let fresh = maria(2, 1);
    let replaced = pair(&fresh, &b, "");
    let said = init_lines(&replaced, "a").await;
    assert!(
        said.contains(&format!("photos: table tickets_photos (bigint unsigned), counter at 0 (the last id it may have handed out, as `check` shows it), behind the marks of its residue class @1of2 (ids up to {mark} were handed out")
        ) && said.contains(&format!("so ids from above {mark} on"))
            && !said.contains("ids from 1 on"),
        "{said}"
    );
    // What it said happens.
    let client = TicketClient::connect(replaced.clone()).await.unwrap();
    let mut after = Vec::new();
    for _ in 0..10 {
        after.extend(client.next_n("photos", 20).await.unwrap());
    }
    client.shutdown().await;
    let of_a: Vec<u64> = after.iter().copied().filter(|id| id % 2 == 1).collect();
    assert!(!of_a.is_empty(), "the fresh a never served");
    assert!(
        of_a.iter().all(|id| *id > mark),
        "{of_a:?} not above {mark}"
    );
    ids.extend(after);
    assert_unique(&ids);
    // Once raised, init again says where the counter is.
    let again = init_lines(&replaced, "a").await;
    assert!(!again.contains("behind the marks"), "{again}");
}

/// Two `init`s at once with files naming different places for the marks
/// each take back the record they wrote (`stores::two_inits_at_once_…`):
/// the servers record no place, as this test leaves them. A client and
/// `check` say that no `init` completed and to run it once with the file
/// every client uses. Before: "initialised by an older shardflake".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_of_the_marks_place_taken_back_is_not_called_an_older_release_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    for server in [&a, &b] {
        server
            .sql("DELETE FROM shardflake_ticket_marks_at")
            .unwrap();
    }
    // Refused at connect, or started with both servers refused.
    let said = match TicketClient::connect(config.clone()).await {
        Ok(client) => {
            let e = client
                .next_n("photos", 1)
                .await
                .expect_err("an id from servers recording no place for the marks");
            let reasons: Vec<String> = client
                .metrics()
                .into_iter()
                .filter_map(|m| m.reason)
                .collect();
            client.shutdown().await;
            format!("{e}\n{}", reasons.join("\n"))
        }
        Err(e) => e.to_string(),
    };
    let report = admin::check(&config).await;
    let report = format!("{said}\n{report}");
    assert!(
        report.contains("no `shardflake tickets init` has completed on it")
            && report.contains("two inits run at once")
            && report.contains("run `shardflake tickets init --config FILE` once")
            && !report.contains("initialised by an older shardflake"),
        "{report}"
    );
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    assert_unique(&client.next_n("photos", 10).await.unwrap());
    client.shutdown().await;
}

/// Both servers of a pair stalled (SIGSTOP: a connection is accepted and
/// never answered): `check` asks them at once, each connection and each
/// place of the marks within `admin_timeout_ms`, so it fails within about
/// one limit and names it. Before: about 2 x (1 + 4) limits, one server
/// after the other (50 s with the defaults).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_with_every_server_stalled_fails_within_one_limit_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut config = config;
    config.failover.admin_timeout_ms = 1000;
    let pids = [a.pid().unwrap(), b.pid().unwrap()];
    for pid in pids {
        signal(pid, "STOP");
    }
    let started = Instant::now();
    let report = admin::check(&config).await;
    let took = started.elapsed();
    for pid in pids {
        signal(pid, "CONT");
    }
    let text = report.to_string();
    assert!(!report.ok(), "{text}");
    assert!(
        took < Duration::from_millis(2500),
        "check took {took:?} with both servers stalled: {text}"
    );
    assert!(
        text.contains(
            "did not answer within 1000 ms (connect; the limit is `[failover] admin_timeout_ms`)"
        ),
        "{text}"
    );
}

/// A running client whose only peer stalls: the write of a mark ahead of
/// `a`'s ids fails, and says which place did not answer and the setting
/// that bounds it (`marks_timeout_ms`, 150 ms by default). Before: "server
/// \"a\" did not answer within 500 ms (write high-water marks)", the server
/// that was up and a limit no setting names (half an attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mark_not_taken_names_the_place_that_did_not_answer_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut config = config;
    config.failover.mark_ahead = 5;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = client.next_n("photos", 20).await.unwrap();
    let b_pid = b.pid().unwrap();
    signal(b_pid, "STOP");
    // a's ids go out up to its last mark, then the next write fails.
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        assert!(Instant::now() < deadline, "a never needed a mark");
        match client.next("photos").await {
            Ok(id) => ids.push(id),
            Err(e) => break e.to_string(),
        }
    };
    signal(b_pid, "CONT");
    client.shutdown().await;
    assert_unique(&ids);
    assert!(
        refused.contains("server \"b\" did not answer within 150 ms (high-water marks; the limit is `[failover] marks_timeout_ms`)"),
        "{refused}"
    );
    assert!(!refused.contains("500 ms"), "{refused}");
}

/// Two files for one pair: `before`, then `after` (increment 4, `a` at 1,
/// `b` at 3), as a reshape from one to the other leaves them.
fn before_and_after(
    a: &shardflake_testkit::MariaDbServer,
    b: &shardflake_testkit::MariaDbServer,
) -> (Config, Config) {
    let file = |increment: &str, offset_b| {
        Config::parse(&format!(
            "{increment}{}{}{FIXED}",
            server_toml("a", "mariadb", &a.url(), 1),
            server_toml("b", "mariadb", &b.url(), offset_b)
        ))
        .unwrap()
    };
    (file("", 2), file("increment = 4\n", 3))
}

/// `init` with a file of before a `reshape` is sent to the reshape's file,
/// never told to reshape (two operators would undo each other's reshape,
/// each time the other's clients were refused). Before: "To change it
/// safely run `shardflake tickets reshape --config NEW_FILE`".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_with_a_file_of_before_a_reshape_is_sent_to_the_current_file_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let (before, after) = before_and_after(&a, &b);
    init_ok(&before).await;
    admin::reshape(&after, &PeersStore::new(after.clone()))
        .await
        .unwrap();
    for s in admin::init(&before).await {
        let e = s
            .result
            .expect_err("init with the file of before the reshape")
            .to_string();
        assert!(
            e.contains("Run it with the file that reshape was given")
                && e.contains("Do not reshape back to this file")
                && !e.contains("To change it safely run `shardflake tickets reshape"),
            "{}: {e}",
            s.server
        );
    }
    // The reshape's file goes on.
    init_ok(&after).await;
}

/// `a` given back its own dump of before a reshape: `check` and a client
/// on the current file are told `a` went back and to run the reshape
/// again, not that their file is old; after it, all is well. Before: "the
/// file says … but it was initialised with …; … run reshape, or put the
/// file back", as if the file had been edited.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_given_its_dump_of_before_a_reshape_is_named_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let (before, after) = before_and_after(&a, &b);
    init_ok(&before).await;
    let old = TicketClient::connect(before.clone()).await.unwrap();
    let mut ids = old.next_n("photos", 20).await.unwrap();
    old.shutdown().await;
    let night = dump(&a, "before-reshape");
    admin::reshape(&after, &PeersStore::new(after.clone()))
        .await
        .unwrap();
    for m in [&a, &b] {
        assert_eq!(
            m.sql("SELECT version FROM shardflake_ticket_lattice_version")
                .unwrap()
                .trim(),
            "2"
        );
    }
    restore(&a, &night);
    let _ = std::fs::remove_file(&night);
    let report = admin::check(&after).await.to_string();
    assert!(
        report.contains("server \"a\": it records lattice version 1 and another lattice than this file's, while server b records this file's at version 2")
            && report.contains("run `shardflake tickets reshape --config FILE` again with this file")
            && !report.contains("put the file back"),
        "{report}"
    );
    // A client of the current file refuses a, and says a went back once
    // it has a session of b (a is probed again meanwhile).
    let said = match TicketClient::connect(after.clone()).await {
        Err(e) => e.to_string(),
        Ok(client) => {
            let deadline = Instant::now() + Duration::from_secs(30);
            let said = loop {
                let reason = client
                    .metrics()
                    .into_iter()
                    .find(|m| m.name == "a")
                    .and_then(|m| m.reason)
                    .unwrap_or_default();
                if reason.contains("went back") || Instant::now() > deadline {
                    break reason;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            client.shutdown().await;
            said
        }
    };
    assert!(
        said.contains("it records lattice version 1 and another lattice than this file's, while server b records this file's at version 2: a went back to before the reshape to version 2")
            && said.contains("run `shardflake tickets reshape --config FILE` again with this file"),
        "{said}"
    );
    admin::reshape(&after, &PeersStore::new(after.clone()))
        .await
        .unwrap();
    // (The servers' globals stay at 2: plain SQL clients are not this
    // test's business.)
    let report = admin::check(&after).await;
    assert!(
        !report.problems.iter().any(|p| p.contains("lattice")),
        "{report}"
    );
    let new = TicketClient::connect(after.clone()).await.unwrap();
    ids.extend(new.next_n("photos", 20).await.unwrap());
    new.shutdown().await;
    assert_unique(&ids);
}

/// `a`'s per-id guard dropped and its counter set back (a restore made
/// without triggers): `check` reports both, the guard missing and the
/// counter behind; a client refuses `a`, naming a restore in progress
/// first (a dump makes the triggers after the rows) and `init` if it
/// stays; `init` then shows the counter as `check` did. Before: only the
/// guard; "a restore made without triggers …: run init"; init's counter
/// one above check's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_counter_set_back_without_its_guard_is_reported_whole_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..20 {
        ids.extend(client.next_n("photos", 100).await.unwrap());
    }
    client.shutdown().await;
    let triggers = a
        .sql("SELECT GROUP_CONCAT(TRIGGER_NAME) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'app' AND EVENT_OBJECT_TABLE = 'tickets_photos'")
        .unwrap();
    for t in triggers.trim().split(',').filter(|t| !t.is_empty()) {
        a.sql(&format!("DROP TRIGGER {t}")).unwrap();
    }
    a.sql("UPDATE tickets_photos SET id = 1").unwrap();
    let report = admin::check(&config).await;
    let text = report.to_string();
    let problem = report
        .problems
        .iter()
        .find(|p| p.starts_with("server a sequence photos"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        problem.contains("no guard against setting it back in place")
            && problem.contains("counter 0 is behind the high-water"),
        "{problem}"
    );
    assert!(
        text.contains("counter 0 (the last id it may have handed out); high-water"),
        "{text}"
    );
    // A client refuses a, and names the restore before `init`.
    let said = match TicketClient::connect(config.clone()).await {
        Ok(client) => {
            let _ = client.next_n("photos", 10).await;
            let reason = client
                .metrics()
                .into_iter()
                .find(|m| m.name == "a")
                .and_then(|m| m.reason)
                .unwrap_or_default();
            client.shutdown().await;
            reason
        }
        Err(e) => e.to_string(),
    };
    assert!(
        said.contains("no guard against setting it back in place: a restore in progress (a dump makes a table's triggers after its rows)")
            && said.contains("if it stays, run `shardflake tickets init`"),
        "{said}"
    );
    let init = admin::init(&config).await;
    let line = init
        .iter()
        .find(|s| s.server == "a")
        .unwrap()
        .result
        .as_ref()
        .unwrap()
        .join("\n");
    assert!(
        line.contains("counter at 0 (the last id it may have handed out, as `check` shows it)"),
        "{line}"
    );
    let client = TicketClient::connect(config.clone()).await.unwrap();
    for _ in 0..5 {
        ids.extend(client.next_n("photos", 100).await.unwrap());
    }
    client.shutdown().await;
    assert_unique(&ids);
}

/// A server added by a later reshape records the same lattice version as
/// the others: `reshape` gives every server one past the highest any
/// records, so the versions `check` and the refusals show agree. Before:
/// each server's own version + 1 (a and b 3, c 2 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_server_of_a_lattice_records_one_version_mariadb() {
    let (a, b, c) = (maria(2, 1), maria(2, 2), maria(6, 5));
    let (before, after) = before_and_after(&a, &b);
    init_ok(&before).await;
    admin::reshape(&after, &PeersStore::new(after.clone()))
        .await
        .unwrap();
    // c joins (increment 6): its tables by `init` with the three-server
    // file (a and b refuse it: their lattice differs), then the reshape
    // to that file.
    let three = Config::parse(&format!(
        "increment = 6\n{}{}{}{FIXED}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 3),
        server_toml("c", "mariadb", &c.url(), 5)
    ))
    .unwrap();
    let init = admin::init(&three).await;
    assert!(
        init.iter()
            .find(|s| s.server == "c")
            .unwrap()
            .result
            .is_ok(),
        "{init:?}"
    );
    admin::reshape(&three, &PeersStore::new(three.clone()))
        .await
        .unwrap();
    let versions: Vec<String> = [&a, &b, &c]
        .iter()
        .map(|m| {
            m.sql("SELECT version FROM shardflake_ticket_lattice_version")
                .unwrap()
                .trim()
                .to_string()
        })
        .collect();
    assert_eq!(versions, ["3", "3", "3"]);
}

/// A reshape cut short past its fence (`b` holds its lattice version row
/// locked, as a stalled server would, once `a` was fenced) says it is half
/// done and to run it again, whatever stopped it; run again, it ends and
/// the clients of the new file go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshape_cut_short_says_it_is_half_done_mariadb() {
    use mysql_async::prelude::Queryable;
    let (a, b) = (maria(2, 1), maria(2, 2));
    let mut old = pair(&a, &b, "");
    old.failover.admin_timeout_ms = 1000;
    init_ok(&old).await;
    let mut new = old.clone();
    new.segment.chunk = 200;
    let mut lock = mysql_async::Conn::new(mysql_async::Opts::from_url(&b.url()).unwrap())
        .await
        .unwrap();
    lock.query_drop("BEGIN").await.unwrap();
    lock.query_drop("SELECT * FROM shardflake_ticket_lattice_version FOR UPDATE")
        .await
        .unwrap();
    let e = admin::reshape(&new, &PeersStore::new(new.clone()))
        .await
        .expect_err("a reshape with b's version row locked")
        .to_string();
    assert!(
        e.contains("the reshape is half done")
            && e.contains("run `shardflake tickets reshape --config FILE` again with this file")
            && !e.contains("allow_without_marks"),
        "{e}"
    );
    lock.query_drop("ROLLBACK").await.unwrap();
    admin::reshape(&new, &PeersStore::new(new.clone()))
        .await
        .unwrap();
    let client = TicketClient::connect(new.clone()).await.unwrap();
    let ids = client.next_n("blocks", 100).await.unwrap();
    client.shutdown().await;
    assert_unique(&ids);
}
