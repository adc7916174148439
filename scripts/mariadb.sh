#!/usr/bin/env bash
# Starts and stops a throw-away MariaDB server on 127.0.0.1.
#
#   scripts/mariadb.sh start [DIR]   prints the URL (mysql://root@127.0.0.1:PORT/app;
#                                    database app is created)
#                                    and, last, "dir DIR"
#   scripts/mariadb.sh stop DIR      stops it (SIGTERM, clean) and removes DIR
#
# --no-defaults comes first so /etc/mysql is ignored; as root it runs with
# --user=root; root logs in over TCP with no password. No binary log, InnoDB
# flushes once a second (data is thrown away).
set -euo pipefail

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
  local dir=${1:-} port user=()
  [[ -n $dir ]] || dir=$(mktemp -d /tmp/shardflake-mariadb.XXXXXX)
  mkdir -p "$dir"
  command -v mariadbd >/dev/null || { echo "mariadb.sh: mariadbd not installed (run scripts/install-deps.sh)" >&2; exit 1; }
  [[ $(id -u) -eq 0 ]] && user=(--user=root)
  mariadb-install-db --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
    --skip-test-db "${user[@]}" >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; exit 1; }
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 30000))
    port_free "$port" && break
  done
  mariadbd --no-defaults --datadir="$dir/data" --port="$port" --bind-address=127.0.0.1 \
    --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --skip-log-bin \
    --innodb-flush-log-at-trx-commit=0 --innodb-buffer-pool-size=256M --max-connections=500 \
    "${user[@]}" >"$dir/server.log" 2>&1 &
  echo $! >"$dir/server.pid"
  for _ in $(seq 1 600); do
    if ! port_free "$port" &&
      mariadb --no-defaults -h 127.0.0.1 -P "$port" -u root -e 'CREATE DATABASE IF NOT EXISTS app' 2>/dev/null; then
      echo "mysql://root@127.0.0.1:$port/app"
      echo "dir $dir"
      return
    fi
    if ! kill -0 "$(cat "$dir/server.pid")" 2>/dev/null; then break; fi
    sleep 0.1
  done
  cat "$dir/server.log" >&2
  exit 1
}

stop() {
  local dir=${1:?usage: mariadb.sh stop DIR} pid
  if [[ -f $dir/server.pid ]]; then
    pid=$(cat "$dir/server.pid")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
      # A dead daemon may linger as a zombie: check its state, not kill -0.
      state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
      [[ -z $state || $state == Z ]] && break
      sleep 0.1
    done
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) echo "usage: $0 start [DIR] | stop DIR" >&2; exit 2 ;;
esac
