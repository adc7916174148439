//! Issue #27's reproductions, each on real servers: a restore from an older
//! dump (stopped and live), `repair`, no peer answering, edits to the file,
//! a stalled peer, a server holding a lock. Each failed on the code before
//! the write-ahead marks (see the note on each).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use shardflake_testkit::{MariaDbServer, PgServer};
use shardflake_tickets::mysql_async::prelude::Queryable;
use shardflake_tickets::{Config, TicketClient, admin, mysql_async, tokio_postgres};

use super::{assert_unique, init_ok, maria, server_toml, state};

/// Fixed blocks of 1,000 ids (10 chunks of 100), so which block is where
/// is known.
pub(super) const FIXED: &str = r#"
[failover]
attempt_timeout_ms = 1000
timeout_ms = 3000
probe_interval_ms = 50
high_water_interval_ms = 50

[segment]
chunk = 100
min_step = 1000
max_step = 1000

[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"
"#;

pub(super) fn pair(a: &MariaDbServer, b: &MariaDbServer, extra: &str) -> Config {
    Config::parse(&format!(
        "{}{}{FIXED}{extra}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 2)
    ))
    .unwrap()
}

/// `mariadb-dump` of the whole `app` database, to a file.
pub(super) fn dump(m: &MariaDbServer, tag: &str) -> PathBuf {
    dump_with(m, tag, &["app"])
}

/// `mariadb-dump` with `args` (options, then what to dump), to a file.
pub(super) fn dump_with(m: &MariaDbServer, tag: &str, args: &[&str]) -> PathBuf {
    let out = Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", m.port))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = std::env::temp_dir().join(format!("tickets-{tag}-{}.sql", m.port));
    std::fs::write(&path, &out.stdout).unwrap();
    path
}

/// Loads a dump into the running server (its sessions stay open).
pub(super) fn restore(m: &MariaDbServer, path: &Path) {
    m.load(path).unwrap();
}

/// The segment row of `blocks` on `m`.
fn segment_row(m: &MariaDbServer) -> i64 {
    m.sql("SELECT max_id FROM shardflake_ticket_segments WHERE sequence_name = 'blocks'")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

pub(super) fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// How many calls `server` has answered `client` (block reservations in
/// segment mode).
pub(super) fn calls(client: &TicketClient, server: &str) -> u64 {
    client
        .metrics()
        .into_iter()
        .find(|m| m.name == server)
        .unwrap()
        .calls
}

/// Takes ids from `client`, 100 at a time, until server `server` has
/// answered `blocks` block reservations. After each take it waits (up to
/// 200 ms) for a prefetch under way to land, so the client stops while it
/// still holds the block it was taking from.
async fn take_until_blocks(client: &TicketClient, server: &str, blocks: u64, ids: &mut Vec<u64>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls(client, server) < blocks {
        assert!(
            Instant::now() < deadline,
            "{server} never reserved {blocks} blocks"
        );
        ids.extend(client.next_n("blocks", 100).await.unwrap());
        let settle = Instant::now() + Duration::from_millis(200);
        while calls(client, server) < blocks && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// 1. Segment: a prefetched block is protected. The client holds a block
/// of `a` and has reserved the next one of `a` ahead; `a` is restored from
/// a dump taken between the two. `check` must see it, and a fresh client
/// must never reserve the prefetched block again. Before: `check` said ok
/// and the fresh client handed out the prefetched block's ids (1,000
/// duplicates here).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro1_a_prefetched_block_survives_a_restore_of_its_server() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let (client, mut ids, path) = hold_a_prefetched_block(&config, &a).await;
    // Restored while stopped: its sessions are new.
    restore(&a, &path);
    a.restart().unwrap();
    let report = admin::check(&config).await;
    assert!(
        !report.ok() && report.to_string().contains("behind the high-water"),
        "{report}"
    );
    let fresh = TicketClient::connect(config.clone()).await.unwrap();
    for _ in 0..3 {
        ids.extend(fresh.next_n("blocks", 1000).await.unwrap());
        ids.extend(client.next_n("blocks", 1000).await.unwrap());
    }
    assert_unique(&ids);
    let _ = std::fs::remove_file(path);
}

/// Takes `blocks` ids until `a` has reserved two blocks for this client,
/// dumping `a` after the first.
async fn hold_a_prefetched_block(
    config: &Config,
    a: &MariaDbServer,
) -> (TicketClient, Vec<u64>, PathBuf) {
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = Vec::new();
    take_until_blocks(&client, "a", 1, &mut ids).await;
    // Let the writer write what it would (before: the chunks used).
    client.record_high_water().await.unwrap();
    let dumped = segment_row(a);
    let path = dump(a, "prefetch");
    take_until_blocks(&client, "a", 2, &mut ids).await;
    client.record_high_water().await.unwrap();
    // The second block of a is reserved, none of its ids handed out yet.
    assert!(segment_row(a) > dumped);
    let of_a = ids.iter().filter(|&&id| (id - 1) / 100 % 2 == 0);
    assert!(
        of_a.max().is_some_and(|&id| id <= dumped as u64),
        "the client already took from a's second block"
    );
    (client, ids, path)
}

/// 2. Segment: `repair` raises past every block a client could hold. Before:
/// only to the chunks used, below the client's prefetched block (whose ids
/// the next reservation handed out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro2_repair_raises_past_the_blocks_clients_hold() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let (client, mut ids, path) = hold_a_prefetched_block(&config, &a).await;
    // What a reserved, blocks the client holds included.
    let reserved = segment_row(&a);
    restore(&a, &path);
    a.restart().unwrap();
    assert!(
        segment_row(&a) < reserved,
        "the dump did not set the row back"
    );
    admin::repair(&config).await.unwrap();
    let report = admin::check(&config).await;
    assert!(report.ok(), "{report}");
    let counter = |r: &admin::CheckReport| {
        r.servers[0].settings.as_ref().unwrap().sequences[1]
            .counter
            .unwrap()
    };
    let repaired = counter(&report);
    assert!(
        repaired >= reserved as u64,
        "repair raised a to {repaired}, below the {reserved} it had reserved before the restore"
    );
    for _ in 0..3 {
        ids.extend(client.next_n("blocks", 1000).await.unwrap());
    }
    assert_unique(&ids);
    let _ = std::fs::remove_file(path);
}

/// 3. No place holding a server's marks answers, and the client has none:
/// refused by default (`no_high_water`), served with
/// `allow_without_marks`. Before: a fresh client trusted the restored
/// server and handed out its ids again (20 of 20).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro3_a_server_whose_marks_no_peer_holds_is_refused() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let path = dump(&a, "nopeer");
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let ids = client.next_n("photos", 400).await.unwrap();
    client.shutdown().await;
    drop(client);
    restore(&a, &path);
    a.restart().unwrap();
    b.kill().unwrap();
    let fresh = TicketClient::connect(config.clone()).await;
    let e = match fresh {
        Err(e) => e,
        Ok(fresh) => {
            let got = fresh.next_n("photos", 20).await;
            let repeated = got
                .as_ref()
                .map(|got| got.iter().filter(|id| ids.contains(id)).count())
                .unwrap_or(0);
            assert_eq!(repeated, 0, "ids handed out again: {got:?}");
            got.unwrap_err()
        }
    };
    let text = e.to_string();
    assert!(
        text.contains("allow_without_marks"),
        "the refusal must name the setting: {text}"
    );
    // Availability over safety, when the operator says so.
    let mut allow = config.clone();
    allow.failover.allow_without_marks = true;
    let fresh = TicketClient::connect(allow).await.unwrap();
    assert_eq!(state(&fresh, "a"), "up");
    fresh.next("photos").await.unwrap();
    b.restart().unwrap();
    let _ = std::fs::remove_file(path);
}

/// 4. A dump loaded into a running server under a running client (no
/// reconnect), MariaDB: the answer at or below the previous one from that
/// server is never handed out; the server is refused, raised past its
/// marks, and used again. Before: the next 100 ids repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro4_a_live_restore_under_a_running_client_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut photos = client.next_n("photos", 100).await.unwrap();
    let mut blocks = client.next_n("blocks", 1500).await.unwrap();
    let path = dump(&a, "live");
    photos.extend(client.next_n("photos", 200).await.unwrap());
    blocks.extend(client.next_n("blocks", 3000).await.unwrap());
    restore(&a, &path);
    photos.extend(client.next_n("photos", 100).await.unwrap());
    for _ in 0..4 {
        blocks.extend(client.next_n("blocks", 1000).await.unwrap());
    }
    // A fresh client too.
    let fresh = TicketClient::connect(config).await.unwrap();
    photos.extend(fresh.next_n("photos", 100).await.unwrap());
    for _ in 0..4 {
        blocks.extend(fresh.next_n("blocks", 1000).await.unwrap());
        blocks.extend(client.next_n("blocks", 1000).await.unwrap());
    }
    photos.extend(client.next_n("photos", 100).await.unwrap());
    assert_unique(&photos);
    assert_unique(&blocks);
    let _ = std::fs::remove_file(path);
}

