//! Issue 36, items 1 and 2: the ids a residue class handed out belong to
//! the class, whoever answers for it. Each on real servers; each failed on
//! the code before (see the note on each).

use std::collections::HashSet;
use std::process::Command;
use std::time::{Duration, Instant};

use shardflake_testkit::{MariaDbServer, PgServer};
use shardflake_tickets::{Config, TicketClient, admin, tokio_postgres};

use super::live_restore::{pg_dump, pg_pair, psql};
use super::repro::{FIXED, dump, pair, restore};
use super::{init_ok, maria, server_toml, state};

/// Takes ids of `sequence` (100 at a time) until `more` of them are in
/// the residue class of offset 2 of 2 (bounded): per-id, even ids;
/// segment (chunks of 100), the second chunk of every 200.
async fn take_from_class_2(client: &TicketClient, sequence: &str, more: usize, ids: &mut Vec<u64>) {
    let in_class = |id: &&u64| match sequence {
        "blocks" => (**id - 1) / 100 % 2 == 1,
        _ => id.is_multiple_of(2),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let want = ids.iter().filter(in_class).count() + more;
    while ids.iter().filter(in_class).count() < want {
        assert!(
            Instant::now() < deadline,
            "never {more} ids of offset 2: {:?}",
            client.metrics()
        );
        ids.extend(client.next_n(sequence, 100).await.unwrap());
    }
}

/// The ids handed out, per sequence (each sequence counts on its own).
#[derive(Default)]
struct Ids {
    photos: Vec<u64>,
    blocks: Vec<u64>,
}

impl Ids {
    /// No id of either sequence handed out twice (both counted first).
    fn assert_unique(&self) {
        let twice = |v: &[u64]| v.len() - v.iter().collect::<HashSet<_>>().len();
        assert_eq!(
            (twice(&self.photos), twice(&self.blocks)),
            (0, 0),
            "ids handed out twice (per-id of {}, segment of {})",
            self.photos.len(),
            self.blocks.len()
        );
    }
}

/// Segment ids and per-id ids from the server at offset 2: `blocks` and
/// 20 more. Blocks first: a client's first call goes to the file's first
/// server, and a block is taken above every id the client handed out
/// before (a first block from another server would lift it).
async fn take_from_offset_2(client: &TicketClient, blocks: usize, ids: &mut Ids) {
    take_from_class_2(client, "blocks", blocks, &mut ids.blocks).await;
    take_from_class_2(client, "photos", 20, &mut ids.photos).await;
}

/// F1: a dead server replaced by a fresh, empty one under a **new name**
/// at the same offset, the file edited, `init` run. The new server answers
/// for the dead one's residue class, so it is raised past the class's
/// marks before its first id. Before: marks were kept per name, the new
/// name had none, and the new server handed out the dead one's ids again
/// (MariaDB: 10 of 10 per-id, every segment id of its blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_replaced_under_a_new_name_is_raised_past_the_class_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    let renamed = |c: &MariaDbServer| {
        Config::parse(&format!(
            "{}{}{FIXED}",
            server_toml("b2", "mariadb", &c.url(), 2),
            server_toml("a", "mariadb", &a.url(), 1)
        ))
        .unwrap()
    };
    replaced_under_a_new_name(config, b, || maria(2, 2), renamed).await;
}

/// F1 on PostgreSQL (the default table style).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_replaced_under_a_new_name_is_raised_past_the_class_postgres() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = pg_pair(&a, &b, "table");
    let renamed = |c: &PgServer| {
        Config::parse(&format!(
            "postgres_tickets = \"table\"\n{}{}{FIXED}",
            server_toml("b2", "postgres", &c.url(), 2),
            server_toml("a", "postgres", &a.url(), 1)
        ))
        .unwrap()
    };
    replaced_under_a_new_name(config, b, || PgServer::start().unwrap(), renamed).await;
}

