//! `mysql adopt` on real MariaDB (issue 39, item 2): an existing
//! `AUTO_INCREMENT` table put under the one-statement ids while writers
//! insert, its dump loaded into a fresh server, each refusal, a second
//! run, and `mysql check` after the switch is undone by hand.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use shardflake::{Layout, preset};
use shardflake_db::mysql::{self, AdoptOptions, Names, Options, Tables};
use shardflake_testkit::MariaDbServer;

fn layout() -> Layout {
    preset::by_name("mysql-procedure").unwrap()
}

fn opts(table: &str) -> AdoptOptions {
    AdoptOptions {
        options: Options {
            names: Names::new(table, "user_id", &format!("generate_{table}_id")).unwrap(),
            locked: false,
            ..Options::default()
        },
        dry_run: false,
    }
}

/// `orders` as an application made it, with `rows` rows (ids 1..=rows).
async fn orders(c: &mut Conn, rows: u64) {
    c.query_drop(
        "CREATE TABLE orders (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT)",
    )
    .await
    .unwrap();
    if rows > 0 {
        c.query_drop(format!(
            "INSERT INTO orders (user_id, body) SELECT seq, 'old' FROM seq_1_to_{rows}"
        ))
        .await
        .unwrap();
    }
}

async fn trigger_count(c: &mut Conn) -> i64 {
    c.query_first("SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = 'orders'")
        .await
        .unwrap()
        .unwrap()
}

/// One writer: inserts as the application does (no id; the id from the
/// OK packet) until `stop`, then `after` more; every id, in order, or the
/// first error.
async fn writer(
    pool: Pool,
    user: i64,
    stop: Arc<AtomicBool>,
    after: usize,
) -> Result<Vec<i64>, String> {
    writer_into(pool, "orders", user, stop, after).await
}

