#!/usr/bin/env bash
# How long N `shardflake serve` processes started together take to be ready:
# with static node ids, and leasing their ids from a 3-member etcd. Both in
# one run, on the same cluster, so the ratio holds on a noisy machine.
#
#   scripts/bench-nodes.sh [--nodes N] [--rounds R] [BIN...]
#
# BIN defaults to target/release/shardflake (built first). Give several
# binaries (e.g. an older build) to compare them round by round. Ready means
# the process logged `ready ... node_id=K`; the etcd trial also checks that
# the N node ids are distinct.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=100 rounds=3
bins=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --nodes) nodes="$2"; shift 2 ;;
        --rounds) rounds="$2"; shift 2 ;;
        *) bins+=("$1"); shift ;;
    esac
done
if [[ ${#bins[@]} -eq 0 ]]; then
    cargo build --release -q -p shardflake-cli
    bins=(target/release/shardflake)
fi

source scripts/bench-cluster.sh
bench_cluster bench-nodes

# The cluster's raft term: a trial that moves it held an election (a member
# starved of CPU long enough to miss the leader's heartbeats).
raft_term() {
    ETCDCTL_API=3 etcdctl --endpoints="$endpoints" --command-timeout=5s \
        endpoint status -w json 2>/dev/null |
        grep -o '"raft_term":[0-9]*' | cut -d: -f2 | sort -n | tail -1
}

# trial BIN MODE: starts N nodes, prints the ms until all are ready.
trial() {
    local bin=$1 mode=$2 dir i started took distinct
    dir=$(mktemp -d "$work/trial.XXXXXX")
    local prefix="/bench/$RANDOM$RANDOM"
    started=$(now_ms)
    for ((i = 0; i < nodes; i++)); do start_node "$bin" "$mode" "$i" "$dir" "$prefix"; done
    wait_ready "$dir" "$nodes"
    took=$(( $(now_ms) - started ))
    distinct=$(cat "$dir"/log.* | sed -n 's/.* ready .*node_id=\([0-9]*\).*/\1/p' | sort -u | wc -l)
    if [[ $distinct -ne $nodes ]]; then
        echo "bench-nodes: $distinct distinct node ids among $nodes nodes ($bin, $mode)" >&2
        exit 1
    fi
    stop_nodes
    rm -rf "$dir"
    echo "$took"
}

printf '%-40s %6s %10s %10s %7s %9s %12s\n' binary round static_ms etcd_ms ratio elections etcd_cpu_ms
for ((r = 1; r <= rounds; r++)); do
    for bin in "${bins[@]}"; do
        s=$(trial "$bin" static)
        t0=$(raft_term) c0=$(etcd_cpu_ms)
        e=$(trial "$bin" etcd)
        c1=$(etcd_cpu_ms) t1=$(raft_term)
        printf '%-40s %6s %10s %10s %7s %9s %12s\n' "$bin" "$r" "$s" "$e" \
            "$(awk -v e="$e" -v s="$s" 'BEGIN { printf "%.2f", e / s }')" \
            "$(( ${t1:-0} - ${t0:-0} ))" "$((c1 - c0))"
    done
done