/// Ids from both servers of `config`; `b` dropped (stopped for good); a
/// fresh server from `fresh` put in its place under the name `b2`
/// (`renamed`, which lists it first), initialised; ids from it: none
/// handed out twice.
async fn replaced_under_a_new_name<S>(
    config: Config,
    b: S,
    fresh: impl FnOnce() -> S,
    renamed: impl FnOnce(&S) -> Config,
) {
    init_ok(&config).await;
    let mut ids = Ids::default();
    let client = TicketClient::connect(config).await.unwrap();
    take_from_offset_2(&client, 300, &mut ids).await;
    client.shutdown().await;
    drop(client);
    drop(b);
    let c = fresh();
    let config = renamed(&c);
    init_ok(&config).await;
    let client = TicketClient::connect(config).await.unwrap();
    // Up to the old server's blocks (lifted past the first client's first
    // block, from `a`) and beyond.
    take_from_offset_2(&client, 3000, &mut ids).await;
    client.shutdown().await;
    ids.assert_unique();
}

/// An upgrade keeps the marks an older release wrote under a server's
/// name: a server is raised past them as past its class's. Here `a` holds
/// a name-keyed mark of `b` at 5000 and nothing else: `b`'s first id is
/// above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn marks_written_under_a_servers_name_still_raise_it() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    a.sql("INSERT INTO shardflake_ticket_hw (server_name, sequence_name, high_water) VALUES ('b', 'photos', 5000)")
        .unwrap();
    let client = TicketClient::connect(config).await.unwrap();
    let mut ids = Vec::new();
    take_from_class_2(&client, "photos", 1, &mut ids).await;
    let first_of_b = ids.iter().find(|id| id.is_multiple_of(2)).unwrap();
    assert!(*first_of_b > 5000, "{ids:?}");
    client.shutdown().await;
}

/// Ids of both sequences from `client`, `rounds` calls of 100 each; a
/// refused call is fine (the server of offset 2 may be refused).
async fn take_some(client: &TicketClient, rounds: usize, ids: &mut Ids) {
    for _ in 0..rounds {
        if let Ok(got) = client.next_n("blocks", 100).await {
            ids.blocks.extend(got);
        }
        if let Ok(got) = client.next_n("photos", 100).await {
            ids.photos.extend(got);
        }
    }
}

/// F8's setup on MariaDB: `b` moved to a fresh server `c` from its dump,
/// `old` on the first file, `new` on the file pointing `b` at `c` (it
/// takes `blocks` blocks of class 2 there), both asked until `old` refuses
/// `b` as superseded.
async fn f8_superseded(
    tag: &str,
    blocks: usize,
) -> (
    MariaDbServer,
    MariaDbServer,
    MariaDbServer,
    Config,
    TicketClient,
    TicketClient,
    Ids,
) {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut ids = Ids::default();
    let old = TicketClient::connect(config.clone()).await.unwrap();
    take_from_offset_2(&old, 300, &mut ids).await;
    let path = dump(&b, tag);
    let c = maria(2, 2);
    restore(&c, &path);
    let _ = std::fs::remove_file(&path);
    let moved = Config::parse(&format!(
        "{}{}{FIXED}",
        server_toml("b", "mariadb", &c.url(), 2),
        server_toml("a", "mariadb", &a.url(), 1)
    ))
    .unwrap();
    let new = TicketClient::connect(moved).await.unwrap();
    take_from_offset_2(&new, blocks, &mut ids).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&old, "b") != "superseded" {
        assert!(Instant::now() < deadline, "{:?}", old.metrics());
        take_some(&old, 1, &mut ids).await;
        take_some(&new, 1, &mut ids).await;
    }
    (a, b, c, config, old, new, ids)
}

