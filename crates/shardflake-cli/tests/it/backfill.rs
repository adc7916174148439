//! `shardflake gen --at` and `gen --times`: ids for rows from the past, kept
//! unique across runs by the backfill state file, and what they refuse.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::process::{Command, Output};

use shardflake::{Id, preset};

fn gen_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(crate::shardflake_bin())
        .arg("gen")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("the binary runs")
}

fn ids(out: &Output) -> Vec<Id> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| Id(l.parse().unwrap()))
        .collect()
}

fn refused(out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "not refused: {stderr}");
    assert!(out.stdout.is_empty(), "printed ids: {:?}", out.stdout);
    assert!(stderr.contains(says), "{stderr:?} does not say {says:?}");
}

fn dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sf-backfill-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
fn runs_on_one_state_file_never_repeat_an_id() {
    let dir = dir();
    let layout = preset::by_name("snowflake").unwrap();
    // 20,000 rows over 5 s of 2019, in no order, many in one tick.
    let base = 1_551_441_600_000u64; // 2019-03-01T12:00:00Z
    let times: Vec<u64> = (0..20_000u64).map(|i| base + (i * 7919) % 5_000).collect();
    let text: String = times.iter().map(|t| format!("{t}\n")).collect();
    std::fs::write(dir.join("times.txt"), &text).unwrap();

    let mut seen = HashSet::new();
    for _run in 0..2 {
        let out = ids(&gen_in(&dir, &["--node", "1023", "--times", "times.txt"]));
        assert_eq!(out.len(), times.len());
        for (id, t) in out.iter().zip(&times) {
            let parts = id.decode(&layout).unwrap();
            assert_eq!(parts.unix_ms, *t);
            assert_eq!(parts.field("node"), Some(1023));
            assert!(seen.insert(*id), "{id} repeated");
        }
    }
    let at = ids(&gen_in(
        &dir,
        &["--node", "1023", "--at", "2019-03-01T12:00:00Z", "-n", "3"],
    ));
    assert_eq!(at.len(), 3);
    for id in at {
        assert_eq!(id.decode(&layout).unwrap().unix_ms, base);
        assert!(seen.insert(id), "{id} repeated");
    }
    // A refused file issues nothing and leaves the state as it was.
    let state = std::fs::read(dir.join("shardflake-backfill.state")).unwrap();
    std::fs::write(dir.join("bad.txt"), format!("{base}\n+1d\n")).unwrap();
    refused(
        &gen_in(&dir, &["--node", "1023", "--times", "bad.txt"]),
        "line 2",
    );
    std::fs::write(dir.join("bad.txt"), format!("{base}\nyesterday\n")).unwrap();
    refused(
        &gen_in(&dir, &["--node", "1023", "--times", "bad.txt"]),
        "line 2: \"yesterday\" is not a time",
    );
    assert_eq!(
        std::fs::read(dir.join("shardflake-backfill.state")).unwrap(),
        state
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn backfills_refuse_what_could_repeat_an_id() {
    let dir = dir();
    // No node id given: node 0 is a live node's.
    refused(
        &gen_in(&dir, &["--at", "-1d"]),
        "need the backfill's node id",
    );
    // The present and the future.
    refused(
        &gen_in(&dir, &["--node", "9", "--at", "now"]),
        "not in the past",
    );
    refused(
        &gen_in(&dir, &["--node", "9", "--at", "+1h"]),
        "not in the past",
    );
    // A full tick: sonyflake holds 256 ids per 10 ms tick.
    let out = gen_in(
        &dir,
        &[
            "-l",
            "sonyflake",
            "--machine",
            "9",
            "--at",
            "2020-01-01T00:00:00Z",
            "-n",
            "257",
        ],
    );
    refused(
        &out,
        "has no sequence value left: all 256 ids of the tick are used",
    );
    assert_eq!(
        ids(&gen_in(
            &dir,
            &[
                "-l",
                "sonyflake",
                "--machine",
                "9",
                "--at",
                "2020-01-01T00:00:00Z",
                "-n",
                "256"
            ]
        ))
        .len(),
        256
    );
    // The state file is another node's.
    refused(
        &gen_in(&dir, &["-l", "sonyflake", "--machine", "8", "--at", "-1d"]),
        "is the state of another backfill",
    );
    // Another backfill holds the state file.
    let lock: File = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("shardflake-backfill.state.lock"))
        .unwrap();
    lock.lock().unwrap();
    refused(
        &gen_in(&dir, &["-l", "sonyflake", "--machine", "9", "--at", "-1d"]),
        "another backfill is running",
    );
    drop(lock);
    assert_eq!(
        ids(&gen_in(
            &dir,
            &["-l", "sonyflake", "--machine", "9", "--at", "-1d"]
        ))
        .len(),
        1
    );
    let _ = std::fs::remove_dir_all(&dir);
}
