//! Options a new user met in one form or place only (issue 30): `gen
//! --node-from` takes the host sources `serve --node-id-from` takes, and
//! `serve --config FILE` goes anywhere among serve's options.

use std::process::{Command, Output};

fn shardflake(args: &[&str], hostname: &str) -> Output {
    Command::new(crate::shardflake_bin())
        .args(args)
        .env("HOSTNAME", hostname)
        .output()
        .expect("the binary runs")
}

/// The node field of the id `gen --node-from FROM` makes, or its error.
fn node_from(from: &str, hostname: &str) -> Result<u64, String> {
    let out = shardflake(&["gen", "--node-from", from], hostname);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let id = String::from_utf8(out.stdout).unwrap();
    let out = shardflake(&["decode", "--json", id.trim()], hostname);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(v["fields"]["node"].as_u64().unwrap())
}

#[test]
fn gen_node_from_takes_the_sources_serve_takes() {
    // Refused before: "unknown node source \"hostname\"; use host-ordinal, mac-hash or ip".
    for from in ["hostname", "host-ordinal", "ordinal"] {
        assert_eq!(node_from(from, "ids-7"), Ok(7), "{from}");
    }
    // The MAC and IP a host has are its own: each name reads the same
    // source as its long form, whatever it finds (or fails to find).
    assert_eq!(node_from("mac", "ids-7"), node_from("mac-hash", "ids-7"));
    let ip = node_from("ip", "ids-7");
    assert!(
        ip.as_ref()
            .map_or_else(|e| !e.contains("unknown node source"), |_| true),
        "{ip:?}"
    );
    let err = node_from("disk", "ids-7").unwrap_err();
    assert!(
        err.contains("unknown node source \"disk\"; use hostname, mac or ip"),
        "{err}"
    );
}

#[test]
fn serve_takes_config_before_or_after_its_other_options() {
    let file = std::env::temp_dir().join(format!("shardflake-config-{}.toml", std::process::id()));
    // A file validation refuses: the error proves it was read, and serve
    // stops before binding anything.
    std::fs::write(&file, "max_batch = 0\n").unwrap();
    let path = file.to_str().unwrap();
    for args in [
        ["serve", "--config", path, "--node-id", "1"],
        ["serve", "--node-id", "1", "--config", path],
    ] {
        let out = shardflake(&args, "ids-7");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr.contains("max_batch 0"), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_file(&file);
}

/// Review R5: a mistyped `--fleet` got only "is not a fleet id (32 hex
/// digits …)". The refusal names the mistake and where to copy the id
/// from, before anything is sent (no etcd listens on this endpoint).
#[test]
fn a_mistyped_fleet_id_is_told_what_is_wrong() {
    let serve = |fleet: &str| {
        let out = shardflake(
            &[
                "serve",
                "--etcd",
                "http://127.0.0.1:1",
                "--etcd-prefix",
                "/p",
                "--fleet",
                fleet,
            ],
            "ids-7",
        );
        assert!(!out.status.success(), "{fleet}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let cut = serve("9f1c2e4b7a6d5c3e8f9a0b1c2d3e4f5");
    assert!(
        cut.contains("--fleet \"9f1c2e4b7a6d5c3e8f9a0b1c2d3e4f5\" is not a fleet id: it has 31 hex digits, not 32")
            && cut.contains("etcdctl get <prefix>/fleet --print-value-only"),
        "{cut}"
    );
    let prefix = serve("/shardflake/prod");
    assert!(
        prefix.contains("it looks like an etcd prefix, which is --etcd-prefix"),
        "{prefix}"
    );
}
