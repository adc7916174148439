//! `mysql apply` on a MariaDB that writes a binary log (every replication
//! primary; issue 37, 1418): MariaDB then lets only a user with `SUPER`
//! create a function or a trigger, unless `log_bin_trust_function_creators`
//! is on, and only a function that declares what it does to data. Before,
//! `apply` failed halfway with `ERROR 1418`, the sequence and table made
//! and no trigger, function, event or procedure.

use mysql_async::{Conn, Opts};
use shardflake::preset;
use shardflake_db::mysql::{self, Options};
use shardflake_testkit::MariaDbServer;

fn binlog_server() -> MariaDbServer {
    MariaDbServer::start_with("--log-bin --server-id=1", None).unwrap()
}

async fn conn(url: &str) -> Conn {
    Conn::new(Opts::from_url(url).unwrap()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_installs_everything_on_a_binlog_enabled_server() {
    let server = binlog_server();
    assert_eq!(
        server
            .sql("SELECT @@log_bin, @@log_bin_trust_function_creators")
            .unwrap(),
        "1\t0"
    );
    let layout = preset::by_name("mysql-procedure").unwrap();
    let opts = Options::default();
    let mut c = conn(&server.url()).await;
    let applied = mysql::apply(&mut c, &layout, &opts).await.unwrap();
    assert!(applied.one_statement, "{applied:?}");
    assert_eq!(
        mysql::check(&mut c, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
    let id = mysql::insert(&mut c, &opts.names, 42, "hello")
        .await
        .unwrap();
    assert!(id > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_without_super_is_refused_before_anything_changes() {
    let server = binlog_server();
    server
        .sql(
            "CREATE USER 'app'@'%'; GRANT ALL ON app.* TO 'app'@'%'; \
             GRANT ALL ON shardflake.* TO 'app'@'%'",
        )
        .unwrap();
    let app_url = format!("mysql://app@127.0.0.1:{}/app", server.port);
    let layout = preset::by_name("mysql-procedure").unwrap();
    let opts = Options::default();
    let mut c = conn(&app_url).await;
    let e = mysql::apply(&mut c, &layout, &opts).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("log_bin_trust_function_creators") && text.contains("nothing was changed"),
        "{text}"
    );
    assert_eq!(
        server
            .sql(
                "SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA IN ('app', 'shardflake')"
            )
            .unwrap(),
        "0",
        "{text}"
    );
    // What the refusal says to do is enough.
    server
        .sql("SET GLOBAL log_bin_trust_function_creators = ON")
        .unwrap();
    mysql::apply(&mut c, &layout, &opts).await.unwrap();
    assert_eq!(
        mysql::check(&mut c, &layout, &opts).await.unwrap(),
        Vec::<String>::new()
    );
}
