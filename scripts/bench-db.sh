#!/usr/bin/env bash
# Ids inside the database: what each primary key costs, in one run.
#
# PostgreSQL (one server started here, fsync off): pgbench, 8 clients, 2
# threads, prepared protocol, 1,000,000 single-row INSERTs per key kind
# (125,000 per client), into a table whose primary key is
#   bigserial | Instagram's published PL/pgSQL next_id() (the seed's exact SQL)
#   | shardflake next_id() (installed by `shardflake pg apply`)
#   | UUIDv4 (gen_random_uuid()) | UUIDv7 (a SQL function; PG 15 has none),
# then the primary-key index size with exactly 1,000,000 rows. The kinds run
# in ROUNDS rounds (default 2), each in a rotated order, and the rate reported
# is the median per kind; ratios are against bigserial from the same run.
#
# Then a measure that other load on the machine barely moves: the CPU time
# (/proc/PID/schedstat) of ONE backend inserting
# CPU_ROWS rows (default 300,000) in one INSERT ... SELECT, CPU_RUNS times
# (default 3) for bigserial, Instagram's function and ours, with the share
# of our calls that took the slow path (pg_stat_user_functions).
#
# MariaDB (one server started here by scripts/mariadb.sh: InnoDB log written
# at each commit, flushed once a second): `shardflake mysql bench`, 8 clients
# sharing one user id, server-side prepared statements, MYSQL_ROWS (default
# 4,000) single-row inserts per client per mode, ROUNDS rounds in rotated
# order: AUTO_INCREMENT against our one-statement id (sequence + trigger,
# id from the OK packet or RETURNING), its candidates (NOCACHE sequence,
# trigger calling a function, column DEFAULT sent as text), our procedures
# (on the sequence; row lock, the previous design) and the seed's verbatim
# procedure with its duplicates counted; the CPU of all the server's threads
# per insert (/proc/PID/task/*/schedstat); then the CPU of one connection per
# row of one INSERT ... SELECT of CPU_ROWS rows, CPU_RUNS times.
#
# BEFORE_BIN=an older shardflake binary adds the kind shardflake_before:
# that binary's `pg apply` in schema prefix "before" on the same server, so
# that a change's cost is measured in one run (KINDS="bigserial shardflake"
# narrows the kinds; ROWS_PER_CLIENT the rows).
#
#   scripts/bench-db.sh [ROUNDS]        results in markdown on stdout
#   scripts/bench-db.sh 0               only the per-backend CPU measure (PostgreSQL)
#   ONLY=mariadb scripts/bench-db.sh 3  only MariaDB (ONLY=pg: only PostgreSQL)
#   ONLY=adopt SF=target/debug/shardflake scripts/bench-db.sh 3
#                                       only the adopted table (no build)
#
# After PostgreSQL, an adopted table against its own bigserial before
# adoption, in the same run (scripts/bench-adopt.sh, on a server of its
# own, at low settings: ADOPT_PRE_ROWS rows before, default 200,000;
# ADOPT_ROWS_PER_CLIENT inserts per client per round, default 5,000).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
ROWS_PER_CLIENT=${ROWS_PER_CLIENT:-125000}
CLIENTS=8
adopted_table() {
  PRE_ROWS=${ADOPT_PRE_ROWS:-200000} ROWS_PER_CLIENT=${ADOPT_ROWS_PER_CLIENT:-5000} \
    CLIENTS=$CLIENTS scripts/bench-adopt.sh "$ROUNDS"
}
if [[ ${ONLY:-} == adopt ]]; then
  adopted_table
  exit 0
fi
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target}
# Release: `mysql bench` runs its clients in this binary (PROFILE=dev for a
# quick look; figures in docs/BENCHMARKS.md say which profile made them).
PROFILE=${PROFILE:-release}
cargo build -q --profile "$PROFILE" -p shardflake-cli
SF=$CARGO_TARGET_DIR/$([[ $PROFILE == dev ]] && echo debug || echo "$PROFILE")/shardflake

