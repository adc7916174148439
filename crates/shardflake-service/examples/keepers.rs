//! How long N lease keepers started together in one process (each with its
//! own etcd client and state file, as N nodes would have) take until every
//! one holds a node id, on a real 3-member etcd; checks the ids are
//! distinct.
//!
//! `cargo run --release -p shardflake-service --example
//! keepers -- [N] [ROUNDS]` (defaults 1024, 3). The layout is Snowflake's
//! (10-bit node field: 1,024 ids), so N = 1024 fills the cluster exactly.
//! Logs go to stderr under `RUST_LOG`: with
//! `RUST_LOG=shardflake_service::registry=debug`, one `took a node id` line
//! per keeper with the races its take lost.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use shardflake_service::Config;
use shardflake_service::issuer::Issuer;
use shardflake_service::lease::Keeper;
use shardflake_service::registry;
use shardflake_testkit::Etcd;

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().context("usage: keepers [N] [ROUNDS]"))
        .collect::<anyhow::Result<_>>()?;
    let n = *args.first().unwrap_or(&1024);
    let rounds = *args.get(1).unwrap_or(&3);
    let etcd = tokio::task::block_in_place(|| Etcd::start(3))?;
    let dir = tempfile::tempdir()?;
    println!("keepers  round  all_held_ms");
    for round in 1..=rounds {
        let prefix = format!("/bench/keepers/{round}");
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut starts = Vec::with_capacity(n);
        // Configuration and clients first, so the clock measures acquisition.
        for i in 0..n {
            let toml = format!(
                "state_file = {:?}\nwindow = \"6s\"\n[etcd]\nendpoints = {:?}\nprefix = {prefix:?}\nlease_ttl = \"10s\"\ntimeout = \"2s\"\n",
                dir.path().join(format!("{round}.{i}.state")),
                etcd.endpoints,
            );
            let config = Config::from_toml(&toml)?;
            let registry = registry::for_node_source(&config.node)?;
            starts.push((Arc::new(Issuer::new(config)), registry));
        }
        let started = Instant::now();
        let tasks: Vec<_> = starts
            .into_iter()
            .enumerate()
            .map(|(i, (issuer, registry))| {
                let stop_rx = stop_rx.clone();
                tokio::spawn(async move {
                    let keeper = Keeper::start(issuer.clone(), registry, format!("k{i}"), stop_rx)
                        .await?
                        .context("shut down")?;
                    let node = issuer.active().map(|a| a.node_id).context("no identity")?;
                    anyhow::Ok((keeper, node))
                })
            })
            .collect();
        let mut keepers = Vec::with_capacity(n);
        for t in tasks {
            keepers.push(t.await??);
        }
        let took = started.elapsed();
        let distinct: HashSet<u64> = keepers.iter().map(|(_, node)| *node).collect();
        if distinct.len() != n {
            bail!("{} distinct node ids among {n} keepers", distinct.len());
        }
        println!("{n:7}  {round:5}  {:11}", took.as_millis());
        for (mut keeper, _) in keepers {
            keeper.stop().await;
        }
    }
    Ok(())
}
