//! Issue 39 item 3: an existing Flickr `Tickets64` pair adopted (`table =
//! "Tickets64"` in the file, then `init`) while the applications' own
//! `REPLACE INTO Tickets64 (stub) VALUES ('a'); SELECT LAST_INSERT_ID()`
//! keeps running beside shardflake's clients; each refusal; a restore then
//! `repair` before the applications are let back. Real MariaDB servers,
//! two, as Flickr ran them.

use shardflake_testkit::MariaDbServer;
use shardflake_tickets::mysql_async::{self, prelude::Queryable};
use shardflake_tickets::{Config, TicketClient, admin};

use super::repro::{dump, restore};
use super::{assert_unique, init_ok, maria, server_toml};

/// Flickr's table, as its article gives it.
const TICKETS64: &str = "CREATE TABLE Tickets64 (id bigint(20) unsigned NOT NULL auto_increment, stub char(1) NOT NULL default '', PRIMARY KEY (id), UNIQUE KEY stub (stub)) ENGINE=InnoDB";

/// A pair of Flickr ticket servers, odd and even, each with its
/// `Tickets64` already past `past` (the applications' own `REPLACE`s).
fn flickr_pair(past: u64) -> (MariaDbServer, MariaDbServer) {
    let (a, b) = (maria(2, 1), maria(2, 2));
    for (m, offset) in [(&a, 1), (&b, 2)] {
        m.sql(&format!(
            "{TICKETS64}; INSERT INTO Tickets64 (id, stub) VALUES ({}, 'a')",
            past + offset
        ))
        .unwrap();
    }
    (a, b)
}

/// The file adopting `Tickets64` as sequence `photos`, servers a and b
/// with offsets `offsets`; marks written at most 10 ids ahead.
fn adopted(a: &MariaDbServer, b: &MariaDbServer, offsets: (u64, u64)) -> Config {
    Config::parse(&format!(
        "{}{}{}",
        server_toml("a", "mariadb", &a.url(), offsets.0),
        server_toml("b", "mariadb", &b.url(), offsets.1),
        r#"
[failover]
attempt_timeout_ms = 1000
timeout_ms = 3000
probe_interval_ms = 50
high_water_interval_ms = 50
mark_ahead = 10

[[sequences]]
name = "photos"
table = "Tickets64"
"#
    ))
    .unwrap()
}

/// The applications' own client: `count` tickets by Flickr's statement
/// on a plain session (the server's global increment and offset), again
/// after a deadlock as Flickr's clients did.
async fn flickr_client(url: String, count: usize) -> Vec<u64> {
    let mut conn = mysql_async::Conn::from_url(url).await.unwrap();
    let mut ids = Vec::new();
    while ids.len() < count {
        match conn
            .query_drop("REPLACE INTO Tickets64 (stub) VALUES ('a')")
            .await
        {
            Ok(()) => {
                let id: Option<u64> = conn.query_first("SELECT LAST_INSERT_ID()").await.unwrap();
                ids.push(id.unwrap());
            }
            Err(mysql_async::Error::Server(e)) if e.code == 1213 => continue,
            Err(e) => panic!("REPLACE INTO Tickets64: {e}"),
        }
    }
    ids
}

/// `Tickets64`'s `AUTO_INCREMENT` on `m`.
fn auto_increment(m: &MariaDbServer) -> u64 {
    let n = m
        .sql("SELECT AUTO_INCREMENT FROM information_schema.TABLES WHERE TABLE_SCHEMA = 'app' AND TABLE_NAME = 'Tickets64'")
        .unwrap();
    n.trim().parse().unwrap_or_else(|e| panic!("{n:?}: {e}"))
}

