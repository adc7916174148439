//! Ticket servers on real MariaDB and PostgreSQL servers, started on
//! 127.0.0.1 under temp dirs by `shardflake_testkit::MariaDbServer` and
//! `PgServer` (through `scripts/mariadb.sh` and `scripts/pg.sh`, which can
//! SIGKILL a server and restart it on its data and port).

use std::collections::HashSet;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod admin_locks;
mod adopt;
mod classes;
mod counter_row;
mod fence;
mod issue36;
mod live_restore;
mod messages;
mod quorum;
mod rechunk;
mod reply_order;
mod repro;
mod stores;
mod write_ahead;

use shardflake_testkit::{MariaDbServer, PgServer};
use shardflake_tickets::{
    Config, ConfigError, MAX_COUNT, MAX_PER_ID_COUNT, TicketClient, TicketError, admin,
};

/// A MariaDB server whose global increment and offset are as given (the
/// script's other settings: InnoDB log written at every commit, so a SIGKILL
/// loses no committed ticket).
fn maria(increment: u64, offset: u64) -> MariaDbServer {
    MariaDbServer::start_with(
        &format!("--auto-increment-increment={increment} --auto-increment-offset={offset}"),
        None,
    )
    .unwrap()
}

fn server_toml(name: &str, kind: &str, url: &str, offset: u64) -> String {
    format!(
        "[[servers]]\nname = \"{name}\"\nkind = \"{kind}\"\nurl = \"{url}\"\noffset = {offset}\n"
    )
}

const SEQUENCES: &str = r#"
[failover]
attempt_timeout_ms = 1000
timeout_ms = 3000
probe_interval_ms = 50
high_water_interval_ms = 50

[segment]
chunk = 100
min_step = 100
max_step = 10000

[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"
"#;

fn maria_pair_config(a: &MariaDbServer, b: &MariaDbServer) -> Config {
    Config::parse(&format!(
        "{}{}{SEQUENCES}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 2)
    ))
    .unwrap()
}

fn pg_pair_config(a: &PgServer, b: &PgServer, style: &str) -> Config {
    Config::parse(&format!(
        "postgres_tickets = \"{style}\"\n{}{}{SEQUENCES}",
        server_toml("a", "postgres", &a.url(), 1),
        server_toml("b", "postgres", &b.url(), 2)
    ))
    .unwrap()
}

async fn init_ok(config: &Config) {
    for _ in 0..2 {
        for s in admin::init(config).await {
            s.result
                .unwrap_or_else(|e| panic!("init {}: {e}", s.server));
        }
    }
}

fn state(client: &TicketClient, server: &str) -> &'static str {
    client
        .metrics()
        .into_iter()
        .find(|m| m.name == server)
        .unwrap()
        .state
}

fn calls(client: &TicketClient, server: &str) -> u64 {
    client
        .metrics()
        .into_iter()
        .find(|m| m.name == server)
        .unwrap()
        .calls
}

