//! Ids by time in SQL (`min_id_at`, `max_id_at`, `id_range`, `id_time`)
//! against the library, on real PostgreSQL and MariaDB servers: 10,000
//! random times each, in one query per server.

use mysql_async::prelude::*;
use shardflake::{Id, Layout, preset};
use shardflake_db::mysql::{self, Options};
use shardflake_db::pg::{self, Topology};
use shardflake_testkit::{MariaDbServer, PgServer};

const TIMES: usize = 10_000;

/// splitmix64: reproducible random numbers without a dependency; the seed
/// is printed with every failure.
struct Random(u64);

impl Random {
    fn seeded() -> Random {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Random(seed)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Random `(ms, span_ms, id)` cases over the layout's whole life, half of
/// the times on a tick boundary or one ms before one, and what the library
/// says of each: min and max id at `ms`, the range of `ms..ms + span`, and
/// the decoded time of `id` (an id the layout can make).
#[allow(clippy::type_complexity)]
fn cases(layout: &Layout, seed: u64) -> (Vec<(i64, i64, i64)>, Vec<[i64; 5]>) {
    let mut random = Random(seed);
    let epoch = layout.epoch_ms();
    let life = u64::try_from(layout.end_of_life_ms()).unwrap() - epoch;
    let mut inputs = Vec::with_capacity(TIMES);
    let mut want = Vec::with_capacity(TIMES);
    for i in 0..TIMES {
        let span = 1 + random.next() % (30 * 86_400_000);
        let mut ms = epoch + random.next() % (life - span);
        if i % 2 == 0 {
            ms -= (ms - epoch) % layout.tick_ms();
            if i % 4 == 0 && ms > epoch {
                ms -= 1;
            }
        }
        let id = Id(random.next() & layout.max_id());
        let range = layout.id_range(ms..ms + span).unwrap();
        inputs.push((ms as i64, span as i64, id.as_i64()));
        want.push([
            layout.min_id_at(ms).unwrap().as_i64(),
            layout.max_id_at(ms).unwrap().as_i64(),
            range.first.as_i64(),
            range.last.as_i64(),
            id.decode(layout).unwrap().unix_ms as i64,
        ]);
    }
    (inputs, want)
}

fn compare(
    layout: &Layout,
    seed: u64,
    inputs: &[(i64, i64, i64)],
    got: &[[i64; 5]],
    want: &[[i64; 5]],
) {
    assert_eq!(got.len(), want.len(), "seed {seed}");
    for ((input, got), want) in inputs.iter().zip(got).zip(want) {
        assert_eq!(
            got, want,
            "{layout}, seed {seed}: (ms, span, id) = {input:?}: SQL [min, max, first, last, id time] differs from the library"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_time_functions_agree_with_the_library() {
    let server = PgServer::start().unwrap();
    let text = format!(
        "layout = \"instagram\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, body text)\"\n",
        server.url()
    );
    let topo = Topology::parse(&text).unwrap();
    pg::apply(&topo).await.unwrap();
    let client = pg::connect_url("test", &server.url()).await.unwrap();
    // Instagram's layout: 64 bits, ids negative as bigint from 2046 on, so
    // the random times cross the sign too.
    let layout = preset::by_name("instagram").unwrap();
    let seed = Random::seeded().0;
    let (inputs, want) = cases(&layout, seed);
    let column = |f: fn(&(i64, i64, i64)) -> i64| inputs.iter().map(f).collect::<Vec<i64>>();
    let rows = client
        .query(
            "SELECT shardflake.min_id_at(x.ts), shardflake.max_id_at(x.ts), r.first_id, r.last_id,
                    floor(extract(epoch FROM shardflake.id_time(t.id)) * 1000)::bigint
             FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) WITH ORDINALITY AS t(ms, span, id, n),
                  LATERAL (SELECT 'epoch'::timestamptz + t.ms * interval '1 millisecond' AS ts) x,
                  LATERAL shardflake.id_range(x.ts, x.ts + t.span * interval '1 millisecond') r
             ORDER BY t.n",
            &[&column(|c| c.0), &column(|c| c.1), &column(|c| c.2)],
        )
        .await
        .unwrap();
    let got: Vec<[i64; 5]> = rows
        .iter()
        .map(|r| [r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)])
        .collect();
    compare(&layout, seed, &inputs, &got, &want);

    // Outside the layout's life, and an empty span: SQLSTATE 22008.
    for sql in [
        "SELECT shardflake.min_id_at('2000-01-01Z')",
        "SELECT shardflake.max_id_at('2300-01-01Z')",
        "SELECT shardflake.id_range('2024-01-02Z', '2024-01-01Z')",
    ] {
        let err = client.query(sql, &[]).await.unwrap_err();
        assert_eq!(err.code().map(|c| c.code()), Some("22008"), "{sql}: {err}");
    }

    // The functions fold to constants: a range of time is an index range
    // scan on the primary key (seq scans off: the table is empty).
    let plan = client
        .simple_query(
            "SET enable_seqscan = off; EXPLAIN SELECT * FROM shard0.posts
             WHERE id BETWEEN shardflake.min_id_at(now() - interval '7 days') AND shardflake.max_id_at(now())",
        )
        .await
        .unwrap();
    let plan: String = plan
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(plan.contains("Index Cond: ((id >= "), "{plan}");
    assert!(plan.contains("posts_pkey"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_time_functions_agree_with_the_library() {
    let server = MariaDbServer::start().unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let layout = preset::by_name("mysql-procedure").unwrap();
    let mut conn = pool.get_conn().await.unwrap();
    let applied = mysql::apply(&mut conn, &layout, &Options::default())
        .await
        .unwrap();
    assert!(
        applied.installed.iter().any(|i| i == "id_range"),
        "{applied:?}"
    );
    let again = mysql::apply(&mut conn, &layout, &Options::default())
        .await
        .unwrap();
    assert!(again.installed.is_empty(), "apply is idempotent: {again:?}");
    let problems = mysql::check(&mut conn, &layout, &Options::default())
        .await
        .unwrap();
    let names = ["tick_at", "min_id_at", "max_id_at", "id_range", "id_time"];
    assert!(
        !problems.iter().any(|p| names.iter().any(|n| p.contains(n))),
        "{problems:?}"
    );

    let seed = Random::seeded().0;
    let (inputs, want) = cases(&layout, seed);
    let json = format!(
        "[{}]",
        inputs
            .iter()
            .map(|c| format!("[{},{},{}]", c.0, c.1, c.2))
            .collect::<Vec<_>>()
            .join(",")
    );
    let ts = "(TIMESTAMP'1970-01-01 00:00:00' + INTERVAL j.ms * 1000 MICROSECOND)";
    let rows: Vec<(i64, i64, i64, i64, i64)> = conn
        .exec(
            format!(
                "SELECT min_id_at({ts}), max_id_at({ts}),
                        CAST(JSON_VALUE(id_range({ts}, {ts} + INTERVAL j.span * 1000 MICROSECOND), '$.first') AS SIGNED),
                        CAST(JSON_VALUE(id_range({ts}, {ts} + INTERVAL j.span * 1000 MICROSECOND), '$.last') AS SIGNED),
                        TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', id_time(j.id)) DIV 1000
                 FROM JSON_TABLE(?, '$[*]' COLUMNS (n FOR ORDINALITY, ms BIGINT PATH '$[0]',
                                                    span BIGINT PATH '$[1]', id BIGINT PATH '$[2]')) AS j
                 ORDER BY j.n"
            ),
            (json,),
        )
        .await
        .unwrap();
    let got: Vec<[i64; 5]> = rows
        .into_iter()
        .map(|r| [r.0, r.1, r.2, r.3, r.4])
        .collect();
    compare(&layout, seed, &inputs, &got, &want);

    for sql in [
        "SELECT min_id_at('2000-01-01')",
        "SELECT max_id_at('2400-01-01')",
        "SELECT id_range('2024-01-02', '2024-01-01')",
    ] {
        match conn.query_drop(sql).await {
            Err(mysql_async::Error::Server(e)) => assert_eq!(e.state, "22008", "{sql}: {e}"),
            other => panic!("{sql}: {other:?}"),
        }
    }
    // check reports a time function that is missing.
    conn.query_drop("DROP FUNCTION id_time").await.unwrap();
    let problems = mysql::check(&mut conn, &layout, &Options::default())
        .await
        .unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("function id_time is missing")),
        "{problems:?}"
    );
}

/// `pg partitions`: daily partitions of the ids, created idempotently;
/// rows route by their id alone (a default id to today's, an id of two
/// days ago to that day's); dropping an old partition drops its rows only;
/// an id of no partition's period is refused by PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_partitions_route_rows_by_id_and_an_old_one_drops() {
    use shardflake_db::pg::partitions::{Period, apply_partitions, partitions};
    let server = PgServer::start().unwrap();
    let text = format!(
        "layout = \"instagram\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n[[tables]]\nname = \"events\"\nsql = \"CREATE TABLE {{schema}}.events (id bigint NOT NULL DEFAULT {{next_id}}, body text, PRIMARY KEY (id)) PARTITION BY RANGE (id)\"\n",
        server.url()
    );
    let topo = Topology::parse(&text).unwrap();
    pg::apply(&topo).await.unwrap();
    let layout = preset::by_name("instagram").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let day = 86_400_000;
    let parts = partitions(&layout, Period::Day, now - 2 * day, 4).unwrap();
    assert_eq!(
        apply_partitions(&topo, "events", &parts).await.unwrap(),
        vec![("a".to_string(), 4)]
    );
    assert_eq!(
        apply_partitions(&topo, "events", &parts).await.unwrap(),
        vec![("a".to_string(), 0)]
    );

    let client = pg::connect_url("test", &server.url()).await.unwrap();
    let partition_of =
        async |sql: &str| -> String { client.query_one(sql, &[]).await.unwrap().get(0) };
    let today = &parts[2].suffix;
    let old = &parts[0].suffix;
    assert_eq!(
        partition_of(
            "INSERT INTO shard0.events (body) VALUES ('now') RETURNING tableoid::regclass::text"
        )
        .await,
        format!("shard0.events_{today}")
    );
    let two_days_ago = layout.min_id_at(now - 2 * day).unwrap().as_i64();
    assert_eq!(
        partition_of(&format!(
            "INSERT INTO shard0.events (id, body) VALUES ({two_days_ago}, 'old') RETURNING tableoid::regclass::text"
        ))
        .await,
        format!("shard0.events_{old}")
    );
    client
        .batch_execute(&format!("DROP TABLE shard0.events_{old}"))
        .await
        .unwrap();
    let bodies: Vec<String> = client
        .query("SELECT body FROM shard0.events", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(bodies, vec!["now".to_string()]);
    let in_ten_days = layout.min_id_at(now + 10 * day).unwrap().as_i64();
    let err = client
        .execute(
            &format!("INSERT INTO shard0.events (id) VALUES ({in_ten_days})"),
            &[],
        )
        .await
        .unwrap_err();
    let message = err.as_db_error().unwrap().message().to_string();
    assert!(message.contains("no partition"), "{message}");
    // A table that is not partitioned is refused with what to do.
    let text = text
        .replace(" PARTITION BY RANGE (id)", "")
        .replace("events", "plain");
    let topo = Topology::parse(&text).unwrap();
    pg::apply(&topo).await.unwrap();
    let err = apply_partitions(&topo, "plain", &parts).await.unwrap_err();
    assert!(err.to_string().contains("PARTITION BY RANGE (id)"), "{err}");
}