/// The pair adopted while each server's applications run Flickr's
/// `REPLACE` (two connections a server) beside a shardflake client taking
/// per-id tickets from both: every id from both kinds collected, none
/// twice, every one above the tables' rows of before. A second `init`
/// changes nothing (`AUTO_INCREMENT` where it was, `check` clean).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flickr_pair_is_adopted_with_its_clients_running_mariadb() {
    let (a, b) = flickr_pair(1000);
    let config = adopted(&a, &b, (1, 2));
    let check = admin::check(&config).await;
    assert!(!check.ok(), "{check}");

    let legacy: Vec<_> = [&a, &b, &a, &b]
        .iter()
        .map(|m| tokio::spawn(flickr_client(m.url(), 300)))
        .collect();
    for s in admin::init(&config).await {
        let said = s
            .result
            .unwrap_or_else(|e| panic!("init {}: {e}", s.server));
        assert!(
            format!("{said:?}").contains("adopted table Tickets64"),
            "{said:?}"
        );
    }
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.extend(client.next_n("photos", 10).await.unwrap());
    }
    assert!(ids.iter().any(|id| id % 2 == 1), "a never served");
    assert!(ids.iter().any(|id| id % 2 == 0), "b never served");
    for task in legacy {
        ids.extend(task.await.unwrap());
    }
    assert!(
        ids.iter().all(|id| *id > 1002),
        "an id at or below the rows of before"
    );
    assert_eq!(ids.len(), 300 + 4 * 300);
    assert_unique(&ids);

    client.shutdown().await;
    // init raises each table past its class's marks (written ahead of the
    // client's ids); a second init changes nothing.
    init_ok(&config).await;
    let before = (auto_increment(&a), auto_increment(&b));
    init_ok(&config).await;
    assert_eq!((auto_increment(&a), auto_increment(&b)), before);
    let check = admin::check(&config).await;
    assert!(check.ok(), "{check}");
}

/// What `init` refuses, each with its message, and `check` reports: the
/// servers' global increment/offset (which the applications' sessions use)
/// off the file's lattice; a table whose `stub` has no unique key (each
/// `REPLACE` would add a row); no such table. Nothing is installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopting_refuses_what_cannot_be_made_safe_mariadb() {
    let (a, b) = flickr_pair(1000);
    // Offsets swapped in the file: the file is fixed, not the servers
    // (review finding E7: the advice to SET GLOBAL the file's offsets,
    // followed with the applications running, handed out 45 ids twice
    // between them, their open connections keeping the old offsets).
    let swapped = adopted(&a, &b, (2, 1));
    for (s, server_offset) in admin::init(&swapped).await.iter().zip([1, 2]) {
        let e = s.result.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("global auto_increment_increment/offset are 2/")
                && e.contains(&format!(
                    "set `offset = {server_offset}` for server {} in the file",
                    s.server
                ))
                && e.contains("do not SET GLOBAL another offset while applications run"),
            "{e}"
        );
    }
    let check = admin::check(&swapped).await.to_string();
    assert!(
        check.contains("global auto_increment_increment/offset"),
        "{check}"
    );
    let triggers = a
        .sql("SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_TABLE = 'Tickets64'")
        .unwrap();
    assert_eq!(triggers.trim(), "0");

    let config = adopted(&a, &b, (1, 2));
    a.sql("ALTER TABLE Tickets64 DROP INDEX stub").unwrap();
    b.sql("DROP TABLE Tickets64").unwrap();
    let done = admin::init(&config).await;
    let e = done[0].result.as_ref().unwrap_err().to_string();
    assert!(
        e.contains("no unique key on stub alone")
            && e.contains("ALTER TABLE Tickets64 ADD UNIQUE KEY stub (stub)"),
        "{e}"
    );
    let e = done[1].result.as_ref().unwrap_err().to_string();
    assert!(
        e.contains("Tickets64 has no column id (or is not there)"),
        "{e}"
    );
}

