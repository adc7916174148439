#!/usr/bin/env bash
# Ticket servers, in one run on the same pairs (`shardflake tickets bench`):
#
# 1. MariaDB odd/even pair (scripts/mariadb.sh, global increment 2, offsets
#    1 and 2): per-id mode through the library (least busy server,
#    failover, residue checks, the guard's proof and the table's identity
#    in every answer, high-water marks) against a bare loop of the counter
#    row's `UPDATE … LAST_INSERT_ID(id) + 2; SELECT LAST_INSERT_ID()` from
#    the same client library (a binary of before the counter row: Flickr's
#    `REPLACE INTO … ('a')`), for each count of callers in PER_ID_TASKS,
#    ROUNDS rounds with the order of the two loops alternating (goal:
#    median library/bare >= 0.9x);
# 2. segment mode in the library on the same pair, one id per call and
#    BATCH ids per call (goal: >= 100x per-id and > 1 M ids/s);
# 3. PostgreSQL pair (scripts/pg.sh): per-id with a sequence (`nextval`)
#    and with Flickr's table (`INSERT … ON CONFLICT … RETURNING`), each
#    against its bare loop (`postgres_tickets`; the table is the default);
# 4. the MariaDB pair under per-id and segment load while server 1 is
#    SIGKILLed and restarted: calls that failed and for how long (goal: none,
#    they fail over);
# 6. what the write-ahead high-water marks cost: per-id with
#    `mark_ahead = 1` (a mark written on the peers before every id) against
#    the default 1,000 (one write per 1,000 ids of a server, in the
#    background);
# 5. the same pair through `shardflake serve --tickets`: wrk against
#    `GET /v1/tickets/blocks?count=BATCH` (segment batches) and
#    `/v1/tickets/photos` (per-id), to set against 2. and 1.
#
#   scripts/bench-tickets.sh     RUN_SECONDS=5 TASKS=8 BATCH=1000 ROUNDS=4 PROFILE=release by default
#
# PER_ID_TASKS="1 8 32": the callers of 1. (default: TASKS); BIN=PATH: that
# shardflake binary, not built here (another release's, to compare);
# SECTIONS=per-id: 1. only.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${RUN_SECONDS:-5}
TASKS=${TASKS:-8}
BATCH=${BATCH:-1000}
ROUNDS=${ROUNDS:-4}
PROFILE=${PROFILE:-release}
PER_ID_TASKS=${PER_ID_TASKS:-$TASKS}
SECTIONS=${SECTIONS:-all}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
if [[ -n ${BIN:-} ]]; then
  bin=$BIN
else
  cargo build -q --profile "$PROFILE" -p shardflake-cli
  bin=$CARGO_TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")/shardflake
fi

