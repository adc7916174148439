#!/usr/bin/env bash
# Fuzzes the HTTP API from its own OpenAPI document with schemathesis:
# every operation, valid and invalid inputs; fails on any 5xx or any
# response the document does not describe (status, content type, body).
#
#   scripts/api-fuzz.sh SECONDS [SERVE_FLAG...]
#
# Starts `shardflake serve` (debug build unless SHARDFLAKE_BIN is set) on
# 127.0.0.1 with a static node id and a temporary state file, runs
# schemathesis for about SECONDS (installed with pip when missing; its seed
# is printed), and stops the server. Extra flags go to `serve`.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:?usage: scripts/api-fuzz.sh SECONDS [SERVE_FLAG...]}
shift
if ! command -v st >/dev/null 2>&1; then
    python3 -m pip install --quiet 'schemathesis>=4,<5' >&2
fi
bin=${SHARDFLAKE_BIN:-}
if [[ -z "$bin" ]]; then
    cargo build -q -p shardflake-cli
    bin=target/debug/shardflake
fi
dir=$(mktemp -d /tmp/shardflake-api-fuzz.XXXXXX)
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
"$bin" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0 --node-id 1 \
    --state-file "$dir/state" "$@" >"$dir/out" 2>"$dir/log" </dev/null &
pid=$!
for _ in $(seq 1 500); do
    grep -q ' ready ' "$dir/log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$dir/log" >&2; exit 1; }
    sleep 0.02
done
http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$dir/out")
[[ -n "$http" ]] || { echo "api-fuzz.sh: serve did not start" >&2; cat "$dir/log" >&2; exit 1; }
seed=${SEED:-$RANDOM}
echo "api-fuzz.sh: schemathesis against http://$http/openapi.json for ${seconds}s, seed $seed" >&2
st run "http://$http/openapi.json" --checks all --max-time "$seconds" \
    --seed "$seed" --workers 2 --request-timeout 10 --no-color \
    --generation-database none
