//! `serve` with `tickets = FILE` (`--tickets`), in-process, on real ticket
//! servers (MariaDB and PostgreSQL from the testkit, etcd for the marks).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use shardflake_service::grpc::pb;
use shardflake_service::{ServeError, config::NodeSource};
use shardflake_testkit::{Etcd, Http, MariaDbServer, PgServer, error_code, grpc_client, metric};
use shardflake_tickets::{
    Config as TicketsConfig, MAX_COUNT, MAX_PER_ID_COUNT, TicketClient, admin,
};

use crate::{App, Server, config};

/// Failover settings short enough for tests: an attempt 1 s, a call 3 s.
const SEQUENCES: &str = r#"
[failover]
attempt_timeout_ms = 1000
timeout_ms = 3000
probe_interval_ms = 50
high_water_interval_ms = 50

[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"
"#;

/// The drain tests check which ids come back, not how fast: a loaded
/// machine (four tests at a time on two cores) has taken over the default
/// 500 ms attempt for a PostgreSQL connection.
const SLOW_MACHINE: &str = "[failover]\nattempt_timeout_ms = 5000\ntimeout_ms = 10000\n";

fn server_toml(name: &str, kind: &str, url: &str, offset: u64) -> String {
    format!(
        "[[servers]]\nname = \"{name}\"\nkind = \"{kind}\"\nurl = \"{url}\"\noffset = {offset}\n"
    )
}

/// Writes the tickets file, creates the schema on every server, and
/// returns the file's path (in `dir`) and its configuration.
async fn tickets_file(
    dir: &tempfile::TempDir,
    text: &str,
) -> anyhow::Result<(String, TicketsConfig)> {
    let path = dir.path().join("tickets.toml");
    std::fs::write(&path, text)?;
    let config = TicketsConfig::parse(text)?;
    for s in admin::init(&config).await {
        s.result
            .map_err(|e| anyhow::anyhow!("init {}: {e}", s.server))?;
    }
    Ok((path.display().to_string(), config))
}

/// A service on a pair of ticket servers of `kind` (offsets 1 and 2, the
/// schema created) serving [`SEQUENCES`]; the directory holds its tickets
/// file.
async fn serve_pair(kind: &str, a: &str, b: &str) -> anyhow::Result<(tempfile::TempDir, Server)> {
    let dir = tempfile::tempdir()?;
    let text = format!(
        "{}{}{SEQUENCES}",
        server_toml("a", kind, a, 1),
        server_toml("b", kind, b, 2)
    );
    let (path, _) = tickets_file(&dir, &text).await?;
    let s = Server::start(&format!("node_id = 1\ntickets = {path:?}")).await?;
    Ok((dir, s))
}

fn ids_of(body: &str) -> anyhow::Result<Vec<u64>> {
    let v: serde_json::Value = serde_json::from_str(body)?;
    v["ids"]
        .as_array()
        .ok_or_else(|| anyhow::anyhow!("no ids in {body}"))?
        .iter()
        .map(|id| match id {
            serde_json::Value::String(s) => Ok(s.parse()?),
            other => anyhow::bail!("an id that is not a string: {other}"),
        })
        .collect()
}

fn assert_unique(ids: &[u64]) {
    let set: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(set.len(), ids.len(), "{} duplicates", ids.len() - set.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tickets_over_http_and_grpc_with_metrics_and_errors() -> anyhow::Result<()> {
    let (a, b) = (PgServer::start()?, PgServer::start()?);
    let (_dir, s) = serve_pair("postgres", &a.url(), &b.url()).await?;
    let mut c = Http::new(&s.http);

    let (status, body) = c.get("/v1/tickets/photos").await?;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        (v["sequence"].as_str(), v["count"].as_u64()),
        (Some("photos"), Some(1))
    );
    let mut photos = ids_of(&body)?;
    let (status, body) = c.get("/v1/tickets/photos?count=20").await?;
    assert_eq!(status, 200, "{body}");
    photos.extend(ids_of(&body)?);
    // Calls go to the servers in turn: odd ids from a, even from b.
    assert!(photos.iter().any(|i| i % 2 == 1) && photos.iter().any(|i| i % 2 == 0));
    let (status, body) = c.get("/v1/tickets/photos?count=3&numbers=true").await?;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body)?;
    for id in v["ids"].as_array().unwrap() {
        photos.push(id.as_u64().expect("numbers=true gives JSON numbers"));
    }

    let (status, body) = c.get("/v1/tickets/blocks?count=5000").await?;
    assert_eq!(status, 200, "{body}");
    let blocks = ids_of(&body)?;
    assert_eq!(blocks.len(), 5000);
    assert!(
        blocks.windows(2).all(|w| w[0] < w[1]),
        "segment ids increase"
    );

    let mut g = grpc_client(&s.grpc).await?;
    let more = g
        .next_tickets(pb::NextTicketsRequest {
            sequence: "photos".into(),
            count: 4,
        })
        .await?
        .into_inner()
        .ids;
    assert_eq!(more.len(), 4);
    photos.extend(more);
    assert_unique(&photos);
    let unknown = g
        .next_tickets(pb::NextTicketsRequest {
            sequence: "nope".into(),
            count: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert_eq!(
        unknown.metadata().get("x-error-code").unwrap(),
        "unknown_sequence"
    );
    let zero = g
        .next_tickets(pb::NextTicketsRequest {
            sequence: "photos".into(),
            count: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(zero.code(), tonic::Code::InvalidArgument);

    for (path, status, code) in [
        ("/v1/tickets/nope", 404, "unknown_sequence"),
        ("/v1/tickets/photos?count=0", 400, "invalid_count"),
        ("/v1/tickets/photos?count=100001", 400, "invalid_count"),
        ("/v1/tickets/photos?count=-1", 400, "invalid_count"),
        ("/v1/tickets/photos?format=hex", 400, "invalid_parameter"),
        ("/v1/tickets/photos?numbers=maybe", 400, "invalid_parameter"),
    ] {
        let (got, body) = c.get(path).await?;
        assert_eq!(
            (got, error_code(&body).as_str()),
            (status, code),
            "{path}: {body}"
        );
    }

    let (_, text) = c.get("/metrics").await?;
    for server in ["a", "b"] {
        let labels = format!("{{server=\"{server}\",kind=\"postgres\"}}");
        assert_eq!(
            metric(&text, &format!("shardflake_ticket_server_up{labels}")),
            Some(1.0),
            "{text}"
        );
        let calls = metric(&text, &format!("shardflake_ticket_calls_total{labels}"));
        assert!(calls.unwrap_or(0.0) > 0.0, "{server}: {text}");
        assert!(
            metric(
                &text,
                &format!("shardflake_ticket_latency_max_seconds{labels}")
            )
            .unwrap_or(0.0)
                > 0.0
        );
    }
    let (_, doc) = c.get("/openapi.json").await?;
    let doc: serde_json::Value = serde_json::from_str(&doc)?;
    // A path per sequence, each with its mode's largest count.
    let paths = doc["paths"].as_object().expect("paths");
    assert!(!paths.contains_key("/v1/tickets/{sequence}"));
    for (sequence, max) in [("photos", MAX_PER_ID_COUNT), ("blocks", MAX_COUNT)] {
        let params = &paths[&format!("/v1/tickets/{sequence}")]["get"]["parameters"];
        let count = params
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "count"));
        assert_eq!(
            count.expect("count")["schema"]["maximum"],
            max,
            "{sequence}"
        );
    }
    let over = format!("/v1/tickets/photos?count={}", MAX_PER_ID_COUNT + 1);
    let (status, body) = c.get(&over).await?;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"invalid_count\""), "{body}");
    s.stop().await
}

/// Both servers down: a clear 503 within the configured timeout (not a
/// hang), the metrics say why; both back: ids again, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_server_answering_is_a_503_within_the_timeout_and_service_resumes() -> anyhow::Result<()>
{
    let opts = |offset| format!("--auto-increment-increment=2 --auto-increment-offset={offset}");
    let a = MariaDbServer::start_with(&opts(1), None)?;
    let b = MariaDbServer::start_with(&opts(2), None)?;
    let (_dir, s) = serve_pair("mariadb", &a.url(), &b.url()).await?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/tickets/photos?count=10").await?;
    assert_eq!(status, 200, "{body}");
    let mut photos = ids_of(&body)?;
    a.kill()?;
    b.kill()?;
    for sequence in ["photos", "blocks"] {
        // The segment sequence may still have ids in memory: drain them.
        let started = Instant::now();
        let (status, body) = loop {
            let (status, body) = c.get(&format!("/v1/tickets/{sequence}?count=1000")).await?;
            if status != 200 {
                break (status, body);
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{sequence} kept answering"
            );
        };
        assert_eq!(
            (status, error_code(&body).as_str()),
            (503, "unavailable"),
            "{body}"
        );
        // The call's timeout is 3 s; well under 30 s even on a busy machine.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
    }
    let (_, text) = c.get("/metrics").await?;
    assert_eq!(
        metric(
            &text,
            "shardflake_ticket_server_up{server=\"a\",kind=\"mariadb\"}"
        ),
        Some(0.0),
        "{text}"
    );
    assert!(text.contains("state=\"down\""), "{text}");
    a.restart()?;
    b.restart()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = c.get("/v1/tickets/photos?count=10").await?;
        if status == 200 {
            photos.extend(ids_of(&body)?);
            break;
        }
        assert!(Instant::now() < deadline, "never answered again: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_unique(&photos);
    s.stop().await
}

/// A file that does not parse fails the start with the tickets error;
/// nothing is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_tickets_file_fails_the_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("tickets.toml");
    std::fs::write(&path, "[[servers]]\nname = \"a\"\n")?;
    let bad = config(
        &dir,
        &format!("node_id = 1\ntickets = {:?}", path.display().to_string()),
    )?;
    let listeners = shardflake_service::Listeners::bind(&bad).await?;
    let started = tokio::time::timeout(
        Duration::from_secs(60),
        shardflake_service::serve(bad, listeners, std::future::pending()),
    )
    .await?;
    match started {
        Err(ServeError::Tickets(e)) => assert_eq!(e.code(), "bad_config", "{e}"),
        other => panic!("{other:?}"),
    }
    let missing = config(&dir, "node_id = 1\ntickets = \"/nonexistent/tickets.toml\"")?;
    let listeners = shardflake_service::Listeners::bind(&missing).await?;
    let e = shardflake_service::serve(missing, listeners, std::future::pending())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("/nonexistent/tickets.toml"), "{e}");
    Ok(())
}

