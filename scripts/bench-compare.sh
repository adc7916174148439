#!/usr/bin/env bash
# The full `shardflake compare` run of docs/BENCHMARKS.md: a release build,
# a fresh PostgreSQL and MariaDB from scripts/pg.sh and scripts/mariadb.sh
# (fsync off; MariaDB with the event scheduler on), every scheme, then the
# servers stopped. Prints the Markdown tables; the chart goes to FILE.svg.
#
#   scripts/bench-compare.sh [FILE.svg] [compare options...]
#   e.g. scripts/bench-compare.sh docs/compare.svg --rows 1000000
set -euo pipefail
cd "$(dirname "$0")/.."
chart=${1:-docs/compare.svg}
shift || true
cargo build -q --release -p shardflake-cli
work=$(mktemp -d)
pg_dir= my_dir=
cleanup() {
  [[ -n $pg_dir ]] && bash scripts/pg.sh stop "$pg_dir" >/dev/null 2>&1 || true
  [[ -n $my_dir ]] && bash scripts/mariadb.sh stop "$my_dir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
bash scripts/pg.sh start 1 >"$work/pg"
pg_dir=$(sed -n 's/^dir //p' "$work/pg")
bash scripts/mariadb.sh start >"$work/my"
my_dir=$(sed -n 's/^dir //p' "$work/my")
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start, $(date -u +%FT%TZ)" >&2
target/release/shardflake compare --pg "$(head -1 "$work/pg")" --mysql "$(head -1 "$work/my")" \
  --format markdown --chart "$chart" "$@"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
