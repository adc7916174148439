//! `pg adopt` (issue 39, item 1) on real PostgreSQL: populated `bigserial`
//! and identity tables switched to a shard's `next_id()` while 8 writers
//! insert, a dump restored into a fresh server, each refusal, and a
//! default changed back by hand.

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shardflake_db::pg::{self, AdoptOptions, Target, Topology};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const OLD_ROWS: i64 = 100_000;

fn topology(url: &str, extra: &str) -> Topology {
    Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 4\n{extra}[[servers]]\nname = \"a\"\nurl = \"{url}\"\nshards = \"0-3\"\n"
    ))
    .unwrap()
}

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

fn table(t: &str, dry_run: bool) -> AdoptOptions {
    AdoptOptions {
        target: Target::Table(t.into()),
        column: "id".into(),
        server: None,
        shard: None,
        dry_run,
    }
}

fn problems(drift: &[pg::Drift]) -> String {
    drift
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

async fn default_of(c: &Client, t: &str) -> String {
    c.query_one(
        "SELECT coalesce(pg_get_expr(d.adbin, d.adrelid), 'none') FROM pg_attribute a
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE a.attrelid = $1::text::regclass AND a.attname = 'id'",
        &[&t],
    )
    .await
    .unwrap()
    .get(0)
}

/// Eight writers inserting into `t` until told to stop; each keeps the
/// ids it got, in order, and the first error it met.
struct Writers {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<Result<Vec<i64>, String>>>,
}

impl Writers {
    async fn start(s: &PgServer, t: &str) -> Writers {
        let (stop, count) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let mut tasks = Vec::new();
        for w in 0..8 {
            let c = client(s).await;
            let (stop, count) = (stop.clone(), count.clone());
            let sql = format!("INSERT INTO {t} (body) VALUES ($1) RETURNING id");
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let row = c
                        .query_one(&sql, &[&format!("writer {w}")])
                        .await
                        .map_err(|e| shardflake_db::pg_message(&e))?;
                    ids.push(row.get::<_, i64>(0));
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Ok(ids)
            }));
        }
        Writers { stop, count, tasks }
    }

    /// Waits (at most 60 s) until `n` more rows than now were inserted.
    async fn wait_for(&self, n: usize) {
        let target = self.count.load(Ordering::Relaxed) + n;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.count.load(Ordering::Relaxed) < target {
            assert!(Instant::now() < deadline, "writers stalled");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn stop(self) -> Vec<Vec<i64>> {
        self.stop.store(true, Ordering::Relaxed);
        let mut out = Vec::new();
        for t in self.tasks {
            out.push(
                t.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("an insert failed: {e}")),
            );
        }
        out
    }
}

