//! Issue 30: `GET /v1/tickets/photos?count=4` answered
//! `["11","10","13","12"]`: the ids of one per-id reply come from the
//! servers in turn, each counting on its own residue. Every reply of
//! `next_n` (which the service, gRPC and `tickets next` return as is) is in
//! increasing order.

use shardflake_tickets::TicketClient;

use super::{init_ok, maria, maria_pair_config};

/// `a` far ahead of `b`, so ids taken from the two in turn interleave out
/// of order. Before: `[101, 2, 103, 4]` (or `[2, 101, 4, 103]`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_per_id_reply_is_in_increasing_order() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = maria_pair_config(&a, &b);
    init_ok(&config).await;
    a.sql("UPDATE tickets_photos SET id = 101 WHERE stub = 'a'")
        .unwrap();
    let client = TicketClient::connect(config).await.unwrap();
    for _ in 0..3 {
        let ids = client.next_n("photos", 4).await.unwrap();
        let (odd, even) = ids.iter().partition::<Vec<u64>, _>(|&&id| id % 2 == 1);
        assert!(
            !odd.is_empty() && !even.is_empty(),
            "one server only: {ids:?}"
        );
        assert!(ids.is_sorted(), "not increasing: {ids:?}");
    }
    client.shutdown().await;
}
