#!/usr/bin/env bash
# Fuzzes the HTTP API from its own OpenAPI document with schemathesis:
# every operation, valid and invalid inputs, every check (no 5xx; statuses,
# content types and bodies as documented, the error shape; valid input
# accepted, invalid input refused). Settings: scripts/schemathesis.toml;
# a hook for one false positive of the tool: scripts/schemathesis_hooks.py.
#
#   scripts/api-fuzz.sh SECONDS|Nx [SERVE_FLAG...]
#
# SECONDS: a time budget (--max-time); Nx (e.g. 200x): N examples per
# operation and phase (--max-examples). Starts `shardflake serve` (a debug
# build unless SHARDFLAKE_BIN is set) on 127.0.0.1 only, on free ports,
# with a static node id, a layout with a shard field (so /v1/shard-id is
# in the document) and a temporary state file; schemathesis (pinned, in a
# virtual environment under target/) runs with a printed seed (SEED to
# replay); the server is stopped on exit. Extra flags go to `serve`.
#
# API_FUZZ_TICKETS=mariadb also starts a MariaDB ticket server
# (scripts/mariadb.sh) with a per-id, a segment and a 32-bit sequence, and
# serves them (`--tickets`), so the /v1/tickets paths are fuzzed too.
set -euo pipefail
cd "$(dirname "$0")/.."

budget=${1:?usage: scripts/api-fuzz.sh SECONDS|Nx [SERVE_FLAG...]}
shift
# 4.32.5: the version these figures were taken with (docs/RELIABILITY.md).
version=4.32.5
venv=target/api-fuzz-venv
if ! "$venv/bin/st" --version 2>/dev/null | grep -q "$version"; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "schemathesis==$version" >&2
fi
bin=${SHARDFLAKE_BIN:-}
if [[ -z "$bin" ]]; then
    cargo build -q -p shardflake-cli
    bin=target/debug/shardflake
fi
dir=$(mktemp -d /tmp/shardflake-api-fuzz.XXXXXX)
pid=""
cleanup() {
    if [[ -n "$pid" ]]; then
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    if [[ -e "$dir/mariadb" ]]; then
        scripts/mariadb.sh stop "$dir/mariadb" >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
tickets=()
case "${API_FUZZ_TICKETS:-}" in
"") ;;
mariadb)
    url=$(scripts/mariadb.sh start "$dir/mariadb" | sed -n 1p)
    cat >"$dir/tickets.toml" <<EOF
[[servers]]
name = "t1"
kind = "mariadb"
url = "$url"
offset = 1

[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"

[[sequences]]
name = "small"
bits = 32
EOF
    "$bin" tickets init --config "$dir/tickets.toml" >/dev/null
    tickets=(--tickets "$dir/tickets.toml")
    ;;
*)
    echo "api-fuzz.sh: API_FUZZ_TICKETS is 'mariadb' or unset, not '$API_FUZZ_TICKETS'" >&2
    exit 2
    ;;
esac
# A static node's first start: --resume-after now (a state file written by
# hand, without the path line a node writes, is refused).
"$bin" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 --node-id 1 --resume-after now \
    --layout "orders: time 41 | node 6 | shard 6 | sequence 10 (epoch 1735689600000 ms)" \
    --shards 40 --max-batch 1000 --state-file "$dir/state" "${tickets[@]}" "$@" \
    >"$dir/out" 2>"$dir/log" </dev/null &
pid=$!
# `serve` prints its bound addresses on stdout once it listens.
http=""
for _ in $(seq 1 1000); do
    http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$dir/out")
    [[ -n "$http" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.01
done
if [[ -z "$http" ]]; then
    echo "api-fuzz.sh: serve did not start" >&2
    cat "$dir/log" >&2
    exit 1
fi
# Ready (node id held) before the first request: /readyz answers 200.
python3 - "$http" <<'PY' || { echo "api-fuzz.sh: serve not ready" >&2; cat "$dir/log" >&2; exit 1; }
import sys, time, urllib.request
for _ in range(500):
    try:
        if urllib.request.urlopen(f"http://{sys.argv[1]}/readyz", timeout=1).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.02)
sys.exit(1)
PY
seed=${SEED:-$RANDOM}
if [[ "$budget" == *x ]]; then
    limit=(--max-examples "${budget%x}")
else
    limit=(--max-time "$budget")
fi
echo "api-fuzz.sh: schemathesis $version against http://$http/openapi.json (${limit[*]}), seed $seed" >&2
SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH=scripts \
    "$venv/bin/st" --config-file scripts/schemathesis.toml run "http://$http/openapi.json" \
    --checks all "${limit[@]}" --seed "$seed" --workers 1 --request-timeout 10 \
    --generation-database none --no-color