/// 4, PostgreSQL (sequence and table styles): the counters set back under
/// a running client whose sessions stay open. Before: ids repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro4_a_live_restore_under_a_running_client_postgres() {
    for style in ["sequence", "table"] {
        let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
        let config = Config::parse(&format!(
            "postgres_tickets = \"{style}\"\n{}{}{FIXED}",
            server_toml("a", "postgres", &a.url(), 1),
            server_toml("b", "postgres", &b.url(), 2)
        ))
        .unwrap();
        init_ok(&config).await;
        let client = TicketClient::connect(config.clone()).await.unwrap();
        let mut photos = client.next_n("photos", 300).await.unwrap();
        let mut blocks = client.next_n("blocks", 4500).await.unwrap();
        let (admin_a, conn) = tokio_postgres::connect(&a.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let back = if style == "sequence" {
            "SELECT setval('tickets_photos', 1, false)"
        } else {
            "UPDATE tickets_photos SET id = 1"
        };
        // Tables are never set back in place by accident (the guard) ...
        for table in ["tickets_photos", "shardflake_ticket_segments"] {
            if style == "sequence" && table == "tickets_photos" {
                continue;
            }
            let column = if table == "tickets_photos" {
                "id"
            } else {
                "max_id"
            };
            let refused = admin_a
                .batch_execute(&format!("UPDATE {table} SET {column} = 1"))
                .await
                .unwrap_err();
            assert!(
                format!("{refused:?}").contains("never set back in place"),
                "{refused:?}"
            );
        }
        // ... so the counters are set back here as by an operator who
        // forced it past the guard.
        admin_a
            .batch_execute(&format!(
                "SET shardflake.rewind = on; {back}; UPDATE shardflake_ticket_segments SET max_id = 900; RESET shardflake.rewind"
            ))
            .await
            .unwrap();
        photos.extend(client.next_n("photos", 100).await.unwrap());
        let fresh = TicketClient::connect(config).await.unwrap();
        for _ in 0..4 {
            blocks.extend(client.next_n("blocks", 1000).await.unwrap());
            blocks.extend(fresh.next_n("blocks", 1000).await.unwrap());
        }
        photos.extend(fresh.next_n("photos", 100).await.unwrap());
        photos.extend(client.next_n("photos", 100).await.unwrap());
        assert_unique(&photos);
        assert_unique(&blocks);
    }
}