/// The node's own ids never depend on the ticket servers: with no ticket
/// server reachable, or one of a pair stalled (SIGSTOP: the other is
/// refused too, as no place holding its marks answers), `serve` starts,
/// serves its ids, answers `503 unavailable` for tickets, and serves
/// tickets once the stalled server answers again. Before: the start
/// failed with `unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unusable_ticket_servers_do_not_stop_the_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let closed = shardflake_testkit::free_port()?;
    let text = format!(
        "{}{SEQUENCES}",
        server_toml(
            "a",
            "postgres",
            &format!("postgres://postgres@127.0.0.1:{closed}/postgres"),
            1
        )
    );
    let path = dir.path().join("closed.toml");
    std::fs::write(&path, text)?;
    let s = Server::start(&format!(
        "node_id = 1\ntickets = {:?}",
        path.display().to_string()
    ))
    .await?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/id").await?;
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.get("/v1/tickets/photos").await?;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (503, "unavailable"),
        "{body}"
    );
    s.stop().await?;

    let opts = |offset| format!("--auto-increment-increment=2 --auto-increment-offset={offset}");
    let a = MariaDbServer::start_with(&opts(1), None)?;
    let b = MariaDbServer::start_with(&opts(2), None)?;
    let text = format!(
        "{}{}{SEQUENCES}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 2)
    );
    let (path, _) = tickets_file(&dir, &text).await?;
    let b_pid = b.pid()?.to_string();
    let kill = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &b_pid])
            .status()
    };
    assert!(kill("-STOP")?.success());
    let started = Server::start(&format!("node_id = 1\ntickets = {path:?}")).await;
    assert!(kill("-CONT")?.success());
    let s = started?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/id").await?;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = c.get("/v1/tickets/photos?count=10").await?;
        if status == 200 {
            assert_unique(&ids_of(&body)?);
            break;
        }
        assert!(Instant::now() < deadline, "tickets never served: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await
}