/// [`writer`] into `table`.
async fn writer_into(
    pool: Pool,
    table: &'static str,
    user: i64,
    stop: Arc<AtomicBool>,
    after: usize,
) -> Result<Vec<i64>, String> {
    let mut c = pool.get_conn().await.map_err(|e| e.to_string())?;
    let mut ids = Vec::new();
    let mut extra = 0;
    while extra < after {
        if stop.load(Ordering::Relaxed) {
            extra += 1;
        }
        c.exec_drop(
            format!("INSERT INTO {table} (user_id, body) VALUES (?, 'new')"),
            (user,),
        )
        .await
        .map_err(|e| format!("insert {}: {e}", ids.len()))?;
        ids.push(c.last_insert_id().ok_or("no insert id")? as i64);
    }
    Ok(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopt_under_eight_writers_keeps_every_insert_and_sorts_new_after_old() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 20_000).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| tokio::spawn(writer(pool.clone(), 1000 + w, stop.clone(), 300)))
        .collect();
    // Each writer has inserted before the switch.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let n: i64 = c
            .query_first("SELECT COUNT(*) FROM orders WHERE body = 'new'")
            .await
            .unwrap()
            .unwrap();
        if n >= 800 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "writers too slow");
        tokio::task::yield_now().await;
    }
    let a = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    assert!(!a.unchanged);
    let floor = a.floor.unwrap();
    assert!(floor >= 20_800, "{a:?}");
    let mut all = HashSet::new();
    let mut new = 0;
    for w in writers {
        let ids = w.await.unwrap().expect("no insert fails");
        // Each writer's ids increase across the switch: its new ones sort
        // after its old ones.
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "{ids:?}");
        assert!(ids.last().unwrap() > &floor);
        for id in ids {
            assert!(all.insert(id), "id {id} twice");
            if id > floor {
                assert!(id >= a.first_new, "new id {id} below {}", a.first_new);
                new += 1;
            } else {
                assert!(id < a.first_new);
            }
        }
    }
    assert!(new >= 8 * 300);
    // Every row is there, none with an id twice; every new id above every
    // old one.
    let (rows, distinct, old_max, new_min): (i64, i64, i64, i64) = c
        .query_first(format!(
            "SELECT COUNT(*), COUNT(DISTINCT id), (SELECT MAX(id) FROM orders WHERE id <= {floor}), (SELECT MIN(id) FROM orders WHERE id > {floor}) FROM orders"
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rows, 20_000 + all.len() as i64);
    assert_eq!(rows, distinct);
    assert_eq!(old_max, floor);
    assert!(new_min >= a.first_new);
    assert!(
        mysql::check(&mut c, &layout(), &opts("orders").options)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn adopt_refuses_an_int_column_a_non_unique_id_and_ids_too_high() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    let refusal = async |c: &mut Conn, ddl: &str| -> String {
        c.query_drop("DROP TABLE IF EXISTS orders").await.unwrap();
        c.query_drop(ddl).await.unwrap();
        c.query_drop("INSERT INTO orders (user_id) VALUES (1), (2)")
            .await
            .unwrap();
        let e = mysql::adopt(c, &layout(), &opts("orders"))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(trigger_count(c).await, 0, "nothing changed: {e}");
        e
    };
    let e = refusal(
        &mut c,
        "CREATE TABLE orders (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT)",
    )
    .await;
    assert!(
        e.contains("ALTER TABLE `orders` MODIFY `id` BIGINT NOT NULL AUTO_INCREMENT"),
        "{e}"
    );
    let e = refusal(
        &mut c,
        "CREATE TABLE orders (id BIGINT NOT NULL AUTO_INCREMENT, user_id BIGINT, KEY (id))",
    )
    .await;
    assert!(e.contains("ALTER TABLE `orders` ADD UNIQUE (`id`)"), "{e}");
    c.query_drop("DROP TABLE orders").await.unwrap();
    orders(&mut c, 2).await;
    c.query_drop("INSERT INTO orders (id, user_id) VALUES (9223372036854775000, 3)")
        .await
        .unwrap();
    let e = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("holds ids up to 9223372036854775000")
            && e.contains("the first id layout mysql-procedure can make now"),
        "{e}"
    );
    assert_eq!(trigger_count(&mut c).await, 0);
    let mut wrong_key = opts("orders");
    wrong_key.options.names = Names::new("orders", "account_id", "generate_orders_id").unwrap();
    c.query_drop("DELETE FROM orders WHERE id > 100")
        .await
        .unwrap();
    let e = mysql::adopt(&mut c, &layout(), &wrong_key)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no column account_id") && e.contains("--key"),
        "{e}"
    );
}

#[tokio::test]
async fn adopt_twice_changes_nothing_and_check_sees_the_switch_undone() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 500).await;
    let mut dry = opts("orders");
    dry.dry_run = true;
    let plan = mysql::adopt(&mut c, &layout(), &dry).await.unwrap();
    assert_eq!(plan.floor, Some(500));
    assert!(
        plan.script.contains("LOCK TABLES `orders` WRITE"),
        "{}",
        plan.script
    );
    assert_eq!(trigger_count(&mut c).await, 0, "a dry run changes nothing");
    let first = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    assert!(!first.unchanged && first.floor == Some(500), "{first:?}");
    let second = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    assert!(second.unchanged, "{second:?}");
    assert_eq!(second.floor, Some(500));
    assert_eq!(second.first_new, first.first_new);
    let check = async |c: &mut Conn| {
        mysql::check(c, &layout(), &opts("orders").options)
            .await
            .unwrap()
    };
    assert!(check(&mut c).await.is_empty());
    let recorded = mysql::adopted(&mut c).await.unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].floor, Some(500));

    // An id made just now, then the switch undone by hand: the trigger
    // dropped, the counter put back. Adopting again at once is not refused
    // for that id (it is below every later draw of the sequence).
    c.query_drop("INSERT INTO orders (user_id, body) VALUES (1023, 'just now')")
        .await
        .unwrap();
    c.query_drop("DROP TRIGGER orders_id").await.unwrap();
    c.query_drop("ALTER TABLE orders AUTO_INCREMENT = 1")
        .await
        .unwrap();
    let problems = check(&mut c).await;
    assert!(
        problems
            .iter()
            .any(|p| p.contains("table orders was adopted")
                && p.contains("shardflake mysql adopt --table orders")),
        "{problems:?}"
    );
    // The way out check names.
    let again = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    assert!(!again.unchanged);
    assert!(check(&mut c).await.is_empty());
    let id: i64 = c
        .query_first("INSERT INTO orders (user_id, body) VALUES (5, 'x') RETURNING id")
        .await
        .unwrap()
        .unwrap();
    assert!(id >= again.first_new);
}

