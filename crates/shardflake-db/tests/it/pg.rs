//! Against real PostgreSQL servers started by the test (and stopped on drop).

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use shardflake::{Id, preset};
use shardflake_db::pg::{self, Router, Topology, route};
use shardflake_testkit::PgServer;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn topology(servers: &[(&str, &PgServer, &str)], shards: u64) -> String {
    let mut t = format!("layout = \"instagram\"\nshards = {shards}\n");
    for (name, s, list) in servers {
        t.push_str(&format!(
            "[[servers]]\nname = \"{name}\"\nurl = \"{}\"\nshards = \"{list}\"\n",
            s.url()
        ));
    }
    t.push_str(
        "[[tables]]\nname = \"posts\"\nsql = \"\"\"CREATE TABLE {schema}.posts (\n  id bigint PRIMARY KEY DEFAULT {next_id},\n  user_id bigint NOT NULL,\n  body text,\n  backend int NOT NULL DEFAULT pg_backend_pid(),\n  at timestamptz NOT NULL DEFAULT clock_timestamp())\"\"\"\n",
    );
    t
}

/// A server that allows 10 + 4 sessions, with one logical shard of a layout
/// of only 6 sequence bits (64 ids per ms per shard-table, catch-up gap 16)
/// applied to it.
async fn narrow_shard() -> (PgServer, Topology) {
    let a =
        PgServer::start_with(&[("max_connections", "10"), ("max_worker_processes", "4")]).unwrap();
    let spec = "narrow: time 41 | shard 13 | sequence 6 (epoch 1314220021721 ms)";
    let text = topology(&[("a", &a, "0")], 1).replace("\"instagram\"", &format!("{spec:?}"));
    let topo = Topology::parse(&text).unwrap();
    pg::apply(&topo).await.unwrap();
    (a, topo)
}