/// Adopts `t` (made by `ddl`, `OLD_ROWS` rows in it) while 8 writers
/// insert: no insert fails, no id twice, each writer's ids increase
/// across the switch, every new id above every old one and on shard 0.
async fn adopt_under_writers(ddl: &str, t: &str) -> (PgServer, Topology, i64) {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(ddl).await.unwrap();
    c.execute(
        &format!("INSERT INTO {t} (body) SELECT 'old' FROM generate_series(1, $1::bigint)"),
        &[&OLD_ROWS],
    )
    .await
    .unwrap();

    let writers = Writers::start(&a, t).await;
    writers.wait_for(400).await;
    let done = pg::adopt(&topo, &table(t, false)).await.unwrap();
    writers.wait_for(400).await;
    let per_writer = writers.stop().await;

    assert_eq!(done.len(), 1, "{done:?}");
    let floor = done[0].floor.expect("old ids");
    assert!(!done[0].unchanged);
    let mut all = HashSet::new();
    let (mut old, mut new) = (0, 0);
    for ids in &per_writer {
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a writer's ids went back across the switch"
        );
        for &id in ids {
            assert!(all.insert(id), "id {id} handed out twice");
            if id <= floor {
                old += 1;
            } else {
                new += 1;
                let shard = pg::route::shard_of_id(topo.layout(), id).unwrap();
                assert_eq!(shard, 0, "id {id} is not of shard 0");
            }
        }
    }
    assert!(old > 0 && new > 0, "old {old}, new {new}");
    let row = c
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT id), max(id) FILTER (WHERE id <= $1),
                        min(id) FILTER (WHERE id > $1) FROM {t}"
            ),
            &[&floor],
        )
        .await
        .unwrap();
    let (rows, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(rows, distinct);
    assert_eq!(rows as usize, OLD_ROWS as usize + old + new);
    let (max_old, min_new): (i64, i64) = (row.get(2), row.get(3));
    assert_eq!(max_old, floor, "the floor is the largest old id");
    assert!(min_new > max_old);
    assert_eq!(
        default_of(&c, t).await,
        "shard0.next_id('shard0.id_seq'::regclass)"
    );
    // The default depends on the function: nothing can drop it under
    // the table, and pg_dump orders the function first.
    let depends: bool = c
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_depend d JOIN pg_attrdef ad ON ad.oid = d.objid
                              WHERE d.classid = 'pg_attrdef'::regclass AND ad.adrelid = $1::text::regclass
                                AND d.refobjid = 'shard0.next_id(regclass)'::regprocedure)",
            &[&t],
        )
        .await
        .unwrap()
        .get(0);
    assert!(depends, "the default records no dependency on next_id");

    // Again: nothing changes; check reports no problem and lists it.
    let again = pg::adopt(&topo, &table(t, false)).await.unwrap();
    assert!(again[0].unchanged, "{again:?}");
    assert_eq!(again[0].floor, Some(floor));
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    let listed = pg::adopted(&topo).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].before_adoption(floor) && !listed[0].before_adoption(min_new));
    (a, topo, floor)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bigserial_table_is_adopted_while_eight_writers_insert() {
    let (a, _topo, floor) = adopt_under_writers(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text)",
        "public.orders",
    )
    .await;
    // The old sequence is kept, where it was.
    let c = client(&a).await;
    let last: i64 = c
        .query_one("SELECT last_value FROM public.orders_id_seq", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(last, floor);
    // decode_id(id, table): an old id has no time, shard or sequence.
    let row = c
        .query_one(
            "SELECT (d).before_adoption, (d).shard IS NULL, (n).before_adoption, (n).shard
               FROM (SELECT shardflake.decode_id($1, 'public.orders') d,
                            shardflake.decode_id((SELECT max(id) FROM public.orders), 'public.orders') n) x",
            &[&floor],
        )
        .await
        .unwrap();
    let (old, no_shard, new, shard): (bool, bool, bool, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert!(old && no_shard && !new && shard == 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_table_is_adopted_while_eight_writers_insert() {
    let (a, _topo, floor) = adopt_under_writers(
        "CREATE TABLE public.items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text)",
        "public.items",
    )
    .await;
    // Dropping the identity drops its sequence: its copy is kept.
    let last: i64 = client(&a)
        .await
        .query_one(
            "SELECT last_value FROM public.items_id_seq_before_shardflake",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(last, floor);
}

/// The whole database dumped with `pg_dump` after adoption, restored with
/// `pg_restore` into a fresh server: no missing function, no "out of
/// bounds"; the restored shard refuses ids (SF003) until `pg repair`, as
/// any restored shard does, then the table keeps inserting, every id new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_database_restored_into_a_fresh_server_keeps_inserting() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let ca = client(&a).await;
    ca.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 1000)",
    )
    .await
    .unwrap();
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    let insert =
        "INSERT INTO public.orders (body) SELECT 'new' FROM generate_series(1, 500) RETURNING id";
    ca.query(insert, &[]).await.unwrap();

    let dir = std::env::temp_dir().join(format!("sf-adopt-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("a.dump");
    let port = a.port.to_string();
    let out = Command::new(a.program("pg_dump").unwrap())
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
    // Ids made on a after the dump: the restored copy must not make them again.
    let mut before: HashSet<i64> = ca
        .query("SELECT id FROM public.orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    before.extend(
        ca.query(insert, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>(0)),
    );
    let a_system: i64 = ca
        .query_one("SELECT system_identifier FROM pg_control_system()", &[])
        .await
        .unwrap()
        .get(0);
    drop(ca);
    a.stop();

    let b = PgServer::start().unwrap();
    let port = b.port.to_string();
    let out = Command::new(b.program("pg_restore").unwrap())
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
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "pg_restore: {out:?}");
    let cb = client(&b).await;
    let e = cb.query(insert, &[]).await.unwrap_err();
    assert!(
        matches!(
            e.as_db_error().map(|d| d.code().code()),
            Some(shardflake_db::SQLSTATE_RESTORED | shardflake_db::SQLSTATE_RESTARTED)
        ),
        "{}",
        shardflake_db::pg_message(&e)
    );
    let moved = topology(&b.url(), "");
    // b is another database than the one the records name: said so.
    let e = pg::repair(&moved, None).await.unwrap_err().to_string();
    assert!(e.contains("pg repair --replaces a"), "{e}");
    // a was stopped for good: the operator's word.
    pg::repair_replacing(
        &moved,
        None,
        &[pg::Replacement {
            server: "a".to_string(),
            old: pg::OldCopy::Gone(vec![a_system]),
        }],
    )
    .await
    .unwrap();
    let after: Vec<i64> = cb
        .query(insert, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let max_before = *before.iter().max().unwrap();
    assert!(
        after
            .iter()
            .all(|id| *id > max_before && !before.contains(id))
    );
    assert_eq!(problems(&pg::check(&moved).await.unwrap()), "");
    assert_eq!(pg::adopted(&moved).await.unwrap().len(), 1);
}

/// Each refusal names its fix, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_refuses_what_would_break_each_with_its_fix() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.small (id serial PRIMARY KEY, body text);
         CREATE TABLE public.huge (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.huge (id) VALUES (9000000000000000000);
         CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         CREATE TABLE public.lines (id bigserial PRIMARY KEY, order_id integer REFERENCES public.orders (id));
         CREATE TABLE public.plain (id bigint PRIMARY KEY, body text);
         CREATE TABLE public.ident (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, body text);
         CREATE TABLE public.shares (id bigint DEFAULT nextval('public.ident_id_seq'::regclass))",
    )
    .await
    .unwrap();
    let refusal = |t: &'static str| {
        let topo = topo.clone();
        async move {
            pg::adopt(&topo, &table(t, false))
                .await
                .expect_err(t)
                .to_string()
        }
    };
    let e = refusal("public.small").await;
    assert!(
        e.contains("is integer")
            && e.contains("ALTER TABLE public.small ALTER COLUMN id TYPE bigint"),
        "{e}"
    );
    let e = refusal("public.huge").await;
    assert!(
        e.contains("holds ids up to 9000000000000000000") && e.contains("renumber"),
        "{e}"
    );
    let e = refusal("public.orders").await;
    assert!(
        e.contains("public.lines.order_id (integer): ALTER TABLE public.lines ALTER COLUMN order_id TYPE bigint"),
        "{e}"
    );
    let e = refusal("public.plain").await;
    assert!(e.contains("has no sequence default"), "{e}");
    let e = refusal("public.ident").await;
    assert!(
        e.contains("sequence public.ident_id_seq is also used by default value for column id of table shares")
            && e.contains("make them use another sequence first"),
        "{e}"
    );
    let allow = topology(&a.url(), "sign_bit = \"allow\"\n");
    let e = pg::adopt(&allow, &table("public.orders", false))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("negative ids from 2046-06-27") && e.contains("sign_bit = \"refuse\""),
        "{e}"
    );
    for t in [
        "public.small",
        "public.huge",
        "public.orders",
        "public.shares",
    ] {
        assert!(default_of(&c, t).await.starts_with("nextval("), "{t}");
    }
    assert_eq!(
        default_of(&c, "public.ident").await,
        "none",
        "still an identity"
    );
    // A widened column is adopted: the refusal's fix works.
    c.batch_execute("ALTER TABLE public.lines ALTER COLUMN order_id TYPE bigint")
        .await
        .unwrap();
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
}

