//! `shardflake mysql ...` flags end to end: what the flags take and
//! refuse, against real MariaDB servers the tests start (and stop on
//! drop).

use std::process::{Command, Output};

use shardflake_testkit::MariaDbServer;

fn shardflake(args: &[&str]) -> Output {
    Command::new(crate::shardflake_bin())
        .args(args)
        .env_remove("SHARDFLAKE_MYSQL_URL")
        .env_remove("SHARDFLAKE_LAYOUT")
        .output()
        .unwrap()
}

/// stdout + stderr of a run.
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

/// A refusal: exit 1, no panic; stdout + stderr.
fn fails(args: &[&str]) -> String {
    let out = shardflake(args);
    let text = text(&out);
    assert_eq!(out.status.code(), Some(1), "shardflake {args:?}: {text}");
    assert!(!text.contains("panicked"), "{text}");
    text
}

/// Review E11: `mysql adopt --shards 0-300` on a second server had no
/// `--peer` and so no overlap check with the first, which made ids for
/// every value (411 of 8,000 ids twice). adopt now takes `--peer` as
/// apply does: the same deployment lock across the servers and the same
/// overlap refusal, before anything changes, in a dry run too.
#[test]
fn adopt_with_a_peer_refuses_the_peers_values() {
    let (a, b) = (
        MariaDbServer::start_with("", None).unwrap(),
        MariaDbServer::start_with("", None).unwrap(),
    );
    let (ua, ub) = (a.url(), b.url());
    ok(&["mysql", "apply", "--url", &ua]);
    b.sql(
        "CREATE TABLE posts (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, body TEXT); \
         INSERT INTO posts (user_id, body) SELECT seq, 'old' FROM seq_1_to_100",
    )
    .unwrap();
    for dry_run in [true, false] {
        let mut args = vec!["mysql", "adopt", "--url", &ub, "--shards", "0-300"];
        args.extend(["--peer", &ua]);
        if dry_run {
            args.push("--dry-run");
        }
        let e = fails(&args);
        assert!(
            e.contains("nothing was changed")
                && e.contains(&format!(
                    "peer {ua} makes ids of app.posts for shard values 0-1023, which meets 0-300"
                )),
            "{e}"
        );
    }
    assert_eq!(
        b.sql("SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = 'app'")
            .unwrap(),
        "0",
        "a refused adopt changed nothing"
    );
    // Values of its own: a lets 0-300 go, b adopts them naming a.
    ok(&["mysql", "apply", "--url", &ua, "--shards", "301-1023"]);
    ok(&[
        "mysql", "adopt", "--url", &ub, "--shards", "0-300", "--peer", &ua,
    ]);
    assert!(ok(&["mysql", "check", "--url", &ub, "--peer", &ua]).starts_with("ok: "));
    assert!(ok(&["mysql", "insert", "--url", &ub, "5"]).contains("shard 5"));
    let e = fails(&["mysql", "insert", "--url", &ub, "600"]);
    assert!(e.contains("shard value 600"), "{e}");
}

/// Review: `--shards "0 - 10"` was taken as 0-10 (each side trimmed).
/// Every `--shards` (apply, adopt, repair) goes through one parser that
/// takes `LO-HI` or one value, digits only, and refuses anything else
/// before connecting.
#[test]
fn shards_with_spaces_or_garbage_are_refused_by_every_command() {
    // Nothing listens there: a refusal of the flag comes first.
    let url = "mysql://root@127.0.0.1:1/app";
    for command in ["apply", "adopt", "repair"] {
        for bad in ["0 - 10", " 0-10", "0-10x", "10-0", "0-", "1,2"] {
            let out = shardflake(&["mysql", command, "--url", url, "--shards", bad]);
            let text = text(&out);
            assert!(!out.status.success(), "{command} --shards {bad:?}: {text}");
            assert!(
                text.contains("expected LO-HI or one value")
                    && text.contains("digits only, no spaces"),
                "{command} --shards {bad:?}: {text}"
            );
        }
    }
}

/// Review 18 through the binary, as the operator ran it: `apply --shards
/// 1023` in a second database that already records values of its own
/// took the first database's value, with or without `--peer` naming it,
/// and `check` printed ok. Both applies are refused now, a `--peer` that
/// is the database itself too, and `check` reports a meeting record.
#[test]
fn a_second_database_of_the_server_never_takes_the_firsts_values() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let app = server.url();
    let shop = app.replace("/app", "/shop");
    ok(&["mysql", "apply", "--url", &app, "--shards", "1023"]);
    server.sql("CREATE DATABASE shop").unwrap();
    ok(&["mysql", "apply", "--url", &shop, "--shards", "500-600"]);
    for peer in [None, Some(&app)] {
        let mut args = vec!["mysql", "apply", "--url", &shop, "--shards", "1023"];
        if let Some(p) = peer {
            args.extend(["--peer", p.as_str()]);
        }
        let e = fails(&args);
        assert!(
            e.contains("nothing was changed")
                && e.contains(
                    "database app of this server makes ids of app.posts for shard values 1023-1023"
                ),
            "{e}"
        );
    }
    let e = fails(&[
        "mysql", "apply", "--url", &shop, "--shards", "500-600", "--peer", &shop,
    ]);
    assert!(e.contains("is this database itself (shop)"), "{e}");
    server
        .sql("UPDATE shardflake.serves SET lo = 1023, hi = 1023 WHERE db = 'shop'")
        .unwrap();
    for url in [&shop, &app] {
        let out = shardflake(&["mysql", "check", "--url", url]);
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(t.contains("of this server makes ids of"), "{t}");
    }
}
