//! A server is new only when the operator says so (issue 37, D): every
//! server records which database holds each shard (system identifier and
//! database oid), so a URL edited to reach an empty database is refused,
//! not taken as a new server whose shards `apply` creates live a second
//! time.

use std::collections::HashSet;
use std::process::Command;

use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const POSTS: &str = "[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL, body text)\"\n";

/// Eight shards on `servers` (name, url, shard list), in that order.
pub(crate) fn topology(servers: &[(&str, &str, &str)]) -> String {
    let mut t = "layout = \"instagram\"\nshards = 8\n".to_string();
    for (name, url, list) in servers {
        t.push_str(&format!(
            "[[servers]]\nname = \"{name}\"\nurl = \"{url}\"\nshards = \"{list}\"\n"
        ));
    }
    t.push_str(POSTS);
    t
}

pub(crate) async fn connect(url: &str) -> Client {
    pg::connect_url("test", url).await.unwrap()
}

/// `n` ids drawn from `schema`'s `posts`.
pub(crate) async fn insert(c: &Client, schema: &str, n: i64) -> Vec<i64> {
    c.query(
        &format!(
            "INSERT INTO {schema}.posts (user_id) SELECT g FROM generate_series(1, $1::bigint) g RETURNING id"
        ),
        &[&n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
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

/// An empty database `name` on `s`; its URL.
async fn empty_database(s: &PgServer, name: &str) -> String {
    connect(&s.url())
        .await
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let url = s.url();
    let base = url.strip_suffix("/postgres").unwrap();
    format!("{base}/{name}")
}

/// D: server b's URL edited to reach an empty database on the same
/// PostgreSQL, then `pg apply`. Before, a database with no records was
/// taken as a new server and b's shards were created there live a second
/// time (their ids made again); now apply is refused, and check says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_refuses_a_url_that_now_reaches_another_database() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let before = topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]);
    pg::apply(&Topology::parse(&before).unwrap()).await.unwrap();
    let on_b = insert(&connect(&b.url()).await, "shard5", 200).await;

    let other = empty_database(&b, "other").await;
    let edited = topology(&[("a", &a.url(), "0-3"), ("b", &other, "4-7")]);
    let edited = Topology::parse(&edited).unwrap();
    let refused = pg::apply(&edited).await;
    let c_other = connect(&other).await;
    // Had apply gone through, shard 5 would make b's ids again.
    if has_schema(&c_other, "shard5").await {
        let again: HashSet<i64> = insert(&c_other, "shard5", 200).await.into_iter().collect();
        let repeated = on_b.iter().filter(|id| again.contains(id)).count();
        panic!("apply created shard 5 on the other database ({repeated} of its ids repeat b's)");
    }
    let e = refused.expect_err("apply took an empty database for a new server");
    assert!(
        e.to_string()
            .contains("this URL now reaches another database"),
        "{e}"
    );
    let drift = pg::check(&edited).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.server == "b" && d.problem.contains("this URL now reaches another database")),
        "{drift:?}"
    );
    // The file with b's real URL is still fine.
    pg::apply(&Topology::parse(&before).unwrap()).await.unwrap();
}