/// 5. Edits to the file are refused by every session, with the way to make
/// them safely; `reshape` makes one. Before: swapped offsets, a server
/// removed (increment 2 to 1) and a new chunk were each taken silently and
/// handed out ids twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro5_edits_to_the_file_are_refused_and_reshape_makes_them_safely() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut photos = client.next_n("photos", 200).await.unwrap();
    let mut blocks = client.next_n("blocks", 2500).await.unwrap();
    client.shutdown().await;
    drop(client);

    let swapped = Config::parse(&format!(
        "{}{}{FIXED}",
        server_toml("a", "mariadb", &a.url(), 2),
        server_toml("b", "mariadb", &b.url(), 1)
    ))
    .unwrap();
    let removed = Config::parse(&format!(
        "{}{FIXED}",
        server_toml("a", "mariadb", &a.url(), 1)
    ))
    .unwrap();
    let rechunked = Config::parse(&format!(
        "{}{}{}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 2),
        FIXED.replace("chunk = 100", "chunk = 50")
    ))
    .unwrap();
    for (what, edited) in [
        ("swapped", &swapped),
        ("removed", &removed),
        ("rechunked", &rechunked),
    ] {
        match TicketClient::connect(edited.clone()).await {
            Ok(c) => {
                for sequence in ["photos", "blocks"] {
                    let got = c.next_n(sequence, 100).await;
                    let e = got.expect_err(&format!("{what}: {sequence} was served"));
                    assert!(e.to_string().contains("reshape"), "{what}: {e}");
                }
            }
            Err(e) => {
                assert!(
                    e.to_string().contains("lattice") || e.to_string().contains("reshape"),
                    "{what}: {e}"
                );
            }
        }
        let init = admin::init(edited).await;
        let e = init[0].result.as_ref().unwrap_err();
        assert_eq!(e.code(), "lattice_changed", "{what}: {e}");
    }
    // The safe way: `a` alone, past everything both handed out.
    let store = shardflake_tickets::PeersStore::new(removed.clone());
    let done = admin::reshape(&removed, &store).await.unwrap();
    assert_eq!(done.len(), 2, "{done:?}");
    let alone = TicketClient::connect(removed).await.unwrap();
    photos.extend(alone.next_n("photos", 300).await.unwrap());
    blocks.extend(alone.next_n("blocks", 3000).await.unwrap());
    assert_unique(&photos);
    assert_unique(&blocks);
}