#[tokio::test]
async fn an_adopted_tables_dump_keeps_inserting_in_a_fresh_server_after_repair() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 1_000).await;
    mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    let mut before = Vec::new();
    for u in 0..50 {
        let id: i64 = c
            .query_first(format!(
                "INSERT INTO orders (user_id, body) VALUES ({u}, 'x') RETURNING id"
            ))
            .await
            .unwrap()
            .unwrap();
        before.push(id);
    }
    let out = std::process::Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", server.port))
        .args(["--triggers", "--routines", "--events", "app"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let file = std::env::temp_dir().join(format!("sf-myadopt-{}.sql", std::process::id()));
    std::fs::write(&file, &out.stdout).unwrap();

    let fresh = MariaDbServer::start_with("", None).unwrap();
    fresh.load(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let fpool = mysql::pool(&fresh.url()).unwrap();
    let mut f = fpool.get_conn().await.unwrap();
    let names = opts("orders").options;
    // The fresh server holds no high-water: refused until repair.
    let refused = f
        .query_drop("INSERT INTO orders (user_id, body) VALUES (1, 'before repair')")
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("shardflake"), "{refused}");
    // Nor does it record which shard values it makes ids for: the
    // server the dump came from may still make ids for all of them.
    let e = mysql::repair(&mut f, &layout(), &names)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("records no shard values") && e.contains("repair --shards 0-1023"),
        "{e}"
    );
    // Nor, with them, without proof that the server the dump came from
    // makes ids no more (it is named gone: the dump moved the table).
    let names = Options {
        shards: Some((0, 1023)),
        ..names
    };
    let e = mysql::repair(&mut f, &layout(), &names)
        .await
        .unwrap_err()
        .to_string();
    let was = server
        .sql("SELECT CONCAT(@@server_id, ':', @@port, ':', @@datadir)")
        .unwrap();
    assert!(e.contains(&format!("--old-server-gone '{was}'")), "{e}");
    let names = Options {
        old_server_gone: Some(was),
        ..names
    };
    mysql::repair(&mut f, &layout(), &names).await.unwrap();
    // The scheduler starts the repaired clock event's loop within a second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !mysql::clock_running(&mut f, &names.names).await.unwrap() {
        assert!(std::time::Instant::now() < deadline, "no clock loop");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let max_before = *before.iter().max().unwrap();
    for u in 0..50 {
        let id: i64 = f
            .query_first(format!(
                "INSERT INTO orders (user_id, body) VALUES ({u}, 'y') RETURNING id"
            ))
            .await
            .unwrap()
            .unwrap();
        assert!(id > max_before, "{id} at or below {max_before}");
    }
    let (rows, distinct): (i64, i64) = f
        .query_first("SELECT COUNT(*), COUNT(DISTINCT id) FROM orders")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((rows, distinct), (1_100, 1_100));
}

/// `mysql check` on a healthy adopted table while writers insert (an
/// outside review: "ids would repeat" on every check under 3 writers):
/// the check drew from the sequence, then read the largest stored id, so
/// rows drawn after its draw looked like ids at or above the sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_under_writers_sees_no_repeat_on_a_healthy_table() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 100).await;
    mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| tokio::spawn(writer(pool.clone(), 2000 + w, stop.clone(), 50)))
        .collect();
    for _ in 0..20 {
        let problems = mysql::check(&mut c, &layout(), &opts("orders").options)
            .await
            .unwrap();
        assert!(problems.is_empty(), "{problems:?}");
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.unwrap().expect("no insert fails");
    }
}

