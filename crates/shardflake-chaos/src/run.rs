//! One chaos run: start etcd and the nodes, load them, apply the printed
//! schedule of faults, stop, hand everything to the checker, print its table.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tracing::{info, warn};

use crate::check::{self, RunFacts, SlotFacts};
use crate::cluster::{self, Etcd, Netns, NodeProc, NodeSpec};
use crate::load::{self, Collected, Load, Mix, SlotState};
use crate::record::Protocol;
use crate::schedule::{self, Fault, Planned, Shape};

/// What `shardflake-chaos run` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Length of the load.
    pub seconds: u64,
    /// Nodes (a spare is added for SIGSTOP hand-overs).
    pub nodes: usize,
    /// Seed of the schedule and the request mix.
    pub seed: u64,
    /// Where logs, state files and the report go; a temporary directory
    /// (removed afterwards) when absent.
    pub out: Option<PathBuf>,
    /// The `shardflake` binary.
    pub bin: PathBuf,
    /// `scripts/etcd.sh`.
    pub etcd_script: PathBuf,
    /// Connections per node per protocol.
    pub conns: usize,
    /// The request mix.
    pub mix: Mix,
    /// Time between faults.
    pub spacing: Duration,
    /// Run one node in a network namespace (needs root and `ip`).
    pub netns: bool,
    /// Lease TTL given to the nodes (also how long a SIGSTOP or a cut lasts, plus a margin).
    pub lease_ttl: Duration,
    /// etcd with user/password authentication and JWT tokens; the nodes
    /// log in, and the schedule holds auth changes.
    pub etcd_auth: bool,
}

/// The node whose clock is faked (libfaketime).
const CLOCK_SLOT: usize = 0;

/// The schedule's shape for these options: 3 s warm-up, 8 s quiet tail;
/// the clock fault on node 0, the cut on the last node (in the namespace).
pub fn shape(o: &Options) -> Shape {
    Shape {
        run: Duration::from_secs(o.seconds),
        spacing: o.spacing,
        warm_up: Duration::from_secs(3),
        tail: Duration::from_secs(8),
        nodes: o.nodes,
        clock_slot: CLOCK_SLOT,
        netns_slot: o.netns.then_some(o.nodes.saturating_sub(1)),
        auth: o.etcd_auth,
    }
}

/// A node slot: how to start it, its process, what the load sees.
struct Slot {
    spec: NodeSpec,
    proc: Option<NodeProc>,
    state: Arc<SlotState>,
    processes: u32,
}

/// Everything started; stopped on drop, whatever happened.
struct Cluster {
    etcd: Option<Etcd>,
    /// A one-member etcd of another cluster (other-cluster-endpoint),
    /// started the first time it is needed.
    other_etcd: Option<Etcd>,
    netns: Option<Netns>,
    slots: Vec<Slot>,
    /// The fleet's etcd prefix.
    prefix: String,
    /// The fleet's layout spec (`/v1/info`), changed by layout-change.
    layout: String,
    /// From (slot, process) on, how much earlier the slot's layout's epoch
    /// is than the run's first (for the checker's lead).
    epoch_earlier_ms: BTreeMap<(usize, u32), i64>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Some(mut p) = slot.proc.take() {
                let _ = p.signal(libc::SIGCONT);
                let _ = p.signal(libc::SIGTERM);
                if !p.wait_exit(Duration::from_secs(10)) {
                    warn!(node = %slot.spec.name, "did not stop on SIGTERM; killed");
                }
            }
        }
        if let Some(e) = self.other_etcd.take()
            && let Err(e) = e.stop()
        {
            warn!("other etcd stop: {e:#}");
        }
        if let Some(e) = self.etcd.take()
            && let Err(e) = e.stop()
        {
            warn!("etcd stop: {e:#}");
        }
        if let Some(n) = self.netns.take() {
            n.remove();
        }
    }
}

/// Prints one timeline line, offset from the load's start.
fn say(start: Instant, text: impl std::fmt::Display) {
    println!("[+{:>7.2}s] {text}", start.elapsed().as_secs_f64());
}

