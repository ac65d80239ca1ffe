#!/bin/sh
# Seed corpora for the fuzz targets (fuzz/corpus/TARGET), made from real
# inputs: a minimal ELF and the built-in guest, command lines and API
# bodies as the docs give them, a snapshot file and a migration stream of
# a small running VM (needs /dev/kvm). Run once; scripts/fuzz.sh grows the
# corpora from here.
set -eu
cd "$(dirname "$0")/.."
C=fuzz/corpus
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p $C/elf $C/cmdline $C/api_body $C/snapshot $C/migration_stream $C/guest_records
cargo build -q --release -p hover
H=target/release/hover

# ELF: the smallest image the loader takes (a guest that spins at 1 MiB),
# and the built-in guest.
printf '.globl _start\n_start: pause\n jmp _start\n' > "$T/min.s"
gcc -nostdlib -static -Wl,-Ttext=0x101000 -Wl,--build-id=none -o "$T/min" "$T/min.s"
strip -o $C/elf/minimal "$T/min"
guest=$(ls -t target/release/build/hover-vmm-*/out/guest-target/release/hover-guest | head -1)
strip -o $C/elf/builtin "$guest"

# Command lines.
n=0
for l in "workload=hello" "workload=iolat size=4K seconds=1" "workload=bm faulting=4 working=4 memory=256M seconds=10 timeline_ms=100" \
         "workload=timer interval_us=500 rt=1 background=2 hz=250 idle=poll" "workload=kvstore wss=64M rate=1000 tasks=2"; do
    printf '%s' "$l" > $C/cmdline/$n; n=$((n + 1))
done

# API bodies: the first byte picks the endpoint (0 snapshot, 1 boost,
# 2 halt-poll, 3 migrate).
printf '\000{"path":"/tmp/vm.snap","stop":true}' > $C/api_body/snapshot
printf '\001{"mode":"dynamic","policy":"fifo:20","max_ms":50}' > $C/api_body/boost
printf '\002{"mode":"auto","budget_pct":2.5}' > $C/api_body/halt_poll
printf '\003{"to":"tcp:127.0.0.1:4000","dirty_tracking":"ring","downtime_ms":30,"bandwidth":100000000,"verify":true,"mode":"hybrid","sender_process":"readv"}' > $C/api_body/migrate

# A snapshot of a small running VM.
$H run --memory 32M --cmdline "workload=spin tasks=1 seconds=600" --console off \
    --api-socket "$T/api.sock" > /dev/null &
run=$!
sleep 1
$H ctl --api-socket "$T/api.sock" snapshot --stop "$T/vm.snap" > /dev/null
wait $run || true
cp "$T/vm.snap" $C/snapshot/spin-32M
# The minimal guest's: 8 pages, quick to mutate.
$H run --guest $C/elf/minimal --memory 16M --console off --api-socket "$T/min.sock" > /dev/null &
run=$!
sleep 1
$H ctl --api-socket "$T/min.sock" snapshot --stop "$T/min.snap" > /dev/null
wait $run || true
cp "$T/min.snap" $C/snapshot/minimal-16M

# Migration streams of the same VMs, recorded by a relay between the
# source and `hover receive`.
record_migration() { # NAME, then the source's `hover run` arguments
    name=$1; shift
    rm -f "$T/in.sock" "$T/relay.sock" "$T/src.sock"
    $H receive --listen "unix:$T/in.sock" --console off > /dev/null 2>&1 &
    recv=$!
    python3 - "$T/relay.sock" "$T/in.sock" "$C/migration_stream/$name" <<'PY' &
import socket, sys, threading
listen, to, out = sys.argv[1:]
s = socket.socket(socket.AF_UNIX); s.bind(listen); s.listen(1)
a, _ = s.accept(); b = socket.socket(socket.AF_UNIX); b.connect(to)
rec = open(out, "wb")
def pump(x, y, f=None):
    while True:
        d = x.recv(65536)
        if not d:
            break
        if f:
            f.write(d)
        y.sendall(d)
    try:
        y.shutdown(socket.SHUT_WR)
    except OSError:
        pass
t = threading.Thread(target=pump, args=(b, a)); t.start()
pump(a, b, rec); t.join(); rec.close()
PY
    relay=$!
    $H run "$@" --console off --api-socket "$T/src.sock" > /dev/null &
    run=$!
    sleep 1
    $H ctl --api-socket "$T/src.sock" migrate --to "unix:$T/relay.sock" > /dev/null
    wait $run || true
    wait $relay || true
    # The minimal guest never ends by itself.
    kill $recv 2> /dev/null || true
    wait $recv || true
}
record_migration spin-32M --memory 32M --cmdline "workload=spin tasks=1 seconds=3"
record_migration minimal-16M --guest $C/elf/minimal --memory 16M

# Its first frames alone (hello, CONF, MODE, the first pages): quicker to mutate.
head -c 16384 $C/migration_stream/spin-32M > $C/migration_stream/spin-32M-head

# Guest memory with a control request and a report batch in its first page.
python3 - $C/guest_records/report <<'PY'
import struct, sys
mem = bytearray(8192)
# Request addresses (the target reads up to 16 from the first bytes): 0x1000.
mem[0:8] = struct.pack("<Q", 0x1000)
# REPORT: op 2, status 0, arg0 = 0x1100, arg1 = 1.
mem[0x1000:0x1018] = struct.pack("<IIQQ", 2, 0, 0x1100, 1)
key = b"vcpus_seen".ljust(32, b"\0")
mem[0x1100:0x1130] = key + struct.pack("<IIQ", 1, 0, 2)[:16]
open(sys.argv[1], "wb").write(bytes(mem))
PY
ls -l $C/*
