//! A server stopped (SIGSTOP) after a `pg` command connected to it: the
//! kernel still acknowledges what is sent, so no TCP timeout fires, and a
//! statement on it used to wait forever (outside review R7). The command
//! now gives up on it, naming the server and what it was doing, while a
//! wait on a server that answers (another operator holding the deployment
//! lock) goes on as long as it takes.

use std::process::Command;
use std::time::{Duration, Instant};

use shardflake_db::pg::{self, Topology};
use shardflake_testkit::PgServer;
use tokio_postgres::Client;

const POSTS: &str = "[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL, body text)\"\n";

async fn client(s: &PgServer) -> Client {
    pg::connect_url("test", &s.url()).await.unwrap()
}

/// Every process of the server whose `backend` is alive (the postmaster
/// first), read from /proc: the postmaster is the backend's parent.
fn server_pids(backend: i32) -> Vec<i32> {
    let ppid = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid ...": comm may hold spaces.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let postmaster = ppid(backend).expect("the backend's parent");
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>()
            && ppid(pid) == Some(postmaster)
        {
            pids.push(pid);
        }
    }
    pids
}

/// The server's processes SIGSTOPped until dropped (SIGCONT), so that a
/// failing test never leaves a server nobody can stop.
struct Stopped(Vec<i32>);

impl Stopped {
    fn new(backend: i32) -> Self {
        let postmaster = server_pids(backend)[0];
        signal("STOP", &[postmaster]);
        // Its children, listed once it can fork no more.
        let pids = server_pids(backend);
        signal("STOP", &pids);
        Stopped(pids)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal("CONT", &self.0);
    }
}

fn signal(sig: &str, pids: &[i32]) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .args(pids.iter().map(ToString::to_string))
        .status()
        .unwrap();
    assert!(status.success(), "kill -{sig} {pids:?}");
}

/// Waits (bounded) until a `shardflake` session on `c`'s server waits for
/// the deployment lock.
async fn wait_for_lock_waiter(c: &Client) {
    let start = Instant::now();
    loop {
        let waiting: bool = c
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_stat_activity
                   WHERE application_name = 'shardflake' AND wait_event_type = 'Lock')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no command waited for the deployment lock"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_mid_command_is_given_up_on_naming_it() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let topo = Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-1\"\n\
         [[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"2-3\"\n{POSTS}",
        a.url(),
        b.url()
    ))
    .unwrap();
    pg::apply(&topo).await.unwrap();
    let holder = client(&b).await;

    // Another operator holds the deployment lock on b longer than the
    // silence after which a server is asked whether it is alive: b
    // answers, so check waits for the lock, then runs.
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&pg::DEPLOYMENT_LOCK])
        .await
        .unwrap();
    let check = tokio::spawn({
        let topo = topo.clone();
        async move { pg::check(&topo).await }
    });
    wait_for_lock_waiter(&holder).await;
    tokio::time::sleep(pg::liveness::SILENCE + pg::liveness::PROBE + Duration::from_secs(2)).await;
    assert!(!check.is_finished(), "check stopped waiting for the lock");
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&pg::DEPLOYMENT_LOCK])
        .await
        .unwrap();
    let drift = check.await.unwrap().unwrap();
    assert!(drift.is_empty(), "{drift:?}");

    // Now repair takes the lock on a (name order), waits on b, and a is
    // stopped before repair reads a's records.
    holder
        .execute("SELECT pg_advisory_lock($1)", &[&pg::DEPLOYMENT_LOCK])
        .await
        .unwrap();
    let repair = tokio::spawn({
        let topo = topo.clone();
        async move { pg::repair(&topo, None).await }
    });
    wait_for_lock_waiter(&holder).await;
    // Held while the pids are read: its backend is a's postmaster's child.
    let on_a = client(&a).await;
    let backend: i32 = on_a
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let stopped = Stopped::new(backend);
    holder
        .execute("SELECT pg_advisory_unlock($1)", &[&pg::DEPLOYMENT_LOCK])
        .await
        .unwrap();
    let started = Instant::now();
    let bound = pg::liveness::SILENCE + pg::liveness::PROBE + Duration::from_secs(20);
    let err = tokio::time::timeout(bound, repair)
        .await
        .unwrap_or_else(|_| panic!("repair still waits on the stopped server after {bound:?}"))
        .unwrap()
        .expect_err("repair went through a stopped server");
    let text = err.to_string();
    assert!(
        text.starts_with("server \"a\": ")
            && text.contains("a new connection got no answer")
            && text.contains("run the same command again"),
        "{text}"
    );
    assert!(
        matches!(err, shardflake_db::Error::Unresponsive { ref server, .. } if server == "a"),
        "{err:?}"
    );
    eprintln!("given up after {:?}: {text}", started.elapsed());

    // Going on, a runs again: the repair's transactions rolled back, and
    // the same command, run again, goes through; check finds nothing left.
    drop(stopped);
    pg::repair(&topo, None).await.unwrap();
    let drift = pg::check(&topo).await.unwrap();
    assert!(drift.is_empty(), "{drift:?}");
}
