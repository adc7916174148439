//! A PostgreSQL server restored from a physical backup (issue #28): a base
//! backup taken, more ids made, the server's data replaced by the backup
//! and recovered to its end (archive recovery, which starts a new WAL
//! timeline, as PITR does). The sequences come back behind ids already
//! handed out and keep their oids, so `next_id` cannot tell; `pg check`
//! must, and `pg repair` must put them past every id.

use std::collections::HashSet;
use std::process::Command;

use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

async fn insert(c: &tokio_postgres::Client, n: i64) -> Vec<i64> {
    c.query(
        "INSERT INTO shard0.posts (user_id) SELECT g FROM generate_series(1, $1::bigint) g RETURNING id",
        &[&n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restored_from_a_base_backup_is_reported_by_check_until_repair() {
    let a = PgServer::start_with(&[
        ("max_connections", "10"),
        ("max_worker_processes", "4"),
        ("synchronous_commit", "on"),
    ])
    .unwrap();
    let toml = format!(
        "layout = \"instagram\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, user_id bigint NOT NULL)\"\n",
        a.url()
    );
    let topo = Topology::parse(&toml).unwrap();
    pg::apply(&topo).await.unwrap();
    let c = pg::connect_url("t", &a.url()).await.unwrap();
    let data: String = c
        .query_one("SHOW data_directory", &[])
        .await
        .unwrap()
        .get(0);
    let mut before = insert(&c, 1000).await;
    let backup = format!("{data}.backup");
    let port = a.port.to_string();
    run(Command::new(a.program("pg_basebackup").unwrap())
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-X",
            "stream",
        ])
        .args(["-c", "fast", "-D", &backup]));
    // Ids made after the backup: the restore forgets them.
    before.extend(insert(&c, 5000).await);
    drop(c);
    a.stop();
    run(Command::new("sh").arg("-c").arg(format!(
        "rm -rf '{data}' && mv '{backup}' '{data}' && touch '{data}/standby.signal' \
         && echo \"restore_command = '/bin/false'\" >> '{data}/postgresql.auto.conf' \
         && chown -R postgres:postgres '{data}' && chmod 700 '{data}'"
    )));
    // First as a standby, which stays in recovery: check says so (it has
    // no WAL position to compare; before, check failed on reading one).
    a.restart().unwrap();
    let drift = pg::check(&topo).await.unwrap();
    assert!(
        drift.iter().any(|d| d.problem.contains("is in recovery")),
        "{drift:?}"
    );
    a.stop();
    run(Command::new("sh").arg("-c").arg(format!(
        "mv '{data}/standby.signal' '{data}/recovery.signal'"
    )));
    a.restart().unwrap();
    // The server takes connections while it still replays the backup's WAL
    // (hot standby); the restore is done when it leaves recovery (bounded).
    let c = pg::connect_url("t", &a.url()).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while c
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "still in recovery after 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(c);

    let drift = pg::check(&topo).await.unwrap();
    assert!(
        drift
            .iter()
            .any(|d| d.problem.contains("timeline") && d.problem.contains("pg repair")),
        "check after a physical restore: {drift:?}"
    );
    pg::repair(&topo, None).await.unwrap();
    assert_eq!(pg::check(&topo).await.unwrap(), Vec::new());
    let c = pg::connect_url("t", &a.url()).await.unwrap();
    let after = insert(&c, 5000).await;
    let seen: HashSet<i64> = before.iter().copied().collect();
    let repeated = after.iter().filter(|id| seen.contains(id)).count();
    assert_eq!(repeated, 0, "ids repeated after the repair");
}
