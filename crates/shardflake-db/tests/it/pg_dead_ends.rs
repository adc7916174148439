//! States an operator reaches that used to refuse every way out (issue 37,
//! item 6): each refusal names a command, and that command is run here
//! from the state that printed it.

use std::process::Command;

use shardflake_db::pg::move_shard::{MoveOptions, MoveStep, move_shard};
use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const POSTS: &str = "[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL, body text)\"\n";

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

async fn insert(c: &Client, schema: &str) -> Result<i64, tokio_postgres::Error> {
    Ok(c.query_one(
        &format!("INSERT INTO {schema}.posts (user_id) VALUES (1) RETURNING id"),
        &[],
    )
    .await?
    .get(0))
}

fn problems(drift: &[pg::Drift]) -> String {
    drift
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// E14: a whole server restored from a dump taken before a shard moved
/// away from it. `pg check` says the shard is live twice and to drop the
/// stale copy, then run `pg repair`; before, repair still refused (the
/// restored record of the shard was left) and the server's other shards
/// refused writes (SF003) until the record was deleted by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_server_restored_after_a_move_gets_out_by_the_steps_check_prints() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-dead-e14-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    std::fs::write(
        &path,
        format!(
            "layout = \"instagram\"\nshards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-3\"\n\
             [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"\"\n{POSTS}",
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    pg::apply(&Topology::load(&path).unwrap()).await.unwrap();
    let ca = client(&a).await;
    insert(&ca, "shard1").await.unwrap();
    insert(&ca, "shard2").await.unwrap();

    // The whole database of a, records included, before the move.
    let dump = dir.join("a.dump");
    let port = a.port.to_string();
    let conn = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let out = Command::new(a.program("pg_dump").unwrap())
        .args(conn)
        .args(["-Fc", "-f"])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    move_shard(&path, 1, "b", &MoveOptions::default())
        .await
        .unwrap();
    let cb = client(&b).await;
    insert(&cb, "shard1").await.unwrap();
    let out = Command::new(a.program("pg_restore").unwrap())
        .args(conn)
        .args(["--clean", "--if-exists", "-d", "postgres"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let topo = Topology::load(&path).unwrap();

    // Step 1, as check says: drop the copy the file does not put there.
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(
        said.contains("shard 1 is live on a and b") && said.contains("DROP SCHEMA shard1 CASCADE"),
        "{said}"
    );
    let ca = client(&a).await;
    ca.batch_execute("DROP SCHEMA shard1 CASCADE")
        .await
        .unwrap();
    // Step 2, as check says now: pg repair.
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(said.contains("pg repair"), "{said}");
    pg::repair(&topo, None)
        .await
        .unwrap_or_else(|e| panic!("repair after the steps check printed: {e}\n{said}"));
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    insert(&ca, "shard2").await.unwrap();
    insert(&cb, "shard1").await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// H: the server's clock ran 600 s ahead for a moment, `next_id` caught
/// the sequence up with it, then the clock was set back: every id is
/// refused (SF004) for about 10 minutes. Before, `pg check` said ok; it
/// now reports the shard, why, and when ids resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_far_ahead_of_the_clock_is_reported_with_when_ids_resume() {
    let a = PgServer::start().unwrap();
    let topo = Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n{POSTS}",
        a.url()
    ))
    .unwrap();
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    insert(&c, "shard0").await.unwrap();
    // What a catch-up at a clock 600 s ahead leaves (instagram: 1 ms
    // ticks, 10 sequence bits, epoch 1314220021721 ms).
    c.batch_execute(
        "SELECT setval('shard0.id_seq', \
         ((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint + 600000 - 1314220021721) << 10))",
    )
    .await
    .unwrap();
    let e = insert(&c, "shard0").await.unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some(shardflake_db::SQLSTATE_AHEAD),
        "{e}"
    );
    // The refusal names the command that says when it ends.
    assert!(
        shardflake_db::pg_message(&e).contains("`shardflake pg check` says when"),
        "{e}"
    );
    let said = problems(&pg::check(&topo).await.unwrap());
    let secs: f64 = said
        .split_once("a: shard 0: sequence shard0.id_seq runs ")
        .and_then(|(_, rest)| rest.split_once(" s ahead of the server clock"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!((595.0..=600.5).contains(&secs), "{said}");
    assert!(
        said.contains("SF004") && said.contains("at about 20"),
        "{said}"
    );
}

/// Outside review R7, item 7: a's dump taken before `move-shard 1 --to b`,
/// which went live on b and stopped before switching the file; rows
/// written on b since; then the dump restored over a. Both copies are
/// live, and the file still puts shard 1 on a: check advised dropping
/// b's copy, the one holding every row. The restored copy (its `next_id`
/// refuses ids, SF003) is the stale one: check now says to drop it and
/// put the shard in b's list; done, `pg repair` and check are clean and
/// every row written on b is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_from_before_a_move_live_elsewhere_is_the_copy_to_drop() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-dead-r7-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    let text = |b_shards: &str, a_shards: &str| {
        format!(
            "layout = \"instagram\"\nshards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"{a_shards}\"\n\
             [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"{b_shards}\"\n{POSTS}",
            a.url(),
            b.url()
        )
    };
    std::fs::write(&path, text("", "0-3")).unwrap();
    pg::apply(&Topology::load(&path).unwrap()).await.unwrap();
    let ca = client(&a).await;
    insert(&ca, "shard1").await.unwrap();

    let dump = dir.join("a.dump");
    let port = a.port.to_string();
    let conn = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let out = Command::new(a.program("pg_dump").unwrap())
        .args(conn)
        .args(["-Fc", "-f"])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let live = MoveOptions {
        stop_after: Some(MoveStep::Live),
        ..MoveOptions::default()
    };
    move_shard(&path, 1, "b", &live).await.unwrap_err();
    let cb = client(&b).await;
    let mut on_b = Vec::new();
    for _ in 0..5 {
        on_b.push(insert(&cb, "shard1").await.unwrap());
    }
    // Restored as into an empty database: the fenced copy's fence
    // functions, not in the dump, would stop `--clean` dropping its schema.
    ca.batch_execute("DROP SCHEMA shard1 CASCADE")
        .await
        .unwrap();
    drop(ca);
    let out = Command::new(a.program("pg_restore").unwrap())
        .args(conn)
        .args(["--clean", "--if-exists", "-d", "postgres"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let said = problems(&pg::check(&Topology::load(&path).unwrap()).await.unwrap());
    assert!(
        said.contains("a: shard 1: shard 1 is live on a and b: the copy on a was restored from a dump taken before the shard went live on b")
            && said.contains("(`DROP SCHEMA shard1 CASCADE` on a), keep the one on b; put shard 1 in b's list in the file (out of a's)")
            && !said.contains("copy on b and drop it"),
        "{said}"
    );
    // As it says.
    client(&a)
        .await
        .batch_execute("DROP SCHEMA shard1 CASCADE")
        .await
        .unwrap();
    std::fs::write(&path, text("1", "0,2-3")).unwrap();
    let topo = Topology::load(&path).unwrap();
    pg::repair(&topo, None).await.unwrap();
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    let mut stored: Vec<i64> = cb
        .query("SELECT id FROM shard1.posts", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    stored.sort_unstable();
    assert!(on_b.iter().all(|id| stored.contains(id)), "{stored:?}");
    assert_eq!(stored.len(), 6);
    let _ = std::fs::remove_dir_all(&dir);
}
