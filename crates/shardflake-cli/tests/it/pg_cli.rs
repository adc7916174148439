//! `shardflake pg ...`, `shardflake mysql ...` and `shardflake tickets ...`
//! end to end, against real servers the tests start (and stop on drop).

use std::path::Path;
use std::process::{Command, Output};

use shardflake_testkit::{MariaDbServer, PgServer};

fn shardflake(args: &[&str]) -> Output {
    Command::new(crate::shardflake_bin())
        .args(args)
        .env_remove("SHARDFLAKE_TOPOLOGY")
        .env_remove("SHARDFLAKE_LAYOUT")
        .output()
        .unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = shardflake(args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "shardflake {args:?} failed:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs a failing command; returns stdout + stderr, checking it is an error
/// exit and not a panic.
fn fails(args: &[&str]) -> String {
    let out = shardflake(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(1), "shardflake {args:?}: {text}");
    assert!(!text.contains("panicked"), "{text}");
    text
}

fn write_topology(path: &Path, a: &PgServer, b: &PgServer, a_shards: &str, b_shards: &str) {
    std::fs::write(
        path,
        format!(
            r#"layout = "instagram"
shards = 4

[[servers]]
name = "a"
url = "{}"
shards = "{a_shards}"

[[servers]]
name = "b"
url = "{}"
shards = "{b_shards}"

[[tables]]
name = "posts"
sql = "CREATE TABLE {{schema}}.posts (id bigint PRIMARY KEY DEFAULT {{next_id}}, user_id bigint NOT NULL, body text)"
"#,
            a.url(),
            b.url()
        ),
    )
    .unwrap();
}

async fn psql(s: &PgServer, sql: &str) -> Vec<shardflake_db::tokio_postgres::Row> {
    let c = shardflake_db::pg::connect_url("t", &s.url()).await.unwrap();
    c.query(sql, &[]).await.unwrap()
}

/// A server added to the file joins only through `pg apply --new-server`.
#[test]
fn pg_apply_adds_a_server_only_when_named_new() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-new-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("shardflake.toml");
    let t = topo.to_str().unwrap();
    let posts = "[[tables]]\nname = \"posts\"\nsql = \"CREATE TABLE {schema}.posts (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL)\"\n";
    let one = format!(
        "shards = 4\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0-3\"\n{posts}",
        a.url()
    );
    std::fs::write(&topo, &one).unwrap();
    ok(&["pg", "apply", "-t", t]);
    let two = format!(
        "{one}[[servers]]\nname = \"b\"\nurl = \"{}\"\nshards = \"\"\n",
        b.url()
    );
    std::fs::write(&topo, &two).unwrap();
    let e = fails(&["pg", "apply", "-t", t]);
    assert!(
        e.contains("add it with `shardflake pg apply --new-server b`"),
        "{e}"
    );
    assert_eq!(
        ok(&["pg", "apply", "--new-server", "b", "-t", t]),
        "a: 4 shards, 0 tables created\nb: 0 shards, 0 tables created\n"
    );
    assert!(ok(&["pg", "check", "-t", t]).starts_with("ok: 4 logical shards"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_apply_check_route_locate_move() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("shardflake.toml");
    let t = topo.to_str().unwrap();
    write_topology(&topo, &a, &b, "0-1", "2-3");

    assert_eq!(
        ok(&["pg", "apply", "-t", t]),
        "a: 2 shards, 2 tables created\nb: 2 shards, 2 tables created\n"
    );
    assert_eq!(
        ok(&["pg", "apply", "-t", t]),
        "a: 2 shards, 0 tables created\nb: 2 shards, 0 tables created\n"
    );
    assert!(ok(&["pg", "check", "-t", t]).starts_with("ok: 4 logical shards"));
    let route = ok(&["pg", "route", "31341", "-t", t]);
    assert_eq!(
        route,
        format!(
            "key 31341 -> shard 1 (schema shard1) on server a ({})\n",
            a.url()
        )
    );
    assert!(
        ok(&["pg", "sql", "-t", t, "--shard", "1"])
            .contains("CREATE OR REPLACE FUNCTION shard1.next_id(seq regclass)")
    );

    let id: i64 = psql(
        &a,
        "INSERT INTO shard1.posts (user_id) VALUES (31341) RETURNING id",
    )
    .await[0]
        .get(0);
    let located = ok(&["pg", "locate", &id.to_string(), "-t", t]);
    assert!(
        located.starts_with(&format!("id {id} -> shard 1 (schema shard1) on server a")),
        "{located}"
    );

    // Move shard 1 to b: the topology file switches, the old copy is dropped.
    let moved = ok(&["pg", "move-shard", "1", "--to", "b", "-t", t]);
    assert!(
        moved.starts_with("moved shard 1 from a to b: rows [posts 1]"),
        "{moved}"
    );
    assert!(ok(&["pg", "route", "31341", "-t", t]).contains("on server b"));
    assert!(ok(&["pg", "locate", &id.to_string(), "-t", t]).contains("on server b"));
    assert!(ok(&["pg", "check", "-t", t]).starts_with("ok:"));
    let next: i64 = psql(
        &b,
        "INSERT INTO shard1.posts (user_id) VALUES (31341) RETURNING id",
    )
    .await[0]
        .get(0);
    assert!(next > id, "the sequence moved with the shard");
    assert!(fails(&["pg", "move-shard", "1", "--to", "b", "-t", t]).contains("already on \"b\""));
    assert!(
        fails(&["pg", "move-shard", "1", "--to", "zz", "-t", t]).contains("no server named \"zz\"")
    );

    // Drift: a missing schema is reported, with a failing exit.
    psql(&a, "DROP SCHEMA shard0 CASCADE").await;
    let drift = fails(&["pg", "check", "-t", t]);
    assert!(
        drift.contains("a: shard 0: schema shard0 is missing"),
        "{drift}"
    );
    ok(&["pg", "apply", "-t", t]);
    assert!(ok(&["pg", "check", "-t", t]).starts_with("ok:"));

    // Bad topology files: clear errors, no panic.
    let bad = dir.join("bad.toml");
    let b_ = bad.to_str().unwrap();
    write_topology(&bad, &a, &b, "0-2", "2-3");
    assert!(
        fails(&["pg", "check", "-t", b_])
            .contains("error: shard 2 is held by both \"a\" and \"b\"")
    );
    write_topology(&bad, &a, &b, "0", "2-3");
    assert!(fails(&["pg", "apply", "-t", b_]).contains("shards 1 are not held by any server"));
    std::fs::write(
        &bad,
        std::fs::read_to_string(&topo)
            .unwrap()
            .replace("shards = 4", "shards = 9000"),
    )
    .unwrap();
    assert!(fails(&["pg", "route", "1", "-t", b_]).contains("13 shard bits, so 1..=8192"));
    std::fs::write(
        &bad,
        std::fs::read_to_string(&topo)
            .unwrap()
            .replace(&b.url(), "http://x"),
    )
    .unwrap();
    assert!(fails(&["pg", "apply", "-t", b_]).contains("bad url \"http://x\""));
    assert!(
        fails(&["pg", "check", "-t", "/nonexistent.toml"])
            .contains("reading topology /nonexistent.toml")
    );

    // A dead server.
    b.stop();
    let e = fails(&["pg", "apply", "-t", t]);
    assert!(e.contains("cannot connect to server \"b\""), "{e}");
    assert!(fails(&["pg", "check", "-t", t]).contains("b: unreachable: cannot connect"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reproduction 5 of issue #28: `move-shard` killed once the source is
/// fenced (here: SIGKILLed as soon as the fence shows, or stopped there by
/// the hidden failpoint, whichever comes first). The shard must not stay
/// fenced everywhere while check says ok: check reports it, apply refuses,
/// and running the move again finishes it with no id twice.
/// `synchronous_commit = off` (a crash can make acknowledged ids again)
/// is a warning of `pg apply` and a difference `pg check` exits 1 on;
/// `fsync = off` (safe against a killed server, not an OS crash) a warning
/// of both, as `mysql apply`/`check` treat InnoDB's flush settings.
#[test]
fn pg_apply_and_check_report_the_durability_settings() {
    let (a, b) = (
        PgServer::start_with(&[("synchronous_commit", "off")]).unwrap(),
        PgServer::start().unwrap(),
    );
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-durable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("shardflake.toml");
    let t = topo.to_str().unwrap();
    write_topology(&topo, &a, &b, "0-1", "2-3");

    let out = shardflake(&["pg", "apply", "-t", t]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert_eq!(
        stdout,
        "a: 2 shards, 2 tables created\nb: 2 shards, 2 tables created\n"
    );
    let warned = |text: &str, setting: &str, server: &str| {
        text.lines().any(|l| {
            l.contains(" WARN ")
                && l.contains(setting)
                && l.ends_with(&format!("server=\"{server}\""))
        })
    };
    for (setting, server) in [
        ("synchronous_commit = off", "a"),
        ("fsync = off", "a"),
        ("fsync = off", "b"),
    ] {
        assert!(
            warned(&stderr, setting, server),
            "{setting} on {server}:\n{stderr}"
        );
    }
    assert!(
        !warned(&stderr, "synchronous_commit = off", "b"),
        "{stderr}"
    );

    let text = fails(&["pg", "check", "-t", t]);
    assert!(
        text.contains("a: synchronous_commit = off (for this server):")
            && text.contains("error: 1 difference(s)")
            && warned(&text, "fsync = off", "b"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_killed_after_the_fence_is_reported_and_finished_by_a_rerun() {
    let (a, b) = (PgServer::start().unwrap(), PgServer::start().unwrap());
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("shardflake.toml");
    let t = topo.to_str().unwrap();
    write_topology(&topo, &a, &b, "0-1", "2-3");
    ok(&["pg", "apply", "-t", t]);
    let before: Vec<i64> = psql(
        &a,
        "INSERT INTO shard1.posts (user_id, body) SELECT g, repeat('x', 100) FROM generate_series(1, 300000) g RETURNING id",
    )
    .await
    .iter()
    .map(|r| r.get(0))
    .collect();

    let mut mover = Command::new(crate::shardflake_bin())
        .args(["pg", "move-shard", "1", "--to", "b", "-t", t])
        .env_remove("SHARDFLAKE_TOPOLOGY")
        .env("SHARDFLAKE_MOVE_STOP_AFTER", "fenced")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let c = shardflake_db::pg::connect_url("t", &a.url()).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let fenced: bool = c
            .query_one(
                "SELECT to_regprocedure('shard1.shardflake_moved()') IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if fenced || mover.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the move never fenced"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let _ = mover.kill();
    mover.wait().unwrap();
    let fenced: bool = c
        .query_one(
            "SELECT to_regprocedure('shard1.shardflake_moved()') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(fenced, "the move was stopped before its fence");
    let e = c
        .execute("INSERT INTO shard1.posts (user_id) VALUES (1)", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("SF001"), "{e}");

    let check = fails(&["pg", "check", "-t", t]);
    assert!(check.contains("move-shard 1 --to b"), "{check}");
    assert!(fails(&["pg", "apply", "-t", t]).contains("move-shard 1 --to b"));
    let rerun = ok(&["pg", "move-shard", "1", "--to", "b", "-t", t]);
    assert!(rerun.contains("moved shard 1 from a to b"), "{rerun}");
    assert!(ok(&["pg", "check", "-t", t]).starts_with("ok:"));
    assert!(ok(&["pg", "route", "31341", "-t", t]).contains("on server b"));
    let after: Vec<i64> = psql(
        &b,
        "INSERT INTO shard1.posts (user_id) SELECT g FROM generate_series(1, 1000) g RETURNING id",
    )
    .await
    .iter()
    .map(|r| r.get(0))
    .collect();
    let max_before = before.iter().max().copied().unwrap();
    assert!(after.iter().all(|id| *id > max_before));
    let rows: i64 = psql(&b, "SELECT count(*) FROM shard1.posts").await[0].get(0);
    assert_eq!(rows, 301_000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #28's last items: `mysql --layout snowflake` is refused, not
/// replaced by mysql-procedure; a refusal is printed once.
#[test]
fn mysql_layout_is_never_replaced_and_a_refusal_is_printed_once() {
    let e = fails(&["mysql", "sql", "--layout", "snowflake"]);
    assert!(e.contains("has no \"shard\" field"), "{e}");
    let out = Command::new(crate::shardflake_bin())
        .args(["mysql", "sql"])
        .env("SHARDFLAKE_LAYOUT", "snowflake")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let m = MariaDbServer::start().unwrap();
    let no_db = m.url().trim_end_matches("/app").to_string();
    let e = fails(&["mysql", "apply", "--url", &no_db]);
    assert_eq!(e.matches("names no database").count(), 1, "{e}");
}

#[test]
fn mysql_apply_call_sql() {
    let sql = ok(&["mysql", "sql"]);
    assert!(
        sql.contains("LAST_INSERT_ID(GREATEST(next_val + 1, now_packed))"),
        "{sql}"
    );
    assert!(ok(&["mysql", "sql", "--seed"]).contains("SELECT next_val % 1024 FROM sequences"));

    let server = MariaDbServer::start().unwrap();
    let url = server.url();
    assert!(ok(&["mysql", "apply", "--url", &url]).starts_with("installed generate_post_id"));
    let out = ok(&["mysql", "call", "1801", "-n", "3", "--url", &url]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert!(l.contains(" shard 777 "), "{l}");
    }
    let ids: Vec<i64> = lines
        .iter()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    let dead = format!(
        "mysql://root@127.0.0.1:{}/mysql",
        shardflake_testkit::free_port().unwrap()
    );
    let e = fails(&["mysql", "call", "1", "--url", &dead]);
    assert!(e.contains("error:"), "{e}");
}

/// `tickets init|check|next` on one MariaDB ticket server: a per-id `next`
/// above the per-request limit is asked in chunks; bad counts and unknown
/// sequences are clear errors; a `next` stopped by a later id prints the
/// ids it got, then the error, and exits non-zero.
#[test]
fn tickets_init_check_next() {
    let server = MariaDbServer::start().unwrap();
    let dir = shardflake_testkit::tempdir().unwrap();
    let file = dir.join("tickets.toml");
    std::fs::write(
        &file,
        format!(
            "[[servers]]\nname = \"t1\"\nkind = \"mariadb\"\nurl = {:?}\noffset = 1\n\n\
             [[sequences]]\nname = \"photos\"\n\n\
             [[sequences]]\nname = \"blocks\"\nmode = \"segment\"\n",
            server.url()
        ),
    )
    .unwrap();
    let config = file.to_str().unwrap();
    ok(&["tickets", "--config", config, "init"]);
    let check = ok(&["tickets", "check", "--config", config]);
    assert!(
        check.contains("session: auto_increment_increment 1 auto_increment_offset 1")
            && check.ends_with("\nok\n"),
        "{check}"
    );

    let numbers = |text: String| -> Vec<u64> { text.lines().map(|l| l.parse().unwrap()).collect() };
    // 2,500 per-id tickets: three requests to the client (1,000 at most
    // each), one server, so 1..=2500 in order.
    let photos = numbers(ok(&[
        "tickets", "next", "photos", "-n", "2500", "--config", config,
    ]));
    assert_eq!(photos, (1..=2500).collect::<Vec<u64>>());
    let blocks = numbers(ok(&[
        "tickets", "next", "blocks", "-n", "100000", "--config", config,
    ]));
    assert_eq!(blocks.len(), 100_000);
    assert!(blocks.windows(2).all(|w| w[0] < w[1]));

    for n in ["0", "100001"] {
        let e = fails(&["tickets", "next", "blocks", "-n", n, "--config", config]);
        assert!(
            e.contains(&format!("count must be in 1..=100000, not {n}")),
            "{e}"
        );
    }
    let e = fails(&["tickets", "next", "nope", "--config", config]);
    assert!(e.contains("unknown sequence \"nope\""), "{e}");
    // A 32-bit sequence where six ids fit below 2^32, in a file of its own
    // (a client writes marks ahead of every per-id sequence of its file,
    // and the next client starts past them): the six printed, then why
    // the seventh failed. Before: nothing printed.
    let small = dir.join("small.toml");
    std::fs::write(
        &small,
        format!(
            "[[servers]]\nname = \"t1\"\nkind = \"mariadb\"\nurl = {:?}\noffset = 1\n\n\
             [[sequences]]\nname = \"small\"\nbits = 32\nstart = 4294967290\n",
            server.url()
        ),
    )
    .unwrap();
    let small = small.to_str().unwrap();
    ok(&["tickets", "--config", small, "init"]);
    let out = shardflake(&["tickets", "next", "small", "-n", "10", "--config", small]);
    assert!(!out.status.success());
    assert_eq!(
        numbers(String::from_utf8(out.stdout).unwrap()),
        (4_294_967_290..=4_294_967_295).collect::<Vec<u64>>()
    );
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        e.contains("exhausted") && e.contains("after 6 of 10 ids, printed"),
        "{e}"
    );

    // bench --bare --rounds 2: the second round runs the bare loop first,
    // and the median of the two ratios is printed.
    let out = ok(&[
        "tickets",
        "bench",
        "photos",
        "--config",
        config,
        "--tasks",
        "2",
        "--seconds",
        "0.2",
        "--bare",
        "--rounds",
        "2",
    ]);
    assert!(
        out.contains("round 1/2: bare loop photos (ran second)")
            && out.contains("round 2/2: bare loop photos (ran first)")
            && out.contains("client/bare photos: median "),
        "{out}"
    );
}

/// Issue #30: `mysql --help` lists the subcommands the docs use, and
/// `mysql apply --help` shows the layout it really defaults to.
#[test]
fn mysql_help_lists_its_subcommands_and_the_real_default_layout() {
    let help = ok(&["mysql", "--help"]);
    for sub in ["apply", "check", "repair", "insert", "call", "sql"] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{sub} "))),
            "{sub} missing from:\n{help}"
        );
    }
    let first = help.lines().next().unwrap();
    assert!(
        first.contains("insert") && first.contains("repair"),
        "{first}"
    );
    let apply = ok(&["mysql", "apply", "--help"]);
    assert!(apply.contains("[default: mysql-procedure]"), "{apply}");
}

/// Issue #30: the file or server a whole command group works on is named
/// before or after the subcommand: `pg -t FILE route`, `mysql --url URL
/// apply`.
#[test]
fn group_options_go_before_or_after_the_subcommand() {
    let dir = std::env::temp_dir().join(format!("sf-cli-global-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("topo.toml");
    std::fs::write(
        &file,
        "layout = \"instagram\"\nshards = 4\n\n[[servers]]\nname = \"a\"\nurl = \"postgres://x@127.0.0.1:1/app\"\nshards = \"0-3\"\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let before = ok(&["pg", "-t", f, "route", "13"]);
    let after = ok(&["pg", "route", "13", "-t", f]);
    assert_eq!(before, after);
    assert!(before.contains("shard 1"), "{before}");
    let _ = std::fs::remove_dir_all(&dir);

    let server = MariaDbServer::start_with("", None).unwrap();
    let url = server.url();
    assert!(ok(&["mysql", "--url", &url, "apply"]).starts_with("installed generate_post_id"));
    assert!(ok(&["mysql", "--url", &url, "check"]).starts_with("ok: "));
    assert!(ok(&["mysql", "check", "--url", &url]).starts_with("ok: "));
}

/// Issue #30: an error is one line that names its cause once and the way
/// out: a missing topology file points to -t, a refused connection names
/// the URL, a procedure not installed names `apply --seed`.
#[test]
fn errors_name_their_cause_once_and_the_fix() {
    let dir = std::env::temp_dir().join(format!("sf-cli-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = Command::new(crate::shardflake_bin())
        .args(["pg", "check"])
        .current_dir(&dir)
        .env_remove("SHARDFLAKE_TOPOLOGY")
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("shardflake.toml") && e.contains("-t FILE"),
        "{e}"
    );
    assert!(e.matches("os error").count() <= 1, "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    let dead = format!(
        "mysql://root@127.0.0.1:{}/app",
        shardflake_testkit::free_port().unwrap()
    );
    let e = fails(&["mysql", "--url", &dead, "check"]);
    assert!(e.contains(&dead), "{e}");
    assert_eq!(e.matches("Connection refused").count(), 1, "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");

    let server = MariaDbServer::start().unwrap();
    let url = server.url();
    ok(&["mysql", "--url", &url, "apply"]);
    let e = fails(&["mysql", "--url", &url, "call", "1", "--flavor", "seed"]);
    assert!(e.contains("apply --seed"), "{e}");
    assert_eq!(e.matches("generate_post_id_seed").count(), 1, "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "{e}");
}

/// A deployment whose layout ends 6 months from now: `pg check` warns
/// (stderr, through the log) under the default year, and not when the
/// threshold is 90 days.
#[test]
fn pg_check_warns_of_a_layout_ending_within_a_year() {
    let a = PgServer::start().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let epoch = now + 182 * 86_400_000 - (1u64 << 35);
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-lifetime-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let topo = dir.join("shardflake.toml");
    std::fs::write(
        &topo,
        format!(
            "layout = \"time 35 | shard 13 | sequence 10 (epoch {epoch} ms)\"\nshards = 1\n[[servers]]\nname = \"a\"\nurl = \"{}\"\nshards = \"0\"\n",
            a.url()
        ),
    )
    .unwrap();
    let t = topo.to_str().unwrap();
    ok(&["pg", "apply", "-t", t]);
    let check = |threshold: Option<&str>| {
        let mut cmd = Command::new(crate::shardflake_bin());
        cmd.args(["pg", "check", "-t", t])
            .env_remove("SHARDFLAKE_TOPOLOGY");
        match threshold {
            Some(v) => cmd.env("SHARDFLAKE_LIFETIME_WARNING", v),
            None => cmd.env_remove("SHARDFLAKE_LIFETIME_WARNING"),
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = check(None);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("in 18") && l.contains("days")),
        "{stderr}"
    );
    assert!(!check(Some("90d")).contains("runs out"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file's URL changed to another database of the same server: `pg
/// apply` and `mysql apply` refuse it, naming `--new-deployment`, which
/// makes a separate deployment there.
#[test]
fn apply_names_new_deployment_for_another_database_of_the_server() {
    let pg = PgServer::start().unwrap();
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-newdep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, url: &str| {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "layout = \"instagram\"\nshards = 2\n[[servers]]\nname = \"a\"\nurl = \"{url}\"\nshards = \"0-1\"\n"
            ),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    };
    ok(&["pg", "apply", "-t", &file("first", &pg.url())]);
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(shardflake_db::pg::execute(
            "a",
            &pg.url(),
            "CREATE DATABASE other",
        ))
        .unwrap();
    let base = pg.url();
    let base = base.strip_suffix("/postgres").unwrap();
    let other = file("other", &format!("{base}/other"));
    let e = fails(&["pg", "apply", "-t", &other]);
    assert!(
        e.contains("of the same PostgreSQL cluster")
            && e.contains("shardflake pg apply --new-deployment"),
        "{e}"
    );
    ok(&["pg", "apply", "--new-deployment", "-t", &other]);
    let _ = std::fs::remove_dir_all(&dir);

    let maria = MariaDbServer::start().unwrap();
    ok(&["mysql", "apply", "--url", &maria.url()]);
    maria.sql("CREATE DATABASE app2").unwrap();
    let url2 = maria.url().replace("/app", "/app2");
    let e = fails(&["mysql", "apply", "--url", &url2]);
    assert!(
        e.contains("database app of this server makes ids of app.posts")
            && e.contains("--new-deployment"),
        "{e}"
    );
    ok(&["mysql", "apply", "--new-deployment", "--url", &url2]);
}

/// `pg_dump -Fc` of `from`'s `postgres` database restored into `to`'s.
fn dump_into(from: &PgServer, to: &PgServer, dir: &Path) {
    let dump = dir.join("a.dump");
    let out = Command::new(from.program("pg_dump").unwrap())
        .args(["-h", "127.0.0.1", "-p", &from.port.to_string()])
        .args(["-U", "postgres", "-Fc", "-f"])
        .arg(&dump)
        .arg("postgres")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let out = Command::new(to.program("pg_restore").unwrap())
        .args(["-h", "127.0.0.1", "-p", &to.port.to_string()])
        .args(["-U", "postgres", "--exit-on-error", "-d", "postgres"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// `pg repair --replaces a` through the binary: without saying where the
/// old copy is, refused naming `--old-url` and `--old-copy-gone`; with
/// `--old-url`, the old copy (still running) is fenced and says so, and
/// the old file is then reported by `pg check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_repair_replaces_fences_the_old_copy() {
    let (a, b, c) = (
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
        PgServer::start().unwrap(),
    );
    let dir = std::env::temp_dir().join(format!("sf-pg-cli-replaces-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let old_file = dir.join("old.toml");
    write_topology(&old_file, &a, &b, "0-1", "2-3");
    let old_file = old_file.to_string_lossy().into_owned();
    ok(&["pg", "apply", "-t", &old_file]);
    let insert = "INSERT INTO shard0.posts (user_id) VALUES (1) RETURNING id";
    psql(&a, insert).await;
    dump_into(&a, &c, &dir);
    let new_file = dir.join("new.toml");
    write_topology(&new_file, &c, &b, "0-1", "2-3");
    let new_file = new_file.to_string_lossy().into_owned();

    let e = fails(&["pg", "repair", "-t", &new_file]);
    assert!(e.contains("--replaces a --old-url"), "{e}");
    let e = fails(&["pg", "repair", "--replaces", "a", "-t", &new_file]);
    assert!(
        e.contains("give the url that reaches each old copy") && e.contains("--old-copy-gone"),
        "{e}"
    );
    // --old-copy-gone names what it declares gone: given nothing, the
    // refusal lists each database and what it is.
    let e = fails(&[
        "pg",
        "repair",
        "--replaces",
        "a",
        "--old-copy-gone",
        "-t",
        &new_file,
    ]);
    assert!(
        e.contains("the database a's new one was restored from") && e.contains("--old-copy-gone "),
        "{e}"
    );
    let out = ok(&[
        "pg",
        "repair",
        "--replaces",
        "a",
        "--old-url",
        &a.url(),
        "-t",
        &new_file,
    ]);
    assert!(
        out.contains("a: the copy it replaces (--old-url) is fenced for good"),
        "{out}"
    );
    let ca = shardflake_db::pg::connect_url("a", &a.url()).await.unwrap();
    let e = ca.query(insert, &[]).await.unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("SF001"), "{e}");
    psql(&c, insert).await;
    ok(&["pg", "check", "-t", &new_file]);
    let e = fails(&["pg", "check", "-t", &old_file]);
    assert!(e.contains("fenced for good"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Review A2: `mysql check --peer URL` (repeatable) reports a shard value
/// this server and a peer both record, and exits 1; without the overlap
/// it passes.
#[test]
fn mysql_check_with_peers_reports_values_two_servers_record() {
    let (a, b) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let (ua, ub) = (a.url(), b.url());
    ok(&["mysql", "apply", "--url", &ua, "--shards", "0-511"]);
    ok(&[
        "mysql", "apply", "--url", &ub, "--shards", "512-1023", "--peer", &ua,
    ]);
    assert!(ok(&["mysql", "check", "--url", &ub, "--peer", &ua]).starts_with("ok: "));
    // As an older release's race left them: both record 512-600.
    a.sql("UPDATE shardflake.serves SET hi = 600 WHERE tbl = 'posts'")
        .unwrap();
    let e = fails(&["mysql", "check", "--url", &ub, "--peer", &ua]);
    assert!(
        e.contains(&format!(
            "peer {ua} makes ids of app.posts for shard values 0-600, which meets 512-1023"
        )),
        "{e}"
    );
}
