#!/usr/bin/env bash
# A layout's random start inside the database: how `id % 16` spreads at
# 10, 1,000 and 100,000 ids/s, and what the option costs at the cap, for
# PostgreSQL (`pg apply`) and MariaDB (`mysql apply`), each layout without
# and with `random start 4 bits` in the same run.
#
# One PostgreSQL and one MariaDB server started here (scripts/pg.sh,
# scripts/mariadb.sh), a database per variant (each holds its own
# deployment-wide functions). The ids are made by the server itself:
#   PostgreSQL: shard 0's next_id() in a PL/pgSQL loop on the server,
#   MariaDB:    single-row INSERTs (the trigger's ids) in a stored procedure,
# each call paced to an absolute schedule (sleeping until call i is due at
# i / rate), so the rate is the server's, not a client's round trips. A rate
# the server cannot reach runs flat out: the rate printed is the one the
# ids' own times show (ids over the ticks they span).
#
# The cap: a layout with a sequence narrow enough for the server to pass
# its cap: PostgreSQL 6 bits (64 ids per 1 ms tick, 64,000 ids/s), one
# session; MariaDB 4 bits (16 ids per tick), two sessions at once. CAP_IDS
# ids in all, in one statement per session, counted per tick of their time
# field (ids over the ticks they span: what the server packs into a tick)
# and per second of wall time (above the cap by the lead the ids may take
# on the clock, about a second).
#
#   scripts/bench-random-start.sh            markdown on stdout
#   SF=target/debug/shardflake scripts/bench-random-start.sh   (no build)
#
# Environment: SLOW_IDS ids at 10 ids/s (default 400, 40 s; the two
# variants run at once), MID_IDS at 1,000 ids/s (default 16,000),
# FAST_IDS at 100,000 ids/s (default 160,000), CAP_IDS (default 320,000),
# ONLY=pg or ONLY=mariadb.
set -euo pipefail
cd "$(dirname "$0")/.."
SLOW_IDS=${SLOW_IDS:-400}
MID_IDS=${MID_IDS:-16000}
FAST_IDS=${FAST_IDS:-160000}
CAP_IDS=${CAP_IDS:-320000}
if [[ -z ${SF:-} ]]; then
  # The ids are made inside the servers: the binary only installs them.
  cargo build -q -p shardflake-cli
  SF=${CARGO_TARGET_DIR:-target}/debug/shardflake
fi