async fn client(s: &PgServer) -> tokio_postgres::Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_agree_between_sql_and_rust_and_never_repeat() {
    let a = PgServer::start().unwrap();
    let topo = Topology::parse(&topology(&[("a", &a, "0-3")], 4)).unwrap();
    let first = pg::apply(&topo).await.unwrap();
    assert_eq!(first[0].tables_created, 4);
    let again = pg::apply(&topo).await.unwrap();
    assert_eq!(again[0].tables_created, 0, "apply is idempotent");
    assert!(pg::check(&topo).await.unwrap().is_empty());

    let layout = preset::by_name("instagram").unwrap();
    let router = Router::new(topo.clone());
    // SQL-made ids decode in Rust to the right shard and time.
    for key in [0u64, 1, 2, 3, 31341, 1 << 40] {
        let before = now_ms();
        let id = router
            .insert(
                key,
                "INSERT INTO {schema}.posts (user_id, body) VALUES ($1, 'x') RETURNING id",
                &[&(key as i64)],
            )
            .await
            .unwrap();
        let after = now_ms();
        assert!(id > 0);
        let parts = Id(id as u64).decode(&layout).unwrap();
        assert_eq!(parts.field("shard"), Some(key % 4));
        assert!(
            // the id's time may lag the clock by up to LAG + GAP (see sql.rs)
            parts.unix_ms + shardflake_db::pg::sql::LAG_MS + 2 >= before && parts.unix_ms <= after,
            "{} not in [{before}, {after}]",
            parts.unix_ms
        );
        assert_eq!(router.locate(id).unwrap(), router.route(key).unwrap());
    }

    // Rust-composed ids decode in SQL; SQL-made ids decode identically in both.
    let c = client(&a).await;
    for (ms, shard, seq) in [
        (1_314_220_021_721 + 1_387_263_000, 1341u64, 5001u64 % 1024),
        (now_ms(), 3, 0),
        (now_ms(), 8191, 1023),
        // The last positive tick of the layout.
        (1_314_220_021_721 + (1u64 << 40) - 1, 7, 9),
    ] {
        let id = layout
            .compose(ms, &layout.nodes(&[("shard", shard)]).unwrap(), seq)
            .unwrap();
        let row = c
            .query_one(
                "SELECT unix_ms, shard, sequence, (extract(epoch from ts) * 1000)::bigint FROM shardflake.decode_id($1)",
                &[&id.as_i64()],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0) as u64, ms);
        assert_eq!(row.get::<_, i32>(1) as u64, shard);
        assert_eq!(row.get::<_, i32>(2) as u64, seq);
        assert_eq!(row.get::<_, i64>(3) as u64, ms);
    }
    let rows = c
        .query(
            "SELECT id, (d).unix_ms, (d).shard, (d).sequence FROM (SELECT id, shardflake.decode_id(id) d FROM shard2.posts) x",
            &[],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty());
    for r in rows {
        let p = Id(r.get::<_, i64>(0) as u64).decode(&layout).unwrap();
        assert_eq!(p.unix_ms as i64, r.get::<_, i64>(1));
        assert_eq!(p.field("shard").unwrap() as i32, r.get::<_, i32>(2));
        assert_eq!(p.sequence as i32, r.get::<_, i32>(3));
    }

    // 20,000 ids from one shard-table in one statement: strictly increasing.
    let burst: Vec<i64> = c
        .query(
            "SELECT shard1.next_id('shard1.id_seq'::regclass) FROM generate_series(1, 20000) g ORDER BY g",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(burst.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
    for id in &burst {
        assert_eq!(
            Id(*id as u64).decode(&layout).unwrap().field("shard"),
            Some(1)
        );
    }
    // The integer-overflow trap: a literal shifted as integer overflows; our
    // functions only shift bigints, so this is shown on the seed's pattern.
    let wrapped: i32 = c
        .query_one("SELECT 1992325551 << 23", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(wrapped, -679_477_248);
}

/// A layout with only 6 sequence bits (64 ids per ms per shard-table), so a
/// single statement easily asks for more ids per ms than the field holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_ids_per_tick_than_the_sequence_holds_borrow_the_next_tick() {
    // next_id's no-repeat argument needs fewer sessions than 64 / 4.
    let (a, topo) = narrow_shard().await;
    let c = client(&a).await;
    let ids: Vec<i64> = c
        .query(
            "SELECT shard0.next_id('shard0.id_seq'::regclass) FROM generate_series(1, 20000) g ORDER BY g",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "strictly increasing, so no repeat"
    );
    let layout = topo.layout();
    let ticks: HashSet<u64> = ids
        .iter()
        .map(|id| Id(*id as u64).decode(layout).unwrap().tick)
        .collect();
    assert!(ticks.len() >= 20000 / 64, "each tick holds at most 64 ids");
    // Instagram's arithmetic (nextval % 2^bits, clock time) in the same burst repeats ids.
    c.batch_execute("CREATE SEQUENCE s").await.unwrap();
    let repeated: i64 = c
        .query_one(
            "SELECT count(*) - count(DISTINCT id) FROM (
               SELECT ((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - 1314220021721) << 19)
                      | (nextval('s') % 64) AS id FROM generate_series(1, 100000)) x",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(repeated > 0, "Instagram's wrap-around repeats ids");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_burst_into_one_shard_table() {
    let a = PgServer::start().unwrap();
    let topo = Topology::parse(&topology(&[("a", &a, "0-1")], 2)).unwrap();
    pg::apply(&topo).await.unwrap();
    let dir = std::env::temp_dir().join(format!("sf-pgbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("insert.sql");
    std::fs::write(&script, "INSERT INTO shard1.posts (user_id) VALUES (1);\n").unwrap();
    let start = now_ms();
    let out = Command::new(a.program("pgbench").unwrap())
        .args([
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            &a.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-c", "32", "-j", "2", "-t", "500", "-M", "prepared", "-f"])
        .arg(&script)
        .arg("postgres")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let end = now_ms();
    let c = client(&a).await;
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT id), min((shardflake.decode_id(id)).unix_ms), max((shardflake.decode_id(id)).unix_ms) FROM shard1.posts",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 32 * 500);
    assert_eq!(row.get::<_, i64>(1), 32 * 500, "no duplicate id");
    assert!(row.get::<_, i64>(2) as u64 + 4 >= start);
    assert!(row.get::<_, i64>(3) as u64 <= end + 2);
    // Each client's ids increase with its insert time, and no id's time is
    // later than the row's clock_timestamp() (evaluated after the id).
    let bad: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT id, lag(id) OVER (PARTITION BY backend ORDER BY at) prev,
                    (shardflake.decode_id(id)).unix_ms AS ms, (extract(epoch from at) * 1000)::bigint AS at_ms
               FROM shard1.posts) x
              WHERE prev >= id OR ms > at_ms + 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bad, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_puts_every_key_on_its_server() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let topo = Topology::parse(&topology(&[("a", &a, "0-4"), ("b", &b, "5-7")], 8)).unwrap();
    pg::apply(&topo).await.unwrap();
    let router = Router::new(topo.clone());
    let mut ids = Vec::new();
    for key in 0..200u64 {
        let id = router
            .insert(
                key,
                "INSERT INTO {schema}.posts (user_id) VALUES ($1) RETURNING id",
                &[&(key as i64)],
            )
            .await
            .unwrap();
        ids.push((key, id));
    }
    let (ca, cb) = (client(&a).await, client(&b).await);
    for (key, id) in ids {
        let r = route::route_key(&topo, key).unwrap();
        assert_eq!(r.shard, key % 8);
        assert_eq!(r.server, if key % 8 < 5 { "a" } else { "b" });
        assert_eq!(router.locate(id).unwrap(), r);
        let q = format!("SELECT user_id FROM {}.posts WHERE id = $1", r.schema);
        let (here, there) = if r.server == "a" {
            (&ca, &cb)
        } else {
            (&cb, &ca)
        };
        assert_eq!(
            here.query_one(&q, &[&id]).await.unwrap().get::<_, i64>(0),
            key as i64
        );
        let elsewhere = there.query(&q, &[&id]).await;
        assert!(elsewhere.map(|r| r.is_empty()).unwrap_or(true));
        let by_id = router
            .query_id(
                id,
                "SELECT user_id FROM {schema}.posts WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        assert_eq!(by_id[0].get::<_, i64>(0), key as i64);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn move_shard_under_concurrent_writes_loses_nothing_and_reuses_no_id() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-move-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("topology.toml");
    std::fs::write(&path, topology(&[("a", &a, "0-3"), ("b", &b, "4-7")], 8)).unwrap();
    let topo = Topology::load(&path).unwrap();
    pg::apply(&topo).await.unwrap();
    // Rows that exist before the move, some updated and deleted during it.
    let ca = client(&a).await;
    ca.batch_execute(
        "INSERT INTO shard3.posts (user_id, body) SELECT 3, 'old' FROM generate_series(1, 5000)",
    )
    .await
    .unwrap();

    let router = Arc::new(Router::from_file(&path).unwrap());
    let inserted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (router, inserted, stopped) = (router.clone(), inserted.clone(), stopped.clone());
        writers.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            let mut i = 0u64;
            while !stopped.load(Ordering::Acquire) {
                // Keys of shard 3 (3, 11, 19, ...) and, every 4th, of shard 6.
                let key = if i % 4 == 3 { 6 + 8 * i } else { 3 + 8 * (w * 1_000_000 + i) };
                let id = router
                    .insert(
                        key,
                        "INSERT INTO {schema}.posts (user_id, body) VALUES ($1, 'new') RETURNING id",
                        &[&(key as i64)],
                    )
                    .await
                    .unwrap();
                mine.push((key, id));
                inserted.fetch_add(1, Ordering::AcqRel);
                i += 1;
            }
            mine
        }));
    }
    let wait_for = |n: u64| {
        let inserted = inserted.clone();
        async move {
            while inserted.load(Ordering::Acquire) < n {
                tokio::task::yield_now().await;
            }
        }
    };
    wait_for(500).await;
    // Concurrent updates and deletes on the moving shard, done before the pause.
    ca.batch_execute("UPDATE shard3.posts SET body = 'updated' WHERE id % 10 = 0 AND body = 'old'; DELETE FROM shard3.posts WHERE id % 10 = 1 AND body = 'old'")
        .await
        .unwrap();
    let before = ca
        .query_one(
            "SELECT count(*) FILTER (WHERE body IN ('old', 'updated')), count(*) FILTER (WHERE body = 'updated') FROM shard3.posts",
            &[],
        )
        .await
        .unwrap();
    let (old_rows, updated_rows): (i64, i64) = (before.get(0), before.get(1));
    assert!(old_rows < 5000 && updated_rows > 0);
    let seq_before: i64 = ca
        .query_one("SELECT last_value FROM shard3.id_seq", &[])
        .await
        .unwrap()
        .get(0);
    let report = shardflake_db::pg::move_shard::move_shard(&path, 3, "b", &Default::default())
        .await
        .unwrap();
    assert_eq!(report.from, "a");
    assert!(report.dropped_source);
    let after_move = inserted.load(Ordering::Acquire);
    wait_for(after_move + 500).await;
    stopped.store(true, Ordering::Release);
    stop.notify_waiters();
    let mut all = Vec::new();
    for w in writers {
        all.extend(w.await.unwrap());
    }

    let moved = Topology::load(&path).unwrap();
    assert_eq!(moved.server_of(3).unwrap().name, "b");
    assert!(
        pg::check(&moved).await.unwrap().is_empty(),
        "{:?}",
        pg::check(&moved).await
    );
    let cb = client(&b).await;
    // Every acknowledged row is on its shard's (new) server; no id repeats.
    let unique: HashSet<i64> = all.iter().map(|(_, id)| *id).collect();
    assert_eq!(unique.len(), all.len(), "an id was handed out twice");
    let mut on_b: HashSet<i64> = HashSet::new();
    for schema in ["shard3", "shard6"] {
        for r in cb
            .query(&format!("SELECT id FROM {schema}.posts"), &[])
            .await
            .unwrap()
        {
            assert!(on_b.insert(r.get(0)), "duplicate id across shards");
        }
    }
    for (key, id) in &all {
        assert!(on_b.contains(id), "row of key {key} (id {id}) lost");
    }
    let stats = cb
        .query_one(
            "SELECT count(*) FILTER (WHERE body = 'old'), count(*) FILTER (WHERE body = 'updated'),
                    count(*) FILTER (WHERE body = 'new' AND user_id % 8 = 3) FROM shard3.posts",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(stats.get::<_, i64>(0) + stats.get::<_, i64>(1), old_rows);
    assert_eq!(stats.get::<_, i64>(1), updated_rows);
    let shard3_new = all.iter().filter(|(k, _)| k % 8 == 3).count() as i64;
    assert_eq!(stats.get::<_, i64>(2), shard3_new);
    // The sequence moved with the shard: ids made after the move are above
    // every id made before it.
    let seq_after: i64 = cb
        .query_one("SELECT last_value FROM shard3.id_seq", &[])
        .await
        .unwrap()
        .get(0);
    assert!(seq_after > seq_before);
    let gone: bool = ca
        .query_one("SELECT to_regnamespace('shard3') IS NULL", &[])
        .await
        .unwrap()
        .get(0);
    assert!(gone, "old copy dropped after verification");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_drift_and_dead_servers_give_clear_errors() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let topo = Topology::parse(&topology(&[("a", &a, "0-1"), ("b", &b, "2-3")], 4)).unwrap();
    pg::apply(&topo).await.unwrap();
    let ca = client(&a).await;
    ca.batch_execute("DROP SCHEMA shard1 CASCADE")
        .await
        .unwrap();
    // shard0's function rebuilt for shard 2 (a hand edit / wrong deploy)
    let other = shardflake_db::pg::sql::shard_ddl(
        topo.layout(),
        "shard0",
        2,
        Default::default(),
        shardflake_db::pg::sql::SeqOid::ByName,
    )
    .unwrap();
    ca.batch_execute(&other).await.unwrap();
    ca.batch_execute("CREATE SCHEMA shard3").await.unwrap();
    let drift: Vec<String> = pg::check(&topo)
        .await
        .unwrap()
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert!(
        drift
            .iter()
            .any(|d| d.starts_with("a: shard 1: schema shard1 is missing")),
        "{drift:?}"
    );
    assert!(
        drift
            .iter()
            .any(|d| d.starts_with("a: shard 0: shard0.next_id() was built for \"v4; shard=2")),
        "{drift:?}"
    );
    assert!(
        drift
            .iter()
            .any(|d| d.contains("unexpected schema shard3 (topology puts it on \"b\")")),
        "{drift:?}"
    );
    // apply refuses to rebuild a live shard's function for another shard.
    let e = pg::apply(&topo).await.unwrap_err().to_string();
    assert!(e.contains("refusing to rebuild a live shard"), "{e}");

    // A dead server: apply fails with the server named, check reports it.
    b.stop();
    let topo2 = Topology::parse(&topology(&[("b", &b, "0-3")], 4)).unwrap();
    let e = pg::apply(&topo2).await.unwrap_err().to_string();
    assert!(e.starts_with("cannot connect to server \"b\""), "{e}");
    let drift = pg::check(&topo2).await.unwrap();
    assert!(
        drift[0]
            .to_string()
            .starts_with("b: unreachable: cannot connect"),
        "{drift:?}"
    );
}

/// `CREATE SEQUENCE IF NOT EXISTS` keeps an existing sequence's options:
/// apply sets the ones next_id needs, check reports others; and the session
/// limit the no-repeat argument needs is enforced by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequence_options_and_session_limit_are_checked_and_fixed() {
    let a = PgServer::start().unwrap();
    let topo = Topology::parse(&topology(&[("a", &a, "0-1")], 2)).unwrap();
    let ca = client(&a).await;
    // A sequence made before apply with a cache, and one altered after it.
    ca.batch_execute("CREATE SCHEMA shard0; CREATE SEQUENCE shard0.id_seq CACHE 20 CYCLE")
        .await
        .unwrap();
    pg::apply(&topo).await.unwrap();
    assert!(pg::check(&topo).await.unwrap().is_empty());
    let fixed = ca
        .query_one(
            "SELECT cache_size, cycle, max_value FROM pg_sequences WHERE schemaname = 'shard0' AND sequencename = 'id_seq'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(fixed.get::<_, i64>(0), 1);
    assert!(!fixed.get::<_, bool>(1));
    assert_eq!(fixed.get::<_, i64>(2), ((1i64 << 40) << 10) - 1);
    ca.batch_execute("ALTER SEQUENCE shard1.id_seq INCREMENT 2")
        .await
        .unwrap();
    let drift: Vec<String> = pg::check(&topo)
        .await
        .unwrap()
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert!(
        drift[0].starts_with("a: shard 1: sequence shard1.id_seq has INCREMENT 2 CACHE 1 NO CYCLE"),
        "{drift:?}"
    );
    pg::apply(&topo).await.unwrap();
    assert!(pg::check(&topo).await.unwrap().is_empty());

    // Functions of an older generator version are rebuilt by apply.
    let meta = shardflake_db::pg::sql::shard_meta(topo.layout(), 0, Default::default());
    let old = meta.replacen(&format!("v{}", shardflake_db::pg::sql::VERSION), "v1", 1);
    ca.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION shard0.shardflake_meta() RETURNS text LANGUAGE sql IMMUTABLE AS $f$ SELECT '{old}'::text $f$"
    ))
    .await
    .unwrap();
    assert_eq!(pg::check(&topo).await.unwrap().len(), 1);
    pg::apply(&topo).await.unwrap();
    assert!(pg::check(&topo).await.unwrap().is_empty());

    // 6 sequence bits: GAP is 16, and this server allows 10 + 8 sessions.
    let spec = "narrow: time 41 | shard 13 | sequence 6 (epoch 1314220021721 ms)";
    let narrow = Topology::parse(
        &topology(&[("a", &a, "0-1")], 2).replace("\"instagram\"", &format!("{spec:?}")),
    )
    .unwrap();
    let b = PgServer::start_with(&[("max_connections", "10")]).unwrap();
    let narrow_b = Topology::parse(
        &topology(&[("b", &b, "0-1")], 2).replace("\"instagram\"", &format!("{spec:?}")),
    )
    .unwrap();
    let e = pg::apply(&narrow_b).await.unwrap_err().to_string();
    assert!(
        e.contains("max_connections = 10 + max_worker_processes = 8")
            && e.contains("fewer than 16 sessions"),
        "{e}"
    );
    let drift = pg::check(&narrow).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.shard.is_none() && d.problem.contains("max_connections = 200")),
        "{drift:?}"
    );
}

