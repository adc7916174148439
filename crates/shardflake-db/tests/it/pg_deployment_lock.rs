//! The deployment as its servers record it, whatever file an operator runs
//! (issue 37): every command takes the deployment lock on every server
//! before it reads the records (R, 2M), and a file older than the
//! generation the servers record is refused (O).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use shardflake_db::pg::move_shard::{MoveOptions, MoveStep, move_shard};
use shardflake_db::pg::{self, Topology, sql};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const POSTS: &str = "[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL, body text)\"\n";

/// Four shards on `servers` (name, server, shard list), in that order.
fn topology(servers: &[(&str, &PgServer, &str)]) -> String {
    let mut t = "layout = \"instagram\"\nshards = 4\n".to_string();
    for (name, s, list) in servers {
        t.push_str(&format!(
            "[[servers]]\nname = \"{name}\"\nurl = \"{}\"\nshards = \"{list}\"\n",
            s.url()
        ));
    }
    t.push_str(POSTS);
    t
}

/// A topology file in a fresh temp dir, removed on drop.
pub(crate) struct TopoFile(pub(crate) PathBuf);

impl TopoFile {
    pub(crate) fn new(name: &str, text: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sf-lock-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("topology.toml");
        std::fs::write(&path, text).unwrap();
        TopoFile(path)
    }
    pub(crate) fn load(&self) -> Topology {
        Topology::load(&self.0).unwrap()
    }
}

impl Drop for TopoFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
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

/// The deployment lock, held by a test's own session to line commands up.
const LOCK: i64 = sql::LOCK_BASE - 1;

/// Waits (bounded) until `n` sessions in all wait for an advisory lock on
/// the servers of `clients`.
async fn wait_for_waiters(clients: &[&Client], n: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut waiting = 0;
        for c in clients {
            let w: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            waiting += w;
        }
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} of {n} sessions wait for the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// O: a server added, a shard moved to it, then `pg apply` from the file
/// of before the move (an app host's deploy): that file does not name the
/// new server, and no server it names records the shard any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_older_than_a_move_is_refused_by_every_command() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let old = Topology::parse(&topology(&[("a", &a, "0-1"), ("b", &b, "2-3")])).unwrap();
    pg::apply(&old).await.unwrap();
    let file = TopoFile::new(
        "older",
        &topology(&[("a", &a, "0-1"), ("b", &b, "2-3"), ("c", &c, "")]),
    );
    pg::apply_adding(&file.load(), &["c".to_string()])
        .await
        .unwrap();
    move_shard(&file.0, 1, "c", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(file.load().generation(), 1);

    let e = pg::apply(&old)
        .await
        .expect_err("apply from the old file recreated shard 1 on a");
    let text = e.to_string();
    assert!(
        text.contains("the file is generation 0, but the servers record generation 1")
            && text.contains(&file.0.display().to_string()),
        "{text}"
    );
    assert!(!has_schema(&client(&a).await, "shard1").await);
    let e = pg::repair(&old, None)
        .await
        .expect_err("repair took the old file");
    assert!(e.to_string().contains("generation 1"), "{e}");
    let drift = pg::check(&old).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.problem.contains("servers record generation 1")),
        "{drift:#?}"
    );
    // Not also "schema shard1 is missing (run pg apply)": that file's apply
    // is refused.
    assert!(
        !drift.iter().any(|d| d.problem.contains("is missing")),
        "{drift:#?}"
    );
    // The file the move wrote is the one to use.
    pg::apply(&file.load()).await.unwrap();
    assert_eq!(pg::check(&file.load()).await.unwrap(), Vec::new());
}

/// 2M: two moves of two shards started at once from one file: the second
/// waits for the first, then works from the file the first wrote (before,
/// it wrote back the list it had read, moving the first shard back in the
/// file while it lived on its new server).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_moves_at_once_from_one_file_keep_both() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("two-moves", &topology(&[("a", &a, "0-3"), ("b", &b, "")]));
    pg::apply(&file.load()).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    // Both moves start (and read the file) while b's lock is taken.
    cb.execute("SELECT pg_advisory_lock($1)", &[&LOCK])
        .await
        .unwrap();
    let path = file.0.clone();
    let first =
        tokio::spawn(async move { move_shard(&path, 2, "b", &MoveOptions::default()).await });
    wait_for_waiters(&[&ca, &cb], 1).await;
    let path = file.0.clone();
    let second =
        tokio::spawn(async move { move_shard(&path, 3, "b", &MoveOptions::default()).await });
    wait_for_waiters(&[&ca, &cb], 2).await;
    cb.execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
        .await
        .unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();

    let topo = file.load();
    assert_eq!(topo.server_of(2).unwrap().name, "b");
    assert_eq!(topo.server_of(3).unwrap().name, "b");
    assert_eq!(topo.generation(), 2);
    assert_eq!(pg::check(&topo).await.unwrap(), Vec::new());
}

