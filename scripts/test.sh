#!/usr/bin/env bash
# Runs every check and test on a fresh machine; .ci/run calls exactly this.
# Installs the real servers the integration tests start (PostgreSQL, MariaDB,
# etcd, libfaketime, wrk); each test starts its own on 127.0.0.1 under a
# temporary directory and stops it afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*" >&2; }

step "install servers and tools"
bash scripts/install-deps.sh

step "format"
cargo fmt --all --check

# Clippy lints our crates while the test build compiles them: clippy-driver
# wraps rustc for workspace members only, so the dependencies are compiled
# once, for the tests, instead of once more in check mode for a separate
# `cargo clippy` (measured in docs/BENCHMARKS.md, "What the test build
# costs"). Each workspace cargo command below runs with the same
# settings, so each reuses what the one before built. `-D warnings` reaches
# only our crates (cargo caps lints of dependencies). Not exported: fuzz.sh
# builds with nightly and flags of its own. No incremental state: CI
# builds from scratch, where it is written and never read.
linted() {
  RUSTC_WORKSPACE_WRAPPER=clippy-driver RUSTFLAGS="-D warnings" CARGO_INCREMENTAL=0 "$@"
}

step "tests (clippy -D warnings on every crate, test and example as they build)"
if cargo nextest --version >/dev/null 2>&1; then
  linted cargo nextest run --workspace --no-fail-fast
else
  linted cargo test --workspace --no-fail-fast --lib --bins --tests
fi

step "clippy on the benchmarks (built, not run)"
linted cargo test --workspace --benches --no-run

step "binaries for the runs below"
# With --tests, cargo resolves features as the test build above did, so
# this reuses it (a `-p` build of one binary would recompile most of the
# dependency tree with other features).
linted cargo build --workspace --bins --tests
bin=target/debug/shardflake
chaos=target/debug/shardflake-chaos

step "fuzz smoke (every cargo-fuzz target 3 s, unoptimised build; nightly and cargo-fuzz installed if missing)"
# Long runs and their figures: docs/RELIABILITY.md. A crash leaves its
# input in fuzz/artifacts/<target>/. Unoptimised: the smoke replays every
# committed corpus and fuzzes a little; the optimised build cost 67 s more
# to build here (112 s against 179 s) for 3 s of running.
FUZZ_DEV=1 bash scripts/fuzz.sh 3

step "API fuzz smoke (schemathesis from /openapi.json, 20 s, seed 2, ticket sequences on MariaDB)"
SHARDFLAKE_BIN=$bin SEED=2 API_FUZZ_TICKETS=mariadb bash scripts/api-fuzz.sh 20

step "chaos run (60 s, faults on a schedule, every id checked; etcd with authentication, an auth change among the faults)"
# Seeded, so a failure replays with the same schedule:
# scripts/chaos.sh 60 --seed 1 --etcd-auth --spacing 7 (seven kinds of
# fault, each once; without --etcd-auth the nodes do not log in, which the
# integration tests cover).
SHARDFLAKE_BIN=$bin CHAOS_BIN=$chaos bash scripts/chaos.sh 60 --seed 1 --etcd-auth --spacing 7

step "chaos run on in-database ids (20 s, MariaDB: a dump restored under writers, a dump restored while no clock loop runs, then mysql repair)"
# The same checker over ids made by MariaDB's trigger (shardflake mysql apply).
# The kinds are drawn at random from the seed; seed 42 draws those two
# (kills and clock steps are covered by the integration tests and the
# 300 s run). The kinds are named, as the tool's default has them, so that
# a kind added later does not change this draw.
$chaos db --seconds 20 --seed 42 --spacing 6 --kinds kill,kill,clock-back,restore-stopped,restore-live,restore-no-loop --bin $bin
step "chaos run on PostgreSQL in-database ids (30 s: two moves at once, move-shard stopped after its fence or killed, a crash, a restore, edited and older files)"
# The kinds are drawn at random from the seed; seed 77 draws two moves at
# once, move-shard stopped after its fence, one SIGKILLed, a crash after
# synchronous_commit = off was reported by check and put back, another
# schema prefix in the file, a restore under the writers, an apply from
# an older file (repair during a move: seed 14). The kinds are named, in
# the tool's order, so that a kind added later does not change this draw.
pg_kinds=move-stopped,move-killed,older-file-apply,edit-owner,edit-prefix,edit-count,edit-epoch,edit-url,restore-stopped,restore-live,repair-during-move,two-moves,crash
$chaos db-pg --seconds 30 --seed 77 --spacing 3 --clients 4 --kinds $pg_kinds --bin $bin

step "chaos runs on adoption (20 s each: pg adopt and mysql adopt of a populated table under writers; adopt killed, the pre-adoption dump restored, the default put back by hand)"
# Every kind the tool draws, named so that a kind added later does not
# change this draw; seed 3 draws the default put back and the restore.
$chaos db-adopt --seconds 20 --seed 3 --clients 4 --spacing 4 --kinds adopt-killed,restore-predump,default-back --bin $bin
# The same on MariaDB (mysql adopt of an AUTO_INCREMENT table); seed 1 at
# spacing 3 draws each kind once: the trigger dropped and AUTO_INCREMENT
# set back, adopt SIGKILLed 1.7 s in and run again, the restore.
$chaos db-adopt --backend mariadb --seconds 20 --seed 1 --clients 4 --spacing 3 --kinds adopt-killed,restore-predump,default-back --bin $bin

step "chaos runs on ticket servers (20 s each: a MariaDB pair under an operator's faults drawn at random)"
# Every kind the tool draws, named in its order so that a kind added later
# does not change this draw. A live load that a client's ticket aborts
# halfway (1062 on the per-id table's stub, between the dump's CREATE
# TABLE and its rows) is loaded again, as an operator would.
tickets_kinds=kill,stop,restore-live,restore-stopped,lowered,skip-triggers,peer-down,peer-backup,edited-file,replaced-new-name,reshape,failover
$chaos tickets --seconds 20 --seed 7 --clients 4 --mode segment --spacing 4 --kinds $tickets_kinds --bin $bin
$chaos tickets --seconds 20 --seed 8 --clients 4 --mode per-id --spacing 4 --kinds $tickets_kinds --bin $bin

step "compare smoke (every id scheme on real PostgreSQL and MariaDB, 2,000 rows each; SIGINT mid-run)"
SHARDFLAKE_BIN=$bin bash scripts/compare-smoke.sh 2000

step "doc tests"
linted cargo test --workspace --doc

step "docs build without warnings"
RUSTDOCFLAGS="-D warnings" linted cargo doc --workspace --no-deps

step "model check (loom)"
# A build of its own: --cfg loom swaps the generator's atomics for loom's.
# The check is a crate of its own, so this build compiles the core and loom
# only (within the core's `it` tests it also compiled criterion, proptest
# and the peer generators; docs/BENCHMARKS.md, "What the test build costs").
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p shardflake-loom --release

step "all passed"