/// Waits until the narrow layout's packed clock is more than `far` ahead of
/// `shard0.id_seq`.
async fn clock_overtakes_sequence(c: &tokio_postgres::Client, far: i64) {
    loop {
        let behind: i64 = c
            .query_one(
                "SELECT ((floor(date_part('epoch', clock_timestamp()) * 1000)::bigint - 1314220021721) << 6) - last_value FROM shard0.id_seq",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if behind > far {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Borrowing under concurrency: 6 sequence bits (64 ids per ms per
/// shard-table, GAP 16) on a server that allows 10 + 4 sessions. In each
/// round 9 sessions burst far more than 64 ids per ms into one table at once
/// (the sequence runs ahead of the clock), then wait until the clock has
/// overtaken the sequence by more than LAG + GAP, so the next burst starts
/// with catch-ups racing the other sessions' draws. The primary key refuses
/// a repeated id (the insert fails); the distinct count checks it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn borrowing_under_concurrency_never_repeats() {
    let (a, topo) = narrow_shard().await;
    let far = shardflake_db::pg::sql::lag_tolerance(topo.layout())
        + shardflake_db::pg::sql::catch_up_gap(topo.layout());
    let (sessions, rounds, burst) = (9usize, 8, 400);
    let barrier = Arc::new(tokio::sync::Barrier::new(sessions));
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let (url, barrier) = (a.url(), barrier.clone());
        tasks.spawn(async move {
            let c = pg::connect_url("test", &url).await.unwrap();
            for _ in 0..rounds {
                barrier.wait().await;
                c.batch_execute(&format!(
                    "INSERT INTO shard0.posts (user_id) SELECT {s} FROM generate_series(1, {burst})"
                ))
                .await
                .unwrap();
                barrier.wait().await;
                // One session waits for the clock to overtake the sequence.
                if s == 0 {
                    clock_overtakes_sequence(&c, far).await;
                }
            }
        });
    }
    // The first failed insert fails the test (dropping the set aborts the
    // sessions waiting at the barrier).
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let c = client(&a).await;
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT id),
                    max(n) FROM (SELECT id, count(*) OVER (PARTITION BY id >> 19) n FROM shard0.posts) x",
            &[],
        )
        .await
        .unwrap();
    let (n, distinct, per_tick): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(n as usize, sessions * rounds * burst);
    assert_eq!(distinct, n, "an id was handed out twice");
    assert_eq!(per_tick, 64, "ticks were filled: ids borrowed ahead");
    // Every round began with a catch-up: setval jumps the packed value
    // (time << 6 | sequence) by more than LAG + GAP.
    let jumps: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT p - lag(p) OVER (ORDER BY p) d
               FROM (SELECT ((id >> 19) << 6) | (id & 63) p FROM shard0.posts) x) y WHERE d > $1",
            &[&far],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        jumps >= rounds as i64 - 1,
        "catch-ups between bursts ({jumps})"
    );
}

