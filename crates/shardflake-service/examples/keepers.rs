//! How long N lease keepers started together in one process (each with its
//! own etcd client and state file, as N nodes would have) take until every
//! one holds a node id, on a real 3-member etcd; checks the ids are
//! distinct.
//!
//! `cargo run --release -p shardflake-service --example
//! keepers -- [N] [ROUNDS] [--auth]` (defaults 1024, 3). The layout is
//! Snowflake's (10-bit node field: 1,024 ids), so N = 1024 fills the
//! cluster exactly.
//!
//! With `--auth`, etcd runs with user/password authentication and JWT
//! tokens, and every keeper logs in (etcd checks each password with
//! bcrypt, tens of ms of a member's CPU). Each round then also changes the
//! auth store once all hold (`etcdctl role add`), which makes etcd refuse
//! every JWT it gave: all keepers log in again at once while keeping their
//! leases. It prints the logins etcd answered (`Authenticate` calls) for
//! the start and for the change, and over the next lease TTL the renewals
//! that failed and the keepers that lost their node id.
//! Logs go to stderr under `RUST_LOG`: with
//! `RUST_LOG=shardflake_service::registry=debug`, one `took a node id` line
//! per keeper with the races its take lost.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

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
    let mut auth = false;
    let mut args = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--auth" => auth = true,
            a => args.push(
                a.parse::<usize>()
                    .context("usage: keepers [N] [ROUNDS] [--auth]")?,
            ),
        }
    }
    let n = *args.first().unwrap_or(&1024);
    let rounds = *args.get(1).unwrap_or(&3);
    let mut etcd = tokio::task::block_in_place(|| {
        if auth {
            Etcd::start_jwt(3)
        } else {
            Etcd::start(3)
        }
    })?;
    let login = if auth {
        tokio::task::block_in_place(|| etcd.enable_auth("root-pw"))?;
        "user = \"root\"\npassword = \"root-pw\"\n"
    } else {
        ""
    };
    let dir = tempfile::tempdir()?;
    if auth {
        println!(
            "keepers  round  all_held_ms  start_logins  change_logins  renewal_failures  lost_ids"
        );
    } else {
        println!("keepers  round  all_held_ms");
    }
    for round in 1..=rounds {
        let prefix = format!("/bench/keepers/{round}");
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut starts = Vec::with_capacity(n);
        // Configuration and clients first, so the clock measures acquisition.
        for i in 0..n {
            let toml = format!(
                "state_file = {:?}\nwindow = \"6s\"\n[etcd]\nendpoints = {:?}\nprefix = {prefix:?}\nlease_ttl = \"10s\"\ntimeout = \"2s\"\n{login}",
                dir.path().join(format!("{round}.{i}.state")),
                etcd.endpoints,
            );
            let config = Config::from_toml(&toml)?;
            let registry = registry::for_node_source(&config.node)?;
            starts.push((Arc::new(Issuer::new(config)), registry));
        }
        let logins_before = if auth {
            etcd.handled("Authenticate").await?
        } else {
            0
        };
        // Each keeper runs on as a node's does (renewing, recording) once it
        // holds an id, until drained.
        let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
        let started = Instant::now();
        let mut running = Vec::with_capacity(n);
        let mut holds = Vec::with_capacity(n);
        for (i, (issuer, registry)) in starts.into_iter().enumerate() {
            let (stop_rx, drain_rx) = (stop_rx.clone(), drain_rx.clone());
            let (held_tx, held_rx) = tokio::sync::oneshot::channel();
            holds.push(held_rx);
            running.push(tokio::spawn(async move {
                let mut keeper =
                    Keeper::start(issuer.clone(), registry, format!("k{i}"), stop_rx.clone())
                        .await?
                        .context("shut down")?;
                let node = issuer.active().map(|a| a.node_id).context("no identity")?;
                let _ = held_tx.send((issuer, node));
                let _ = keeper.run(stop_rx, drain_rx).await;
                keeper.stop().await;
                anyhow::Ok(())
            }));
        }
        let mut held = Vec::with_capacity(n);
        for (hold, task) in holds.into_iter().zip(&mut running) {
            match hold.await {
                Ok(h) => held.push(h),
                // The keeper's task ended without an id: its error.
                Err(_) => task.await??,
            }
        }
        let took = started.elapsed();
        let distinct: HashSet<u64> = held.iter().map(|(_, node)| *node).collect();
        if distinct.len() != n {
            bail!("{} distinct node ids among {n} keepers", distinct.len());
        }
        if auth {
            let start_logins = etcd.handled("Authenticate").await? - logins_before;
            let (change_logins, failures, lost) = auth_change(&etcd, round, &held).await?;
            println!(
                "{n:7}  {round:5}  {:11}  {start_logins:12}  {change_logins:13}  {failures:16}  {lost:8}",
                took.as_millis()
            );
        } else {
            println!("{n:7}  {round:5}  {:11}", took.as_millis());
        }
        drain_tx.send(true)?;
        for task in running {
            task.await??;
        }
    }
    Ok(())
}

/// Changes the auth store (every token etcd gave out is then refused),
/// keeps the keepers renewing for a lease TTL and counts what it cost:
/// logins, failed renewals, keepers no longer holding the id they held.
async fn auth_change(
    etcd: &Etcd,
    round: usize,
    keepers: &[(Arc<Issuer>, u64)],
) -> anyhow::Result<(u64, u64, usize)> {
    let failures = |ks: &[(Arc<Issuer>, u64)]| -> u64 {
        ks.iter()
            .map(|(issuer, _)| issuer.metrics.renewal_failures.load(Ordering::Relaxed))
            .sum()
    };
    let (failures_before, logins_before) = (failures(keepers), etcd.handled("Authenticate").await?);
    tokio::task::block_in_place(|| etcd.etcdctl(&["role", "add", &format!("change-{round}")]))?;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let lost = keepers
        .iter()
        .filter(|(issuer, node)| issuer.active().map(|a| a.node_id) != Some(*node))
        .count();
    Ok((
        etcd.handled("Authenticate").await? - logins_before,
        failures(keepers) - failures_before,
        lost,
    ))
}
