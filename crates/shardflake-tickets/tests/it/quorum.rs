//! The marks are a read/write quorum over the places the file names (every
//! server, and etcd when `[marks]` names it): a peer that missed marks
//! while it was down never vouches alone. Each on real servers; each failed
//! on the code before (see the note on each).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shardflake_testkit::{MariaDbServer, PgServer};
use shardflake_tickets::high_water::stores;
use shardflake_tickets::{Config, PeersStore, TicketClient};

use super::live_restore::{pg_dump, psql};
use super::repro::{dump, restore};
use super::{assert_unique, init_ok, maria, server_toml, state, wait_state};

/// Three servers of `kind`, marks written `mark_ahead = 10` ids ahead, so
/// that the ids handed out while a peer is down go past the marks it holds.
fn three(kind: &str, urls: [&str; 3]) -> Config {
    let servers: String = ["a", "b", "c"]
        .iter()
        .zip(urls)
        .enumerate()
        .map(|(i, (name, url))| server_toml(name, kind, url, i as u64 + 1))
        .collect();
    Config::parse(&format!(
        r#"{servers}
[failover]
attempt_timeout_ms = 1000
timeout_ms = 3000
probe_interval_ms = 50
high_water_interval_ms = 50
mark_ahead = 10

[segment]
chunk = 100
min_step = 1000
max_step = 1000

[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"
"#
    ))
    .unwrap()
}

/// Per-id and segment ids from `client`, `rounds` calls of each; a
/// refused or unavailable call is fine (it hands out nothing).
async fn take(client: &TicketClient, rounds: usize, photos: &mut Vec<u64>, blocks: &mut Vec<u64>) {
    for _ in 0..rounds {
        if let Ok(got) = client.next_n("photos", 60).await {
            photos.extend(got);
        }
        if let Ok(got) = client.next_n("blocks", 3000).await {
            blocks.extend(got);
        }
    }
}

/// E1: three servers; `c` down while `a` hands out ids (its marks on `b`
/// and on its own copy); then `b`, the up-to-date peer, down, `c`, the
/// stale one, back, and `a` restored from a dump of before. A new client
/// must not take `a` on `c`'s word alone: `c` is one of the two places
/// other than `a`, and a mark write needed two of the three places, so
/// only both of them together are sure to hold every mark. It refuses `a`
/// (`no_high_water`) until `b` is back, then raises `a` past every mark.
/// Before: a load took the largest mark of every place that answered,
/// `c` alone, and `a` handed out again the ids it had handed out while
/// `c` was down (MariaDB: 79 of 720 per-id ids twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_peer_never_vouches_alone_with_three_servers_mariadb() {
    let servers = [maria(3, 1), maria(3, 2), maria(3, 3)];
    let urls = servers.each_ref().map(|s| s.url());
    let config = three("mariadb", urls.each_ref().map(String::as_str));
    stale_peer(
        config,
        &servers,
        |s: &MariaDbServer| s.kill().unwrap(),
        |s: &MariaDbServer| s.restart().unwrap(),
        |s: &MariaDbServer| dump(s, "quorum-night"),
        |s: &MariaDbServer, path: &Path| restore(s, path),
    )
    .await;
}

/// E1 on PostgreSQL (the default table style; the dump recreates every
/// table, `pg_dump --clean`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_peer_never_vouches_alone_with_three_servers_postgres() {
    let servers = [(); 3].map(|_| PgServer::start().unwrap());
    let urls = servers.each_ref().map(|s| s.url());
    let config = three("postgres", urls.each_ref().map(String::as_str));
    stale_peer(
        config,
        &servers,
        |s: &PgServer| s.kill().unwrap(),
        |s: &PgServer| s.restart().unwrap(),
        |s: &PgServer| pg_dump(s, "quorum-night", &["--clean"]),
        |s: &PgServer, path: &Path| psql(s, &[], path),
    )
    .await;
}

/// The scenario of the tests above on servers `[a, b, c]` of `config`.
async fn stale_peer<S>(
    config: Config,
    [a, b, c]: &[S; 3],
    kill: impl Fn(&S),
    restart: impl Fn(&S),
    dump: impl Fn(&S) -> PathBuf,
    restore: impl Fn(&S, &Path),
) {
    init_ok(&config).await;
    let (mut photos, mut blocks) = (Vec::new(), Vec::new());
    let client = TicketClient::connect(config.clone()).await.unwrap();
    take(&client, 2, &mut photos, &mut blocks).await;
    let night = dump(a);
    kill(c);
    // `a` hands out ids past every mark `c` holds of its class.
    take(&client, 6, &mut photos, &mut blocks).await;
    assert!(
        super::calls(&client, "a") > 0 && state(&client, "a") == "up",
        "{:?}",
        client.metrics()
    );
    client.shutdown().await;
    drop(client);

    kill(b);
    restart(c);
    restore(a, &night);
    let _ = std::fs::remove_file(&night);
    let client =
        TicketClient::start_with_store(config.clone(), stores(PeersStore::new(config.clone())))
            .await;
    take(&client, 4, &mut photos, &mut blocks).await;
    assert_unique(&photos);
    assert_unique(&blocks);
    assert_eq!(
        state(&client, "a"),
        "no_high_water",
        "{:?}",
        client.metrics()
    );

    // The up-to-date peer back: `a` is raised past its marks and serves.
    let of_a = |ids: &[u64]| ids.iter().filter(|id| *id % 3 == 1).count();
    let before = of_a(&photos);
    restart(b);
    wait_state(&client, "a", "up").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while of_a(&photos) < before + 20 {
        assert!(Instant::now() < deadline, "{:?}", client.metrics());
        take(&client, 1, &mut photos, &mut blocks).await;
    }
    take(&client, 2, &mut photos, &mut blocks).await;
    client.shutdown().await;
    assert_unique(&photos);
    assert_unique(&blocks);
}