/// Without `--tickets` the route exists but names no sequence: 404
/// `unknown_sequence` saying how to start the node; the OpenAPI document
/// leaves it out.
#[tokio::test]
async fn without_tickets_the_route_is_a_404_that_says_why() -> anyhow::Result<()> {
    let app = App::new("node_id = 1").await?;
    let (status, body) = app.get("/v1/tickets/photos").await?;
    assert_eq!(
        (status, error_code(&body).as_str()),
        (404, "unknown_sequence")
    );
    assert!(body.contains("--tickets"), "{body}");
    let (_, doc) = app.get("/openapi.json").await?;
    assert!(!doc.contains("/v1/tickets"), "{doc}");
    Ok(())
}

/// At the drain the service skips a segment's unused tails, never gives
/// them back (a row lowered below what another client read was taken for
/// a restore): the next client starts past every block the service held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drain_skips_the_segment_tail() -> anyhow::Result<()> {
    let pg = PgServer::start()?;
    let dir = tempfile::tempdir()?;
    let text = format!(
        "{}{SLOW_MACHINE}[segment]\nchunk = 100\nmin_step = 1000\nmax_step = 1000\n[[sequences]]\nname = \"solo\"\nmode = \"segment\"\n",
        server_toml("a", "postgres", &pg.url(), 1)
    );
    let (path, tickets) = tickets_file(&dir, &text).await?;
    let s = Server::start(&format!("node_id = 1\ntickets = {path:?}")).await?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/tickets/solo?count=250").await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body)?, (1..=250).collect::<Vec<_>>());
    s.stop().await?;
    // 251..=1000 skipped, and 1001..=2000, fetched ahead at a tenth used.
    let next = TicketClient::connect(tickets).await?;
    assert_eq!(next.next("solo").await?, 2001);
    Ok(())
}

