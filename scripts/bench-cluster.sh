# Sourced by the bench scripts (bench-nodes.sh, bench-node-latency.sh,
# bench-etcd-cost.sh).
#
# `bench_cluster NAME` makes a work folder and starts a 3-member etcd; on
# exit every process in `pids` is killed, the cluster stopped and the folder
# removed. Sets `work`, `etcd_dir`, `endpoints` and `pids`.
bench_cluster() {
    work=$(mktemp -d "/tmp/shardflake-$1.XXXXXX")
    etcd_dir=""
    pids=()
    trap bench_cleanup EXIT
    local out
    out=$(bash scripts/etcd.sh start --members 3)
    etcd_dir=$(sed -n 's/^DIR=//p' <<<"$out")
    endpoints=$(sed -n 's/^ENDPOINTS=//p' <<<"$out")
}

bench_cleanup() {
    [[ ${#pids[@]} -gt 0 ]] && kill -9 "${pids[@]}" 2>/dev/null || true
    [[ -n "$etcd_dir" ]] && bash scripts/etcd.sh stop "$etcd_dir" >/dev/null 2>&1 || true
    rm -rf "$work"
}

# `bench_node_args DEFAULT_N "$@"`: parses `[--nodes N] [BIN]` into `nodes`
# and `bin` (target/release/shardflake, built now, when no BIN is given).
bench_node_args() {
    nodes=$1 bin=""
    shift
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --nodes) nodes="$2"; shift 2 ;;
            *) bin="$1"; shift ;;
        esac
    done
    if [[ -z "$bin" ]]; then
        cargo build --release -q -p shardflake-cli
        bin=target/release/shardflake
    fi
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# CPU time (ms) the etcd members have used so far, all together.
etcd_cpu_ms() {
    local f total=0 tck
    tck=$(getconf CLK_TCK)
    for f in "$etcd_dir"/m*.pid; do
        # Fields 14 and 15 of /proc/PID/stat: user and system time in ticks.
        total=$((total + $(awk '{ print $14 + $15 }' "/proc/$(cat "$f")/stat")))
    done
    echo $((total * 1000 / tck))
}