async fn triggers_in(c: &mut Conn, table: &str) -> i64 {
    c.exec_first(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() AND EVENT_OBJECT_TABLE = ?",
        (table,),
    )
    .await
    .unwrap()
    .unwrap()
}

/// `mysql adopt --schema` (and `--pattern`) while four writers insert into
/// each of two tables: one table the schema cannot adopt (an INT id) and
/// nothing changes; without it, both AUTO_INCREMENT tables are adopted
/// (no failed insert, no id twice, each table's new ids above its old
/// ones), the table without AUTO_INCREMENT is left alone, a second run
/// changes nothing, and check reports each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopt_a_schema_under_writers_adopts_each_auto_increment_table() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 5_000).await;
    c.query_drop(
        "CREATE TABLE items (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT);
         INSERT INTO items (user_id, body) SELECT seq, 'old' FROM seq_1_to_1000;
         CREATE TABLE notes (id BIGINT NOT NULL PRIMARY KEY, user_id BIGINT);
         CREATE TABLE small (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT)",
    )
    .await
    .unwrap();
    let schema = Tables::Schema("app".into());
    let mut all = opts("orders");
    let e = mysql::adopt_tables(&mut c, &layout(), &all, &schema)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nothing was changed")
            && e.contains("app.small: small.id is int(11)")
            && e.contains("ALTER TABLE `small` MODIFY `id` BIGINT"),
        "{e}"
    );
    for t in ["orders", "items", "small"] {
        assert_eq!(triggers_in(&mut c, t).await, 0, "{t}: {e}");
    }
    c.query_drop("DROP TABLE small").await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let table = if w % 2 == 0 { "orders" } else { "items" };
            (
                table,
                tokio::spawn(writer_into(
                    pool.clone(),
                    table,
                    3000 + w,
                    stop.clone(),
                    100,
                )),
            )
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let n: i64 = c
            .query_first("SELECT LEAST((SELECT COUNT(*) FROM orders WHERE body = 'new'), (SELECT COUNT(*) FROM items WHERE body = 'new'))")
            .await
            .unwrap()
            .unwrap();
        if n >= 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "writers too slow");
        tokio::task::yield_now().await;
    }
    all.dry_run = true;
    let plans = mysql::adopt_tables(&mut c, &layout(), &all, &schema)
        .await
        .unwrap();
    let planned: Vec<&str> = plans.iter().map(|a| a.table.as_str()).collect();
    assert_eq!(planned, ["items", "orders"], "{plans:?}");
    assert!(plans.iter().all(|a| a.script.contains("LOCK TABLES")));
    assert_eq!(
        triggers_in(&mut c, "orders").await,
        0,
        "a dry run changes nothing"
    );
    all.dry_run = false;
    let done = mysql::adopt_tables(&mut c, &layout(), &all, &schema)
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(done.len(), 2, "{done:?}");
    assert!(
        done.iter().all(|a| !a.unchanged && a.database == "app"),
        "{done:?}"
    );
    let mut seen = HashSet::new();
    for (table, w) in writers {
        let a = done.iter().find(|a| a.table == table).unwrap();
        let floor = a.floor.unwrap();
        let ids = w.await.unwrap().expect("no insert fails");
        assert!(ids.windows(2).all(|p| p[0] < p[1]), "{table}: {ids:?}");
        assert!(*ids.last().unwrap() >= a.first_new, "{table}: {ids:?}");
        for id in ids {
            assert!(seen.insert((table, id)), "{table}: id {id} twice");
            assert!(id <= floor || id >= a.first_new, "{table}: {id}");
        }
    }
    for t in ["orders", "items"] {
        let (rows, distinct): (i64, i64) = c
            .query_first(format!("SELECT COUNT(*), COUNT(DISTINCT id) FROM {t}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rows, distinct, "{t}");
    }
    assert_eq!(triggers_in(&mut c, "notes").await, 0);

    let again = mysql::adopt_tables(&mut c, &layout(), &all, &schema)
        .await
        .unwrap();
    assert!(again.iter().all(|a| a.unchanged), "{again:?}");
    let checked = mysql::check_tables(&mut c, &layout(), &all.options, &schema)
        .await
        .unwrap();
    assert_eq!(checked.len(), 2, "{checked:?}");
    for t in &checked {
        assert!(t.problems.is_empty(), "{t:?}");
        let a = done.iter().find(|a| a.table == t.table).unwrap();
        assert_eq!(t.adopted.as_ref().map(|r| r.floor), Some(a.floor), "{t:?}");
    }
    // A pattern selects by database.table; the session stays in app.
    let items = mysql::adopt_tables(&mut c, &layout(), &all, &Tables::Pattern("app.i%".into()))
        .await
        .unwrap();
    assert_eq!(items.len(), 1);
    assert!(items[0].table == "items" && items[0].unchanged, "{items:?}");
    let db: String = c.query_first("SELECT DATABASE()").await.unwrap().unwrap();
    assert_eq!(db, "app");
    // A table added later is reported as not adopted, with the command.
    c.query_drop(
        "CREATE TABLE later (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT)",
    )
    .await
    .unwrap();
    let checked = mysql::check_tables(&mut c, &layout(), &all.options, &schema)
        .await
        .unwrap();
    let later = checked.iter().find(|t| t.table == "later").unwrap();
    assert_eq!(
        later.problems,
        [
            "app.later.id is not adopted (it takes its ids from AUTO_INCREMENT): run shardflake mysql adopt --schema app"
        ]
    );
}

/// An adopted table's old ids have no time, shard or sequence: the SQL
/// `decode_id(id, table)` and the record say they are from before
/// adoption rather than decode them; a new id decodes, and an id of a
/// table that was not adopted decodes.
#[tokio::test]
async fn decode_id_says_an_old_id_is_from_before_adoption() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 500).await;
    let a = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    assert_eq!(a.floor, Some(500));
    let new: i64 = c
        .query_first("INSERT INTO orders (user_id, body) VALUES (1801, 'new') RETURNING id")
        .await
        .unwrap()
        .unwrap();
    let decode = async |c: &mut Conn, id: i64, table: &str| -> String {
        c.exec_first("SELECT decode_id(?, ?)", (id, table))
            .await
            .unwrap()
            .unwrap()
    };
    for old in [1, 250, 500] {
        assert_eq!(
            decode(&mut c, old, "orders").await,
            r#"{"before_adoption": true, "time": null, "shard": null, "sequence": null}"#
        );
    }
    let parts = shardflake::Id(new as u64).decode(&layout()).unwrap();
    let time: String = c
        .exec_first("SELECT CAST(id_time(?) AS CHAR)", (new,))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        decode(&mut c, new, "orders").await,
        format!(
            r#"{{"before_adoption": false, "time": "{time}", "shard": {}, "sequence": {}}}"#,
            1801 & 1023,
            parts.sequence
        )
    );
    assert_eq!(parts.field("shard"), Some(1801 & 1023));
    // The same small id of a table that was not adopted decodes.
    assert!(
        decode(&mut c, 250, "items")
            .await
            .starts_with(r#"{"before_adoption": false, "time": "2023-01-01 00:00:00.000""#)
    );
    let record = mysql::adopted(&mut c).await.unwrap();
    assert!(record[0].before_adoption(500) && !record[0].before_adoption(new));
}

