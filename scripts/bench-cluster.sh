# Sourced by the bench scripts (bench-nodes.sh, bench-node-latency.sh,
# bench-etcd-cost.sh):
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