/// F8 on MariaDB: server `b` moved to a new host from its backup (a dump
/// loaded into a fresh server on another port), the file edited to point
/// `b` there, the old host left running, one client on each file. The
/// new server takes `b`'s residue class over (it answers with another
/// identity) and is raised past every mark of the class; the old one's
/// next mark write is refused (`superseded`), so it hands out nothing
/// above the marks the new one was raised past. `check` with the old file
/// names the takeover and does not advise `repair`; `tickets takeover`
/// gives the class back to the old server, and then the copy is refused.
/// Before: both answered for the class and handed out the same ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_on_another_host_takes_the_class_over_and_the_old_one_is_refused_mariadb() {
    let (_a, _b, _c, config, old, new, mut ids) = f8_superseded("f8", 3000).await;
    ids.assert_unique();
    // check with the old file: the takeover, and not `repair`.
    let report = admin::check(&config).await;
    let text = report.to_string();
    assert!(!report.ok(), "{text}");
    assert!(
        text.contains("SUPERSEDED") && text.contains("tickets takeover"),
        "{text}"
    );
    assert!(!text.contains("tickets repair"), "{text}");
    // The operator gives the class back to the old host: the copy is
    // refused at its next mark write, the old one serves again.
    admin::takeover(&config, &*admin::admin_store(&config), "b")
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&new, "b") != "superseded" || state(&old, "b") != "up" {
        assert!(
            Instant::now() < deadline,
            "{:?} {:?}",
            new.metrics(),
            old.metrics()
        );
        take_some(&old, 1, &mut ids).await;
        take_some(&new, 1, &mut ids).await;
    }
    take_from_offset_2(&old, 300, &mut ids).await;
    old.shutdown().await;
    new.shutdown().await;
    ids.assert_unique();
}

/// F8, then the peer down (an outside review: 265 of 910 ids twice on
/// MariaDB, 250 of 1,245 on PostgreSQL with a promoted standby). A client
/// on the old file was refused `b` as superseded; with `a` down too, no
/// place answers for `b`'s marks, and the client used to take `b` back on
/// its own marks in memory, beside the copy that holds the class. A client
/// never vouches for a server it saw superseded: `b` stays refused until a
/// quorum of the places answers for it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_superseded_server_is_not_taken_back_on_own_marks_when_the_peer_is_down_mariadb() {
    let (a, _b, _c, _config, old, new, mut ids) = f8_superseded("f8p", 300).await;
    a.kill().unwrap();
    // Both clients keep asking (as services do) for 20 s: the old one
    // retries `b` on its calls; the new one goes on from the copy.
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until && state(&old, "b") != "up" {
        take_some(&old, 1, &mut ids).await;
        take_some(&new, 1, &mut ids).await;
    }
    take_some(&old, 2, &mut ids).await;
    take_some(&new, 2, &mut ids).await;
    assert_ne!(state(&old, "b"), "up", "{:?}", old.metrics());
    old.shutdown().await;
    new.shutdown().await;
    ids.assert_unique();
}

/// F8 on PostgreSQL: `b` moved to a new host from its `pg_dump`, the old
/// one left running, one client on each file: the copy takes the class
/// over, the old one is refused at its next mark write, no id twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_on_another_host_takes_the_class_over_and_the_old_one_is_refused_postgres() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = pg_pair(&a, &b, "table");
    init_ok(&config).await;
    let mut ids = Ids::default();
    let old = TicketClient::connect(config.clone()).await.unwrap();
    take_from_offset_2(&old, 300, &mut ids).await;
    let path = pg_dump(&b, "f8", &[]);
    let c = PgServer::start().unwrap();
    psql(&c, &[], &path);
    let _ = std::fs::remove_file(&path);
    let moved = Config::parse(&format!(
        "postgres_tickets = \"table\"\n{}{}{FIXED}",
        server_toml("b", "postgres", &c.url(), 2),
        server_toml("a", "postgres", &a.url(), 1)
    ))
    .unwrap();
    let new = TicketClient::connect(moved).await.unwrap();
    take_from_offset_2(&new, 3000, &mut ids).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&old, "b") != "superseded" {
        assert!(Instant::now() < deadline, "{:?}", old.metrics());
        take_some(&old, 1, &mut ids).await;
        take_some(&new, 1, &mut ids).await;
    }
    take_from_offset_2(&new, 300, &mut ids).await;
    old.shutdown().await;
    new.shutdown().await;
    ids.assert_unique();
}

