//! The marks written ahead of the ids, from an outside review of a pair of
//! MariaDB ticket servers (run r1): a block handed out while its mark sat
//! only on its own server (B4, B6), per-id counters raised by clients that
//! never asked for them, and what a client says while a dump is loaded.
//! Each on real servers; each failed on the code before (see the note on
//! each).

use std::time::{Duration, Instant};

use shardflake_testkit::MariaDbServer;
use shardflake_tickets::{HighWaterStore, PeersStore, ResidueClass, TicketClient, TicketError};

use super::repro::{calls, dump, pair, restore};
use super::{assert_unique, init_ok, maria};

/// Takes ids of `blocks` 100 at a time until `server` answered `blocks`
/// reservations (bounded).
async fn take_from(client: &TicketClient, server: &str, blocks: u64, ids: &mut Vec<u64>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls(client, server) < blocks {
        assert!(
            Instant::now() < deadline,
            "{server} never reserved {blocks}"
        );
        ids.extend(client.next_n("blocks", 100).await.unwrap());
    }
}

/// B4: a short-lived client (`tickets next`) checks both servers, then its
/// block is reserved from `a` just as `a`'s only peer `b` dies, so the
/// block's mark can reach `a`'s own copy only. `a` is then restored from
/// an older dump (its copy of the marks rolled back with it), `b` comes
/// back without the mark, and a fresh client takes `a` back against `b`'s
/// marks. No id of that block may be handed out: a mark counts only once
/// a place other than its server holds it (with two places, the peer).
/// Before: the block's mark on `a` alone was enough, its ids went out,
/// and the fresh client handed them out again (the review: 5 of 10,705).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_block_whose_mark_only_its_own_server_took_is_never_handed_out_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut ids = Vec::new();
    let earlier = TicketClient::connect(config.clone()).await.unwrap();
    take_from(&earlier, "a", 1, &mut ids).await;
    earlier.shutdown().await;
    drop(earlier);
    let path = dump(&a, "b4");
    let next = TicketClient::connect(config.clone()).await.unwrap();
    b.kill().unwrap();
    let taken = next.next_n("blocks", 5).await;
    if let Ok(got) = &taken {
        ids.extend(got);
    }
    next.shutdown().await;
    drop(next);
    restore(&a, &path);
    b.restart().unwrap();
    let fresh = TicketClient::connect(config.clone()).await.unwrap();
    take_from(&fresh, "a", 3, &mut ids).await;
    fresh.shutdown().await;
    let _ = std::fs::remove_file(path);
    assert_unique(&ids);
    assert!(
        taken.is_err(),
        "ids of a block whose mark only its own server took went out: {taken:?}"
    );
}

/// B4 per id: a running client goes on with `a`'s per-id ids after `a`'s
/// only peer `b` died, past the last mark `b` took. `a` is then restored
/// from an older dump, `b` comes back, and a fresh client takes `a` back
/// against `b`'s marks. No id past the marks `b` holds may have gone out.
/// Before: the running client's marks reached `a`'s own copy only, its
/// ids went out, and the fresh client handed them out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_per_id_id_past_the_marks_only_its_own_server_took_is_never_handed_out_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = shardflake_tickets::Config::parse(&format!(
        "{}{}{}",
        super::server_toml("a", "mariadb", &a.url(), 1),
        super::server_toml("b", "mariadb", &b.url(), 2),
        super::repro::FIXED.replace("[failover]\n", "[failover]\nmark_ahead = 10\n")
    ))
    .unwrap();
    assert_eq!(config.failover.mark_ahead, 10);
    init_ok(&config).await;
    let path = dump(&a, "b4-per-id");
    let running = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = running.next_n("photos", 20).await.unwrap();
    b.kill().unwrap();
    for _ in 0..100 {
        if let Ok(id) = running.next("photos").await {
            ids.push(id);
        }
    }
    running.shutdown().await;
    drop(running);
    restore(&a, &path);
    b.restart().unwrap();
    let fresh = TicketClient::connect(config.clone()).await.unwrap();
    ids.extend(fresh.next_n("photos", 200).await.unwrap());
    fresh.shutdown().await;
    let _ = std::fs::remove_file(path);
    assert_unique(&ids);
}