work=$(mktemp -d /tmp/shardflake-random-start.XXXXXX)
chmod 755 "$work"
pgdir="$work/pg" mdir="$work/mariadb"
cleanup() {
  scripts/pg.sh stop "$pgdir" >/dev/null 2>&1 || true
  scripts/mariadb.sh stop "$mdir" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# The rates: name, ids/s, how many ids.
rates=("10 $SLOW_IDS" "1000 $MID_IDS" "100000 $FAST_IDS")
RS=", random start 4 bits"

# Prints the markdown of one database's results from lines
# "variant rate residue count" (hist) and "variant rate ids ticks" (span).
report() {
  local db=$1 hist=$2 span=$3
  echo
  echo "#### $db: id % 16"
  echo
  echo "| rate asked | reached (ids over their ticks) | without: share of each residue | with 4 bits: share of each residue |"
  echo "|---|---|---|---|"
  for r in "${rates[@]}"; do
    read -r rate _ <<<"$r"
    awk -v rate="$rate" -v db="$db" '
      FNR == NR { if ($2 == rate) { ids[$1] = $3; ticks[$1] = $4 } next }
      $2 == rate { n[$1] += $4; c[$1, $3] = $4 }
      END {
        reached = sprintf("%.0f / %.0f ids/s", ids["plain"] * 1000 / ticks["plain"], ids["random"] * 1000 / ticks["random"])
        for (v = 0; v < 2; v++) {
          name = v ? "random" : "plain"
          lo = 101; hi = -1; on0 = 100 * c[name, 0] / n[name]
          for (i = 0; i < 16; i++) { s = 100 * c[name, i] / n[name]; if (s < lo) lo = s; if (s > hi) hi = s }
          cell[v] = sprintf("%.1f%% on 0; %.1f–%.1f%% (n = %d)", on0, lo, hi, n[name])
        }
        printf "| %s ids/s | %s | %s | %s |\n", rate, reached, cell[0], cell[1]
      }' "$span" "$hist"
  done
  echo
  echo '```text'
  for r in "${rates[@]}"; do
    read -r rate _ <<<"$r"
    echo "$db, $rate ids/s: id % 16, without | with random start 4 bits (one # per 1% of the ids)"
    awk -v rate="$rate" '
      $2 == rate { n[$1] += $4; c[$1, $3] = $4 }
      END {
        for (i = 0; i < 16; i++) {
          a = 100 * c["plain", i] / n["plain"]; b = 100 * c["random", i] / n["random"]
          printf "  %2d  %-26s %5.1f%%   %-26s %5.1f%%\n", i, bar(a), a, bar(b), b
        }
      }
      function bar(p,   s, k) { s = ""; for (k = 1; k <= p && k <= 25; k++) s = s "#"; if (p > 25) s = s ">"; return s }' "$hist"
  done
  echo '```'
}

# Prints the cap table from lines "variant ids ticks seconds".
cap_report() {
  local db=$1 file=$2 bits=$3
  echo
  echo "#### $db: at the cap ($bits-bit sequence: $((1 << bits)) ids per tick, $((1 << bits)),000 ids/s)"
  echo
  echo "| random start | ids | ids per tick (ids over the ticks they span) | of the cap | ids/s, wall time |"
  echo "|---|---|---|---|---|"
  awk -v cap=$((1 << bits)) '{ printf "| %s | %d | %.2f | %.2f%% | %.0f |\n", ($1 == "plain" ? "none" : "4 bits"), $2, $2 / $3, 100 * $2 / $3 / cap, $2 / $4 }' "$file"
}

echo "# Random start inside the database ($(date -u +%F), load average $(cut -d' ' -f1-3 /proc/loadavg))"

if [[ ${ONLY:-} != mariadb ]]; then
  # next_id() keeps its promise on a 6-bit sequence only with fewer than
  # 16 sessions (pg apply checks): few connections, few workers.
  url=$(PG_OPTS="-c max_connections=8 -c max_worker_processes=4" scripts/pg.sh start 1 "$pgdir" | sed -n 1p)
  port=${url##*:}; port=${port%%/*}
  bin=$(scripts/pg.sh bindir)
  psql() { "$bin/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres "$@"; }
  # variant database layout
  pg_variants=(
    "plain plain time 41 | shard 13 | sequence 10 (epoch 1314220021721 ms)"
    "random random time 41 | shard 13 | sequence 10 (epoch 1314220021721 ms$RS)"
    "plain capplain time 41 | shard 17 | sequence 6 (epoch 1314220021721 ms)"
    "random caprandom time 41 | shard 17 | sequence 6 (epoch 1314220021721 ms$RS)"
  )
  for v in "${pg_variants[@]}"; do
    read -r _ db layout <<<"$v"
    psql -d postgres -c "CREATE DATABASE $db"
    cat >"$work/$db.toml" <<TOML
layout = "$layout"
shards = 1
[[servers]]
name = "bench"
url = "${url%/*}/$db"
shards = "0"
TOML
    # Each database a deployment of its own (its ids may equal another's).
    new=(); [[ $db == plain ]] || new=(--new-deployment)
    "$SF" pg apply -t "$work/$db.toml" "${new[@]}" >/dev/null 2>"$work/apply.log" ||
      { cat "$work/apply.log" >&2; exit 1; }
    # Ids at a rate, on an absolute schedule: call i is due at i / rate.
    psql -d "$db" <<'SQL'
CREATE TABLE ids (rate int, id bigint);
CREATE FUNCTION paced(n int, rate float8) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t0 float8 := extract(epoch FROM clock_timestamp());
  d float8;
BEGIN
  FOR i IN 0..n - 1 LOOP
    d := t0 + i / rate - extract(epoch FROM clock_timestamp());
    IF d > 0 THEN
      PERFORM pg_sleep(d);
    END IF;
    INSERT INTO ids VALUES (rate, shard0.next_id('shard0.id_seq'::regclass));
  END LOOP;
END $$;
SQL
  done
  for r in "${rates[@]}"; do
    read -r rate n <<<"$r"
    # The two variants at once where the server sleeps most of the time;
    # one after the other where it runs flat out.
    if ((rate <= 1000)); then
      psql -d plain -c "SELECT paced($n, $rate)" >/dev/null &
      psql -d random -c "SELECT paced($n, $rate)" >/dev/null
      wait $!
    else
      psql -d plain -c "SELECT paced($n, $rate)" >/dev/null
      psql -d random -c "SELECT paced($n, $rate)" >/dev/null
    fi
  done
  : >"$work/pg.hist"; : >"$work/pg.span"
  for db in plain random; do
    # Instagram's layout: the time field starts at bit 23.
    psql -d "$db" -F' ' -c "SELECT '$db', rate, id % 16, count(*) FROM ids GROUP BY 2, 3" >>"$work/pg.hist"
    psql -d "$db" -F' ' -c "SELECT '$db', rate, count(*), max(id >> 23) - min(id >> 23) + 1 FROM ids GROUP BY 2" >>"$work/pg.span"
  done
  : >"$work/pg.cap"
  for db in capplain caprandom; do
    psql -d "$db" -F' ' <<SQL >>"$work/pg.cap"
CREATE TEMP TABLE t0 AS SELECT clock_timestamp() AS t;
INSERT INTO ids SELECT 0, shard0.next_id('shard0.id_seq'::regclass) FROM generate_series(1, $CAP_IDS);
SELECT '${db#cap}', count(*), max(id >> 23) - min(id >> 23) + 1,
       extract(epoch FROM clock_timestamp() - (SELECT t FROM t0)) FROM ids;
SQL
  done
  report PostgreSQL "$work/pg.hist" "$work/pg.span"
  cap_report PostgreSQL "$work/pg.cap" 6
  scripts/pg.sh stop "$pgdir" >/dev/null 2>&1
fi

if [[ ${ONLY:-} != pg ]]; then
  murl=$(scripts/mariadb.sh start "$mdir" | sed -n 1p)
  mport=${murl##*:}; mport=${mport%%/*}
  my() { mariadb --no-defaults -h 127.0.0.1 -P "$mport" -u root -N -B "$@"; }
  # variant database layout (the MySQL procedure variant's layout)
  my_variants=(
    "plain plain time 43 | shard 10 | sequence 10 (epoch 1672531200000 ms)"
    "random random time 43 | shard 10 | sequence 10 (epoch 1672531200000 ms$RS)"
    "plain capplain time 43 | shard 16 | sequence 4 (epoch 1672531200000 ms)"
    "random caprandom time 43 | shard 16 | sequence 4 (epoch 1672531200000 ms$RS)"
  )
  for v in "${my_variants[@]}"; do
    read -r _ db layout <<<"$v"
    my -e "CREATE DATABASE $db"
    # A table of its own name in each database: no two apply the same table.
    "$SF" mysql --url "${murl%/*}/$db" apply --table "ids_$db" --layout "$layout" \
      >/dev/null 2>"$work/apply.log" || { cat "$work/apply.log" >&2; exit 1; }
    my "$db" <<SQL
DELIMITER //
CREATE PROCEDURE paced(n INT, rate DOUBLE)
BEGIN
  DECLARE i INT DEFAULT 0;
  DECLARE t0 DOUBLE DEFAULT UNIX_TIMESTAMP(SYSDATE(6));
  DECLARE d DOUBLE;
  WHILE i < n DO
    SET d = t0 + i / rate - UNIX_TIMESTAMP(SYSDATE(6));
    IF d > 0 THEN
      DO SLEEP(d);
    END IF;
    INSERT INTO ids_$db (user_id, body) VALUES (7, rate);
    SET i = i + 1;
  END WHILE;
END //
SQL
  done
  for r in "${rates[@]}"; do
    read -r rate n <<<"$r"
    if ((rate <= 1000)); then
      my plain -e "CALL paced($n, $rate)" &
      my random -e "CALL paced($n, $rate)"
      wait $!
    else
      my plain -e "CALL paced($n, $rate)"
      my random -e "CALL paced($n, $rate)"
    fi
  done
  : >"$work/my.hist"; : >"$work/my.span"
  for db in plain random; do
    # The MySQL procedure variant's layout: the time field starts at bit 20.
    my "$db" -e "SELECT '$db', body, id % 16, COUNT(*) FROM ids_$db GROUP BY 2, 3" >>"$work/my.hist"
    my "$db" -e "SELECT '$db', body, COUNT(*), MAX(id >> 20) - MIN(id >> 20) + 1 FROM ids_$db GROUP BY 2" >>"$work/my.span"
  done
  : >"$work/my.cap"
  for db in capplain caprandom; do
    t0=$(date +%s.%N)
    pids=()
    for _ in 1 2; do
      my "$db" -e "INSERT INTO ids_$db (user_id, body) SELECT 7, 'cap' FROM seq_1_to_$((CAP_IDS / 2))" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    my "$db" -e "SELECT '${db#cap}', COUNT(*), MAX(id >> 20) - MIN(id >> 20) + 1, $elapsed FROM ids_$db" >>"$work/my.cap"
  done
  report MariaDB "$work/my.hist" "$work/my.span"
  cap_report MariaDB "$work/my.cap" 4
fi
