//! MariaDB per-id tickets as one counter row advanced by `UPDATE … SET id
//! = LAST_INSERT_ID(id) + increment` (issue 39 item 4), and its guard
//! (issue 36): the guard proved in every answer, and a table of the
//! `REPLACE` form converted in place by `init` while clients run. Each on
//! real servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use shardflake_tickets::mysql_async::{self, prelude::Queryable};
use shardflake_tickets::{TicketClient, admin};

use super::fence::counter_row;
use super::repro::pair;
use super::{assert_unique, init_ok, maria, state, wait_state};

/// Every trigger on `tickets_photos` on `server`, dropped (whatever their
/// names: the test reads the same on the code before the counter row).
fn drop_photos_triggers(server: &shardflake_testkit::MariaDbServer) {
    let names = server
        .sql("SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = 'app' AND EVENT_OBJECT_TABLE = 'tickets_photos'")
        .unwrap();
    assert!(!names.trim().is_empty(), "no trigger on tickets_photos");
    for name in names.split_whitespace() {
        server.sql(&format!("DROP TRIGGER {name}")).unwrap();
    }
}

/// Issue 36, review finding: the guard of a per-id table dropped under a
/// running client (its sessions already checked). Its next answer from
/// that server is refused (`misconfigured`, naming `init`): the answer
/// carries the proof the guard's update trigger ran, in the same round
/// trip. No id of `a` is handed out after the drop; `init` puts the guard
/// back and the client takes `a` back on its own. Before: only a new
/// session looked, and the client went on taking `a`'s ids unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guard_dropped_under_a_running_client_refuses_its_next_answer_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = client.next_n("photos", 100).await.unwrap();
    assert!(ids.iter().any(|id| id % 2 == 1), "a never served");
    drop_photos_triggers(&a);
    let mut after = Vec::new();
    for _ in 0..20 {
        after.extend(client.next_n("photos", 10).await.unwrap());
    }
    let of_a: Vec<_> = after.iter().filter(|id| *id % 2 == 1).collect();
    assert!(of_a.is_empty(), "a handed out {of_a:?} without its guard");
    assert_eq!(state(&client, "a"), "misconfigured");
    ids.extend(after);
    let report = admin::check(&config).await;
    assert!(
        !report.ok()
            && report
                .to_string()
                .contains("no guard against setting it back"),
        "{report}"
    );
    init_ok(&config).await;
    wait_state(&client, "a", "up").await;
    for _ in 0..20 {
        ids.extend(client.next_n("photos", 10).await.unwrap());
    }
    assert!(
        ids.iter().rev().take(200).any(|id| id % 2 == 1),
        "a never served again"
    );
    assert_unique(&ids);
}

/// A server set up by an older shardflake: `tickets_photos` of the
/// `REPLACE` form (`id auto_increment`, `stub UNIQUE`, its old guard),
/// past 500, and a client of that release still taking `REPLACE`
/// tickets on it while `init` runs, with a client of this release taking
/// ids from the pair. `check` names the form and `init`; `init` converts
/// the table in place: the old client is refused from then on, the row
/// starts above every id the table handed out, a second `init` changes
/// nothing, and no id is handed out twice across both clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_of_the_replace_form_is_converted_in_place_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    a.sql(
        "DROP TABLE tickets_photos;
         CREATE TABLE tickets_photos (id bigint unsigned NOT NULL auto_increment PRIMARY KEY, stub char(1) NOT NULL default '' UNIQUE) ENGINE=InnoDB;
         CREATE TRIGGER tickets_photos_guard_v BEFORE INSERT ON tickets_photos FOR EACH ROW SET @shardflake_replacing = 1;
         REPLACE INTO tickets_photos (id, stub) VALUES (501, 'a');",
    )
    .unwrap();
    let report = admin::check(&config).await;
    assert!(
        !report.ok() && report.to_string().contains("REPLACE form"),
        "{report}"
    );

    // The old client: REPLACE tickets on a, until refused.
    let refused = Arc::new(AtomicBool::new(false));
    let old = {
        let (url, refused) = (a.url(), refused.clone());
        tokio::spawn(async move {
            let mut conn = mysql_async::Conn::from_url(url).await.unwrap();
            conn.query_drop("SET SESSION auto_increment_increment = 2, auto_increment_offset = 1")
                .await
                .unwrap();
            let mut ids = Vec::new();
            loop {
                match conn
                    .query_drop("REPLACE INTO tickets_photos (stub) VALUES ('a')")
                    .await
                {
                    Ok(()) => ids.push(conn.last_insert_id().unwrap()),
                    Err(e) => {
                        assert!(e.to_string().contains("never set back in place"), "{e}");
                        refused.store(true, Ordering::Relaxed);
                        return ids;
                    }
                }
            }
        })
    };
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = Vec::new();
    let new = {
        let client = client.clone();
        let refused = refused.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            while !refused.load(Ordering::Relaxed) {
                ids.extend(client.next_n("photos", 5).await.unwrap());
            }
            ids
        })
    };
    let done = admin::init(&config).await;
    let said = format!("{:?}", done[0].result);
    assert!(said.contains("converted to the counter row"), "{said}");
    let old_ids = old.await.unwrap();
    ids.extend(new.await.unwrap());
    assert!(!old_ids.is_empty(), "the old client took no ticket");
    let largest_old = *old_ids.iter().max().unwrap();
    assert!(
        counter_row(&a) > largest_old,
        "{} <= {largest_old}",
        counter_row(&a)
    );

    // a comes back (its table is new to the client: raised past the marks).
    wait_state(&client, "a", "up").await;
    for _ in 0..40 {
        ids.extend(client.next_n("photos", 10).await.unwrap());
    }
    assert!(
        ids.iter().any(|id| id % 2 == 1 && *id > largest_old),
        "a never served after the conversion"
    );
    let row = counter_row(&a);
    let again = admin::init(&config).await;
    let said = format!("{:?}", again[0].result);
    assert!(!said.contains("converted"), "{said}");
    assert_eq!(counter_row(&a), row, "a second init moved the counter");
    let report = admin::check(&config).await;
    assert!(report.ok(), "{report}");
    ids.extend(old_ids);
    assert_unique(&ids);
}

