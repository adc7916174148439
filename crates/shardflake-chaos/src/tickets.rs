//! `shardflake-chaos tickets`: Flickr's ticket servers and Leaf-style
//! segments, judged by the same checker. Two MariaDB servers from
//! `scripts/mariadb.sh` (odd and even: `auto-increment-increment = 2`,
//! offsets 1 and 2), the schema made by `shardflake tickets init`, clients
//! (each its own `TicketClient`, as separate processes would be) asking for
//! single ids and batches while a seeded schedule SIGKILLs one server at a
//! time and restarts it after a pause.
//!
//! What each mode promises, and so what is checked: no id twice, ever
//! (duplicates, exact); in segment mode one client's ids increase; in
//! per-id mode the ids one client got from one server increase (a
//! server's ids are the residue class of its offset, so the checker keeps
//! one log per client and server). Errors by code are counted: with one
//! server down the other carries the load, so callers should see none.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use shardflake_tickets::{Config, TicketClient};

use crate::check;
use crate::db::{Server, sleep_until};
use crate::load::Answers;
use crate::record::{ConnLog, Protocol, ms_since};
use crate::verdict::{ClientLog, Outcome, ServerRun, in_dir};

/// The sequence the run draws from.
const SEQUENCE: &str = "chaos";

/// What a `tickets` run does.
#[derive(Debug, Clone)]
pub struct TicketsOptions {
    /// Length, seed, clients, binaries, spacing, output.
    pub run: ServerRun,
    /// Segment mode (Leaf) instead of per-id (Flickr).
    pub segment: bool,
}

/// The seeded schedule: (seconds after the load began, server killed,
/// how long it stays down).
fn schedule(o: &TicketsOptions) -> Vec<(Duration, usize, Duration)> {
    let mut rng = fastrand::Rng::with_seed(o.run.seed);
    let spacing = o.run.spacing.max(Duration::from_secs(2));
    let mut at = spacing / 2;
    let mut plan = Vec::new();
    // Faults stop a spacing before the end, so both servers are seen back.
    while at + spacing <= Duration::from_secs(o.run.seconds) {
        let down = Duration::from_millis(rng.u64(200..=spacing.as_millis() as u64 / 2));
        plan.push((at, rng.usize(0..2), down));
        at += spacing + Duration::from_millis(rng.u64(0..=spacing.as_millis() as u64 / 2));
    }
    plan
}

/// The configuration: the pair, one 64-bit sequence in the run's mode.
fn config_toml(servers: &[Server], segment: bool) -> String {
    let mut t = String::from("increment = 2\n");
    for (i, s) in servers.iter().enumerate() {
        t += &format!(
            "\n[[servers]]\nname = \"t{}\"\nkind = \"mariadb\"\nurl = \"{}\"\noffset = {}\n",
            i + 1,
            s.url,
            i + 1
        );
    }
    let mode = if segment { "segment" } else { "per-id" };
    t += &format!("\n[[sequences]]\nname = \"{SEQUENCE}\"\nbits = 64\nmode = \"{mode}\"\n");
    t
}

struct Shared {
    start: Instant,
    stop: AtomicBool,
    answers: Mutex<Answers>,
}

/// One client: single ids and batches of 2..=500 in a seeded mix, logged
/// per server in per-id mode (the residue of the id) and as one log in
/// segment mode.
async fn client(config: Config, shared: Arc<Shared>, seed: u64, segment: bool) -> ClientLog {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut out = ClientLog::default();
    let client = match TicketClient::connect(config).await {
        Ok(c) => c,
        Err(e) => {
            *out.errors
                .entry(format!("connect:{}", e.code()))
                .or_default() += 1;
            return out;
        }
    };
    // Ticket numbers: every bit may differ within a run of consecutive ids.
    let mut logs: Vec<ConnLog> = (0..if segment { 1 } else { 2 })
        .map(|_| ConnLog::new(0, 0, Protocol::Tickets, u64::MAX))
        .collect();
    while !shared.stop.load(Ordering::Relaxed) {
        let count = if rng.f64() < 0.5 {
            1
        } else {
            rng.usize(2..=500)
        };
        match client.next_n(SEQUENCE, count).await {
            Ok(ids) => {
                let at = ms_since(shared.start);
                if segment {
                    logs[0].record(&ids, at);
                } else {
                    for id in ids {
                        // Offsets 1 and 2 of increment 2: odd ids are t1's.
                        logs[usize::from(id % 2 == 0)].record(&[id], at);
                    }
                }
                shared
                    .answers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .answered(u64::from(at));
            }
            Err(e) => {
                tracing::warn!(error = %e, "a ticket call failed");
                out.error(e.code().to_string());
            }
        }
    }
    client.shutdown().await;
    out.logs = logs;
    out
}

