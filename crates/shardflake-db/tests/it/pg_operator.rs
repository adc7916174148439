//! What operators do to a PostgreSQL deployment (issue #28): edit the
//! topology file, re-run `apply` from an old copy, change the prefix, the
//! epoch or the shard count, restore a dump. Each must be refused, or leave
//! the ids unique; none may make two calls return one id.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;

use shardflake_db::pg::move_shard::{MoveOptions, MoveStep, abort_move, move_shard};
use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const POSTS: &str = "[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL, body text)\"\n";

/// A topology: `head` (layout, shards, prefix lines), then the servers.
fn topology(head: &str, servers: &[(&str, &PgServer, &str)]) -> String {
    let mut t = format!("{head}\n");
    for (name, s, list) in servers {
        t.push_str(&format!(
            "[[servers]]\nname = \"{name}\"\nurl = \"{}\"\nshards = \"{list}\"\n",
            s.url()
        ));
    }
    t.push_str(POSTS);
    t
}

const EIGHT: &str = "layout = \"instagram\"\nshards = 8";

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

async fn schemas(c: &Client) -> Vec<String> {
    c.query(
        "SELECT nspname FROM pg_namespace WHERE nspname ~ '^(s|shard)[0-9]+$' ORDER BY 1",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// `n` rows inserted into `schema.posts` in one statement; their ids.
async fn insert(c: &Client, schema: &str, n: i64) -> Result<Vec<i64>, tokio_postgres::Error> {
    Ok(c
        .query(
            &format!(
                "INSERT INTO {schema}.posts (user_id) SELECT g FROM generate_series(1, $1::bigint) g RETURNING id"
            ),
            &[&n],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

fn repeats(a: &[i64], b: &[i64]) -> usize {
    let seen: HashSet<i64> = a.iter().copied().collect();
    b.iter().filter(|id| seen.contains(id)).count()
}

/// A topology file in a fresh temp dir, removed on drop.
struct TopoFile(PathBuf);

impl TopoFile {
    fn new(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sf-op-{name}-{}", std::process::id()));
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

/// Reproduction 1: a shard "moved" by editing the file, and a pre-move file
/// applied after a finished move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_shard_that_lives_on_another_server() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let before = topology(EIGHT, &[("a", &a, "0-3"), ("b", &b, "4-7")]);
    pg::apply(&Topology::parse(&before).unwrap()).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    let on_b = insert(&cb, "shard5", 500).await.unwrap();

    // Shard 5 "moved" to a by editing the file.
    let edited = topology(EIGHT, &[("a", &a, "0-3,5"), ("b", &b, "4,6-7")]);
    let e = pg::apply(&Topology::parse(&edited).unwrap())
        .await
        .expect_err("apply created shard 5 on a while it lives on b");
    let text = e.to_string();
    assert!(text.contains("move-shard 5 --to a"), "{text}");
    assert!(!schemas(&ca).await.contains(&"shard5".to_string()));
    assert!(repeats(&on_b, &insert(&cb, "shard5", 500).await.unwrap()) == 0);

    // A real move of shard 7, then the pre-move file applied again.
    let file = TopoFile::new("stale-after-move", &before);
    move_shard(&file.0, 7, "a", &MoveOptions::default())
        .await
        .unwrap();
    let e = pg::apply(&Topology::parse(&before).unwrap())
        .await
        .expect_err("a pre-move file recreated shard 7 on b");
    assert!(e.to_string().contains("shard 7"), "{e}");
    assert!(!schemas(&cb).await.contains(&"shard7".to_string()));
    // The file move-shard wrote is fine.
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    assert!(
        pg::check(&Topology::load(&file.0).unwrap())
            .await
            .unwrap()
            .is_empty()
    );
}

/// Reproduction 2: a changed `schema_prefix` would make a second set of
/// shards beside the live ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_schema_prefix_is_refused_and_check_sees_every_shard_schema() {
    let a = PgServer::start().unwrap();
    let live = topology(EIGHT, &[("a", &a, "0-7")]);
    pg::apply(&Topology::parse(&live).unwrap()).await.unwrap();
    let other = topology(
        "layout = \"instagram\"\nshards = 8\nschema_prefix = \"s\"",
        &[("a", &a, "0-7")],
    );
    let other = Topology::parse(&other).unwrap();
    let e = pg::apply(&other)
        .await
        .expect_err("apply made s0..s7 beside shard0..shard7");
    assert!(e.to_string().contains("schema_prefix"), "{e}");
    let c = client(&a).await;
    assert_eq!(schemas(&c).await.len(), 8, "{:?}", schemas(&c).await);
    // check with the edited file sees the live shards of the other prefix.
    let drift = pg::check(&other).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.problem.contains("schema_prefix is recorded as \"shard\"")),
        "{drift:?}"
    );
    // A deployment made before the records: its shard schemas are found by
    // their functions, whatever their prefix.
    c.batch_execute("DROP TABLE shardflake.deployment, shardflake.shards")
        .await
        .unwrap();
    let drift = pg::check(&other).await.unwrap();
    assert!(
        drift.iter().any(|d| d.problem.contains("shard5")),
        "{drift:?}"
    );
    pg::apply(&other)
        .await
        .expect_err("apply beside another prefix");
}

/// Reproduction 3: one server refuses after another committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_checks_every_server_before_changing_any() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    pg::apply(&Topology::parse(&topology(EIGHT, &[("a", &a, "0-3"), ("b", &b, "4-7")])).unwrap())
        .await
        .unwrap();
    // The epoch 10 s later, and a new server, listed first, given shard 7.
    let later = "layout = \"instagram2: time 41 | shard 13 | sequence 10 (epoch 1314220031721 ms)\"\nshards = 8";
    let edited = topology(later, &[("c", &c, "7"), ("a", &a, "0-3"), ("b", &b, "4-6")]);
    pg::apply(&Topology::parse(&edited).unwrap())
        .await
        .expect_err("the layout of live shards changed");
    let cc = client(&c).await;
    let anything: i64 = cc
        .query_one(
            "SELECT count(*) FROM pg_namespace WHERE nspname IN ('shard7', 'shardflake')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(anything, 0, "the new server was changed before the refusal");
}

/// Reproduction 4: a stale apply must not lift the fence of a kept source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_apply_never_unfences_a_kept_source() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let before = topology(EIGHT, &[("a", &a, "0-3"), ("b", &b, "4-7")]);
    let file = TopoFile::new("keep-source", &before);
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let cb = client(&b).await;
    insert(&cb, "shard7", 100).await.unwrap();
    move_shard(
        &file.0,
        7,
        "a",
        &MoveOptions {
            keep_source: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let _ = pg::apply(&Topology::parse(&before).unwrap()).await;
    let e = insert(&cb, "shard7", 1)
        .await
        .expect_err("the kept source hands out ids again");
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("SF001"),
        "{e}"
    );
    let e = cb
        .query_one("SELECT shard7.next_id()", &[])
        .await
        .expect_err("the kept source's next_id works again");
    assert!(e.as_db_error().is_some(), "{e}");
}

/// Reproduction 8: the shard count changed under live shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_shard_count_is_refused() {
    let a = PgServer::start().unwrap();
    pg::apply(&Topology::parse(&topology(EIGHT, &[("a", &a, "0-7")])).unwrap())
        .await
        .unwrap();
    let sixteen = Topology::parse(&topology(
        "layout = \"instagram\"\nshards = 16",
        &[("a", &a, "0-15")],
    ))
    .unwrap();
    let e = pg::apply(&sixteen)
        .await
        .expect_err("the shard count changed");
    assert!(e.to_string().contains("shards = 8"), "{e}");
    let c = client(&a).await;
    assert_eq!(schemas(&c).await.len(), 8);
    let drift = pg::check(&sixteen).await.unwrap();
    assert!(
        drift.iter().any(|d| d.to_string().contains("shard count")),
        "{drift:?}"
    );
}

/// Also: ids of a shard come from one sequence, so `shardN.next_id()` and a
/// table's default cannot collide; and `check` sees an unlogged sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shard_never_repeats_an_id_across_its_tables_and_next_id() {
    let a = PgServer::start().unwrap();
    let topo = Topology::parse(&topology(EIGHT, &[("a", &a, "0-7")])).unwrap();
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    let from_table = insert(&c, "shard4", 20_000).await.unwrap();
    let from_next_id: Vec<i64> = c
        .query(
            "SELECT shard4.next_id() FROM generate_series(1, 20000)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let more = insert(&c, "shard4", 20_000).await.unwrap();
    let mut all: Vec<i64> = from_table.clone();
    all.extend(&more);
    assert_eq!(repeats(&all, &from_next_id), 0);

    c.batch_execute("ALTER SEQUENCE shard4.id_seq SET UNLOGGED")
        .await
        .unwrap();
    let drift = pg::check(&topo).await.unwrap();
    assert!(
        drift.iter().any(|d| d.to_string().contains("UNLOGGED")),
        "{drift:?}"
    );
}

/// Reproduction 6: a shard restored from a dump taken while its sequence ran
/// ahead of the clock (a burst borrows ahead) must not hand out again the
/// ids made after the dump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_restored_from_a_dump_repeats_no_id() {
    let a =
        PgServer::start_with(&[("max_connections", "10"), ("max_worker_processes", "4")]).unwrap();
    // 6 sequence bits: 64 ids per ms, so a burst easily runs ahead.
    let head =
        "layout = \"narrow: time 41 | shard 13 | sequence 6 (epoch 1314220021721 ms)\"\nshards = 1";
    let topo = Topology::parse(&topology(head, &[("a", &a, "0")])).unwrap();
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    let mut before = insert(&c, "shard0", 60_000).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sf-op-restore-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("shard0.dump");
    let port = a.port.to_string();
    let conn = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let out = Command::new(a.program("pg_dump").unwrap())
        .args(conn)
        .args(["-Fc", "-n", "shard0", "-f"])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    before.extend(insert(&c, "shard0", 30_000).await.unwrap());
    let out = Command::new(a.program("pg_restore").unwrap())
        .args(conn)
        .args(["--clean", "-d", "postgres"])
        .arg(&dump)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");

    let c = client(&a).await;
    match insert(&c, "shard0", 30_000).await {
        Ok(after) => panic!(
            "a restored shard handed out ids ({} of them repeats)",
            repeats(&before, &after)
        ),
        Err(e) => assert_eq!(
            e.as_db_error().map(|d| d.code().code()),
            Some(shardflake_db::SQLSTATE_RESTORED),
            "{e}"
        ),
    }
    let drift = pg::check(&topo).await.unwrap();
    assert!(
        drift.iter().any(|d| d.problem.contains("pg repair")),
        "{drift:?}"
    );
    let e = pg::apply(&topo)
        .await
        .expect_err("apply over a restored shard");
    assert!(e.to_string().contains("pg repair"), "{e}");
    let repaired = pg::repair(&topo, None).await.unwrap();
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    assert!(pg::check(&topo).await.unwrap().is_empty());
    let after = insert(&c, "shard0", 30_000).await.unwrap();
    assert_eq!(repeats(&before, &after), 0, "ids repeated after a repair");
}

/// Reproduction 5, at every step: a move stopped after any of its steps (as
/// if killed there) is reported by `check`, refused by `apply`, and finished
/// by running it again; rows written between are all there, no id twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_stopped_after_any_step_is_finished_by_running_it_again() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new(
        "stopped",
        &topology(EIGHT, &[("a", &a, "0-3"), ("b", &b, "4-7")]),
    );
    pg::apply(&Topology::load(&file.0).unwrap()).await.unwrap();
    let servers = [("a", client(&a).await), ("b", client(&b).await)];
    let mut ids = insert(&servers[0].1, "shard3", 1000).await.unwrap();
    for step in MoveStep::ALL {
        let topo = Topology::load(&file.0).unwrap();
        let from = topo.server_of(3).unwrap().name.clone();
        let to = if from == "a" { "b" } else { "a" };
        let opts = MoveOptions {
            stop_after: Some(step),
            ..Default::default()
        };
        let e = move_shard(&file.0, 3, to, &opts).await.unwrap_err();
        assert!(e.to_string().contains("stopped after step"), "{e}");
        if step != MoveStep::Switched {
            let drift = pg::check(&topo).await.unwrap();
            assert!(
                drift
                    .iter()
                    .any(|d| d.problem.contains(&format!("move-shard 3 --to {to}"))),
                "after {step:?}: {drift:?}"
            );
            pg::apply(&topo)
                .await
                .expect_err("apply during a stopped move");
        }
        // Before the fence the source still takes writes.
        if matches!(step, MoveStep::Recorded | MoveStep::Copied) {
            let c = &servers.iter().find(|(n, _)| *n == from).unwrap().1;
            ids.extend(insert(c, "shard3", 100).await.unwrap());
        }
        let report = move_shard(&file.0, 3, to, &MoveOptions::default())
            .await
            .unwrap();
        assert!(report.resumed_after.is_some() || step == MoveStep::Switched);
        let topo = Topology::load(&file.0).unwrap();
        assert_eq!(topo.server_of(3).unwrap().name, to);
        assert!(pg::check(&topo).await.unwrap().is_empty(), "after {step:?}");
        let c = &servers.iter().find(|(n, _)| *n == to).unwrap().1;
        ids.extend(insert(c, "shard3", 100).await.unwrap());
        let n: i64 = c
            .query_one("SELECT count(*) FROM shard3.posts", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(n as usize, ids.len(), "rows lost after {step:?}");
    }
    let distinct: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len(), "ids handed out twice");
}

