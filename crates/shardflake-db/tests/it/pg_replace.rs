//! `pg repair --replaces a --old-url URL` where URL does not reach the
//! copy that makes a's ids (the second outside review of issue 37): a
//! physical clone of a (a standby, promoted or not, or a base backup
//! started as a primary) has a's identity and records, but not its run;
//! and a lock held on a's tables (a prepared transaction) must refuse the
//! repair, not hang it.

use std::path::PathBuf;
use std::time::Duration;

use shardflake_db::pg::move_shard::{MoveOptions, MoveStep, move_shard};
use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

use crate::pg_deployment_lock::TopoFile;
use crate::pg_failover::Standby;
use crate::pg_identity::{connect, dump_into, insert, topology, try_insert};

fn replacing(old: &str) -> Vec<pg::Replacement> {
    vec![pg::Replacement {
        server: "a".to_string(),
        old: pg::OldCopy::Url(old.to_string()),
    }]
}

async fn code(c: &Client, schema: &str) -> Option<String> {
    try_insert(c, schema, 1)
        .await
        .err()
        .and_then(|e| e.as_db_error().map(|d| d.code().code().to_string()))
}

/// E2c, E2d, E5: `--old-url` reaching a standby of a is refused as
/// read-only, nothing changed (before: "cannot execute CREATE SCHEMA in
/// a read-only transaction"); promoted, or a base backup of a started as
/// a primary, it has a's identity and records and was taken as the old
/// copy: fenced while the real a kept making ids, which c made again (21
/// of 347, 42 of 272 in the review). Now such a copy is fenced (it made
/// no id) and c is not made live until the url reaches the copy whose
/// ids are vouched for its run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_physical_clone_of_the_old_copy_is_not_taken_for_it() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let original =
        Topology::parse(&topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    pg::apply(&original).await.unwrap();
    let ca = connect(&a.url()).await;
    let mut made = insert(&ca, "shard0", 100).await;
    dump_into(&a, &c);
    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();

    let standby = Standby::start_copy(&a, "standby", "+0", true);
    let e = pg::repair_replacing(&onto_c, None, &replacing(&standby.url()))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a standby in recovery (read-only)") && e.contains("nothing was changed"),
        "{e}"
    );

    standby.promote();
    let e = pg::repair_replacing(&onto_c, None, &replacing(&standby.url()))
        .await
        .expect_err("a promoted standby of a taken as the copy that makes a's ids")
        .to_string();
    assert!(
        e.contains("not vouched for its current run")
            && e.contains("was not reached")
            && e.contains("--old-copy-gone"),
        "{e}"
    );
    // The clone is fenced; the real a still makes ids, and c makes none.
    let cs = connect(&standby.url()).await;
    assert_eq!(code(&cs, "shard0").await.as_deref(), Some("SF001"));
    made.extend(insert(&ca, "shard0", 100).await);
    let cc = connect(&c.url()).await;
    assert!(code(&cc, "shard0").await.is_some(), "c made an id");
    // Again: it cannot be told any more, and is still not taken.
    let e = pg::repair_replacing(&onto_c, None, &replacing(&standby.url()))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("already fenced"), "{e}");

    let started = Standby::start_copy(&a, "primary", "+0", false);
    let e = pg::repair_replacing(&onto_c, None, &replacing(&started.url()))
        .await
        .expect_err("a base backup of a started on its own taken as the copy that makes a's ids")
        .to_string();
    assert!(e.contains("not vouched for its current run"), "{e}");
    made.extend(insert(&ca, "shard0", 100).await);

    // The real a: fenced, and c's ids come after all of its.
    pg::repair_replacing(&onto_c, None, &replacing(&a.url()))
        .await
        .unwrap();
    assert_eq!(code(&ca, "shard0").await.as_deref(), Some("SF001"));
    let on_c = insert(&cc, "shard0", 100).await;
    assert!(on_c.iter().min() > made.iter().max());
}