/// A dry run prints the SQL and changes nothing; a schema adopts every
/// table with a sequence default and skips the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_changes_nothing_and_a_schema_adopts_its_sequence_tables() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE SCHEMA app;
         CREATE TABLE app.orders (id bigserial PRIMARY KEY, body text);
         CREATE TABLE app.users (id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, body text);
         CREATE TABLE app.tags (id bigint PRIMARY KEY, body text);
         INSERT INTO app.orders (body) VALUES ('old');",
    )
    .await
    .unwrap();
    let schema = |dry_run| AdoptOptions {
        target: Target::Schema("app".into()),
        shard: Some(2),
        ..table("", dry_run)
    };
    let plan = pg::adopt(&topo, &schema(true)).await.unwrap();
    assert_eq!(plan.len(), 2, "{plan:?}");
    let script = plan[0].script();
    assert!(
        script.contains("LOCK TABLE app.orders IN ACCESS EXCLUSIVE MODE")
            && script.contains(
                "ALTER TABLE app.orders ALTER COLUMN id SET DEFAULT shard2.next_id('shard2.id_seq'::regclass)"
            ),
        "{script}"
    );
    assert!(plan[1].script().contains("DROP IDENTITY"), "{plan:?}");
    assert!(default_of(&c, "app.orders").await.starts_with("nextval("));
    let none: bool = c
        .query_one("SELECT to_regclass('shardflake.adopted') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(none, "a dry run recorded something");

    let done = pg::adopt(&topo, &schema(false)).await.unwrap();
    assert!(
        done.iter().all(|d| !d.unchanged && d.shard == 2),
        "{done:?}"
    );
    assert_eq!(done[0].floor, Some(1));
    assert_eq!(done[1].floor, None);
    assert!(
        pg::adopt(&topo, &schema(false))
            .await
            .unwrap()
            .iter()
            .all(|d| d.unchanged)
    );
}

/// The default changed back by hand: `pg check` says so and names the
/// command; adopting again counts the ids drawn meanwhile as old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_changed_back_by_hand_is_reported_and_adopted_again() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 10)",
    )
    .await
    .unwrap();
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    c.batch_execute(
        "INSERT INTO public.orders (body) VALUES ('new');
         ALTER TABLE public.orders ALTER COLUMN id SET DEFAULT nextval('public.orders_id_seq'::regclass);",
    )
    .await
    .unwrap();
    // The kept sequence is fenced at its value: it hands out no id.
    let e = c
        .execute("INSERT INTO public.orders (body) VALUES ('by hand')", &[])
        .await
        .expect_err("the kept sequence handed out an id");
    assert!(
        shardflake_db::pg_message(&e).contains("reached maximum value"),
        "{e}"
    );
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(
        said.contains("public.orders.id no longer draws from shard 0")
            && said.contains("pg adopt --table public.orders --shard 0"),
        "{said}"
    );
    let done = pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    assert_eq!(done[0].floor, Some(10), "{done:?}");
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    let listed = pg::adopted(&topo).await.unwrap();
    assert!(listed[0].before_adoption(10) && !listed[0].before_adoption(11));
}

