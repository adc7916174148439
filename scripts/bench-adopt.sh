#!/usr/bin/env bash
# An adopted table's insert rate against its own bigserial before adoption,
# in one run (issue 39).
#
# One PostgreSQL server started here (fsync off, synchronous_commit=off as
# in scripts/bench-db.sh). A table `orders` (bigserial, PRE_ROWS rows, default
# 1,000,000), then ROUNDS rounds (default 3) of: its default set back to
# its own sequence (bigserial) and pgbench; `shardflake pg adopt` and pgbench
# again. Each pgbench: CLIENTS clients (default 8), 2 threads, prepared,
# ROWS_PER_CLIENT single-row INSERTs each (default 20,000). Every round also
# runs adopt after a default changed back by hand, as `pg check` says to.
#
#   SF=path/to/shardflake scripts/bench-adopt.sh [ROUNDS]   markdown on stdout
#
# SF defaults to target/release/shardflake, then target/debug/shardflake (no
# build here: build it first; figures should say which profile made them).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
ROWS_PER_CLIENT=${ROWS_PER_CLIENT:-20000}
CLIENTS=${CLIENTS:-8}
PRE_ROWS=${PRE_ROWS:-1000000}
SF=${SF:-$( [[ -x target/release/shardflake ]] && echo target/release/shardflake || echo target/debug/shardflake)}
[[ -x $SF ]] || { echo "bench-adopt: no shardflake binary at $SF (cargo build first, or set SF)" >&2; exit 1; }

work=$(mktemp -d /tmp/shardflake-bench-adopt.XXXXXX)
chmod 755 "$work"
trap 'scripts/pg.sh stop "$work/pg" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
url=$(PG_OPTS="-c synchronous_commit=off ${PG_OPTS:-}" scripts/pg.sh start 1 "$work/pg" | sed -n 1p)
port=${url##*:}; port=${port%%/*}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n1)
psql() { "$bin/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres postgres "$@"; }

cat >"$work/topology.toml" <<TOML
layout = "instagram"
shards = 1
[[servers]]
name = "bench"
url = "$url"
shards = "0"
TOML
"$SF" pg apply -t "$work/topology.toml" >/dev/null 2>&1
psql -c "CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, body text)" \
  -c "INSERT INTO orders (user_id, body) SELECT g, 'old' FROM generate_series(1, $PRE_ROWS) g" \
  -c "VACUUM ANALYZE orders"
echo "INSERT INTO orders (user_id, body) VALUES (31341, 'hello');" >"$work/insert.sql"

run() {
  "$bin/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c "$CLIENTS" -j 2 -M prepared \
    -t "$ROWS_PER_CLIENT" -f "$work/insert.sql" postgres 2>&1 | awk '/^tps/ {print int($3)}'
}
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'; }
before='' after=''
for round in $(seq 1 "$ROUNDS"); do
  # Back on its own sequence, which pg adopt fenced (MAXVALUE): lifted here.
  psql -c "ALTER SEQUENCE orders_id_seq NO MAXVALUE" \
    -c "ALTER TABLE orders ALTER COLUMN id SET DEFAULT nextval('orders_id_seq')" -c CHECKPOINT
  tps=$(run); before="$before $tps"
  echo "round $round bigserial: $tps inserts/s" >&2
  "$SF" pg adopt -t "$work/topology.toml" --table public.orders --shard 0 >/dev/null
  psql -c CHECKPOINT
  tps=$(run); after="$after $tps"
  echo "round $round adopted: $tps inserts/s" >&2
done
# Every insert landed, none twice (a repeated id fails the primary key and
# pgbench aborts that client).
want=$((PRE_ROWS + 2 * ROUNDS * CLIENTS * ROWS_PER_CLIENT))
rows=$(psql -At -c "SELECT count(*) FROM orders")
[[ $rows -eq $want ]] || { echo "bench-adopt: orders has $rows rows, want $want" >&2; exit 1; }
b=$(echo "$before" | median) a=$(echo "$after" | median)
echo "### An adopted table against its own bigserial ($("$bin/postgres" --version); pgbench -c $CLIENTS -j 2 -M prepared, $((CLIENTS * ROWS_PER_CLIENT)) inserts per round, $ROUNDS rounds, $PRE_ROWS rows before)"
echo
echo "| default of orders.id | inserts/s (median) | per round | vs bigserial |"
echo "|---|---:|---|---:|"
echo "| bigserial (its own sequence) | $b |$before | 1.00x |"
echo "| adopted: shard0.next_id() | $a |$after | $(awk -v a="$a" -v b="$b" 'BEGIN {printf "%.2fx", a / b}') |"