/// E10: a prepared transaction holding a row of a's shard0.posts made
/// `--replaces a --old-url` wait forever, and killing it left its
/// EXCLUSIVE lock request queued on a, blocking every insert there. Now
/// the wait is bounded: refused naming the prepared transaction, nothing
/// left queued, and the repair goes through once it is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_on_the_old_copy_refuses_the_replacement_naming_it() {
    let a = PgServer::start_with(&[("max_prepared_transactions", "5")]).unwrap();
    let (b, c) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let original =
        Topology::parse(&topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    pg::apply(&original).await.unwrap();
    let ca = connect(&a.url()).await;
    let made = insert(&ca, "shard0", 100).await;
    dump_into(&a, &c);
    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    // Messages: the old copy is labelled so, with the server's own words.
    let as_role = |role: &str| a.url().replace("postgres@", &format!("{role}@"));
    let e = pg::repair_replacing(&onto_c, None, &replacing(&as_role("nobody")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"a (old copy)\"") && e.contains("role \"nobody\" does not exist"),
        "{e}"
    );
    ca.batch_execute("CREATE ROLE reader LOGIN").await.unwrap();
    let e = pg::repair_replacing(&onto_c, None, &replacing(&as_role("reader")))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("server \"a (old copy)\"") && e.contains("permission denied"),
        "{e}"
    );
    connect(&a.url())
        .await
        .batch_execute(
            "BEGIN; INSERT INTO shard0.posts (user_id) VALUES (1); PREPARE TRANSACTION 'held'",
        )
        .await
        .unwrap();
    let e = tokio::time::timeout(
        Duration::from_secs(60),
        pg::repair_replacing(&onto_c, None, &replacing(&a.url())),
    )
    .await
    .expect("the repair waits on the prepared transaction for 60 s")
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("prepared transaction 'held'") && e.contains("COMMIT PREPARED"),
        "{e}"
    );
    let queued: i64 = ca
        .query_one("SELECT count(*) FROM pg_locks WHERE NOT granted", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(queued, 0, "a lock request left queued on a");
    tokio::time::timeout(Duration::from_secs(30), insert(&ca, "shard0", 10))
        .await
        .expect("an insert on a waits behind the refused repair");
    ca.batch_execute("COMMIT PREPARED 'held'").await.unwrap();
    pg::repair_replacing(&onto_c, None, &replacing(&a.url()))
        .await
        .unwrap();
    let on_c = insert(&connect(&c.url()).await, "shard0", 100).await;
    assert!(on_c.iter().min() > made.iter().max());
}

fn gone(systems: &[i64]) -> Vec<pg::Replacement> {
    vec![pg::Replacement {
        server: "a".to_string(),
        old: pg::OldCopy::Gone(systems.to_vec()),
    }]
}

async fn system_identifier(url: &str) -> i64 {
    connect(url)
        .await
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .await
        .unwrap()
        .get(0)
}