/// The shard adopted tables draw from stays with them: its move is
/// refused (dropping the old copy would drop their defaults), another
/// shard moves; adopted onto another shard of the server, it moves too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shard_adopted_tables_draw_from_stays_until_they_draw_from_another() {
    use shardflake_db::pg::move_shard::{MoveOptions, move_shard};
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-adopt-move-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    std::fs::write(
        &path,
        format!(
            "layout = \"instagram\"\nshards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-3\"\n\
             [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"\"\n",
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    let topo = Topology::load(&path).unwrap();
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) VALUES ('old')",
    )
    .await
    .unwrap();
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    let e = move_shard(&path, 0, "b", &MoveOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("adopted tables on a draw their ids from shard 0 (public.orders.id)")
            && e.contains("--shard N")
            && !e.contains("objects outside"),
        "{e}"
    );
    move_shard(&path, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    let topo = Topology::load(&path).unwrap();
    let onto_1 = AdoptOptions {
        shard: Some(1),
        ..table("public.orders", false)
    };
    let done = pg::adopt(&topo, &onto_1).await.unwrap();
    assert!(!done[0].unchanged && done[0].shard == 1, "{done:?}");
    assert_eq!(done[0].floor, Some(1), "ids of shard 0 are not old ids");
    // Run again without --shard: it keeps shard 1.
    assert!(
        pg::adopt(&topo, &table("public.orders", false))
            .await
            .unwrap()[0]
            .unchanged
    );
    move_shard(&path, 0, "b", &MoveOptions::default())
        .await
        .unwrap();
    let id: i64 = c
        .query_one(
            "INSERT INTO public.orders (body) VALUES ('new') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let topo = Topology::load(&path).unwrap();
    assert_eq!(pg::route::shard_of_id(topo.layout(), id).unwrap(), 1);
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Operator fault: adopt run from two machines at once, on an identity
/// table and a bigserial one. Both succeed, one switches each table, the
/// other finds it switched; the record and the kept sequence are whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_run_twice_at_once_switches_each_table_once() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text);
         CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.items (body) SELECT 'old' FROM generate_series(1, 100);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 100);",
    )
    .await
    .unwrap();
    let opts = AdoptOptions {
        target: Target::Schema("public".into()),
        ..table("", false)
    };
    let (one, two) = tokio::join!(pg::adopt(&topo, &opts), pg::adopt(&topo, &opts));
    let (one, two) = (
        one.unwrap_or_else(|e| panic!("first: {e}")),
        two.unwrap_or_else(|e| panic!("second: {e}")),
    );
    for (x, y) in one.iter().zip(&two) {
        assert_eq!(x.table, y.table);
        assert_eq!(x.floor, Some(100), "{x:?}");
        assert_eq!(y.floor, Some(100), "{y:?}");
    }
    let listed = pg::adopted(&topo).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        listed[0].old_sequence.as_deref(),
        Some("public.items_id_seq_before_shardflake")
    );
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
}

/// Operator fault: the table's dump taken before adoption restored over
/// the adopted table (`pg_restore --clean`). Its old default and sequence
/// come back: `pg check` says so, adopt again switches it, and the ids
/// after that are above every id it ever handed out, those the restore
/// threw away included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pre_adoption_dump_restored_over_an_adopted_table_is_adopted_again() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 100)",
    )
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("sf-adopt-pre-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("orders.dump");
    let port = a.port.to_string();
    let conn = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let out = Command::new(a.program("pg_dump").unwrap())
        .args(conn)
        .args(["-Fc", "-t", "public.orders", "-f"])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    let insert =
        "INSERT INTO public.orders (body) SELECT 'x' FROM generate_series(1, 10) RETURNING id";
    let handed: Vec<i64> = c
        .query(insert, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let out = Command::new(a.program("pg_restore").unwrap())
        .args(conn)
        .args(["--clean", "-d", "postgres"])
        .arg(&dump)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");

    let c = client(&a).await;
    let after_restore: Vec<i64> = c
        .query(insert, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        after_restore.first(),
        Some(&101),
        "the old sequence is back"
    );
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(
        said.contains("public.orders.id no longer draws from shard 0")
            && said.contains("pg adopt --table public.orders"),
        "{said}"
    );
    let done = pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    assert_eq!(done[0].floor, Some(110), "{done:?}");
    let new: Vec<i64> = c
        .query(insert, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let most = *handed.iter().max().unwrap();
    assert!(new.iter().all(|&id| id > most), "{new:?} vs {most}");
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
}

/// Operator fault: adopt stopped between tables (the second one held by a
/// long transaction past the lock timeout, as a kill there would leave
/// it). The first is adopted, the second untouched, and the refusal says
/// to run it again; run again after the transaction ends, it adopts the
/// second and leaves the first as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_stopped_between_tables_is_finished_by_running_it_again() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE SCHEMA app;
         CREATE TABLE app.a_orders (id bigserial PRIMARY KEY, body text);
         CREATE TABLE app.b_items (id bigserial PRIMARY KEY, body text);
         INSERT INTO app.a_orders (body) VALUES ('old');
         INSERT INTO app.b_items (body) VALUES ('old');",
    )
    .await
    .unwrap();
    let mut holder = client(&a).await;
    let long = holder.transaction().await.unwrap();
    long.batch_execute("INSERT INTO app.b_items (body) VALUES ('held')")
        .await
        .unwrap();
    let opts = AdoptOptions {
        target: Target::Schema("app".into()),
        ..table("", false)
    };
    let e = pg::adopt(&topo, &opts).await.unwrap_err().to_string();
    assert!(
        e.contains("locking app.b_items") && e.contains("run pg adopt again"),
        "{e}"
    );
    // It says what it switched, and never that nothing was changed.
    assert!(
        e.contains("switched, and they stay switched:\n    a: app.a_orders.id draws from shard 0")
            && e.contains("not changed: a: app.b_items.id")
            && !e.contains("nothing was changed"),
        "{e}"
    );
    assert!(
        default_of(&c, "app.a_orders")
            .await
            .starts_with("shard0.next_id(")
    );
    assert!(default_of(&c, "app.b_items").await.starts_with("nextval("));
    long.commit().await.unwrap();
    let done = pg::adopt(&topo, &opts).await.unwrap();
    assert!(done[0].unchanged && !done[1].unchanged, "{done:?}");
    assert_eq!(done[1].floor, Some(2));
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
}

