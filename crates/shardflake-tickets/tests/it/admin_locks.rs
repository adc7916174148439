//! Issue 27, 7 (the part left): `repair` on a server that holds a lock
//! is bounded and says which server and statement timed out: under
//! `FLUSH TABLES WITH READ LOCK`, behind an `ALTER TABLE` that waits for a
//! metadata lock (every later statement on the table queues behind it), and
//! on PostgreSQL behind `LOCK TABLE … ACCESS EXCLUSIVE`. Once the lock is
//! gone, `repair` raises the counters.

use std::time::{Duration, Instant};

use shardflake_testkit::{MariaDbServer, PgServer};
use shardflake_tickets::mysql_async::prelude::Queryable;
use shardflake_tickets::{Config, admin, mysql_async, tokio_postgres};

use super::{init_ok, maria, server_toml};

/// What a lock may hold `repair` for before the test calls it unbounded
/// (the limit is 1 s a statement, 4 s a server).
const UNBOUNDED: Duration = Duration::from_secs(60);

const SEQUENCES: &str = r#"
[failover]
admin_timeout_ms = 1000

[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"
"#;

/// `a` behind marks its peer holds, as a restore would leave it.
fn behind(kind: &str, a: &str, b: &str, style: &str) -> Config {
    Config::parse(&format!(
        "postgres_tickets = \"{style}\"\n{}{}{SEQUENCES}",
        server_toml("a", kind, a, 1),
        server_toml("b", kind, b, 2)
    ))
    .unwrap()
}

const MARKS_OF_A: &str = "INSERT INTO shardflake_ticket_hw (server_name, sequence_name, high_water) VALUES ('a', 'photos', 100001), ('a', 'blocks', 100001)";

async fn conn(m: &MariaDbServer) -> mysql_async::Conn {
    mysql_async::Conn::new(mysql_async::Opts::from_url(&m.url()).unwrap())
        .await
        .unwrap()
}

/// `repair` fails within [`UNBOUNDED`], naming server `a` and `what`.
async fn repair_refused(config: &Config, what: &[&str]) {
    let started = Instant::now();
    let e = tokio::time::timeout(UNBOUNDED, admin::repair(config))
        .await
        .expect("repair waited on the locked server")
        .expect_err("repair went through the lock");
    let text = e.to_string();
    assert!(
        text.contains("\"a\"") && what.iter().any(|w| text.contains(w)),
        "the error must name the server and the statement: {text}"
    );
    println!("refused after {:?}: {text}", started.elapsed());
}

/// Without the bounds (the session's `lock_wait_timeout` and the admin
/// limit on our side, both added for issue 27), `repair` waited for the
/// lock past [`UNBOUNDED`].
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repair_is_bounded_on_a_locked_mariadb_server() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = behind("mariadb", &a.url(), &b.url(), "sequence");
    init_ok(&config).await;
    b.sql(MARKS_OF_A).unwrap();

    let mut lock = conn(&a).await;
    lock.query_drop("FLUSH TABLES WITH READ LOCK")
        .await
        .unwrap();
    repair_refused(&config, &["raise the counter", "UPDATE tickets_photos"]).await;
    lock.query_drop("UNLOCK TABLES").await.unwrap();

    // A transaction reads the table; an ALTER waits for it to end, and
    // every later statement on the table waits behind the ALTER.
    lock.query_drop("BEGIN").await.unwrap();
    lock.query_drop("SELECT * FROM tickets_photos")
        .await
        .unwrap();
    let mut alter = conn(&a).await;
    alter
        .query_drop("SET SESSION lock_wait_timeout = 300")
        .await
        .unwrap();
    let altering = tokio::spawn(async move {
        alter
            .query_drop("ALTER TABLE tickets_photos COMMENT = 'held'")
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while a
        .sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'ALTER TABLE tickets_photos%' AND STATE LIKE '%metadata lock%'")
        .unwrap()
        != "1"
    {
        assert!(Instant::now() < deadline, "the ALTER never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The counter is the table's row: its read waits behind the ALTER.
    repair_refused(&config, &["read the counter of tickets_photos"]).await;
    lock.query_drop("COMMIT").await.unwrap();
    altering.await.unwrap().unwrap();

    // The locks gone, repair raises a past its marks.
    let done = admin::repair(&config).await.unwrap();
    assert_eq!(done.len(), 2, "{done:?}");
    let report = admin::check(&config).await;
    assert!(report.ok(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repair_is_bounded_on_a_locked_postgres_server() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = behind("postgres", &a.url(), &b.url(), "table");
    init_ok(&config).await;
    let connect = |url: String| async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
    };
    connect(b.url())
        .await
        .batch_execute(MARKS_OF_A)
        .await
        .unwrap();

    let lock = connect(a.url()).await;
    lock.batch_execute("BEGIN; LOCK TABLE tickets_photos IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    repair_refused(&config, &["counter"]).await;
    lock.batch_execute("COMMIT").await.unwrap();

    let done = admin::repair(&config).await.unwrap();
    assert_eq!(done.len(), 2, "{done:?}");
    let report = admin::check(&config).await;
    assert!(report.ok(), "{report}");
}