/// The limit the guide states: the delete guard (`…_ctr_d`) dropped alone
/// while the update guard stays. The per-ticket proof comes from the update
/// trigger, so a running client's open sessions go on (no per-ticket
/// statement can see a trigger that does not fire); a row set lower by an
/// `UPDATE` is still refused; every new session refuses the server, and
/// `check` reports it. A row deleted and inserted again lower (what the
/// dropped trigger refused) goes in through the insert trigger, which
/// leaves it vouched for by no guard: the running client's next answers
/// from `a` are refused (`recreated`, then `a` is refused for its missing
/// guard), never handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_delete_guard_dropped_alone_is_seen_by_new_sessions_and_check_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = client.next_n("photos", 100).await.unwrap();
    a.sql("DROP TRIGGER tickets_photos_ctr_d").unwrap();

    // Open sessions go on: the update guard's proof is there.
    let after = client.next_n("photos", 100).await.unwrap();
    assert!(after.iter().any(|id| id % 2 == 1), "a stopped serving");
    assert_eq!(state(&client, "a"), "up");
    ids.extend(after);
    let e = a
        .sql("UPDATE tickets_photos SET id = 1 WHERE stub = 'a'")
        .unwrap_err()
        .to_string();
    assert!(e.contains("is never set back in place"), "{e}");

    // Every new session and check see the guard incomplete.
    let report = admin::check(&config).await;
    assert!(
        !report.ok()
            && report
                .to_string()
                .contains("no guard against setting it back"),
        "{report}"
    );
    let fresh = TicketClient::connect(config.clone()).await.unwrap();
    assert_eq!(state(&fresh, "a"), "misconfigured");
    fresh.shutdown().await;

    // Deleted and inserted again lower: the running client's next answers
    // from `a` are refused.
    let last_of_a = *ids.iter().filter(|id| *id % 2 == 1).max().unwrap();
    a.sql(&format!(
        "DELETE FROM tickets_photos; INSERT INTO tickets_photos (stub, id) VALUES ('a', {})",
        last_of_a - 40
    ))
    .unwrap();
    for _ in 0..10 {
        ids.extend(client.next_n("photos", 10).await.unwrap());
    }
    assert_ne!(state(&client, "a"), "up");
    client.shutdown().await;
    assert_unique(&ids);
}

/// The `CREATE TRIGGER` statements of every trigger on `tickets_photos`
/// on `server`, as an operator copies them before dropping them.
async fn photos_trigger_text(conn: &mut mysql_async::Conn) -> Vec<String> {
    conn.query(
        "SELECT CONCAT('CREATE TRIGGER ', TRIGGER_NAME, ' ', ACTION_TIMING, ' ', EVENT_MANIPULATION, ' ON tickets_photos FOR EACH ROW ', ACTION_STATEMENT) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = 'app' AND EVENT_OBJECT_TABLE = 'tickets_photos'",
    )
    .await
    .unwrap()
}