work=$(mktemp -d /tmp/bench-tickets.XXXXXX)
# PostgreSQL runs as user postgres: it must traverse the dir.
chmod 755 "$work"
m1=$work/m1 m2=$work/m2 pgdir=$work/pg
cleanup() {
  scripts/mariadb.sh stop "$m1" >/dev/null 2>&1 || true
  scripts/mariadb.sh stop "$m2" >/dev/null 2>&1 || true
  scripts/pg.sh stop "$pgdir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

url1=$(MARIADB_OPTS="--auto-increment-increment=2 --auto-increment-offset=1" scripts/mariadb.sh start "$m1" | sed -n 1p)
url2=$(MARIADB_OPTS="--auto-increment-increment=2 --auto-increment-offset=2" scripts/mariadb.sh start "$m2" | sed -n 1p)
mapfile -t pg < <(scripts/pg.sh start 2 "$pgdir")

sequences='
[[sequences]]
name = "photos"

[[sequences]]
name = "blocks"
mode = "segment"
'
cat >"$work/maria.toml" <<EOF
[[servers]]
name = "m1"
kind = "mariadb"
url = "$url1"
offset = 1

[[servers]]
name = "m2"
kind = "mariadb"
url = "$url2"
offset = 2
$sequences
EOF
for style in sequence table; do
  cat >"$work/pg-$style.toml" <<EOF
postgres_tickets = "$style"

[[servers]]
name = "p1"
kind = "postgres"
url = "${pg[0]}"
offset = 1

[[servers]]
name = "p2"
kind = "postgres"
url = "${pg[1]}"
offset = 2

[[sequences]]
name = "photos_$style"
EOF
done

"$bin" tickets init --config "$work/maria.toml" >/dev/null
"$bin" tickets init --config "$work/pg-sequence.toml" >/dev/null
"$bin" tickets init --config "$work/pg-table.toml" >/dev/null

printf '[failover]\nmark_ahead = 1\n\n' | cat - "$work/maria.toml" >"$work/maria-ahead1.toml"

echo "# scripts/bench-tickets.sh: $(nproc) cores, ${SECONDS_PER_RUN} s per run, $TASKS callers, profile $PROFILE, $bin"
echo
for tasks in $PER_ID_TASKS; do
  echo "## MariaDB pair: per-id against its bare loop, $tasks callers"
  "$bin" tickets bench --config "$work/maria.toml" photos --tasks "$tasks" --seconds "$SECONDS_PER_RUN" --bare --rounds "$ROUNDS"
  echo
done
[[ $SECTIONS == per-id ]] && exit 0
echo "## MariaDB pair: segment mode, 1 id per call, then $BATCH per call"
"$bin" tickets bench --config "$work/maria.toml" blocks --tasks "$TASKS" --seconds "$SECONDS_PER_RUN"
"$bin" tickets bench --config "$work/maria.toml" blocks --tasks "$TASKS" --seconds "$SECONDS_PER_RUN" --batch "$BATCH"
echo
for style in sequence table; do
  echo "## PostgreSQL pair: per-id with a $style, against its bare loop"
  "$bin" tickets bench --config "$work/pg-$style.toml" "photos_$style" --tasks "$TASKS" --seconds "$SECONDS_PER_RUN" --bare --rounds "$ROUNDS"
  echo
done

echo "## Write-ahead marks: per-id with mark_ahead = 1 (a mark before every id), then the default (1000)"
"$bin" tickets bench --config "$work/maria-ahead1.toml" photos --tasks "$TASKS" --seconds "$SECONDS_PER_RUN"
"$bin" tickets bench --config "$work/maria.toml" photos --tasks "$TASKS" --seconds "$SECONDS_PER_RUN"
echo

echo "## MariaDB pair through shardflake serve --tickets (wrk -t1 -c$TASKS)"
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk; }
"$bin" serve --tickets "$work/maria.toml" --http 127.0.0.1:0 --grpc 127.0.0.1:0 \
  --state-file "$work/state" >"$work/serve.out" 2>"$work/serve.err" &
serve=$!
for _ in $(seq 100); do grep -q http= "$work/serve.out" 2>/dev/null && break; sleep 0.05; done
http=$(grep -o 'http=[^ ]*' "$work/serve.out" | cut -d= -f2) || { cat "$work/serve.err"; exit 1; }
for path in "/v1/tickets/blocks?count=$BATCH" /v1/tickets/photos; do
  out=$(wrk -t1 -c"$TASKS" -d"${SECONDS_PER_RUN}s" --latency "http://$http$path")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  errors=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  per=$([[ $path == *count=* ]] && echo "$BATCH" || echo 1)
  awk -v r="$rps" -v n="$per" -v p="$path" -v e="${errors:-0}" \
    'BEGIN {printf "%-34s %10.0f requests/s %12.0f ids/s, non-2xx %d\n", p, r, r * n, e}'
done
kill -TERM "$serve"
wait "$serve" || true
grep -o 'ticket segments given back.*' "$work/serve.err" || true
echo

echo "## MariaDB pair: m1 SIGKILLed 1 s into a 6 s run, restarted 2 s later"
for sequence in photos blocks; do
  "$bin" tickets bench --config "$work/maria.toml" "$sequence" --tasks "$TASKS" --seconds 6 >"$work/kill.out" 2>"$work/kill.err" &
  bench=$!
  sleep 1
  scripts/mariadb.sh kill "$m1"
  sleep 2
  scripts/mariadb.sh restart "$m1" >/dev/null
  wait "$bench"
  cat "$work/kill.out"
done
