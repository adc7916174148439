#!/usr/bin/env bash
# Starts, crashes, restarts and stops a throw-away MariaDB server on 127.0.0.1.
#
#   scripts/mariadb.sh start [DIR]   prints the URL (mysql://root@127.0.0.1:PORT/app;
#                                    database app is created)
#                                    and, last, "dir DIR"
#   scripts/mariadb.sh kill DIR      SIGKILLs it (a crash: no shutdown, InnoDB
#                                    recovers at the next start); waits until dead
#   scripts/mariadb.sh restart DIR   starts it again on the same data and port
#                                    (after kill or stop-less SIGTERM); prints the URL
#   scripts/mariadb.sh pid DIR       prints the server's pid
#   scripts/mariadb.sh stop DIR      stops it (SIGTERM, clean) and removes DIR
#
# --no-defaults comes first so /etc/mysql is ignored; as root it runs with
# --user=root; root logs in over TCP with no password. No binary log. InnoDB
# writes its log to the OS at every commit and flushes it once a second
# (innodb_flush_log_at_trx_commit=2): a killed server (SIGKILL) loses no
# committed transaction, an OS crash may lose the last second; the data is
# thrown away anyway. The event scheduler is on (the MariaDB one-statement
# ids keep their sequence up with the clock through an event).
#
# Environment, read by start (and remembered for restart):
#   MARIADB_OPTS="--opt=value ..."  extra server options (last wins, e.g.
#                                   --innodb-flush-log-at-trx-commit=0)
#   MARIADB_FAKETIME_FILE=FILE      run mariadbd under libfaketime, its clock
#                                   offset read from FILE at every call
#                                   (write "-10s", "+1d" or "+0" into FILE);
#                                   the file is created with "+0" if missing
set -euo pipefail

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

faketime_lib() {
  local f
  for f in /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 /usr/lib/*/faketime/libfaketime.so.1; do
    [[ -e $f ]] && { echo "$f"; return; }
  done
  echo "mariadb.sh: libfaketime not installed (run scripts/install-deps.sh)" >&2
  exit 1
}

# Starts mariadbd on the data dir and port recorded in DIR; waits until it
# answers queries.
launch() {
  local dir=$1 port user=() opts=() env=()
  port=$(cat "$dir/port")
  [[ $(id -u) -eq 0 ]] && user=(--user=root)
  read -r -a opts <"$dir/opts" || true
  if [[ -s $dir/faketime ]]; then
    env=(env LD_PRELOAD="$(faketime_lib)" FAKETIME_TIMESTAMP_FILE="$(cat "$dir/faketime")"
      FAKETIME_NO_CACHE=1 FAKETIME_DONT_FAKE_MONOTONIC=1)
  fi
  "${env[@]}" mariadbd --no-defaults --datadir="$dir/data" --port="$port" --bind-address=127.0.0.1 \
    --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --tmpdir="$dir/tmp" --skip-log-bin \
    --innodb-flush-log-at-trx-commit=2 --innodb-buffer-pool-size=256M --max-connections=500 \
    --event-scheduler=ON "${opts[@]}" "${user[@]}" >>"$dir/server.log" 2>&1 &
  echo $! >"$dir/server.pid"
  # Ready when the server on the port is this one (its data directory):
  # another start may have taken the port between the probe and the bind,
  # and then this server dies on its bind ("already in use") instead.
  local datadir got
  datadir="$(cd "$dir/data" && pwd -P)/"
  for _ in $(seq 1 600); do
    if ! port_free "$port" &&
      got=$(mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -N -B -e 'SELECT @@datadir' 2>/dev/null) &&
      [[ $got == "$datadir" ]] &&
      mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -e 'CREATE DATABASE IF NOT EXISTS app' 2>/dev/null; then
      echo "mysql://root@127.0.0.1:$port/app"
      return
    fi
    alive "$(cat "$dir/server.pid")" || break
    sleep 0.1
  done
  cat "$dir/server.log" >&2
  exit 1
}

# A dead daemon may linger as a zombie: check its state, not kill -0.
alive() {
  local state
  state=$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null || true)
  [[ -n $state && $state != Z ]]
}

wait_dead() {
  for _ in $(seq 1 300); do
    alive "$1" || return 0
    sleep 0.05
  done
  return 1
}

start() {
  local dir=${1:-} port user=()
  [[ -n $dir ]] || dir=$(mktemp -d /tmp/shardflake-mariadb.XXXXXX)
  mkdir -p "$dir"
  command -v mariadbd >/dev/null || { echo "mariadb.sh: mariadbd not installed (run scripts/install-deps.sh)" >&2; exit 1; }
  [[ $(id -u) -eq 0 ]] && user=(--user=root)
  # Temporary files under DIR: servers started side by side share nothing.
  mkdir -p "$dir/tmp"
  mariadb-install-db --no-defaults --datadir="$dir/data" --tmpdir="$dir/tmp" \
    --auth-root-authentication-method=normal \
    --skip-test-db "${user[@]}" >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
  # Below the kernel's ephemeral range (ip_local_port_range, 32768 and up
  # here): servers that bind port 0 never take it, so after `kill` the port
  # is still free for `restart`.
  local low high
  read -r low high </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
  ((low > 20500)) || low=32768
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % (low - 20000)))
    port_free "$port" && break
  done
  echo "$port" >"$dir/port"
  echo "${MARIADB_OPTS:-}" >"$dir/opts"
  if [[ -n ${MARIADB_FAKETIME_FILE:-} ]]; then
    [[ -e $MARIADB_FAKETIME_FILE ]] || echo "+0" >"$MARIADB_FAKETIME_FILE"
    faketime_lib >/dev/null
    echo "$MARIADB_FAKETIME_FILE" >"$dir/faketime"
  fi
  launch "$dir"
  echo "dir $dir"
}

# The main thread of a killed mariadbd shows as a zombie while its other
# threads are still exiting, holding the listening socket: wait for the port.
wait_port_free() {
  for _ in $(seq 1 300); do
    port_free "$1" && return 0
    sleep 0.05
  done
  return 1
}

kill_server() {
  local dir=${1:?usage: mariadb.sh kill DIR} pid
  pid=$(cat "$dir/server.pid")
  kill -KILL "$pid" 2>/dev/null || true
  wait_dead "$pid" || { echo "mariadb.sh: pid $pid still alive after SIGKILL" >&2; exit 1; }
  wait_port_free "$(cat "$dir/port")" || { echo "mariadb.sh: port $(cat "$dir/port") still taken after SIGKILL" >&2; exit 1; }
}

restart() {
  local dir=${1:?usage: mariadb.sh restart DIR} pid
  pid=$(cat "$dir/server.pid")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    wait_dead "$pid" || { echo "mariadb.sh: pid $pid did not stop" >&2; exit 1; }
  fi
  wait_port_free "$(cat "$dir/port")" || { echo "mariadb.sh: port $(cat "$dir/port") taken" >&2; exit 1; }
  launch "$dir"
}

stop() {
  local dir=${1:?usage: mariadb.sh stop DIR} pid
  if [[ -f $dir/server.pid ]]; then
    pid=$(cat "$dir/server.pid")
    kill -TERM "$pid" 2>/dev/null || true
    wait_dead "$pid" || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  kill) shift; kill_server "$@" ;;
  restart) shift; restart "$@" ;;
  pid) shift; cat "${1:?usage: mariadb.sh pid DIR}/server.pid" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start [DIR] | kill DIR | restart DIR | pid DIR | stop DIR" >&2; exit 2 ;;
esac
