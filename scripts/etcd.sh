#!/usr/bin/env bash
# Starts and stops throw-away etcd clusters on 127.0.0.1 for tests and benchmarks.
#
#   scripts/etcd.sh start [--members N] [--dir DIR]   start N members (default 1) on free ports;
#         [--cert F --key F --ca F]                   prints DIR=... and ENDPOINTS=http://...,...
#         [--client-cert-auth]                        With --cert/--key/--ca the client URLs are
#                                                     https:// (members verify nothing unless
#                                                     --client-cert-auth: then clients need a
#                                                     certificate signed by --ca).
#         [--jwt]                                     Auth tokens are JWTs (as etcd's guide
#                                                     advises for production) instead of simple
#                                                     tokens, signed with an ES256 key pair made
#                                                     with openssl in DIR.
#   scripts/etcd.sh stop DIR                          stop every member, remove DIR
#   scripts/etcd.sh kill DIR I                        SIGKILL member I (0-based)
#   scripts/etcd.sh restart DIR I                     start member I again (same ports, same data)
#   scripts/etcd.sh leader DIR                        print the index of the leader (plain http)
#
# Members use the fast test flags measured in shared/notes/INFRA.md
# (--heartbeat-interval 10 --election-timeout 100 --unsafe-no-fsync): a member
# starts in ~0.2 s and a 3-member cluster re-elects in a few seconds.
# Readiness is read from each member's plain-http metrics port (/health), so
# it works the same with TLS and client-certificate authentication.
# etcd (Debian's etcd-server 3.4) is installed with apt-get when missing.
set -euo pipefail

die() { echo "etcd.sh: $*" >&2; exit 1; }

ensure_etcd() {
    command -v etcd >/dev/null && return
    echo "etcd.sh: installing etcd-server etcd-client" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends etcd-server etcd-client >&2
}

ensure_openssl() {
    command -v openssl >/dev/null && return
    echo "etcd.sh: installing openssl" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends openssl >&2
}