/// Two servers, `a` holding shards 0-3 and `b` none, in a topology file
/// of its own (moves write it); `pg apply` run.
async fn two_servers(name: &str) -> (PgServer, PgServer, std::path::PathBuf) {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-adopt-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    std::fs::write(
        &path,
        format!(
            "layout = \"instagram\"\nshards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-3\"\n\
             [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"\"\n",
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    pg::apply(&Topology::load(&path).unwrap()).await.unwrap();
    (a, b, path)
}

/// Operator fault (E-old): adopt run with the file from before a move
/// (generation 0, the servers record 1) is refused as apply refuses it,
/// naming the file to use, and the table is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_refuses_a_file_older_than_a_move() {
    use shardflake_db::pg::move_shard::{MoveOptions, move_shard};
    let (a, _b, path) = two_servers("old-file").await;
    let old = Topology::load(&path).unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) VALUES ('old')",
    )
    .await
    .unwrap();
    move_shard(&path, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    let onto_1 = AdoptOptions {
        shard: Some(1),
        ..table("public.orders", false)
    };
    let e = pg::adopt(&old, &onto_1).await.unwrap_err().to_string();
    assert!(
        e.contains("the file is generation 0, but the servers record generation 1")
            && e.contains("use the file of generation 1"),
        "{e}"
    );
    assert!(
        default_of(&c, "public.orders")
            .await
            .starts_with("nextval(")
    );
    // The file the move wrote adopts it.
    let done = pg::adopt(&Topology::load(&path).unwrap(), &onto_1)
        .await
        .unwrap();
    assert_eq!(done[0].shard, 1);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Operator fault (E11b): a default set by hand to a shard's next_id (the
/// ALTER that adopt --dry-run prints), and a view calling it, neither
/// recorded as adopted: moving the shard would drop them with its old
/// copy (`DROP SCHEMA ... CASCADE`). The move is refused, naming both and
/// the way out; the shard beside it moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_shard_refuses_a_shard_that_objects_outside_it_depend_on() {
    use shardflake_db::pg::move_shard::{MoveOptions, move_shard};
    let (a, _b, path) = two_servers("depends").await;
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigint PRIMARY KEY DEFAULT shard2.next_id('shard2.id_seq'::regclass), body text);
         CREATE VIEW public.next_on_2 AS SELECT shard2.next_id('shard2.id_seq'::regclass) AS id;",
    )
    .await
    .unwrap();
    let e = move_shard(&path, 2, "b", &MoveOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("default value for column id of table orders")
            && e.contains("view next_on_2")
            && e.contains("shardflake pg adopt --table T --shard N"),
        "{e}"
    );
    assert!(
        default_of(&c, "public.orders")
            .await
            .starts_with("shard2.next_id(")
    );
    c.execute("INSERT INTO public.orders (body) VALUES ('after')", &[])
        .await
        .unwrap();
    move_shard(&path, 3, "b", &MoveOptions::default())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}