/// R: `pg repair` run while a `move-shard --keep-source` of one of its
/// shards is under way must not reach the old copy with what it read
/// before the move fenced it (before: it set the fenced sequence's
/// MAXVALUE back and rebuilt its `next_id`, and the old copy made ids
/// again beside the new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repair_during_a_move_never_reopens_the_fenced_copy() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    // b first in the file: repair went through the servers in file order.
    let text = topology(&[("b", &b, ""), ("a", &a, "0-3")]);
    let file = TopoFile::new("repair-move", &text);
    pg::apply(&file.load()).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    cb.execute("SELECT pg_advisory_lock($1)", &[&LOCK])
        .await
        .unwrap();
    let topo = file.load();
    let repair = tokio::spawn(async move { pg::repair(&topo, None).await });
    wait_for_waiters(&[&ca, &cb], 1).await;
    let path = file.0.clone();
    let keep = MoveOptions {
        keep_source: true,
        ..MoveOptions::default()
    };
    let mover = tokio::spawn(async move { move_shard(&path, 1, "b", &keep).await });
    wait_for_waiters(&[&ca, &cb], 2).await;
    cb.execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
        .await
        .unwrap();
    repair.await.unwrap().unwrap();
    mover.await.unwrap().unwrap();

    // The old copy on a stays fenced: it hands out no id.
    let e = ca
        .query_one("SELECT shard1.next_id()", &[])
        .await
        .expect_err("the fenced copy made an id after repair");
    assert!(shardflake_db::is_moved(&e), "{e}");
    // check says only what the kept copy blocks (a later move elsewhere).
    let drift: Vec<String> = pg::check(&file.load())
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift.len() == 1 && drift[0].starts_with("a: shard 1: a fenced copy of shard 1 is here"),
        "{drift:#?}"
    );
}

/// A `pg repair` started beside a move on the same file waits for the move,
/// which switches the file to the next generation: the repair read the
/// file before it waited, so it is refused, naming the new generation (what
/// operations-db.md says); run again, it reads the file the move wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repair_waiting_behind_a_move_is_refused_naming_the_new_generation() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new(
        "move-then-repair",
        &topology(&[("a", &a, "0-3"), ("b", &b, "")]),
    );
    pg::apply(&file.load()).await.unwrap();
    let (ca, cb) = (client(&a).await, client(&b).await);
    cb.execute("SELECT pg_advisory_lock($1)", &[&LOCK])
        .await
        .unwrap();
    let path = file.0.clone();
    let mover =
        tokio::spawn(async move { move_shard(&path, 1, "b", &MoveOptions::default()).await });
    wait_for_waiters(&[&ca, &cb], 1).await;
    let topo = file.load();
    let repair = tokio::spawn(async move { pg::repair(&topo, None).await });
    wait_for_waiters(&[&ca, &cb], 2).await;
    cb.execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
        .await
        .unwrap();
    mover.await.unwrap().unwrap();
    let e = repair.await.unwrap().unwrap_err().to_string();
    assert!(
        e.contains("the file is generation 0, but the servers record generation 1"),
        "{e}"
    );
    pg::repair(&file.load(), None).await.unwrap();
}