/// Runs it; returns whether everything passed.
pub fn run(o: &Options) -> anyhow::Result<bool> {
    let (dir, temporary) = match &o.out {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("shardflake-chaos.{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let result = run_in(o, &dir);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("logs, state files and report in {}", dir.display());
    }
    result
}

fn run_in(o: &Options, dir: &std::path::Path) -> anyhow::Result<bool> {
    anyhow::ensure!(o.nodes >= 2, "--nodes must be at least 2");
    anyhow::ensure!(
        o.bin.exists(),
        "{} missing: build it (cargo build --release -p shardflake-cli)",
        o.bin.display()
    );
    // Two runtimes: the load keeps its threads busy, and must not delay the
    // control side (readiness, scrapes, the etcd forwarders of the
    // namespaced node), whose timeouts would otherwise fire late.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("control")
        .enable_all()
        .build()?;
    let load_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load")
        .enable_all()
        .build()?;
    let mut cluster = Cluster {
        etcd: None,
        other_etcd: None,
        netns: None,
        slots: Vec::new(),
        prefix: String::new(),
        layout: String::new(),
        epoch_earlier_ms: BTreeMap::new(),
    };
    let (etcd, login) = cluster::start_etcd(&o.etcd_script, &dir.join("etcd"), 3, o.etcd_auth)?;
    let endpoints = etcd.endpoints.join(",");
    let etcd_ports = etcd.ports()?;
    cluster.etcd = Some(etcd);
    let auth_note = if login.is_some() {
        ", authentication on (JWT tokens)"
    } else {
        ""
    };
    println!("etcd: 3 members at {endpoints}{auth_note}");

    // The last node runs in its own network namespace and reaches etcd
    // through forwarders on a host-side address of the veth pair.
    let netns_slot = o.nodes - 1;
    let mut netns_endpoints = None;
    if o.netns {
        let tag = (std::process::id() % 200 + 20) as u8;
        let ns = Netns::create(tag).context(
            "network namespace for the cut-from-etcd fault (needs root and iproute2; --no-netns skips that fault)",
        )?;
        for &port in &etcd_ports {
            rt.block_on(cluster::forward(
                cluster::at(ns.etcd_addr, port),
                cluster::at(Ipv4Addr::LOCALHOST, port),
            ))?;
        }
        netns_endpoints = Some(
            etcd_ports
                .iter()
                .map(|p| format!("http://{}:{p}", ns.etcd_addr))
                .collect::<Vec<_>>()
                .join(","),
        );
        println!(
            "netns {}: node{netns_slot} at {}, clients from {}, etcd via {}",
            ns.name, ns.node_addr, ns.client_addr, ns.etcd_addr
        );
        cluster.netns = Some(ns);
    }

    let prefix = format!("/chaos/{}-{}", o.seed, std::process::id());
    cluster.prefix = prefix.clone();
    let ttl = o.lease_ttl;
    let faketime = dir.join("faketime");
    std::fs::write(&faketime, "+0s")?;
    let clock_slot = CLOCK_SLOT;
    for i in 0..=o.nodes {
        let spare = i == o.nodes;
        let name = if spare {
            "spare".to_string()
        } else {
            format!("node{i}")
        };
        let in_netns = o.netns && i == netns_slot;
        let ip: IpAddr = match (&cluster.netns, in_netns) {
            (Some(ns), true) => ns.node_addr.into(),
            _ => Ipv4Addr::LOCALHOST.into(),
        };
        let (http, grpc) = (
            SocketAddr::new(ip, cluster::free_port()?),
            SocketAddr::new(ip, cluster::free_port()?),
        );
        let etcd_for_node = match (&netns_endpoints, in_netns) {
            (Some(e), true) => e.clone(),
            _ => endpoints.clone(),
        };
        let mut args: Vec<String> = [
            "--etcd",
            &etcd_for_node,
            "--etcd-prefix",
            &prefix,
            "--lease-ttl",
            &format!("{}ms", ttl.as_millis()),
            "--safety-margin",
            "500ms",
            "--etcd-timeout",
            "300ms",
            "--window",
            "1s",
            // After an etcd restore a take waits this out (a lost holder's
            // clock may have run that far ahead): the fleet's clocks here
            // differ by the clock faults' steps back, 5 s at most.
            "--max-resume-wait",
            "10s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(l) = &login {
            args.extend([
                "--etcd-user".to_string(),
                l.user.clone(),
                "--etcd-password-file".to_string(),
                l.password_file.display().to_string(),
            ]);
        }
        let spec = NodeSpec {
            bin: o.bin.clone(),
            http,
            grpc,
            args,
            state_file: dir.join(format!("{name}.state")),
            name,
            faketime_file: (i == clock_slot).then(|| faketime.clone()),
            netns: in_netns
                .then(|| cluster.netns.as_ref().map(|n| n.name.clone()))
                .flatten(),
            dir: dir.to_path_buf(),
        };
        cluster.slots.push(Slot {
            state: Arc::new(SlotState::new(http, grpc)),
            spec,
            proc: None,
            processes: 0,
        });
    }
    for i in 0..o.nodes {
        start_slot(&mut cluster.slots[i])?;
    }
    for i in 0..o.nodes {
        let http = cluster.slots[i].spec.http;
        rt.block_on(wait_ready(http, Duration::from_secs(30)))
            .with_context(|| format!("node{i} not ready"))?;
    }
    let info = rt.block_on(load::get_json(cluster.slots[0].spec.http, "/v1/info"))?;
    let spec = info["layout_spec"]
        .as_str()
        .context("/v1/info has no layout_spec")?
        .to_string();
    let node_field = info["node_field"].as_str().unwrap_or("node").to_string();
    let layout = shardflake::preset::resolve(&spec).with_context(|| format!("layout {spec:?}"))?;
    cluster.layout = spec.clone();
    let seq = layout.sequence();
    println!("layout: {spec}; node field {node_field}");
    for s in &cluster.slots {
        println!("{}: http {} grpc {}", s.spec.name, s.spec.http, s.spec.grpc);
    }

    let plan = schedule::plan(o.seed, &shape(o));
    println!("schedule (seed {}, {} faults):", o.seed, plan.len());
    for p in &plan {
        println!("  {p}");
    }

    // The load.
    let load = Arc::new(Load {
        start: Instant::now(),
        stop: Default::default(),
        slots: cluster.slots.iter().map(|s| s.state.clone()).collect(),
        sequence_mask: seq.max() << seq.shift(),
        mix: o.mix,
    });
    let load_start_unix_ms = check::unix_ms_now();
    let mut tasks = Vec::new();
    for (slot, s) in cluster.slots.iter().enumerate() {
        for protocol in [Protocol::Http, Protocol::Grpc] {
            for c in 0..o.conns {
                let seed = o.seed ^ ((slot as u64) << 32 | (protocol as u64) << 16 | c as u64);
                let label = s.spec.name.clone();
                let task = load_rt.spawn(load::connection_loop(load.clone(), slot, protocol, seed));
                tasks.push((label, task));
            }
        }
    }

    // The faults.
    let start = load.start;
    let mut incidents = Vec::new();
    let mut issued: BTreeMap<(usize, u32), (u64, bool)> = BTreeMap::new();
    let mut faults_over_ms = 0u64;
    // Processes started without their state file (the state-lost fault).
    let mut fresh_state = std::collections::BTreeSet::new();
    for p in &plan {
        sleep_until(start + p.at);
        check_alive(&mut cluster, &mut incidents, start);
        say(start, p);
        if p.fault == Fault::StateLost {
            fresh_state.insert((p.slot, cluster.slots[p.slot].processes));
        }
        if let Err(e) = apply(&rt, &mut cluster, p, o, &faketime, start, &mut issued) {
            incidents.push(format!("{}: {e:#}", p.fault.name()));
            say(start, format!("fault failed: {e:#}"));
        }
        faults_over_ms = start.elapsed().as_millis() as u64;
    }
    say(start, "faults over; quiet until the end");
    sleep_until(start + Duration::from_secs(o.seconds));
    check_alive(&mut cluster, &mut incidents, start);

    // Stop the load, then take every live node's exact final count.
    load.stop.store(true, Ordering::SeqCst);
    let seconds = start.elapsed().as_secs_f64();
    let end_ms = start.elapsed().as_millis() as u64;
    let mut logs = Vec::new();
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for (label, task) in tasks {
        let collected: Collected = match load_rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(15), task).await })
        {
            Ok(Ok(c)) => c,
            _ => {
                incidents.push(format!(
                    "a {label} load connection did not stop within 15 s"
                ));
                continue;
            }
        };
        logs.extend(collected.logs);
        for (code, n) in collected.errors {
            *errors.entry(format!("{label} {code}")).or_default() += n;
        }
    }
    for (i, slot) in cluster.slots.iter().enumerate() {
        if let Some(p) = &slot.proc
            && let Some(n) = rt.block_on(scrape(slot.spec.http))
        {
            issued.insert((i, p.incarnation), (n, true));
        }
    }
    say(start, "load stopped; checking");

    let slots = cluster
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let a = s.state.answers_until(end_ms);
            SlotFacts {
                name: s.spec.name.clone(),
                spare: i == o.nodes,
                processes: s.processes,
                longest_outage_ms: a.longest_gap_ms,
                longest_outage_from_ms: a.longest_gap_from_ms,
                came_back: a.any && a.last_ms > faults_over_ms,
            }
        })
        .collect::<Vec<_>>();
    for s in slots.iter().filter(|s| !s.spare && !s.came_back) {
        incidents.push(format!("{} never answered after the last fault", s.name));
    }
    let epoch_earlier_ms = std::mem::take(&mut cluster.epoch_earlier_ms);
    drop(cluster);
    let facts = RunFacts {
        load_start_unix_ms,
        seconds,
        slots,
        errors,
        issued,
        incidents,
        fresh_state,
        epoch_earlier_ms,
    };
    let sorting = Instant::now();
    let report = check::check(&logs, Some(&layout), &node_field, &facts);
    let passed = !report.failed() && facts.incidents.is_empty();
    let table = check::table(&report, &facts, passed);
    println!(
        "\nchecker: {} ids in {} runs judged in {:.1} s\n",
        report.ids,
        report.runs,
        sorting.elapsed().as_secs_f64()
    );
    println!("{table}");
    std::fs::write(dir.join("report.md"), &table)?;
    Ok(passed)
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