/// Operator fault (E14): two adopts with different --shard at once, on a
/// bigserial and an identity table, the first table held by a writer's
/// open transaction until both runs wait. Adopts are serialised: both
/// succeed, and the one that ran second names the shard each table draws
/// from now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_adopts_onto_different_shards_at_once_run_one_after_the_other() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.a_orders (id bigserial PRIMARY KEY, body text);
         CREATE TABLE public.b_items (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text);
         INSERT INTO public.a_orders (body) SELECT 'old' FROM generate_series(1, 100);
         INSERT INTO public.b_items (body) SELECT 'old' FROM generate_series(1, 100);",
    )
    .await
    .unwrap();
    let mut holder = client(&a).await;
    let long = holder.transaction().await.unwrap();
    long.batch_execute("INSERT INTO public.a_orders (body) VALUES ('held')")
        .await
        .unwrap();
    let onto = |shard| AdoptOptions {
        target: Target::Schema("public".into()),
        shard: Some(shard),
        ..table("", false)
    };
    let (o1, o2) = (onto(1), onto(2));
    let runs = async { tokio::join!(pg::adopt(&topo, &o1), pg::adopt(&topo, &o2)) };
    let release = async {
        // Both runs wait: one for the table, the other for it or for the
        // deployment lock. Bounded.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE application_name = 'shardflake' AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if n >= 2 {
                break;
            }
            assert!(Instant::now() < deadline, "the adopts never both waited");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        long.commit().await.unwrap();
    };
    let ((one, two), ()) = tokio::join!(runs, release);
    let (one, two) = (
        one.unwrap_or_else(|e| panic!("--shard 1: {e}")),
        two.unwrap_or_else(|e| panic!("--shard 2: {e}")),
    );
    let mut now = Vec::new();
    for t in ["public.a_orders", "public.b_items"] {
        now.push(default_of(&c, t).await);
    }
    let names_now = |run: &[pg::Adopted]| {
        run.len() == 2
            && run
                .iter()
                .zip(&now)
                .all(|(x, d)| d.starts_with(&format!("shard{}.next_id(", x.shard)))
    };
    assert!(
        names_now(&one) || names_now(&two),
        "neither run names what the tables draw from now ({now:?}): {one:?} {two:?}"
    );
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
}

/// Operator fault, found by `shardflake-chaos db-adopt`: the dump from
/// before adoption restored over the adopted table, adopt run again as
/// the guide says, then the default changed back by hand. The restore set
/// the kept sequence back to its dump-time value, below ids the
/// application had written and been answered before adoption (thrown
/// away by the restore): the old sequence handed them out again (3,207
/// acknowledged twice in a 25 s chaos run). Adopt now keeps the largest
/// old id it recorded before and moves the kept sequence past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_put_back_after_a_pre_adoption_restore_repeats_no_id() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 100)",
    )
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("sf-adopt-back-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("orders.dump");
    let port = a.port.to_string();
    let conn = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let out = Command::new(a.program("pg_dump").unwrap())
        .args(conn)
        .args(["-Fc", "-t", "public.orders", "-f"])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let insert =
        "INSERT INTO public.orders (body) SELECT 'x' FROM generate_series(1, 20) RETURNING id";
    let ids = async |c: &Client| -> Vec<i64> {
        c.query(insert, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    // Answered before adoption, after the dump.
    let mut handed = ids(&c).await;
    assert_eq!(handed.last(), Some(&120));
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    handed.extend(ids(&c).await);
    let out = Command::new(a.program("pg_restore").unwrap())
        .args(conn)
        .args(["--clean", "-d", "postgres"])
        .arg(&dump)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{out:?}");
    let c = client(&a).await;
    let done = pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    assert_eq!(done[0].floor, Some(120), "{done:?}");
    let seq = done[0].old_sequence.clone().unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE public.orders ALTER COLUMN id SET DEFAULT nextval('{seq}'::regclass)"
    ))
    .await
    .unwrap();
    // Fenced past 120: it hands out none of the ids the restore threw
    // away, nor any other.
    match c.query(insert, &[]).await {
        Ok(rows) => {
            let again: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
            let repeated: Vec<&i64> = again.iter().filter(|id| handed.contains(id)).collect();
            panic!("the kept sequence handed out {again:?} (again: {repeated:?})");
        }
        Err(e) => assert!(
            shardflake_db::pg_message(&e).contains("reached maximum value"),
            "{e}"
        ),
    }
    assert!(
        problems(&pg::check(&topo).await.unwrap()).contains("public.orders.id no longer draws")
    );
}

/// `pg_dump -Fc -t table` of `s`'s `postgres` database into `dump`, or
/// `pg_restore --clean` of it.
fn dump_or_restore(s: &PgServer, restore: bool, dump: &std::path::Path) {
    let port = s.port.to_string();
    let conn = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres"];
    let out = if restore {
        Command::new(s.program("pg_restore").unwrap())
            .args(conn)
            .args(["--clean", "-d", "postgres"])
            .arg(dump)
            .output()
            .unwrap()
    } else {
        Command::new(s.program("pg_dump").unwrap())
            .args(conn)
            .args(["-Fc", "-t", "public.orders", "-f"])
            .arg(dump)
            .arg("postgres")
            .output()
            .unwrap()
    };
    assert!(out.status.success(), "{out:?}");
}

