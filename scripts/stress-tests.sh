#!/usr/bin/env bash
# Run the whole test suite N times (default 10), every other run with a
# CPU hog on each core, and print the tests that failed with how often
# (and under which load). A suite that never flakes prints "0 failures".
#   scripts/stress-tests.sh [N]
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:-10}"
logdir="$(mktemp -d /tmp/hover-stress.XXXXXX)"
cargo test --workspace --no-run -q || exit 1
hogs=()
stop_hogs() {
    for p in "${hogs[@]}"; do kill "$p" 2>/dev/null; done
    hogs=()
}
trap stop_hogs EXIT
for i in $(seq 1 "$runs"); do
    load=idle
    if [ $((i % 2)) -eq 0 ]; then
        load=hogs
        for _ in $(seq 1 "$(nproc)"); do
            sh -c 'while :; do :; done' &
            hogs+=($!)
        done
    fi
    start=$(date +%s)
    cargo test --workspace --no-fail-fast > "$logdir/run$i.log" 2>&1
    rc=$?
    stop_hogs
    if ! grep -E '^test .* FAILED$' "$logdir/run$i.log" | sed "s/^test //; s/ \.\.\. FAILED$/ ($load)/" >> "$logdir/failures" \
        && [ "$rc" -ne 0 ]; then
        # A failure no test names: a test binary that crashed, a build
        # error, the watchdog ending a hung binary.
        echo "run $i: exit $rc, no test named ($load)" >> "$logdir/failures"
    fi
    echo "run $i/$runs ($load): exit $rc in $(( $(date +%s) - start )) s"
done
if [ -s "$logdir/failures" ]; then
    echo "failures (count, test, load):"
    sort "$logdir/failures" | uniq -c | sort -rn
    echo "logs: $logdir"
    exit 1
fi
echo "0 failures in $runs runs (logs: $logdir)"
