# Hover beside QEMU (-M microvm, the machine's QEMU) on the L1's KVM, not
# in the suite (docs/BENCHMARKS.md has its figures): the same kernel,
# initramfs, command line, 256 MiB and 1 vCPU, each with a 64 MiB raw
# disk; LAB_ROUNDS rounds (default 5), the order alternating. Per run:
#   boot_ms   process start to the guest init's first line (its "GUEST: up",
#             timestamped by a reader of the console; /proc/uptime: 10 ms)
#   rss_kb    the VMM process's VmRSS at that moment (guest memory included)
#   setup_ms  Hover only: its own setup (VM built, vCPUs started), from its
#             outcome
#   vmm_mib   Hover only: its own resident memory beside the guest's (its
#             outcome's "VMM overhead")
#   write_us  in the guest: 200 4 KiB O_DSYNC writes (write + flush each)
#   read_us   in the guest: 32 MiB read with O_DIRECT, 128 KiB requests
# and per round the ratios Hover/QEMU (below 1: Hover faster).
. /lab/lib.sh
export LD_LIBRARY_PATH=/lab/qemu/lib
ROUNDS=$(lab_number rounds 5)
CL="console=ttyS0 reboot=k panic=-1 lab.blk=1"
mark "peer: $(cat /lab/qemu/version)"
dd if=/dev/zero of=/tmp/h.img bs=1M count=64 2>/dev/null
dd if=/dev/zero of=/tmp/q.img bs=1M count=64 2>/dev/null

# read_console NAME: log the console, stamp its "GUEST: up", sample RSS then.
read_console() {
    while IFS= read -r l; do
        echo "$l" >> "/tmp/$1.log"
        case $l in
            *"GUEST: up"*)
                read -r u _ < /proc/uptime; echo "$u" > "/tmp/$1.up"
                sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\).*/\1/p' "/proc/$(cat /tmp/$1.pid)/status" > "/tmp/$1.rss" ;;
        esac
    done < /tmp/con
}

run_one() { # NAME COMMAND...
    local name=$1; shift
    rm -f /tmp/con "/tmp/$name".*; mkfifo /tmp/con
    read_console "$name" &
    local reader=$!
    read -r t0 _ < /proc/uptime
    # The VMM's own pid (not timeout's): the shell that execs it says it.
    timeout 300 sh -c 'echo $$ > "$0"; exec "$@"' "/tmp/$name.pid" "$@" > /tmp/con 2> "/tmp/$name.err" &
    wait $!
    echo "$?" > "/tmp/$name.rc"
    wait $reader
    up=$(cat "/tmp/$name.up" 2>/dev/null || echo "")
    boot=$(awk -v a="$t0" -v b="$up" 'BEGIN { if (b == "") print "none"; else printf "%d", (b - a) * 1000 }')
    w=$(sed -n 's/.*BLK: write4k-dsync [0-9]* \([0-9]*\).*/\1/p' "/tmp/$name.log" | head -1)
    r=$(sed -n 's/.*BLK: read128k-direct [0-9]* \([0-9]*\).*/\1/p' "/tmp/$name.log" | head -1)
    setup=$(sed -n 's/^boot: setup \([0-9.]*\) ms.*/\1/p' "/tmp/$name.log" | head -1)
    own=$(sed -n 's/.*VMM overhead \([0-9.]*\) MiB.*/\1/p' "/tmp/$name.log" | head -1)
    echo "$name boot_ms=$boot rss_kb=$(cat /tmp/$name.rss 2>/dev/null) setup_ms=${setup:--} vmm_mib=${own:--} write_us=${w:-none} read_us=${r:-none} rc=$(cat /tmp/$name.rc)"
}

hover_run() {
    run_one hover hover run --kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M --vcpus 1 \
        --rng off --disk /tmp/h.img --cmdline "$CL" --console stdout
}
qemu_run() {
    run_one qemu /lab/qemu/qemu-system-x86_64 -M microvm -accel kvm -cpu host -m 256 -smp 1 \
        -kernel /lab/vmlinuz -initrd /lab/initrd -append "$CL" -nographic -no-reboot -nodefaults \
        -serial stdio -L /lab/qemu/share \
        -drive file=/tmp/q.img,format=raw,if=none,id=d0 -device virtio-blk-device,drive=d0
}

: > /tmp/rounds
r=1
while [ $r -le "$ROUNDS" ]; do
    if [ $((r % 2)) = 1 ]; then h=$(hover_run); q=$(qemu_run); else q=$(qemu_run); h=$(hover_run); fi
    mark "round $r $h"
    mark "round $r $q"
    echo "$r $h $q" >> /tmp/rounds
    r=$((r + 1))
done
# Per-round ratios Hover/QEMU and their spread.
awk '
function field(line, key,   n, i, kv, parts) {
    n = split(line, parts, " ")
    for (i = 1; i <= n; i++) { split(parts[i], kv, "="); if (kv[1] == key) return kv[2] }
    return ""
}
function spread(name, xs, n,   i, j, t, med) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (xs[j] < xs[i]) { t = xs[i]; xs[i] = xs[j]; xs[j] = t }
    med = (n % 2) ? xs[(n + 1) / 2] : (xs[n / 2] + xs[n / 2 + 1]) / 2
    printf "LAB: ratio %s hover/qemu min %.2f median %.2f max %.2f (n=%d)\n", name, xs[1], med, xs[n], n
}
{
    split($0, halves, " qemu ")
    h = halves[1]; q = "qemu " halves[2]
    n++
    hb = field(h, "boot_ms"); qb = field(q, "boot_ms")
    hw = field(h, "write_us"); qw = field(q, "write_us")
    hr = field(h, "read_us"); qr = field(q, "read_us")
    if (qb > 0 && hb != "none") { b[++nb] = hb / qb }
    if (qw > 0 && hw != "none") { w[++nw] = hw / qw }
    if (qr > 0 && hr != "none") { rd[++nr] = hr / qr }
    printf "LAB: round %d ratios boot %.2f write %.2f read %.2f\n", $1, (qb > 0 ? hb / qb : 0), (qw > 0 ? hw / qw : 0), (qr > 0 ? hr / qr : 0)
}
END {
    if (nb) spread("boot", b, nb)
    if (nw) spread("write4k-dsync", w, nw)
    if (nr) spread("read128k-direct", rd, nr)
}' /tmp/rounds
check vs-qemu-every-run-booted sh -c '! grep -q "boot_ms=none" /tmp/rounds'
exit $FAILED
