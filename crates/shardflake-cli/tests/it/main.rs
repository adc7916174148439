//! The `shardflake` binary's integration tests, one binary: the CLI itself,
//! and `shardflake serve` where a test needs a process (signals, libfaketime,
//! etcd member kills, restarts on one state file). Servers and clients come
//! from `shardflake-testkit`.

mod backfill;
mod cli;
mod client;
mod docs;
mod holder_watch;
mod mysql_cli;
mod node_options;
mod pg_cli;
mod serve_api;
mod serve_clock;
mod serve_etcd;
mod serve_operator;
mod serve_uniqueness;
mod tickets_lifetime;
mod tickets_stores;

/// The `shardflake` binary cargo built for these tests.
pub fn shardflake_bin() -> &'static str {
    env!("CARGO_BIN_EXE_shardflake")
}