/// Review finding E5: between two answers of an idle running client, an
/// operator drops the counter row's whole guard, sets the row back (above
/// that client's last answer from the server, below ids another client
/// took since), and puts the guard back: once with `init`, once from the
/// triggers' own text. The idle client's pooled sessions open no new
/// checked session, so only what its next answer carries can show it.
/// Before: the guard's proof was there again and the table was the same,
/// and the idle client handed out the other client's ids again. Now the
/// row carries what its guard last vouched for; a row moved outside the
/// guard (or under a guard made anew) gives no proof until a client
/// raises it past the marks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guard_replaced_between_two_answers_hands_out_nothing_twice_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let idle = TicketClient::connect(config.clone()).await.unwrap();
    let busy = TicketClient::connect(config.clone()).await.unwrap();
    let mut admin_conn = mysql_async::Conn::from_url(a.url()).await.unwrap();
    let mut ids = Vec::new();
    for by_hand in [false, true] {
        let mine = idle.next_n("photos", 20).await.unwrap();
        let last_of_a = *mine
            .iter()
            .filter(|id| *id % 2 == 1)
            .max()
            .expect("a never served");
        ids.extend(mine);
        ids.extend(busy.next_n("photos", 400).await.unwrap());
        assert!(counter_row(&a) > last_of_a + 100, "busy took no id of a");
        let text = photos_trigger_text(&mut admin_conn).await;
        drop_photos_triggers(&a);
        a.sql(&format!(
            "UPDATE tickets_photos SET id = {} WHERE stub = 'a'",
            last_of_a + 2
        ))
        .unwrap();
        match by_hand {
            false => init_ok(&config).await,
            true => {
                for sql in text {
                    admin_conn.query_drop(sql).await.unwrap();
                }
            }
        }
        for _ in 0..20 {
            ids.extend(idle.next_n("photos", 10).await.unwrap());
        }
    }
    assert_unique(&ids);
}

/// E5 in segment mode: the segment table's whole guard dropped, `a`'s row
/// set back to where it was when an idle client last reserved from it
/// (below blocks another client reserved since), and the guard put back
/// by `init`, between two reservations of the idle client. Its next
/// block from `a` is reserved from a row the guard does not vouch for:
/// refused (`recreated`), the server raised past the marks; no id is
/// handed out twice. Before: the block was taken, and the busy client's
/// ids went out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_segment_guard_replaced_between_two_blocks_hands_out_nothing_twice_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let row_of_a = || {
        a.sql("SELECT max_id FROM shardflake_ticket_segments WHERE sequence_name = 'blocks'")
            .unwrap()
            .trim()
            .to_string()
    };
    let idle = TicketClient::connect(config.clone()).await.unwrap();
    let mut ids = idle.next_n("blocks", 3000).await.unwrap();
    let then = row_of_a();
    let busy = TicketClient::connect(config.clone()).await.unwrap();
    for _ in 0..20 {
        ids.extend(busy.next_n("blocks", 1000).await.unwrap());
    }
    assert_ne!(row_of_a(), then, "busy reserved nothing from a");
    let names = a
        .sql("SELECT TRIGGER_NAME FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = 'app' AND EVENT_OBJECT_TABLE = 'shardflake_ticket_segments'")
        .unwrap();
    for name in names.split_whitespace() {
        a.sql(&format!("DROP TRIGGER {name}")).unwrap();
    }
    a.sql(&format!(
        "UPDATE shardflake_ticket_segments SET max_id = {then} WHERE sequence_name = 'blocks'"
    ))
    .unwrap();
    init_ok(&config).await;
    for _ in 0..20 {
        ids.extend(idle.next_n("blocks", 1000).await.unwrap());
    }
    idle.shutdown().await;
    busy.shutdown().await;
    assert_unique(&ids);
}

/// The guard's triggers on `a` made again with the text of guard version
/// 1 (the release before): no version label, and the segment guard's
/// give-back branch (`@shardflake_give_back`), token kept. Returns the
/// token of the segment guard.
async fn put_guard_version_1(conn: &mut mysql_async::Conn) -> String {
    let rows: Vec<(String, String, String, String, String)> = conn
        .query(
            "SELECT TRIGGER_NAME, ACTION_TIMING, EVENT_MANIPULATION, EVENT_OBJECT_TABLE, ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = 'app' AND EVENT_OBJECT_TABLE IN ('tickets_photos', 'shardflake_ticket_segments')",
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 6, "{rows:?}");
    let mut token = String::new();
    for (name, timing, event, table, body) in rows {
        // Unlabelled already where this runs on the code of version 1.
        let mut old = body
            .strip_prefix("shardflake_guard_v2: ")
            .and_then(|b| b.strip_suffix(" shardflake_guard_v2"))
            .unwrap_or(&body)
            .to_string();
        if name == "shardflake_ticket_guard_update" {
            let at = old.find("CONCAT('sfg").unwrap() + "CONCAT('".len();
            token = old[at..at + 19].to_string();
            let vouch = "IF @shardflake_vouch <=> 1 THEN";
            assert!(
                old.contains(vouch) || old.contains("@shardflake_give_back"),
                "{old}"
            );
            old = old.replace(
                vouch,
                &format!("IF @shardflake_vouch <=> 1 OR (@shardflake_give_back <=> 1 AND OLD.vouched <=> CONCAT('{token}:', OLD.max_id)) THEN"),
            );
        }
        conn.query_drop(format!(
            "CREATE OR REPLACE TRIGGER {name} {timing} {event} ON {table} FOR EACH ROW {old}"
        ))
        .await
        .unwrap();
    }
    token
}

