#!/usr/bin/env bash
# Smoke run of `shardflake compare` on a real PostgreSQL and MariaDB (small
# N): every scheme ran, sizes are positive, no duplicate except the seed's
# trap, the sandbox is gone afterwards -- also after a SIGINT mid-run -- and
# a table of the user's beside it is untouched.
#
#   scripts/compare-smoke.sh [ROWS]     (SHARDFLAKE_BIN: the binary to run;
#                                        default: cargo's debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
rows=${1:-2000}
if [[ -n ${SHARDFLAKE_BIN:-} ]]; then bin=$SHARDFLAKE_BIN; else
  cargo build -q -p shardflake-cli
  bin=target/debug/shardflake
fi
work=$(mktemp -d)
pg_dir= my_dir=
cleanup() {
  [[ -n $pg_dir ]] && bash scripts/pg.sh stop "$pg_dir" >/dev/null 2>&1 || true
  [[ -n $my_dir ]] && bash scripts/mariadb.sh stop "$my_dir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

bash scripts/pg.sh start 1 >"$work/pg"
pg_url=$(head -1 "$work/pg"); pg_dir=$(sed -n 's/^dir //p' "$work/pg")
bash scripts/mariadb.sh start >"$work/my"
my_url=$(head -1 "$work/my"); my_dir=$(sed -n 's/^dir //p' "$work/my")
psql=("$(bash scripts/pg.sh bindir)/psql" -X -q -t -A "$pg_url")
port=${my_url##*:}; port=${port%%/*}
maria=(mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -N -B)

"${psql[@]}" -c "CREATE TABLE keep (x int); INSERT INTO keep VALUES (7)"
"${maria[@]}" app -e "CREATE TABLE keep (x int); INSERT INTO keep VALUES (7)"

sandbox_gone() {
  [[ $("${psql[@]}" -c "SELECT count(*) FROM pg_namespace WHERE nspname = 'shardflake_compare'") == 0 ]] &&
    [[ $("${maria[@]}" -e "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'shardflake_compare'") == 0 ]] &&
    [[ $("${psql[@]}" -c "SELECT x FROM keep") == 7 ]] &&
    [[ $("${maria[@]}" app -e "SELECT x FROM keep") == 7 ]]
}

echo "compare: $rows rows per scheme on $pg_url and $my_url"
"$bin" compare --pg "$pg_url" --mysql "$my_url" --rows "$rows" --clients 4 --batch 50 \
  --format json --chart "$work/chart.svg" --quiet >"$work/report.json"
python3 - "$work/report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
expected = {
    "postgres": ["bigserial", "next_id", "snowflake", "server_uuid", "uuid_v4", "uuid_v7",
                 "objectid", "tickets", "segment"],
    "mariadb": ["auto_increment", "trigger", "procedure", "seed_procedure", "snowflake",
                "server_uuid", "uuid_v4", "uuid_v7", "objectid", "tickets", "segment"],
}
assert not report["interrupted"]
assert [s["kind"] for s in report["servers"]] == ["postgres", "mariadb"]
for server in report["servers"]:
    kind = server["kind"]
    assert server["dropped"], f"{kind}: sandbox not dropped"
    got = [r["scheme"] for r in server["results"]]
    assert got == expected[kind], (kind, got)
    for r in server["results"]:
        name = f'{kind} {r["scheme"]}'
        assert r["skipped"] is None and r["error"] is None, (name, r["skipped"], r["error"])
        assert r["table_bytes"] > 0 and r["index_bytes"] > 0, name
        assert r["index_bytes_after_churn"] > 0, name
        assert r["rows_per_s"] > 0 and r["inserted"] > 0, name
        assert r["duplicates"] == 0 or r["duplicates_expected"], (name, r["duplicates"])
    dups = {r["scheme"]: r["duplicates"] for r in server["results"]}
    print(f"  {kind}: {len(server['results'])} schemes ran, duplicates {dups}")
PY
grep -q '<svg' "$work/chart.svg"
sandbox_gone || { echo "compare-smoke: a sandbox is left behind, or a user table changed" >&2; exit 1; }
echo "  both sandboxes dropped; the users' tables untouched"

# SIGINT mid-run: the running batches finish, the sandbox is dropped.
for server in "--pg $pg_url" "--mysql $my_url"; do
  # shellcheck disable=SC2086
  "$bin" compare $server --rows 100000000 --seconds 600 --quiet >"$work/int.out" 2>"$work/int.err" &
  pid=$!
  for _ in $(seq 300); do
    if [[ $server == --pg* ]]; then
      [[ $("${psql[@]}" -c "SELECT count(*) > 0 FROM shardflake_compare.t_bigserial" 2>/dev/null) == t ]] && break
    else
      [[ $("${maria[@]}" -e "SELECT COUNT(*) > 0 FROM shardflake_compare.t_auto_increment" 2>/dev/null) == 1 ]] && break
    fi
    sleep 0.1
  done
  kill -INT "$pid"
  rc=0
  for _ in $(seq 600); do [[ -d /proc/$pid ]] && [[ $(awk '{print $3}' /proc/$pid/stat 2>/dev/null) != Z ]] || break; sleep 0.1; done
  wait "$pid" || rc=$?
  grep -q "interrupted" "$work/int.err" || { echo "compare-smoke: no interruption reported (${server%% *}, rc $rc):" >&2; cat "$work/int.err" >&2; exit 1; }
  [[ $rc == 1 ]] || { echo "compare-smoke: exit code $rc after SIGINT" >&2; exit 1; }
  sandbox_gone || { echo "compare-smoke: sandbox left behind after SIGINT (${server%% *})" >&2; exit 1; }
  echo "  SIGINT mid-run (${server%% *}): exit $rc, sandbox dropped"
done
echo "compare-smoke: ok"
