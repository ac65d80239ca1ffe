#!/bin/sh
# Run every fuzz target (fuzz/, cargo-fuzz on the nightly toolchain) for
# SECONDS each (default 60; with RUNS=N set, until N executions or SECONDS,
# whichever comes first; MAX_LEN=N caps input size), growing its corpus in fuzz/corpus/TARGET, and
# print per target the executions and the findings (crash, leak or
# timeout inputs, kept in fuzz/artifacts/TARGET). A finding is turned into
# a regression test in the normal suite (crates/vmm/src/fuzzing.rs tests).
# Not in CI (time). Needs: cargo install cargo-fuzz; rustup toolchain nightly.
set -eu
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
TARGETS=${TARGETS:-"elf cmdline api_body snapshot migration_stream guest_records virtio_block virtio_mmio"}
command -v cargo-fuzz > /dev/null || { echo "fuzz.sh: needs cargo-fuzz (cargo install cargo-fuzz)"; exit 2; }
# Built once, then run directly: editing the sources meanwhile does not
# change the binaries under test.
cargo +nightly fuzz build -O > /dev/null
BIN=fuzz/target/x86_64-unknown-linux-gnu/release
mkdir -p fuzz/logs
printf '%-18s %14s %10s %9s\n' target executions exec/s findings
for t in $TARGETS; do
    mkdir -p "fuzz/corpus/$t" "fuzz/artifacts/$t"
    "$BIN/$t" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
        -max_total_time="$SECONDS_EACH" ${RUNS:+-runs=$RUNS} ${MAX_LEN:+-max_len=$MAX_LEN} -print_final_stats=1 -rss_limit_mb=4096 \
        > "fuzz/logs/$t.log" 2>&1 || true
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "fuzz/logs/$t.log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "fuzz/logs/$t.log" | tail -1)
    found=$(ls "fuzz/artifacts/$t" | wc -l)
    printf '%-18s %14s %10s %9s\n' "$t" "${execs:-?}" "${rate:-?}" "$found"
done
