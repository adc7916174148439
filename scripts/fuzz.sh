#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ (cargo-fuzz, libFuzzer).
#
#   scripts/fuzz.sh SECONDS [TARGET...]   run each target for SECONDS
#
# Installs what it needs when missing: a nightly toolchain (minimal
# profile) and cargo-fuzz (`cargo install cargo-fuzz --locked`). Targets
# are built without a sanitizer (safe Rust; speed) but with debug
# assertions and overflow checks. Each run starts from the committed
# corpus fuzz/corpus/<target>/ and writes what it finds to
# fuzz/target/found/<target>/; with FUZZ_UPDATE_CORPUS=1 those are merged
# into the committed corpus and minimised (`cargo fuzz cmin`). A crash
# leaves its input in fuzz/artifacts/<target>/ and fails the script.
# Prints one line per target: executions, executions per second, corpus.
# FUZZ_JOBS (default 1) runs that many libFuzzer jobs per target.
# FUZZ_DEV=1 builds unoptimised (`--dev`): 37% less build time here, far
# fewer executions a second; for the seconds-long smoke run in test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal >&2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked >&2
fi
cd fuzz
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || mapfile -t targets < <(cargo +nightly fuzz list)
flags=(--sanitizer none --debug-assertions)
[[ "${FUZZ_DEV:-0}" == 1 ]] && flags+=(--dev)
cargo +nightly fuzz build "${flags[@]}" >&2
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "target/found/$t"
    log=target/found/$t.log
    if ! cargo +nightly fuzz run "${flags[@]}" "$t" "target/found/$t" "corpus/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "fuzz.sh: $t failed (input in fuzz/artifacts/$t/)" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    if [[ "${FUZZ_UPDATE_CORPUS:-0}" == 1 ]]; then
        cp -n "target/found/$t"/* "corpus/$t/" 2>/dev/null || true
        # Edge coverage only (no hit counts): a few hundred files, not thousands.
        cargo +nightly fuzz cmin "${flags[@]}" "$t" "corpus/$t" -- -use_counters=0 \
            >"$log.cmin" 2>&1
        rm -rf "target/found/$t"
    fi
    printf '%-14s %12s runs %8s exec/s %5s corpus files\n' \
        "$t" "${runs:-?}" "${rate:-?}" "$(ls "corpus/$t" | wc -l)"
done
