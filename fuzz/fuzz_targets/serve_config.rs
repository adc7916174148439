//! The `serve` configuration: a TOML file (`RawConfig::from_toml`), the
//! `SHARDFLAKE_*` environment read through the CLI's own clap flags (the
//! real `serve.rs`, compiled in), merged as `serve` merges them, then the
//! pure `Config::validate` with fuzzed host facts. Never a panic; a
//! configuration that validates holds a node id its field can carry, and
//! an issuer built from it makes its identity or gives a typed error.
//!
//! Input: the TOML, then after a NUL byte, NUL-separated environment
//! entries: one byte choosing the variable (modulo the flags' variables;
//! one more value is the host name), then the value.
#![no_main]

use std::sync::OnceLock;

use clap::{CommandFactory, Parser};
use libfuzzer_sys::fuzz_target;
use shardflake_host::HostInfo;
use shardflake_service::Config;
use shardflake_service::config::{NodeSource, RawConfig};
use shardflake_service::issuer::Issuer;

#[allow(dead_code, clippy::all)]
#[path = "../../crates/shardflake-cli/src/cmd/serve.rs"]
mod serve;

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    serve: serve::ServeArgs,
}

/// The environment variables the `serve` flags read.
fn variables() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        Cli::command()
            .get_arguments()
            .filter_map(|a| a.get_env())
            .filter_map(|e| e.to_str().map(str::to_string))
            .filter(|e| e != "SHARDFLAKE_CONFIG")
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let (toml, env) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(toml) = std::str::from_utf8(toml) else {
        return;
    };
    let names = variables();
    let mut host = HostInfo {
        hostname: "shardflake-7".into(),
        macs: vec![[2, 0, 0, 0, 0, 7]],
        ip: Some([10, 0, 0, 7].into()),
    };
    let mut set = Vec::new();
    for entry in env.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let Ok(value) = std::str::from_utf8(&entry[1..]) else {
            continue;
        };
        let which = usize::from(entry[0]) % (names.len() + 1);
        match names.get(which) {
            Some(name) => set.push((name.as_str(), value)),
            None => host.hostname = value.to_string(),
        }
    }
    // SAFETY: the fuzzer runs one input at a time on one thread, and
    // nothing else in this process reads the environment meanwhile.
    for (name, value) in &set {
        unsafe { std::env::set_var(name, value) };
    }
    let flags = Cli::try_parse_from(["serve"]);
    for (name, _) in &set {
        unsafe { std::env::remove_var(name) };
    }
    let Ok(flags) = flags else {
        return;
    };
    let Ok(file) = RawConfig::from_toml(toml) else {
        return;
    };
    let Ok(config) = Config::validate(file.merge(flags.serve.into()), &host) else {
        return;
    };
    if let NodeSource::Static(id) = config.node {
        assert!(
            id <= config.max_node_id(),
            "{id} > {}",
            config.max_node_id()
        );
        let issuer = Issuer::new(config);
        let _ = issuer.make_active(id, 0, None, u64::MAX);
    }
});