work=$(mktemp -d /tmp/shardflake-bench.XXXXXX)
chmod 755 "$work"
pgdir="$work/pg" mdir="$work/mariadb"
cleanup() {
  scripts/pg.sh stop "$pgdir" >/dev/null 2>&1 || true
  scripts/mariadb.sh stop "$mdir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [[ ${ONLY:-} != mariadb ]]; then
# synchronous_commit=off, as the figures in docs/BENCHMARKS.md were
# measured (CPU costs, not WAL writes; `pg apply` warns about it).
url=$(PG_OPTS="-c synchronous_commit=off ${PG_OPTS:-}" scripts/pg.sh start 1 "$pgdir" | sed -n 1p)
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
[[tables]]
name = "k_shardflake"
sql = "CREATE TABLE {schema}.k_shardflake (id bigint PRIMARY KEY DEFAULT {next_id}, user_id bigint NOT NULL, body text)"
TOML
"$SF" pg apply -t "$work/topology.toml" >/dev/null
if [[ -n ${BEFORE_BIN:-} ]]; then
  sed 's/^shards = 1$/shards = 1\nschema_prefix = "before"/' "$work/topology.toml" >"$work/before.toml"
  "$BEFORE_BIN" pg apply -t "$work/before.toml" >/dev/null
fi

psql <<'SQL'
CREATE TABLE k_bigserial (id bigserial PRIMARY KEY, user_id bigint NOT NULL, body text);
-- Instagram's published function, exactly as in MISSION.md §2.2.
CREATE SCHEMA insta5;
CREATE SEQUENCE insta5.table_id_seq;
CREATE OR REPLACE FUNCTION insta5.next_id(OUT result bigint) AS $$
DECLARE
    our_epoch bigint := 1314220021721;
    seq_id bigint;
    now_millis bigint;
    shard_id int := 5;
BEGIN
    SELECT nextval('insta5.table_id_seq') % 1024 INTO seq_id;
    SELECT FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) INTO now_millis;
    result := (now_millis - our_epoch) << 23;
    result := result | (shard_id << 10);
    result := result | (seq_id);
END;
$$ LANGUAGE PLPGSQL;
CREATE TABLE k_instagram (id bigint PRIMARY KEY DEFAULT insta5.next_id(), user_id bigint NOT NULL, body text);
CREATE TABLE k_uuid4 (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), user_id bigint NOT NULL, body text);
-- UUIDv7 (RFC 9562): 48-bit Unix ms, version 7, random rest; an inlinable SQL function.
CREATE FUNCTION uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
  SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
           PLACING substring(int8send(floor(date_part('epoch', clock_timestamp()) * 1000)::bigint) FROM 3)
           FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;
CREATE TABLE k_uuid7 (id uuid PRIMARY KEY DEFAULT uuid_v7(), user_id bigint NOT NULL, body text);
SQL

