#!/usr/bin/env bash
# Where the MariaDB trigger's cost goes (docs/BENCHMARKS.md, "MariaDB: ids
# against AUTO_INCREMENT"): the server's CPU per prepared single-row INSERT
# (one `mariadb` client session, N EXECUTEs; the CPU of all the server's
# threads from /proc/PID/task/*/schedstat), for five tables, round after
# round, interleaved:
#   p_auto      AUTO_INCREMENT, no trigger
#   p_cur       the trigger `shardflake mysql apply` installs
#   p_nofn      the same without the refusal function (a NULL, then an
#               inline SIGNAL with a fixed message)
#   p_min       only the draw: SET NEW.id = NEXT VALUE FOR seq
#   p_oneclock  ours with the epoch check dropped (one clock read)
#   p_nohw      ours without the high-water test (the read of the
#               restore guard's sequence in database shardflake)
#   p_norun     ours without the clock-loop test (IS_USED_LOCK of the
#               lock the clock event's loop holds)
# Prints every round and the lowest per table.
#
#   scripts/bench-db-trigger.sh          ROUNDS=8 N=5000 BIN=target/release/shardflake
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/shardflake}
[[ -x $BIN ]] || cargo build --release -q -p shardflake-cli
tmp=$(mktemp -d /tmp/shardflake-trigger.XXXXXX)
d=$tmp/db
url=$(scripts/mariadb.sh start $d | sed -n 1p)
port=$(cat $d/port); pid=$(scripts/mariadb.sh pid $d)
trap 'scripts/mariadb.sh stop $d >/dev/null 2>&1 || true; rm -rf $tmp' EXIT
q() { mariadb -h127.0.0.1 -P$port -uroot app -N -B "$@"; }
$BIN mysql apply --url "$url" >/dev/null
body=$(q -e "SELECT ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE EVENT_OBJECT_TABLE='posts'")
fn=$(q -e "SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_NAME LIKE '%refused%'")
seq=$(q -e "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE='SEQUENCE' AND TABLE_SCHEMA=DATABASE()")
echo "trigger body: $body" >&2; echo "fn=$fn seq=$seq" >&2
mode="SET SESSION sql_mode='STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';"
mk() { q -e "CREATE TABLE $1 (id BIGINT NOT NULL AUTO_INCREMENT, user_id BIGINT NOT NULL, body TEXT, id_by_trigger TINYINT NOT NULL DEFAULT 1, PRIMARY KEY(id)) ENGINE=InnoDB"; }
for t in p_auto p_cur p_nofn p_min p_oneclock p_nohw p_norun; do mk $t; done
# current: the body as installed
q -e "$mode CREATE TRIGGER t_cur BEFORE INSERT ON p_cur FOR EACH ROW $body"
# no function: error branch gives NULL, SIGNAL inline
expr=$(printf '%s' "$body" | sed -e "s/\`$fn\`(NEW.\`user_id\`)/NULL/")
printf '%s\nDELIMITER //\nCREATE TRIGGER t_nofn BEFORE INSERT ON p_nofn FOR EACH ROW BEGIN %s; IF NEW.id IS NULL THEN SIGNAL SQLSTATE "45000" SET MESSAGE_TEXT = "shardflake: refused"; END IF; END //\nDELIMITER ;\n' "$mode" "$expr" | q
# lower bound: only the draw
q -e "$mode CREATE TRIGGER t_min BEFORE INSERT ON p_min FOR EACH ROW SET NEW.id = NEXT VALUE FOR \`$seq\`"
# one clock: the epoch check dropped (measured only: a clock just before the epoch would then pass the band test with a draw near 0)
one=$(printf '%s' "$body" | sed -E "s/ AND TIMESTAMPDIFF\(MICROSECOND, TIMESTAMP'[^']*', UTC_TIMESTAMP\(6\)\) >= 0//")
q -e "$mode CREATE TRIGGER t_one BEFORE INSERT ON p_oneclock FOR EACH ROW $one"
# no high-water test: the restore guard's read dropped
nohw=$(printf '%s' "$body" | sed -E 's/ AND \(PREVIOUS VALUE FOR [^)]*\) >= \(SELECT next_not_cached_value FROM [^)]*\)//')
[[ $nohw != "$body" ]] || { echo "no high-water test in the trigger" >&2; exit 1; }
q -e "$mode CREATE TRIGGER t_nohw BEFORE INSERT ON p_nohw FOR EACH ROW $nohw"
# no clock-loop test: the IS_USED_LOCK of the clock event's lock dropped
norun=$(printf '%s' "$body" | sed -E "s/ AND IS_USED_LOCK\('[^']*'\) IS NOT NULL//")
[[ $norun != "$body" ]] || { echo "no clock-loop test in the trigger" >&2; exit 1; }
q -e "$mode CREATE TRIGGER t_norun BEFORE INSERT ON p_norun FOR EACH ROW $norun"
N=${N:-5000}
for t in p_auto p_cur p_nofn p_min p_oneclock p_nohw p_norun; do
  { echo "PREPARE s FROM 'INSERT INTO $t (user_id, body) VALUES (?, ?)'; SET @u=1801, @b='x';"
    for i in $(seq $N); do echo "EXECUTE s USING @u, @b;"; done; } > $d/$t.sql
done
cpu() { cat /proc/$pid/task/*/schedstat | awk '{s+=$1} END {printf "%d", s}'; }
declare -A best
for r in $(seq "${ROUNDS:-8}"); do
  for t in p_auto p_cur p_nofn p_min p_oneclock p_nohw p_norun; do
    a=$(cpu); q < $d/$t.sql; b=$(cpu)
    us=$(( (b - a) / N ))   # ns per insert
    [[ -z "${best[$t]:-}" || $us -lt ${best[$t]} ]] && best[$t]=$us
    printf '%s round %d: %d ns/insert\n' $t $r $us
  done
done
for t in p_auto p_cur p_nofn p_min p_oneclock p_nohw p_norun; do
  printf 'lowest %-10s %6d ns/insert  %.2fx p_auto\n' $t ${best[$t]} "$(echo "${best[$t]} / ${best[p_auto]}" | bc -l)"
done
