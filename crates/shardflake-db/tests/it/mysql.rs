//! MariaDB ids against real servers started by the tests: the one-statement
//! `INSERT ... RETURNING id` under concurrency, bursts and a SIGKILL, clock
//! moves under libfaketime (before the epoch, back, forward, past 2038 and
//! past the layout's end), the procedures, `apply` and `check`.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mysql_async::prelude::*;
use mysql_async::{Conn, Pool};
use shardflake::{Id, Layout, preset};
use shardflake_db::mysql::{self, Flavor, Names, Options, Plan, sql};
use shardflake_testkit::MariaDbServer;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn layout() -> Layout {
    preset::by_name("mysql-procedure").unwrap()
}

async fn applied(pool: &Pool, layout: &Layout, opts: &Options) -> mysql::Applied {
    let mut c = pool.get_conn().await.unwrap();
    mysql::apply(&mut c, layout, opts).await.unwrap()
}

fn err_text<T: std::fmt::Debug>(r: Result<T, shardflake_db::Error>) -> String {
    r.unwrap_err().to_string()
}

/// Every id: unique, of the shard of `user_id`, dated within [from, to].
fn verify(layout: &Layout, ids: &[i64], user_id: i64, from: u64, to: u64) {
    let unique: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(
        unique.len(),
        ids.len(),
        "{} duplicate ids",
        ids.len() - unique.len()
    );
    let shards = 1i64 << layout.field("shard").unwrap().bits();
    for &id in ids {
        let p = Id(id as u64).decode(layout).unwrap();
        assert_eq!(p.field("shard"), Some((user_id % shards) as u64), "{id}");
        assert!(
            p.unix_ms >= from && p.unix_ms <= to,
            "id {id} dated {} outside the run [{}, {}]",
            p.timestamp(),
            shardflake::timestamp::rfc3339_ms(from),
            shardflake::timestamp::rfc3339_ms(to)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_procedure_repeats_ids_under_concurrency_ours_do_not() {
    let server = MariaDbServer::start().unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let layout = layout();
    let opts = Options {
        seed: true,
        ..Options::default()
    };
    let first = applied(&pool, &layout, &opts).await;
    assert!(
        first
            .warnings
            .iter()
            .any(|w| w.contains("innodb_flush_log_at_trx_commit = 0")),
        "{:?}",
        first.warnings
    );
    assert!(first.clock_running, "{first:?}");
    // Re-applying changes nothing.
    let again = applied(&pool, &layout, &opts).await;
    assert!(again.installed.is_empty(), "{again:?}");
    let names = Names::default();

    // The OK packet carries the id the trigger set (LAST_INSERT_ID-style
    // clients), and it is the stored one.
    let mut c = pool.get_conn().await.unwrap();
    c.exec_drop(
        "INSERT INTO posts (user_id, body) VALUES (?, 'ok packet')",
        (1801,),
    )
    .await
    .unwrap();
    let from_ok = c.last_insert_id().unwrap() as i64;
    let stored: i64 = c
        .query_first("SELECT id FROM posts WHERE body = 'ok packet'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(from_ok, stored);
    verify(&layout, &[stored], 1801, now_ms() - 10_000, now_ms());
    drop(c);

    // One id of each kind, decoded in Rust: the seed's test (user 1801).
    let mut c = pool.get_conn().await.unwrap();
    for flavor in [Flavor::Sequence, Flavor::Locked] {
        let before = now_ms();
        let id = mysql::generate_post_id(&mut c, &flavor.procedure(&names), 1801)
            .await
            .unwrap();
        let inserted = mysql::insert(&mut c, &names, 1801, "hello").await.unwrap();
        let after = now_ms();
        // the clock event may not have caught up yet: allow its lag
        if matches!(flavor, Flavor::Sequence) {
            // One counter (the sequence) behind both: never the same id.
            verify(&layout, &[id, inserted], 1801, before - 2000, after + 1);
        } else {
            // The row-lock procedure counts in its own table, for servers
            // without sequences: an alternative to the trigger, not a second
            // source for the same table (they can meet on one id).
            verify(&layout, &[id], 1801, before - 2000, after + 1);
            verify(&layout, &[inserted], 1801, before - 2000, after + 1);
        }
        let e = err_text(mysql::generate_post_id(&mut c, &flavor.procedure(&names), -1).await);
        assert!(e.contains("user_id must be >= 0"), "{e}");
    }
    drop(c);

    // 16 callers sharing one user id, as the seed's ORM generator would call it.
    let seed = ids_from(&pool, "generate_post_id_seed", 16, 300, 1801).await;
    let seed_unique: HashSet<i64> = seed.iter().copied().collect();
    assert!(
        seed_unique.len() < seed.len(),
        "the seed's procedure handed out {} ids, all distinct: expected duplicates",
        seed.len()
    );
    for procedure in ["generate_post_id", "generate_post_id_locked"] {
        let from = now_ms();
        let ours = ids_from(&pool, procedure, 16, 300, 1801).await;
        verify(&layout, &ours, 1801, from - 2000, now_ms() + 1000);
    }
    eprintln!(
        "seed: {} of {} ids duplicated; ours: none",
        seed.len() - seed_unique.len(),
        seed.len()
    );
    pool.disconnect().await.unwrap();
}

async fn ids_from(
    pool: &Pool,
    procedure: &'static str,
    clients: usize,
    calls: usize,
    user_id: i64,
) -> Vec<i64> {
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = pool.get_conn().await.unwrap();
            let mut ids = Vec::with_capacity(calls);
            for _ in 0..calls {
                ids.push(
                    mysql::generate_post_id(&mut c, procedure, user_id)
                        .await
                        .unwrap(),
                );
            }
            ids
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

/// What one client collected: ids acknowledged before the kill was sent,
/// after the restart was seen, and in between (either side).
#[derive(Default)]
struct Collected {
    ids: Vec<i64>,
    bursts: usize,
    errors: usize,
}

/// Inserts until `stop` is set: single rows, and every 20th statement a
/// burst of `burst` rows from one statement (one clock reading); on an
/// error (the server was killed) reconnects and goes on.
async fn writer(
    pool: Pool,
    user_id: i64,
    burst: u32,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Collected {
    let mut out = Collected::default();
    let mut conn: Option<Conn> = None;
    let mut n = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match pool.get_conn().await {
                Ok(c) => conn.insert(c),
                Err(_) => {
                    out.errors += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        n += 1;
        let r: Result<Vec<i64>, _> = if n.is_multiple_of(20) {
            c.exec(
                format!("INSERT INTO posts (user_id, body) SELECT ?, 'burst' FROM seq_1_to_{burst} RETURNING id"),
                (user_id,),
            )
            .await
        } else {
            c.exec(
                "INSERT INTO posts (user_id, body) VALUES (?, 'hello') RETURNING id",
                (user_id,),
            )
            .await
        };
        match r {
            Ok(ids) => {
                if ids.len() > 1 {
                    out.bursts += 1;
                }
                out.ids.extend(ids);
            }
            Err(e) => {
                if out.errors == 0 {
                    eprintln!("writer: {e}");
                }
                out.errors += 1;
                conn = None;
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_statement_ids_never_repeat_under_clients_bursts_and_a_sigkill() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let layout = layout();
    // Ids are dated from the sequence's start at apply (they may lag the
    // clock by the clock event's LAG_MS and period).
    let start = now_ms();
    let a = applied(&pool, &layout, &Options::default()).await;
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    let mut c = pool.get_conn().await.unwrap();
    // Right after apply, `check` failed 1 run in ~20 on a loaded machine
    // (cause not pinned down: the clock event's loop is the suspect);
    // it must come clean within a bound.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let problems = mysql::check(&mut c, &layout, &Options::default())
            .await
            .unwrap();
        if problems.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "{problems:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(c);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spawn = |stop| tokio::spawn(writer(pool.clone(), 1801, 3000, stop));
    let mut tasks: Vec<_> = (0..8).map(|_| spawn(stop.clone())).collect();
    // Let the writers make ids, then kill the server under them.
    let count = |pool: &Pool| {
        let pool = pool.clone();
        async move {
            let mut c = pool.get_conn().await.ok()?;
            c.query_first::<i64, _>("SELECT COUNT(*) FROM posts")
                .await
                .ok()
                .flatten()
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&pool).await.unwrap_or(0) < 30_000 {
        assert!(Instant::now() < deadline, "writers made too few ids");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_kill: Option<(i64, i64)> = {
        let mut c = pool.get_conn().await.unwrap();
        c.query_first("SELECT MAX(id), (SELECT next_not_cached_value FROM posts_id_seq) FROM posts")
            .await
            .unwrap()
    };
    server.kill().unwrap();
    let killed_at = now_ms();
    server.restart().unwrap();
    let restarted_at = now_ms();
    // The first draw after the restart, before anyone else's: where the
    // sequence resumed (its reservation), compared with the last id seen.
    let mut c = loop {
        match pool.get_conn().await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let resumed: Option<i64> = c
        .query_first("SELECT NEXT VALUE FOR posts_id_seq")
        .await
        .unwrap();
    drop(c);
    // Let the writers go on for as many ids again after the restart.
    let after_restart = count(&pool).await.unwrap_or(0);
    while count(&pool).await.unwrap_or(0) < after_restart + 30_000 {
        assert!(
            Instant::now() < deadline + Duration::from_secs(60),
            "no ids after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut all = Vec::new();
    let (mut bursts, mut errors) = (0, 0);
    for t in tasks.drain(..) {
        let c = t.await.unwrap();
        all.extend(c.ids);
        bursts += c.bursts;
        errors += c.errors;
    }
    let end = now_ms();
    verify(&layout, &all, 1801, start, end + 10);
    assert!(bursts >= 8, "{bursts} bursts");
    assert!(errors > 0, "the kill interrupted no writer");
    // More than 2^10 ids per clock reading borrow the next milliseconds
    // instead of wrapping. The writers get there only on a machine that
    // inserts faster than the clock event moves the sequence up (roughly
    // 200 rows per ms by the event's arithmetic; a loaded CI machine did
    // not, its fullest millisecond held 567), so it is checked with the
    // sequence ahead of the clock: 3,000 ids fill whole milliseconds, and
    // borrow.
    let (ahead_ms, borrowed, per_ms) =
        one_statement_ahead_of_the_clock(&pool, &layout, 1801, 3000).await;
    assert_eq!(
        per_ms,
        [(ahead_ms, 1024), (ahead_ms + 1, 1024), (ahead_ms + 2, 952)],
        "3,000 ids from one statement, the sequence ahead of the clock"
    );
    let from_writers = all.len();
    all.extend(borrowed);
    verify(&layout, &all, 1801, start, ahead_ms + 2);
    // Every acknowledged id was stored, and survived the SIGKILL (InnoDB
    // writes its log at each commit here).
    let mut c = pool.get_conn().await.unwrap();
    let stored: Vec<i64> = c.query("SELECT id FROM posts").await.unwrap();
    let stored: HashSet<i64> = stored.into_iter().collect();
    let lost = all.iter().filter(|id| !stored.contains(id)).count();
    assert_eq!(lost, 0, "{lost} acknowledged ids are not in the table");
    let (max_before, reserved) = before_kill.unwrap();
    let resumed = resumed.unwrap();
    let w_before = ((max_before >> 20) << 10) | (max_before & 1023);
    assert!(
        resumed > w_before,
        "the sequence resumed at {resumed}, at or below {w_before}"
    );
    eprintln!(
        "{} ids from 8 clients ({bursts} bursts of 3,000 rows, {errors} failed statements around the kill, {lost} lost); \
         killed at +{} ms, answering again {} ms later; before the kill the newest stored id's value was {w_before} and the sequence's row said {reserved}; \
         it resumed at {resumed} ({} values past that id skipped; a reservation no commit had written to the log yet is lost, and no id from it was acknowledged), none repeated; \
         3,000 ids from one statement with the sequence ahead of the clock filled 1,024 per ms",
        from_writers,
        killed_at - start,
        restarted_at - killed_at,
        resumed - w_before - 1,
    );
    // (no pool.disconnect(): it waits for connections the kill broke)
    drop(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn narrow_sequence_borrows_time_under_concurrency() {
    // 6 sequence bits: 64 ids per ms, so 8 clients go far past it.
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let spec = "narrow: time 47 | shard 10 | sequence 6 (epoch 1672531200000 ms)";
    let layout = preset::resolve(spec).unwrap();
    let start = now_ms();
    applied(&pool, &layout, &Options::default()).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> = (0..8)
        .map(|_| tokio::spawn(writer(pool.clone(), 77, 500, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap().ids);
    }
    let end = now_ms();
    // The ids borrow: at 64 per ms they may be dated past the end of the run.
    let ahead = all.len() as u64 / 64;
    verify(&layout, &all, 77, start, end + ahead);
    let mut per_ms = std::collections::HashMap::<u64, u32>::new();
    for id in &all {
        *per_ms
            .entry(Id(*id as u64).decode(&layout).unwrap().unix_ms)
            .or_default() += 1;
    }
    assert!(per_ms.values().all(|&n| n <= 64));
    // Whether the writers fill whole milliseconds depends on how fast this
    // machine inserts; that they borrow the next ones instead of wrapping
    // is checked where it does not: 200 ids with the sequence ahead of the
    // clock must fill three milliseconds and start a fourth.
    let (ahead_ms, borrowed, burst_per_ms) =
        one_statement_ahead_of_the_clock(&pool, &layout, 77, 200).await;
    assert_eq!(
        burst_per_ms,
        [
            (ahead_ms, 64),
            (ahead_ms + 1, 64),
            (ahead_ms + 2, 64),
            (ahead_ms + 3, 8)
        ],
        "200 ids from one statement, the sequence ahead of the clock"
    );
    let full_ms = per_ms.values().filter(|&&n| n == 64).count();
    all.extend(borrowed);
    verify(&layout, &all, 77, start, ahead_ms + 3);
    eprintln!(
        "{} ids from 8 clients in {} ms, 64 per ms at most: {full_ms} full milliseconds; 200 from one statement borrowed 3 ms",
        all.len() - 200,
        end - start,
    );
}

/// Puts `posts_id_seq` 2 s ahead of the clock, where a burst faster than
/// the clock event or a clock step back leaves it (SETVAL only moves it
/// up), and draws `rows` ids for `user_id` from one statement. Returns the
/// millisecond it was put at, the ids, and how many ids each decoded
/// millisecond holds, in order.
async fn one_statement_ahead_of_the_clock(
    pool: &Pool,
    layout: &Layout,
    user_id: i64,
    rows: u32,
) -> (u64, Vec<i64>, Vec<(u64, u32)>) {
    let ahead_ms = now_ms() + 2_000;
    let packed = Plan::new(layout).unwrap().packed_at(ahead_ms).unwrap();
    let mut c = pool.get_conn().await.unwrap();
    c.query_drop(format!("DO SETVAL(posts_id_seq, {packed}, 0)"))
        .await
        .unwrap();
    let ids: Vec<i64> = c
        .exec(
            format!("INSERT INTO posts (user_id, body) SELECT ?, 'burst' FROM seq_1_to_{rows} RETURNING id"),
            (user_id,),
        )
        .await
        .unwrap();
    let mut per_ms = std::collections::BTreeMap::<u64, u32>::new();
    for id in &ids {
        *per_ms
            .entry(Id(*id as u64).decode(layout).unwrap().unix_ms)
            .or_default() += 1;
    }
    (ahead_ms, ids, per_ms.into_iter().collect())
}

/// Sets the server's clock offset. Written to a temporary file and renamed
/// over the old one: libfaketime reads the file at every clock call (no
/// cache), and a call between a plain write's truncation and its bytes
/// would read no offset, so the clock event would see the real time for
/// one tick and put the sequence ahead of the faked clock.
async fn set_clock(file: &Path, offset: &str) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, offset).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

async fn server_ms(c: &mut Conn) -> u64 {
    let us: i64 = c
        .query_first(
            "SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', UTC_TIMESTAMP(6))",
        )
        .await
        .unwrap()
        .unwrap();
    (us / 1000) as u64
}

/// Waits until the clock event has the sequence within `LAG + 5 ms` of the
/// server's clock (a condition, not a sleep: it fails after 30 s; the
/// scheduler runs the event on its own time, late on a loaded host).
async fn caught_up(c: &mut Conn, plan: &Plan, names: &Names) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reserved: i64 = c
            .query_first(format!(
                "SELECT next_not_cached_value FROM {}",
                names.sequence()
            ))
            .await
            .unwrap()
            .unwrap();
        let now = plan.packed_at(server_ms(c).await).unwrap();
        if reserved + plan.packed_ms(sql::LAG_MS + 5) >= now {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the clock event did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_moves_before_the_epoch_back_forward_and_past_2038() {
    let faketime = std::env::temp_dir().join(format!("shardflake-faketime-{}", std::process::id()));
    std::fs::write(&faketime, "+0").unwrap();
    let server = MariaDbServer::start_with("", Some(&faketime)).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let layout = layout();
    let plan = Plan::new(&layout).unwrap();
    let names = Names::default();
    let mut c = pool.get_conn().await.unwrap();

    // The arithmetic on given times, past 2038 and to the layout's end.
    for (text, unix_ms) in [
        ("2023-01-01 00:00:00.000", 1_672_531_200_000u64),
        ("2038-01-19 03:14:08.001", 2_147_483_648_001),
        ("2106-02-07 06:28:16.500", 4_294_967_296_500),
        ("2300-06-01 12:00:00.123", 10_426_881_600_123),
    ] {
        let sql = format!(
            "SELECT {}",
            plan.packed_sql(&plan.micros_sql(&format!("TIMESTAMP'{text}'")))
        );
        let packed: i64 = c.query_first(sql).await.unwrap().unwrap();
        assert_eq!(Some(packed), plan.packed_at(unix_ms), "{text}");
        let id = plan.id_of(packed | 5, 1801);
        assert_eq!(
            Id(id as u64).decode(&layout).unwrap().unix_ms,
            unix_ms,
            "{text}"
        );
    }

    // Apply on a server whose default sql_mode is not strict (database
    // app) and on one whose is (database app2): the routines are pinned.
    c.query_drop("SET GLOBAL sql_mode = ''").await.unwrap();
    drop(c);
    let pool = {
        pool.disconnect().await.unwrap();
        mysql::pool(&server.url()).unwrap()
    };
    applied(&pool, &layout, &Options::default()).await;
    let mut c = pool.get_conn().await.unwrap();
    c.query_drop("SET GLOBAL sql_mode = 'STRICT_TRANS_TABLES'; CREATE DATABASE app2")
        .await
        .unwrap();
    let url2 = server.url().replace("/app", "/app2");
    let pool2 = mysql::pool(&url2).unwrap();
    // A separate table of the same name: the operator says so.
    let separate = Options {
        new_deployment: true,
        ..Options::default()
    };
    applied(&pool2, &layout, &separate).await;
    for db in ["app", "app2"] {
        let modes: Vec<String> = c
            .exec(
                "SELECT SQL_MODE FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = ? UNION ALL SELECT SQL_MODE FROM information_schema.EVENTS WHERE EVENT_SCHEMA = ? UNION ALL SELECT SQL_MODE FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = ?",
                (db, db, db),
            )
            .await
            .unwrap();
        // two procedures, the refusal function, the event, the trigger,
        // the five ids-by-time functions, decode_id
        assert_eq!(modes.len(), 11, "{db}: {modes:?}");
        assert!(
            modes.iter().all(|m| m.contains("STRICT_ALL_TABLES")),
            "{db}: {modes:?}"
        );
    }
    c.query_drop("SET GLOBAL sql_mode = DEFAULT").await.unwrap();
    let mut c2 = pool2.get_conn().await.unwrap();
    // A few ids at the real time.
    let id0 = mysql::insert(&mut c, &names, 5, "x").await.unwrap();
    let row0: i64 = c
        .query_first("SELECT next_val FROM sequences WHERE name = 'posts_id'")
        .await
        .unwrap()
        .unwrap();

    // 1. Before the epoch (2022): every path refuses, naming clock and
    //    epoch, in a strict and in a non-strict session, and writes nothing.
    set_clock(&faketime, "-1500d").await;
    for (conn, mode) in [(&mut c, "STRICT_TRANS_TABLES"), (&mut c2, "")] {
        conn.query_drop(format!("SET SESSION sql_mode = '{mode}'"))
            .await
            .unwrap();
        let clock = server_ms(conn).await;
        assert!(clock < layout.epoch_ms(), "faketime did not move the clock");
        let e = err_text(mysql::insert(conn, &names, 5, "x").await);
        assert!(
            e.contains("is before the epoch 2023-01-01 00:00:00.000 UTC of layout mysql-procedure")
                && e.contains("the server clock (2022-"),
            "{mode:?}: {e}"
        );
        for p in ["generate_post_id", "generate_post_id_locked"] {
            let e = err_text(mysql::generate_post_id(conn, p, 5).await);
            assert!(
                e.contains(&format!("{p}: the server clock (2022-"))
                    && e.contains("is before the epoch 2023-01-01 00:00:00.000 UTC"),
                "{mode:?} {p}: {e}"
            );
        }
    }
    let row1: i64 = c
        .query_first("SELECT next_val FROM sequences WHERE name = 'posts_id'")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row0, row1, "a refused call wrote next_val");
    // Bad shard keys.
    c.query_drop("SET SESSION sql_mode = DEFAULT")
        .await
        .unwrap();
    set_clock(&faketime, "+0").await;
    let e = err_text(mysql::insert(&mut c, &names, -3, "x").await);
    assert!(e.contains("shard key user_id = -3 is not >= 0"), "{e}");
    let e = c
        .query_drop("INSERT IGNORE INTO posts (user_id) VALUES (-4)")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shardflake: posts.id: shard key user_id = -4 is not >= 0"),
        "{e}"
    );

    // 2. Back to now: the next ids are dated now (the sequence procedure
    //    lets its draw lag the clock by up to LAG_MS before it catches up).
    for (p, lag) in [
        ("generate_post_id", sql::LAG_MS + 1),
        ("generate_post_id_locked", 0),
    ] {
        let before = now_ms();
        let id = mysql::generate_post_id(&mut c, p, 5).await.unwrap();
        verify(&layout, &[id], 5, before - lag, now_ms());
    }
    caught_up(&mut c, &plan, &names).await;
    let before = now_ms();
    let id1 = mysql::insert(&mut c, &names, 5, "x").await.unwrap();
    verify(&layout, &[id1], 5, before - sql::LAG_MS - 10, now_ms());
    assert!(id1 > id0);

    // 3. Back by 1.5 s: the sequence runs ahead of the clock by more than
    //    AHEAD_MS, so an insert waits for the clock and its id is never
    //    more than AHEAD_MS ahead of it (what `mysql repair` relies on).
    set_clock(&faketime, "-1.5").await;
    let mut last = id1;
    for _ in 0..3 {
        let id = mysql::insert(&mut c, &names, 5, "x").await.unwrap();
        assert!(id > last);
        last = id;
        let p = Id(id as u64).decode(&layout).unwrap();
        let clock = server_ms(&mut c).await;
        assert!(
            p.unix_ms <= clock + sql::AHEAD_MS,
            "{} vs {clock}",
            p.timestamp()
        );
    }
    let id = mysql::generate_post_id(&mut c, "generate_post_id", 5)
        .await
        .unwrap();
    assert!(id > last);
    let clock = server_ms(&mut c).await;
    assert!(Id(id as u64).decode(&layout).unwrap().unix_ms <= clock + sql::AHEAD_MS);
    //    One hour back: refused, naming the step, until the clock is back;
    //    check says so too.
    set_clock(&faketime, "-1h").await;
    let e = err_text(mysql::insert(&mut c, &names, 5, "x").await);
    assert!(
        e.contains("ms ahead of the server clock") && e.contains("did the clock step back?"),
        "{e}"
    );
    let e = err_text(mysql::generate_post_id(&mut c, "generate_post_id", 5).await);
    assert!(e.contains("did the clock step back?"), "{e}");
    let problems = mysql::check(&mut c, &layout, &Options::default())
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains("ms ahead of the server clock (did it step back?)"),
        "{problems}"
    );

    // 4. Past 2038 (2300-09): the event moves the sequence up; ids are
    //    dated then, and decode.
    set_clock(&faketime, "+100000d").await;
    let fake = server_ms(&mut c).await;
    assert!(fake > 10_000_000_000_000, "{fake}");
    caught_up(&mut c, &plan, &names).await;
    let id = mysql::insert(&mut c, &names, 5, "x").await.unwrap();
    let p = Id(id as u64).decode(&layout).unwrap();
    assert!(p.timestamp().starts_with("2300-"), "{}", p.timestamp());
    let id = mysql::generate_post_id(&mut c, "generate_post_id_locked", 5)
        .await
        .unwrap();
    assert!(
        Id(id as u64)
            .decode(&layout)
            .unwrap()
            .timestamp()
            .starts_with("2300-")
    );

    // 5. Past the layout's end (2301-09): refused, naming it.
    set_clock(&faketime, "+102000d").await;
    let e = err_text(mysql::insert(&mut c, &names, 5, "x").await);
    assert!(
        e.contains("is past the last time of layout mysql-procedure (ids end at 2301-"),
        "{e}"
    );
    for p in ["generate_post_id", "generate_post_id_locked"] {
        let e = err_text(mysql::generate_post_id(&mut c, p, 5).await);
        assert!(
            e.contains("is past the last time of layout mysql-procedure"),
            "{p}: {e}"
        );
    }
    set_clock(&faketime, "+0").await;
    let _ = std::fs::remove_file(&faketime);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_and_check_refuse_what_breaks_the_argument() {
    let server = MariaDbServer::start_with("--innodb-flush-log-at-trx-commit=0", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let layout = layout();
    let opts = Options::default();
    let names = names_default();
    let mut c = pool.get_conn().await.unwrap();
    // An unsigned id is refused.
    c.query_drop("CREATE TABLE posts (id BIGINT UNSIGNED NOT NULL PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT)")
        .await
        .unwrap();
    let e = err_text(mysql::apply(&mut c, &layout, &opts).await);
    assert!(
        e.contains("posts.id is bigint(20) unsigned, not a signed BIGINT"),
        "{e}"
    );
    c.query_drop("ALTER TABLE posts MODIFY id BIGINT NOT NULL")
        .await
        .unwrap();
    // An existing table gets a default 0 (for INSERT ... SELECT), the
    // function and the trigger; flush 0 is warned about.
    let a = mysql::apply(&mut c, &layout, &opts).await.unwrap();
    for want in [
        "default 0 of posts.id",
        "posts_id_refused",
        "trigger posts_id",
    ] {
        assert!(a.installed.contains(&want.to_string()), "{want}: {a:?}");
    }
    assert!(
        a.warnings
            .iter()
            .any(|w| w.contains("innodb_flush_log_at_trx_commit = 0"))
    );
    // The scheduler starts the clock event on its own time (apply waits 3 s
    // for it; a loaded machine can take longer): wait for it, bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mysql::clock_running(&mut c, &names).await.unwrap() {
        assert!(Instant::now() < deadline, "the clock event never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let problems = mysql::check(&mut c, &layout, &opts).await.unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("innodb_flush_log_at_trx_commit = 0"));
    let id = mysql::insert(&mut c, &names, 9, "x").await.unwrap();
    let burst: Vec<i64> = c
        .query("INSERT INTO posts (user_id, body) SELECT 9, 'b' FROM seq_1_to_100 RETURNING id")
        .await
        .unwrap();
    assert_eq!(burst.len(), 100);
    // An explicit id is kept; one above the sequence breaks the argument.
    let ahead = id + (1 << 30);
    c.exec_drop("INSERT INTO posts (id, user_id) VALUES (?, 9)", (ahead,))
        .await
        .unwrap();
    let problems = mysql::check(&mut c, &layout, &opts).await.unwrap();
    assert!(
        problems.iter().any(|p| p.contains("ids would repeat")),
        "{problems:?}"
    );
    c.exec_drop("DELETE FROM posts WHERE id = ?", (ahead,))
        .await
        .unwrap();
    // A cycling sequence, another trigger, the scheduler off.
    c.query_drop("ALTER SEQUENCE posts_id_seq CYCLE; CREATE OR REPLACE TRIGGER posts_id BEFORE INSERT ON posts FOR EACH ROW SET NEW.id = 7; SET GLOBAL event_scheduler = OFF")
        .await
        .unwrap();
    let problems = mysql::check(&mut c, &layout, &opts)
        .await
        .unwrap()
        .join("\n");
    for want in [
        "cycles",
        "trigger posts_id differs",
        "event_scheduler = OFF",
    ] {
        assert!(problems.contains(want), "{want}: {problems}");
    }
    c.query_drop("DROP TRIGGER posts_id").await.unwrap();
    let problems = mysql::check(&mut c, &layout, &opts)
        .await
        .unwrap()
        .join("\n");
    assert!(
        problems.contains("trigger posts_id on posts is missing"),
        "{problems}"
    );
    // apply puts it all back.
    let a = mysql::apply(&mut c, &layout, &opts).await.unwrap();
    assert!(a.clock_running, "{a:?}");
    let problems = mysql::check(&mut c, &layout, &opts).await.unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    // Another layout on the same sequence is refused.
    let other = preset::resolve("other: time 41 | shard 12 | sequence 10 (epoch 1672531200000 ms)")
        .unwrap();
    let e = err_text(mysql::apply(&mut c, &other, &opts).await);
    assert!(e.contains("was made for another layout"), "{e}");
    // repair names the layout that works on it (before: "run shardflake
    // mysql apply", which refuses that layout).
    let e = err_text(mysql::repair(&mut c, &other, &opts).await);
    assert!(
        e.contains(&format!("run shardflake mysql repair --layout '{layout}'")),
        "{e}"
    );
    assert_eq!(preset::resolve(&layout.to_string()).unwrap(), layout);
    // The sequence runs out at the layout's last value: a clear error (the
    //    two values before it are refused as far ahead of the clock).
    let max = Plan::new(&layout).unwrap().max_packed();
    c.query_drop(format!("DO SETVAL(posts_id_seq, {}, 0)", max - 1))
        .await
        .unwrap();
    for _ in 0..2 {
        let e = err_text(mysql::insert(&mut c, &names, 9, "x").await);
        assert!(e.contains("did the clock step back?"), "{e}");
    }
    let e = err_text(mysql::insert(&mut c, &names, 9, "x").await);
    assert!(e.contains("Sequence 'app.posts_id_seq' has run out"), "{e}");
    let e = err_text(mysql::generate_post_id(&mut c, "generate_post_id", 9).await);
    assert!(
        e.contains("generate_post_id: sequence posts_id_seq has run out: the ids of layout mysql-procedure end at 2301-"),
        "{e}"
    );
}

fn names_default() -> Names {
    Names::default()
}

/// The connection holding the clock event loop's lock, if any.
async fn clock_holder(c: &mut Conn, names: &Names) -> Option<u64> {
    c.query_first::<Option<u64>, _>(format!("SELECT IS_USED_LOCK({})", names.clock_lock_sql()))
        .await
        .unwrap()
        .flatten()
}

/// Reproduction 7 of issue #28: a dump of the database restored into the
/// running server, taken before a burst ran the sequence ahead of the
/// clock. The restore drops and recreates the sequence and sets it back;
/// the clock event's loop must outlive the `DROP` and put the sequence past
/// every value it handed out, and the trigger must refuse the set-back
/// values meanwhile, so the ids made afterwards repeat none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dump_restored_into_the_running_server_repeats_no_id() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    // 2 sequence bits: 4 ids per ms, so a burst runs far ahead of the clock.
    let spec = "narrow: time 47 | shard 10 | sequence 2 (epoch 1672531200000 ms)";
    let layout = preset::resolve(spec).unwrap();
    applied(&pool, &layout, &Options::default()).await;
    let names = names_default();
    let mut c = pool.get_conn().await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids.push(mysql::insert(&mut c, &names, 7, "before").await.unwrap());
    }
    let holder = clock_holder(&mut c, &names).await;
    let dumped_at = now_ms();
    let out = std::process::Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", server.port))
        .args(["--triggers", "--routines", "--events", "app"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let dump = std::env::temp_dir().join(format!("sf-maria-dump-{}.sql", std::process::id()));
    std::fs::write(&dump, &out.stdout).unwrap();
    let burst: Vec<i64> = c
        .query(
            "INSERT INTO posts (user_id, body) SELECT 7, 'burst' FROM seq_1_to_8000 RETURNING id",
        )
        .await
        .unwrap();
    let burst_end = burst
        .iter()
        .map(|id| Id(*id as u64).decode(&layout).unwrap().unix_ms)
        .max()
        .unwrap();
    // As far ahead as the trigger lets a draw run (then it waits).
    let now = now_ms();
    assert!(burst_end > now + 500, "the burst did not run ahead");
    assert!(
        burst_end <= now + sql::AHEAD_MS,
        "{} ms ahead",
        burst_end - now
    );
    ids.extend(burst);
    // An earlier dump: older than the trigger's tolerance when restored.
    while now_ms() < dumped_at + sql::STALE_MS + 300 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.load(&dump).unwrap();
    let _ = std::fs::remove_file(&dump);
    // Ids until the clock has passed the burst's (bounded).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refused = 0;
    loop {
        match mysql::insert(&mut c, &names, 7, "after").await {
            Ok(id) => {
                ids.push(id);
                if Id(id as u64).decode(&layout).unwrap().unix_ms > burst_end + 200 {
                    break;
                }
            }
            // Refused while the sequence is set back: not an id.
            Err(_) => refused += 1,
        }
        assert!(
            Instant::now() < deadline,
            "the clock never passed the burst"
        );
    }
    verify(&layout, &ids, 7, 0, u64::MAX);
    if holder.is_some() {
        assert_eq!(
            clock_holder(&mut c, &names).await,
            holder,
            "the clock event's loop ended during the restore"
        );
    }
    let mut c2 = pool.get_conn().await.unwrap();
    let problems = mysql::check(&mut c2, &layout, &Options::default())
        .await
        .unwrap();
    assert!(
        problems.is_empty(),
        "{problems:?} ({refused} inserts refused)"
    );
}

/// A layout's random start (`id % N` without skew, issue #40): at a low
/// rate each insert draws the first value of a tick the clock event caught
/// up to, sequence 0 without a random start, so every id would be 0 modulo
/// 16. With 4 bits the ticks start spread over 0..16; a burst from one
/// statement repeats no id either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_start_spreads_ids_made_at_a_low_rate() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let spec = "r: time 42 | shard 10 | sequence 11 (epoch 1288834974657 ms, random start 4 bits)";
    let layout = preset::resolve(spec).unwrap();
    let start = now_ms();
    applied(&pool, &layout, &Options::default()).await;
    let mut c = pool.get_conn().await.unwrap();
    let names = Names::default();
    let mut ids = Vec::new();
    // One insert every 6 ms: the event catches the sequence up every 4 ms
    // when idle, so each draw starts a tick of its own.
    for _ in 0..200 {
        ids.push(mysql::insert(&mut c, &names, 7, "slow").await.unwrap());
        tokio::time::sleep(Duration::from_millis(6)).await;
    }
    let residues: HashSet<i64> = ids.iter().map(|id| id % 16).collect();
    // 200 draws of 16 values: fewer than 12 seen has odds below 1e-20.
    assert!(residues.len() >= 12, "id % 16 took only {residues:?}");
    let burst: Vec<i64> = c
        .query(
            "INSERT INTO posts (user_id, body) SELECT 7, 'burst' FROM seq_1_to_20000 RETURNING id",
        )
        .await
        .unwrap();
    ids.extend(burst);
    verify(&layout, &ids, 7, start, now_ms() + 2 * sql::AHEAD_MS);
}

/// A burst on a random-start layout was refused after idle with no
/// restore ("sequence ... is at N, below its high-water M ... run
/// shardflake mysql repair", M - N = 481): the high-water was read after
/// the row's draw, and the clock event may raise it past that draw
/// meanwhile, legitimately (every value still to come is above it), while
/// the row's thread waits for a CPU. Here the pause is made by hand: a
/// row's draw in one session; from another, what a catch-up and the clock
/// event do while it waits (the sequence moved on, the high-water raised
/// to the reservation less the cache, above the draw); then the row's
/// test as the trigger's last arm makes it (every row of an `INSERT ...
/// SELECT` after its first second goes there: its clock is the
/// statement's start). The draw was made before the raise: it gets its
/// id. A sequence set back below the high-water is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draw_made_before_the_high_water_was_raised_is_not_refused() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let pool = mysql::pool(&server.url()).unwrap();
    let spec = "r: time 43 | shard 14 | sequence 6 (epoch 1672531200000 ms, random start 4 bits)";
    let layout = preset::resolve(spec).unwrap();
    applied(&pool, &layout, &Options::default()).await;
    let names = names_default();
    let plan = Plan::new(&layout).unwrap().in_database("app");
    let hw = plan.high_water(&names).unwrap();
    let mut row = pool.get_conn().await.unwrap();
    let mut other = pool.get_conn().await.unwrap();
    caught_up(&mut row, &plan, &names).await;
    mysql::insert(&mut row, &names, 7, "first").await.unwrap();

    // The row's draw.
    let w: i64 = row
        .query_first("SELECT NEXT VALUE FOR posts_id_seq")
        .await
        .unwrap()
        .unwrap();
    // While it waits: a catch-up moves the sequence on, and the clock
    // event records the reservation less the cache, above the draw.
    other
        .query_drop(format!("DO SETVAL(posts_id_seq, {}, 0)", w + 3000))
        .await
        .unwrap();
    let raised: i64 = other
        .query_first("SELECT next_not_cached_value - cache_size FROM posts_id_seq")
        .await
        .unwrap()
        .unwrap();
    assert!(raised > w, "the raise {raised} is not above the draw {w}");
    other
        .query_drop(format!("DO SETVAL({hw}, {raised}, 0)"))
        .await
        .unwrap();
    // The row's test of its draw (PREVIOUS VALUE FOR is this session's).
    let refused = names.refused_function();
    let arity: i64 = row
        .query_first(format!(
            "SELECT COUNT(*) FROM information_schema.PARAMETERS WHERE SPECIFIC_SCHEMA = DATABASE() \
             AND SPECIFIC_NAME = '{refused}' AND PARAMETER_MODE IS NOT NULL"
        ))
        .await
        .unwrap()
        .unwrap();
    // One argument: the function of the build that read the high-water
    // after the draw, which the trigger's last arm called with the key.
    let args = if arity == 1 { "7" } else { "7, FALSE" };
    let got: Result<Option<(i64, i64)>, _> = row
        .query_first(format!(
            "SELECT PREVIOUS VALUE FOR posts_id_seq, `{refused}`({args})"
        ))
        .await;
    let (prev, id) = got
        .expect("a draw made before the high-water was raised was refused")
        .unwrap();
    assert_eq!(prev, w);
    assert_eq!(id, plan.id_of(w, 7));
    // Rows go on, above the raise.
    let next = mysql::insert(&mut row, &names, 7, "after").await.unwrap();
    assert!(next > id, "{next} <= {id}");

    // Set back below the high-water (as a restore does): refused.
    let reserved: i64 = other
        .query_first("SELECT next_not_cached_value FROM posts_id_seq")
        .await
        .unwrap()
        .unwrap();
    other
        .query_drop(format!(
            "DO SETVAL({hw}, {}, 0)",
            reserved + plan.packed_ms(5_000)
        ))
        .await
        .unwrap();
    let e = err_text(mysql::insert(&mut row, &names, 7, "set back").await);
    assert!(
        e.contains("below its high-water") && e.contains("run shardflake mysql repair"),
        "{e}"
    );
}
