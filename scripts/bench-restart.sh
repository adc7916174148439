#!/usr/bin/env bash
# Restart-to-ready (SIGTERM, then the same state file) of one static node and
# of one etcd node on a used prefix (its id has a high-water record), per
# binary, interleaved rounds:  scripts/bench-restart.sh [ROUNDS=5 env] BIN...
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-5}
out=$(bash scripts/etcd.sh start --members 3)
endpoints=$(sed -n 's/^ENDPOINTS=//p' <<<"$out")
edir=$(sed -n 's/^DIR=//p' <<<"$out")
trap 'bash scripts/etcd.sh stop "$edir" >/dev/null 2>&1 || true' EXIT
now_ms() { date +%s%3N; }
start_ready() {  # bin dir mode -> ms to ready
  local bin=$1 dir=$2 mode=$3 t0 pid
  local -a args=(--node-id 5)
  # A static node's first start: --resume-after now.
  [[ $mode == static && ! -s $dir/state ]] && args+=(--resume-after now)
  [[ $mode == etcd ]] && args=(--etcd "$endpoints" --etcd-prefix "/restart/$(basename "$dir")" --lease-ttl 10s --etcd-timeout 2s --window 6s)
  : >"$dir/log"
  t0=$(now_ms)
  "$bin" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 --state-file "$dir/state" "${args[@]}" >/dev/null 2>"$dir/log" </dev/null &
  pid=$!
  until grep -q ' ready ' "$dir/log"; do sleep 0.002; done
  echo $(( $(now_ms) - t0 ))
  kill -TERM $pid; wait $pid || true
}
printf '%-34s %6s %14s %14s\n' binary round static_restart etcd_restart
for ((r = 1; r <= rounds; r++)); do
  for bin in "$@"; do
    d=$(mktemp -d); e=$(mktemp -d)
    start_ready "$bin" "$d" static >/dev/null; start_ready "$bin" "$e" etcd >/dev/null
    printf '%-34s %6s %14s %14s\n' "$bin" "$r" "$(start_ready "$bin" "$d" static)" "$(start_ready "$bin" "$e" etcd)"
    rm -rf "$d" "$e"
    # Each round's etcd node is a new fleet on a prefix of its own: the
    # cluster registers fleets (shardflake.fleets/) and would refuse the
    # next round's as one that shares this one's ids.
    # (Both places: an earlier build under comparison registers at the old one.)
    for place in shardflake.fleets/ /shardflake.fleets/; do
      ETCDCTL_API=3 etcdctl --endpoints="$endpoints" del --prefix "$place" >/dev/null
    done
  done
done