/// 6. A SIGSTOPped peer holds no call to a healthy server beyond its share:
/// a running client takes the restarted `a` back and serves from it; a
/// fresh one is refused at once with `no_high_water` (not a timeout), or
/// served with `allow_without_marks`. Before: `a` never came back (every
/// check waited for `b`'s marks as long as the whole attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro6_a_stopped_peer_does_not_hold_a_healthy_server() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut photos = client.next_n("photos", 100).await.unwrap();
    let b_pid = b.pid().unwrap();
    signal(b_pid, "STOP");
    a.kill().unwrap();
    a.restart().unwrap();
    // Calls go on (b hangs, a is taken back).
    let mut errors = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&client, "a") != "up" && Instant::now() < deadline {
        match client.next("photos").await {
            Ok(id) => photos.push(id),
            Err(e) => errors.push(e),
        }
    }
    let a_state = state(&client, "a");
    let fresh = TicketClient::connect(config.clone()).await;
    let mut allow = config.clone();
    allow.failover.allow_without_marks = true;
    let allowed = TicketClient::connect(allow).await;
    let served = match &allowed {
        Ok(c) => c.next_n("photos", 10).await,
        Err(e) => Err(e.clone()),
    };
    photos.extend(client.next_n("photos", 100).await.unwrap_or_default());
    signal(b_pid, "CONT");
    assert_eq!(
        a_state, "up",
        "a was never taken back while b was stopped: {errors:?}"
    );
    let e = fresh.expect_err("a fresh client used a server whose marks none holds");
    assert!(
        e.to_string().contains("no_high_water") || e.to_string().contains("allow_without_marks"),
        "{e}"
    );
    assert_eq!(served.unwrap().len(), 10);
    assert_unique(&photos);
}

/// 7. `init` and `check` are bounded on a server that holds a lock, and
/// say which server and statement. Before: `init` waited forever (here:
/// past the test's 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repro7_admin_commands_are_bounded_on_a_locked_server() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = Config::parse(&format!(
        "{}{}{}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 2),
        FIXED.replace("[failover]\n", "[failover]\nadmin_timeout_ms = 1000\n")
    ))
    .unwrap();
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    client.next_n("photos", 50).await.unwrap();
    client.shutdown().await;
    drop(client);
    let mut lock = mysql_async::Conn::new(mysql_async::Opts::from_url(&a.url()).unwrap())
        .await
        .unwrap();
    lock.query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .unwrap();
    let limit = Duration::from_secs(60);
    let init = tokio::time::timeout(limit, admin::init(&config))
        .await
        .expect("init waited on the locked server");
    let e = init[0].result.as_ref().unwrap_err();
    let text = e.to_string();
    assert!(text.contains("\"a\"") && text.contains("init"), "{text}");
    assert!(init[1].result.is_ok(), "{:?}", init[1].result);
    lock.query_drop("UNLOCK TABLES").await.unwrap();

    // check reads under the lock, within the limit.
    lock.query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .unwrap();
    tokio::time::timeout(limit, admin::check(&config))
        .await
        .expect("check waited");
    lock.query_drop("UNLOCK TABLES").await.unwrap();
}

/// Found on the way: a pooled session from before a server restart is
/// retried on a fresh (checked) one, so a lone server's first caller after
/// the restart is answered. Before: that caller got `unavailable` ("Broken
/// pipe"), each server being tried once per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pooled_session_broken_by_a_restart_is_retried_on_a_fresh_one() {
    let a = maria(1, 1);
    // A restarted server is slow to its first answers on a busy machine:
    // the point is the retry, not the time.
    let config = Config::parse(&format!(
        "{}{}",
        server_toml("a", "mariadb", &a.url(), 1),
        FIXED
            .replace("attempt_timeout_ms = 1000", "attempt_timeout_ms = 10000")
            .replace("timeout_ms = 3000", "timeout_ms = 20000")
    ))
    .unwrap();
    init_ok(&config).await;
    let client = TicketClient::connect(config).await.unwrap();
    let mut photos = client.next_n("photos", 20).await.unwrap();
    a.kill().unwrap();
    a.restart().unwrap();
    photos.extend(client.next_n("photos", 20).await.unwrap());
    assert_unique(&photos);
}
