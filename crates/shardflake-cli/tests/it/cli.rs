//! The `shardflake` binary end to end: several processes and restarts make
//! distinct ids; decode, plan and bench speak their documented formats; bad
//! input is a clear error on stderr with a non-zero exit, never a panic.

use std::collections::HashSet;
use std::process::{Command, Output};
use std::thread;

fn shardflake(args: &[&str]) -> Output {
    Command::new(crate::shardflake_bin())
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stdout(args: &[&str]) -> String {
    let out = shardflake(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn ids(text: &str) -> Vec<u64> {
    text.lines().map(|l| l.parse().unwrap()).collect()
}

#[test]
fn processes_and_restarts_never_repeat_an_id() {
    // Four nodes at once, each restarted three times in a row.
    let per_node: Vec<Vec<u64>> = thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|node| {
                s.spawn(move || {
                    let node = node.to_string();
                    (0..3)
                        .flat_map(|_| ids(&stdout(&["gen", "--node", &node, "-n", "50000"])))
                        .collect()
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut seen = HashSet::new();
    for ids in &per_node {
        assert_eq!(ids.len(), 150_000);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "a node's ids went down across restarts"
        );
        for id in ids {
            assert!(seen.insert(*id), "duplicate id {id}");
        }
    }
}

#[test]
fn back_to_back_runs_on_one_node_never_repeat() {
    // Each run ends inside a tick; the next must not reuse it.
    let mut all = Vec::new();
    for _ in 0..20 {
        all.extend(ids(&stdout(&["gen", "--node", "7", "-n", "3"])));
    }
    assert!(all.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn decode_json_has_the_documented_keys() {
    let out = stdout(&[
        "decode",
        "--layout",
        "instagram",
        "--json",
        "11637205501278089",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["id"], "11637205501278089");
    assert_eq!(v["layout"], "instagram");
    assert_eq!(v["fields"]["shard"], 1341);
    assert_eq!(v["sequence"], 905);
    assert_eq!(v["unix_ms"], 1_315_607_284_721u64);
    assert_eq!(v["timestamp"], "2011-09-09T22:28:04.721Z");
}

#[test]
fn generated_ids_decode_to_their_fields_in_every_format() {
    for format in ["dec", "hex", "base32", "base62"] {
        let id = stdout(&[
            "gen",
            "--layout",
            "twitter",
            "--datacenter",
            "2",
            "--worker",
            "30",
            "-f",
            format,
        ]);
        let out = stdout(&[
            "decode",
            "--layout",
            "twitter",
            "-f",
            format,
            "--json",
            id.trim(),
        ]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            (
                v["fields"]["datacenter"].as_u64(),
                v["fields"]["worker"].as_u64()
            ),
            (Some(2), Some(30))
        );
    }
    let id = stdout(&[
        "gen",
        "--layout",
        "instagram",
        "--key",
        "31341",
        "--shards",
        "2000",
    ]);
    let out = stdout(&["decode", "--layout", "instagram", "--json", id.trim()]);
    assert!(out.contains(r#""shard":1341"#), "{out}");
}

#[test]
fn other_kinds_are_made_and_recognised() {
    assert_eq!(
        stdout(&[
            "gen",
            "--kind",
            "uuidv5",
            "--namespace",
            "dns",
            "--name",
            "www.example.com"
        ])
        .trim(),
        "2ed6657d-e927-568b-95e1-2665a8aea6a2"
    );
    let v7 = stdout(&["gen", "--kind", "uuidv7", "-n", "1000"]);
    let lines: Vec<&str> = v7.lines().collect();
    assert_eq!(lines.iter().collect::<HashSet<_>>().len(), 1000);
    let oid = stdout(&["gen", "--kind", "objectid"]);
    let out = stdout(&["decode", "--json", lines[0], oid.trim()]);
    assert!(
        out.contains(r#""kind":"uuidv7""#) && out.contains(r#""kind":"objectid""#),
        "{out}"
    );
}

#[test]
fn bad_input_is_a_clear_error_never_a_panic() {
    let cases: &[(&[&str], &str)] = &[
        (&["gen", "--node", "1024"], "out of range"),
        (&["gen", "--shard", "1"], "no field \"shard\""),
        (&["gen", "--layout", "nope"], "unknown layout"),
        (
            &["gen", "--layout", "time 60 | node 10 | sequence 12"],
            "at most 64",
        ),
        (
            &[
                "gen",
                "--layout",
                "instagram",
                "--key",
                "5",
                "--shards",
                "0",
            ],
            "shard",
        ),
        (
            &[
                "gen",
                "--layout",
                "instagram",
                "--key",
                "5",
                "--shards",
                "9000",
            ],
            "shard",
        ),
        (&["gen", "--kind", "uuidv5"], "needs a name-space"),
        (&["gen", "--kind", "uuidv9"], "unknown kind"),
        (&["gen", "-n", "0"], "not in 1.."),
        (&["gen", "-n", "-3"], "unexpected argument"),
        (
            &["gen", "--layout", "time 62 | sequence 2 (tick 10 ms)"],
            "past u64 milliseconds",
        ),
        (
            &["plan", "--nodes", "3", "--rate", "1e308", "--years", "5"],
            "no 63-bit layout",
        ),
        (&["decode", "12x"], "unexpected character"),
        (
            &["decode", "99999999999999999999"],
            "does not fit in 64 bits",
        ),
        (
            &["decode", "--layout", "js-safe", "18446744073709551615"],
            "js-safe",
        ),
        (
            &["plan", "--nodes", "100", "--rate=-5", "--years", "10"],
            "positive",
        ),
        (
            &["plan", "--nodes", "100", "--rate", "0", "--years", "10"],
            "positive",
        ),
        (&["bench", "--batch", "0"], "--batch"),
        (
            &[
                "tickets", "bench", "photos", "--config", "t.toml", "--rounds", "0",
            ],
            "--rounds",
        ),
    ];
    for (args, needle) in cases {
        let out = shardflake(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn plan_reports_capacity_and_the_negative_date() {
    let out = stdout(&["plan", "--layout", "instagram"]);
    assert!(out.contains("2046-06-27"), "{out}");
    assert!(out.contains("1024"), "ids per tick: {out}");
    let js: serde_json::Value =
        serde_json::from_str(stdout(&["plan", "--layout", "js-safe", "--json"]).trim()).unwrap();
    assert!(js["js_unsafe_from"].is_null());
    let suggested = stdout(&[
        "plan",
        "--nodes",
        "1000",
        "--rate",
        "4000000",
        "--years",
        "69",
        "--epoch",
        "2010-11-04T01:42:54.657Z",
    ]);
    assert!(
        suggested.contains("time 41 | node 10 | sequence 12"),
        "{suggested}"
    );
}

#[test]
fn bench_json_reports_a_rate_against_the_cap() {
    let out = stdout(&["bench", "--threads", "2", "--seconds", "0.2", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(v["ids"].as_u64().unwrap() > 0);
    assert!(v["fraction_of_cap"].as_f64().unwrap() > 0.0);
    assert!(v["vs_baseline"].as_f64().unwrap() > 0.0);
    assert_eq!(v["cap_per_second"].as_f64(), Some(4_096_000.0));
}

fn decode_json(args: &[&str]) -> Vec<serde_json::Value> {
    let mut full = vec!["decode", "--json"];
    full.extend_from_slice(args);
    stdout(&full)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn decode_reads_every_format_gen_writes_without_being_told() {
    use shardflake::Format;
    for format in Format::ALL {
        let out = stdout(&["gen", "--node", "9", "-n", "5", "-f", format.name()]);
        let texts: Vec<&str> = out.lines().collect();
        let decoded = decode_json(&texts);
        assert_eq!(decoded.len(), 5, "{format}");
        for (text, v) in texts.iter().zip(&decoded) {
            let id = format.parse(text).unwrap();
            assert_eq!(v["id"], id.to_string(), "{format} {text}");
            assert_eq!(v["fields"]["node"], 9, "{format} {text}");
        }
        // Forcing the form gives the same answer.
        let mut forced = vec!["--format", format.name()];
        forced.extend(&texts);
        assert_eq!(decode_json(&forced), decoded, "{format}");
    }
    // A layout whose ids are 16 decimal digits (js-safe) still reads as decimal.
    let out = stdout(&["gen", "--layout", "js-safe", "--node", "1"]);
    let v = &decode_json(&["--layout", "js-safe", out.trim()])[0];
    assert_eq!(v["id"], out.trim());
}

#[test]
fn decode_reads_every_other_kind_gen_writes() {
    for kind in [
        "uuidv1", "uuidv4", "uuidv6", "uuidv7", "uuid-nil", "objectid",
    ] {
        let out = stdout(&["gen", "--kind", kind]);
        let v = &decode_json(&[out.trim()])[0];
        assert_eq!(v["id"], out.trim(), "{kind}");
        let expected = match kind {
            "uuid-nil" => "uuidv0",
            k => k,
        };
        assert_eq!(v["kind"], expected, "{kind}");
    }
    let out = stdout(&[
        "gen",
        "--kind",
        "uuidv5",
        "--namespace",
        "dns",
        "--name",
        "example.com",
    ]);
    assert_eq!(decode_json(&[out.trim()])[0]["kind"], "uuidv5");
}

#[test]
fn decode_format_forces_the_form_of_digit_only_text() {
    // 2^63 in hex is digits alone: read as decimal unless told.
    let as_dec = &decode_json(&["--layout", "instagram", "8000000000000000"])[0];
    assert_eq!(as_dec["id"], "8000000000000000");
    let as_hex = &decode_json(&["--layout", "instagram", "-f", "hex", "8000000000000000"])[0];
    assert_eq!(as_hex["id"], "9223372036854775808");
    // Forcing a form that does not fit the text is an error, not a guess.
    let out = shardflake(&["decode", "--format", "hex", "0XbfGYCuLKE"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid hex id"), "{err}");
}

#[test]
fn decode_of_malformed_ids_is_a_clear_error() {
    for text in ["", " ", "12x", "héllo", "0XbfGYCuLK!", "-", "+5", "1 2"] {
        let out = shardflake(&["decode", text]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text:?} succeeded");
        assert!(err.contains("error:"), "{text:?}: {err}");
        assert!(!err.contains("panicked"), "{text:?} panicked: {err}");
    }
    let out = shardflake(&["decode", "12x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"12x\" is not an id in any form"), "{err}");
    // One bad id among good ones: the good ones are decoded, the exit says so.
    let out = shardflake(&["decode", "454947766275222906", "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("454947766275222906"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 2 ids"));
}

#[test]
fn completions_name_every_subcommand() {
    for shell in ["bash", "zsh", "fish"] {
        let out = stdout(&["completions", shell]);
        for sub in [
            "gen",
            "decode",
            "plan",
            "bench",
            "serve",
            "pg",
            "mysql",
            "completions",
            "man",
        ] {
            assert!(out.contains(sub), "{shell} completions lack {sub}");
        }
        assert!(out.contains("shardflake"), "{shell}");
    }
    assert!(stdout(&["completions", "bash"]).contains("complete -F"));
    assert!(stdout(&["completions", "zsh"]).starts_with("#compdef shardflake"));
    assert!(stdout(&["completions", "fish"]).contains("complete -c shardflake"));
    let out = shardflake(&["completions", "tcsh"]);
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn man_page_is_roff() {
    let out = stdout(&["man"]);
    assert!(
        out.starts_with(".ie \\n(.g .ds Aq"),
        "{}",
        &out[..out.len().min(200)]
    );
    assert!(out.contains(".TH shardflake 1"), "{out}");
    assert!(out.contains(".SH NAME"));
    assert!(out.contains(".SH SYNOPSIS"));
    assert!(out.contains("decode"));
}

/// `shardflake mysql sql | head -5`: the reader goes away after a few lines;
/// the command must end quietly (SIGPIPE, as `cat` does), not panic with exit
/// 101 and a backtrace. Each command is read for one line, then its pipe is
/// closed while it still has much to print.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    for args in [
        &["mysql", "sql"][..],
        &["completions", "bash"][..],
        &["gen", "-n", "10000000"][..],
    ] {
        let mut child = Command::new(crate::shardflake_bin())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        assert!(!first.is_empty(), "{args:?} printed nothing");
        // The reader is dropped here: the pipe's read end is closed.
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(
            out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
            "{args:?} ended with {:?}: {stderr}",
            out.status
        );
    }
}

#[test]
fn range_brackets_the_ids_of_a_span_and_refuses_times_outside_the_layout() {
    // An id made now is in the range of the last minute, and decodes inside it.
    let id: u64 = stdout(&["gen", "-n", "1"]).trim().parse().unwrap();
    let out = stdout(&["range", "--from", "-1m", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let first: u64 = v["first"].as_str().unwrap().parse().unwrap();
    let last: u64 = v["last"].as_str().unwrap().parse().unwrap();
    assert!(first <= id && id <= last, "{id} outside {out}");
    assert_eq!(v["signed"].as_array().unwrap().len(), 1, "{out}");
    // Instagram's ids turn negative in 2046: a span across it is two
    // ranges of signed ids.
    let text = stdout(&[
        "range",
        "--layout",
        "instagram",
        "--from",
        "2046-01-01T00:00:00Z",
        "--to",
        "2047-01-01T00:00:00Z",
    ]);
    let sql = text.lines().find(|l| l.starts_with("sql")).unwrap();
    assert_eq!(sql.matches("BETWEEN").count(), 2, "{text}");
    assert!(sql.contains(" OR id BETWEEN -"), "{text}");
    for (args, message) in [
        (
            vec!["range", "--from", "1999-01-01T00:00:00Z"],
            "before layout snowflake's epoch",
        ),
        (
            vec!["range", "--from", "+1d", "--to", "now"],
            "from must be before to",
        ),
        (vec!["range", "--from", "last tuesday"], "is not a time"),
        (
            vec![
                "range",
                "--layout",
                "sonyflake",
                "--from",
                "now",
                "--to",
                "2400-01-01T00:00:00Z",
            ],
            "end of life",
        ),
    ] {
        let out = shardflake(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn plan_check_fails_a_deployment_whose_layout_ends_within_the_threshold() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // 35 bits of 1 ms ticks (about 398 days) that end 6 months from now.
    let epoch = now + 182 * 86_400_000 - (1u64 << 35);
    let dir = std::env::temp_dir().join(format!("shardflake-plan-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shardflake.toml");
    std::fs::write(
        &file,
        format!("node_id = 3\nlayout = \"time 35 | node 10 | sequence 12 (epoch {epoch} ms)\"\n"),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let out = shardflake(&["plan", "--check", file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("days left (under 365 days)"), "{stderr}");
    assert!(
        stderr.contains("shardflake plan --from OLD --to NEW"),
        "{stderr}"
    );
    let text = stdout(&["plan", "--check", file, "--lifetime-warning", "90d"]);
    assert!(text.contains("ok: more than 90 days left"), "{text}");
    // A preset's deployment has decades left.
    let pg = dir.join("pg.toml");
    std::fs::write(&pg, "layout = \"instagram\"\n").unwrap();
    assert!(
        stdout(&["plan", "--check", pg.to_str().unwrap()]).contains("ok: more than 365 days left")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