/// A server that accepts TCP but never answers stalls only the callers
/// routed to it: the router connects without holding its connection map.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_server_does_not_stall_routing_to_the_others() {
    let a = PgServer::start().unwrap();
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hole.local_addr().unwrap().port();
    let text = format!(
        "layout = \"instagram\"\nshards = 2\n\
         [[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n\
         [[servers]]\nname = \"hole\"\nurl = \"postgres://postgres@127.0.0.1:{port}/postgres\"\nshards = \"1\"\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}})\"\n",
        a.url()
    );
    let topo = Topology::parse(&text).unwrap();
    // Installed while a held both shards (apply needs every server).
    let only_a = Topology::parse(&topology(&[("a", &a, "0-1")], 2)).unwrap();
    pg::apply(&only_a).await.unwrap();
    let router = Arc::new(Router::new(topo));
    let stalled = {
        let router = router.clone();
        tokio::spawn(async move { router.query_key(1, "SELECT 1", &[]).await })
    };
    // The stalled caller is inside its connect once the hole accepts it.
    let (_socket, _) = hole.accept().await.unwrap();
    let rows = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        router.query_key(0, "SELECT count(*) FROM {schema}.posts", &[]),
    )
    .await
    .expect("routing to server a waited for the hanging server")
    .unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 0);
    assert!(!stalled.is_finished());
    stalled.abort();
}