/// Adding a server is an explicit step: a server without records joins a
/// deployment only through `apply --new-server`, empty, and takes shards
/// by moves; naming an edited URL new does not let it take its shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_is_new_only_when_named_so() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let two = topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")]);
    pg::apply(&Topology::parse(&two).unwrap()).await.unwrap();
    let c = empty_database(&b, "third").await;
    let new = |name: &str| vec![name.to_string()];

    let three = topology(&[
        ("a", &a.url(), "0-3"),
        ("b", &b.url(), "4-7"),
        ("c", &c, ""),
    ]);
    let three = Topology::parse(&three).unwrap();
    let e = pg::apply(&three)
        .await
        .expect_err("a server joined unnamed");
    assert!(e.to_string().contains("--new-server c"), "{e}");
    let drift = pg::check(&three).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.server == "c" && d.problem.contains("--new-server c")),
        "{drift:?}"
    );
    // A new server given a shard the deployment holds: refused.
    let taking = topology(&[
        ("a", &a.url(), "0-3"),
        ("b", &b.url(), "4,6-7"),
        ("c", &c, "5"),
    ]);
    let e = pg::apply_adding(&Topology::parse(&taking).unwrap(), &new("c"))
        .await
        .expect_err("a new server took a live shard");
    assert!(
        e.to_string().contains("holds no shard until one is moved"),
        "{e}"
    );
    // Named new: it joins, empty; a re-run with the name is fine.
    pg::apply_adding(&three, &new("c")).await.unwrap();
    pg::apply_adding(&three, &new("c")).await.unwrap();
    pg::apply(&three).await.unwrap();
    assert!(pg::check(&three).await.unwrap().is_empty());

    // b's URL edited to an empty database, named new: still refused.
    let other = empty_database(&a, "other").await;
    let edited = topology(&[("a", &a.url(), "0-3"), ("b", &other, "4-7"), ("c", &c, "")]);
    let e = pg::apply_adding(&Topology::parse(&edited).unwrap(), &new("b"))
        .await
        .expect_err("an edited url named new took b's shards");
    assert!(
        e.to_string()
            .contains("this URL now reaches another database"),
        "{e}"
    );
    assert!(!has_schema(&connect(&other).await, "shard5").await);
    // A name the file does not have.
    let e = pg::apply_adding(&three, &new("zz")).await.unwrap_err();
    assert!(e.to_string().contains("no server named \"zz\""), "{e}");
}

/// The owners follow a move: a shard moved to a server, then that
/// server's URL edited to an empty database, is refused as D.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_follow_a_move() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let text = topology(&[("a", &a.url(), "0-7"), ("b", &b.url(), "")]);
    let dir = std::env::temp_dir().join(format!("sf-identity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    std::fs::write(&path, &text).unwrap();
    pg::apply(&Topology::load(&path).unwrap()).await.unwrap();
    shardflake_db::pg::move_shard::move_shard(
        &path,
        5,
        "b",
        &shardflake_db::pg::move_shard::MoveOptions::default(),
    )
    .await
    .unwrap();
    let moved = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let other = empty_database(&b, "other").await;
    let edited = Topology::parse(&moved.replace(&b.url(), &other)).unwrap();
    let e = pg::apply(&edited).await.expect_err("shard 5 recreated");
    assert!(e.to_string().contains("records shards 5 on"), "{e}");
    assert!(!has_schema(&connect(&other).await, "shard5").await);
}

/// What the guides say of a one-server file whose URL now reaches another,
/// empty, database: no server of the file holds the records, so nothing
/// tells it from a new deployment's. `pg check` reports the server, with
/// both readings and what `apply` would do; the database with the records
/// is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_server_file_edited_to_an_empty_database_is_reported_by_check() {
    let (a, empty) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    pg::apply(&Topology::parse(&topology(&[("a", &a.url(), "0-7")])).unwrap())
        .await
        .unwrap();
    let edited = Topology::parse(&topology(&[("a", &empty.url(), "0-7")])).unwrap();
    let said: Vec<String> = pg::check(&edited)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        said.iter().any(|d| d.contains("holds no deployment record")
            && d.contains("put back the url of the database that holds the records")
            && d.contains("second deployment")),
        "{said:?}"
    );
}

