#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/ (cargo-fuzz, libFuzzer).
#
#   scripts/fuzz.sh SECONDS [TARGET...]   run each target for SECONDS
#
# Needs a nightly toolchain and cargo-fuzz (installed here when missing).
# New inputs that reach new code are kept in fuzz/corpus/<target>/ (commit
# them); a crash leaves its input in fuzz/artifacts/<target>/ and fails.
# Prints one line per target: executions and corpus size.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:?usage: scripts/fuzz.sh SECONDS [TARGET...]}
shift
if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: a nightly toolchain is needed (rustup toolchain install nightly)" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz >&2
fi
cd fuzz
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || mapfile -t targets < <(cargo +nightly fuzz list)
cargo +nightly fuzz build -O "${targets[@]/#/}" >&2 2>/dev/null || cargo +nightly fuzz build -O >&2
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    log=$(mktemp)
    if ! cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "fuzz.sh: $t failed (input in fuzz/artifacts/$t/)" >&2
        exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    printf '%-16s %12s runs %6s corpus files\n' "$t" "${runs:-?}" "$(ls "corpus/$t" | wc -l)"
    rm -f "$log"
done
