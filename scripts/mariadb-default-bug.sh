#!/usr/bin/env bash
# Why MariaDB's one-statement ids use a trigger, not a column DEFAULT
# (docs/BENCHMARKS.md, "MariaDB: ids against AUTO_INCREMENT"): the cheaper
# form, `id BIGINT DEFAULT (NEXT VALUE FOR s)`, breaks once two sessions run
# a server-side prepared INSERT into the table. Run it against a newer
# server to see whether the DEFAULT has become safe there.
#
#   scripts/mariadb-default-bug.sh [SESSIONS] [EXECUTES]     (default 8 2000)
#
# Each session PREPAREs `INSERT INTO t (u) VALUES (?)` and EXECUTEs it
# EXECUTES times; then the script counts rows, distinct ids and NULL ids.
# A server that is fine prints "ok"; exits 1 with what went wrong otherwise
# (on MariaDB 10.11.19 the server dies of signal 11 in
# Item_func_nextval::val_int, under TABLE::update_default_fields).
# The same INSERTs sent as text, and one session with the prepared INSERT,
# come out right: the script checks both first, so a failure of the
# concurrent prepared run is the bug, not the set-up.
set -euo pipefail
cd "$(dirname "$0")/.."
sessions=${1:-8}
executes=${2:-2000}
tmp=$(mktemp -d /tmp/shardflake-default-bug.XXXXXX)
d=$tmp/db
scripts/mariadb.sh start "$d" >/dev/null
port=$(cat "$d/port")
trap 'scripts/mariadb.sh stop "$d" >/dev/null 2>&1 || scripts/mariadb.sh kill "$d" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
q() { mariadb -h127.0.0.1 -P"$port" -uroot app -N -B "$@"; }
mariadbd --version >&2

# run KIND SESSIONS: the table anew, SESSIONS clients at once; prints
# "rows distinct nulls" or "server died".
run() {
  local kind=$1 n=$2 i j
  q -e "DROP TABLE IF EXISTS t; DROP SEQUENCE IF EXISTS s;
        CREATE SEQUENCE s CACHE 1000;
        CREATE TABLE t (id BIGINT DEFAULT (NEXT VALUE FOR s), u INT)"
  for i in $(seq 1 "$n"); do
    {
      if [[ $kind == prepared ]]; then
        echo "PREPARE st FROM 'INSERT INTO t (u) VALUES (?)'; SET @u = $i;"
        for j in $(seq 1 "$executes"); do echo "EXECUTE st USING @u;"; done
      else
        for j in $(seq 1 "$executes"); do echo "INSERT INTO t (u) VALUES ($i);"; done
      fi
    } | q >/dev/null 2>&1 &
  done
  wait || true
  q -e "SELECT COUNT(*), COUNT(DISTINCT id), COUNT(*) - COUNT(id) FROM t" 2>/dev/null \
    | tr '\t' ' ' || echo "server died"
}

want="$((sessions * executes)) $((sessions * executes)) 0"
text=$(run text "$sessions")
one=$(run prepared 1)
echo "text, $sessions sessions:     $text (rows distinct nulls)"
echo "prepared, 1 session:  $one"
[[ $text == "$want" && $one == "$executes $executes 0" ]] || { echo "set-up failed" >&2; exit 2; }
many=$(run prepared "$sessions")
echo "prepared, $sessions sessions: $many"
if [[ $many == "$want" ]]; then
  echo ok
else
  # Until the process is gone its backtrace may be half written.
  scripts/mariadb.sh kill "$d" >/dev/null 2>&1 || true
  grep -m1 "got signal" "$d/server.log" >&2 || true
  grep -m1 "Item_func_nextval" "$d/server.log" >&2 || true
  echo "the DEFAULT is not safe here (want $want)"
  exit 1
fi
