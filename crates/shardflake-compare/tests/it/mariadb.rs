use shardflake_compare::{CompareError, Options, Scheme, ServerKind, Silent};
use shardflake_testkit::mariadb::MariaDbServer;

use super::*;

fn count(db: &MariaDbServer, sql: &str) -> u64 {
    db.sql(sql).unwrap().trim().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheme_runs_and_only_the_sandbox_is_touched() {
    // The script's settings: the event scheduler on (the trigger's clock).
    let db = MariaDbServer::start_with("", None).unwrap();
    db.sql("CREATE TABLE keep (x int); INSERT INTO keep VALUES (7)")
        .unwrap();
    let opts = small();
    let report = shardflake_compare::mariadb(&db.url(), &opts, Arc::new(Silent))
        .await
        .unwrap();
    check_full_run(&report, ServerKind::Mariadb, opts.rows);
    let seed = report
        .results
        .iter()
        .find(|r| r.scheme == Scheme::SeedProcedure)
        .unwrap();
    assert!(seed.duplicates_expected);
    assert_eq!(db.sql("SELECT x FROM keep").unwrap(), "7");
    let sandbox = &opts.schema;
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = '{sandbox}'"
            )
        ),
        0
    );
    assert_eq!(
        count(
            &db,
            &format!(
                "SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = '{sandbox}'"
            )
        ),
        0
    );
    // The clock event's loop (the trigger scheme's) is gone with it.
    assert_eq!(
        count(
            &db,
            &format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = '{sandbox}'")
        ),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_it_did_not_make_is_refused_and_left_alone() {
    let db = MariaDbServer::start().unwrap();
    db.sql("CREATE DATABASE shardflake_compare; CREATE TABLE shardflake_compare.mine (x int)")
        .unwrap();
    let err = shardflake_compare::mariadb(&db.url(), &small(), Arc::new(Silent))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CompareError::NotOurs {
                kind: "database",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM shardflake_compare.mine"),
        0
    );

    // A leftover of ours (the mark inside) is replaced; a held lock refused.
    db.sql(&format!(
        "DROP DATABASE shardflake_compare; CREATE DATABASE shardflake_compare; \
         CREATE TABLE shardflake_compare.{} (note varchar(64))",
        shardflake_compare::SANDBOX_MARK_TABLE
    ))
    .unwrap();
    let opts = Options {
        only: vec![Scheme::Segment],
        ..small()
    };
    let report = shardflake_compare::mariadb(&db.url(), &opts, Arc::new(Silent))
        .await
        .unwrap();
    assert!(report.results.iter().all(|r| r.ran()) && report.dropped);
    let mut conn = mysql_async::Conn::new(mysql_async::Opts::from_url(&db.url()).unwrap())
        .await
        .unwrap();
    use mysql_async::prelude::Queryable;
    let got: Option<i64> = conn
        .exec_first(
            "SELECT GET_LOCK(?, 0)",
            (shardflake_compare::sandbox_lock(&opts.schema),),
        )
        .await
        .unwrap();
    assert_eq!(got, Some(1));
    let err = shardflake_compare::mariadb(&db.url(), &opts, Arc::new(Silent))
        .await
        .unwrap_err();
    assert!(matches!(err, CompareError::Busy { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_after_the_running_batches_and_drops_the_sandbox() {
    let db = MariaDbServer::start().unwrap();
    let opts = Options {
        rows: 10_000_000,
        seconds: 600,
        ..small()
    };
    let progress = Arc::new(CancelOnFirstRows(opts.cancel.clone()));
    let report = shardflake_compare::mariadb(&db.url(), &opts, progress)
        .await
        .unwrap();
    assert_eq!(report.results.len(), 1, "no scheme starts after the cancel");
    assert!(report.results[0].rows < opts.rows && report.dropped);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'shardflake_compare'"
        ),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_global_setting_is_changed_a_scheme_that_needs_one_is_skipped() {
    // MariaDbServer::start: the event scheduler off.
    let db = MariaDbServer::start().unwrap();
    let opts = Options {
        only: vec![Scheme::Trigger, Scheme::Procedure],
        ..small()
    };
    let report = shardflake_compare::mariadb(&db.url(), &opts, Arc::new(Silent))
        .await
        .unwrap();
    assert!(report.results[0].ran() && report.dropped);
    assert_eq!(report.results.len(), 3);
    for r in &report.results[1..] {
        let why = r.skipped.as_deref().unwrap_or_default();
        assert!(
            why.contains("event scheduler is OFF") && why.contains("SET GLOBAL"),
            "{}: {why}",
            r.label
        );
    }
    assert_eq!(db.sql("SELECT @@GLOBAL.event_scheduler").unwrap(), "OFF");
}
