//! Shard moves against real PostgreSQL servers: changes committed during the
//! move (also from subtransactions of a transaction open across the bulk
//! copy's snapshot), the sequence carry-over, refusals; ids drawn across a
//! move by statements that touch no shard table, a deadlock with the pause,
//! the old copy given back after a late failure, the fence's quoting; the
//! destination's copy refusing writes until it is live, rows written to it
//! anyway never dropped; a copy that needs repair never moved.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardflake::Id;
use shardflake_db::pg::move_shard::{MoveOptions, MoveStep, abort_move, move_shard};
use shardflake_db::pg::{self, Topology, sql};
use shardflake_testkit::PgServer;
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
        let opts = MoveOptions {
            keep_source: true,
            ..Default::default()
        };
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

    // The source's sequence is 0.9 s ahead of the clock (a burst borrowed
    // ticks): ids made after the move must continue above it.
    let layout = topo.layout();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ahead = ((now + 900 - layout.epoch_ms()) as i64) << layout.sequence().bits();
    ca.execute("SELECT setval('shard3.id_seq', $1)", &[&ahead])
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
    assert!(Id(last_on_a as u64).decode(layout).unwrap().unix_ms >= now + 900);

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

/// Advisory-lock key of the gate the id-drawing statement waits at.
const GATE: i64 = 0x5346_6761_7465;

/// Polls (bounded) until `cond` holds on `c`'s server.
async fn wait_until(c: &Client, what: &str, cond: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let yes: bool = c.query_one(cond, &[]).await.unwrap().get(0);
        if yes {
            return;
        }
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`ids_drawn_across_a_move`] saw.
struct Drawn {
    /// The drawing statement's outcome (rows inserted).
    statement: Result<u64, tokio_postgres::Error>,
    /// Ids the statement drew on the source (committed ones).
    on_source: Vec<i64>,
    /// Ids drawn on the destination after the move.
    on_destination: Vec<i64>,
    /// Whether the move was waiting on a lock when the gate opened.
    move_waited: bool,
}