/// E9: a one-server file whose URL was changed to another, empty,
/// database of the same PostgreSQL cluster. No server of the file holds
/// the records, so before, `apply` made a second deployment there and its
/// shards made the first one's ids again. The other databases of the
/// cluster are read: the deployment recorded in `postgres` under the same
/// server name refuses the apply, and `check` names that database; the
/// operator's `--new-deployment` makes a separate one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_server_file_edited_to_another_database_of_its_cluster_is_refused() {
    let a = PgServer::start().unwrap();
    pg::apply(&Topology::parse(&topology(&[("a", &a.url(), "0-7")])).unwrap())
        .await
        .unwrap();
    let first = insert(&connect(&a.url()).await, "shard5", 200).await;

    let other = empty_database(&a, "other").await;
    let edited = Topology::parse(&topology(&[("a", &other, "0-7")])).unwrap();
    let refused = pg::apply(&edited).await;
    let c_other = connect(&other).await;
    if has_schema(&c_other, "shard5").await {
        let again: HashSet<i64> = insert(&c_other, "shard5", 200).await.into_iter().collect();
        let repeated = first.iter().filter(|id| again.contains(id)).count();
        panic!(
            "apply made a second deployment on the other database ({repeated} of 200 ids of shard 5 repeat the first one's in this draw)"
        );
    }
    let e = refused
        .expect_err("apply took another database of the cluster for a new deployment")
        .to_string();
    assert!(
        e.contains("database \"postgres\" of the same PostgreSQL cluster")
            && e.contains("shards 0-7")
            && e.contains("shardflake pg apply --new-deployment"),
        "{e}"
    );
    let said: Vec<String> = pg::check(&edited)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        said.iter()
            .any(|d| d.contains("database \"postgres\" of the same PostgreSQL cluster")),
        "{said:?}"
    );
    // Renamed too, it is reported the same; the operator's word makes a
    // separate deployment.
    let renamed = Topology::parse(&topology(&[("b", &other, "0-7")])).unwrap();
    assert!(
        pg::check(&renamed)
            .await
            .unwrap()
            .iter()
            .any(|d| d.problem.contains("of the same PostgreSQL cluster"))
    );
    pg::apply_with(
        &edited,
        &pg::ApplyOptions {
            new_deployment: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(has_schema(&c_other, "shard5").await);
    // Once it records its own deployment, later runs need no flag.
    pg::apply(&edited).await.unwrap();
    assert!(pg::check(&edited).await.unwrap().is_empty());
}

/// P1b: the same as E9, the server renamed in the file too (`a` to `db1`).
/// Before, only a deployment's server of the same name was looked for:
/// `check` said "holds no deployment record", `apply` made a second
/// deployment, and its shards made the first one's ids again (1,278 in
/// the review). Any deployment recorded in another database of the
/// cluster now refuses a first apply, whatever the server is called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_one_server_file_in_another_database_of_its_cluster_is_refused() {
    let a = PgServer::start().unwrap();
    pg::apply(&Topology::parse(&topology(&[("a", &a.url(), "0-7")])).unwrap())
        .await
        .unwrap();
    let first = insert(&connect(&a.url()).await, "shard0", 200).await;

    let other = empty_database(&a, "other").await;
    let renamed = Topology::parse(&topology(&[("db1", &other, "0-7")])).unwrap();
    let said: Vec<String> = pg::check(&renamed)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    let refused = pg::apply(&renamed).await;
    let c_other = connect(&other).await;
    if has_schema(&c_other, "shard0").await {
        let again: HashSet<i64> = insert(&c_other, "shard0", 200).await.into_iter().collect();
        let repeated = first.iter().filter(|id| again.contains(id)).count();
        panic!(
            "apply made a second deployment on the other database ({repeated} of 200 ids of shard 0 repeat the first one's in this draw); check said {said:?}"
        );
    }
    let e = refused
        .expect_err("apply took another database of the cluster for a new deployment")
        .to_string();
    assert!(
        e.contains("database \"postgres\" of the same PostgreSQL cluster")
            && e.contains("server \"a\"")
            && e.contains("shards 0-7")
            && e.contains("shardflake pg apply --new-deployment"),
        "{e}"
    );
    assert!(
        said.iter()
            .any(|d| d.contains("database \"postgres\" of the same PostgreSQL cluster")),
        "{said:?}"
    );
}