/// Two copies of `b` on two new hosts, each with its own file and client,
/// started at once: their takeovers race on the holder record. Whichever
/// took the class over last holds it; the other is refused at its next
/// mark write (`superseded`), and no id is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_copies_racing_for_one_class_never_both_issue() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut ids = Ids::default();
    let first = TicketClient::connect(config).await.unwrap();
    take_from_offset_2(&first, 300, &mut ids).await;
    first.shutdown().await;
    drop(first);
    let path = dump(&b, "race");
    drop(b);
    let copies = [maria(2, 2), maria(2, 2)];
    let files: Vec<Config> = copies
        .iter()
        .map(|c| {
            restore(c, &path);
            Config::parse(&format!(
                "{}{}{FIXED}",
                server_toml("b", "mariadb", &c.url(), 2),
                server_toml("a", "mariadb", &a.url(), 1)
            ))
            .unwrap()
        })
        .collect();
    let _ = std::fs::remove_file(&path);
    let (one, two) = tokio::join!(
        TicketClient::connect(files[0].clone()),
        TicketClient::connect(files[1].clone())
    );
    let clients = [one.unwrap(), two.unwrap()];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for client in &clients {
            take_some(client, 1, &mut ids).await;
        }
        let up: Vec<&str> = clients.iter().map(|c| state(c, "b")).collect();
        if up.contains(&"superseded") {
            break;
        }
        assert!(Instant::now() < deadline, "both still serve b: {up:?}");
    }
    for client in &clients {
        take_some(client, 5, &mut ids).await;
        client.shutdown().await;
    }
    ids.assert_unique();
}

/// Runs `cmd`; its failure fails the test.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// `sql` on `s`, the first column of its first row as text.
async fn pg_query(s: &PgServer, sql: &str) -> String {
    let (c, conn) = tokio_postgres::connect(&s.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let rows = c.simple_query(sql).await.unwrap();
    rows.iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default()
}

/// SB on PostgreSQL: `b` fails over to its streaming standby (a base
/// backup taken with `-R`), the standby is promoted, a client on a file
/// that points `b` at it starts, and the old primary is restarted beside
/// it with a client still on the old file (split brain). The promoted
/// standby answers with another identity (port, data directory, and the
/// new timeline) and takes the class over; the old primary is refused
/// (`superseded`) when the old client checks it again, and `check` with
/// the old file names the takeover, not `repair`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_primary_restarted_beside_its_promoted_standby_is_refused_postgres() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = pg_pair(&a, &b, "table");
    init_ok(&config).await;
    let mut ids = Ids::default();
    let old = TicketClient::connect(config.clone()).await.unwrap();
    take_from_offset_2(&old, 300, &mut ids).await;
    // The standby: a fresh server's data replaced by b's base backup.
    let standby = PgServer::start().unwrap();
    let data = pg_query(&standby, "SHOW data_directory").await;
    standby.stop();
    let backup = format!("{data}.standby");
    run(Command::new(b.program("pg_basebackup").unwrap())
        .args(["-h", "127.0.0.1", "-U", "postgres", "-X", "stream", "-R"])
        .arg(format!("-p{}", b.port))
        .args(["-c", "fast", "-D", &backup]));
    run(Command::new("sh").arg("-c").arg(format!(
        "rm -rf '{data}' && mv '{backup}' '{data}' && chown -R postgres:postgres '{data}' && chmod 700 '{data}'"
    )));
    standby.restart().unwrap();
    // More ids from b, streamed to the standby; then b fails.
    take_from_offset_2(&old, 300, &mut ids).await;
    b.kill().unwrap();
    let pg_ctl = b.program("pg_ctl").unwrap();
    run(Command::new("sh").arg("-c").arg(format!(
        "if [ $(id -u) -eq 0 ]; then runuser -u postgres -- '{}' promote -w -D '{data}'; else '{}' promote -w -D '{data}'; fi",
        pg_ctl.display(),
        pg_ctl.display()
    )));
    // Its identity settles on the new timeline at its first checkpoint.
    assert_eq!(pg_query(&standby, "SELECT pg_is_in_recovery()").await, "f");
    pg_query(&standby, "CHECKPOINT").await;
    let promoted = Config::parse(&format!(
        "postgres_tickets = \"table\"\n{}{}{FIXED}",
        server_toml("b", "postgres", &standby.url(), 2),
        server_toml("a", "postgres", &a.url(), 1)
    ))
    .unwrap();
    let new = TicketClient::connect(promoted).await.unwrap();
    take_from_offset_2(&new, 3000, &mut ids).await;
    // The old primary comes back beside it.
    b.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&old, "b") != "superseded" {
        assert!(Instant::now() < deadline, "{:?}", old.metrics());
        take_some(&old, 1, &mut ids).await;
        take_some(&new, 1, &mut ids).await;
    }
    take_from_offset_2(&new, 300, &mut ids).await;
    let text = admin::check(&config).await.to_string();
    assert!(
        text.contains("SUPERSEDED") && text.contains("tickets takeover"),
        "{text}"
    );
    assert!(!text.contains("tickets repair"), "{text}");
    old.shutdown().await;
    new.shutdown().await;
    ids.assert_unique();
}

