//! What `init`, `check` and the clients say, where the text is what an
//! operator acts on: each on real servers.

use shardflake_tickets::{TicketClient, admin};

use super::repro::pair;
use super::{assert_unique, init_ok, maria};

/// The lines `init` printed for `server`.
async fn init_lines(config: &shardflake_tickets::Config, server: &str) -> String {
    admin::init(config)
        .await
        .into_iter()
        .find(|s| s.server == server)
        .unwrap()
        .result
        .unwrap_or_else(|e| panic!("init {server}: {e}"))
        .join("\n")
}

/// A dead server put back as a fresh, empty one (same name and offset):
/// `init` makes its counter row at the sequence's start, but no client
/// hands out an id from it below its residue class's marks (each raises
/// it past them at its first session there). `init` says so, and where its
/// ids will start. Before: "photos: table tickets_photos (bigint
/// unsigned), ids from 1 on", ids the dead server had handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_on_a_fresh_replacement_says_where_its_ids_start_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..30 {
        ids.extend(client.next_n("photos", 200).await.unwrap());
    }
    client.shutdown().await;
    drop(a);
    let mark: u64 = b
        .sql("SELECT MAX(high_water) FROM shardflake_ticket_hw WHERE server_name = '@1of2' AND sequence_name = 'photos'")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(mark > 3000, "a's marks only reach {mark}");
    let fresh = maria(2, 1);
    let replaced = pair(&fresh, &b, "");
    let said = init_lines(&replaced, "a").await;
    assert!(
        said.contains(&format!("photos: table tickets_photos (bigint unsigned), counter at 1, behind the marks of its residue class @1of2 (ids up to {mark} were handed out")
        ) && said.contains(&format!("so ids from above {mark} on"))
            && !said.contains("ids from 1 on"),
        "{said}"
    );
    // What it said happens.
    let client = TicketClient::connect(replaced.clone()).await.unwrap();
    let mut after = Vec::new();
    for _ in 0..10 {
        after.extend(client.next_n("photos", 20).await.unwrap());
    }
    client.shutdown().await;
    let of_a: Vec<u64> = after.iter().copied().filter(|id| id % 2 == 1).collect();
    assert!(!of_a.is_empty(), "the fresh a never served");
    assert!(
        of_a.iter().all(|id| *id > mark),
        "{of_a:?} not above {mark}"
    );
    ids.extend(after);
    assert_unique(&ids);
    // Once raised, init again says where the counter is.
    let again = init_lines(&replaced, "a").await;
    assert!(!again.contains("behind the marks"), "{again}");
}

/// Two `init`s at once with files naming different places for the marks
/// each take back the record they wrote (`stores::two_inits_at_once_…`):
/// the servers record no place, as this test leaves them. A client and
/// `check` say that no `init` completed and to run it once with the file
/// every client uses. Before: "initialised by an older shardflake".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_of_the_marks_place_taken_back_is_not_called_an_older_release_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    for server in [&a, &b] {
        server
            .sql("DELETE FROM shardflake_ticket_marks_at")
            .unwrap();
    }
    // Refused at connect, or started with both servers refused.
    let said = match TicketClient::connect(config.clone()).await {
        Ok(client) => {
            let e = client
                .next_n("photos", 1)
                .await
                .expect_err("an id from servers recording no place for the marks");
            let reasons: Vec<String> = client
                .metrics()
                .into_iter()
                .filter_map(|m| m.reason)
                .collect();
            client.shutdown().await;
            format!("{e}\n{}", reasons.join("\n"))
        }
        Err(e) => e.to_string(),
    };
    let report = admin::check(&config).await;
    let report = format!("{said}\n{report}");
    assert!(
        report.contains("no `shardflake tickets init` has completed on it")
            && report.contains("two inits run at once")
            && report.contains("run `shardflake tickets init --config FILE` once")
            && !report.contains("initialised by an older shardflake"),
        "{report}"
    );
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    assert_unique(&client.next_n("photos", 10).await.unwrap());
    client.shutdown().await;
}