/// The bodies and creation times of the guard's triggers on the segment
/// table and `tickets_photos`, by name.
async fn guard_text(conn: &mut mysql_async::Conn) -> Vec<(String, String, String)> {
    conn.query(
        "SELECT TRIGGER_NAME, ACTION_STATEMENT, CAST(CREATED AS CHAR) FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_SCHEMA = 'app' AND EVENT_OBJECT_TABLE IN ('tickets_photos', 'shardflake_ticket_segments') ORDER BY 1",
    )
    .await
    .unwrap()
}

/// Guard version 2 drops the segment guard's give-back branch (segment
/// tails are skipped, no client sets `@shardflake_give_back`). A server
/// still holding the guard of version 1: clients of this release use it
/// (they look for the guard's triggers, not their text), `check` warns
/// and names `init`, and `init` puts version 2 in over it, keeping its
/// token, so the rows it vouched for stay vouched for and running
/// clients go on; `init` again leaves the triggers as they are (their
/// creation time unchanged). Before: `init` kept the give-back branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn init_puts_this_releases_guard_over_an_older_one_mariadb() {
    let (a, b) = (maria(2, 1), maria(2, 2));
    let config = pair(&a, &b, "");
    init_ok(&config).await;
    let mut conn = mysql_async::Conn::from_url(a.url()).await.unwrap();
    let token = put_guard_version_1(&mut conn).await;
    let old = guard_text(&mut conn).await;
    assert!(
        old.iter()
            .any(|(_, body, _)| body.contains("@shardflake_give_back")),
        "{old:?}"
    );
    let client = TicketClient::connect(config.clone()).await.unwrap();
    let mut blocks = client.next_n("blocks", 3000).await.unwrap();
    let mut photos = client.next_n("photos", 100).await.unwrap();
    let report = admin::check(&config).await;
    let text = report.to_string();
    assert!(report.ok(), "{text}");
    for table in ["tickets_photos", "shardflake_ticket_segments"] {
        assert!(
            text.contains(&format!(
                "warning: {table}: its guard is of another shardflake release"
            )),
            "{text}"
        );
    }
    let said: Vec<String> = admin::init(&config)
        .await
        .into_iter()
        .flat_map(|s| {
            s.result
                .unwrap_or_else(|e| panic!("init {}: {e}", s.server))
        })
        .collect();
    let said = said.join("\n");
    assert!(
        said.contains(
            "shardflake_ticket_segments: guard of another shardflake release replaced by guard version 2"
        ) && said.contains("tickets_photos: guard of another shardflake release replaced"),
        "{said}"
    );
    let new = guard_text(&mut conn).await;
    for (name, body, _) in &new {
        assert!(
            body.starts_with("shardflake_guard_v2: ") && !body.contains("give_back"),
            "{name}: {body}"
        );
    }
    assert!(
        new.iter()
            .any(|(n, body, _)| n == "shardflake_ticket_guard_update"
                && body.contains(&format!("'{token}:'"))),
        "token {token} not kept: {new:?}"
    );
    // Vouched rows stay vouched: the running client goes on on a.
    for _ in 0..5 {
        blocks.extend(client.next_n("blocks", 1000).await.unwrap());
        photos.extend(client.next_n("photos", 20).await.unwrap());
    }
    assert_eq!(state(&client, "a"), "up");
    assert!(admin::check(&config).await.ok());
    assert!(
        !admin::check(&config).await.to_string().contains("warning"),
        "a warning is left"
    );
    init_ok(&config).await;
    assert_eq!(
        guard_text(&mut conn).await,
        new,
        "init again made a trigger anew"
    );
    photos.extend(client.next_n("photos", 20).await.unwrap());
    client.shutdown().await;
    assert_unique(&blocks);
    assert_unique(&photos);
}
