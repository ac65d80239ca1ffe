# A Linux guest's snapshot restored by Hover (eager, lazy, prefetch) beside
# QEMU (-M microvm, the machine's QEMU; its state saved with `migrate
# "exec:cat > FILE"` and loaded with `-incoming "exec:cat FILE"`) on the
# L1's KVM, not in the suite (docs/BENCHMARKS.md has its figures;
# `LAB_APPEND=lab.rounds=3 scripts/kvm-lab.sh run restore-vs-qemu`): the
# same kernel, initramfs and command line (a guest printing ticks as fast
# as its console takes them), 128 MiB, 1 vCPU, a 4 MiB disk; one snapshot
# each, then per round one restore in each way, the order rotated. Per
# restore: the time from starting the VMM to the guest's first line on
# its console (the next tick), read by a reader of the console (/proc/uptime,
# 10 ms). Ratios only: TCG distorts absolute times (docs/LAB.md).
. /lab/lib.sh
export LD_LIBRARY_PATH=/lab/qemu/lib
ROUNDS=$(lab_number rounds 3)
CL="console=ttyS0 reboot=k panic=-1 lab.tick=1"
mark "peer: $(cat /lab/qemu/version)"
dd if=/dev/zero of=/tmp/h.img bs=1M count=4 2>/dev/null
dd if=/dev/zero of=/tmp/q.img bs=1M count=4 2>/dev/null
Q="/lab/qemu/qemu-system-x86_64 -M microvm -accel kvm -cpu host -m 128 -smp 1 -kernel /lab/vmlinuz -initrd /lab/initrd -append \"$CL\" -nographic -no-reboot -nodefaults -L /lab/qemu/share -drive file=/tmp/q.img,format=raw,if=none,id=d0 -device virtio-blk-device,drive=d0"
hmp() { (printf '%s\n' "$2"; sleep 1) | timeout 5 nc 127.0.0.1 "$1" 2> /dev/null | tr -d '\r'; }

# The snapshots: each guest ticking, then stopped and saved.
rm -f /tmp/s.sock
timeout 300 hover run --kernel /lab/vmlinuz --initrd /lab/initrd --memory 128M --vcpus 1 --rng off \
    --disk /tmp/h.img,id=data --cmdline "$CL" --console file:/tmp/hs.log --api-socket /tmp/s.sock > /dev/null 2>&1 &
wait_for_text "GUEST: tick 200" /tmp/hs.log 1800
timeout 120 hover ctl --api-socket /tmp/s.sock snapshot /tmp/h.snap --stop > /tmp/hsnap.out 2>&1
wait
mark "hover snapshot: $(tail -1 /tmp/hsnap.out)"
eval "timeout 300 $Q -serial file:/tmp/qs.log -monitor tcp:127.0.0.1:4444,server,nowait" > /dev/null 2>&1 &
wait_for_text "GUEST: tick 200" /tmp/qs.log 1800
hmp 4444 stop > /dev/null
hmp 4444 'migrate "exec:cat > /tmp/q.state"' > /dev/null
i=0; while [ $i -lt 60 ] && ! hmp 4444 "info migrate" | grep -q "completed"; do i=$((i + 1)); done
hmp 4444 quit > /dev/null
wait
mark "qemu snapshot: $(ls -l /tmp/q.state | awk '{print $5}') bytes"

# first_line NAME COMMAND...: start it, its console to a reader that
# stamps the first tick; prints the milliseconds from start to that tick.
first_line() {
    name=$1; shift
    rm -f /tmp/con /tmp/$name.at; mkfifo /tmp/con
    ( while IFS= read -r l; do
        case $l in *"GUEST: tick"*) read -r u _ < /proc/uptime; echo "$u" > /tmp/$name.at; break ;; esac
      done < /tmp/con ) &
    reader=$!
    read -r t0 _ < /proc/uptime
    eval "timeout 120 $* > /tmp/con 2> /tmp/$name.err &"
    vmm=$!
    _w=0; while [ ! -s /tmp/$name.at ] && [ $_w -lt 600 ]; do sleep 0.1; _w=$((_w + 1)); done
    kill $vmm 2> /dev/null; wait $vmm; wait $reader
    awk -v a="$t0" -v b="$(cat /tmp/$name.at 2>/dev/null)" 'BEGIN { if (b == "") print "none"; else printf "%d", (b - a) * 1000 }'
}

hover_restore() { # MODE
    first_line "h-$1" hover restore /tmp/h.snap --memory-restore "$1" --disk data=/tmp/h.img --console stdout
}
qemu_restore() {
    first_line q "$Q -serial stdio -incoming \"exec:cat /tmp/q.state\""
}

: > /tmp/rounds
r=1
while [ $r -le "$ROUNDS" ]; do
    case $((r % 4)) in
        1) order="eager lazy prefetch qemu" ;;
        2) order="qemu eager lazy prefetch" ;;
        3) order="prefetch qemu eager lazy" ;;
        0) order="lazy prefetch qemu eager" ;;
    esac
    line="$r"
    for w in $order; do
        case $w in qemu) t=$(qemu_restore) ;; *) t=$(hover_restore $w) ;; esac
        eval "t_$w=$t"
        case $w in qemu) e=/tmp/q.err ;; *) e=/tmp/h-$w.err ;; esac
        [ "$t" = none ] && tail -5 "$e" | sed "s/^/LAB: $w: /"
    done
    mark "round $r ms to the first line: eager $t_eager lazy $t_lazy prefetch $t_prefetch qemu $t_qemu; ratios to QEMU $(awk -v e="$t_eager" -v l="$t_lazy" -v p="$t_prefetch" -v q="$t_qemu" 'BEGIN { if (q + 0 > 0) printf "%.2f %.2f %.2f", e / q, l / q, p / q; else print "none" }')"
    r=$((r + 1))
done
exit 0