/// E8: a lost for good, its dump restored twice, into c and d, by two
/// operators, each running `--replaces a --old-copy-gone`: both were
/// accepted, and c and d made the same ids. The records of b say c
/// replaced a; `--old-copy-gone` now names the system identifier of
/// each database it declares gone, and the refusal says what each is:
/// the second operator cannot declare the live c gone by accident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_copy_gone_names_each_database_it_declares_gone() {
    let (a, b, c, d) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let original =
        Topology::parse(&topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    pg::apply(&original).await.unwrap();
    let made = insert(&connect(&a.url()).await, "shard0", 100).await;
    dump_into(&a, &c);
    dump_into(&a, &d);
    let (a_sys, c_sys) = (
        system_identifier(&a.url()).await,
        system_identifier(&c.url()).await,
    );
    a.stop();
    let onto = |s: &PgServer| {
        Topology::parse(&topology(&[("a", &s.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap()
    };
    let e = pg::repair_replacing(&onto(&c), None, &gone(&[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("{a_sys} (database oid"))
            && e.contains("the database a's new one was restored from")
            && e.contains(&format!("--old-copy-gone {a_sys})")),
        "{e}"
    );
    let e = pg::repair_replacing(&onto(&c), None, &gone(&[a_sys, 42]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("names system identifier 42, which no server"),
        "{e}"
    );
    pg::repair_replacing(&onto(&c), None, &gone(&[a_sys]))
        .await
        .unwrap();
    let on_c = insert(&connect(&c.url()).await, "shard0", 100).await;
    assert!(on_c.iter().min() > made.iter().max());

    let e = pg::repair_replacing(&onto(&d), None, &gone(&[a_sys]))
        .await
        .expect_err("d declared a gone while c, which replaced a, is live")
        .to_string();
    assert!(
        e.contains(&format!(
            "{c_sys} (database oid 5), a database that replaced it since"
        )) && e.contains("may be live"),
        "{e}"
    );
    // Told explicitly, once c is stopped for good too.
    c.stop();
    pg::repair_replacing(&onto(&d), None, &gone(&[a_sys, c_sys]))
        .await
        .unwrap();
    let on_d = insert(&connect(&d.url()).await, "shard0", 100).await;
    assert!(on_d.iter().min() > made.iter().max());
}

/// E1, E16: inserts acknowledged on a after its dump, and a shard that
/// moved onto a after it (the dump holds none of it), are only on the
/// fenced a once c replaces it; the repair said nothing of them. Now it
/// reports each table's rows the new copy lacks, and a shard it lacks
/// entirely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_only_on_the_fenced_old_copy_are_reported() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let dir = std::env::temp_dir().join(format!("sf-left-behind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    std::fs::write(
        &path,
        topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    )
    .unwrap();
    pg::apply(&Topology::load(&path).unwrap()).await.unwrap();
    let ca = connect(&a.url()).await;
    insert(&ca, "shard0", 50).await;
    dump_into(&a, &c);
    let after_dump = insert(&ca, "shard0", 30).await;
    pg::move_shard::move_shard(&path, 4, "a", &Default::default())
        .await
        .unwrap();
    let moved = insert(&ca, "shard4", 20).await;
    // The file the move wrote (its generation), a's url pointed at c.
    let moved_file = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let onto_c = Topology::parse(&moved_file.replace(&a.url(), &c.url())).unwrap();
    let replaced = pg::repair_replacing(&onto_c, None, &replacing(&a.url()))
        .await
        .unwrap();
    let left: Vec<_> = replaced
        .left_behind
        .iter()
        .map(|l| (l.shard, l.table.as_str(), l.rows, l.ids, l.shard_missing))
        .collect();
    let span = |ids: &[i64]| (*ids.iter().min().unwrap(), *ids.iter().max().unwrap());
    assert_eq!(
        left,
        vec![
            (0, "shard0.posts", 30, span(&after_dump), false),
            (4, "shard4.posts", 20, span(&moved), true),
        ],
        "{:#?}",
        replaced.left_behind
    );
    let said = replaced.left_behind[1].to_string();
    assert!(
        said.contains("has no shard 4 at all") && said.contains("\\copy shard4.posts FROM"),
        "{said}"
    );
    // check says so, not just "run pg apply" (which recreates the shard
    // empty), until the rows are copied over.
    let drift: Vec<String> = pg::check(&onto_c)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift
            .iter()
            .any(|d| d.contains("shard4.posts is missing here, and its 20 row(s)"))
            && drift
                .iter()
                .any(|d| d.contains("30 of the 30 row(s) of shard0.posts")),
        "{drift:#?}"
    );
    pg::apply(&onto_c).await.unwrap();
    let drift: Vec<String> = pg::check(&onto_c)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift
            .iter()
            .any(|d| d.contains("20 of the 20 row(s) of shard4.posts")),
        "{drift:#?}"
    );
    let cc = connect(&c.url()).await;
    for t in ["shard0.posts", "shard4.posts"] {
        for r in ca
            .query(&format!("SELECT id, user_id FROM {t}"), &[])
            .await
            .unwrap()
        {
            cc.execute(
                &format!("INSERT INTO {t} (id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"),
                &[&r.get::<_, i64>(0), &r.get::<_, i64>(1)],
            )
            .await
            .unwrap();
        }
    }
    assert_eq!(pg::check(&onto_c).await.unwrap(), Vec::new());
}

/// A topology file for `move-shard`, removed on drop.
struct MoveFile(PathBuf);

impl MoveFile {
    fn new(name: &str, text: &str) -> MoveFile {
        let path =
            std::env::temp_dir().join(format!("sf-replace-{name}-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        MoveFile(path)
    }
}

impl Drop for MoveFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn stopped_after_copy() -> MoveOptions {
    MoveOptions {
        stop_after: Some(MoveStep::Copied),
        ..Default::default()
    }
}

/// Every id stored in `schema`'s posts, sorted.
async fn stored(c: &Client, schema: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = c
        .query(&format!("SELECT id FROM {schema}.posts"), &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    ids.sort_unstable();
    ids
}

async fn has_schema(c: &Client, schema: &str) -> bool {
    c.query_one(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
        &[&schema],
    )
    .await
    .unwrap()
    .get(0)
}

/// E12: `move-shard 0 --to b` stopped before its fence (a the source),
/// then a lost and its dump restored into c. `--replaces a` was refused
/// ("a move of shard 0 to b did not finish"), and `move-shard` and
/// `--abort` refused c until the replacement: shard 0 refused every id
/// on c for good. Now the replacement undoes the move: b's copy (never
/// live) holds only what the move copied from a, so its rows c lacks
/// (acknowledged on a after the dump) are copied to c, b's copy is
/// dropped, and shard 0 is live on c alone with every acknowledged row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_from_a_lost_server_is_undone_by_its_replacement() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = MoveFile::new(
        "source-lost",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let ca = connect(&a.url()).await;
    let mut made = insert(&ca, "shard0", 100).await;
    dump_into(&a, &c);
    // Acknowledged on a after the dump: only a and b's copy hold them.
    made.extend(insert(&ca, "shard0", 30).await);
    move_shard(&file.0, 0, "b", &stopped_after_copy())
        .await
        .unwrap_err();
    let system = system_identifier(&a.url()).await;
    drop(ca);
    a.stop();

    let onto_c = topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")]);
    let replaced = pg::repair_replacing(&Topology::parse(&onto_c).unwrap(), None, &gone(&[system]))
        .await
        .expect("the replacement of a lost source refused for its unfinished move");
    assert_eq!(
        replaced.repaired.iter().filter(|r| r.server == "a").count(),
        4
    );
    let (cb, cc) = (connect(&b.url()).await, connect(&c.url()).await);
    assert!(!has_schema(&cb, "shard0").await, "b's copy of shard 0 kept");
    made.sort_unstable();
    assert_eq!(stored(&cc, "shard0").await, made, "acknowledged rows lost");
    let onto_c_topo = Topology::parse(&onto_c).unwrap();
    assert_eq!(pg::check(&onto_c_topo).await.unwrap(), vec![]);
    let on_c = insert(&cc, "shard0", 50).await;
    assert!(on_c.iter().min() > made.iter().max());
    // And the move can be made again, from c.
    std::fs::write(&file.0, &onto_c).unwrap();
    move_shard(&file.0, 0, "b", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(stored(&cb, "shard0").await.len(), 180);
}

/// E13b: `move-shard 4 --to a` stopped before its fence (a the
/// destination), a's dump (holding its copy of shard 4, never live)
/// restored into c, a lost: refused as in E12, `pg apply` too. Now the
/// replacement undoes the move: b served shard 4 throughout and holds
/// every row; c's copy is dropped, b's record made live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_to_a_lost_server_is_undone_by_its_replacement() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = MoveFile::new(
        "destination-lost",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let cb = connect(&b.url()).await;
    let mut made = insert(&cb, "shard4", 100).await;
    move_shard(&file.0, 4, "a", &stopped_after_copy())
        .await
        .unwrap_err();
    dump_into(&a, &c);
    made.extend(insert(&cb, "shard4", 20).await);
    let system = system_identifier(&a.url()).await;
    a.stop();

    let onto_c = topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")]);
    let onto_c_topo = Topology::parse(&onto_c).unwrap();
    let replaced = pg::repair_replacing(&onto_c_topo, None, &gone(&[system]))
        .await
        .expect("the replacement of a lost destination refused for its unfinished move");
    assert_eq!(
        replaced.undone,
        vec![pg::UndoneMove {
            shard: 4,
            source: "b".into(),
            destination: "a".into(),
            copied: vec![],
            unfenced: false,
        }]
    );
    let cc = connect(&c.url()).await;
    assert!(!has_schema(&cc, "shard4").await, "c's copy of shard 4 kept");
    made.extend(insert(&cb, "shard4", 20).await);
    made.sort_unstable();
    assert_eq!(stored(&cb, "shard4").await, made);
    assert_eq!(pg::check(&onto_c_topo).await.unwrap(), vec![]);
    std::fs::write(&file.0, &onto_c).unwrap();
    move_shard(&file.0, 4, "a", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(stored(&cc, "shard4").await, made);
}

/// E12 and E13b past the fence: both moves stopped after they fenced
/// their source, the destination's copy complete but never live, then a
/// dump of a restored into c and a lost. Shard 0 (a the source) is fenced
/// on c with every row; shard 4 (a the destination): b's copy fenced, c's
/// a copy. Both were refused as in E12; now the replacement lifts the
/// source's fence, drops the copy that never went live, and the shard's
/// ids go past every id made before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_past_its_fence_with_a_lost_server_is_undone_by_its_replacement() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = MoveFile::new(
        "past-fence",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let (ca, cb) = (connect(&a.url()).await, connect(&b.url()).await);
    let mut on_0 = insert(&ca, "shard0", 100).await;
    let mut on_4 = insert(&cb, "shard4", 100).await;
    let fenced = MoveOptions {
        stop_after: Some(MoveStep::Fenced),
        ..Default::default()
    };
    move_shard(&file.0, 4, "a", &fenced).await.unwrap_err();
    on_0.extend(insert(&ca, "shard0", 30).await);
    move_shard(&file.0, 0, "b", &fenced).await.unwrap_err();
    dump_into(&a, &c);
    let system = system_identifier(&a.url()).await;
    drop(ca);
    a.stop();

    let onto_c = topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")]);
    let onto_c_topo = Topology::parse(&onto_c).unwrap();
    let replaced = pg::repair_replacing(&onto_c_topo, None, &gone(&[system]))
        .await
        .expect("the replacement refused for a move past its fence");
    let mut undone = replaced.undone.clone();
    undone.sort_by_key(|u| u.shard);
    assert_eq!(
        undone,
        vec![
            pg::UndoneMove {
                shard: 0,
                source: "a".into(),
                destination: "b".into(),
                copied: vec![],
                unfenced: true,
            },
            pg::UndoneMove {
                shard: 4,
                source: "b".into(),
                destination: "a".into(),
                copied: vec![],
                unfenced: true,
            },
        ]
    );
    let cc = connect(&c.url()).await;
    assert!(!has_schema(&cb, "shard0").await && !has_schema(&cc, "shard4").await);
    on_0.sort_unstable();
    on_4.sort_unstable();
    assert_eq!(stored(&cc, "shard0").await, on_0);
    assert_eq!(stored(&cb, "shard4").await, on_4);
    assert_eq!(pg::check(&onto_c_topo).await.unwrap(), vec![]);
    let (new_0, new_4) = (
        insert(&cc, "shard0", 20).await,
        insert(&cb, "shard4", 20).await,
    );
    assert!(new_0.iter().min() > on_0.iter().max());
    assert!(new_4.iter().min() > on_4.iter().max());
}

/// E12 after go-live: the move went live on b but did not switch the
/// file, then a lost and its dump (shard 0 fenced there) restored into c.
/// b makes shard 0's ids: the replacement never undoes that move (b's
/// rows since would be lost); it is refused until the file puts shard 0
/// on b, the switch the move did not write, and then goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_live_on_its_destination_is_finished_by_the_file_not_undone() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = MoveFile::new(
        "went-live",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let ca = connect(&a.url()).await;
    let mut made = insert(&ca, "shard0", 100).await;
    let live = MoveOptions {
        stop_after: Some(MoveStep::Live),
        ..Default::default()
    };
    move_shard(&file.0, 0, "b", &live).await.unwrap_err();
    let cb = connect(&b.url()).await;
    made.extend(insert(&cb, "shard0", 20).await);
    dump_into(&a, &c);
    let system = system_identifier(&a.url()).await;
    drop(ca);
    a.stop();

    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    let e = pg::repair_replacing(&onto_c, None, &gone(&[system]))
        .await
        .expect_err("a move live on b undone")
        .to_string();
    assert!(
        e.contains("went live on b") && e.contains("Put shard 0 in b's list"),
        "{e}"
    );
    assert_eq!(stored(&cb, "shard0").await.len(), 120);
    let switched = Topology::parse(&topology(&[
        ("a", &c.url(), "1-3"),
        ("b", &b.url(), "0,4-7"),
    ]))
    .unwrap();
    pg::repair_replacing(&switched, None, &gone(&[system]))
        .await
        .unwrap();
    made.extend(insert(&cb, "shard0", 20).await);
    made.sort_unstable();
    assert_eq!(stored(&cb, "shard0").await, made);
    // Finished but for the source's fenced copy on c, which check reports
    // (it refuses a later move elsewhere) with the move that drops it.
    let drift: Vec<String> = pg::check(&switched)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift.len() == 1
            && drift[0].starts_with("a: shard 0: a fenced copy of shard 0 is here")
            && drift[0].contains("`shardflake pg move-shard 0 --to b` finishes that move"),
        "{drift:#?}"
    );
    std::fs::write(&file.0, switched.to_toml()).unwrap();
    move_shard(&file.0, 0, "b", &MoveOptions::default())
        .await
        .unwrap();
    assert!(!has_schema(&connect(&c.url()).await, "shard0").await);
    assert_eq!(
        pg::check(&Topology::load(&file.0).unwrap()).await.unwrap(),
        vec![]
    );
}

/// Outside review R7, item 2: rows acknowledged on a after its dump stay
/// only on the old copy that `--replaces a` fenced, recorded on c (now a
/// in the file); then shard 0 moves from c to b. The record went nowhere:
/// check kept saying on a "shard0.posts is missing here ... run pg
/// apply", which changes nothing, and never said it on b. The record now
/// goes with the shard, and check names the way out on b: the `\copy`
/// commands, then the `DELETE` that drops the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_left_on_the_old_copy_are_reported_where_the_shard_moved() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = TopoFile::new(
        "left-moved",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&file.load()).await.unwrap();
    let ca = connect(&a.url()).await;
    insert(&ca, "shard0", 50).await;
    dump_into(&a, &c);
    let after_dump = insert(&ca, "shard0", 30).await;
    let text = std::fs::read_to_string(&file.0).unwrap();
    std::fs::write(&file.0, text.replace(&a.url(), &c.url())).unwrap();
    let replaced = pg::repair_replacing(&file.load(), None, &replacing(&a.url()))
        .await
        .unwrap();
    assert_eq!(replaced.left_behind.len(), 1, "{:#?}", replaced.left_behind);
    move_shard(&file.0, 0, "b", &MoveOptions::default())
        .await
        .unwrap();

    let topo = file.load();
    let drift = |d: Vec<pg::Drift>| -> Vec<String> { d.iter().map(ToString::to_string).collect() };
    let found = drift(pg::check(&topo).await.unwrap());
    let about: Vec<&String> = found
        .iter()
        .filter(|d| d.contains("shard0.posts"))
        .collect();
    let (min, max) = (
        after_dump.iter().min().unwrap(),
        after_dump.iter().max().unwrap(),
    );
    assert!(
        about.len() == 1
            && about[0].starts_with(&format!(
                "b: shard 0: 30 of the 30 row(s) of shard0.posts with ids {min}..{max} are only on the old copy that `shardflake pg repair --replaces a` fenced"
            ))
            && about[0].contains("then on b `\\copy shard0.posts FROM 'rows.csv' CSV`")
            && about[0].contains(
                "then `DELETE FROM shardflake.left_behind WHERE shard = 0 AND tbl = 'shard0.posts'` here"
            ),
        "{found:#?}"
    );

    // The way out it names: the rows copied to b, then the record dropped.
    let cb = connect(&b.url()).await;
    for r in ca
        .query(
            &format!("SELECT id, user_id FROM shard0.posts WHERE id BETWEEN {min} AND {max}"),
            &[],
        )
        .await
        .unwrap()
    {
        cb.execute(
            "INSERT INTO shard0.posts (id, user_id) VALUES ($1, $2)",
            &[&r.get::<_, i64>(0), &r.get::<_, i64>(1)],
        )
        .await
        .unwrap();
    }
    let found = drift(pg::check(&topo).await.unwrap());
    assert!(found.is_empty(), "{found:#?}");
    cb.batch_execute("DELETE FROM shardflake.left_behind WHERE shard = 0 AND tbl = 'shard0.posts'")
        .await
        .unwrap();
    let found = drift(pg::check(&topo).await.unwrap());
    assert!(found.is_empty(), "{found:#?}");
}

