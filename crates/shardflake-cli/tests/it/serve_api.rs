//! `shardflake serve` processes with a static node id: restarts resuming
//! after the state file (a crash, libfaketime), one process per state file,
//! start errors. The API itself is tested in-process in the service crate
//! (`shardflake-service/tests/it`).

use std::time::Duration;

use shardflake_testkit::{Http, Serve, ServeOpts, id_of};

use crate::shardflake_bin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_resume_after_the_state_file() -> anyhow::Result<()> {
    let libfaketime = shardflake_testkit::libfaketime()?;
    let dir = shardflake_testkit::tempdir()?;
    // Rounds 1 and 2 run with the wall clock 5 s behind (libfaketime): only
    // the state file's high-water keeps their ids above round 0's (caught:
    // a state file ignored or read as 0).
    let with_dir = |round: usize| ServeOpts {
        args: vec![
            "--workers".into(),
            "1".into(),
            "--window".into(),
            "1s".into(),
        ],
        env: if round == 0 {
            Vec::new()
        } else {
            vec![
                ("LD_PRELOAD".into(), libfaketime.display().to_string()),
                ("FAKETIME".into(), "-5s".into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
            ]
        },
        dir: Some(dir.clone()),
    };
    let mut last = 0;
    for round in 0..3 {
        let mut s =
            tokio::task::block_in_place(|| Serve::start(shardflake_bin(), with_dir(round)))?;
        s.ready(Duration::from_secs(20)).await?;
        let mut c = Http::new(&s.http);
        for _ in 0..200 {
            let (st, body) = c.get("/v1/id").await?;
            assert_eq!(st, 200, "{body}");
            let id = id_of(&body)?;
            assert!(id > last, "round {round}: {id} after {last}");
            last = id;
        }
        if round == 1 {
            s.kill(); // a crash: the successor waits out the recorded window
        } else {
            s.signal(libc::SIGTERM);
            assert!(
                s.exit(Duration::from_secs(15)).await?.success(),
                "{}",
                s.stderr()
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_file_serves_one_process() -> anyhow::Result<()> {
    let dir = shardflake_testkit::tempdir()?;
    let state = dir.join("state").display().to_string();
    let args = |d: &str| ServeOpts {
        args: vec![
            "--workers".into(),
            "1".into(),
            "--state-file".into(),
            state.clone(),
        ],
        dir: Some(dir.join(d)),
        ..Default::default()
    };
    let a = tokio::task::block_in_place(|| Serve::start(shardflake_bin(), args("a")))?;
    assert_eq!(a.ready(Duration::from_secs(10)).await?, 0);
    // Caught: a second process with the same node id and state file would
    // issue the same ids. It must fail at start, with the reason.
    let why = match tokio::task::block_in_place(|| Serve::start(shardflake_bin(), args("b"))) {
        Ok(mut b) => {
            assert!(!b.exit(Duration::from_secs(10)).await?.success());
            b.stderr()
        }
        Err(e) => format!("{e:#}"),
    };
    assert!(why.contains("in use by another"), "{why}");
    let (st, _) = Http::new(&a.http).get("/v1/id").await?;
    assert_eq!(st, 200, "the first process serves on");
    Ok(())
}

#[test]
fn start_errors_are_clear() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(shardflake_bin())
            .arg("serve")
            .args(args)
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            // A directory of its own: the default state file is locked,
            // and another process in a shared directory would hold it.
            .current_dir(shardflake_testkit::tempdir().unwrap())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--node-id", "1024"]).contains("does not fit"));
    assert!(run(&["--layout", "nope"]).contains("unknown layout"));
    assert!(run(&["--rollback", "maybe"]).contains("rollback"));
    let started = std::time::Instant::now();
    let err = run(&[
        "--etcd",
        "http://127.0.0.1:1",
        "--lease-ttl",
        "2s",
        "--etcd-timeout",
        "200ms",
    ]);
    assert!(err.contains("etcd unreachable"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));
}