/// Waits until connection `id` waits on a lock (a table's, a routine's;
/// bounded), then kills it.
async fn kill_when_waiting(c: &mut Conn, id: u32) {
    // adopt installs its sequence and clock event first (up to 3 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let waiting: Option<String> = c
            .exec_first(
                "SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = ? AND STATE LIKE 'Waiting for %metadata lock'",
                (id,),
            )
            .await
            .unwrap();
        if waiting.is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "adopt never waited on a lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    c.query_drop(format!("KILL CONNECTION {id}")).await.unwrap();
}

/// Operator fault: `mysql adopt` killed while it waits on a lock, at each
/// step where one is held (the table, held by a transaction; the record's
/// table, held by another session), then at moments spread over a run,
/// four writers inserting throughout, then run again: no insert fails, no
/// id twice, a switched table always has its record, and the record's
/// floor is the largest id from before adoption (a run killed between the
/// switch and its record left the floor unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn adopt_killed_at_each_lock_and_run_again_records_the_floor() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 1_000).await;
    // Another table adopted first: shardflake.adopted exists, to be held.
    c.query_drop(
        "CREATE TABLE items (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT)",
    )
    .await
    .unwrap();
    mysql::adopt(&mut c, &layout(), &opts("items"))
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| tokio::spawn(writer(pool.clone(), 4000 + w, stop.clone(), 50)))
        .collect();
    let mut holder = pool.get_conn().await.unwrap();
    for hold in [
        "START TRANSACTION; SELECT COUNT(*) FROM orders",
        "LOCK TABLES shardflake.adopted READ",
    ] {
        holder.query_drop(hold).await.unwrap();
        let mut run = pool.get_conn().await.unwrap();
        let id = run.id();
        let adopt = tokio::spawn(async move {
            mysql::adopt(&mut run, &layout(), &opts("orders"))
                .await
                .map_err(|e| e.to_string())
        });
        kill_when_waiting(&mut c, id).await;
        let e = adopt.await.unwrap().unwrap_err();
        holder.query_drop("COMMIT; UNLOCK TABLES").await.unwrap();
        // Killed before the switch, or after it with the record written:
        // either way the table's state and its record agree.
        let switched = triggers_in(&mut c, "orders").await == 1;
        let recorded = mysql::adopted(&mut c)
            .await
            .unwrap()
            .into_iter()
            .any(|a| a.table == "orders");
        assert!(!switched || recorded, "{hold}: switched, not recorded: {e}");
    }
    // Then killed at moments spread over its run (installing, waiting
    // for the clock event, switching), whatever step each falls in.
    for ms in [0, 20, 50, 100, 200, 400, 700, 1000, 1500] {
        let mut run = pool.get_conn().await.unwrap();
        let id = run.id();
        let adopt = tokio::spawn(async move {
            mysql::adopt(&mut run, &layout(), &opts("orders"))
                .await
                .map_err(|e| e.to_string())
        });
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        let _ = c.query_drop(format!("KILL CONNECTION {id}")).await;
        let _ = adopt.await.unwrap();
        let switched = triggers_in(&mut c, "orders").await == 1;
        let record = mysql::adopted(&mut c)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.table == "orders");
        assert!(
            !switched || record.as_ref().is_some_and(|r| r.floor.is_some()),
            "killed after {ms} ms: switched, record {record:?}"
        );
    }
    let a = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let mut all = HashSet::new();
    for w in writers {
        for id in w.await.unwrap().expect("no insert fails") {
            assert!(all.insert(id), "id {id} twice");
        }
    }
    let record = mysql::adopted(&mut c)
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.table == "orders")
        .unwrap();
    let old_max: i64 = c
        .query_first(format!(
            "SELECT MAX(id) FROM orders WHERE id < {}",
            a.first_new
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.floor, Some(old_max), "{record:?} {a:?}");
    let min_new: i64 = c
        .query_first(format!("SELECT MIN(id) FROM orders WHERE id > {old_max}"))
        .await
        .unwrap()
        .unwrap();
    assert!(min_new >= record.first_new, "{min_new} {record:?}");
    let again = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    assert!(again.unchanged && again.floor == Some(old_max), "{again:?}");
    let problems = mysql::check(&mut c, &layout(), &opts("orders").options)
        .await
        .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

/// M10: a dump from before adoption loaded over an adopted table brings
/// it back without its guard column, trigger and parked counter. `mysql
/// check` said "re-run apply" on two lines and "run shardflake mysql
/// adopt ... again" on another; apply does not switch the table back. For
/// an adopted table every line now names the adopt command.
#[tokio::test]
async fn a_pre_adoption_dump_over_an_adopted_table_is_checked_with_adopt_only() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 500).await;
    let out = std::process::Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", server.port))
        .args(["--triggers", "--routines", "--events", "app"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let file = std::env::temp_dir().join(format!("sf-m10-{}.sql", std::process::id()));
    std::fs::write(&file, &out.stdout).unwrap();
    mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    server.load(&file).unwrap();
    let _ = std::fs::remove_file(&file);
    let o = opts("orders").options;
    let problems = mysql::check(&mut c, &layout(), &o).await.unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("shardflake mysql adopt --table orders --key user_id again")),
        "{problems:?}"
    );
    assert!(
        !problems.iter().any(|p| p.contains("apply")),
        "an adopted table's check names apply: {problems:?}"
    );
    let again = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    assert!(!again.unchanged);
    assert_eq!(
        mysql::check(&mut c, &layout(), &o).await.unwrap(),
        Vec::<String>::new()
    );
}