/// Polls `cond` until it holds, for up to 30 s.
async fn wait_for(client: &TicketClient, what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "no {what} in 30 s: {:?}",
            client.metrics()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls the client's view of a server until it reaches `want` (the prober
/// runs every 50 ms here).
async fn wait_state(client: &TicketClient, server: &str, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(client, server) != want {
        assert!(
            Instant::now() < deadline,
            "server {server} never became {want}: {:?}",
            client.metrics()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tickets file's `[marks]` section naming `etcd` under `prefix`.
fn etcd_marks(etcd: &shardflake_testkit::Etcd, prefix: &str) -> String {
    let endpoints: Vec<String> = etcd.endpoints.iter().map(|e| format!("{e:?}")).collect();
    format!(
        "\n[marks]\netcd = [{}]\netcd_prefix = \"{prefix}\"\n",
        endpoints.join(", ")
    )
}

/// With two servers a mark counts only once the peer holds it: while one
/// is down, the other's clients hand out the ids already marked, then are
/// refused for want of marks (`no_high_water`, or `unavailable` /
/// `timeout` when a call's time ran out meanwhile). Any other error fails.
fn assert_only_marks_refusals(what: &str, errors: &[TicketError]) {
    let other: Vec<_> = errors
        .iter()
        .filter(|e| !matches!(e.code(), "no_high_water" | "unavailable" | "timeout"))
        .collect();
    assert!(other.is_empty(), "{what}: callers saw errors: {other:?}");
}

fn assert_unique(ids: &[u64]) {
    let set: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(
        set.len(),
        ids.len(),
        "{} duplicate ids",
        ids.len() - set.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_pair_hands_out_odd_and_even_ids_and_checks_clean() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = maria_pair_config(&a, &b);
    init_ok(&config).await;
    let report = admin::check(&config).await;
    assert!(report.ok(), "{report}");
    assert!(
        report
            .to_string()
            .contains("session: auto_increment_increment 2 auto_increment_offset 2")
    );

    let client = TicketClient::connect(config).await.unwrap();
    let ids = client.next_n("photos", 200).await.unwrap();
    assert_unique(&ids);
    assert!(ids.iter().any(|i| i % 2 == 1) && ids.iter().any(|i| i % 2 == 0));
    assert_eq!(&ids[..4], &[1, 2, 3, 4], "the servers take turns");
    // Segment ids from one client increase.
    let blocks = client.next_n("blocks", 5000).await.unwrap();
    assert!(blocks.windows(2).all(|w| w[0] < w[1]));

    let e = client.next("nope").await.unwrap_err();
    assert_eq!(e.code(), "unknown_sequence");
    assert_eq!(e.to_string(), "unknown sequence \"nope\"");
    let e = client.next_n("photos", 0).await.unwrap_err();
    assert_eq!(e.code(), "bad_count");
    // A per-id request is a round trip per id: it has its own, lower limit.
    let e = client
        .next_n("photos", MAX_PER_ID_COUNT + 1)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        TicketError::BadCount {
            count: MAX_PER_ID_COUNT + 1,
            max: MAX_PER_ID_COUNT
        }
    );
    assert_eq!(
        client
            .next_n("photos", MAX_PER_ID_COUNT)
            .await
            .unwrap()
            .len(),
        MAX_PER_ID_COUNT
    );
    assert_eq!(
        client.next_n("blocks", MAX_COUNT).await.unwrap().len(),
        MAX_COUNT
    );
    let e = client.next_n("blocks", MAX_COUNT + 1).await.unwrap_err();
    assert_eq!(e.code(), "bad_count");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pair_sharing_an_offset_fails_check_and_is_refused_by_the_client() {
    // Both servers configured with offset 1: plain SQL clients would get one
    // id from both.
    let (a, b) = (maria(2, 1), maria(2, 1));
    let config = maria_pair_config(&a, &b);
    init_ok(&config).await;
    let report = admin::check(&config).await;
    assert!(!report.ok());
    let text = report.to_string();
    assert!(
        text.contains("servers a and b share global auto_increment_offset 1"),
        "{text}"
    );
    assert!(
        text.contains(
            "server b: global auto_increment_increment/offset are 2/1, the file says 2/2"
        ),
        "{text}"
    );

    // The same mistake in the file: refused before any connection.
    let same = format!(
        "{}{}{SEQUENCES}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 1)
    );
    let e = Config::parse(&same).unwrap_err();
    assert!(
        matches!(e, ConfigError::DuplicateOffset { offset: 1, .. }),
        "{e}"
    );

    // The client sets the offsets on its own sessions: still odd and even.
    let client = TicketClient::connect(config).await.unwrap();
    let ids = client.next_n("photos", 10).await.unwrap();
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
}

/// Two servers left at MariaDB's default global increment and offset
/// (1/1): shardflake's clients set their own sessions, so `check` is ok and
/// warns (naming what a plain SQL client would do), and the clients hand
/// out odd and even ids. Before: `check` failed with three problems (each
/// global differs from the file, and both "share" offset 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pair_at_mariadbs_default_globals_checks_ok_with_a_warning() {
    let (a, b) = (
        MariaDbServer::start().unwrap(),
        MariaDbServer::start().unwrap(),
    );
    let config = maria_pair_config(&a, &b);
    init_ok(&config).await;
    let report = admin::check(&config).await;
    let text = report.to_string();
    assert!(report.ok(), "{text}");
    assert_eq!(
        text.matches("warning: global auto_increment_increment/offset are MariaDB's defaults 1/1")
            .count(),
        2,
        "{text}"
    );
    let client = TicketClient::connect(config).await.unwrap();
    assert_eq!(
        client.next_n("photos", 10).await.unwrap(),
        (1..=10).collect::<Vec<_>>()
    );
}

/// 8 callers on both sequences while server `a` is SIGKILLed and restarted:
/// `b` serves while its marks last (a mark needs `a` too), then is
/// refused until `a` is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_pair_survives_a_kill_under_load_without_a_duplicate() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = maria_pair_config(&a, &b);
    init_ok(&config).await;
    let client = TicketClient::connect(config).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for t in 0..8 {
        let (client, stop) = (client.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let sequence = if t % 2 == 0 { "photos" } else { "blocks" };
            let (mut ids, mut errors) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match client.next(sequence).await {
                    Ok(id) => ids.push(id),
                    Err(e) => errors.push(e),
                }
            }
            (sequence, ids, errors)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.kill().unwrap();
    // b goes on through the ids already marked, then takes no mark a
    // does not hold too.
    wait_state(&client, "b", "no_high_water").await;
    assert_eq!(state(&client, "a"), "down");
    a.restart().unwrap();
    wait_state(&client, "a", "up").await;
    let a_back = calls(&client, "a");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    for t in tasks {
        let (sequence, ids, errors) = t.await.unwrap();
        assert_only_marks_refusals(sequence, &errors);
        if sequence == "photos" {
            photos.extend(ids);
        } else {
            // Each caller's segment ids increase.
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
            blocks.extend(ids);
        }
    }
    assert!(calls(&client, "a") > a_back, "a was not taken back");
    assert!(photos.len() > 100 && blocks.len() > 100);
    assert_unique(&photos);
    assert_unique(&blocks);
    let m = client.metrics();
    assert!(m[0].failovers > 0, "{m:?}");
    client.shutdown().await;
}

/// 8 callers on both sequences while server `a` of a PostgreSQL pair is
/// SIGKILLed (postmaster and children) and restarted on its data, in both
/// per-id styles. Every wait polls a condition under a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_pair_survives_a_kill_under_load_without_a_duplicate() {
    for style in ["sequence", "table"] {
        // The script's synchronous_commit=off lets a SIGKILL lose the last
        // commits (WAL still in shared memory): with it, a restarted here
        // behind its high-water and was refused (with the refusal disabled,
        // ~170 duplicates); `tickets check` warns about the setting.
        let sync = [("synchronous_commit", "on")];
        let (a, b) = (
            PgServer::start_with(&sync).unwrap(),
            PgServer::start_with(&sync).unwrap(),
        );
        let config = pg_pair_config(&a, &b, style);
        init_ok(&config).await;
        let client = TicketClient::connect(config).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let collected = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for t in 0..8 {
            let (client, stop, collected) = (client.clone(), stop.clone(), collected.clone());
            tasks.push(tokio::spawn(async move {
                let sequence = if t % 2 == 0 { "photos" } else { "blocks" };
                let (mut ids, mut errors) = (Vec::new(), Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match client.next(sequence).await {
                        Ok(id) => {
                            ids.push(id);
                            collected.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => errors.push(e),
                    }
                }
                (sequence, ids, errors)
            }));
        }
        let count = || collected.load(Ordering::Relaxed);
        wait_for(&client, "both servers in use", || {
            calls(&client, "a") > 50 && calls(&client, "b") > 50
        })
        .await;

        a.kill().unwrap();
        wait_state(&client, "a", "down").await;
        // b goes on through the ids already marked, then takes no mark a
        // does not hold too.
        wait_state(&client, "b", "no_high_water").await;
        assert_eq!(
            state(&client, "a"),
            "down",
            "{style}: a is not down while killed"
        );

        a.restart().unwrap();
        wait_state(&client, "a", "up").await;
        let (a_back, ids_back) = (calls(&client, "a"), count());
        wait_for(&client, "ids from a again after its restart", || {
            calls(&client, "a") > a_back + 50 && count() > ids_back + 200
        })
        .await;
        stop.store(true, Ordering::Relaxed);

        let (mut photos, mut blocks) = (Vec::new(), Vec::new());
        for t in tasks {
            let (sequence, ids, errors) = t.await.unwrap();
            assert_only_marks_refusals(style, &errors);
            if sequence == "photos" {
                photos.extend(ids);
            } else {
                // Each caller's segment ids increase.
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "{style}");
                blocks.extend(ids);
            }
        }
        assert_eq!(photos.len() + blocks.len(), count() as usize);
        assert!(photos.len() > 100 && blocks.len() > 100, "{style}");
        assert_unique(&photos);
        assert_unique(&blocks);
        let m = client.metrics();
        assert!(m[0].failovers > 0, "{style}: {m:?}");
        client.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mariadb_server_restored_from_a_dump_is_raised_past_its_marks() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = maria_pair_config(&a, &b);
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = client.next_n("photos", 20).await.unwrap();
    let dump = Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", a.port))
        .args(["app", "tickets_photos"])
        .output()
        .unwrap();
    assert!(dump.status.success());
    ids.extend(client.next_n("photos", 200).await.unwrap());
    client.record_high_water().await.unwrap();

    // Restore the old dump, restart (a restore's sessions are new).
    let path = std::env::temp_dir().join(format!("tickets-dump-{}.sql", a.port));
    std::fs::write(&path, &dump.stdout).unwrap();
    a.load(&path).unwrap();
    a.restart().unwrap();
    let behind = fence::counter_row(&a);
    assert!(
        behind < 200,
        "the dump did not set the counter back: {behind}"
    );

    // `check` sees it behind the marks written ahead of its ids.
    let report = admin::check(&config).await;
    assert!(
        !report.ok() && report.to_string().contains("behind the high-water"),
        "{report}"
    );
    // The running client's next session on it is checked against the marks
    // and raises it past them; so does a new client's. `repair` then finds
    // nothing behind (a checked session writes no mark ahead).
    ids.extend(client.next_n("photos", 50).await.unwrap());
    let fresh = TicketClient::connect(config.clone()).await.unwrap();
    assert_eq!(state(&fresh, "a"), "up");
    admin::repair(&config).await.unwrap();
    assert!(admin::check(&config).await.ok());
    wait_state(&client, "a", "up").await;
    ids.extend(client.next_n("photos", 200).await.unwrap());
    ids.extend(fresh.next_n("photos", 200).await.unwrap());
    assert_unique(&ids);
    let _ = std::fs::remove_file(path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_pair_per_id_and_segment() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    for style in ["sequence", "table"] {
        let config = pg_pair_config(&a, &b, style);
        if style == "table" {
            // A style is chosen once: reuse the servers under other names.
            for s in [&a, &b] {
                let (c, conn) = shardflake_tickets::tokio_postgres::connect(
                    &s.url(),
                    shardflake_tickets::tokio_postgres::NoTls,
                )
                .await
                .unwrap();
                tokio::spawn(conn);
                c.batch_execute("DROP SEQUENCE tickets_photos; DROP TABLE shardflake_ticket_segments, shardflake_ticket_hw")
                    .await
                    .unwrap();
            }
        }
        init_ok(&config).await;
        let report = admin::check(&config).await;
        assert!(report.problems.is_empty(), "{report}");
        let client = TicketClient::connect(config.clone()).await.unwrap();
        let ids = client.next_n("photos", 100).await.unwrap();
        assert_eq!(&ids[..4], &[1, 2, 3, 4], "{style}");
        assert_unique(&ids);

        let mut tasks = Vec::new();
        for _ in 0..8 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..300 {
                    ids.extend(client.next_n("blocks", 7).await.unwrap());
                }
                ids
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            let ids = t.await.unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]));
            all.extend(ids);
        }
        assert_eq!(all.len(), 8 * 300 * 7);
        assert_unique(&all);
        let report = client.shutdown().await;
        assert!(report.skipped_ids > 0, "{report:?}");
        // Tails are skipped: the next client's ids are past them.
        let next = TicketClient::connect(config).await.unwrap();
        all.extend(next.next_n("blocks", 20_000).await.unwrap());
        assert_unique(&all);
    }
}

/// A tail is skipped at shutdown, never given back: the next client
/// starts past every block the last one held (the one it used and the one
/// it fetched ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_tail_is_skipped_at_shutdown() {
    let pg = PgServer::start().unwrap();
    let config = Config::parse(&format!(
        "{}[[sequences]]\nname = \"solo\"\nmode = \"segment\"\n[segment]\nchunk = 100\nmin_step = 1000\nmax_step = 1000\n",
        server_toml("a", "postgres", &pg.url(), 1)
    ))
    .unwrap();
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let ids = client.next_n("solo", 250).await.unwrap();
    assert_eq!(ids, (1..=250).collect::<Vec<_>>());
    let report = client.shutdown().await;
    // 251..=1000, and 1001..=2000 fetched ahead (at a tenth used).
    assert_eq!(report.skipped_ids, 1750, "{report:?}");
    assert_eq!(client.next("solo").await.unwrap_err().code(), "unavailable");
    let next = TicketClient::connect(config).await.unwrap();
    assert_eq!(next.next("solo").await.unwrap(), 2001);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_server_set_back_is_raised_past_its_marks() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let config = pg_pair_config(&a, &b, "sequence");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut photos = client.next_n("photos", 100).await.unwrap();
    let mut blocks = client.next_n("blocks", 500).await.unwrap();
    client.record_high_water().await.unwrap();
    let (admin_a, conn) = shardflake_tickets::tokio_postgres::connect(
        &a.url(),
        shardflake_tickets::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // The segment row is never set back in place by accident ...
    let refused = admin_a
        .batch_execute("UPDATE shardflake_ticket_segments SET max_id = -100")
        .await
        .unwrap_err();
    assert!(
        format!("{refused:?}").contains("never set back in place"),
        "{refused:?}"
    );
    // ... but as if restored from an older backup by an operator who set
    // it back anyway, then its sessions cut.
    admin_a
        .batch_execute(
            "SET shardflake.rewind = on;
             SELECT setval('tickets_photos', 1, false);
             UPDATE shardflake_ticket_segments SET max_id = -100;
             RESET shardflake.rewind;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'shardflake-tickets';",
        )
        .await
        .unwrap();
    let report = admin::check(&config).await;
    assert!(
        !report.ok() && report.to_string().contains("behind the high-water"),
        "{report}"
    );
    photos.extend(client.next_n("photos", 20).await.unwrap());
    blocks.extend(client.next_n("blocks", 2000).await.unwrap());
    // `a` is raised past its marks by `repair`, or before it by the
    // client's first session on `a` after the cut, whichever runs first
    // (under load, often the client): either way `check` is clean after.
    let repaired = admin::repair(&config).await.unwrap();
    let report = admin::check(&config).await;
    assert!(report.ok(), "repaired {repaired:?}, then: {report}");
    wait_state(&client, "a", "up").await;
    photos.extend(client.next_n("photos", 100).await.unwrap());
    let fresh = TicketClient::connect(config).await.unwrap();
    assert_eq!(state(&fresh, "a"), "up");
    blocks.extend(fresh.next_n("blocks", 2000).await.unwrap());
    photos.extend(fresh.next_n("photos", 100).await.unwrap());
    assert!(
        fresh.metrics()[0].calls > 0,
        "a was not used after the repair"
    );
    assert_unique(&photos);
    assert_unique(&blocks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_32_bit_sequence_stops_at_its_maximum() {
    let m = maria(1, 1);
    let pg = PgServer::start().unwrap();
    for (kind, url) in [("mariadb", m.url()), ("postgres", pg.url())] {
        let config = Config::parse(&format!(
            "{}[[sequences]]\nname = \"small\"\nbits = 32\nstart = 4294967290\n[[sequences]]\nname = \"small_blocks\"\nbits = 32\nmode = \"segment\"\nstart = 4294967000\n[segment]\nchunk = 100\nmin_step = 100\nmax_step = 100\n",
            server_toml("a", kind, &url, 1)
        ))
        .unwrap();
        init_ok(&config).await;
        let client = TicketClient::connect(config).await.unwrap();
        let ids = client.next_n("small", 6).await.unwrap();
        assert_eq!(
            ids,
            (4_294_967_290..=4_294_967_295).collect::<Vec<_>>(),
            "{kind}"
        );
        for _ in 0..2 {
            let e = client.next("small").await.unwrap_err();
            assert_eq!(e.code(), "exhausted", "{kind}: {e}");
            assert!(e.to_string().contains("no id above 4294967295"), "{e}");
        }
        // The first chunk wholly at or above `start`: 4294967001..=4294967100.
        let blocks = client.next_n("small_blocks", 295).await.unwrap();
        assert_eq!(blocks[0], 4_294_967_001, "{kind}");
        assert_eq!(*blocks.last().unwrap(), 4_294_967_295, "{kind}");
        let e = client.next("small_blocks").await.unwrap_err();
        assert_eq!(e.code(), "exhausted", "{kind}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unreachable_server_at_start_is_a_clear_error() {
    let port = shardflake_testkit::free_port().unwrap();
    let dead = format!("mysql://root@127.0.0.1:{port}/app");
    let config = Config::parse(&format!(
        "{}{SEQUENCES}",
        server_toml("gone", "mariadb", &dead, 1)
    ))
    .unwrap();
    let e = TicketClient::connect(config.clone()).await.err().unwrap();
    assert_eq!(e.code(), "unavailable");
    let text = e.to_string();
    assert!(text.contains("gone: server \"gone\": connect"), "{text}");
    let report = admin::check(&config).await;
    assert!(
        !report.ok() && report.to_string().contains("unreachable"),
        "{report}"
    );

    // One of two unreachable: the other serves, the dead one is down.
    let m = maria(2, 1);
    let config = Config::parse(&format!(
        "{}{}{SEQUENCES}",
        server_toml("a", "mariadb", &m.url(), 1),
        server_toml("gone", "mariadb", &dead, 2)
    ))
    .unwrap();
    init_ok_partial(&config).await;
    // a's marks live on its peer, which never answers: refused by default.
    let e = TicketClient::connect(config.clone()).await.unwrap_err();
    assert!(
        e.to_string().contains("allow_without_marks"),
        "the refusal names the setting: {e}"
    );
    let mut config = config;
    config.failover.allow_without_marks = true;
    let client = TicketClient::connect(config).await.unwrap();
    assert_eq!(state(&client, "gone"), "down");
    let ids = client.next_n("photos", 10).await.unwrap();
    assert!(ids.iter().all(|i| i % 2 == 1));
}

async fn init_ok_partial(config: &Config) {
    let results = admin::init(config).await;
    assert!(results.iter().any(|s| s.result.is_ok()));
}

#[test]
fn a_malformed_file_is_a_clear_error() {
    let path = std::env::temp_dir().join(format!("tickets-bad-{}.toml", std::process::id()));
    std::fs::write(&path, "[[servers]]\nname = \"a\"\nkind = \"oracle\"\n").unwrap();
    let e = Config::load(&path).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("bad tickets configuration") && text.contains("oracle"),
        "{text}"
    );
    let _ = std::fs::remove_file(&path);
    let e = Config::load("/nonexistent/tickets.toml").unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }));
    assert_eq!(TicketError::from(e).code(), "bad_config");
}

/// Eight clients on one server (its peer down, or a one-server
/// deployment), 12,000 ids: every call is answered and no deadlock
/// happens. Flickr's `REPLACE INTO` on InnoDB deadlocked on the one row
/// (a delete and an insert under gap locks; retried), and with the guard's
/// delete trigger it ran as a real delete and insert: this test took
/// 35–52 s and failed one run in two ("did not answer within 1000 ms").
/// The counter row's `UPDATE` takes one row lock and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_clients_on_one_server_are_all_answered_without_a_deadlock() {
    let m = maria(1, 1);
    let config = Config::parse(&format!(
        "{}{SEQUENCES}",
        server_toml("a", "mariadb", &m.url(), 1)
    ))
    .unwrap();
    init_ok(&config).await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let config = config.clone();
            tokio::spawn(async move {
                let client = TicketClient::connect(config).await.unwrap();
                let mut ids = Vec::new();
                for _ in 0..300 {
                    ids.extend(client.next_n("photos", 5).await.unwrap());
                }
                ids
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert_eq!(all.len(), 8 * 300 * 5);
    assert_unique(&all);
    let deadlocks: u64 = m
        .sql("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        .unwrap()
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert_eq!(deadlocks, 0, "the counter row's updates deadlocked");
}

/// A table without its guard against being set back in place (a server
/// set up by an older shardflake) is reported by `check` until `init`
/// adds it, on both databases; a segment client hands out ids again after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_without_its_guard_is_reported_until_init() {
    let (ma, mb) = (maria(2, 1), maria(2, 2));
    let (pa, pb) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let maria_config = maria_pair_config(&ma, &mb);
    let pg_config = pg_pair_config(&pa, &pb, "table");
    for config in [&maria_config, &pg_config] {
        init_ok(config).await;
        assert!(admin::check(config).await.ok());
    }
    for t in ["update", "insert", "delete"] {
        ma.sql(&format!("DROP TRIGGER shardflake_ticket_guard_{t}"))
            .unwrap();
    }
    let (admin_a, conn) = shardflake_tickets::tokio_postgres::connect(
        &pa.url(),
        shardflake_tickets::tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    admin_a
        .batch_execute(
            "DROP TRIGGER shardflake_ticket_guard ON shardflake_ticket_segments;
             DROP TRIGGER shardflake_ticket_guard ON tickets_photos;",
        )
        .await
        .unwrap();
    for config in [&maria_config, &pg_config] {
        let report = admin::check(config).await;
        let text = report.to_string();
        assert!(
            !report.ok() && text.contains("no guard against setting it back in place"),
            "{text}"
        );
        init_ok(config).await;
        let report = admin::check(config).await;
        assert!(report.ok(), "{report}");
        let client = TicketClient::connect(config.clone()).await.unwrap();
        let ids = client.next_n("blocks", 10).await.unwrap();
        client.shutdown().await;
        let again = TicketClient::connect(config.clone()).await.unwrap();
        let next = again.next_n("blocks", 10).await.unwrap();
        assert!(next[0] > ids[9], "{ids:?} then {next:?}");
        again.shutdown().await;
    }
}

/// A PostgreSQL server set up when the sequence was the default, read
/// with a file that names no style (the table now): refused by `init`
/// and by every session with the setting that matches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sequence_style_server_read_as_table_style_names_the_setting() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    init_ok(&pg_pair_config(&a, &b, "sequence")).await;
    let table = Config::parse(&format!(
        "{}{}{SEQUENCES}",
        server_toml("a", "postgres", &a.url(), 1),
        server_toml("b", "postgres", &b.url(), 2)
    ))
    .unwrap();
    for s in admin::init(&table).await {
        let e = s.result.unwrap_err().to_string();
        assert!(
            e.contains("tickets_photos is a sequence here")
                && e.contains("postgres_tickets = \"sequence\""),
            "{e}"
        );
    }
    let e = TicketClient::connect(table).await.unwrap_err().to_string();
    assert!(e.contains("postgres_tickets = \"sequence\""), "{e}");
}

/// Review finding: `check` said "counter … is behind the high-water …
/// (restored?)" of servers never restored while clients ran. It read each
/// counter, then the marks: a block reserved between the two reads (its
/// mark written after its row moved) looked like a counter gone back. It
/// reads the marks first now. A segment client reserving blocks all the
/// time, and `check` run again and again beside it: never "behind".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_finds_no_counter_behind_while_a_client_reserves_blocks_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = repro::pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                n += client.next_n("blocks", 1000).await.unwrap().len();
            }
            n
        })
    };
    let mut behind = Vec::new();
    for _ in 0..30 {
        let report = admin::check(&config).await.to_string();
        if report.contains("behind the high-water") {
            behind.push(report);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let taken = load.await.unwrap();
    assert!(taken >= 30_000, "the client took only {taken} ids");
    assert!(
        behind.is_empty(),
        "{} of 30 checks said a counter was behind: {}",
        behind.len(),
        behind[0]
    );
}

/// The same warning after a segment tail given back while a peer was
/// down: the row was lowered, and the peer that missed the lowered mark
/// kept the block's mark above the row; every later `check` (and every
/// client's checked session) then said the server went back. Tails are
/// skipped now, never given back. Here a client holding a block on `a`
/// shuts down while `b`, which took the block's mark, is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tail_given_back_while_a_peer_is_down_leaves_no_counter_behind_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = repro::pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    // Chunks of 100 ids alternate between the servers: `a` owns the first.
    let of_a = |id: u64| ((id - 1) / 100).is_multiple_of(2);
    let mut ids = Vec::new();
    while !ids.last().is_some_and(|id| of_a(*id)) {
        ids.extend(client.next_n("blocks", 50).await.unwrap());
    }
    b.kill().unwrap();
    client.shutdown().await;
    b.restart().unwrap();
    let report = admin::check(&config).await.to_string();
    assert!(!report.contains("behind the high-water"), "{report}");
    let again = TicketClient::connect(config.clone()).await.unwrap();
    for _ in 0..10 {
        ids.extend(again.next_n("blocks", 500).await.unwrap());
    }
    again.shutdown().await;
    assert_unique(&ids);
}

