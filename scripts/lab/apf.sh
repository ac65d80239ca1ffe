# The reproducer of the lab's VINTR defect (docs/LAB.md, "Found in the
# lab"): the built-in guest with async PF now and then hangs (a lazy
# restore) or triple-faults (memtouch under a budget) under QEMU's TCG. Alternates the two
# until one fails (at most 10 rounds), with KVM's async-PF tracepoints on,
# and prints the trace's end for the failing run. Not in the test suite.
. /lab/lib.sh
mount -t tracefs none /sys/kernel/tracing 2>/dev/null
T=/sys/kernel/tracing
echo 40000 > $T/buffer_size_kb
for e in kvm_async_pf_not_present kvm_async_pf_ready kvm_async_pf_completed kvm_async_pf_repeated_fault kvm_try_async_get_page kvm_inj_virq kvm_inj_exception kvm_exit kvm_msr; do
    echo 1 > $T/events/kvm/$e/enable 2>/dev/null || mark "no event $e"
done
n=0
while [ $n -lt 10 ]; do
    n=$((n+1))
    rm -f /tmp/a.sock /tmp/vm.snap
    timeout 300 hover run --vcpus 1 --api-socket /tmp/a.sock --cmdline "workload=kvstore wss=16M rate=2000 seconds=8" --console off > /tmp/run.out 2>&1 &
    wait_for /tmp/a.sock
    sleep 1
    timeout 60 hover ctl --api-socket /tmp/a.sock snapshot /tmp/vm.snap --stop > /tmp/snap.out 2>&1
    wait
    echo > $T/trace
    if timeout 40 hover restore /tmp/vm.snap --memory-restore lazy --stats > /tmp/r.out 2>&1 &&
        timeout 120 hover run --memory 128M --memory-budget 32M --cmdline "workload=memtouch size=48M" --console off > /tmp/r.out 2>&1; then
        mark "ok round-$n"
    else
        mark "FAIL round-$n"
        echo 0 > $T/tracing_on
        sed 's/^/LAB: out: /' /tmp/r.out | head -20
        for e in not_present ready completed repeated_fault try_async; do mark "count $e $(grep -c "kvm_async_pf_$e\|kvm_$e" $T/trace)"; done
        last=$(grep -n "kvm_async_pf_ready" $T/trace | tail -1 | cut -d: -f1)
        mark "events after the last ready: $(tail -n +$last $T/trace | wc -l); exits by reason:"
        tail -n +$last $T/trace | grep -o "reason [a-z_]*" | sort | uniq -c | sed 's/^/LAB: /'
        tail -n +$((last - 30)) $T/trace | head -90 | sed 's/^/LAB: tr: /'
        tail -15 $T/trace | sed 's/^/LAB: end: /'
        exit 1
    fi
done
exit 0