/// The per-id counter of `photos` on `m`.
fn photos_counter(m: &MariaDbServer) -> u64 {
    m.sql("SELECT MAX(id) FROM tickets_photos")
        .unwrap()
        .parse()
        .unwrap()
}

/// Short-lived clients that take only segment ids (hundreds of `tickets
/// next events` processes) leave a per-id counter where it is. Before:
/// every client's first session wrote per-id marks `mark_ahead` ids ahead
/// of every per-id counter and the next client raised the counter past
/// them, 2,000 a client and server here (the review: `photos` 956,007 to
/// 958,007 per `next events` process).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clients_that_never_ask_for_a_per_id_sequence_leave_its_counter_alone_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut photos = Vec::new();
    let user = TicketClient::connect(config.clone()).await.unwrap();
    photos.extend(user.next_n("photos", 10).await.unwrap());
    user.shutdown().await;
    drop(user);
    let mut blocks = Vec::new();
    let first = TicketClient::connect(config.clone()).await.unwrap();
    blocks.extend(first.next_n("blocks", 5).await.unwrap());
    first.shutdown().await;
    drop(first);
    let before = (photos_counter(&a), photos_counter(&b));
    for _ in 0..5 {
        let client = TicketClient::connect(config.clone()).await.unwrap();
        blocks.extend(client.next_n("blocks", 5).await.unwrap());
        client.shutdown().await;
    }
    let after = (photos_counter(&a), photos_counter(&b));
    assert_eq!(after, before, "per-id counters raised by segment clients");
    let user = TicketClient::connect(config.clone()).await.unwrap();
    photos.extend(user.next_n("photos", 10).await.unwrap());
    user.shutdown().await;
    assert_unique(&photos);
    assert_unique(&blocks);
}

/// While a dump is loaded into `a`, each of its tables is recreated empty
/// before its rows go in: here its lattice version, as the dump leaves it
/// for a moment. A client's refusal names a restore under way (and `init`
/// only if it stays), and a mark of `b`'s class is merely not taken by
/// `a`, not refused as if a `reshape` had changed `a`'s lattice. Before:
/// "made by an older shardflake: run `shardflake tickets init`", and the
/// mark write of `b` failed with `lattice_changed` ("restart it with the
/// file reshape was given"), which refuses `b` itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dump_being_loaded_is_named_and_refuses_no_peer_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = client.next_n("photos", 10).await.unwrap();
    client.shutdown().await;
    drop(client);
    a.sql("DELETE FROM shardflake_ticket_lattice_version")
        .unwrap();
    let store = PeersStore::new(config.clone());
    let class = ResidueClass::named(&config, "b");
    let holder = store.holder(&class).await.unwrap().expect("b's holder");
    let written = store
        .record(
            &class,
            Some(&holder.identity),
            &[("photos".into(), 1 << 40)],
        )
        .await;
    let e = written.expect_err("a took a mark with no lattice version");
    assert!(
        !matches!(e, TicketError::LatticeChanged { .. }) && !e.to_string().contains("reshape"),
        "{e}"
    );
    let fresh = TicketClient::connect(config.clone()).await.unwrap();
    let reason = fresh
        .metrics()
        .into_iter()
        .find(|m| m.name == "a")
        .and_then(|m| m.reason)
        .unwrap_or_default();
    assert!(
        reason.contains("a restore in progress") && reason.contains("if it stays"),
        "{reason}"
    );
    a.sql("INSERT INTO shardflake_ticket_lattice_version (one, version, reshaping) VALUES (1, 1, FALSE)")
        .unwrap();
    super::wait_state(&fresh, "a", "up").await;
    ids.extend(fresh.next_n("photos", 10).await.unwrap());
    fresh.shutdown().await;
    assert_unique(&ids);
}
