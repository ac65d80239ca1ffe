#!/usr/bin/env bash
# A guest that touches fresh memory after a post-copy move: how long the
# destination's run takes with each of two hover binaries, interleaved.
#   scripts/postcopy-fresh-memory.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# Each round moves a 2 GiB `memtouch size=768M tasks=2` guest 0.3 s into
# its run, in post-copy over a Unix socket, with each binary in turn; the
# destination then writes the rest of its 768 MiB. Prints each run, each
# round's ratio (before / after) and their min/median/max.
set -euo pipefail
before=$1 after=$2 rounds=${3:-3}

one() {
    local bin=$1 d
    d=$(mktemp -d /tmp/hover-pcfresh.XXXXXX)
    "$bin" receive --listen "unix:$d/in.sock" --json --console off > "$d/dest.json" 2> "$d/dest.err" &
    local rx=$!
    while ! grep -q "waiting" "$d/dest.err" 2>/dev/null; do sleep 0.01; done
    "$bin" run --memory 2G --cmdline "workload=memtouch size=768M tasks=2" \
        --api-socket "$d/src.sock" --json --console off > "$d/src.json" 2> "$d/src.err" &
    local sx=$!
    while [ ! -S "$d/src.sock" ]; do sleep 0.01; done
    sleep 0.3
    "$bin" ctl --api-socket "$d/src.sock" migrate --to "unix:$d/in.sock" --mode postcopy > /dev/null 2> "$d/migrate.err"
    wait "$sx" "$rx"
    python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
p = o.get("pager") or {}
assert o["exit_code"] == 0, o["exit_code"]
print(o["timings"]["exit_us"] / 1000, p.get("released"), p.get("faults"))
' "$d/dest.json"
    rm -rf "$d"
}

ratios=()
for r in $(seq 1 "$rounds"); do
    read -r b_ms b_rel b_faults < <(one "$before")
    read -r a_ms a_rel a_faults < <(one "$after")
    ratio=$(python3 -c "print(f'{$b_ms / $a_ms:.2f}')")
    ratios+=("$ratio")
    printf 'round %d: before %.0f ms (pager released: %s, %s faults), after %.0f ms (released: %s, %s faults), before/after %sx\n' \
        "$r" "$b_ms" "$b_rel" "$b_faults" "$a_ms" "$a_rel" "$a_faults" "$ratio"
done
python3 -c '
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
print(f"before/after: min {r[0]:.2f}x, median {statistics.median(r):.2f}x, max {r[-1]:.2f}x over {len(r)} rounds")
' "${ratios[@]}"
