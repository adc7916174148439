//! `tickets check` warns of a ticket counter that reaches its column's end
//! within the lifetime warning at the rate it moved while check watched it
//! (issue 40, item 4): a counter is not a clock, so its lifetime is its ids
//! left over its rate.

use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shardflake_testkit::MariaDbServer;

const WARNING: &str = "reaches its column's end";

fn shardflake(args: &[&str], warning: Option<&str>) -> Output {
    let mut cmd = Command::new(crate::shardflake_bin());
    cmd.args(args)
        .env_remove("SHARDFLAKE_CONFIG")
        .env_remove("SHARDFLAKE_ETCD")
        .env_remove("SHARDFLAKE_ETCD_PREFIX")
        .env_remove("SHARDFLAKE_LIFETIME_WARNING");
    if let Some(w) = warning {
        cmd.env("SHARDFLAKE_LIFETIME_WARNING", w);
    }
    cmd.output().unwrap()
}

fn ok(args: &[&str], warning: Option<&str>) -> (String, String) {
    let out = shardflake(args, warning);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "shardflake {args:?}: {stdout}{stderr}"
    );
    (stdout, stderr)
}

/// A 32-bit sequence 100,000,000 ids from its end: at the hundreds of ids a
/// second `tickets next` makes here, that is a day or two.
#[test]
fn check_warns_of_a_counter_ending_within_the_warning_at_its_rate() {
    let server = MariaDbServer::start_with("", None).unwrap();
    let dir = shardflake_testkit::tempdir().unwrap();
    let file = dir.join("tickets.toml");
    let start = u64::from(u32::MAX) - 100_000_000;
    std::fs::write(
        &file,
        format!(
            "[[servers]]\nname = \"t1\"\nkind = \"mariadb\"\nurl = {:?}\noffset = 1\n\n\
             [[sequences]]\nname = \"photos\"\nbits = 32\nstart = {start}\n",
            server.url()
        ),
    )
    .unwrap();
    let config = file.to_str().unwrap();
    ok(&["tickets", "--config", config, "init"], None);
    // Its stdout and stderr (the warning is logged: stderr). Its exit
    // status is not asserted while ids are made: a check can read the
    // counter before a client's mark written ahead of it, and report it
    // behind the mark.
    let check = |warning: Option<&str>| {
        let out = shardflake(
            &[
                "tickets",
                "--config",
                config,
                "check",
                "--rate-window",
                "3s",
            ],
            warning,
        );
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };

    // No ids made: the counter does not move, nothing to warn of.
    let idle = check(None);
    assert!(idle.contains("\nok\n"), "{idle}");
    assert!(!idle.contains(WARNING), "{idle}");

    // Ids made all the while check watches: two clients in turn, so that
    // one draws while the other's process starts. A client that gives up
    // (a server slow to answer on a loaded machine) is simply started again:
    // only the counter's moving matters here.
    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(AtomicU64::new(0));
    let traffic: Vec<_> = (0..2)
        .map(|_| {
            let (stop, batches, config) = (stop.clone(), batches.clone(), config.to_string());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let args = [
                        "tickets", "--config", &config, "next", "photos", "-n", "1000",
                    ];
                    if shardflake(&args, None).status.success() {
                        batches.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let began = Instant::now();
    while batches.load(Ordering::Relaxed) < 2 {
        assert!(began.elapsed() < Duration::from_secs(60), "no ids made");
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = check(None);
    let quiet_threshold = check(Some("1h"));
    stop.store(true, Ordering::Relaxed);
    for t in traffic {
        t.join().unwrap();
    }

    let made = batches.load(Ordering::Relaxed);
    assert!(
        busy.contains(WARNING),
        "{made} batches of 1,000 ids: {busy}"
    );
    assert!(busy.contains("sequence photos: counter"), "{busy}");
    assert!(
        busy.contains("bits = 64 and start = 4294967296"),
        "the way out: {busy}"
    );
    // The same rate against a warning of one hour: more than that is left.
    assert!(!quiet_threshold.contains(WARNING), "{quiet_threshold}");
    for text in [&busy, &quiet_threshold] {
        assert!(!text.contains("panicked"), "{text}");
    }
}
