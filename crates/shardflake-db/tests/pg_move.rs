//! Shard moves against real PostgreSQL servers: changes committed during the
//! move (also from subtransactions of a transaction open across the bulk
//! copy's snapshot), the sequence carry-over, refusals.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardflake::Id;
use shardflake_db::move_shard::{MoveOptions, move_shard};
use shardflake_db::testing::PgServer;
use shardflake_db::{Topology, pg, sql};
use tokio_postgres::Client;

fn topology(a: &PgServer, b: &PgServer) -> String {
    format!(
        "layout = \"instagram\"\nshards = 8\n\
         [[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-3\"\n\
         [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"4-7\"\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, user_id bigint NOT NULL, body text)\"\n",
        a.url(),
        b.url()
    )
}

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

/// A topology file in a fresh temp dir, removed on drop.
struct TopoFile(PathBuf);

impl TopoFile {
    fn new(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sf-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("topology.toml");
        std::fs::write(&path, text).unwrap();
        TopoFile(path)
    }
}

impl Drop for TopoFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Waits (polling, bounded) until a session of the move on `c`'s server is
/// blocked on a lock while running a statement that starts with `prefix`.
async fn wait_for_blocked(c: &Client, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE application_name = 'shardflake' AND wait_event_type = 'Lock'
                    AND query LIKE $1 || '%'",
                &[&prefix],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the move never blocked on {prefix:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn rows(c: &Client) -> Vec<(i64, i64, Option<String>)> {
    c.query(
        "SELECT id, user_id, body FROM shard3.posts ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_copies_changes_committed_during_it_including_savepoints_across_the_snapshot() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-delta", &topology(&a, &b));
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let ca = client(&a).await;
    ca.batch_execute(
        "INSERT INTO shard3.posts (user_id, body) SELECT g, 'old' FROM generate_series(1, 1000) g",
    )
    .await
    .unwrap();
    let id_of = |user: i64| {
        let ca = &ca;
        async move {
            ca.query_one("SELECT id FROM shard3.posts WHERE user_id = $1", &[&user])
                .await
                .unwrap()
                .get::<_, i64>(0)
        }
    };
    let (x1, x2, x3, x4, x5) = (
        id_of(1).await,
        id_of(2).await,
        id_of(3).await,
        id_of(4).await,
        id_of(5).await,
    );

    // T is open across the move's snapshot: a plain update and one inside a
    // savepoint (a subtransaction xid, which snapshots do not list) before it.
    let mut ct = client(&a).await;
    let t = ct.transaction().await.unwrap();
    t.execute(
        "UPDATE shard3.posts SET body = 'plain, before' WHERE id = $1",
        &[&x1],
    )
    .await
    .unwrap();
    t.batch_execute(&format!(
        "SAVEPOINT s1; UPDATE shard3.posts SET body = 'savepoint, before' WHERE id = {x2}; RELEASE s1"
    ))
    .await
    .unwrap();

    let path = file.0.clone();
    let mover = tokio::spawn(async move {
        let opts = MoveOptions { keep_source: true };
        move_shard(&path, 3, "b", &opts).await
    });
    // The move has taken its snapshot and copied, and now waits for T's lock.
    wait_for_blocked(&ca, "LOCK TABLE").await;
    // More changes in T, after the snapshot, in a savepoint, then commit.
    t.batch_execute(&format!(
        "SAVEPOINT s2;
         UPDATE shard3.posts SET body = 'savepoint, after' WHERE id = {x4};
         DELETE FROM shard3.posts WHERE id IN ({x3}, {x5});
         INSERT INTO shard3.posts (user_id, body) VALUES (-1, 'inserted in savepoint');
         RELEASE s2"
    ))
    .await
    .unwrap();
    t.commit().await.unwrap();
    let report = mover.await.unwrap().unwrap();
    assert!(report.delta_rows >= 4, "{report:?}");

    // The destination holds exactly the source's rows (the fenced old copy
    // was kept for this comparison).
    let cb = client(&b).await;
    let (on_a, on_b) = (rows(&ca).await, rows(&cb).await);
    assert_eq!(on_a.len(), 999);
    assert_eq!(on_a, on_b);
    let body = |id: i64| on_b.iter().find(|r| r.0 == id).and_then(|r| r.2.clone());
    assert_eq!(body(x1).as_deref(), Some("plain, before"));
    assert_eq!(
        body(x2).as_deref(),
        Some("savepoint, before"),
        "lost update"
    );
    assert_eq!(body(x4).as_deref(), Some("savepoint, after"));
    assert_eq!(body(x3), None);
    assert!(on_b.iter().any(|r| r.1 == -1));
    // The old copy is fenced.
    let e = ca
        .execute(
            "UPDATE shard3.posts SET body = 'late' WHERE id = $1",
            &[&x1],
        )
        .await
        .unwrap_err();
    assert!(shardflake_db::is_moved(&e), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_carries_the_sequence_refuses_foreign_objects_and_holds_the_apply_lock() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-seq", &topology(&a, &b));
    let topo = Topology::load(&file.0).unwrap();
    pg::apply(&topo).await.unwrap();
    let ca = client(&a).await;

    // A relation the topology does not describe: refused, nothing touched.
    ca.batch_execute("CREATE VIEW shard3.recent AS SELECT * FROM shard3.posts")
        .await
        .unwrap();
    let e = move_shard(&file.0, 3, "b", &Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("relation recent"), "{e}");
    assert_eq!(
        Topology::load(&file.0).unwrap().server_of(3).unwrap().name,
        "a"
    );
    let cb = client(&b).await;
    let on_b: bool = cb
        .query_one("SELECT to_regnamespace('shard3') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!on_b);
    ca.batch_execute("DROP VIEW shard3.recent").await.unwrap();

    // The source's sequence is 10 s ahead of the clock (a burst borrowed
    // ticks): ids made after the move must continue above it.
    let layout = topo.layout();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ahead = ((now + 10_000 - layout.epoch_ms()) as i64) << layout.sequence().bits();
    ca.execute("SELECT setval('shard3.posts_id_seq', $1)", &[&ahead])
        .await
        .unwrap();
    let last_on_a: i64 = ca
        .query_one(
            "INSERT INTO shard3.posts (user_id) VALUES (1) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(Id(last_on_a as u64).decode(layout).unwrap().unix_ms >= now + 10_000);

    // Someone holds the apply lock on b: the move waits for it.
    let holder = client(&b).await;
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&(sql::LOCK_BASE - 1)])
        .await
        .unwrap();
    let path = file.0.clone();
    let mover = tokio::spawn(async move { move_shard(&path, 3, "b", &Default::default()).await });
    wait_for_blocked(&cb, "SELECT pg_advisory_lock").await;
    assert!(!mover.is_finished());
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&(sql::LOCK_BASE - 1)])
        .await
        .unwrap();
    mover.await.unwrap().unwrap();

    let first_on_b: i64 = cb
        .query_one(
            "INSERT INTO shard3.posts (user_id) VALUES (2) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        first_on_b > last_on_a,
        "id {first_on_b} on the destination is not above {last_on_a} from the source"
    );
    // The move released the apply lock: apply runs.
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
}