/// Every event's message logged while it is the thread's default.
struct Logged(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl tracing::Subscriber for Logged {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0.lock().unwrap().push(message.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Outside review R7, item 4: shard 4's move from b to a stopped after
/// its copy (undone by a replacement of a) and shard 0's move from a to b
/// live on b, file not switched (refused), then a's dump restored into c.
/// The refused repair rolled back the undo, yet logged "undid a move".
/// Now only what was committed is logged. (One thread: the logger is
/// that thread's.)
#[tokio::test]
async fn a_refused_replacement_logs_no_move_it_did_not_undo() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = MoveFile::new(
        "refused-log",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let (ca, cb) = (connect(&a.url()).await, connect(&b.url()).await);
    insert(&ca, "shard0", 10).await;
    insert(&cb, "shard4", 10).await;
    move_shard(&file.0, 4, "a", &stopped_after_copy())
        .await
        .unwrap_err();
    let live = MoveOptions {
        stop_after: Some(MoveStep::Live),
        ..Default::default()
    };
    move_shard(&file.0, 0, "b", &live).await.unwrap_err();
    dump_into(&a, &c);
    let system = system_identifier(&a.url()).await;
    drop(ca);
    a.stop();

    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let _logger = tracing::subscriber::set_default(Logged(logs.clone()));
    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    let e = pg::repair_replacing(&onto_c, None, &gone(&[system]))
        .await
        .expect_err("a move live on b undone")
        .to_string();
    assert!(e.contains("went live on b"), "{e}");
    let undid = |logs: &[String]| logs.iter().any(|l| l.contains("undid a move"));
    assert!(!undid(&logs.lock().unwrap()), "{:#?}", logs.lock().unwrap());
    // Nothing was undone: b still records shard 4 moving to a.
    let moving: String = cb
        .query_one("SELECT state FROM shardflake.shards WHERE shard = 4", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(moving, "moving");

    // The file switched for shard 0, the repair undoes shard 4's move,
    // and says so.
    let switched = Topology::parse(&topology(&[
        ("a", &c.url(), "1-3"),
        ("b", &b.url(), "0,4-7"),
    ]))
    .unwrap();
    let replaced = pg::repair_replacing(&switched, None, &gone(&[system]))
        .await
        .unwrap();
    assert_eq!(
        replaced.undone.iter().map(|u| u.shard).collect::<Vec<_>>(),
        vec![4]
    );
    assert!(undid(&logs.lock().unwrap()), "{:#?}", logs.lock().unwrap());
}

/// Outside review R7, item 7: the undo of a move whose source is replaced,
/// the old copy reached with `--old-url` (still running, so fenced by the
/// same repair) rather than declared gone. `move-shard 0 --to b` stopped
/// after its copy, 30 rows acknowledged on a after its dump (on a and b's
/// copy), then 20 more on a alone after the copy. The repair undoes the
/// move (b's 30 copied to c, b's copy dropped), fences a, and reports
/// the 20 rows only a holds; check names them until they are on c.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_from_a_replaced_server_reached_by_old_url_is_undone() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = MoveFile::new(
        "source-old-url",
        &topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let ca = connect(&a.url()).await;
    let mut made = insert(&ca, "shard0", 100).await;
    dump_into(&a, &c);
    made.extend(insert(&ca, "shard0", 30).await);
    move_shard(&file.0, 0, "b", &stopped_after_copy())
        .await
        .unwrap_err();
    let only_on_a = insert(&ca, "shard0", 20).await;

    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    let replaced = pg::repair_replacing(&onto_c, None, &replacing(&a.url()))
        .await
        .expect("the replacement refused for its unfinished move");
    assert_eq!(
        replaced.undone,
        vec![pg::UndoneMove {
            shard: 0,
            source: "a".into(),
            destination: "b".into(),
            copied: vec![("shard0.posts".into(), 30)],
            unfenced: false,
        }]
    );
    let left: Vec<_> = replaced
        .left_behind
        .iter()
        .map(|l| (l.shard, l.rows, l.ids))
        .collect();
    let span = (
        *only_on_a.iter().min().unwrap(),
        *only_on_a.iter().max().unwrap(),
    );
    assert_eq!(left, vec![(0, 20, span)], "{:#?}", replaced.left_behind);
    let e = try_insert(&ca, "shard0", 1)
        .await
        .expect_err("the old copy still makes ids");
    assert!(shardflake_db::is_moved(&e), "{e}");
    // Item 6: the old copy's own records say fenced, not live (or moving).
    let states: Vec<(i64, String)> = ca
        .query("SELECT shard, state FROM shardflake.shards ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        states,
        (0..4)
            .map(|s| (s, "fenced".to_string()))
            .collect::<Vec<_>>()
    );

    let (cb, cc) = (connect(&b.url()).await, connect(&c.url()).await);
    assert!(!has_schema(&cb, "shard0").await, "b's copy of shard 0 kept");
    made.sort_unstable();
    assert_eq!(stored(&cc, "shard0").await, made, "acknowledged rows lost");
    let drift: Vec<String> = pg::check(&onto_c)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift.len() == 1 && drift[0].contains("20 of the 20 row(s) of shard0.posts"),
        "{drift:#?}"
    );
    let on_c = insert(&cc, "shard0", 10).await;
    assert!(on_c.iter().min() > only_on_a.iter().max());
}
