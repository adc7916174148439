//! Prometheus metrics in the text format: the counters (`counters.rs`),
//! ids issued, batches, sequence exhaustions, clock rollbacks, borrowed
//! lead, lease state and renewals, the layout's time left; with `--tickets`, each ticket server's
//! state, calls, failovers, latency and skipped ids (labelled `server`,
//! `kind`).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use shardflake_tickets::ServerMetrics;

use crate::issuer::{Issuer, LeaseState};

/// The text exposition of every metric.
pub fn render(issuer: &Issuer) -> String {
    let m = &issuer.metrics;
    let stats = issuer.stats();
    let active = issuer.active();
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let mut out = String::with_capacity(2048);
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP shardflake_{name} {help}\n# TYPE shardflake_{name} {kind}\nshardflake_{name} {value}"
        );
    };
    metric(
        "ids_issued_total",
        "counter",
        "Ids of the layout issued.",
        get(&m.ids) as f64,
    );
    metric(
        "batches_total",
        "counter",
        "Batch requests served.",
        get(&m.batches) as f64,
    );
    metric(
        "batches_in_flight",
        "gauge",
        "Batches being reserved now (large ones wait for the clock).",
        get(&m.batches_in_flight) as f64,
    );
    metric(
        "other_kinds_total",
        "counter",
        "UUIDs and ObjectIds issued.",
        get(&m.other_kinds) as f64,
    );
    metric(
        "sequence_exhaustions_total",
        "counter",
        "Calls that found their tick's sequence used up.",
        stats.exhaustions as f64,
    );
    metric(
        "clock_rollbacks_total",
        "counter",
        "Calls that found the clock behind the last issued tick.",
        stats.clock_behind as f64,
    );
    metric(
        "clock_rollback_refusals_total",
        "counter",
        "Calls refused because the clock was further behind than the rollback policy allows.",
        stats.rollback_errors as f64,
    );
    metric(
        "borrowed_lead_seconds",
        "gauge",
        "How far the last tick issued or claimed (by a batch waiting for it) is ahead of the clock.",
        active.as_ref().map_or(0, |a| a.lead_ms()) as f64 / 1000.0,
    );
    let state = issuer.lease_state();
    metric(
        "lease_held",
        "gauge",
        "1 while a node id is held (leased or static).",
        f64::from(u8::from(matches!(
            state,
            LeaseState::Held | LeaseState::Static
        ))),
    );
    metric(
        "lease_state",
        "gauge",
        "0 acquiring, 1 held, 2 static, 3 lost, 4 stopped.",
        f64::from(state as u8),
    );
    metric(
        "layout_lifetime_seconds",
        "gauge",
        "Seconds until the layout's ids stop fitting a signed bigint: its end of life, or its first negative id if earlier.",
        (issuer
            .layout()
            .lifetime_left_ms(shardflake::Clock::now_ms(issuer.clock()))
            / 1000) as f64,
    );
    metric(
        "node_id",
        "gauge",
        "The node id held, -1 when none.",
        active.as_ref().map_or(-1.0, |a| a.node_id as f64),
    );
    metric(
        "lease_acquisitions_total",
        "counter",
        "Node ids acquired.",
        get(&m.acquisitions) as f64,
    );
    metric(
        "lease_renewals_total",
        "counter",
        "Successful lease keep-alives.",
        get(&m.renewals) as f64,
    );
    metric(
        "lease_renewal_failures_total",
        "counter",
        "Failed lease keep-alives.",
        get(&m.renewal_failures) as f64,
    );
    metric(
        "lease_losses_total",
        "counter",
        "Leases lost.",
        get(&m.losses) as f64,
    );
    metric(
        "high_water_ms",
        "gauge",
        "Last durably recorded high-water time, Unix ms.",
        active.as_ref().map_or(0, |a| a.durable_hw()) as f64,
    );
    metric(
        "high_water_writes_total",
        "counter",
        "High-water records written.",
        get(&m.high_water_writes) as f64,
    );
    metric(
        "high_water_write_failures_total",
        "counter",
        "Failed high-water writes.",
        get(&m.high_water_failures) as f64,
    );
    metric(
        "refused_fenced_total",
        "counter",
        "Requests refused because the lease deadline had passed.",
        get(&m.refused_fenced) as f64,
    );
    metric(
        "refused_high_water_total",
        "counter",
        "Requests refused because the clock ran past the recorded high-water.",
        get(&m.refused_high_water) as f64,
    );
    if let Some(tickets) = issuer.tickets() {
        render_tickets(&mut out, &tickets.metrics());
    }
    out
}

/// One family per server counter, a sample per server.
fn render_tickets(out: &mut String, servers: &[ServerMetrics]) {
    let mut family =
        |name: &str, kind: &str, help: &str, value: &dyn Fn(&ServerMetrics) -> (String, f64)| {
            let _ = writeln!(
                out,
                "# HELP shardflake_ticket_{name} {help}\n# TYPE shardflake_ticket_{name} {kind}"
            );
            for s in servers {
                let (extra, v) = value(s);
                let _ = writeln!(
                    out,
                    "shardflake_ticket_{name}{{server=\"{}\",kind=\"{}\"{extra}}} {v}",
                    s.name, s.kind
                );
            }
        };
    family(
        "server_up",
        "gauge",
        "1 while the ticket server takes calls.",
        &|s| (String::new(), f64::from(u8::from(s.state == "up"))),
    );
    family(
        "server_state",
        "gauge",
        "Always 1; the state label is up, down, or the code of the refusal (went_back, recreated, no_high_water, superseded, lattice_changed, misconfigured, ...).",
        &|s| (format!(",state=\"{}\"", s.state), 1.0),
    );
    family(
        "calls_total",
        "counter",
        "Successful calls (ids in per-id mode, blocks in segment mode).",
        &|s| (String::new(), s.calls as f64),
    );
    family(
        "failovers_total",
        "counter",
        "Calls that failed on the server and moved on to another.",
        &|s| (String::new(), s.failovers as f64),
    );
    family(
        "latency_mean_seconds",
        "gauge",
        "Mean latency of the server's successful calls.",
        &|s| (String::new(), s.latency_mean_us / 1e6),
    );
    family(
        "latency_max_seconds",
        "gauge",
        "Largest latency of a successful call.",
        &|s| (String::new(), s.latency_max_us as f64 / 1e6),
    );
    family(
        "skipped_ids_total",
        "counter",
        "Ids reserved from the server and never handed out (a tail is skipped, never given back).",
        &|s| (String::new(), s.skipped_ids as f64),
    );
}
