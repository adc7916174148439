//! PostgreSQL failover (issue 37, F1 and SB): an async standby made with
//! `pg_basebackup -R`, its clock 4 s behind the primary's (libfaketime),
//! its WAL receiver cut while the primary goes on making ids, the primary
//! killed and the standby promoted with `pg_ctl promote`. The promoted
//! standby has the sequence as it was at the cut; its own clock is behind
//! ids the primary made since. It must make no id until `pg repair`, which
//! refuses while its clock is off and then puts it past every id the old
//! primary made. The old primary restarted beside it (split brain) makes
//! no id either.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use shardflake_db::pg::{self, Topology};
use shardflake_testkit::{PgServer, free_port, libfaketime};

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

/// A physical copy of `primary` (`pg_basebackup`), started as its standby
/// (`-R`) or on its own as a primary, whose wall clock is shifted by what
/// its faketime file says; stopped and removed on drop.
pub(crate) struct Standby {
    dir: PathBuf,
    clock: PathBuf,
    port: u16,
    pg_ctl: PathBuf,
}

impl Standby {
    fn start(primary: &PgServer, clock_shift: &str) -> Standby {
        Standby::start_copy(primary, "standby", clock_shift, true)
    }

    /// A copy named `name` (its directory), a standby or a primary.
    pub(crate) fn start_copy(
        primary: &PgServer,
        name: &str,
        clock_shift: &str,
        standby: bool,
    ) -> Standby {
        let dir = std::env::temp_dir().join(format!("sf-copy-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let data = dir.join("data");
        let clock = dir.join("clock");
        std::fs::write(&clock, clock_shift).unwrap();
        run(Command::new(primary.program("pg_basebackup").unwrap())
            .args(["-h", "127.0.0.1", "-p", &primary.port.to_string()])
            .args(["-U", "postgres", "-X", "stream", "-c", "fast", "-D"])
            .arg(&data)
            .args(if standby { &["-R"][..] } else { &[][..] }));
        run(Command::new("sh").arg("-c").arg(format!(
            "chmod 755 '{0}' && chown postgres '{0}' && chmod 644 '{0}/clock' && chown -R postgres:postgres '{1}' && chmod 700 '{1}'",
            dir.display(),
            data.display()
        )));
        let standby = Standby {
            port: free_port().unwrap(),
            pg_ctl: primary.program("pg_ctl").unwrap(),
            dir,
            clock,
        };
        let faketime = libfaketime().unwrap();
        run(Command::new("runuser")
            .args(["-u", "postgres", "--", "env"])
            .arg(format!("LD_PRELOAD={}", faketime.display()))
            .arg(format!(
                "FAKETIME_TIMESTAMP_FILE={}",
                standby.clock.display()
            ))
            .args(["FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"])
            .arg(&standby.pg_ctl)
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(standby.dir.join("log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
                standby.port,
                data.display()
            ))
            .arg("start"));
        standby
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Renamed into place, never truncated in place: libfaketime reads the
    /// file at every clock call, and an empty read is no offset at all.
    fn set_clock(&self, shift: &str) {
        let tmp = self.clock.with_extension("tmp");
        std::fs::write(&tmp, shift).unwrap();
        std::fs::rename(&tmp, &self.clock).unwrap();
    }

    pub(crate) fn promote(&self) {
        run(Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&self.pg_ctl)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "promote"]));
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(&self.pg_ctl)
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn topology(url: &str) -> Topology {
    Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{url}\"\nshards = \"0\"\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, user_id bigint NOT NULL)\"\n"
    ))
    .unwrap()
}