declare -A table=(
  [bigserial]=k_bigserial [instagram]=k_instagram [shardflake]=shard0.k_shardflake
  [uuid4]=k_uuid4 [uuid7]=k_uuid7 [shardflake_before]=before0.k_shardflake
)
read -r -a kinds <<<"${KINDS:-bigserial instagram shardflake uuid4 uuid7}"
[[ -z ${BEFORE_BIN:-} ]] || kinds+=(shardflake_before)
nk=${#kinds[@]}
declare -A rates=() index=() tsize=()
for round in $(seq 1 "$ROUNDS"); do
  # rotate the order each round so no kind always runs first
  order=("${kinds[@]:$(( (round - 1) % nk ))}" "${kinds[@]:0:$(( (round - 1) % nk ))}")
  for k in "${order[@]}"; do
    t=${table[$k]}
    psql -c "TRUNCATE $t" -c "CHECKPOINT"
    echo "INSERT INTO $t (user_id, body) VALUES (31341, 'hello');" >"$work/$k.sql"
    tps=$("$bin/pgbench" -n -h 127.0.0.1 -p "$port" -U postgres -c $CLIENTS -j 2 -M prepared \
      -t "$ROWS_PER_CLIENT" -f "$work/$k.sql" postgres 2>&1 | awk '/^tps/ {print int($3)}')
    rates[$k]="${rates[$k]:-} $tps"
    # every insert landed: a repeated id would have failed the primary key
    # (pgbench aborts that client) and left fewer rows
    rows=$(psql -At -c "SELECT count(*) FROM $t")
    [[ $rows -eq $((CLIENTS * ROWS_PER_CLIENT)) ]] || { echo "bench: $t has $rows rows" >&2; exit 1; }
    index[$k]=$(psql -At -c "SELECT pg_relation_size(i.indexrelid) FROM pg_index i WHERE i.indrelid = '$t'::regclass AND i.indisprimary")
    tsize[$k]=$(psql -At -c "SELECT pg_relation_size('$t')")
    echo "round $round $k: $tps inserts/s" >&2
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'; }
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
pgver=$("$bin/postgres" --version)
if [[ $ROUNDS -gt 0 ]]; then
base=$(echo "${rates[bigserial]}" | median)
echo "### PostgreSQL: primary key kinds ($pgver; pgbench -c $CLIENTS -j 2 -M prepared, $((CLIENTS * ROWS_PER_CLIENT)) inserts per kind, $ROUNDS rounds)"
echo
echo "| primary key | inserts/s (median) | each round | vs bigserial | PK index, 1 M rows | table |"
echo "|---|---:|---|---:|---:|---:|"
for k in "${kinds[@]}"; do
  m=$(echo "${rates[$k]}" | median)
  printf '| %s | %s | %s | %.2fx | %s MiB | %s MiB |\n' "$k" "$m" "$(echo ${rates[$k]} | tr ' ' '/')" \
    "$(awk -v a="$m" -v b="$base" 'BEGIN {print a / b}')" "$(mib "${index[$k]}")" "$(mib "${tsize[$k]}")"
done
fi

# One backend runs one INSERT ... SELECT of $2 rows into $1: prints its CPU
# µs per row (from /proc/PID/schedstat: nanoseconds on a CPU) and the share
# of rows whose id took next_id_slow.
backend_cpu() {
  local t=$1 n=$2 pid ns0 ns1 slow
  psql -c "TRUNCATE $t" -c "CHECKPOINT" -c "SELECT pg_stat_reset()" >/dev/null
  coproc BACKEND { "$bin/psql" -X -q -At -h 127.0.0.1 -p "$port" -U postgres postgres; }
  echo "SELECT pg_backend_pid();" >&"${BACKEND[1]}"
  read -r pid <&"${BACKEND[0]}"
  read -r ns0 _ <"/proc/$pid/schedstat"
  echo "INSERT INTO $t (user_id, body) SELECT 31341, 'hello' FROM generate_series(1, $n); SELECT 'done';" >&"${BACKEND[1]}"
  read -r _ <&"${BACKEND[0]}"
  read -r ns1 _ <"/proc/$pid/schedstat"
  # this session's function counts reach the view once flushed
  echo "SELECT pg_stat_force_next_flush();" >&"${BACKEND[1]}"
  read -r _ <&"${BACKEND[0]}"
  echo "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE funcname = 'next_id_slow';" >&"${BACKEND[1]}"
  read -r slow <&"${BACKEND[0]}"
  echo '\q' >&"${BACKEND[1]}"; wait "$BACKEND_PID" 2>/dev/null || true
  awk -v a="$ns0" -v b="$ns1" -v n="$n" -v slow="$slow" 'BEGIN {printf "%.2f %.1f%%\n", (b - a) / 1000 / n, 100 * slow / n}'
}
if [[ -r /proc/self/schedstat ]]; then
  CPU_ROWS=${CPU_ROWS:-300000} CPU_RUNS=${CPU_RUNS:-3}
  psql -c "ALTER SYSTEM SET track_functions = 'pl'" -c "SELECT pg_reload_conf()" >/dev/null
  echo
  echo "### PostgreSQL: CPU of one backend per row ($pgver; one INSERT ... SELECT of $CPU_ROWS rows, $CPU_RUNS runs)"
  echo
  echo "| primary key | µs CPU per row, each run | slow-path calls (ours) |"
  echo "|---|---|---:|"
  cpu_kinds=(bigserial instagram shardflake)
  [[ -z ${BEFORE_BIN:-} ]] || cpu_kinds+=(shardflake_before)
  for k in "${cpu_kinds[@]}"; do
    runs="" slow=""
    for _ in $(seq 1 "$CPU_RUNS"); do
      read -r cpu share < <(backend_cpu "${table[$k]}" "$CPU_ROWS")
      runs="$runs $cpu" slow="$slow $share"
    done
    [[ $k == shardflake* ]] || slow=""
    printf '| %s | %s | %s |\n' "$k" "$(echo $runs | tr ' ' '/')" "$(echo $slow | tr ' ' '/')"
  done
fi
scripts/pg.sh stop "$pgdir" >/dev/null
if [[ $ROUNDS -gt 0 ]]; then
  echo
  SF=$SF adopted_table
fi
fi
[[ $ROUNDS -gt 0 && ${ONLY:-} != pg ]] || exit 0

murl=$(scripts/mariadb.sh start "$mdir" | sed -n 1p)
mpid=$(scripts/mariadb.sh pid "$mdir")
MYSQL_ROWS=${MYSQL_ROWS:-4000}
echo
echo "### MariaDB: ids against AUTO_INCREMENT ($(mariadbd --version | awk '{print $3}'); $CLIENTS clients sharing user id 1801, prepared statements, $MYSQL_ROWS inserts per client per mode, $ROUNDS rounds)"
echo
"$SF" mysql bench --url "$murl" --clients $CLIENTS --rows "$MYSQL_ROWS" --rounds "$ROUNDS" \
  --server-pid "$mpid" --cpu-rows "${CPU_ROWS:-300000}" --cpu-runs "${CPU_RUNS:-3}"