/// Item 2: a client's own marks never vouch for a server whose identity
/// changed. A physical copy of `b` taken earlier (a base backup, started
/// from another data directory) comes up at `b`'s address while `b`'s only
/// peer is down, after another client handed out ids from `b` past the
/// backup and past this client's own marks. This client is alone (no
/// other server up) and the copy's tables are the very ones it checked
/// (same file nodes), but the copy answers with another identity: it is
/// refused (`no_high_water`), not vouched for by the client's own marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn own_marks_never_vouch_for_another_server_at_the_same_address_postgres() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = pg_pair(&a, &b, "table");
    init_ok(&config).await;
    let mut ids = Ids::default();
    let mine = TicketClient::connect(config.clone()).await.unwrap();
    take_from_class_2(&mine, "photos", 20, &mut ids.photos).await;
    // A base backup of b, into a fresh server's data directory.
    let copy = PgServer::start().unwrap();
    let data = pg_query(&copy, "SHOW data_directory").await;
    copy.stop();
    let backup = format!("{data}.copy");
    run(Command::new(b.program("pg_basebackup").unwrap())
        .args(["-h", "127.0.0.1", "-U", "postgres", "-X", "stream"])
        .arg(format!("-p{}", b.port))
        .args(["-c", "fast", "-D", &backup]));
    run(Command::new("sh").arg("-c").arg(format!(
        "rm -rf '{data}' && mv '{backup}' '{data}' && chown -R postgres:postgres '{data}' && chmod 700 '{data}' && echo {} > '{data}.port'",
        b.port
    )));
    // Another client hands out ids from b past the backup and past this
    // client's marks (written 1,000 ids of b ahead).
    let other = TicketClient::connect(config.clone()).await.unwrap();
    take_from_class_2(&other, "photos", 3000, &mut ids.photos).await;
    other.shutdown().await;
    // The peer goes down; the copy comes up at b's address.
    a.stop();
    b.stop();
    copy.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(&mine, "b") != "no_high_water" {
        assert!(Instant::now() < deadline, "{:?}", mine.metrics());
        if let Ok(got) = mine.next_n("photos", 100).await {
            ids.photos.extend(got);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reason = mine.metrics()[1].reason.clone().unwrap_or_default();
    assert!(
        reason.contains("not as the server this client last checked"),
        "{reason}"
    );
    ids.assert_unique();
}