/// M5: three `mysql adopt` runs at once all printed "draws from the
/// trigger"; the table was switched once. The runs that found it
/// switched under the lock now report it unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_adopts_at_once_switch_the_table_once() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 500).await;
    let run = || {
        let pool = pool.clone();
        async move {
            let mut c = pool.get_conn().await.unwrap();
            mysql::adopt(&mut c, &layout(), &opts("orders")).await
        }
    };
    let (a, b, d) = tokio::join!(run(), run(), run());
    let runs = [a.unwrap(), b.unwrap(), d.unwrap()];
    let switched = runs.iter().filter(|r| !r.unchanged).count();
    assert_eq!(switched, 1, "{runs:?}");
    assert!(runs.iter().all(|r| r.floor == Some(500)), "{runs:?}");
}

/// M12: `adopt --schema` over a table whose own name is too long for the
/// objects named after it advised a shorter --procedure, which cannot
/// help. Now that table gets advice that works (rename it, or leave it
/// out); one whose default procedure name alone is too long gets the
/// command with a shorter one.
#[tokio::test]
async fn adopt_schema_advises_what_works_for_long_table_names() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    let long = "t".repeat(50);
    let medium = "m".repeat(40);
    for t in [&long, &medium] {
        c.query_drop(format!(
            "CREATE TABLE {t} (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL)"
        ))
        .await
        .unwrap();
    }
    let e = mysql::adopt_tables(
        &mut c,
        &layout(),
        &opts("orders"),
        &Tables::Schema("app".into()),
    )
    .await
    .unwrap_err()
    .to_string();
    let line = |t: &str| {
        e.lines()
            .find(|l| l.contains(&format!("app.{t}:")))
            .unwrap_or_else(|| panic!("no line for {t}: {e}"))
            .to_string()
    };
    let l = line(&long);
    assert!(
        l.contains("rename the table") && !l.contains("--procedure"),
        "{l}"
    );
    let m = line(&medium);
    assert!(
        m.contains(&format!(
            "shardflake mysql adopt --table {medium} --procedure gen_{medium}_id"
        )),
        "{m}"
    );
    // The advice works: that command adopts it.
    let alone = AdoptOptions {
        options: Options {
            names: Names::new(&medium, "user_id", &format!("gen_{medium}_id")).unwrap(),
            locked: false,
            ..Options::default()
        },
        dry_run: false,
    };
    mysql::adopt(&mut c, &layout(), &alone).await.unwrap();
}