/// Another session runs `INSERT INTO public.prealloc SELECT
/// shard3.next_id() FROM generate_series(1, 2000)` on the source: it touches
/// no shard table, only the shard's sequence. At row `gate_at` it waits for
/// an advisory lock the test holds (so it has drawn `gate_at - 1` ids), and
/// shard 3 is moved meanwhile; the gate opens once the move has finished or
/// is waiting on a lock. Then 3000 ids are drawn on the destination.
async fn ids_drawn_across_a_move(name: &str, gate_at: i32) -> Drawn {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new(name, &topology(&a, &b));
    let topo = Topology::load(&file.0).unwrap();
    pg::apply(&topo).await.unwrap();
    let ca = client(&a).await;
    ca.batch_execute("CREATE TABLE public.prealloc (id bigint NOT NULL)")
        .await
        .unwrap();
    // The sequence is 0.9 s ahead of the clock (a burst borrowed ticks; the
    // most next_id allows is sql::AHEAD_MS), so the draws take the fast path:
    // consecutive values on each side.
    let layout = topo.layout();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let ahead = ((now + 900 - layout.epoch_ms()) as i64) << layout.sequence().bits();
    ca.execute("SELECT setval('shard3.id_seq', $1)", &[&ahead])
        .await
        .unwrap();

    let gate = client(&a).await;
    gate.execute("SELECT pg_advisory_lock($1)", &[&GATE])
        .await
        .unwrap();
    let drawer = client(&a).await;
    let statement = tokio::spawn(async move {
        drawer
            .execute(
                "INSERT INTO public.prealloc SELECT shard3.next_id() FROM generate_series(1, 2000) g \
                 WHERE g <> $1 OR (SELECT g > 0 FROM pg_advisory_lock($2))",
                &[&gate_at, &GATE],
            )
            .await
    });
    wait_until(
        &ca,
        "the statement waits at the gate",
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                         WHERE query LIKE 'INSERT INTO public.prealloc%' AND wait_event = 'advisory')",
    )
    .await;

    let path = file.0.clone();
    let mover = tokio::spawn(async move {
        let opts = MoveOptions {
            keep_source: true,
            ..Default::default()
        };
        move_shard(&path, 3, "b", &opts).await
    });
    // The move either finishes or waits on a lock (the statement's).
    let deadline = Instant::now() + Duration::from_secs(60);
    let move_waited = loop {
        let blocked: bool = ca
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                 WHERE application_name = 'shardflake' AND wait_event_type = 'Lock'
                                   AND query NOT LIKE 'INSERT INTO public.prealloc%')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if blocked || mover.is_finished() {
            break blocked;
        }
        assert!(
            Instant::now() < deadline,
            "the move neither finished nor blocked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    gate.execute("SELECT pg_advisory_unlock($1)", &[&GATE])
        .await
        .unwrap();
    let statement = statement.await.unwrap();
    mover.await.unwrap().unwrap();
    assert_eq!(
        Topology::load(&file.0).unwrap().server_of(3).unwrap().name,
        "b"
    );

    let on_source: Vec<i64> = ca
        .query("SELECT id FROM public.prealloc", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let cb = client(&b).await;
    let on_destination: Vec<i64> = cb
        .query("SELECT shard3.next_id() FROM generate_series(1, 3000)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    Drawn {
        statement,
        on_source,
        on_destination,
        move_waited,
    }
}

/// Ids handed out on both sides.
fn twice(d: &Drawn) -> Vec<i64> {
    let source: std::collections::HashSet<i64> = d.on_source.iter().copied().collect();
    let mut both: Vec<i64> = d
        .on_destination
        .iter()
        .copied()
        .filter(|id| source.contains(id))
        .collect();
    both.sort_unstable();
    both
}

/// Fails with the ids handed out on both the source and the destination.
fn assert_no_id_twice(d: &Drawn) {
    let dup = twice(d);
    assert!(
        dup.is_empty(),
        "{} ids handed out twice (on the source and on the destination), e.g. {:?}",
        dup.len(),
        &dup[..dup.len().min(3)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_waits_for_a_statement_already_drawing_ids_without_touching_shard_tables() {
    // The statement has drawn 999 ids when the move starts; it draws the rest
    // after the move began (and, before the fix, after the fence committed).
    let d = ids_drawn_across_a_move("move-drawing", 1000).await;
    assert_no_id_twice(&d);
    // It was not disturbed: the move waited for it.
    assert!(d.move_waited, "the move did not wait for the statement");
    assert_eq!(d.statement.unwrap(), 2000);
    assert_eq!(d.on_source.len(), 2000);
    assert_eq!(d.on_destination.len(), 3000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_planned_before_the_fence_draws_nothing_from_the_old_copy() {
    // The statement was planned (old next_id inlined) before the move, but
    // draws its first id only after the move.
    let d = ids_drawn_across_a_move("move-planned", 1).await;
    assert_no_id_twice(&d);
    // Its first draw on the fenced old copy fails.
    let e = d.statement.unwrap_err();
    assert_eq!(
        e.code().map(|c| c.code()),
        Some("2200H"),
        "{}",
        shardflake_db::pg_message(&e)
    );
    assert!(d.on_source.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_sql_keeps_any_server_name_inside_the_message() {
    // Topologies refuse such names; the generated SQL must not depend on it.
    let a = PgServer::start().unwrap();
    let ca = client(&a).await;
    // Unchecked bodies (as in a restore session): a name that ends the
    // dollar quote would run the rest as SQL instead of a syntax error.
    ca.batch_execute("CREATE SCHEMA shard3; SET check_function_bodies = off")
        .await
        .unwrap();
    let to = "b$f$; CREATE TABLE public.pwned (); SELECT $f$ '\"; --";
    let fence = shardflake_db::pg::move_shard::fence_sql("shard3", &[], 3, to);
    ca.batch_execute(&fence)
        .await
        .unwrap_or_else(|e| panic!("{}\n{fence}", shardflake_db::pg_message(&e)));
    let pwned: bool = ca
        .query_one("SELECT to_regclass('public.pwned') IS NOT NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(!pwned, "the server name ran as SQL:\n{fence}");
    let e = ca
        .query_one("SELECT shard3.next_id('pg_class'::regclass)", &[])
        .await
        .unwrap_err();
    assert!(shardflake_db::is_moved(&e), "{e}");
    let message = e.as_db_error().unwrap().message().to_string();
    assert!(
        message.ends_with(&format!("to server {to}; reload the topology")),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_between_the_pause_and_a_transaction_drawing_then_writing_is_retried() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-deadlock", &topology(&a, &b));
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let ca = client(&a).await;
    // T takes an id first (holding shard3.id_seq), then writes a shard table.
    let mut ct = client(&a).await;
    let t = ct.transaction().await.unwrap();
    let id: i64 = t
        .query_one("SELECT shard3.next_id()", &[])
        .await
        .unwrap()
        .get(0);
    let path = file.0.clone();
    let mover = tokio::spawn(async move { move_shard(&path, 3, "b", &Default::default()).await });
    // The pause holds the tables and waits for T's sequence lock; T's write
    // now waits for the tables: PostgreSQL aborts one of the two.
    wait_for_blocked(&ca, "ALTER SEQUENCE").await;
    let write = t
        .execute(
            "INSERT INTO shard3.posts (id, user_id, body) VALUES ($1, 1, 'prealloc')",
            &[&id],
        )
        .await;
    match write {
        Ok(_) => t.commit().await.unwrap(),
        Err(e) => {
            assert_eq!(e.code().map(|c| c.code()), Some("40P01"), "{e}");
            t.rollback().await.unwrap();
        }
    }
    // Either way the move completes (the pause starts again if it was the
    // victim), with T's row if T committed.
    mover.await.unwrap().unwrap();
    let cb = client(&b).await;
    let n: i64 = cb
        .query_one("SELECT count(*) FROM shard3.posts", &[])
        .await
        .unwrap()
        .get(0);
    assert!(n <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_failing_after_going_live_is_finished_by_running_it_again() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-unfence", &topology(&a, &b));
    let topo = Topology::load(&file.0).unwrap();
    pg::apply(&topo).await.unwrap();
    let ca = client(&a).await;
    let before: i64 = ca
        .query_one("SELECT shard3.next_id()", &[])
        .await
        .unwrap()
        .get(0);
    // The topology cannot be written (a directory where its temp file goes):
    // the move fails after the destination went live.
    let tmp = file.0.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::create_dir(&tmp).unwrap();
    let e = move_shard(&file.0, 3, "b", &Default::default())
        .await
        .unwrap_err();
    assert!(matches!(e, shardflake_db::Error::Io { .. }), "{e}");
    std::fs::remove_dir(&tmp).unwrap();
    assert_eq!(
        Topology::load(&file.0).unwrap().server_of(3).unwrap().name,
        "a"
    );
    // The servers know better than the stale file: check says how to finish,
    // apply refuses.
    let drift = pg::check(&topo).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.problem.contains("move-shard 3 --to b")),
        "{drift:?}"
    );
    pg::apply(&topo).await.unwrap_err();
    let report = move_shard(&file.0, 3, "b", &Default::default())
        .await
        .unwrap();
    assert_eq!(
        report.resumed_after,
        Some(shardflake_db::pg::move_shard::MoveStep::Live)
    );
    let topo = Topology::load(&file.0).unwrap();
    assert_eq!(topo.server_of(3).unwrap().name, "b");
    let after: i64 = client(&b)
        .await
        .query_one("SELECT shard3.next_id()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(after > before, "{after} <= {before}");
    let max = sql::sequence_max(topo.layout(), topo.sign_bit());
    let odd: i64 = client(&b)
        .await
        .query_one(
            "SELECT count(*) FROM pg_sequences WHERE schemaname = 'shard3' \
             AND (min_value <> 1 OR max_value <> $1)",
            &[&max],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(odd, 0);
    assert!(pg::check(&topo).await.unwrap().is_empty());
}

/// Issue #30: `move-shard` edits the topology file in place: the user's
/// comments and layout stay, only the two servers' shard lists and the
/// file's generation (issue 37) change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_keeps_the_topology_files_comments() {
    let a = PgServer::start().unwrap();
    let b = PgServer::start().unwrap();
    let text = topology(&a, &b)
        .replacen(
            "layout = ",
            "# our deployment: do not change the layout\nlayout = ",
            1,
        )
        .replacen("shards = \"0-3\"", "shards = \"0-3\"  # the old machine", 1);
    let file = TopoFile::new("move-comments", &text);
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    move_shard(&file.0, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    let after = std::fs::read_to_string(&file.0).unwrap();
    let want = text
        .replacen("shards = 8\n", "shards = 8\ngeneration = 1\n", 1)
        .replacen("shards = \"0-3\"  #", "shards = \"0-2\"  #", 1)
        .replacen("shards = \"4-7\"", "shards = \"3-7\"", 1);
    assert_eq!(after, want);
}

fn stop_after(step: MoveStep) -> MoveOptions {
    MoveOptions {
        stop_after: Some(step),
        ..Default::default()
    }
}

/// `n` rows into shard 3; their ids.
async fn insert3(c: &Client, n: i64) -> Vec<i64> {
    c.query(
        "INSERT INTO shard3.posts (user_id) SELECT g FROM generate_series(1, $1::bigint) g RETURNING id",
        &[&n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The SQLSTATE and message of a statement's refusal.
async fn refusal(c: &Client, sql: &str) -> (String, String) {
    let e = c.batch_execute(sql).await.expect_err(sql);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    (db.code().code().to_string(), db.message().to_string())
}

/// A row written to the destination's copy while the move is under way is
/// no row of the shard (the source serves it): the copy refuses every
/// write and id with SF001, as a moved-away copy does, until it goes live.
/// (An outside review wrote 9 acknowledged ids there; the move then failed
/// its verification and dropped them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incoming_copy_refuses_writes_and_ids_until_the_move_makes_it_live() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-incoming", &topology(&a, &b));
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    let mut ids = insert3(&ca, 100).await;
    for step in [MoveStep::Copied, MoveStep::Fenced] {
        move_shard(&file.0, 3, "b", &stop_after(step))
            .await
            .unwrap_err();
        for sql in [
            "INSERT INTO shard3.posts (user_id) VALUES (1) RETURNING id",
            "INSERT INTO shard3.posts (id, user_id) VALUES (42, 1)",
            "SELECT shard3.next_id()",
            "UPDATE shard3.posts SET body = 'x'",
            "DELETE FROM shard3.posts",
            "TRUNCATE shard3.posts",
            "SET session_replication_role = replica; INSERT INTO shard3.posts (id, user_id) VALUES (42, 1)",
        ] {
            let (code, message) = refusal(&cb, sql).await;
            assert_eq!(code, "SF001", "after {step:?}: {sql}: {message}");
            assert!(
                message.contains("not live here yet: write to a"),
                "{message}"
            );
        }
        cb.batch_execute("RESET session_replication_role")
            .await
            .unwrap();
        if step == MoveStep::Copied {
            ids.extend(insert3(&ca, 10).await);
        }
    }
    let report = move_shard(&file.0, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(report.resumed_after, Some(MoveStep::Fenced));
    ids.extend(insert3(&cb, 10).await);
    let mut stored: Vec<i64> = rows(&cb).await.iter().map(|r| r.0).collect();
    stored.sort_unstable();
    ids.sort_unstable();
    assert_eq!(stored, ids);
    let topo = Topology::load(&file.0).unwrap();
    assert!(pg::check(&topo).await.unwrap().is_empty());
}

/// Rows in the destination's copy that the move did not copy there (its
/// fence disabled, or a copy made before the fence) are never dropped nor
/// overwritten: a rerun and `--abort` refuse, naming them, before and
/// after the source's fence, until they are dealt with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_never_drops_rows_written_to_its_copy_directly() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-kept", &topology(&a, &b));
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    insert3(&ca, 100).await;
    // The fence dropped by hand, as a copy made before it had none.
    let bypass =
        |sql: &str| format!("DROP TRIGGER IF EXISTS shardflake_moved ON shard3.posts; {sql}");
    for (step, id) in [(MoveStep::Copied, 42_i64), (MoveStep::Fenced, 43)] {
        move_shard(&file.0, 3, "b", &stop_after(step))
            .await
            .unwrap_err();
        cb.batch_execute(&bypass(&format!(
            "INSERT INTO shard3.posts (id, user_id) VALUES ({id}, 7)"
        )))
        .await
        .unwrap();
        let aborted = abort_move(&file.0, 3).await.unwrap_err().to_string();
        let rerun = move_shard(&file.0, 3, "b", &MoveOptions::default())
            .await
            .unwrap_err()
            .to_string();
        for e in [&aborted, &rerun] {
            assert!(
                e.contains(&format!("1 rows of shard3.posts (ids {id})")),
                "after {step:?}: {e}"
            );
            assert!(e.contains("move-shard 3 --to b"), "{e}");
        }
        let kept: i64 = cb
            .query_one("SELECT count(*) FROM shard3.posts WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            kept, 1,
            "after {step:?}: the row written to the copy was dropped"
        );
        cb.batch_execute(&bypass(&format!(
            "DELETE FROM shard3.posts WHERE id = {id}"
        )))
        .await
        .unwrap();
        if step == MoveStep::Copied {
            assert_eq!(abort_move(&file.0, 3).await.unwrap(), "a");
        }
    }
    move_shard(&file.0, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(rows(&cb).await.len(), 100);
}

/// A copy that needs `pg repair` (here its server restarted: `next_id`
/// refuses with SF005; a promoted standby the same) is not moved: the move
/// would carry its sequence on without repair's margin and lift the
/// refusal. The refusal names `pg repair`; after it the move goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_from_a_copy_that_needs_repair_is_refused_naming_pg_repair() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("move-repair", &topology(&a, &b));
    let topo = Topology::load(&file.0).unwrap();
    pg::apply(&topo).await.unwrap();
    insert3(&client(&a).await, 10).await;
    a.restart().unwrap();
    let e = move_shard(&file.0, 3, "b", &MoveOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("shardflake pg repair"), "{e}");
    assert_eq!(
        Topology::load(&file.0).unwrap().server_of(3).unwrap().name,
        "a"
    );
    let on_b: i64 = client(&b)
        .await
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname = 'shard3'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_b, 0, "the move copied a shard that needs repair");
    pg::repair(&topo, None).await.unwrap();
    move_shard(&file.0, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
}