/// A move stopped after its fence is undone by `--abort`: the old copy
/// serves again, above every id it made; once the destination went live it
/// cannot be undone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_move_is_undone_by_abort_until_it_went_live() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new(
        "abort",
        &topology(EIGHT, &[("a", &a, "0-3"), ("b", &b, "4-7")]),
    );
    let topo = Topology::load(&file.0).unwrap();
    pg::apply(&topo).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    let before = insert(&ca, "shard3", 1000).await.unwrap();
    let stop = |step| MoveOptions {
        stop_after: Some(step),
        ..Default::default()
    };
    move_shard(&file.0, 3, "b", &stop(MoveStep::Fenced))
        .await
        .unwrap_err();
    assert_eq!(
        insert(&ca, "shard3", 1)
            .await
            .unwrap_err()
            .as_db_error()
            .map(|d| d.code().code()),
        Some("SF001")
    );
    let drift = pg::check(&topo).await.unwrap();
    assert!(
        drift.iter().any(|d| d.problem.contains("live nowhere")),
        "{drift:?}"
    );
    assert_eq!(abort_move(&file.0, 3).await.unwrap(), "a");
    assert!(pg::check(&topo).await.unwrap().is_empty());
    assert!(!schemas(&cb).await.contains(&"shard3".to_string()));
    let after = insert(&ca, "shard3", 1000).await.unwrap();
    assert!(after.iter().min() > before.iter().max());

    move_shard(&file.0, 3, "b", &stop(MoveStep::Live))
        .await
        .unwrap_err();
    let e = abort_move(&file.0, 3).await.unwrap_err();
    assert!(e.to_string().contains("went live"), "{e}");
    move_shard(&file.0, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    assert!(
        pg::check(&Topology::load(&file.0).unwrap())
            .await
            .unwrap()
            .is_empty()
    );
    abort_move(&file.0, 3).await.unwrap_err();
}