/// With `--etcd` the marks are in etcd too, which a restore of the ticket
/// server does not roll back: a lone server restored behind (its own marks
/// restored with it) is raised past them when the service starts, and
/// `repair` with the same store raises it too; without etcd the same server
/// would be taken as it is, ids repeated.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_marks_raise_a_lone_server_restored_behind() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let pg = PgServer::start()?;
    let dir = tempfile::tempdir()?;
    // The sequence style, set back below by `setval` as a restore would.
    let text = format!(
        "postgres_tickets = \"sequence\"\n{}{SEQUENCES}",
        server_toml("a", "postgres", &pg.url(), 1)
    );
    let (path, tickets) = tickets_file(&dir, &text).await?;
    let serve_toml = format!(
        "tickets = {path:?}\n[etcd]\nendpoints = [{:?}]\nprefix = \"/t\"\nlease_ttl = \"5s\"\nsafety_margin = \"1s\"",
        etcd.urls()
    );
    let s = Server::start(&serve_toml).await?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/tickets/photos?count=50").await?;
    assert_eq!(status, 200, "{body}");
    let photos = ids_of(&body)?;
    let top = *photos.iter().max().unwrap();
    s.stop().await?;
    // Written ahead of the ids handed out.
    let mark: u64 = etcd
        .get(&format!(
            "/t/tickets/hw/{}/photos",
            class_key(&tickets, "a")
        ))
        .await?
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(mark >= top, "the mark in etcd {mark} is below {top}");

    // A restore from before those ids: counter and its own marks go back.
    let (admin_a, conn) = shardflake_tickets::tokio_postgres::connect(
        &pg.url(),
        shardflake_tickets::tokio_postgres::NoTls,
    )
    .await?;
    tokio::spawn(conn);
    admin_a
        .batch_execute(&format!(
            "SELECT setval('tickets_photos', 1, false); DELETE FROM {};",
            shardflake_tickets::HW_TABLE
        ))
        .await?;
    // Without etcd nothing remembers: the server would be taken.
    let blind = TicketClient::connect(tickets.clone()).await?;
    assert_eq!(blind.metrics()[0].state, "up");
    drop(blind);

    let server_config = config(&dir, &serve_toml)?;
    let store = shardflake_service::tickets::high_water_store(&tickets, &server_config.node)?;
    assert!(matches!(server_config.node, NodeSource::Etcd(_)));
    let report = admin::check_with_store(&tickets, &*store).await;
    assert!(!report.ok(), "{report}");
    let repaired = admin::repair_with_store(&tickets, &*store).await?;
    assert_eq!(repaired.len(), 1, "{repaired:?}");
    assert!(repaired[0].high_water >= top, "{repaired:?}");
    let s = Server::start(&serve_toml).await?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/tickets/photos?count=10").await?;
    assert_eq!(status, 200, "{body}");
    assert!(ids_of(&body)?.iter().all(|&id| id > top), "{body}");
    s.stop().await
}