/// P4: after adoption the default set back on the kept sequence by hand,
/// then the dump from before adoption restored (`pg_restore --clean`) and
/// adopt run again, then the default set back again. Before, the first
/// hand-set default handed out ids past the old ones (1001-1500 in the
/// review), the restore threw those rows away and set the sequence back
/// to 1000, adopt recorded 1000 as the largest old id, and the second
/// hand-set default handed out 1001-1500 again. The kept sequence is now
/// fenced at adoption (`MAXVALUE` at its value): a default put back on it
/// fails instead of handing out ids, each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_put_back_by_hand_draws_no_id_from_the_fenced_sequence() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 1000)",
    )
    .await
    .unwrap();
    let dir = std::env::temp_dir().join(format!("sf-adopt-fence-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dump = dir.join("orders.dump");
    dump_or_restore(&a, false, &dump);
    let by_hand = "INSERT INTO public.orders (body) SELECT 'by hand' FROM generate_series(1, 500) RETURNING id";
    let put_back = "ALTER TABLE public.orders ALTER COLUMN id SET DEFAULT nextval('public.orders_id_seq'::regclass)";
    let mut handed: Vec<i64> = Vec::new();
    for round in 0..2 {
        if round == 1 {
            dump_or_restore(&a, true, &dump);
        }
        let c = client(&a).await;
        let done = pg::adopt(&topo, &table("public.orders", false))
            .await
            .unwrap();
        assert_eq!(done[0].floor, Some(1000), "{done:?}");
        c.batch_execute(put_back).await.unwrap();
        match c.query(by_hand, &[]).await {
            Ok(rows) => handed.extend(rows.iter().map(|r| r.get::<_, i64>(0))),
            Err(e) => assert!(
                shardflake_db::pg_message(&e).contains("reached maximum value"),
                "{e}"
            ),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let distinct: HashSet<i64> = handed.iter().copied().collect();
    assert!(
        handed.is_empty(),
        "the kept sequence handed out {} ids by hand, {} of them twice",
        handed.len(),
        handed.len() - distinct.len()
    );
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(said.contains("public.orders.id no longer draws"), "{said}");
}

/// P13: `--shard 3` without `--server`, shard 3 on server `b`, the table
/// on `a`. Before, each server drew from its own lowest shard when the
/// one asked for was not its own: the table was adopted onto shard 0 of
/// `a` without a word (`--dry-run` showed it too). Refused now, naming the
/// server that holds shard 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_the_tables_server_does_not_hold_is_refused() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let topo = Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-1\"\n\
         [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"2-3\"\n",
        a.url(),
        b.url()
    ))
    .unwrap();
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) VALUES ('old')",
    )
    .await
    .unwrap();
    for dry_run in [true, false] {
        let onto_3 = AdoptOptions {
            shard: Some(3),
            ..table("public.orders", dry_run)
        };
        match pg::adopt(&topo, &onto_3).await {
            Ok(done) => panic!("--shard 3 adopted (dry run {dry_run}): {done:?}"),
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains("the file puts shard 3 on server b")
                        && e.contains("(0-1) with --shard")
                        && e.contains("--server b"),
                    "{e}"
                );
            }
        }
    }
    assert!(
        default_of(&c, "public.orders")
            .await
            .starts_with("nextval(")
    );
    // One of its own shards: adopted.
    let onto_1 = AdoptOptions {
        shard: Some(1),
        ..table("public.orders", false)
    };
    assert_eq!(pg::adopt(&topo, &onto_1).await.unwrap()[0].shard, 1);
}

/// P5/P6: an id column with no primary key or unique index. Before, it
/// was adopted, and after the pre-adoption dump restored under writers
/// (the primary key's build failed on the rows stored twice) `pg adopt`
/// and `pg check` accepted the table. Adopt now refuses it with the
/// `ADD PRIMARY KEY` fix, and `check` reports an adopted table that lost
/// its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_column_without_a_unique_index_is_refused_and_reported() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial, body text);
         INSERT INTO public.orders (body) VALUES ('old');
         CREATE UNIQUE INDEX orders_id_partial ON public.orders (id) WHERE id > 100;",
    )
    .await
    .unwrap();
    match pg::adopt(&topo, &table("public.orders", false)).await {
        Ok(done) => panic!("a column without a unique index adopted: {done:?}"),
        Err(e) => {
            let e = e.to_string();
            assert!(
                e.contains("public.orders.id has no primary key or unique index")
                    && e.contains("ALTER TABLE public.orders ADD PRIMARY KEY (id)"),
                "{e}"
            );
        }
    }
    assert!(
        default_of(&c, "public.orders")
            .await
            .starts_with("nextval(")
    );
    // The fix it names works.
    c.batch_execute("ALTER TABLE public.orders ADD PRIMARY KEY (id)")
        .await
        .unwrap();
    pg::adopt(&topo, &table("public.orders", false))
        .await
        .unwrap();
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    // The key lost (a restore whose key build failed): reported.
    c.batch_execute("ALTER TABLE public.orders DROP CONSTRAINT orders_pkey")
        .await
        .unwrap();
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(
        said.contains("public.orders.id has no primary key or unique index")
            && said.contains("ALTER TABLE public.orders ADD PRIMARY KEY (id)"),
        "{said}"
    );
}

