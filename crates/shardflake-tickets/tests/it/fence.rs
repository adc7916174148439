//! Issue 36, item 5: the lattice's version, enforced by the database on
//! every ticket and block. A client left running on the file of before a
//! `reshape` (a rolling deploy) is refused at its next call on the sessions
//! it already holds, not only at its next session. Each on real servers.

use std::time::{Duration, Instant};

use shardflake_testkit::PgServer;
use shardflake_tickets::{Config, PeersStore, TicketClient, admin};

use super::repro::FIXED;
use super::{assert_unique, init_ok, maria, server_toml, state};

/// F6, a rolling deploy after `tickets reshape`: a client on the old file,
/// its sessions on both servers open and pooled, another client reshapes
/// (increment 2 to 4, `a`'s ids still odd), a client on the new file takes ids; the old
/// client's next per-id call is refused (`lattice_changed` on both servers),
/// and its blocks stop at the ones it already held, all below every new
/// id. Before: the old client kept issuing on its pooled sessions, on the
/// old lattice, over the new client's ids.
async fn an_old_client_is_refused_at_its_next_call(kind: &str, style: &str, a: &str, b: &str) {
    let file = |increment: &str, offset_a, offset_b| {
        Config::parse(&format!(
            "{style}{increment}{}{}{FIXED}",
            server_toml("a", kind, a, offset_a),
            server_toml("b", kind, b, offset_b)
        ))
        .unwrap()
    };
    // Room for two more servers: a keeps its residue mod 2, so only the
    // lattice's version tells the old client's answers from the new.
    let (before, after) = (file("", 1, 2), file("increment = 4\n", 1, 3));
    init_ok(&before).await;
    let old = TicketClient::connect(before).await.unwrap();
    let mut photos = Vec::new();
    let mut blocks = Vec::new();
    for _ in 0..10 {
        photos.extend(old.next_n("photos", 20).await.unwrap());
        blocks.extend(old.next_n("blocks", 100).await.unwrap());
    }
    let store = PeersStore::new(after.clone());
    let done = admin::reshape(&after, &store).await.unwrap();
    assert_eq!(done.len(), 2, "{kind} {style}: {done:?}");
    let new = TicketClient::connect(after).await.unwrap();
    for _ in 0..10 {
        photos.extend(new.next_n("photos", 20).await.unwrap());
        blocks.extend(new.next_n("blocks", 300).await.unwrap());
    }
    let refused = old
        .next_n("photos", 10)
        .await
        .expect_err("the old client handed out per-id tickets after the reshape");
    assert!(refused.to_string().contains("reshape"), "{refused}");
    for server in ["a", "b"] {
        assert_eq!(
            state(&old, server),
            "lattice_changed",
            "{server}: {refused}"
        );
    }
    // The blocks it held are handed out, then it is refused: bounded.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "the old client still hands out blocks"
        );
        match old.next_n("blocks", 100).await {
            Ok(ids) => blocks.extend(ids),
            Err(e) => {
                assert!(e.to_string().contains("reshape"), "{e}");
                break;
            }
        }
    }
    photos.extend(new.next_n("photos", 20).await.unwrap());
    blocks.extend(new.next_n("blocks", 3000).await.unwrap());
    assert_unique(&photos);
    assert_unique(&blocks);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_client_is_refused_at_its_next_call_after_a_reshape_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    an_old_client_is_refused_at_its_next_call("mariadb", "", &a.url(), &b.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_client_is_refused_at_its_next_call_after_a_reshape_postgres_table() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    an_old_client_is_refused_at_its_next_call("postgres", "", &a.url(), &b.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_old_client_is_refused_at_its_next_call_after_a_reshape_postgres_sequence() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let style = "postgres_tickets = \"sequence\"\n";
    an_old_client_is_refused_at_its_next_call("postgres", style, &a.url(), &b.url()).await;
}