/// `pg check` shares the deployment lock: while a command that changes the
/// deployment holds it (a move under way), check waits and then reads what
/// that command left, rather than records about to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_waits_for_a_command_holding_the_deployment_lock() {
    let a = PgServer::start().unwrap();
    let file = TopoFile::new("check-waits", &topology(&[("a", &a, "0-3")]));
    pg::apply(&file.load()).await.unwrap();
    let ca = client(&a).await;
    ca.execute("SELECT pg_advisory_lock($1)", &[&LOCK])
        .await
        .unwrap();
    let topo = file.load();
    let check = tokio::spawn(async move { pg::check(&topo).await });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            !check.is_finished(),
            "check read the records while another command held the lock"
        );
        let waiting: i64 = ca
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "check never asked for the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Checks share it with each other.
    let other = tokio::spawn({
        let topo = file.load();
        async move { pg::check(&topo).await }
    });
    ca.execute("SELECT pg_advisory_unlock($1)", &[&LOCK])
        .await
        .unwrap();
    assert_eq!(check.await.unwrap().unwrap(), Vec::new());
    assert_eq!(other.await.unwrap().unwrap(), Vec::new());
}

/// Outside review R7, item 3: a move that recorded its generation on the
/// servers and stopped before it wrote the file (simulated: stopped once
/// the file was written, the file then put back) leaves a file one
/// generation behind. The refusal said the move "wrote it to" that file,
/// false, and named neither `generation` nor a command. It now says the
/// move writes the file after recording it, names the move to run again,
/// and the two edits that do the same by hand; the move, run again from
/// that file, writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_stopped_before_it_wrote_the_file_names_the_way_to_write_it() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let file = TopoFile::new("unwritten", &topology(&[("a", &a, "0-3"), ("b", &b, "")]));
    pg::apply(&file.load()).await.unwrap();
    let before = std::fs::read_to_string(&file.0).unwrap();
    let stop = MoveOptions {
        stop_after: Some(MoveStep::Switched),
        ..MoveOptions::default()
    };
    move_shard(&file.0, 1, "b", &stop).await.unwrap_err();
    std::fs::write(&file.0, &before).unwrap();

    let text = pg::apply(&file.load()).await.unwrap_err().to_string();
    let path = file.0.display().to_string();
    assert!(
        text.contains(&format!(
            "use the file of generation 1: the last `pg move-shard`, of shard 1 to b, recorded it on the servers, then writes it to {path}. If that file still says an older generation (the move stopped in between), run that move again from it (`shardflake pg move-shard 1 --to b`), which writes it; or, where that move is refused, make its two edits by hand: set `generation = 1` and put shard 1 in b's list"
        )) && !text.contains("wrote it to"),
        "{text}"
    );
    move_shard(&file.0, 1, "b", &MoveOptions::default())
        .await
        .unwrap();
    let topo = file.load();
    assert_eq!(
        (topo.generation(), topo.server_of(1).unwrap().name.as_str()),
        (1, "b")
    );
    pg::apply(&topo).await.unwrap();
    let drift = pg::check(&topo).await.unwrap();
    assert!(drift.is_empty(), "{drift:#?}");
}

/// Outside review R7, item 5: a fenced copy beside the live one (kept by
/// `--keep-source`; a restore of a dump taken during a move brings back
/// the same records) made `move-shard` of that shard to any other server
/// refuse ("finish that first"), while `pg check` said nothing. check now
/// says so, with the move that drops it; run, the next move goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_fenced_copy_that_refuses_the_next_move() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let file = TopoFile::new(
        "fenced-beside",
        &topology(&[("a", &a, "0-3"), ("b", &b, ""), ("c", &c, "")]),
    );
    pg::apply(&file.load()).await.unwrap();
    let keep = MoveOptions {
        keep_source: true,
        ..MoveOptions::default()
    };
    move_shard(&file.0, 1, "b", &keep).await.unwrap();

    let drift: Vec<String> = pg::check(&file.load())
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        drift,
        vec![
            "a: shard 1: a fenced copy of shard 1 is here (kept by `move-shard --keep-source`, or brought back by a restore), while the shard is live on b: it makes no id, but `shardflake pg move-shard 1` to any server but b is refused while it is here; `shardflake pg move-shard 1 --to b` finishes that move and drops it"
        ]
    );
    let e = move_shard(&file.0, 1, "c", &MoveOptions::default())
        .await
        .expect_err("moved beside a fenced copy")
        .to_string();
    assert!(e.contains("finish that first"), "{e}");
    move_shard(&file.0, 1, "b", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(pg::check(&file.load()).await.unwrap(), Vec::new());
    assert!(!has_schema(&client(&a).await, "shard1").await);
    move_shard(&file.0, 1, "c", &MoveOptions::default())
        .await
        .unwrap();
    assert_eq!(pg::check(&file.load()).await.unwrap(), Vec::new());
}
