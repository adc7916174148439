//! Issue 27, 4, with several clients: a dump loaded into a running server
//! under running clients whose sessions stay open. A client whose last
//! answer from that server is below the restored counter cannot tell from
//! the answer's value that another client already handed it out; every
//! answer carries the identity of the table or sequence it came from (the
//! restore recreates it), and one from an object the client has not
//! checked against the marks is never handed out. A restore that keeps
//! the table and sets its rows back in place is refused by the table's
//! guard.

use std::path::{Path, PathBuf};
use std::process::Command;

use mysql_async::prelude::Queryable;
use shardflake_testkit::PgServer;
use shardflake_tickets::{Config, TicketClient};

use super::repro::{FIXED, dump, dump_with, pair, restore};
use super::{assert_unique, init_ok, maria, server_toml};

/// Three clients take ids of both sequences; the server `a` is dumped;
/// only the second client takes ids then (so `a`'s counters move past the
/// dump); the dump is loaded into the running `a`; the three take ids
/// again, at once. The first and third clients' last answers from `a`
/// are below the restored counters. Every id is checked for duplicates.
async fn three_clients_across_a_live_restore(
    config: &Config,
    dump: impl FnOnce() -> PathBuf,
    restore: impl FnOnce(&Path),
) {
    init_ok(config).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(TicketClient::connect(config.clone()).await.unwrap());
    }
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    for c in &clients {
        photos.extend(c.next_n("photos", 50).await.unwrap());
        blocks.extend(c.next_n("blocks", 1500).await.unwrap());
    }
    let path = dump();
    photos.extend(clients[1].next_n("photos", 400).await.unwrap());
    for _ in 0..6 {
        blocks.extend(clients[1].next_n("blocks", 1000).await.unwrap());
    }
    restore(&path);
    let mut tasks = Vec::new();
    for c in &clients {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let (mut photos, mut blocks) = (Vec::new(), Vec::new());
            for _ in 0..4 {
                photos.extend(c.next_n("photos", 100).await?);
                blocks.extend(c.next_n("blocks", 1500).await?);
            }
            Ok::<_, shardflake_tickets::TicketError>((photos, blocks))
        }));
    }
    for task in tasks {
        let (p, b) = task.await.unwrap().unwrap();
        photos.extend(p);
        blocks.extend(b);
    }
    for c in &clients {
        c.shutdown().await;
    }
    let _ = std::fs::remove_file(path);
    assert_unique(&photos);
    assert_unique(&blocks);
}

/// MariaDB: `mariadb-dump` (`DROP TABLE`, `CREATE TABLE … AUTO_INCREMENT=`,
/// the rows) loaded with `source`. Before: duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_clients_across_a_live_restore_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    three_clients_across_a_live_restore(&config, || dump(&a, "three"), |p| restore(&a, p)).await;
}

/// PostgreSQL, sequence and table styles: `pg_dump --clean` (`DROP`,
/// `CREATE`, `setval`, the rows) loaded with `psql`. Before: duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_clients_across_a_live_restore_postgres() {
    for style in ["sequence", "table"] {
        let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
        let config = pg_pair(&a, &b, style);
        let dump = || pg_dump(&a, "three", &["--clean", "--if-exists"]);
        let restore = |path: &Path| psql(&a, &[], path);
        three_clients_across_a_live_restore(&config, dump, restore).await;
    }
}

/// A MariaDB user without the `PROCESS` privilege cannot read InnoDB's
/// table ids; its sessions tell tables apart by their creation time
/// instead: they still get tickets, and still refuse answers from a dump
/// loaded into the running server, given a dump loaded in a later second
/// than its tables were made in (the creation time's resolution). Without
/// the fallback every session failed ("you need the PROCESS privilege").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_user_without_the_process_privilege_is_served_by_creation_time() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    for m in [&a, &b] {
        m.sql("CREATE USER tickets@'%'; GRANT ALL ON app.* TO tickets@'%'")
            .unwrap();
    }
    let url = |m: &shardflake_testkit::MariaDbServer| m.url().replace("root@", "tickets@");
    let mut conn = mysql_async::Conn::from_url(url(&a)).await.unwrap();
    let denied = conn
        .query_drop("SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES WHERE NAME = ''")
        .await;
    assert!(denied.is_err(), "the user reads InnoDB's table ids");
    drop(conn);
    let config = Config::parse(&format!(
        "{}{}{FIXED}",
        server_toml("a", "mariadb", &url(&a), 1),
        server_toml("b", "mariadb", &url(&b), 2)
    ))
    .unwrap();
    three_clients_across_a_live_restore(
        &config,
        || {
            let path = dump(&a, "noprocess");
            // Load it in a later second than the tables were made in.
            let dumped = std::time::Instant::now();
            while dumped.elapsed() < std::time::Duration::from_millis(1100) {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            path
        },
        |p| restore(&a, p),
    )
    .await;
}