/// A segment tail given back lowered a row other clients had already
/// read: a client that checked the server (a session opened for another
/// sequence) while a second client held a block took that block's mark as
/// one it knew written, and wrote it again at its shutdown, above the row
/// the second client had given its tail back to. `check` then said the
/// counter went back (an outside review: 21 of 483 runs, the gap always
/// one block's tail), with nothing restored. Tails are skipped now, never
/// given back: a row and its marks only go up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tail_left_by_one_client_is_no_counter_behind_for_another_mariadb() {
    let m = maria(1, 1);
    let config = Config::parse(&format!(
        "{}[[sequences]]\nname = \"photos\"\n[[sequences]]\nname = \"events\"\nmode = \"segment\"\n[segment]\nchunk = 100\nmin_step = 1000\nmax_step = 1000\n",
        server_toml("a", "mariadb", &m.url(), 1)
    ))
    .unwrap();
    init_ok(&config).await;
    let holder = TicketClient::connect(config.clone()).await.unwrap();
    let mut events = holder.next_n("events", 3).await.unwrap();
    // Checks the server, every sequence, while `holder` holds its block.
    let other = TicketClient::connect(config.clone()).await.unwrap();
    other.next_n("photos", 3).await.unwrap();
    holder.shutdown().await;
    other.shutdown().await;
    let report = admin::check(&config).await;
    assert!(report.ok(), "{report}");
    let again = TicketClient::connect(config.clone()).await.unwrap();
    events.extend(again.next_n("events", 3).await.unwrap());
    again.shutdown().await;
    assert_unique(&events);
}
