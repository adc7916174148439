use std::time::Duration;

use shardflake_compare::{CompareError, Options, ServerKind, Silent, report::Report};
use shardflake_testkit::pg::PgServer;
use tokio_postgres::NoTls;

use super::*;

async fn client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

async fn schema_exists(c: &tokio_postgres::Client, name: &str) -> bool {
    c.query_one(
        "SELECT count(*) FROM pg_namespace WHERE nspname = $1",
        &[&name],
    )
    .await
    .unwrap()
    .get::<_, i64>(0)
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheme_runs_and_only_the_sandbox_is_touched() {
    let pg = PgServer::start().unwrap();
    let c = client(&pg.url()).await;
    c.batch_execute("CREATE TABLE keep (x int); INSERT INTO keep VALUES (7)")
        .await
        .unwrap();
    let opts = small();
    let report = shardflake_compare::postgres(&pg.url(), &opts, Arc::new(Silent))
        .await
        .unwrap();
    check_full_run(&report, ServerKind::Postgres, opts.rows);
    assert!(
        !schema_exists(&c, &opts.schema).await,
        "sandbox left behind"
    );
    let kept: i32 = c.query_one("SELECT x FROM keep", &[]).await.unwrap().get(0);
    assert_eq!(kept, 7);
    let schemas: i64 = c
        .query_one("SELECT count(*) FROM pg_namespace WHERE nspname NOT LIKE 'pg_%' AND nspname <> 'information_schema'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(schemas, 1, "only public is left");

    // Every output form names every scheme.
    let full = Report {
        rows: opts.rows,
        clients: opts.clients,
        batch: opts.batch,
        seconds: opts.seconds,
        servers: vec![report],
        interrupted: false,
    };
    assert!(full.clean());
    let (table, markdown) = (full.table(), full.markdown());
    let json = serde_json::to_string(&full).unwrap();
    for r in &full.servers[0].results {
        assert!(
            table.contains(&r.label) && markdown.contains(&r.label),
            "{}",
            r.label
        );
        assert!(json.contains(r.scheme.name()), "{}", r.label);
    }
    let svg = std::env::temp_dir().join(format!("compare-{}.svg", std::process::id()));
    shardflake_compare::chart::write_svg(&full, &svg).unwrap();
    let drawn = std::fs::read_to_string(&svg).unwrap();
    let _ = std::fs::remove_file(&svg);
    assert!(drawn.starts_with("<svg") && drawn.contains("bigserial") && drawn.contains("<rect"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_it_did_not_make_is_refused_and_left_alone() {
    let pg = PgServer::start().unwrap();
    let c = client(&pg.url()).await;
    c.batch_execute(
        "CREATE SCHEMA shardflake_compare; CREATE TABLE shardflake_compare.mine (x int)",
    )
    .await
    .unwrap();
    let err = shardflake_compare::postgres(&pg.url(), &small(), Arc::new(Silent))
        .await
        .unwrap_err();
    assert!(
        matches!(err, CompareError::NotOurs { kind: "schema", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("--schema"), "{err}");
    c.query_one("SELECT count(*) FROM shardflake_compare.mine", &[])
        .await
        .unwrap();

    // Another name works beside it.
    let opts = Options {
        schema: "compare_two".into(),
        only: vec![shardflake_compare::Scheme::UuidV7],
        ..small()
    };
    let report = shardflake_compare::postgres(&pg.url(), &opts, Arc::new(Silent))
        .await
        .unwrap();
    assert_eq!(report.results.len(), 2);
    assert!(report.results.iter().all(|r| r.ran()));
    assert!(
        schema_exists(&c, "shardflake_compare").await && !schema_exists(&c, "compare_two").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leftover_sandbox_is_replaced_and_a_concurrent_run_refused() {
    let pg = PgServer::start().unwrap();
    let c = client(&pg.url()).await;
    c.batch_execute(&format!(
        "CREATE SCHEMA shardflake_compare; COMMENT ON SCHEMA shardflake_compare IS '{}'; \
         CREATE TABLE shardflake_compare.t_bigserial (x int)",
        shardflake_compare::SANDBOX_MARK
    ))
    .await
    .unwrap();
    let opts = Options {
        only: vec![shardflake_compare::Scheme::Bigserial],
        ..small()
    };
    let report = shardflake_compare::postgres(&pg.url(), &opts, Arc::new(Silent))
        .await
        .unwrap();
    assert!(report.results[0].ran() && report.dropped);
    assert!(!schema_exists(&c, &opts.schema).await);

    let lock = shardflake_compare::sandbox_lock(&opts.schema);
    c.query_one("SELECT pg_advisory_lock(hashtextextended($1, 0))", &[&lock])
        .await
        .unwrap();
    let err = shardflake_compare::postgres(&pg.url(), &opts, Arc::new(Silent))
        .await
        .unwrap_err();
    assert!(matches!(err, CompareError::Busy { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_after_the_running_batches_and_drops_the_sandbox() {
    let pg = PgServer::start().unwrap();
    let c = client(&pg.url()).await;
    let opts = Options {
        rows: 10_000_000,
        seconds: 600,
        ..small()
    };
    let progress = Arc::new(CancelOnFirstRows(opts.cancel.clone()));
    let report = shardflake_compare::postgres(&pg.url(), &opts, progress)
        .await
        .unwrap();
    assert_eq!(report.results.len(), 1, "no scheme starts after the cancel");
    let first = &report.results[0];
    assert!(
        first.rows > 0 && first.rows < opts.rows,
        "{} rows",
        first.rows
    );
    assert!(report.dropped && !schema_exists(&c, &opts.schema).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_connect_error() {
    // A port nothing listens on: refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let opts = Options {
        timeout: Duration::from_secs(5),
        ..small()
    };
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let err = shardflake_compare::postgres(&url, &opts, Arc::new(Silent))
        .await
        .unwrap_err();
    assert!(matches!(err, CompareError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&url), "{err}");
    let url = format!("mysql://root@127.0.0.1:{port}");
    let err = shardflake_compare::mariadb(&url, &opts, Arc::new(Silent))
        .await
        .unwrap_err();
    assert!(matches!(err, CompareError::Connect { .. }), "{err}");
}