/// Issue 27, an in-place restore: the ticket tables emptied with
/// `TRUNCATE` and their rows of an earlier data-only dump loaded back,
/// under running clients. The objects keep their names and oids, so an
/// identity by oid (PostgreSQL) or by creation time within one second
/// (MariaDB) saw nothing, and the first and third clients repeated the
/// second's ids; a `TRUNCATE` gives the table a new file node
/// (PostgreSQL) and a new InnoDB table id (MariaDB), which the answers now
/// carry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_clients_across_a_truncate_and_reload_postgres() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = pg_pair(&a, &b, "table");
    let tables = ["tickets_photos", "shardflake_ticket_segments"];
    let dump = || {
        pg_dump(
            &a,
            "inplace",
            &["--data-only", "-t", tables[0], "-t", tables[1]],
        )
    };
    let truncate = format!("TRUNCATE {}", tables.join(", "));
    let restore = |path: &Path| psql(&a, &["-c", &truncate], path);
    three_clients_across_a_live_restore(&config, dump, restore).await;
}

/// MariaDB: `TRUNCATE TABLE` and the rows of `mariadb-dump
/// --no-create-info --skip-triggers` (see the PostgreSQL one above; the
/// tables keep their guards, which the dump would otherwise create again
/// and fail on).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_clients_across_a_truncate_and_reload_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    let tables = ["tickets_photos", "shardflake_ticket_segments"];
    let dump = || {
        dump_with(
            &a,
            "inplace",
            &[
                "--no-create-info",
                "--skip-triggers",
                "app",
                tables[0],
                tables[1],
            ],
        )
    };
    let restore = |path: &Path| {
        for t in tables {
            a.sql(&format!("TRUNCATE TABLE {t}")).unwrap();
        }
        restore(&a, path);
    };
    three_clients_across_a_live_restore(&config, dump, restore).await;
}

/// MariaDB: a data-only dump written as `REPLACE` (`mariadb-dump
/// --no-create-info --replace`) loaded into the running server: the same
/// tables, rows set back in place, so no answer's identity changes. The
/// guard refuses it (the load fails, nothing is set back). Before: 1,000
/// and more duplicate ids, every client's answers above its own last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_data_only_replace_loaded_in_place_is_refused_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    let dump = || {
        dump_with(
            &a,
            "replace",
            &[
                "--no-create-info",
                "--replace",
                "--skip-triggers",
                "app",
                "shardflake_ticket_segments",
            ],
        )
    };
    // Loaded from standard input (`source` reports an error but exits 0).
    let loaded = std::sync::Mutex::new(None);
    let restore = |path: &Path| {
        let out = Command::new("mariadb")
            .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
            .arg(format!("-P{}", a.port))
            .arg("app")
            .stdin(std::fs::File::open(path).unwrap())
            .output()
            .unwrap();
        *loaded.lock().unwrap() = Some(out);
    };
    three_clients_across_a_live_restore(&config, dump, restore).await;
    let loaded = loaded.lock().unwrap().take().unwrap();
    let said = String::from_utf8_lossy(&loaded.stderr);
    assert!(!loaded.status.success(), "the dump was loaded in place");
    assert!(said.contains("never set back in place"), "{said}");
}

/// `pg_dump` of database `postgres` on `a` with `args`, to a file.
pub(super) fn pg_dump(a: &PgServer, tag: &str, args: &[&str]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("tickets-{tag}-{}.sql", a.port));
    let out = Command::new(a.program("pg_dump").unwrap())
        .args(args)
        .args(["-h", "127.0.0.1", "-U", "postgres"])
        .arg(format!("-p{}", a.port))
        .args(["-f", &path.to_string_lossy(), "postgres"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// `psql` on `a`'s database `postgres`: `before` (e.g. `-c SQL`), then the
/// file at `path`, stopping at the first error.
pub(super) fn psql(a: &PgServer, before: &[&str], path: &Path) {
    let out = Command::new(a.program("psql").unwrap())
        .args([
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
        ])
        .arg(format!("-p{}", a.port))
        .args(before)
        .args(["-f", &path.to_string_lossy(), "postgres"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A PostgreSQL pair with [`FIXED`]'s sequences, `style` its
/// `postgres_tickets`.
pub(super) fn pg_pair(a: &PgServer, b: &PgServer, style: &str) -> Config {
    Config::parse(&format!(
        "postgres_tickets = \"{style}\"\n{}{}{FIXED}",
        server_toml("a", "postgres", &a.url(), 1),
        server_toml("b", "postgres", &b.url(), 2)
    ))
    .unwrap()
}
