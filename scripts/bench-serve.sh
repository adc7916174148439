#!/usr/bin/env bash
# Benchmarks `shardflake serve` (release build, embedded default: static node
# id, local state file) with the load generators on the same machine:
#   - wrk against /healthz: the HTTP stack's ceiling on this machine (baseline)
#   - wrk against /v1/id: single-id requests/s and p50/p99 latency
#   - wrk against /v1/ids?count=100000: batch ids/s (cap: 4.096 M/s for snowflake)
#   - examples/grpc_load (tonic client): NextId and NextIds
# Usage: scripts/bench-serve.sh [SECONDS] [CONNECTIONS]   (defaults 10, 32)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
conns=${2:-32}
target=${CARGO_TARGET_DIR:-target}
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }
cargo build --release -q -p shardflake-cli
cargo build --release -q -p shardflake-service --example grpc_load

dir=$(mktemp -d)
"$target/release/shardflake" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 --state-file "$dir/state" \
    >"$dir/out" 2>"$dir/err" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "bench-serve: $1; server stderr:" >&2; cat "$dir/err" >&2; exit 1; }
for _ in $(seq 100); do grep -q http= "$dir/out" 2>/dev/null && break; sleep 0.05; done
http=$(grep -o 'http=[^ ]*' "$dir/out" | cut -d= -f2) || fail "the server printed no address in 5 s"
grpc=$(grep -o 'grpc=[^ ]*' "$dir/out" | cut -d= -f2) || fail "the server printed no gRPC address"
ready=0
for _ in $(seq 100); do curl -sf "http://$http/readyz" >/dev/null && { ready=1; break; }; sleep 0.05; done
[ "$ready" = 1 ] || fail "the server was not ready within 5 s"

run_wrk() {  # name path
    local out rps p50 p99
    out=$(wrk -t1 -c"$conns" -d"${secs}s" --latency "http://$http$2")
    rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
    p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
    p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
    printf '%-28s %12s req/s   p50 %8s   p99 %8s\n' "$1" "$rps" "$p50" "$p99"
    echo "$rps" >"$dir/$1.rps"
}
echo "machine: $(nproc) cores, $(uname -r); load generator on the same machine; shared and noisy"
echo "wrk -t1 -c$conns -d${secs}s"
run_wrk healthz /healthz
run_wrk single-id /v1/id
ratio=$(awk -v a="$(cat "$dir/single-id.rps")" -v b="$(cat "$dir/healthz.rps")" 'BEGIN {printf "%.2f", a / b}')
echo "single-id / healthz ratio: $ratio"
out=$(wrk -t1 -c4 -d"${secs}s" "http://$http/v1/ids?count=100000")
rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
awk -v r="$rps" 'BEGIN {printf "%-28s %12.0f ids/s (%.1f%% of the 4,096,000 ids/s cap)\n", "batch 100000 (http, c4)", r * 100000, r * 100000 / 40960}'
echo -n "grpc NextId (c$conns):          "
"$target/release/examples/grpc_load" "$grpc" "$secs" "$conns" 1
echo -n "grpc NextIds 100000 (c4):     "
"$target/release/examples/grpc_load" "$grpc" "$secs" 4 100000

# Batches under single-id traffic: each batch's answer time alone (baseline)
# and while wrk keeps single ids flowing on 2 connections, with the single
# ids' latency meanwhile. A batch needs count / 4,096 ms of ticks.
batch_times() {  # count rounds -> median seconds
    for _ in $(seq "$2"); do
        curl -s -o /dev/null -w '%{time_total}\n' "http://$http/v1/ids?count=$1"
    done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
echo "batches: median answer time of 5, alone and under single-id traffic (wrk -t1 -c2 /v1/id)"
for count in 65536 1000000; do
    alone=$(batch_times "$count" 5)
    wrk -t1 -c2 -d"$((secs + 5))s" --latency "http://$http/v1/id" >"$dir/traffic.out" &
    wrk_pid=$!
    sleep 1
    loaded=$(batch_times "$count" 5)
    wait "$wrk_pid"
    p99=$(awk '$1 == "99%" {print $2}' "$dir/traffic.out")
    rps=$(awk '/Requests\/sec/ {print $2}' "$dir/traffic.out")
    awk -v c="$count" -v a="$alone" -v l="$loaded" -v p="$p99" -v r="$rps" 'BEGIN {
        printf "batch %-8d alone %6.0f ms   under %s single-id req/s %6.0f ms (%.2fx)   single-id p99 meanwhile %s\n",
            c, a * 1000, r, l * 1000, l / a, p }'
done