/// Issue 39, the switch undone by hand the whole way: the trigger
/// dropped, the guard's `CHECK` dropped too (so the application's inserts
/// go through again), `AUTO_INCREMENT` set back, rows inserted. `mysql
/// check` names `mysql adopt`; before, adopt failed every time
/// ("adding the guard column: CONSTRAINT `id_made_by_trigger` failed": the
/// rows inserted meanwhile have the guard's default 0), a dead end. Adopt
/// now marks those rows, which count as old ones, before it adds the
/// `CHECK` back.
#[tokio::test]
async fn adopt_again_after_the_guard_was_dropped_by_hand_switches_the_table() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 100).await;
    let first = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    c.query_drop(
        "DROP TRIGGER orders_id; ALTER TABLE orders DROP CONSTRAINT id_made_by_trigger; \
         ALTER TABLE orders AUTO_INCREMENT = 1",
    )
    .await
    .unwrap();
    let by_hand: Vec<i64> = c
        .query(
            "INSERT INTO orders (user_id, body) SELECT seq, 'by hand' FROM seq_1_to_5 RETURNING id",
        )
        .await
        .unwrap();
    assert_eq!(by_hand.len(), 5);
    let o = opts("orders").options;
    let problems = mysql::check(&mut c, &layout(), &o).await.unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("shardflake mysql adopt --table orders")),
        "{problems:?}"
    );
    let again = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap_or_else(|e| panic!("the adopt that check names failed: {e}"));
    assert!(!again.unchanged, "{again:?}");
    assert_eq!(again.floor, by_hand.iter().max().copied());
    assert!(again.first_new >= first.first_new);
    assert_eq!(
        mysql::check(&mut c, &layout(), &o).await.unwrap(),
        Vec::<String>::new()
    );
    let id: i64 = c
        .query_first("INSERT INTO orders (user_id, body) VALUES (5, 'new') RETURNING id")
        .await
        .unwrap()
        .unwrap();
    assert!(id >= again.first_new, "{id} < {}", again.first_new);
    // An insert without the trigger fails again.
    c.query_drop("DROP TRIGGER orders_id").await.unwrap();
    assert!(
        c.query_drop("INSERT INTO orders (user_id, body) VALUES (5, 'no trigger')")
            .await
            .is_err()
    );
}

