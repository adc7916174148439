#!/usr/bin/env bash
# What one node's start costs, with a static node id and with one leased
# from a 3-member etcd: N `shardflake serve` started one at a time (each
# ready before the next), so nothing races. Prints per node
#   - the node's own CPU until ready (all its threads, /proc/PID/task/*/schedstat),
#   - for etcd: the calls the members answered (their /metrics, gRPC
#     handled counts) and the raft proposals committed (the leader's count),
#   - the etcd members' CPU, less what the idle cluster burns in the same
#     time (its heartbeats; measured first).
#
#   scripts/bench-etcd-cost.sh [--nodes N] [BIN]
#
# BIN defaults to target/release/shardflake (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/bench-cluster.sh
bench_node_args 50 "$@"
bench_cluster bench-etcd-cost

# Sums, over the members, the /metrics samples whose line matches $1.
metric_sum() {
    local f url total=0 v
    for f in "$etcd_dir"/m*.args; do
        url=$(grep -A1 -- '--listen-metrics-urls' "$f" | tail -1)
        v=$(curl -s --max-time 2 "$url/metrics" | grep -E "$1" | awk '{ s += $NF } END { printf "%d", s }')
        total=$((total + v))
    done
    echo "$total"
}
calls() { metric_sum "^grpc_server_handled_total\\{.*grpc_method=\"$1\""; }
# Every member counts each committed proposal; the leader's count is the max.
proposals() {
    local f url best=0 v
    for f in "$etcd_dir"/m*.args; do
        url=$(grep -A1 -- '--listen-metrics-urls' "$f" | tail -1)
        v=$(curl -s --max-time 2 "$url/metrics" | awk '/^etcd_server_proposals_committed_total/ { print $NF }')
        [[ ${v%.*} -gt $best ]] && best=${v%.*}
    done
    echo "$best"
}

# The idle cluster's CPU per wall ms.
c0=$(etcd_cpu_ms) t0=$(now_ms)
sleep 3
idle=$(awk -v c=$(( $(etcd_cpu_ms) - c0 )) -v t=$(( $(now_ms) - t0 )) 'BEGIN { printf "%.4f", c / t }')
echo "idle cluster: $idle ms of etcd CPU per ms (3 members, heartbeat 10 ms)"

for mode in static etcd; do
    dir=$(mktemp -d "$work/$mode.XXXXXX")
    prefix="/cost/$RANDOM$RANDOM"
    declare -A before=()
    for m in LeaseGrant Range Txn; do before[$m]=$(calls "$m"); done
    p0=$(proposals) c0=$(etcd_cpu_ms) t0=$(now_ms)
    node_ns=0
    for ((i = 0; i < nodes; i++)); do
        args=(--node-id "$i")
        [[ $mode == etcd ]] && args=(--etcd "$endpoints" --etcd-prefix "$prefix" --lease-ttl 10s
                                     --etcd-timeout 2s --window 6s)
        RUST_LOG=info "$bin" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
            --state-file "$dir/state.$i" "${args[@]}" >/dev/null 2>"$dir/log.$i" </dev/null &
        pid=$!
        pids+=("$pid")
        deadline=$((SECONDS + 30))
        until grep -q ' ready ' "$dir/log.$i" 2>/dev/null; do
            [[ $SECONDS -lt $deadline ]] || { echo "node $i not ready" >&2; tail -3 "$dir/log.$i" >&2; exit 1; }
            sleep 0.001
        done
        for t in /proc/"$pid"/task/*/schedstat; do
            node_ns=$((node_ns + $(awk '{ print $1 }' "$t" 2>/dev/null || echo 0)))
        done
    done
    c1=$(etcd_cpu_ms) t1=$(now_ms) p1=$(proposals)
    line=$(awk -v ns="$node_ns" -v n="$nodes" -v c=$((c1 - c0)) -v t=$((t1 - t0)) -v i="$idle" \
        'BEGIN { printf "node CPU until ready %.1f ms; etcd CPU %.1f ms (less idle)", ns / n / 1e6, (c - i * t) / n }')
    if [[ $mode == etcd ]]; then
        per=""
        for m in LeaseGrant Range Txn; do
            per+=" $m $(awk -v d=$(( $(calls "$m") - before[$m] )) -v n="$nodes" 'BEGIN { printf "%.2f", d / n }')"
        done
        line+="; calls:$per; proposals $(awk -v d=$((p1 - p0)) -v n="$nodes" 'BEGIN { printf "%.2f", d / n }')"
    fi
    printf '%-6s %d one at a time, per node: %s\n' "$mode" "$nodes" "$line"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    pids=()
done