/// One run; `Ok(true)` when every check passed.
pub fn run(o: &TicketsOptions) -> anyhow::Result<bool> {
    in_dir(o.run.out.as_deref(), "tickets", |dir| run_in(o, dir))
}

fn run_in(o: &TicketsOptions, dir: &Path) -> anyhow::Result<bool> {
    let plan = schedule(o);
    println!("seed {}; schedule:", o.run.seed);
    for (at, server, down) in &plan {
        println!(
            "  +{:.1} s SIGKILL t{} for {:.1} s",
            at.as_secs_f64(),
            server + 1,
            down.as_secs_f64()
        );
    }
    let servers = (1..=2)
        .map(|offset| {
            Server::start(
                &o.run.script,
                &format!("--auto-increment-increment=2 --auto-increment-offset={offset}"),
                None,
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let toml = config_toml(&servers, o.segment);
    let path = dir.join("tickets.toml");
    std::fs::write(&path, &toml)?;
    let init = Command::new(&o.run.bin)
        .args(["tickets", "init", "--config"])
        .arg(&path)
        .output()
        .context("running shardflake tickets init")?;
    if !init.status.success() {
        bail!(
            "shardflake tickets init: {}",
            String::from_utf8_lossy(&init.stderr).trim()
        );
    }
    let config = Config::parse(&toml)?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let load_start_unix_ms = check::unix_ms_now();
    let shared = Arc::new(Shared {
        start: Instant::now(),
        stop: AtomicBool::new(false),
        answers: Mutex::new(Answers::default()),
    });
    let clients: Vec<_> = (0..o.run.clients)
        .map(|i| {
            rt.spawn(client(
                config.clone(),
                shared.clone(),
                o.run.seed.wrapping_add(i as u64 + 1),
                o.segment,
            ))
        })
        .collect();

    let mut incidents = Vec::new();
    for (at, server, down) in &plan {
        sleep_until(shared.start + *at);
        let s = &servers[*server];
        let result = s.kill().and_then(|()| {
            std::thread::sleep(*down);
            s.restart()
        });
        let when = ms_since(shared.start);
        match result {
            Ok(()) => println!("+{:.1} s t{} back", f64::from(when) / 1000.0, server + 1),
            Err(e) => incidents.push(format!("SIGKILL t{} at +{when} ms: {e:#}", server + 1)),
        }
    }
    let faults_over_ms = u64::from(ms_since(shared.start));
    sleep_until(shared.start + Duration::from_secs(o.run.seconds));
    shared.stop.store(true, Ordering::SeqCst);
    let end_ms = u64::from(ms_since(shared.start));
    let mut all = ClientLog::default();
    for c in clients {
        all.merge(rt.block_on(c)?);
    }
    drop(servers);
    Outcome {
        name: format!(
            "tickets ({}, 2 servers)",
            if o.segment { "segment" } else { "per-id" }
        ),
        processes: 2 + plan.len() as u32,
        clients: all,
        incidents,
        answers: &shared.answers,
        load_start_unix_ms,
        faults_over_ms,
        end_ms,
    }
    .judge(None, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(seed: u64) -> TicketsOptions {
        TicketsOptions {
            run: ServerRun {
                seconds: 60,
                seed,
                clients: 8,
                bin: "shardflake".into(),
                script: "scripts/mariadb.sh".into(),
                spacing: Duration::from_secs(6),
                out: None,
            },
            segment: true,
        }
    }

    #[test]
    fn the_schedule_is_seeded_and_kills_each_server_within_the_run() {
        let a = schedule(&options(3));
        assert_eq!(a, schedule(&options(3)));
        assert!(a.len() >= 4, "{a:?}");
        for (at, server, down) in &a {
            assert!(*server < 2);
            assert!(*down >= Duration::from_millis(200) && *down <= Duration::from_secs(3));
            assert!(*at + Duration::from_secs(6) <= Duration::from_secs(60));
        }
    }
}