async fn insert(c: &tokio_postgres::Client, n: i64) -> Result<Vec<i64>, tokio_postgres::Error> {
    Ok(c
        .query(
            "INSERT INTO shard0.posts (user_id) SELECT g FROM generate_series(1, $1::bigint) g RETURNING id",
            &[&n],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

/// Waits, bounded, until `query` (one boolean) is true on `c`.
async fn wait_for(c: &tokio_postgres::Client, query: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !c.query_one(query, &[]).await.unwrap().get::<_, bool>(0) {
        assert!(Instant::now() < deadline, "not {what} after 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_promoted_with_a_clock_behind_makes_no_id_the_old_primary_made() {
    let a = PgServer::start().unwrap();
    let topo_a = topology(&a.url());
    pg::apply(&topo_a).await.unwrap();
    let ca = pg::connect_url("a", &a.url()).await.unwrap();
    let mut made = insert(&ca, 1000).await.unwrap();

    let standby = Standby::start(&a, "-4s");
    let cs = pg::connect_url("standby", &standby.url()).await.unwrap();
    // The standby has everything so far, then its receiver is cut.
    let lsn: String = ca
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    wait_for(
        &cs,
        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        "replayed",
    )
    .await;
    for sql in [
        "ALTER SYSTEM SET primary_conninfo = ''",
        "SELECT pg_reload_conf()",
    ] {
        cs.batch_execute(sql).await.unwrap();
    }
    wait_for(
        &cs,
        "SELECT NOT EXISTS (SELECT FROM pg_stat_wal_receiver)",
        "cut",
    )
    .await;
    // The primary goes on for 3 s that the standby never receives.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        made.extend(insert(&ca, 50).await.unwrap());
    }
    drop(ca);
    a.kill().unwrap();
    standby.promote();
    wait_for(&cs, "SELECT NOT pg_is_in_recovery()", "promoted").await;
    let max_made = *made.iter().max().unwrap();

    // Before any operator step: no id (on the old code, ids the dead
    // primary had made).
    match insert(&cs, 2000).await {
        Err(e) => assert_eq!(sqlstate(&e), "SF005", "{e}"),
        Ok(ids) => {
            let seen: HashSet<i64> = made.iter().copied().collect();
            panic!(
                "the promoted standby made ids at once: {} of {} at or below the old primary's last, {} repeated",
                ids.iter().filter(|&&id| id <= max_made).count(),
                ids.len(),
                ids.iter().filter(|id| seen.contains(id)).count()
            );
        }
    }
    let topo_s = topology(&standby.url());
    let drift: Vec<String> = pg::check(&topo_s)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    for what in ["replayed WAL", "timeline", "behind this host's"] {
        assert!(drift.iter().any(|d| d.contains(what)), "{what}: {drift:?}");
    }
    // On the promoted server itself: repair it, never "this is the old
    // primary: do not repair it" (the text for a restart on the old timeline).
    assert!(
        !drift.iter().any(|d| d.contains("this is the old primary")),
        "{drift:#?}"
    );
    // Its clock is 4 s behind: repair refuses, naming the clock; apply
    // refuses the clock and the restart.
    let err = pg::repair(&topo_s, None).await.unwrap_err().to_string();
    assert!(err.contains("behind this host's"), "{err}");
    let err = pg::apply(&topo_s).await.unwrap_err().to_string();
    assert!(
        err.contains("behind this host's") && err.contains("pg apply does not lift this"),
        "{err}"
    );
    assert!(insert(&cs, 1).await.is_err());
    // The clock corrected, repair puts the shard past every id made.
    standby.set_clock("+0");
    pg::repair(&topo_s, None).await.unwrap();
    assert_eq!(pg::check(&topo_s).await.unwrap(), Vec::new());
    let after = insert(&cs, 2000).await.unwrap();
    assert!(
        after.iter().all(|&id| id > max_made),
        "ids at or below the old primary's last: {}",
        after.iter().filter(|&&id| id <= max_made).count()
    );

    // Split brain: the old primary restarted beside the promoted one
    // (crash recovery) makes no id, and check says what it may be.
    a.restart().unwrap();
    let ca = pg::connect_url("a", &a.url()).await.unwrap();
    let e = insert(&ca, 1).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF005", "{e}");
    let drift: Vec<String> = pg::check(&topo_a)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift
            .iter()
            .any(|d| d.contains("this is the old primary: do not repair it")),
        "{drift:?}"
    );
    // apply cannot lift it either.
    let err = pg::apply(&topo_a).await.unwrap_err().to_string();
    assert!(err.contains("pg repair"), "{err}");
    assert!(insert(&ca, 1).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_or_crashed_server_makes_ids_again_after_repair() {
    let a = PgServer::start().unwrap();
    let topo = topology(&a.url());
    pg::apply(&topo).await.unwrap();
    let c = pg::connect_url("a", &a.url()).await.unwrap();
    let before = insert(&c, 500).await.unwrap();
    drop(c);
    // A clean restart (fast shutdown) too: nothing on the server tells it
    // from an old primary started again beside a promoted standby.
    a.restart().unwrap();
    let c = pg::connect_url("a", &a.url()).await.unwrap();
    let e = insert(&c, 1).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF005", "{e}");
    pg::repair(&topo, None).await.unwrap();
    assert_eq!(pg::check(&topo).await.unwrap(), Vec::new());
    let after = insert(&c, 500).await.unwrap();
    let max = *before.iter().max().unwrap();
    assert!(after.iter().all(|&id| id > max));

    // One backend killed: PostgreSQL restarts every process and replays
    // WAL (a crash, though the postmaster stays): refused until repair.
    // The run is what next_id compares: a session that connects before
    // the postmaster has reaped the killed backend is still on the old
    // run (and may make ids), so wait for the new one.
    let run_sql = "SELECT pg_postmaster_start_time()::text || ' ' || \
                   coalesce(pg_last_wal_replay_lsn()::text, '-')";
    let old_run: String = c.query_one(run_sql, &[]).await.unwrap().get(0);
    let pid: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    run(Command::new("kill").args(["-9", &pid.to_string()]));
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(30);
    let c = loop {
        if let Ok(c) = pg::connect_url("a", &a.url()).await
            && let Ok(row) = c.query_one(run_sql, &[]).await
            && row.get::<_, String>(0) != old_run
        {
            break c;
        }
        assert!(Instant::now() < deadline, "not back after 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let e = insert(&c, 1).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF005", "{e}");
    pg::repair(&topo, None).await.unwrap();
    let again = insert(&c, 500).await.unwrap();
    let max = *after.iter().max().unwrap();
    assert!(again.iter().all(|&id| id > max));
}

fn two_servers(a: &str, b: &str) -> Topology {
    Topology::parse(&format!(
        "layout = \"instagram\"\nshards = 2\n\
         [[servers]]\nname = \"a\"\nurl = \"{a}\"\nshards = \"0\"\n\
         [[servers]]\nname = \"b\"\nurl = \"{b}\"\nshards = \"1\"\n\
         [[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, user_id bigint NOT NULL)\"\n"
    ))
    .unwrap()
}

/// Split brain in a deployment of two servers: once `pg repair` has
/// vouched for the promoted standby, every server records its database
/// on the new timeline, so a file that still reaches the old primary
/// (started again on the old one) is refused by repair and apply and
/// reported by check: no command makes it serve again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_primary_is_refused_wherever_a_file_still_reaches_it() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    pg::apply(&two_servers(&a.url(), &b.url())).await.unwrap();
    let standby = Standby::start(&a, "+0");
    let cs = pg::connect_url("standby", &standby.url()).await.unwrap();
    let ca = pg::connect_url("a", &a.url()).await.unwrap();
    let lsn: String = ca
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    wait_for(
        &cs,
        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        "replayed",
    )
    .await;
    drop(ca);
    a.kill().unwrap();
    standby.promote();
    wait_for(&cs, "SELECT NOT pg_is_in_recovery()", "promoted").await;
    let promoted = two_servers(&standby.url(), &b.url());
    pg::repair(&promoted, None).await.unwrap();
    assert_eq!(pg::check(&promoted).await.unwrap(), Vec::new());

    a.restart().unwrap();
    let old = two_servers(&a.url(), &b.url());
    let e = pg::repair(&old, None).await.unwrap_err().to_string();
    assert!(e.contains("a copy left on an older timeline"), "{e}");
    let e = pg::apply(&old).await.unwrap_err().to_string();
    assert!(e.contains("a copy left on an older timeline"), "{e}");
    let dir = std::env::temp_dir().join(format!("s37-move-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shardflake.toml");
    std::fs::write(&file, old.to_toml()).unwrap();
    let e = pg::move_shard::move_shard(&file, 1, "a", &Default::default())
        .await
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(e.contains("a copy left on an older timeline"), "{e}");
    let drift: Vec<String> = pg::check(&old)
        .await
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        drift
            .iter()
            .any(|d| d.starts_with("a: is on WAL timeline 1, but server \"b\" records timeline 2")),
        "{drift:?}"
    );
    let ca = pg::connect_url("a", &a.url()).await.unwrap();
    let e = insert(&ca, 1).await.unwrap_err();
    assert_eq!(sqlstate(&e), "SF005", "{e}");
}

/// A move from a promoted standby before `pg repair` is refused, naming
/// it (tested before only through a restart): the move would carry on a
/// sequence that may be behind the old primary's last ids, without the
/// margin repair adds after a timeline change. After the repair the same
/// move goes through, and the shard makes ids on its new server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_from_a_promoted_standby_is_refused_until_repair() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    pg::apply(&two_servers(&a.url(), &b.url())).await.unwrap();
    let standby = Standby::start(&a, "+0");
    let cs = pg::connect_url("standby", &standby.url()).await.unwrap();
    let ca = pg::connect_url("a", &a.url()).await.unwrap();
    let made = insert(&ca, 100).await.unwrap();
    let lsn: String = ca
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);
    wait_for(
        &cs,
        &format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"),
        "replayed",
    )
    .await;
    drop(ca);
    a.kill().unwrap();
    standby.promote();
    wait_for(&cs, "SELECT NOT pg_is_in_recovery()", "promoted").await;

    let promoted = two_servers(&standby.url(), &b.url());
    let dir = std::env::temp_dir().join(format!("s37-move-promoted-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shardflake.toml");
    std::fs::write(&file, promoted.to_toml()).unwrap();
    let e = pg::move_shard::move_shard(&file, 0, "b", &Default::default())
        .await
        .expect_err("a shard moved from a promoted standby before its repair")
        .to_string();
    assert!(
        e.contains("WAL timeline") && e.contains("run `shardflake pg repair`"),
        "{e}"
    );
    let cb = pg::connect_url("b", &b.url()).await.unwrap();
    let on_b: bool = cb
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'shard0')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!on_b, "the refused move left a copy of shard 0 on b");

    pg::repair(&promoted, None).await.unwrap();
    pg::move_shard::move_shard(&file, 0, "b", &Default::default())
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let after = insert(&cb, 100).await.unwrap();
    let max = *made.iter().max().unwrap();
    assert!(after.iter().all(|&id| id > max));
}
