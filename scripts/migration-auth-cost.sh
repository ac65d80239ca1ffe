#!/bin/bash
# What authenticating a migration costs: ROUNDS (default 4) rounds, each one
# pre-copy migration of a 512 MiB guest with 384 MiB of data over TCP
# loopback without a key (--insecure) and one with --migration-key, in turn.
# Prints the report's figures per migration. Needs a release build
# (cargo build --release) and curl.
set -euo pipefail
H=${HOVER:-$(dirname "$0")/../target/release/hover}
ROUNDS=${1:-4}
D=$(mktemp -d); $H migration-key $D/k 2>/dev/null
for round in $(seq "$ROUNDS"); do
 for mode in insecure key; do
  if [ $mode = key ]; then RX="--migration-key $D/k"; SX="--migration-key $D/k"; INS=false; else RX="--insecure"; SX=""; INS=true; fi
  rm -f $D/src.sock
  $H receive --listen tcp:127.0.0.1:0 $RX --json --console off > $D/rx.json 2> $D/rx.err &
  RXP=$!
  for i in $(seq 50); do AT=$(head -1 $D/rx.err | awk '{print $NF}' || true); [ -n "$AT" ] && break; sleep 0.1; done
  $H run --memory 512M $SX --api-socket $D/src.sock --json --console off --cmdline "workload=bm faulting=0 working=0 memory=384M seconds=8" > $D/src.json 2>$D/src.err &
  SP=$!
  for i in $(seq 100); do [ -S $D/src.sock ] && break; sleep 0.05; done
  sleep 3
  R=$(curl -s --unix-socket $D/src.sock -X PUT http://localhost/vm/migrate -d "{\"to\":\"$AT\",\"insecure\":$INS}")
  echo "$round $mode $(echo "$R" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("total_ms=%.1f downtime_ms=%.2f bytes=%d pages=%d sender_cpu_ms=%.1f auth=%s" % (r["total_ms"], r["downtime_ms"], r["bytes_sent"], r["pages_sent"], r["sender_cpu_us"]/1e3, r["authenticated"]))' 2>&1 | head -2)"
  wait $SP || true; wait $RXP || true
 done
done | tee $D/lines
# Each round's ratio, key / insecure, and their spread.
python3 - $D/lines <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\d+) (\w+) total_ms=([\d.]+) downtime_ms=([\d.]+) .*sender_cpu_ms=([\d.]+)", line)
    if m:
        rows.setdefault(m[1], {})[m[2]] = (float(m[3]), float(m[5]))
for what, i in (("total time", 0), ("sender CPU", 1)):
    r = [v["key"][i] / v["insecure"][i] for v in rows.values() if len(v) == 2]
    if r:
        print(f"{what}, key / insecure per round: " + " ".join(f"{x:.2f}" for x in r)
              + f"  (min {min(r):.2f}, median {statistics.median(r):.2f}, max {max(r):.2f})")
PY
rm -rf $D
