#!/usr/bin/env bash
# Starts, crashes, restarts and stops throw-away PostgreSQL servers on
# 127.0.0.1, for tests, benchmarks and the README walk-through.
#
#   scripts/pg.sh start N [DIR]   start N servers under DIR (default: a new
#                                 temp dir); prints one URL per line and, last,
#                                 "dir DIR"
#   scripts/pg.sh kill DIR [I]    SIGKILL server I (1..N) under DIR, or every
#                                 one (a crash: the postmaster, then its
#                                 children; WAL recovery at the next start);
#                                 waits until all its processes are dead and
#                                 its port is free
#   scripts/pg.sh restart DIR [I] start server I (or every one) again on the
#                                 same data, port and settings (after kill or
#                                 halt; a running one is stopped first, fast
#                                 mode); waits until it accepts connections;
#                                 prints its URL
#   scripts/pg.sh halt DIR        stop every server under DIR now (immediate
#                                 mode), keeping DIR
#   scripts/pg.sh stop DIR        stop every server under DIR and remove DIR
#   scripts/pg.sh bindir          print the newest PostgreSQL's bin directory
#                                 (pgbench, psql)
#
# Environment, read by start (and remembered for restart):
#   PG_OPTS="-c name=value ..."   extra server settings (last wins, e.g.
#                                 -c max_connections=10)
#
# Each server: initdb --auth=trust -U postgres, a free port probed before use,
# fsync=off (data is thrown away: an OS crash may lose the last commits, a
# killed server loses none), max_connections=200, socket in its own dir.
# PostgreSQL refuses to run as root, so initdb/pg_ctl run as user postgres.
# synchronous_commit=on (with fsync off, a commit's WAL write costs no disk
# flush): `shardflake pg check` fails on off, under which a killed server
# loses its last commits (the WAL not yet written from shared memory); a
# test of that passes PG_OPTS="-c synchronous_commit=off".
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

# Starts the server on data dir $2 (DIR/pgI) with the port and settings
# recorded at start in DIR/pgI.port and DIR/pgI.opts; waits until it accepts
# connections and prints its URL.
launch() {
  local bin=$1 data=$2 port
  port=$(cat "$data.port")
  as_pg "$bin/pg_ctl" -D "$data" -l "$data.log" -w -t 60 \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=on -c full_page_writes=off -c max_connections=200 $(cat "$data.opts" 2>/dev/null)" \
    start >/dev/null || { tail -n 40 "$data.log" >&2; exit 1; }
  echo "postgres://postgres@127.0.0.1:$port/postgres"
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
    echo "$port" >"$data.port"
    echo "${PG_OPTS:-}" >"$data.opts"
    launch "$bin" "$data"
  done
  echo "dir $dir"
}

# The data dirs of server $2 under DIR $1, or of every server when $2 is
# empty.
data_dirs() {
  local dir=$1 i=${2:-} data
  if [[ -n $i ]]; then
    [[ -f "$dir/pg$i/PG_VERSION" ]] || { echo "pg.sh: no server $i under $dir" >&2; exit 1; }
    echo "$dir/pg$i"
    return
  fi
  for data in "$dir"/pg*/; do
    [[ -f "$data/PG_VERSION" ]] && echo "${data%/}"
  done
  return 0
}

# Every live process of the server on data dir $1, found by its working
# directory (PostgreSQL's processes all chdir there): the postmaster and its
# children, also once the postmaster is dead and they are orphans. Zombies
# have no working directory: dead ones are not listed.
server_pids() {
  local data
  data=$(cd "$1" && pwd -P)
  # find fails on processes that exit while it reads /proc: not an error.
  { find /proc -mindepth 2 -maxdepth 2 -name cwd -lname "$data" 2>/dev/null || true; } | cut -d/ -f3
}

# Orphaned children notice their postmaster's death only when they next
# wait; one running a statement would finish it first: kill them too, then
# wait until none is left (their shared memory detached, which the next
# postmaster checks) and the port is free.
kill_server() {
  local dir=${1:?usage: pg.sh kill DIR [I]} dirs data pm port pids
  dirs=$(data_dirs "$dir" "${2:-}")
  for data in $dirs; do
    port=$(cat "$data.port")
    # postmaster.pid outlives a crash: its pid is killed only while that
    # process is still one of this server's.
    pm=$(head -n1 "$data/postmaster.pid" 2>/dev/null || true)
    pids=$(server_pids "$data")
    if [[ -n $pm ]] && grep -qx "$pm" <<<"$pids"; then
      kill -KILL "$pm" 2>/dev/null || true
    fi
    for _ in $(seq 1 300); do
      pids=$(server_pids "$data")
      [[ -z $pids ]] && port_free "$port" && break
      # shellcheck disable=SC2086
      [[ -n $pids ]] && kill -KILL $pids 2>/dev/null || true
      sleep 0.05
    done
    [[ -z $(server_pids "$data") ]] || { echo "pg.sh: processes of $data still alive after SIGKILL" >&2; exit 1; }
    port_free "$port" || { echo "pg.sh: port $port still taken after SIGKILL" >&2; exit 1; }
  done
}

restart() {
  local dir=${1:?usage: pg.sh restart DIR [I]} dirs data bin port
  bin=$(bindir)
  dirs=$(data_dirs "$dir" "${2:-}")
  for data in $dirs; do
    port=$(cat "$data.port")
    if [[ -n $(server_pids "$data") ]]; then
      as_pg "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null
    fi
    # None of its processes is alive: the lock files a killed server leaves
    # (data dir and socket) only name a dead postmaster, which may linger as
    # a zombie (PID 1 reaps lazily) that PostgreSQL takes for a running one.
    [[ -z $(server_pids "$data") ]] || { echo "pg.sh: $data still has live processes" >&2; exit 1; }
    rm -f "$data/postmaster.pid" "$data/.s.PGSQL.$port.lock"
    # The port is below the ephemeral range (free_port): nothing else
    # should take it while the server is down, but never talk to another.
    port_free "$port" || { echo "pg.sh: port $port of $data is taken" >&2; exit 1; }
    launch "$bin" "$data"
  done
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
  kill) shift; kill_server "$@" ;;
  restart) shift; restart "$@" ;;
  halt) shift; halt "$@" ;;
  stop) shift; stop "$@" ;;
  bindir) bindir ;;
  *) echo "usage: $0 start N [DIR] | kill DIR [I] | restart DIR [I] | halt DIR | stop DIR | bindir" >&2; exit 2 ;;
esac
