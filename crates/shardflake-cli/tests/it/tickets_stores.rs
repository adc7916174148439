//! Issue 36, item 4: one set of mark stores for every client of a tickets
//! file. `shardflake tickets next|check|repair|reshape`, each its own
//! process, keep and read the marks where the file's `[marks]` says (the
//! peers, and etcd), so both servers restored from dumps taken before (the
//! peers' marks set back with them) are raised past every id handed out.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use shardflake_testkit::serve::{Http, Serve, ServeOpts};
use shardflake_testkit::{Etcd, MariaDbServer};

fn shardflake(args: &[&str]) -> Output {
    Command::new(crate::shardflake_bin())
        .args(args)
        .env_remove("SHARDFLAKE_CONFIG")
        .env_remove("SHARDFLAKE_ETCD")
        .env_remove("SHARDFLAKE_ETCD_PREFIX")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(args: &[&str]) -> String {
    let out = shardflake(args);
    assert!(out.status.success(), "shardflake {args:?}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tickets next SEQUENCE -n N` with `file`: the ids.
fn next(file: &Path, sequence: &str, n: u64) -> Vec<u64> {
    let file = file.to_str().unwrap();
    ok(&[
        "tickets",
        "next",
        sequence,
        "-n",
        &n.to_string(),
        "--config",
        file,
    ])
    .lines()
    .map(|l| l.parse().unwrap())
    .collect()
}

fn dump(m: &MariaDbServer, dir: &Path, tag: &str) -> PathBuf {
    let out = Command::new("mariadb-dump")
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{}", m.port))
        .arg("app")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let path = dir.join(format!("{tag}-{}.sql", m.port));
    std::fs::write(&path, out.stdout).unwrap();
    path
}

fn assert_unique(what: &str, ids: &[u64]) {
    let set: HashSet<u64> = ids.iter().copied().collect();
    assert_eq!(
        set.len(),
        ids.len(),
        "{what}: {} duplicate ids",
        ids.len() - set.len()
    );
}

/// Both servers restored from the dumps taken right after `init`, twice:
/// after ids from `tickets next`, `check` sees the servers behind (the
/// marks only in etcd) and `repair` raises them; after more, `reshape`
/// raises every server past the marks in etcd. Before: `reshape` read the
/// marks on the servers only, and the reshaped file handed out ids again.
#[test]
fn every_tickets_command_uses_the_stores_the_file_names() {
    let etcd = Etcd::start(1).unwrap();
    let a = MariaDbServer::start_with(
        "--auto-increment-increment=2 --auto-increment-offset=1",
        None,
    )
    .unwrap();
    let b = MariaDbServer::start_with(
        "--auto-increment-increment=2 --auto-increment-offset=2",
        None,
    )
    .unwrap();
    let dir = shardflake_testkit::tempdir().unwrap();
    let marks = format!(
        "[marks]\netcd = [{}]\netcd_prefix = \"/stores\"\n",
        etcd.endpoints
            .iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let file = |name: &str, head: &str, offset_a: u64, offset_b: u64| {
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!(
                "{head}\n[[servers]]\nname = \"a\"\nkind = \"mariadb\"\nurl = {:?}\noffset = {offset_a}\n\n\
                 [[servers]]\nname = \"b\"\nkind = \"mariadb\"\nurl = {:?}\noffset = {offset_b}\n\n\
                 [[sequences]]\nname = \"photos\"\n\n\
                 [[sequences]]\nname = \"blocks\"\nmode = \"segment\"\n\n{marks}",
                a.url(),
                b.url()
            ),
        )
        .unwrap();
        path
    };
    let before = file("before.toml", "", 1, 2);
    let after = file("after.toml", "increment = 4", 1, 3);
    let config = before.to_str().unwrap();
    ok(&["tickets", "--config", config, "init"]);
    let (dump_a, dump_b) = (dump(&a, &dir, "init"), dump(&b, &dir, "init"));
    let restore_both = || {
        a.load(&dump_a).unwrap();
        b.load(&dump_b).unwrap();
    };

    let mut photos = next(&before, "photos", 2000);
    let mut blocks = next(&before, "blocks", 20_000);
    restore_both();
    let check = shardflake(&["tickets", "check", "--config", config]);
    assert!(
        !check.status.success() && text(&check).contains("behind"),
        "check did not read the marks in etcd: {}",
        text(&check)
    );
    ok(&["tickets", "repair", "--config", config]);
    ok(&["tickets", "check", "--config", config]);
    photos.extend(next(&before, "photos", 2000));
    blocks.extend(next(&before, "blocks", 20_000));
    assert_unique("after repair: photos", &photos);
    assert_unique("after repair: blocks", &blocks);

    restore_both();
    ok(&["tickets", "reshape", "--config", after.to_str().unwrap()]);
    photos.extend(next(&after, "photos", 2000));
    blocks.extend(next(&after, "blocks", 20_000));
    assert_unique("after reshape: photos", &photos);
    assert_unique("after reshape: blocks", &blocks);

    // `serve --tickets` keeps its marks in the same stores: both servers
    // restored from dumps taken before it handed out ids, `tickets next`
    // hands out none of them again.
    let (dump_a, dump_b) = (dump(&a, &dir, "reshaped"), dump(&b, &dir, "reshaped"));
    let mut serve = Serve::start(
        crate::shardflake_bin(),
        ServeOpts {
            args: vec!["--tickets".into(), after.to_str().unwrap().into()],
            ..Default::default()
        },
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        serve.ready(Duration::from_secs(30)).await.unwrap();
        let mut http = Http::new(&serve.http);
        for _ in 0..4 {
            photos.extend(tickets(&mut http, "photos", 500).await);
            blocks.extend(tickets(&mut http, "blocks", 5000).await);
        }
    });
    serve.signal(libc::SIGTERM);
    serve.wait_exit(Duration::from_secs(30)).unwrap();
    a.load(&dump_a).unwrap();
    b.load(&dump_b).unwrap();
    photos.extend(next(&after, "photos", 2000));
    blocks.extend(next(&after, "blocks", 20_000));
    assert_unique("after serve: photos", &photos);
    assert_unique("after serve: blocks", &blocks);
}

/// `GET /v1/tickets/SEQUENCE?count=N`: the ids.
async fn tickets(http: &mut Http, sequence: &str, n: u64) -> Vec<u64> {
    let (status, body) = http
        .get(&format!("/v1/tickets/{sequence}?count={n}&numbers=true"))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_u64().unwrap())
        .collect()
}

/// `tickets next` takes its ids and stops, and a client that stops skips
/// the unused rest of its blocks (rows only go up). Its blocks hold what
/// it asks for, rounded up to a chunk (100 here), none fetched ahead: six
/// runs of `-n 5` on a pair use the first chunks of each server. Before:
/// blocks of 1,000 and one fetched ahead, up to ~2,000 ids skipped a run,
/// the third run's ids above 2,000.
#[test]
fn one_shot_next_skips_less_than_a_chunk_a_run() {
    let a = MariaDbServer::start_with(
        "--auto-increment-increment=2 --auto-increment-offset=1",
        None,
    )
    .unwrap();
    let b = MariaDbServer::start_with(
        "--auto-increment-increment=2 --auto-increment-offset=2",
        None,
    )
    .unwrap();
    let dir = shardflake_testkit::tempdir().unwrap();
    let file = dir.join("tickets.toml");
    std::fs::write(
        &file,
        format!(
            "[[servers]]\nname = \"a\"\nkind = \"mariadb\"\nurl = {:?}\noffset = 1\n\n\
             [[servers]]\nname = \"b\"\nkind = \"mariadb\"\nurl = {:?}\noffset = 2\n\n\
             [[sequences]]\nname = \"blocks\"\nmode = \"segment\"\n",
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    ok(&["tickets", "--config", file.to_str().unwrap(), "init"]);
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.extend(next(&file, "blocks", 5));
    }
    assert_unique("blocks", &ids);
    assert_eq!(ids.len(), 30);
    // Six blocks of one chunk each, however the runs fall on the two
    // servers: within the first 12 chunks. With blocks of 1,000, some
    // server serves twice, its second block from id 2,001 on.
    let top = ids.iter().max().unwrap();
    assert!(*top <= 1200, "ids up to {top}: {ids:?}");
}