/// `pg_dump -Fc` of `from`'s `postgres` database restored into `to`'s.
pub(crate) fn dump_into(from: &PgServer, to: &PgServer) {
    let dump = std::env::temp_dir().join(format!("sf-replaced-{}.dump", std::process::id()));
    let port = from.port.to_string();
    let out = Command::new(from.program("pg_dump").unwrap())
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-Fc",
            "-f",
        ])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let port = to.port.to_string();
    let out = Command::new(to.program("pg_restore").unwrap())
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "--exit-on-error",
            "-d",
            "postgres",
        ])
        .arg(&dump)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&dump);
    assert!(out.status.success(), "{out:?}");
}

/// 4e: a dump of a restored into a new cluster c, a halted, a file with
/// a's url pointing at c repaired, a restarted, the original file
/// repaired: both made the same ids. The records name a's database for
/// its shards; c's differs: repair through c is refused until
/// `--replaces a`, which records c on every server, and then a is refused
/// by repair and check as the replaced copy (and its ids stay refused:
/// restarted, it needs a repair nothing lets through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_restored_into_another_cluster_is_a_replacement_only_when_said() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let original =
        Topology::parse(&topology(&[("a", &a.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    pg::apply(&original).await.unwrap();
    let made = insert(&connect(&a.url()).await, "shard0", 100).await;
    dump_into(&a, &c);
    let a_system: i64 = connect(&a.url())
        .await
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .await
        .unwrap()
        .get(0);
    a.stop();
    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    let e = pg::repair(&onto_c, None).await.unwrap_err().to_string();
    assert!(e.contains("pg repair --replaces a"), "{e}");
    let drift: Vec<String> = pg::check(&onto_c)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift.iter().any(|d| d.contains("--replaces a"))
            && drift.iter().all(|d| !d.contains("repair --shard")),
        "{drift:#?}"
    );
    pg::repair_replacing(
        &onto_c,
        None,
        &[pg::Replacement {
            server: "a".to_string(),
            old: pg::OldCopy::Gone(vec![a_system]),
        }],
    )
    .await
    .unwrap();
    assert_eq!(pg::check(&onto_c).await.unwrap(), Vec::new());
    let after = insert(&connect(&c.url()).await, "shard0", 100).await;
    assert!(after.iter().min() > made.iter().max());

    // The old server back, the original file: refused as the replaced copy.
    a.restart().unwrap();
    let e = pg::repair(&original, None).await.unwrap_err().to_string();
    assert!(e.contains("the copy another server replaced"), "{e}");
    let drift: Vec<String> = pg::check(&original)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift
            .iter()
            .any(|d| d.contains("the copy another server replaced")),
        "{drift:#?}"
    );
    pg::apply(&original).await.unwrap_err();
    let e = connect(&a.url())
        .await
        .query_one("SELECT shard0.next_id()", &[])
        .await
        .unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("SF005"),
        "{e}"
    );
}

