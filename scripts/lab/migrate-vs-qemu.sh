# A Linux guest's live migration under Hover beside QEMU (-M microvm, the
# machine's QEMU) on the L1's KVM, not in the suite (docs/BENCHMARKS.md has
# its figures; `LAB_APPEND=lab.rounds=3 scripts/kvm-lab.sh run
# migrate-vs-qemu`): the same kernel, initramfs and command line (the
# counting guest of linux-state.guest.sh), 128 MiB, 1 vCPU, a 4 MiB disk
# both sides of a migration open (shared storage); per round and mode
# (pre-copy, post-copy), one Hover and one QEMU migration between two
# processes in the L1, the order alternating. Per run: the source's
# downtime (Hover's `downtime_ms`, QEMU's `info migrate` "downtime"), the
# total time, and whether the guest went on counting at the destination.
# Ratios only: TCG distorts absolute times (docs/LAB.md).
. /lab/lib.sh
export LD_LIBRARY_PATH=/lab/qemu/lib
ROUNDS=$(lab_number rounds 3)
CL="console=ttyS0 reboot=k panic=-1 lab.count=1"
mark "peer: $(cat /lab/qemu/version)"
dd if=/dev/zero of=/tmp/h.img bs=1M count=4 2>/dev/null
dd if=/dev/zero of=/tmp/q.img bs=1M count=4 2>/dev/null

# goes_on SRC-LOG DST-LOG: the destination's first count follows the source's last.
goes_on() {
    n=$(last_count "$1")
    wait_for_text "GUEST: count $((n + 2)) " "$2" 600 && [ "$(first_count "$2")" = "$((n + 1))" ]
}

hover_mig() { # MODE
    rm -f /tmp/hs.sock /tmp/hd.sock /tmp/h.in /tmp/hs.log /tmp/hd.log
    timeout 300 hover run --kernel /lab/vmlinuz --initrd /lab/initrd --memory 128M --vcpus 1 --rng off \
        --disk /tmp/h.img,id=data --cmdline "$CL" --console file:/tmp/hs.log --api-socket /tmp/hs.sock > /dev/null 2> /tmp/hs.err &
    src=$!
    wait_for_text "GUEST: count 3 " /tmp/hs.log 1800
    timeout 300 hover receive --listen unix:/tmp/h.in --disk data=/tmp/h.img --console file:/tmp/hd.log --api-socket /tmp/hd.sock > /dev/null 2> /tmp/hd.err &
    dst=$!
    wait_for /tmp/h.in
    timeout 120 hover ctl --api-socket /tmp/hs.sock --json migrate --to unix:/tmp/h.in --mode "$1" > /tmp/hm.json 2> /tmp/hm.err
    rc=$?
    wait $src
    on=no; goes_on /tmp/hs.log /tmp/hd.log && on=yes
    timeout 30 hover ctl --api-socket /tmp/hd.sock shutdown > /dev/null 2>&1
    wait $dst
    d=$(sed -n 's/.*"downtime_ms": *\([0-9.]*\).*/\1/p' /tmp/hm.json | head -1)
    t=$(sed -n 's/.*"total_ms": *\([0-9.]*\).*/\1/p' /tmp/hm.json | head -1)
    [ $rc = 0 ] || head -3 /tmp/hm.err >&2
    echo "hover-$1 downtime_ms=${d:-none} total_ms=${t:-none} goes_on=$on rc=$rc"
}

# hmp PORT COMMAND: one QEMU monitor command, its answer on stdout.
hmp() { (printf '%s\n' "$2"; sleep 1) | timeout 5 nc 127.0.0.1 "$1" 2> /dev/null | tr -d '\r'; }

qemu_mig() { # MODE
    rm -f /tmp/qs.log /tmp/qd.log /tmp/q.in
    Q="/lab/qemu/qemu-system-x86_64 -M microvm -accel kvm -cpu host -m 128 -smp 1 -kernel /lab/vmlinuz -initrd /lab/initrd -nographic -no-reboot -nodefaults -L /lab/qemu/share -drive file=/tmp/q.img,format=raw,if=none,id=d0 -device virtio-blk-device,drive=d0"
    timeout 300 $Q -append "$CL" -serial file:/tmp/qs.log -monitor tcp:127.0.0.1:4444,server,nowait > /dev/null 2> /tmp/qs.err &
    src=$!
    wait_for_text "GUEST: count 3 " /tmp/qs.log 1800
    timeout 300 $Q -append "$CL" -serial file:/tmp/qd.log -monitor tcp:127.0.0.1:4445,server,nowait -incoming defer > /dev/null 2> /tmp/qd.err &
    dst=$!
    sleep 2
    if [ "$1" = postcopy ]; then
        hmp 4444 "migrate_set_capability postcopy-ram on" > /dev/null
        hmp 4445 "migrate_set_capability postcopy-ram on" > /dev/null
    fi
    hmp 4445 "migrate_incoming unix:/tmp/q.in" > /dev/null
    hmp 4444 "migrate -d unix:/tmp/q.in" > /dev/null
    [ "$1" = postcopy ] && hmp 4444 "migrate_start_postcopy" > /dev/null
    i=0 st=
    while [ $i -lt 60 ]; do
        hmp 4444 "info migrate" > /tmp/qm.txt
        st=$(sed -n 's/^Migration status: *\([a-z-]*\).*/\1/p; s/^Status: *\([a-z-]*\).*/\1/p' /tmp/qm.txt | head -1)
        case $st in completed|failed|cancelled) break ;; esac
        i=$((i + 1))
    done
    d=$(sed -n 's/^[Dd]owntime: *\([0-9.]*\) ms.*/\1/p' /tmp/qm.txt | head -1)
    t=$(sed -n 's/^[Tt]otal time: *\([0-9.]*\) ms.*/\1/p' /tmp/qm.txt | head -1)
    on=no; goes_on /tmp/qs.log /tmp/qd.log && on=yes
    hmp 4445 "quit" > /dev/null; hmp 4444 "quit" > /dev/null
    kill $src $dst 2> /dev/null; wait $src $dst
    [ "$st" = completed ] || sed 's/^/LAB: qemu: /' /tmp/qm.txt | head -20 >&2
    echo "qemu-$1 downtime_ms=${d:-none} total_ms=${t:-none} goes_on=$on status=${st:-none}"
}

: > /tmp/rounds
r=1
while [ $r -le "$ROUNDS" ]; do
    for mode in precopy postcopy; do
        if [ $((r % 2)) = 1 ]; then h=$(hover_mig $mode); q=$(qemu_mig $mode); else q=$(qemu_mig $mode); h=$(hover_mig $mode); fi
        mark "round $r $h"
        mark "round $r $q"
        echo "$r $mode $h $q" >> /tmp/rounds
    done
    r=$((r + 1))
done
# Per round, Hover's downtime over QEMU's (below 1: Hover's shorter).
awk '{ split($4, a, "="); split($9, b, "="); if (a[2] + 0 > 0 && b[2] + 0 > 0) printf "LAB: round %s %s downtime ratio %.2f\n", $1, $2, a[2] / b[2] }' /tmp/rounds
exit 0