/// With `--etcd` the mark in etcd is the end of the blocks the service
/// held (2,000 here), never lowered, and the next client through etcd
/// starts past it, as without etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_drain_skips_the_segment_tail_through_etcd() -> anyhow::Result<()> {
    let etcd = Etcd::start(1)?;
    let pg = PgServer::start()?;
    let dir = tempfile::tempdir()?;
    let text = format!(
        "{}{SLOW_MACHINE}[segment]\nchunk = 100\nmin_step = 1000\nmax_step = 1000\n[[sequences]]\nname = \"solo\"\nmode = \"segment\"\n",
        server_toml("a", "postgres", &pg.url(), 1)
    );
    let (path, tickets) = tickets_file(&dir, &text).await?;
    let serve_toml = format!(
        "tickets = {path:?}\n[etcd]\nendpoints = [{:?}]\nprefix = \"/t\"\nlease_ttl = \"5s\"\nsafety_margin = \"1s\"",
        etcd.urls()
    );
    let s = Server::start(&serve_toml).await?;
    let mut c = Http::new(&s.http);
    let (status, body) = c.get("/v1/tickets/solo?count=250").await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids_of(&body)?, (1..=250).collect::<Vec<_>>());
    s.stop().await?;
    let mark = etcd
        .get(&format!("/t/tickets/hw/{}/solo", class_key(&tickets, "a")))
        .await?;
    assert_eq!(mark.as_deref(), Some("2000"), "the mark in etcd");
    let server_config = config(&dir, &serve_toml)?;
    let store = shardflake_service::tickets::high_water_store(&tickets, &server_config.node)?;
    let next = TicketClient::connect_with_store(tickets, store).await?;
    assert_eq!(next.next("solo").await?, 2001);
    Ok(())
}

/// `shardflake tickets check|repair|reshape` read the marks with
/// `admin_timeout_ms` per place, like every admin statement: a peer that
/// answers after a second (here: its marks table locked for one) is waited
/// for, not taken for absent. Before: the clients' `marks_timeout_ms`
/// (150 ms), and `check` said no place holding `a`'s marks answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_commands_wait_for_a_slow_peer_s_marks() -> anyhow::Result<()> {
    use shardflake_tickets::mysql_async::{self, prelude::Queryable};
    let opts = |offset| format!("--auto-increment-increment=2 --auto-increment-offset={offset}");
    let a = MariaDbServer::start_with(&opts(1), None)?;
    let b = MariaDbServer::start_with(&opts(2), None)?;
    let dir = tempfile::tempdir()?;
    let text = format!(
        "{}{}{SEQUENCES}",
        server_toml("a", "mariadb", &a.url(), 1),
        server_toml("b", "mariadb", &b.url(), 2)
    );
    let (_, tickets) = tickets_file(&dir, &text).await?;
    let client = TicketClient::connect(tickets.clone()).await?;
    client.next_n("photos", 10).await?;
    client.shutdown().await;
    let mut lock = mysql_async::Conn::from_url(b.url()).await?;
    lock.query_drop("LOCK TABLES shardflake_ticket_hw WRITE")
        .await?;
    let unlock = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lock.query_drop("UNLOCK TABLES").await
    });
    let store =
        shardflake_service::tickets::admin_high_water_store(&tickets, &NodeSource::Static(1))?;
    let report = admin::check_with_store(&tickets, &*store).await;
    unlock.await??;
    assert!(report.ok(), "{report}");
    Ok(())
}

/// The etcd key of server `server`'s residue class (marks are kept per
/// class, not per name).
fn class_key(tickets: &shardflake_tickets::Config, server: &str) -> String {
    shardflake_tickets::ResidueClass::named(tickets, server).key
}