/// Issue 39's operator fault: a server restored under an adopted table.
/// The applications' clients cannot see the marks: the restored
/// `AUTO_INCREMENT` is below ids already handed out, so their next
/// `REPLACE` would hand one out again. `check` reports the counter behind
/// its high-water, `repair` raises it past the marks, and the
/// applications let back after it hand out no id twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_is_repaired_before_the_applications_are_let_back_mariadb() {
    let (a, b) = flickr_pair(1000);
    let config = adopted(&a, &b, (1, 2));
    init_ok(&config).await;
    let path = dump(&a, "adopt-restore");
    let mut ids = flickr_client(a.url(), 20).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    for _ in 0..20 {
        ids.extend(client.next_n("photos", 10).await.unwrap());
    }
    client.shutdown().await;
    drop(client);
    let largest_of_a = *ids.iter().filter(|id| *id % 2 == 1).max().unwrap();
    assert!(largest_of_a > 1100, "a served too little: {largest_of_a}");

    restore(&a, &path);
    assert!(
        auto_increment(&a) <= largest_of_a,
        "the restore did not set a back"
    );
    let check = admin::check(&config).await;
    assert!(
        !check.ok() && check.to_string().contains("is behind the high-water"),
        "{check}"
    );
    let repaired = admin::repair(&config).await.unwrap();
    assert!(repaired.iter().any(|r| r.server == "a"), "{repaired:?}");
    assert!(auto_increment(&a) > largest_of_a);
    let check = admin::check(&config).await;
    assert!(check.ok(), "{check}");

    let again = flickr_client(a.url(), 20).await;
    assert!(again.iter().all(|id| *id > largest_of_a));
    ids.extend(again);
    assert_unique(&ids);
}

/// A server of an adopted pair replaced by a fresh one (its `Tickets64`
/// made again as the applications' schema has it, its counter far below
/// the ids the old one handed out), then `init`, as the guide says before
/// the applications are let back: `init` raises the new table past every
/// mark of the server's residue class, so the applications' own `REPLACE`
/// hands out no id shardflake's clients got from the old server. Before:
/// `init` raised it only past the file's `start`, and the legacy client
/// handed out 100 of 100 ids again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_raises_a_replaced_server_past_its_class_marks_mariadb() {
    let (a, b) = flickr_pair(1000);
    let config = adopted(&a, &b, (1, 2));
    init_ok(&config).await;
    // The applications first, then shardflake's clients: every legacy id
    // is below the first answer after it, which the marks are ahead of.
    let mut ids = flickr_client(b.url(), 20).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    for _ in 0..20 {
        ids.extend(client.next_n("photos", 10).await.unwrap());
    }
    client.shutdown().await;
    drop(client);
    let largest_of_b = *ids.iter().filter(|id| *id % 2 == 0).max().unwrap();
    assert!(largest_of_b > 1100, "b served too little: {largest_of_b}");

    drop(b);
    let fresh = maria(2, 2);
    fresh
        .sql(&format!(
            "{TICKETS64}; INSERT INTO Tickets64 (id, stub) VALUES (1002, 'a')"
        ))
        .unwrap();
    let config = adopted(&a, &fresh, (1, 2));
    init_ok(&config).await;
    assert!(
        auto_increment(&fresh) > largest_of_b,
        "init left the new table at {} (ids up to {largest_of_b} handed out)",
        auto_increment(&fresh)
    );
    ids.extend(flickr_client(fresh.url(), 100).await);
    assert_unique(&ids);
}

/// The adopted table's guard is lifted only by `@shardflake_rewind = 1`,
/// as every other guard: an operator who switches it "off" with 0 (or any
/// other value) is still refused a row set lower. Before: any non-NULL
/// value lifted it, 0 included, and the row went from 1,001 to 5.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_adopted_guard_is_lifted_only_by_rewind_one_mariadb() {
    let (a, b) = flickr_pair(1000);
    let config = adopted(&a, &b, (1, 2));
    init_ok(&config).await;
    for value in ["0", "2", "''"] {
        let e = a
            .sql(&format!(
                "SET @shardflake_rewind = {value}; UPDATE Tickets64 SET id = 5 WHERE stub = 'a'"
            ))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is never set back in place"), "{value}: {e}");
    }
    let row = a.sql("SELECT id FROM Tickets64").unwrap();
    assert_eq!(row.trim(), "1001");
}
