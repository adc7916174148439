#!/usr/bin/env bash
# Benchmarks shardflake-client (crates/shardflake-client/examples/bench_client.rs)
# against two release `shardflake serve` nodes (static node ids 1 and 2, local
# state files) on this machine:
#   - sustained ids/s through a prefetching client (one fetcher per node) vs
#     the batch endpoint driven directly and the combined cap (2 x 4,096,000
#     ids/s for `snowflake`), HTTP and gRPC
#   - ns per id handed out from the buffer (tight loop over fetched ids)
#   - single-id latency without prefetch, HTTP and gRPC
# Usage: scripts/bench-client.sh [SECONDS] [BATCH]   (defaults 5, 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
batch=${2:-100000}
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p shardflake-cli
cargo build --release -q -p shardflake-client --example bench_client

dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
http=() grpc=()
for n in 1 2; do
    # A static node's first start: --resume-after now.
    "$target/release/shardflake" serve --node-id "$n" --resume-after now \
        --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
        --state-file "$dir/state$n" >"$dir/out$n" 2>"$dir/err$n" &
    pids+=($!)
done
for n in 1 2; do
    for _ in $(seq 200); do grep -q http= "$dir/out$n" 2>/dev/null && break; sleep 0.05; done
    h=$(grep -o 'http=[^ ]*' "$dir/out$n" | cut -d= -f2) || { cat "$dir/err$n" >&2; exit 1; }
    g=$(grep -o 'grpc=[^ ]*' "$dir/out$n" | cut -d= -f2)
    ready=0
    for _ in $(seq 200); do curl -sf "http://$h/readyz" >/dev/null && { ready=1; break; }; sleep 0.05; done
    [ "$ready" = 1 ] || { echo "node $n not ready" >&2; cat "$dir/err$n" >&2; exit 1; }
    http+=("$h") grpc+=("$g")
done
echo "machine: $(nproc) cores, $(uname -r); servers and client on the same machine; load average $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=,
"$target/release/examples/bench_client" --http "${http[*]}" --grpc "${grpc[*]}" --secs "$secs" --batch "$batch"
