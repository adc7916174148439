//! Durability settings under which a crash hands out ids again (issue 37,
//! CR): with `synchronous_commit = off` a crash loses the last commits'
//! WAL, a shard sequence's position with it, and `next_id` makes ids it
//! already acknowledged again. `pg check` reports the setting wherever a
//! session can get it: the server's own, or a database's or role's
//! override that our session does not see.

use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;

fn one_shard(a: &PgServer) -> Topology {
    Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n",
        a.url()
    ))
    .unwrap()
}

fn problems(drift: &[pg::Drift]) -> Vec<String> {
    drift.iter().map(ToString::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_synchronous_commit_off_on_the_server() {
    let a = PgServer::start_with(&[("synchronous_commit", "off")]).unwrap();
    let topo = one_shard(&a);
    // A warning, not a refusal (as `mysql apply` on innodb_flush_log_at_trx_commit = 0).
    pg::apply(&topo).await.unwrap();
    let drift = problems(&pg::check(&topo).await.unwrap());
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert!(
        drift[0].starts_with("a: synchronous_commit = off")
            && drift[0].contains("ALTER SYSTEM SET synchronous_commit = on"),
        "{drift:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_role_or_database_that_turns_synchronous_commit_off() {
    let a = PgServer::start_with(&[("synchronous_commit", "on")]).unwrap();
    let topo = one_shard(&a);
    pg::apply(&topo).await.unwrap();
    assert_eq!(
        problems(&pg::check(&topo).await.unwrap()),
        Vec::<String>::new()
    );
    // The application's role: our session does not see its setting.
    pg::execute(
        "a",
        &a.url(),
        "CREATE ROLE app LOGIN; ALTER ROLE app SET synchronous_commit = OFF; \
         ALTER DATABASE postgres SET synchronous_commit = off",
    )
    .await
    .unwrap();
    let drift = problems(&pg::check(&topo).await.unwrap());
    assert_eq!(drift.len(), 1, "{drift:#?}");
    assert!(
        drift[0].contains("role app") && drift[0].contains("database postgres"),
        "{drift:#?}"
    );
    pg::execute(
        "a",
        &a.url(),
        "ALTER ROLE app RESET synchronous_commit; ALTER DATABASE postgres RESET synchronous_commit",
    )
    .await
    .unwrap();
    assert_eq!(
        problems(&pg::check(&topo).await.unwrap()),
        Vec::<String>::new()
    );
}