/// `n` ids drawn from `schema`'s `posts`, or the server's refusal.
pub(crate) async fn try_insert(
    c: &Client,
    schema: &str,
    n: i64,
) -> Result<Vec<i64>, tokio_postgres::Error> {
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

/// The last outside review: a dump of a restored into a new cluster c,
/// the file's a pointed at c, `pg repair --replaces a` while a was never
/// stopped nor restarted: both copies took inserts (16,950 ids made by
/// both). The replacement now reaches the old copy (`--old-url`),
/// checks it is the database the deployment records for a, and fences
/// it in the same deployment-lock section: a writer on it, running
/// through the repair, gets no id from it afterwards (SF001), and c's
/// ids come after every id a made, also those made after the dump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_fences_the_copy_it_replaces_while_that_one_runs() {
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
    // The old copy goes on taking inserts the dump does not hold, through
    // the repair, until it refuses.
    made.extend(insert(&ca, "shard0", 100).await);
    let writer = tokio::spawn(async move {
        let mut ids = Vec::new();
        loop {
            match try_insert(&ca, "shard0", 50).await {
                Ok(more) => ids.extend(more),
                Err(e) => return (ids, e, ca),
            }
        }
    });
    let onto_c =
        Topology::parse(&topology(&[("a", &c.url(), "0-3"), ("b", &b.url(), "4-7")])).unwrap();
    let replaces = |old: pg::OldCopy| {
        vec![pg::Replacement {
            server: "a".to_string(),
            old,
        }]
    };
    // Bad input: refused, nothing changed.
    let e = pg::repair_replacing(&onto_c, Some(0), &replaces(pg::OldCopy::Url(a.url())))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("--shard with --replaces"), "{e}");
    let twice = [
        replaces(pg::OldCopy::Url(a.url())),
        replaces(pg::OldCopy::Gone(Vec::new())),
    ]
    .concat();
    let e = pg::repair_replacing(&onto_c, None, &twice)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("--replaces a is given twice"), "{e}");
    // Where the old copy cannot be reached, or is not the recorded one:
    // refused, nothing changed.
    let nowhere = format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        shardflake_testkit::free_port().unwrap()
    );
    let e = pg::repair_replacing(&onto_c, None, &replaces(pg::OldCopy::Url(nowhere)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cannot reach the copy") && e.contains("--old-copy-gone"),
        "{e}"
    );
    let e = pg::repair_replacing(&onto_c, None, &replaces(pg::OldCopy::Url(b.url())))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("the database that b's url reaches"), "{e}");
    let unrelated = empty_database(&c, "unrelated").await;
    let e = pg::repair_replacing(&onto_c, None, &replaces(pg::OldCopy::Url(unrelated)))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds no records of this deployment"), "{e}");
    assert!(
        !writer.is_finished(),
        "the old copy stopped making ids before the replacement"
    );

    pg::repair_replacing(&onto_c, None, &replaces(pg::OldCopy::Url(a.url())))
        .await
        .unwrap();
    let (after, e, ca) = tokio::time::timeout(std::time::Duration::from_secs(30), writer)
        .await
        .expect("the replaced copy still makes ids 30 s after the replacement")
        .unwrap();
    // The fence (SF001), or, for a statement planned before it, the
    // sequence capped at its last value (2200H).
    assert!(
        matches!(
            e.as_db_error().map(|d| d.code().code()),
            Some("SF001" | "2200H")
        ),
        "{e}"
    );
    made.extend(after);
    // A statement after the fence, and a new session: refused too.
    match try_insert(&ca, "shard0", 100).await {
        Ok(ids) => panic!(
            "the replaced copy made {} ids after the replacement",
            ids.len()
        ),
        Err(e) => assert_eq!(
            e.as_db_error().map(|d| d.code().code()),
            Some("SF001"),
            "{e}"
        ),
    }
    let e = connect(&a.url())
        .await
        .query_one("SELECT shard0.next_id()", &[])
        .await
        .unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("SF001"),
        "{e}"
    );
    // The rows a took after the dump are only there: check says so until
    // they are copied over, or the record of them dropped.
    let drift: Vec<String> = pg::check(&onto_c)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift.len() == 1 && drift[0].contains("are only on the old copy"),
        "{drift:#?}"
    );
    connect(&c.url())
        .await
        .batch_execute("DELETE FROM shardflake.left_behind")
        .await
        .unwrap();
    assert_eq!(pg::check(&onto_c).await.unwrap(), Vec::new());
    let on_c = insert(&connect(&c.url()).await, "shard0", 100).await;
    assert!(on_c.iter().min() > made.iter().max());

    // Run again: nothing left to replace.
    let e = pg::repair_replacing(&onto_c, None, &replaces(pg::OldCopy::Url(a.url())))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("there is nothing to replace"), "{e}");
    // The old file reaches the fenced copy: refused, even when it is
    // named as the replacement of c.
    let drift: Vec<String> = pg::check(&original)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift.iter().any(|d| d.contains("fenced for good")),
        "{drift:#?}"
    );
    let e = pg::repair_replacing(&original, None, &replaces(pg::OldCopy::Url(c.url())))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("fenced for good"), "{e}");
    let e = pg::apply(&original).await.unwrap_err().to_string();
    assert!(e.contains("fenced for good"), "{e}");
    let e = pg::adopt(
        &original,
        &pg::AdoptOptions {
            target: pg::Target::Table("public.orders".into()),
            column: "id".into(),
            server: None,
            shard: None,
            dry_run: true,
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(e.contains("fenced for good"), "{e}");
    let dir = std::env::temp_dir().join(format!("sf-replaced-move-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("old.toml");
    std::fs::write(&file, original.to_toml()).unwrap();
    let e = pg::move_shard::move_shard(&file, 4, "a", &Default::default())
        .await
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.contains("fenced for good"), "{e}");
}

/// The one-server case: nothing but the old copy itself can record its
/// replacement, and `--old-url` does: a file that still reaches only the
/// old copy is refused by repair and reported by check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_server_replacement_is_recorded_on_the_copy_it_replaces() {
    let (a, c) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let original = Topology::parse(&topology(&[("a", &a.url(), "0-7")])).unwrap();
    pg::apply(&original).await.unwrap();
    let made = insert(&connect(&a.url()).await, "shard3", 100).await;
    dump_into(&a, &c);
    let onto_c = Topology::parse(&topology(&[("a", &c.url(), "0-7")])).unwrap();
    let e = pg::repair(&onto_c, None).await.unwrap_err().to_string();
    assert!(e.contains("--replaces a --old-url"), "{e}");
    pg::repair_replacing(
        &onto_c,
        None,
        &[pg::Replacement {
            server: "a".to_string(),
            old: pg::OldCopy::Url(a.url()),
        }],
    )
    .await
    .unwrap();
    let on_c = insert(&connect(&c.url()).await, "shard3", 100).await;
    assert!(on_c.iter().min() > made.iter().max());
    let e = pg::repair(&original, None).await.unwrap_err().to_string();
    assert!(e.contains("fenced for good"), "{e}");
    let drift: Vec<String> = pg::check(&original)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert!(drift[0].contains("fenced for good"), "{drift:#?}");
}

/// One server's dump restored twice, into c1 and c2: c1 replaced a (its
/// `--old-url` fenced a), then c2 is to replace "a" too, its own records
/// (from the dump) naming a's database. Fencing a again would leave c1
/// live beside c2: refused, naming the database that replaced a; its url
/// as `--old-url` fences c1, and c2's ids come after c1's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_of_one_server_must_fence_the_copy_that_replaced_it() {
    let (a, c1, c2) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let one = |url: &str| Topology::parse(&topology(&[("a", url, "0-7")])).unwrap();
    pg::apply(&one(&a.url())).await.unwrap();
    let mut made = insert(&connect(&a.url()).await, "shard3", 100).await;
    dump_into(&a, &c1);
    dump_into(&a, &c2);
    let replacing = |old: &str| {
        vec![pg::Replacement {
            server: "a".to_string(),
            old: pg::OldCopy::Url(old.to_string()),
        }]
    };
    pg::repair_replacing(&one(&c1.url()), None, &replacing(&a.url()))
        .await
        .unwrap();
    let cc1 = connect(&c1.url()).await;
    made.extend(insert(&cc1, "shard3", 100).await);

    let e = pg::repair_replacing(&one(&c2.url()), None, &replacing(&a.url()))
        .await
        .expect_err("c2 replaced a, which c1 had replaced: c1 still live")
        .to_string();
    assert!(
        e.contains("already replaced") && e.contains("give its url as --old-url"),
        "{e}"
    );
    pg::repair_replacing(&one(&c2.url()), None, &replacing(&c1.url()))
        .await
        .unwrap();
    let e = try_insert(&cc1, "shard3", 1).await.unwrap_err();
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("SF001"),
        "{e}"
    );
    let on_c2 = insert(&connect(&c2.url()).await, "shard3", 100).await;
    assert!(on_c2.iter().min() > made.iter().max());
}