port_free() {
    ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

declare -A USED=()
PORT=0
free_port() {  # sets PORT (no subshell, so USED remembers every pick)
    local p
    for _ in $(seq 1 200); do
        # Below the ephemeral range (32768-60999 here): a port picked there
        # can be taken by any outgoing connection before etcd binds it.
        p=$(( (RANDOM << 15 | RANDOM) % 22000 + 10000 ))
        if [[ -z "${USED[$p]:-}" ]] && port_free "$p"; then
            USED[$p]=1
            PORT=$p
            return
        fi
    done
    die "no free port found"
}

alive() {  # pid: running and not a zombie
    [[ -r /proc/$1/status ]] && ! grep -q '^State:.*Z' "/proc/$1/status"
}

launch() {  # dir i: start member i from its saved flags, appending to its log
    local dir="$1" i="$2" args
    mapfile -t args <"$dir/m$i.args"
    setsid etcd "${args[@]}" >>"$dir/m$i.log" 2>&1 </dev/null &
    echo $! >"$dir/m$i.pid"
}

cmd_start() {
    local members=1 dir="" cert="" key="" ca="" client_cert_auth=0
    local jwt=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --members) members="$2"; shift 2 ;;
            --dir) dir="$2"; shift 2 ;;
            --cert) cert="$2"; shift 2 ;;
            --key) key="$2"; shift 2 ;;
            --ca) ca="$2"; shift 2 ;;
            --client-cert-auth) client_cert_auth=1; shift ;;
            --jwt) jwt=1; shift ;;
            *) die "unknown option $1" ;;
        esac
    done
    local scheme=http
    local -a tls=()
    if [[ -n "$cert$key$ca" ]]; then
        [[ -n "$cert" && -n "$key" && -n "$ca" ]] || die "--cert, --key and --ca come together"
        scheme=https
        tls=(--cert-file "$cert" --key-file "$key" --trusted-ca-file "$ca")
        [[ $client_cert_auth -eq 0 ]] || tls+=(--client-cert-auth)
    elif [[ $client_cert_auth -eq 1 ]]; then
        die "--client-cert-auth needs --cert, --key and --ca"
    fi
    ensure_etcd
    [[ -n "$dir" ]] || dir=$(mktemp -d /tmp/shardflake-etcd.XXXXXX)
    mkdir -p "$dir"
    local -a auth_token=()
    if [[ $jwt -eq 1 ]]; then
        ensure_openssl
        openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/jwt.key" 2>/dev/null
        openssl pkey -in "$dir/jwt.key" -pubout -out "$dir/jwt.pub" 2>/dev/null
        auth_token=(--auth-token "jwt,priv-key=$dir/jwt.key,pub-key=$dir/jwt.pub,sign-method=ES256")
    fi
    local cluster="" endpoints="" i token="shardflake-$$-$RANDOM"
    local -a cps pps mps
    for ((i = 0; i < members; i++)); do
        free_port; cps[i]=$PORT
        free_port; pps[i]=$PORT
        free_port; mps[i]=$PORT
        cluster+="${cluster:+,}m$i=http://127.0.0.1:${pps[i]}"
        endpoints+="${endpoints:+,}$scheme://127.0.0.1:${cps[i]}"
    done
    for ((i = 0; i < members; i++)); do
        # The member's flags, one a line, so `restart` starts it the same way.
        printf '%s\n' --name "m$i" --data-dir "$dir/m$i" \
            --listen-client-urls "$scheme://127.0.0.1:${cps[i]}" \
            --advertise-client-urls "$scheme://127.0.0.1:${cps[i]}" \
            --listen-metrics-urls "http://127.0.0.1:${mps[i]}" \
            "${tls[@]}" "${auth_token[@]}" \
            --listen-peer-urls "http://127.0.0.1:${pps[i]}" \
            --initial-advertise-peer-urls "http://127.0.0.1:${pps[i]}" \
            --initial-cluster "$cluster" --initial-cluster-state new \
            --initial-cluster-token "$token" \
            --heartbeat-interval 10 --election-timeout 100 --unsafe-no-fsync \
            --logger zap --log-level warn >"$dir/m$i.args"
        launch "$dir" "$i"
        echo "$scheme://127.0.0.1:${cps[i]}" >"$dir/m$i.endpoint"
    done
    echo "$endpoints" >"$dir/endpoints"
    trap 'cmd_stop "$dir"' ERR EXIT
    # Ready when every member reports a leader (bounded wait).
    local deadline=$((SECONDS + 30)) ok
    while :; do
        ok=0
        for ((i = 0; i < members; i++)); do
            alive "$(cat "$dir/m$i.pid")" || { cat "$dir/m$i.log" >&2; die "member m$i exited"; }
            if port_free "${mps[i]}"; then continue; fi
            if curl -s --max-time 1 "http://127.0.0.1:${mps[i]}/health" | grep -q '"health":"true"'; then
                ok=$((ok + 1))
            fi
        done
        [[ $ok -eq $members ]] && break
        [[ $SECONDS -lt $deadline ]] || die "cluster in $dir not healthy after 30 s"
        sleep 0.1
    done
    trap - ERR EXIT
    echo "DIR=$dir"
    echo "ENDPOINTS=$endpoints"
}

cmd_stop() {
    local dir="${1:?usage: etcd.sh stop DIR}" f pid
    [[ -d "$dir" ]] || return 0
    for f in "$dir"/m*.pid; do
        [[ -e "$f" ]] || continue
        pid=$(cat "$f")
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
}

cmd_kill() {
    local dir="${1:?usage: etcd.sh kill DIR I}" i="${2:?member index}"
    kill -KILL "$(cat "$dir/m$i.pid")"
}

cmd_restart() {
    local dir="${1:?usage: etcd.sh restart DIR I}" i="${2:?member index}"
    ! alive "$(cat "$dir/m$i.pid")" || die "member m$i is still running"
    launch "$dir" "$i"
}

cmd_leader() {
    local dir="${1:?usage: etcd.sh leader DIR}" f i status leader member
    for f in "$dir"/m*.endpoint; do
        i=${f##*/m}; i=${i%.endpoint}
        alive "$(cat "$dir/m$i.pid")" || continue
        status=$(curl -s --max-time 1 -X POST -d '{}' "$(cat "$f")/v3/maintenance/status") || continue
        leader=$(grep -o '"leader":"[0-9]*"' <<<"$status" | grep -o '[0-9]*') || continue
        member=$(grep -o '"member_id":"[0-9]*"' <<<"$status" | grep -o '[0-9]*') || continue
        if [[ "$leader" == "$member" ]]; then echo "$i"; return; fi
    done
    die "no leader found"
}

case "${1:-}" in
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    kill) shift; cmd_kill "$@" ;;
    restart) shift; cmd_restart "$@" ;;
    leader) shift; cmd_leader "$@" ;;
    *) sed -n '2,/^set -e/{/^set -e/d;p}' "$0"; exit 2 ;;
esac
