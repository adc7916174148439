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
# BIN defaults to target/release/shardflake (built first).
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/bench-cluster.sh
bench_node_args 50 "$@"
bench_cluster bench-etcd-cost

# "GRANTS RANGES TXNS PROPOSALS": the calls the members have answered so
# far (summed) and the raft proposals committed (every member counts each
# one: the leader's count, the largest); one /metrics read per member.
etcd_counts() {
    local f
    for f in "$etcd_dir"/m*.args; do
        curl -s --max-time 2 "$(grep -A1 -- '--listen-metrics-urls' "$f" | tail -1)/metrics"
    done | awk '
        BEGIN { split("LeaseGrant Range Txn", method) }
        /^grpc_server_handled_total\{/ {
            for (m in method) if (index($0, "grpc_method=\"" method[m] "\"")) n[m] += $NF
        }
        /^etcd_server_proposals_committed_total / { if ($NF + 0 > p) p = $NF + 0 }
        END { printf "%d %d %d %d\n", n[1], n[2], n[3], p }'
}

# The idle cluster's CPU per wall ms.
c0=$(etcd_cpu_ms) t0=$(now_ms)
sleep 3
idle=$(awk -v c=$(( $(etcd_cpu_ms) - c0 )) -v t=$(( $(now_ms) - t0 )) 'BEGIN { printf "%.4f", c / t }')
echo "idle cluster: $idle ms of etcd CPU per ms (3 members, heartbeat 10 ms)"

for mode in static etcd; do
    dir=$(mktemp -d "$work/$mode.XXXXXX")
    prefix="/cost/$RANDOM$RANDOM"
    read -r g0 r0 x0 p0 <<<"$(etcd_counts)"
    c0=$(etcd_cpu_ms) t0=$(now_ms)
    node_ns=0
    for ((i = 0; i < nodes; i++)); do
        start_node "$bin" "$mode" "$i" "$dir" "$prefix"
        wait_ready "$dir" $((i + 1))
        # Its threads' time on CPU so far (first field of each schedstat).
        for t in /proc/"${pids[-1]}"/task/*/schedstat; do
            node_ns=$((node_ns + $(awk '{ print $1 }' "$t" 2>/dev/null || echo 0)))
        done
    done
    c1=$(etcd_cpu_ms) t1=$(now_ms)
    read -r g1 r1 x1 p1 <<<"$(etcd_counts)"
    line=$(awk -v ns="$node_ns" -v n="$nodes" -v c=$((c1 - c0)) -v t=$((t1 - t0)) -v i="$idle" \
        'BEGIN { printf "node CPU until ready %.1f ms; etcd CPU %.1f ms (less idle)", ns / n / 1e6, (c - i * t) / n }')
    if [[ $mode == etcd ]]; then
        line+=$(awk -v n="$nodes" -v g=$((g1 - g0)) -v r=$((r1 - r0)) -v x=$((x1 - x0)) -v p=$((p1 - p0)) \
            'BEGIN { printf "; calls: LeaseGrant %.2f Range %.2f Txn %.2f; proposals %.2f", g / n, r / n, x / n, p / n }')
    fi
    printf '%-6s %d one at a time, per node: %s\n' "$mode" "$nodes" "$line"
    stop_nodes
done
