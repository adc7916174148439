#!/usr/bin/env bash
# Where a node's start goes: for each `shardflake serve`, the time from its
# spawn to its `ready` line, with static node ids and with ids leased from a
# 3-member etcd; N started together, then 20 one at a time. For the etcd
# herd it also counts the races each take lost (the registry's debug line
# `took a node id lost_races=K`).
#
#   scripts/bench-node-latency.sh [--nodes N] [BIN]
#
# BIN defaults to target/release/shardflake (built first). Prints per
# run: how long the spawning took, first spawn to last ready, and the
# per-node spawn-to-ready p10/p50/p90/max.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/bench-cluster.sh
bench_node_args 100 "$@"
bench_cluster bench-latency

# Lines "SPAWN_EPOCH_S READY_LOG_TIMESTAMP" on stdin -> one summary line.
summary() {
    python3 -c '
import sys, datetime
rows = []
for line in sys.stdin:
    spawn, ready = line.split()
    ready = datetime.datetime.fromisoformat(ready.rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()
    rows.append((float(spawn), ready))
lat = sorted((r - s) * 1000 for s, r in rows)
q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
spawns = [s for s, _ in rows]
print("spawning %4.0f ms, first spawn to last ready %4.0f ms, per node p10 %5.1f p50 %5.1f p90 %5.1f max %5.1f ms" % (
    (max(spawns) - min(spawns)) * 1000, (max(r for _, r in rows) - min(spawns)) * 1000,
    q(.1), q(.5), q(.9), lat[-1]))'
}

# node MODE I DIR PREFIX: starts node I, its spawn time in DIR/spawn.I.
node() {
    echo "$EPOCHREALTIME" >"$3/spawn.$2"
    start_node "$bin" "$@"
}

report() {  # DIR COUNT
    local i
    for ((i = 0; i < $2; i++)); do
        echo "$(cat "$1/spawn.$i") $(sed -n 's/^\([^ ]*\) .* ready .*/\1/p' "$1/log.$i" | head -1)"
    done | summary
}

for mode in static etcd; do
    dir=$(mktemp -d "$work/together.XXXXXX")
    # One prefix for the whole herd: its nodes race for the same ids.
    prefix="/latency/$RANDOM$RANDOM"
    for ((i = 0; i < nodes; i++)); do node "$mode" "$i" "$dir" "$prefix"; done
    wait_ready "$dir" "$nodes"
    printf '%-6s %4d together:   %s\n' "$mode" "$nodes" "$(report "$dir" "$nodes")"
    if [[ $mode == etcd ]]; then
        printf '       lost races per take (races: nodes): %s\n' "$(cat "$dir"/log.* |
            sed -n 's/.*lost_races=\([0-9]*\).*/\1/p' | sort -n | uniq -c |
            awk '{ printf "%s%s: %s", (NR > 1 ? ", " : ""), $2, $1 }')"
    fi
    stop_nodes
done
alone_prefix="/latency/$RANDOM$RANDOM"
for mode in static etcd; do
    dir=$(mktemp -d "$work/alone.XXXXXX")
    for ((i = 0; i < 20; i++)); do
        node "$mode" "$i" "$dir" "$alone_prefix"
        wait_ready "$dir" $((i + 1))
        stop_nodes
    done
    printf '%-6s   20 one at a time: %s\n' "$mode" "$(report "$dir" 20)"
done