fn start_slot(slot: &mut Slot) -> anyhow::Result<()> {
    let spec = slot.spec.clone();
    start_slot_as(slot, &spec)
}

/// Starts the slot's next process from `spec` (the slot's own, or one an
/// operator got wrong).
fn start_slot_as(slot: &mut Slot, spec: &NodeSpec) -> anyhow::Result<()> {
    let incarnation = slot.processes;
    // Before the process exists: a connection accepted from now on is its.
    slot.state.incarnation.store(incarnation, Ordering::SeqCst);
    slot.proc = Some(spec.spawn(incarnation)?);
    slot.processes += 1;
    Ok(())
}

/// The slot's current process log.
fn log_of(slot: &Slot) -> String {
    let Some(p) = &slot.proc else {
        return String::new();
    };
    let log = slot
        .spec
        .dir
        .join(format!("{}.{}.log", slot.spec.name, p.incarnation));
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Stops the slot's process with SIGTERM (bounded).
fn term_slot(slot: &mut Slot) -> anyhow::Result<()> {
    if let Some(mut proc) = slot.proc.take() {
        proc.signal(libc::SIGTERM)?;
        if !proc.wait_exit(Duration::from_secs(10)) {
            bail!("{} did not exit within 10 s of SIGTERM", slot.spec.name);
        }
    }
    Ok(())
}

/// Waits (bounded) for the slot's process to exit on its own; its log.
fn exits_within(slot: &mut Slot, limit: Duration) -> Option<String> {
    let proc = slot.proc.as_mut()?;
    let deadline = Instant::now() + limit;
    loop {
        if proc.exited().is_some() {
            let log = log_of(slot);
            slot.proc = None;
            return Some(log);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A node that exited without being told to is an incident; it is started again.
fn check_alive(cluster: &mut Cluster, incidents: &mut Vec<String>, start: Instant) {
    for slot in &mut cluster.slots {
        let Some(p) = slot.proc.as_mut() else {
            continue;
        };
        if let Some(status) = p.exited() {
            let log = slot
                .spec
                .dir
                .join(format!("{}.{}.log", slot.spec.name, p.incarnation));
            let tail = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            let text = format!(
                "{} process {} exited on its own ({status}); log {}: {}",
                slot.spec.name,
                p.incarnation,
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            );
            say(start, &text);
            incidents.push(text);
            slot.proc = None;
            if let Err(e) = start_slot(slot) {
                incidents.push(format!("{}: restart failed: {e:#}", slot.spec.name));
            }
        }
    }
}

async fn wait_ready(http: SocketAddr, limit: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok((200, _)) = load::get_once(http, "/readyz").await {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{http}/readyz not 200 within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The node's `shardflake_ids_issued_total`, if it answers within a second.
async fn scrape(http: SocketAddr) -> Option<u64> {
    let (status, body) = load::get_once(http, "/metrics").await.ok()?;
    if status != 200 {
        return None;
    }
    String::from_utf8_lossy(&body).lines().find_map(|l| {
        l.strip_prefix("shardflake_ids_issued_total ")
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    })
}

fn node_id(rt: &tokio::runtime::Runtime, http: SocketAddr) -> String {
    rt.block_on(load::get_json(http, "/v1/info"))
        .ok()
        .and_then(|v| v["node_id"].as_u64())
        .map_or_else(|| "none".to_string(), |n| n.to_string())
}

/// Applies one fault and its recovery.
fn apply(
    rt: &tokio::runtime::Runtime,
    cluster: &mut Cluster,
    p: &Planned,
    o: &Options,
    faketime: &std::path::Path,
    start: Instant,
    issued: &mut BTreeMap<(usize, u32), (u64, bool)>,
) -> anyhow::Result<()> {
    let ttl = o.lease_ttl;
    let mut last_count = |cluster: &Cluster, slot: usize| {
        let s = &cluster.slots[slot];
        if let (Some(proc), Some(n)) = (&s.proc, rt.block_on(scrape(s.spec.http))) {
            issued.insert((slot, proc.incarnation), (n, false));
        }
        info!(slot, "scraped before the fault");
    };
    match p.fault {
        Fault::Kill | Fault::Term => {
            last_count(cluster, p.slot);
            let slot = &mut cluster.slots[p.slot];
            let mut proc = slot.proc.take().context("no process")?;
            let signal = if p.fault == Fault::Kill {
                libc::SIGKILL
            } else {
                libc::SIGTERM
            };
            proc.signal(signal)?;
            info!(node = %slot.spec.name, signal, "signalled");
            if !proc.wait_exit(Duration::from_secs(10)) {
                bail!(
                    "{} did not exit within 10 s of signal {signal}",
                    slot.spec.name
                );
            }
            start_slot(slot)?;
            say(
                start,
                format!(
                    "{}: process {} started on the same state file",
                    slot.spec.name,
                    slot.processes - 1
                ),
            );
        }
        Fault::Stop => {
            let spare_index = cluster.slots.len() - 1;
            let held = node_id(rt, cluster.slots[p.slot].spec.http);
            let proc = cluster.slots[p.slot].proc.as_ref().context("no process")?;
            proc.signal(libc::SIGSTOP)?;
            std::thread::sleep(ttl + Duration::from_millis(300));
            start_slot(&mut cluster.slots[spare_index])?;
            let spare_http = cluster.slots[spare_index].spec.http;
            // A take of an id not recorded since an etcd restore waits
            // window + --max-resume-wait (11 s here) before it is ready.
            let ready = rt.block_on(wait_ready(spare_http, Duration::from_secs(15)));
            say(
                start,
                format!(
                    "node{} stopped holding node id {held}; spare started, holds {} ({})",
                    p.slot,
                    node_id(rt, spare_http),
                    if ready.is_ok() {
                        "ready"
                    } else {
                        "not ready in 15 s"
                    }
                ),
            );
            let proc = cluster.slots[p.slot].proc.as_ref().context("no process")?;
            proc.signal(libc::SIGCONT)?;
            say(start, format!("node{}: SIGCONT", p.slot));
            std::thread::sleep(Duration::from_secs(3));
            say(
                start,
                format!(
                    "node{} now holds node id {}",
                    p.slot,
                    node_id(rt, cluster.slots[p.slot].spec.http)
                ),
            );
            last_count(cluster, spare_index);
            let spare = &mut cluster.slots[spare_index];
            if let Some(mut proc) = spare.proc.take() {
                proc.signal(libc::SIGTERM)?;
                if !proc.wait_exit(Duration::from_secs(10)) {
                    bail!("spare did not exit within 10 s of SIGTERM");
                }
            }
            say(start, "spare stopped (SIGTERM)");
            ready?;
        }
        Fault::Clock => {
            std::fs::write(faketime, "-3s")?;
            say(start, format!("node{}: clock stepped back 3 s", p.slot));
            std::thread::sleep(Duration::from_secs(4));
            std::fs::write(faketime, "+0s")?;
            say(
                start,
                format!(
                    "node{}: clock stepped forward 3 s (to the real time)",
                    p.slot
                ),
            );
        }
        Fault::EtcdLeader => {
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            let leader = etcd.leader()?;
            etcd.kill(leader)?;
            say(start, format!("etcd member m{leader} (leader) SIGKILLed"));
            std::thread::sleep(Duration::from_secs(3));
            etcd.restart(leader)?;
            say(start, format!("etcd member m{leader} restarted"));
        }
        Fault::CutFromEtcd => {
            let ns = cluster.netns.as_ref().context("no network namespace")?;
            ns.cut_etcd_route()?;
            say(
                start,
                format!(
                    "node{}: route to etcd removed (clients still reach it)",
                    p.slot
                ),
            );
            std::thread::sleep(ttl + Duration::from_secs(2));
            ns.restore_etcd_route()?;
            say(start, format!("node{}: route to etcd restored", p.slot));
        }
        Fault::AuthChange => {
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            let role = format!("chaos-{}", p.at.as_millis());
            // etcd then refuses every JWT it gave before.
            etcd.etcdctl(&["role", "add", &role])?;
            say(
                start,
                format!("etcd auth store changed (role {role} added): every token voided"),
            );
        }
        Fault::OtherPrefix => {
            let other = format!("{}-other", cluster.prefix);
            let half = (cluster.slots.len() - 1) / 2;
            for i in 0..half.max(1) {
                last_count(cluster, i);
                let slot = &mut cluster.slots[i];
                term_slot(slot)?;
                let mut wrong = slot.spec.clone();
                for a in wrong.args.iter_mut().filter(|a| **a == cluster.prefix) {
                    *a = other.clone();
                }
                start_slot_as(slot, &wrong)?;
                match exits_within(slot, Duration::from_secs(10)) {
                    Some(log)
                        if log.contains("state file says it ran under")
                            || log.contains("holds no fleet id") =>
                    {
                        say(
                            start,
                            format!("node{i} under {other}: refused by its state file"),
                        )
                    }
                    Some(log) => bail!(
                        "node{i} under {other} exited, but not refused by its state file: {}",
                        log.lines().last().unwrap_or("")
                    ),
                    None => {
                        // It came up: the checker will see what it issued.
                        term_slot(slot)?;
                        bail!("node{i} started under {other} beside the fleet");
                    }
                }
                start_slot(slot)?;
            }
            say(
                start,
                format!("{} nodes restarted under {}", half.max(1), cluster.prefix),
            );
        }
        Fault::RegistryDeleted => {
            let key = format!("{}/fleet", cluster.prefix);
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            let fleet = etcd.etcdctl(&["get", "--print-value-only", &key])?;
            let fleet = fleet.trim_end_matches('\n').to_string();
            // The generation the nodes' state files record (a move or a
            // layout change raised it): the refusal asks for it back too.
            let generation_key = format!("{}/generation", cluster.prefix);
            let generation = etcd.etcdctl(&["get", "--print-value-only", &generation_key])?;
            let generation = generation.trim_end_matches('\n').to_string();
            // A confirmation after a restore goes with the delete.
            let confirmed = etcd.etcdctl(&[
                "get",
                "--print-value-only",
                &format!("{}/confirmed", cluster.prefix),
            ])?;
            etcd.etcdctl(&["del", "--prefix", &format!("{}/", cluster.prefix)])?;
            say(start, format!("etcdctl del --prefix {}/", cluster.prefix));
            // Holders stop at once (they watch their records); each then
            // finds no fleet id and exits. Give them a few windows.
            std::thread::sleep(Duration::from_secs(3));
            if !fleet.is_empty() {
                fresh_node_refused(cluster, p.at)?;
                say(
                    start,
                    "a node without a state file on the deleted prefix: refused (its fleet is registered there)",
                );
                // As the refusal says: a floor past every id the fleet
                // stamped (now, plus the window and the largest clock
                // difference here: 1 s and the faked node's 5 s), then
                // the fleet id.
                let floor_key = format!("{}/floor", cluster.prefix);
                let floor = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)?
                    .as_millis()
                    + 6_000;
                etcd.etcdctl(&["put", &floor_key, &floor.to_string()])?;
                if !generation.is_empty() {
                    etcd.etcdctl(&["put", &generation_key, &generation])?;
                }
                etcd.etcdctl(&["put", &key, &fleet])?;
                say(
                    start,
                    format!(
                        "{floor_key}, {generation_key} ({}) then {key} put back, as the refusal says",
                        if generation.is_empty() {
                            "none"
                        } else {
                            generation.as_str()
                        }
                    ),
                );
                // After a restore, a node without a state file of the
                // place is refused until the operator confirms it again
                // (the fleet never left it).
                if !confirmed.trim().is_empty() {
                    confirm_place(cluster)?;
                    say(
                        start,
                        format!(
                            "shardflake fleet confirm --etcd-prefix {} again",
                            cluster.prefix
                        ),
                    );
                }
            }
            let mut stopped = 0;
            for (i, slot) in cluster.slots.iter_mut().enumerate() {
                if let Some(log) = exits_within(slot, Duration::ZERO) {
                    anyhow::ensure!(
                        log.contains("holds no fleet id"),
                        "node{i} exited, not for the missing fleet id: {}",
                        log.lines().last().unwrap_or("")
                    );
                    stopped += 1;
                    start_slot(slot)?;
                }
            }
            say(
                start,
                format!("{stopped} nodes had stopped for it; restarted"),
            );
        }
        Fault::Restore => {
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            let file = etcd
                .dir
                .with_extension(format!("{}.snapshot", p.at.as_millis()));
            etcd.snapshot(&file)?;
            say(start, "etcd snapshot saved; restoring it in 4 s");
            std::thread::sleep(Duration::from_secs(4));
            etcd.restore(&file)?;
            say(start, "etcd restored from the snapshot (every member)");
            // The snapshot is newer than the fleet's last move and layout
            // change (this run makes none): the operator says so, and new
            // nodes (state-lost) may take ids there again.
            confirm_place(cluster)?;
            say(
                start,
                format!("shardflake fleet confirm --etcd-prefix {}", cluster.prefix),
            );
            // Raft entries that make no revision close the gap between
            // revision and raft index a restore leaves: the restore must
            // still be seen after them (the record the first take wrote).
            let client = etcd.client();
            let grants = 1_000;
            rt.block_on(async {
                for _ in 0..grants {
                    client.grant(10).await?;
                }
                anyhow::Ok(())
            })?;
            say(start, format!("{grants} etcd leases granted"));
        }
        Fault::LayoutDeleted => {
            let key = format!("{}/layout", cluster.prefix);
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            // Right after a fault that emptied the prefix, the record is
            // written again by the nodes' next takes: wait for it (never
            // put back a value not read).
            let deadline = Instant::now() + Duration::from_secs(15);
            let value = loop {
                let value = etcd.etcdctl(&["get", "--print-value-only", &key])?;
                let value = value.trim_end_matches('\n').to_string();
                if !value.is_empty() {
                    break value;
                }
                anyhow::ensure!(Instant::now() < deadline, "{key} was not written again");
                std::thread::sleep(Duration::from_millis(200));
            };
            etcd.etcdctl(&["del", &key])?;
            say(start, format!("etcdctl del {key}"));
            // Holders stop at their next record (window/3); each then
            // finds no layout and stops. Give them a few windows.
            std::thread::sleep(Duration::from_secs(3));
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            etcd.etcdctl(&["put", &key, &value])?;
            say(start, format!("{key} put back, as the refusal says"));
            let mut stopped = 0;
            for (i, slot) in cluster.slots.iter_mut().enumerate() {
                if let Some(log) = exits_within(slot, Duration::ZERO) {
                    anyhow::ensure!(
                        log.contains(&format!("no {key}")),
                        "node{i} exited, not for the missing layout: {}",
                        log.lines().last().unwrap_or("")
                    );
                    stopped += 1;
                    start_slot(slot)?;
                }
            }
            say(
                start,
                format!("{stopped} nodes had stopped for it; restarted"),
            );
        }
        Fault::ForeignEndpoint => {
            if cluster.other_etcd.is_none() {
                cluster.other_etcd = Some(Etcd::start(1)?);
            }
            let other = cluster
                .other_etcd
                .as_ref()
                .map(|e| e.urls())
                .context("no other etcd")?;
            last_count(cluster, p.slot);
            let slot = &mut cluster.slots[p.slot];
            term_slot(slot)?;
            let mut wrong = slot.spec.clone();
            let at = wrong
                .args
                .iter()
                .position(|a| a == "--etcd")
                .context("no --etcd")?;
            // Drawn at an even millisecond (the schedule's random jitter),
            // the list names that member twice, as 127.0.0.1 and
            // localhost: one member, counted once.
            let twice = p.at.as_millis().is_multiple_of(2);
            let other = if twice {
                format!("{other},{}", other.replace("127.0.0.1", "localhost"))
            } else {
                other
            };
            wrong.args[at + 1] = format!("{},{other}", wrong.args[at + 1]);
            start_slot_as(slot, &wrong)?;
            let how = if twice { " (listed twice)" } else { "" };
            match exits_within(slot, Duration::from_secs(10)) {
                Some(log) if log.contains("answer for different etcd clusters") => say(
                    start,
                    format!(
                        "node{} with a member of another cluster{how}: refused",
                        p.slot
                    ),
                ),
                Some(log) => bail!(
                    "node{} with a member of another cluster exited, but not for it: {}",
                    p.slot,
                    log.lines().last().unwrap_or("")
                ),
                None => {
                    term_slot(slot)?;
                    bail!("node{} started with a member of another cluster", p.slot);
                }
            }
            start_slot(slot)?;
        }
        Fault::CopyElsewhere => {
            let etcd = cluster.etcd.as_ref().context("no etcd")?;
            let file = etcd
                .dir
                .with_extension(format!("{}.copy", p.at.as_millis()));
            etcd.snapshot(&file)?;
            if cluster.other_etcd.is_none() {
                cluster.other_etcd = Some(Etcd::start(1)?);
            }
            let copy = cluster.other_etcd.as_ref().context("no other etcd")?;
            copy.restore(&file)?;
            let _ = std::fs::remove_file(&file);
            let prefix = cluster.prefix.clone();
            // What the operator deletes there: drawn from the schedule's
            // jitter, its tenths of a second as the schedule prints them
            // (the fault's slot is the node pointed at it).
            let fleet = copy.etcdctl(&["get", "--print-value-only", &format!("{prefix}/fleet")])?;
            let fleet = fleet.trim_end_matches('\n').to_string();
            let what = match (p.at.as_millis() / 100) % 4 {
                0 => {
                    copy.etcdctl(&["del", &format!("{prefix}/cluster")])?;
                    format!("{prefix}/cluster deleted")
                }
                1 => {
                    copy.etcdctl(&["del", &format!("{prefix}/cluster")])?;
                    copy.etcdctl(&["del", "--prefix", &format!("{prefix}/taken/")])?;
                    format!("{prefix}/cluster and {prefix}/taken/ deleted")
                }
                2 => {
                    copy.etcdctl(&["del", "--prefix", &format!("{prefix}/")])?;
                    format!("{prefix}/ deleted")
                }
                _ => {
                    copy.etcdctl(&["del", "--prefix", &format!("{prefix}/")])?;
                    let floor = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)?
                        .as_millis()
                        + 6_000;
                    copy.etcdctl(&["put", &format!("{prefix}/floor"), &floor.to_string()])?;
                    copy.etcdctl(&["put", &format!("{prefix}/fleet"), &fleet])?;
                    format!("{prefix}/ deleted, floor and fleet id put back")
                }
            };
            say(
                start,
                format!("etcd snapshot restored into another cluster; on the copy: {what}"),
            );
            let urls = copy.urls();
            last_count(cluster, p.slot);
            let slot = &mut cluster.slots[p.slot];
            term_slot(slot)?;
            let mut wrong = slot.spec.clone();
            let at = wrong
                .args
                .iter()
                .position(|a| a == "--etcd")
                .context("no --etcd")?;
            wrong.args[at + 1] = urls;
            start_slot_as(slot, &wrong)?;
            match exits_within(slot, Duration::from_secs(10)) {
                Some(log)
                    if log.contains("a copy of that cluster")
                        || log.contains("whose state file names another etcd cluster") =>
                {
                    say(start, format!("node{} on the copy: refused", p.slot))
                }
                Some(log) => bail!(
                    "node{} on the copy exited, but not for it: {}",
                    p.slot,
                    log.lines().last().unwrap_or("")
                ),
                None => {
                    term_slot(slot)?;
                    bail!("node{} started on a copy of its fleet's etcd", p.slot);
                }
            }
            start_slot(slot)?;
        }
        Fault::FleetMove => {
            let nodes = cluster.slots.len() - 1;
            for i in 0..nodes {
                last_count(cluster, i);
                term_slot(&mut cluster.slots[i])?;
            }
            let old = cluster.prefix.clone();
            let new = format!("{old}-m{}", p.at.as_millis());
            // After a restore a move raises the records at least the
            // --max-resume-wait it is given: 6 s, past the largest clock
            // difference here (5 s), so the moved nodes wait less than the
            // fleet's own 10 s would make them (the raise goes past the
            // clock, never on top of a record already ahead of it).
            let move_args = [
                "move",
                "--etcd-prefix",
                &old,
                "--to-prefix",
                &new,
                "--raise",
                "6s",
                "--max-resume-wait",
                "6s",
            ];
            // A node key on a lease a restore brought back lasts its TTL.
            let deadline = Instant::now() + ttl + Duration::from_secs(10);
            let said = loop {
                match fleet_cmd(cluster, &move_args)? {
                    Ok(said) => break said,
                    Err(e) if e.contains("a node of the fleet") && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    Err(e) => bail!("shardflake fleet move: {e}"),
                }
            };
            say(start, said.lines().next().unwrap_or("moved").to_string());
            for slot in &mut cluster.slots {
                for a in slot.spec.args.iter_mut().filter(|a| **a == old) {
                    a.clone_from(&new);
                }
            }
            cluster.prefix = new.clone();
            for i in 0..nodes {
                start_slot(&mut cluster.slots[i])?;
            }
            say(start, format!("{nodes} nodes started under {new}"));
        }
        Fault::LayoutChange => {
            if let Err(e) = layout_change(cluster, p, start, ttl, &mut last_count) {
                // The run goes on with the fleet where it was.
                let nodes = cluster.slots.len() - 1;
                for slot in cluster.slots.iter_mut().take(nodes) {
                    if slot.proc.is_none() {
                        start_slot(slot)?;
                    }
                }
                return Err(e);
            }
        }
        Fault::StateCopy => {
            let slot = &cluster.slots[p.slot];
            let name = format!("{}-copy", slot.spec.name);
            let link = slot.spec.dir.join(format!("{name}.state"));
            let _ = std::fs::remove_file(&link);
            // Which link, from the seed (the schedule's jitter).
            let hard = p.at.as_millis().is_multiple_of(2);
            if hard {
                std::fs::hard_link(&slot.spec.state_file, &link)?;
            } else {
                std::os::unix::fs::symlink(&slot.spec.state_file, &link)?;
            }
            let ip = slot.spec.http.ip();
            let copy = NodeSpec {
                name: name.clone(),
                http: SocketAddr::new(ip, cluster::free_port()?),
                grpc: SocketAddr::new(ip, cluster::free_port()?),
                state_file: link.clone(),
                faketime_file: None,
                ..slot.spec.clone()
            };
            let mut proc = copy.spawn(0)?;
            let kind = if hard { "hard link" } else { "symlink" };
            if !proc.wait_exit(Duration::from_secs(10)) {
                proc.signal(libc::SIGKILL)?;
                bail!(
                    "{name} ({kind} to node{}'s state file) was not refused",
                    p.slot
                );
            }
            let log =
                std::fs::read_to_string(copy.dir.join(format!("{name}.0.log"))).unwrap_or_default();
            let _ = std::fs::remove_file(&link);
            anyhow::ensure!(
                log.contains("in use by another shardflake process")
                    || log.contains("is a copy or a link of another node's state file"),
                "{name} exited, not refused for its state file: {}",
                log.lines().last().unwrap_or("")
            );
            say(
                start,
                format!(
                    "{name}: a second process on a {kind} to node{}'s state file, refused",
                    p.slot
                ),
            );
        }
        Fault::StateLost => {
            last_count(cluster, p.slot);
            let slot = &mut cluster.slots[p.slot];
            term_slot(slot)?;
            std::fs::remove_file(&slot.spec.state_file)?;
            std::fs::write(faketime, "-5s")?;
            start_slot(slot)?;
            say(
                start,
                format!(
                    "node{}: state file removed, restarted with its clock 5 s back",
                    p.slot
                ),
            );
            std::thread::sleep(Duration::from_secs(6));
            std::fs::write(faketime, "+0s")?;
            say(
                start,
                format!("node{}: clock forward to the real time", p.slot),
            );
        }
    }
    info!(fault = p.fault.name(), "done");
    Ok(())
}

/// The layout-change fault: every node stopped, then started on a new
/// prefix with `--previous-prefix`, the changed layout and new state files,
/// as the guide says. An epoch moved later (drawn) must be refused by
/// every node, which then restarts as it was; an epoch a minute earlier
/// (and the random start switched) is allowed, and the fleet runs there
/// (the checker reads its ids' time a minute late: `epoch_earlier_ms`).
fn layout_change(
    cluster: &mut Cluster,
    p: &Planned,
    start: Instant,
    ttl: Duration,
    last_count: &mut impl FnMut(&Cluster, usize),
) -> anyhow::Result<()> {
    let nodes = cluster.slots.len() - 1;
    for i in 0..nodes {
        last_count(cluster, i);
        term_slot(&mut cluster.slots[i])?;
    }
    let old = cluster.prefix.clone();
    let tag = p.at.as_millis();
    let new = format!("{old}-l{tag}");
    // From the schedule's jitter: which change, and how much later.
    let later_ms = if tag % 2 == 1 {
        5_000 + (tag as i64 * 7919) % 25_000
    } else {
        -EARLIER_EPOCH_MS
    };
    let layout = changed_layout(&cluster.layout, later_ms)?;
    let specs: Vec<NodeSpec> = cluster.slots[..nodes]
        .iter()
        .map(|slot| {
            let mut spec = slot.spec.clone();
            for a in spec.args.iter_mut().filter(|a| **a == old) {
                a.clone_from(&new);
            }
            set_flag(&mut spec.args, "--layout", &layout);
            set_flag(&mut spec.args, "--previous-prefix", &old);
            spec.state_file = spec.dir.join(format!("{}-l{tag}.state", spec.name));
            spec
        })
        .collect();
    say(
        start,
        format!("{nodes} nodes stopped; the new fleet under {new}: {layout}"),
    );
    // After an etcd restore a node without a state file of the new place
    // is refused until it is confirmed, and a node key on a lease the
    // restore brought back holds the old prefix until its TTL, as the
    // refusals say.
    let mut confirmed = false;
    let mut refusals = Vec::new();
    let deadline = Instant::now() + ttl + Duration::from_secs(10);
    let mut i = 0;
    while i < nodes {
        let slot = &mut cluster.slots[i];
        start_slot_as(slot, &specs[i])?;
        match exits_within(slot, Duration::from_secs(if later_ms > 0 { 20 } else { 3 })) {
            Some(log) if log.contains("was restored from a snapshot") && !confirmed => {
                fleet_cmd(cluster, &["confirm", "--etcd-prefix", &new])?
                    .map_err(|e| anyhow::anyhow!("shardflake fleet confirm {new}: {e}"))?;
                say(start, format!("{new} confirmed after the etcd restore"));
                confirmed = true;
                continue;
            }
            Some(log) if log.contains("still has a node") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            Some(log) if later_ms > 0 && log.contains("are not above every id the fleet under") => {
                refusals.push(i);
            }
            Some(log) => bail!(
                "node{i} of the new layout exited: {}",
                log.lines().last().unwrap_or("")
            ),
            None if later_ms > 0 => {
                term_slot(&mut cluster.slots[i])?;
                bail!("node{i} started with an epoch {later_ms} ms later than the fleet's");
            }
            None => {}
        }
        i += 1;
    }
    if later_ms > 0 {
        say(
            start,
            format!(
                "the epoch {later_ms} ms later: refused by nodes {refusals:?}; restarted as they were"
            ),
        );
        for i in 0..nodes {
            start_slot(&mut cluster.slots[i])?;
        }
        return Ok(());
    }
    // Allowed: the fleet runs under the new prefix and layout, and later
    // restarts are plain ones there.
    for (slot, mut spec) in cluster.slots[..nodes].iter_mut().zip(specs) {
        if let Some(at) = spec.args.iter().position(|a| a == "--previous-prefix") {
            spec.args.drain(at..at + 2);
        }
        slot.spec = spec;
    }
    let spare = &mut cluster.slots[nodes].spec;
    for a in spare.args.iter_mut().filter(|a| **a == old) {
        a.clone_from(&new);
    }
    set_flag(&mut spare.args, "--layout", &layout);
    spare.state_file = spare.dir.join(format!("spare-l{tag}.state"));
    cluster.prefix = new.clone();
    cluster.layout = layout;
    for (i, slot) in cluster.slots.iter().enumerate() {
        // The node's process running now, or the spare's next one.
        let from = if i < nodes {
            slot.processes.saturating_sub(1)
        } else {
            slot.processes
        };
        let before = cluster
            .epoch_earlier_ms
            .range(..=(i, from))
            .next_back()
            .filter(|((s, _), _)| *s == i)
            .map_or(0, |(_, ms)| *ms);
        cluster
            .epoch_earlier_ms
            .insert((i, from), before + EARLIER_EPOCH_MS);
    }
    say(start, format!("{nodes} nodes started under {new}"));
    Ok(())
}

/// How much earlier the layout-change fault's allowed layout puts the
/// epoch: past the old fleet's high-water records (a window ahead, or a
/// floor put back after a delete), so that every id of the new layout from
/// now on is above every id of the old.
const EARLIER_EPOCH_MS: i64 = 60_000;

/// `args` with `flag`'s value set to `value` (appended where absent).
fn set_flag(args: &mut Vec<String>, flag: &str, value: &str) {
    match args.iter().position(|a| a == flag) {
        Some(at) if at + 1 < args.len() => args[at + 1] = value.to_string(),
        _ => args.extend([flag.to_string(), value.to_string()]),
    }
}

/// `spec` with its epoch `later_ms` later (negative: earlier); an earlier
/// one also switches a random start of 4 bits on (or off).
fn changed_layout(spec: &str, later_ms: i64) -> anyhow::Result<String> {
    let old = shardflake::preset::resolve(spec).with_context(|| format!("layout {spec:?}"))?;
    let random_start = match (later_ms < 0, old.random_start_bits()) {
        (true, 0) => 4,
        (true, _) => 0,
        (false, bits) => bits,
    };
    let epoch = old
        .epoch_ms()
        .checked_add_signed(later_ms)
        .context("epoch out of range")?;
    let mut builder = shardflake::Layout::builder(old.name())
        .epoch_ms(epoch)
        .tick_ms(old.tick_ms())
        .random_start(random_start);
    for f in old.fields() {
        builder = builder.field(f.name(), f.kind(), f.bits());
    }
    Ok(builder.build()?.to_string())
}

/// A node without a state file started on the fleet's deleted prefix
/// (review E13): it must be refused, for the cluster registers the fleet
/// there; started, it would make a new fleet's ids with no floor. It runs
/// as the spare, on ports and a state file of its own.
fn fresh_node_refused(cluster: &Cluster, at: Duration) -> anyhow::Result<()> {
    let spare = &cluster.slots.last().context("no spare")?.spec;
    let name = "fresh".to_string();
    let state_file = spare.dir.join(format!("fresh-{}.state", at.as_millis()));
    let ip = spare.http.ip();
    let fresh = NodeSpec {
        name: name.clone(),
        http: SocketAddr::new(ip, cluster::free_port()?),
        grpc: SocketAddr::new(ip, cluster::free_port()?),
        state_file: state_file.clone(),
        faketime_file: None,
        ..spare.clone()
    };
    let mut proc = fresh.spawn(0)?;
    if !proc.wait_exit(Duration::from_secs(10)) {
        proc.signal(libc::SIGKILL)?;
        bail!(
            "a node without a state file started on the deleted prefix {}",
            cluster.prefix
        );
    }
    let log = std::fs::read_to_string(fresh.dir.join(format!("{name}.0.log"))).unwrap_or_default();
    for path in [state_file.clone(), state_file.with_extension("state.lock")] {
        let _ = std::fs::remove_file(path);
    }
    // After an etcd restore the deleted `<prefix>/confirmed` refuses it
    // first; confirmed again, the registration would.
    anyhow::ensure!(
        log.contains("is registered in this etcd cluster under it")
            || log.contains("was restored from a snapshot"),
        "the node without a state file exited, not refused for the registered fleet: {}",
        log.lines().last().unwrap_or("")
    );
    Ok(())
}

/// `shardflake fleet confirm` of the fleet's place.
fn confirm_place(cluster: &Cluster) -> anyhow::Result<()> {
    let prefix = cluster.prefix.clone();
    fleet_cmd(cluster, &["confirm", "--etcd-prefix", &prefix])?
        .map_err(|e| anyhow::anyhow!("shardflake fleet confirm: {e}"))?;
    Ok(())
}

/// `shardflake fleet <args>` on the run's etcd, with the nodes' etcd
/// login: `Ok(stdout)`, or `Err(stderr)` when it failed.
fn fleet_cmd(cluster: &Cluster, args: &[&str]) -> anyhow::Result<Result<String, String>> {
    let etcd = cluster.etcd.as_ref().context("no etcd")?;
    let spec = &cluster.slots.first().context("no node")?.spec;
    let mut cmd = std::process::Command::new(&spec.bin);
    cmd.arg("fleet")
        .args(args.first())
        .args(["--etcd", &etcd.urls()]);
    cmd.args(args.iter().skip(1));
    for flag in ["--etcd-user", "--etcd-password-file"] {
        if let Some(i) = spec.args.iter().position(|a| a == flag) {
            cmd.arg(flag).args(spec.args.get(i + 1));
        }
    }
    let out = cmd.output()?;
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}
