#!/usr/bin/env bash
# Starts and stops throw-away PostgreSQL servers on 127.0.0.1, for tests,
# benchmarks and the README walk-through.
#
#   scripts/pg.sh start N [DIR]   start N servers under DIR (default: a new
#                                 temp dir); prints one URL per line and, last,
#                                 "dir DIR"
#   scripts/pg.sh halt DIR        stop every server under DIR now (immediate
#                                 mode), keeping DIR
#   scripts/pg.sh stop DIR        stop every server under DIR and remove DIR
#   scripts/pg.sh bindir          print the newest PostgreSQL's bin directory
#                                 (pgbench, psql)
#
# Environment, read by start:
#   PG_OPTS="-c name=value ..."   extra server settings (last wins, e.g.
#                                 -c max_connections=10)
#
# Each server: initdb --auth=trust -U postgres, a free port probed before use,
# fsync=off (data is thrown away), max_connections=200, socket in its own dir.
# PostgreSQL refuses to run as root, so initdb/pg_ctl run as user postgres.
set -euo pipefail

bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
  [[ -x "$d/pg_ctl" ]] || { echo "pg.sh: PostgreSQL not installed (run scripts/install-deps.sh)" >&2; exit 1; }
  echo "$d"
}

as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Below the kernel's ephemeral range (ip_local_port_range, 32768 and up
# here): a port picked there can be taken by any outgoing connection or
# port-0 bind between the probe and the server's bind.
free_port() {
  local p low high
  read -r low high </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
  ((low > 20500)) || low=32768
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % (low - 20000)))
    if port_free "$p"; then echo "$p"; return; fi
  done
  echo "pg.sh: no free port found" >&2
  exit 1
}

start() {
  local n=${1:?usage: pg.sh start N [DIR]} dir=${2:-} bin
  bin=$(bindir)
  [[ -n $dir ]] || dir=$(mktemp -d /tmp/shardflake-pg.XXXXXX)
  mkdir -p "$dir"
  chmod 755 "$dir"
  [[ $(id -u) -eq 0 ]] && chown postgres "$dir"
  for i in $(seq 1 "$n"); do
    local data="$dir/pg$i" port
    as_pg "$bin/initdb" -D "$data" --auth=trust -U postgres -E UTF8 --no-sync >"$dir/pg$i.initdb.log" 2>&1 \
      || { cat "$dir/pg$i.initdb.log" >&2; exit 1; }
    port=$(free_port)
    as_pg "$bin/pg_ctl" -D "$data" -l "$dir/pg$i.log" -w -t 60 \
      -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 ${PG_OPTS:-}" \
      start >/dev/null || { cat "$dir/pg$i.log" >&2; exit 1; }
    echo "$port" >"$dir/pg$i.port"
    echo "postgres://postgres@127.0.0.1:$port/postgres"
  done
  echo "dir $dir"
}

halt() {
  local dir=${1:?usage: pg.sh halt DIR} bin
  bin=$(bindir)
  for data in "$dir"/pg*/; do
    [[ -f "$data/PG_VERSION" ]] || continue
    as_pg "$bin/pg_ctl" -D "$data" -m immediate -w stop >/dev/null 2>&1 || true
  done
}

stop() {
  local dir=${1:?usage: pg.sh stop DIR}
  halt "$dir"
  rm -rf "$dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  halt) shift; halt "$@" ;;
  stop) shift; stop "$@" ;;
  bindir) bindir ;;
  *) echo "usage: $0 start N [DIR] | halt DIR | stop DIR | bindir" >&2; exit 2 ;;
esac
