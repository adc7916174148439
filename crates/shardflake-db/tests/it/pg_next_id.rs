//! `next_id`'s slow path against a real server: callers that arrive far
//! behind the clock leave with fresh times, and a cancelled wait leaves no
//! advisory lock behind.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardflake::Id;
use shardflake_db::pg::{self, Topology, sql};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const INSERT: &str = "INSERT INTO shard0.posts (body) VALUES ('x') RETURNING id";

async fn setup(layout: &str) -> (PgServer, Topology, i64) {
    let a = PgServer::start().unwrap();
    let topo = Topology::parse(&format!(
        "layout = {layout:?}\nshards = 1\n\
         [[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, body text)\"\n",
        a.url()
    ))
    .unwrap();
    pg::apply(&topo).await.unwrap();
    let c = client(&a).await;
    let oid: i64 = c
        .query_one("SELECT 'shard0.id_seq'::regclass::oid::bigint", &[])
        .await
        .unwrap()
        .get(0);
    (a, topo, sql::LOCK_BASE + oid)
}

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits (polling, bounded) until `n` sessions wait for the catch-up lock.
async fn wait_for_waiters(c: &Client, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting >= n {
            return;
        }
        assert!(Instant::now() < deadline, "only {waiting} of {n} waiters");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn advisory_locks(c: &Client) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// A fresh table's sequence is at 1 (time = the layout's epoch, 2011): every
/// caller that arrives while the first catches up must still get an id of
/// the current time, not its stale draw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_far_behind_the_clock_get_fresh_times() {
    let (a, topo, key) = setup("instagram").await;
    let holder = client(&a).await;
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    let start = now_ms();
    let mut callers = Vec::new();
    for _ in 0..8 {
        let c = client(&a).await;
        callers.push(tokio::spawn(async move {
            c.query_one(INSERT, &[]).await.unwrap().get::<_, i64>(0)
        }));
    }
    wait_for_waiters(&holder, 8).await;
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    let mut ids = Vec::new();
    for c in callers {
        ids.push(c.await.unwrap());
    }
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 8, "no repeat");
    for id in ids {
        let ms = Id(id as u64).decode(topo.layout()).unwrap().unix_ms;
        assert!(ms + 5 >= start && ms <= now_ms(), "{ms} vs start {start}");
    }
}

/// Cancelled while waiting on the catch-up lock (far behind: exclusive; in
/// the lag band: shared): the caller holds no advisory lock afterwards, so
/// catch-ups go on. A one-minute tick makes the band (a quarter tick) wide
/// enough to land in; should a minute boundary pass, the caller is far
/// behind instead and the exclusive wait is what gets cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_no_lock_behind() {
    let (a, topo, key) = setup("minutes: time 41 | shard 13 | sequence 10 (tick 60000 ms)").await;
    let holder = client(&a).await;
    let caller = client(&a).await;
    caller
        .batch_execute("SET statement_timeout = '200ms'")
        .await
        .unwrap();
    let layout = topo.layout();
    let bits = layout.sequence().bits();
    let packed_now = || (((now_ms() - layout.epoch_ms()) / layout.tick_ms()) as i64) << bits;
    let (lag, gap) = (sql::lag_tolerance(layout), sql::catch_up_gap(layout));
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&key])
        .await
        .unwrap();
    for (what, value) in [
        ("far behind", packed_now() - 60 * lag),
        ("in the band", packed_now() - lag - gap / 2),
    ] {
        caller
            .execute("SELECT setval('shard0.id_seq', $1)", &[&value])
            .await
            .unwrap();
        let e = caller.query_one(INSERT, &[]).await.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{what}: {e}");
        assert_eq!(
            advisory_locks(&holder).await,
            1,
            "{what}: only the holder's"
        );
    }
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await
        .unwrap();
    // Catch-ups work: from far behind, the next insert has the current tick.
    caller
        .execute(
            "SELECT setval('shard0.id_seq', $1)",
            &[&(packed_now() - 60 * lag)],
        )
        .await
        .unwrap();
    let id: i64 = caller.query_one(INSERT, &[]).await.unwrap().get(0);
    let tick = Id(id as u64).decode(layout).unwrap().tick as i64;
    assert!(tick + 1 >= packed_now() >> bits, "{tick}");
}

/// An error raised while the caller holds the catch-up lock (here `SF002`:
/// a 20-bit millisecond time field ran out in 2011) releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_under_the_catch_up_lock_releases_it() {
    let (a, _topo, _key) =
        setup("short: time 20 | shard 13 | sequence 10 (epoch 1314220021721 ms)").await;
    let c = client(&a).await;
    for _ in 0..2 {
        let e = c.query_one(INSERT, &[]).await.unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("SF002"), "{e}");
        assert_eq!(advisory_locks(&c).await, 0, "the lock was released");
    }
}

/// A layout's random start (`id % N` without skew, issue #40): at a low
/// rate every call catches the sequence up to a new tick, which without
/// one starts at sequence 0, so every id would be 0 modulo 16. With a
/// 4-bit random start the ticks start spread over 0..16, and no id
/// repeats in a burst either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_start_spreads_ids_made_at_a_low_rate() {
    let layout =
        "r: time 41 | shard 13 | sequence 10 (epoch 1314220021721 ms, random start 4 bits)";
    let (a, _topo, _key) = setup(layout).await;
    let c = client(&a).await;
    // One id every 6 ms: more than LAG + GAP (4.25 ms here) apart, so each
    // is a catch-up to a tick of its own.
    c.batch_execute(
        "CREATE FUNCTION spaced(n int) RETURNS SETOF bigint LANGUAGE plpgsql AS $$
         BEGIN
           FOR i IN 1..n LOOP
             PERFORM pg_sleep(0.006);
             RETURN NEXT shard0.next_id('shard0.id_seq'::regclass);
           END LOOP;
         END $$",
    )
    .await
    .unwrap();
    let slow: Vec<i64> = c
        .query("SELECT spaced(200)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let residues: std::collections::BTreeSet<i64> = slow.iter().map(|id| id % 16).collect();
    // 200 draws of 16 values: fewer than 12 seen has odds below 1e-20.
    assert!(residues.len() >= 12, "id % 16 took only {residues:?}");
    let ticks: std::collections::BTreeSet<i64> = slow.iter().map(|id| id >> 23).collect();
    assert!(ticks.len() >= 150, "only {} ticks", ticks.len());
    // A burst runs on from the random start into later ticks: all distinct.
    let burst: Vec<i64> = c
        .query(
            "SELECT shard0.next_id('shard0.id_seq'::regclass) FROM generate_series(1, 20000)",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut all: Vec<i64> = slow.into_iter().chain(burst).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "an id repeated");
}
