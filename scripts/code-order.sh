#!/usr/bin/env bash
# Regenerate crates/hover/code-order.txt: the functions of `hover` that a
# VM runs, in the order it first runs them. The release link
# (crates/hover/build.rs) places them first in the binary's code, so a
# running VMM maps their pages and not the rest: the kernel maps the 64 KiB
# around each code page a process touches, and scattered over the whole
# binary a VM's ~0.9 MiB of code made ~3 MiB resident (docs/BENCHMARKS.md,
# "The VMM's own memory").
#
# Run it after changes that add code to a VM's run (a device, a thread, a
# startup step), or after a Rust upgrade (symbol names carry the compiler's
# version): names the binary no longer has are skipped by the linker, so a
# stale list only costs memory, never a build. `hover bench boot` shows the
# effect (`VMM overhead`).
#
#   scripts/code-order.sh        (needs valgrind: apt-get install valgrind)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind > /dev/null ||
    { echo "code-order.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
cargo build --release -q
hover="$PWD/target/release/hover"
work="$(mktemp -d /tmp/hover-code-order.XXXXXX)"
trap 'rm -rf "$work"' EXIT
grind() {
    local out="$1"
    shift
    valgrind -q --tool=callgrind --demangle=no --dump-instr=no \
        --callgrind-out-file="$work/$out" "$hover" "$@"
}

# 1. `hover bench boot`'s run: start, two vCPUs, the guest's exit, the report.
#    Seccomp off: valgrind cannot run a process that installs filters.
grind boot.cg run --seccomp off --vcpus 2 --json > /dev/null 2> "$work/boot.log" ||
    { cat "$work/boot.log" >&2; exit 1; }
# 2. The seccomp filters' construction: valgrind refuses the seccomp call
#    itself, which ends this run with an error after the filters are built.
grind seccomp.cg run --seccomp on --vcpus 2 > /dev/null 2>&1 || true
# 3. A VM steered through its API: a store workload, then get, stats,
#    pause, resume and shutdown.
sock="$work/api.sock"
grind api.cg run --seccomp off --api-socket "$sock" \
    --cmdline "workload=kvstore wss=4M seconds=600" > /dev/null 2>&1 &
vmm=$!
for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
for request in get stats pause resume shutdown; do
    "$hover" ctl --api-socket "$sock" "$request" > /dev/null
done
wait "$vmm"

python3 - "$work/boot.cg" "$work/seccomp.cg" "$work/api.cg" \
    > crates/hover/code-order.txt << 'EOF'
"""Callgrind outputs, in order -> hover's functions, first seen first."""
import re
import sys

order, seen = [], set()
for path in sys.argv[1:]:
    names, objects, current, ran = {}, {}, None, []
    for line in open(path):
        line = line.rstrip("\n")
        m = re.match(r"^(c?ob)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, i, name = m.groups()
            if name:
                objects[i] = name
            if kind == "ob":
                current = objects.get(i)
            continue
        # Callgrind names a function once, where it first appears (as the
        # function or as a callee), and by number after that.
        m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line)
        if m:
            kind, i, name = m.groups()
            if name:
                names[i] = name
            if kind == "fn" and current and current.endswith("/hover"):
                ran.append(i)
    for i in ran:
        name = names[i]
        if name not in seen and not name.startswith("0x"):
            seen.add(name)
            order.append(name)
print("\n".join(order))
EOF
echo "crates/hover/code-order.txt: $(wc -l < crates/hover/code-order.txt) functions"