/// A table adopted by a version that left the kept sequence unfenced (as
/// `NO MAXVALUE` puts it back): adopt, run again, reports it unchanged and
/// fences it; a default put back then draws no id. A kept sequence the
/// operator dropped is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adopt_run_again_fences_a_kept_sequence_left_unfenced() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 10);
         CREATE TABLE public.items (id bigserial PRIMARY KEY, body text);",
    )
    .await
    .unwrap();
    for t in ["public.orders", "public.items"] {
        pg::adopt(&topo, &table(t, false)).await.unwrap();
    }
    c.batch_execute(
        "ALTER SEQUENCE public.orders_id_seq NO MAXVALUE;
         ALTER TABLE public.items ALTER COLUMN id DROP DEFAULT;
         DROP SEQUENCE public.items_id_seq;
         ALTER TABLE public.items ALTER COLUMN id SET DEFAULT shard0.next_id('shard0.id_seq'::regclass);",
    )
    .await
    .unwrap();
    let said = problems(&pg::check(&topo).await.unwrap());
    assert!(
        said.contains("the sequence public.orders_id_seq kept for adopted table public.orders.id is not fenced")
            && said.contains("run shardflake pg adopt --table public.orders --shard 0"),
        "{said}"
    );
    for t in ["public.orders", "public.items"] {
        let done = pg::adopt(&topo, &table(t, false)).await.unwrap();
        assert!(done[0].unchanged, "{done:?}");
    }
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");
    c.batch_execute(
        "ALTER TABLE public.orders ALTER COLUMN id SET DEFAULT nextval('public.orders_id_seq'::regclass)",
    )
    .await
    .unwrap();
    let e = c
        .execute("INSERT INTO public.orders (body) VALUES ('by hand')", &[])
        .await
        .expect_err("the kept sequence handed out an id");
    assert!(
        shardflake_db::pg_message(&e).contains("reached maximum value"),
        "{e}"
    );
}

/// Issue 39, the fence seen from a function body: after adopt, every
/// `nextval()` on the kept sequence fails, whoever calls it. Before, a
/// kept sequence made `CYCLE` (legal for an application's own sequence)
/// was fenced at `MAXVALUE` only, so its next `nextval()` wrapped round to
/// `MINVALUE`: a function handed out old id 1 again. The fence now sets
/// `NO CYCLE` too, and a kept sequence made to cycle again by hand is
/// reported by `pg check` and fenced by adopt run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_drawing_from_the_kept_sequence_gets_no_old_id() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url(), "");
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    c.batch_execute(
        "CREATE SEQUENCE public.orders_seq CYCLE;
         CREATE TABLE public.orders (id bigint PRIMARY KEY DEFAULT nextval('public.orders_seq'), body text);
         INSERT INTO public.orders (body) SELECT 'old' FROM generate_series(1, 1000);
         CREATE FUNCTION public.next_order_id() RETURNS bigint LANGUAGE plpgsql
           AS $$ BEGIN RETURN nextval('public.orders_seq'); END $$;
         CREATE TABLE public.items (id bigserial PRIMARY KEY, body text);
         INSERT INTO public.items (body) SELECT 'old' FROM generate_series(1, 10);
         CREATE FUNCTION public.next_item_id() RETURNS bigint LANGUAGE sql
           AS $$ SELECT nextval('public.items_id_seq') $$;",
    )
    .await
    .unwrap();
    let mut opts = table("public.orders", false);
    opts.target = Target::Schema("public".into());
    let done = pg::adopt(&topo, &opts).await.unwrap();
    assert_eq!(done.len(), 2, "{done:?}");
    let drawn = async |f: &str| c.query_one(&format!("SELECT public.{f}()"), &[]).await;
    for f in ["next_order_id", "next_item_id"] {
        match drawn(f).await {
            Ok(row) => panic!(
                "{f}() drew {} from the kept sequence after adopt",
                row.get::<_, i64>(0)
            ),
            Err(e) => assert!(
                shardflake_db::pg_message(&e).contains("reached maximum value"),
                "{f}(): {e}"
            ),
        }
    }
    assert_eq!(problems(&pg::check(&topo).await.unwrap()), "");

    // Changed by hand so that it hands out values again (made to cycle,
    // set back, its MAXVALUE raised): reported, and fenced by adopt again.
    for by_hand in [
        "ALTER SEQUENCE public.orders_seq CYCLE",
        "SELECT setval('public.orders_seq', 1, false)",
        "ALTER SEQUENCE public.orders_seq MAXVALUE 1000000",
    ] {
        c.batch_execute(by_hand).await.unwrap();
        let said = problems(&pg::check(&topo).await.unwrap());
        assert!(
            said.contains("kept for adopted table public.orders.id is not fenced"),
            "{by_hand}: {said}"
        );
        pg::adopt(&topo, &table("public.orders", false))
            .await
            .unwrap();
        let e = drawn("next_order_id").await.unwrap_err();
        assert!(
            shardflake_db::pg_message(&e).contains("reached maximum value"),
            "{by_hand}: {e}"
        );
        assert_eq!(problems(&pg::check(&topo).await.unwrap()), "", "{by_hand}");
    }
}
