#!/usr/bin/env bash
# A fault-injection run: `shardflake-chaos run` against a 3-member etcd and
# `shardflake serve` nodes on 127.0.0.1 (one node in a network namespace on
# 10.213.x.0 addresses it creates), with the seeded schedule of faults and
# the independent checker (crates/shardflake-chaos). Exits non-zero on any
# duplicate, order violation, lead over 1 s, or a node that never came back.
#
#   scripts/chaos.sh SECONDS [shardflake-chaos run args: --seed S --nodes N --batch B --out DIR ...]
#
# Builds the binaries (shardflake, shardflake-chaos) first, in the release
# profile, or the one CHAOS_PROFILE names (test.sh uses `dev`: a release
# build would double CI's compile time; the checks are the same, only fewer
# ids are issued). SHARDFLAKE_BIN and CHAOS_BIN, both set, name binaries
# built already (test.sh: the tests' own build) and skip the build. Whatever
# happens, every process it started and every temporary directory is removed
# on exit (a trap): leftover pids under the run directory are SIGKILLed and
# the run's network namespace deleted. Needs root for the namespace; pass
# --no-netns to run without it (and without the cut-from-etcd fault).
# --etcd-auth runs etcd with authentication and JWT tokens, the nodes logging
# in, and adds the etcd-auth-change fault (a role added: every token voided).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:?usage: scripts/chaos.sh SECONDS [args]}"
shift
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "chaos.sh: SECONDS must be a number" >&2; exit 2; }

if ! compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || ! command -v etcd >/dev/null; then
    bash scripts/install-deps.sh
fi
# Two builds, not one: built together, cargo unifies their dependencies'
# features (tonic's client and server) and rebuilds the service for both.
profile=${CHAOS_PROFILE:-release}
dir=$([[ $profile == dev ]] && echo debug || echo "$profile")
bin=${SHARDFLAKE_BIN:-target/$dir/shardflake}
chaos=${CHAOS_BIN:-target/$dir/shardflake-chaos}
if [[ -z "${SHARDFLAKE_BIN:-}" || -z "${CHAOS_BIN:-}" ]]; then
    cargo build --profile "$profile" -q -p shardflake-cli
    cargo build --profile "$profile" -q -p shardflake-chaos
fi

# The run's directory, unless --out names one (kept then).
out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ "${args[i]}" == "--out" ]] && out="${args[i + 1]:-}"
done
tmp=""
if [[ -z "$out" ]]; then
    tmp=$(mktemp -d /tmp/shardflake-chaos.XXXXXX)
    out="$tmp/run"
    args+=(--out "$out")
fi

chaos_pid=""  # while the binary runs
ns_pid=""     # the binary's pid, which names its namespace
cleanup() {
    local f pid
    if [[ -n "$chaos_pid" ]]; then kill -TERM "$chaos_pid" 2>/dev/null || true; fi
    # Nodes and etcd members the binary could not stop (it was killed, say).
    for f in "$out"/pids/*.pid "$out"/etcd/m*.pid; do
        [[ -e "$f" ]] || continue
        pid=$(cat "$f")
        kill -CONT "$pid" 2>/dev/null || true
        kill -KILL "$pid" 2>/dev/null || true
    done
    # The namespace is named after the binary's pid: sfchaos<20 + pid % 200>.
    if [[ -n "$ns_pid" ]]; then
        local tag=$((ns_pid % 200 + 20))
        ip link del "sfc${tag}h" 2>/dev/null || true
        ip netns del "sfchaos${tag}" 2>/dev/null || true
    fi
    if [[ -n "$tmp" ]]; then rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$chaos" run --seconds "$seconds" --bin "$bin" "${args[@]}" &
chaos_pid=$!
ns_pid=$chaos_pid
rc=0
wait "$chaos_pid" || rc=$?
chaos_pid=""
if [[ $rc -ne 0 && -n "$tmp" ]]; then
    echo "chaos.sh: failed ($rc); run again with --out DIR to keep the nodes' logs" >&2
fi
exit "$rc"
