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

# `start_node BIN MODE I DIR PREFIX`: starts `shardflake serve` node I in
# the background, with node id I (MODE static) or an id leased from the
# cluster under PREFIX (MODE etcd); its log (with the registry's debug line,
# the races its take lost) in DIR/log.I, its pid added to `pids`.
start_node() {
    local bin=$1 mode=$2 i=$3 dir=$4 prefix=$5
    local -a args=(--node-id "$i")
    # A static node's first start: --resume-after now.
    [[ $mode == static && ! -s $dir/state.$i ]] && args+=(--resume-after now)
    [[ $mode == etcd ]] && args=(--etcd "$endpoints" --etcd-prefix "$prefix" --lease-ttl 10s
                                 --etcd-timeout 2s --window 6s)
    RUST_LOG=info,shardflake_service::registry=debug "$bin" serve --http 127.0.0.1:0 \
        --grpc 127.0.0.1:0 --state-file "$dir/state.$i" "${args[@]}" \
        >/dev/null 2>"$dir/log.$i" </dev/null &
    pids+=($!)
}

# `wait_ready DIR COUNT`: until COUNT logs in DIR say ready (60 s at most,
# then the script fails).
wait_ready() {
    local dir=$1 count=$2 deadline=$((SECONDS + 60)) ready
    while :; do
        ready=$(cat "$dir"/log.* | grep -c ' ready ' || true)
        [[ $ready -ge $count ]] && return
        if [[ $SECONDS -ge $deadline ]]; then
            echo "$0: only $ready of $count nodes ready after 60 s" >&2
            tail -n 3 "$dir"/log.* >&2
            exit 1
        fi
        sleep 0.002
    done
}

# `stop_nodes`: SIGTERM to every node in `pids` (they give their leases
# back), and waits for them. Each trial is a new fleet on its own prefix of
# one cluster, which registers every fleet (shardflake.fleets/) and
# refuses a second of the same layout: the stopped fleet's registration
# goes with it.
stop_nodes() {
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    pids=()
    forget_fleets
}

# `forget_fleets`: deletes every fleet's registration in the cluster.
forget_fleets() {
    local place
    for place in shardflake.fleets/ /shardflake.fleets/; do
        ETCDCTL_API=3 etcdctl --endpoints="$endpoints" --command-timeout=5s \
            del --prefix "$place" >/dev/null
    done
}