/// Review 2b/2c: the trigger and the guard's `CHECK` dropped by hand,
/// the counter left parked: the first insert without the trigger takes
/// 2^63-1 (acknowledged), later ones fail ("Out of range"). `mysql check`
/// names `mysql adopt`, which refused ("holds ids up to
/// 9223372036854775807, at or above ..."), a dead end only `mysql apply`
/// got out of. Adopt now leaves that one row out of the old ids, as
/// `check` and `repair` do (ours makes that id only at the layout's very
/// last tick, for the last shard value), and switches the table back.
#[tokio::test]
async fn adopt_again_after_an_unguarded_insert_took_the_parked_id_switches_the_table() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    orders(&mut c, 100).await;
    mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap();
    let made: i64 = c
        .query_first("INSERT INTO orders (user_id, body) VALUES (7, 'new') RETURNING id")
        .await
        .unwrap()
        .unwrap();
    c.query_drop("DROP TRIGGER orders_id; ALTER TABLE orders DROP CONSTRAINT id_made_by_trigger")
        .await
        .unwrap();
    let parked: i64 = c
        .query_first("INSERT INTO orders (user_id, body) VALUES (7, 'unguarded') RETURNING id")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(parked, i64::MAX);
    let e = c
        .query_drop("INSERT INTO orders (user_id, body) VALUES (7, 'unguarded')")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("Out of range"), "{e}");
    let o = opts("orders").options;
    let problems = mysql::check(&mut c, &layout(), &o).await.unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("shardflake mysql adopt --table orders")),
        "{problems:?}"
    );
    let again = mysql::adopt(&mut c, &layout(), &opts("orders"))
        .await
        .unwrap_or_else(|e| panic!("the adopt that check names failed: {e}"));
    assert!(!again.unchanged, "{again:?}");
    assert_eq!(again.floor, Some(made));
    assert_eq!(
        mysql::check(&mut c, &layout(), &o).await.unwrap(),
        Vec::<String>::new()
    );
    let id: i64 = c
        .query_first("INSERT INTO orders (user_id, body) VALUES (7, 'new') RETURNING id")
        .await
        .unwrap()
        .unwrap();
    assert!(id > made && id >= again.first_new, "{id}");
    // An insert without the trigger fails again.
    c.query_drop("DROP TRIGGER orders_id").await.unwrap();
    assert!(
        c.query_drop("INSERT INTO orders (user_id, body) VALUES (7, 'no trigger')")
            .await
            .is_err()
    );
}
