# The balloon's figure (not in the suite: `LAB_APPEND=lab.rounds=3
# scripts/kvm-lab.sh run linux-balloon-waves`): Debian's 6.1 guest, 256
# MiB, 1 vCPU, under `--memory-budget 128M`, allocating and freeing memory
# in waves (memwave: 16 MiB kept, lab.waves= waves of lab.wave= MiB, 3 s
# apart), with the balloon's free page reporting off and on, one VM each
# per round, the order alternating. Per VM, taken at the same point (the
# waves done, 5 s later): the pager's store reads and writes, the guest's
# work (the waves' time), the balloon's reported and dropped pages, then a
# snapshot's size on disk, then a live migration's bytes (pre-copy to a
# `hover receive` in the same L1). Ratios only: TCG (docs/LAB.md).
. /lab/lib.sh
R=$(lab_number rounds 2)
W=$(lab_number wave 48)
N=$(lab_number waves 3)
# Async PF off: the lab's emulated SVM breaks under it (docs/LAB.md).
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M --vcpus 1 --rng off --memory-budget 128M --async-pf off"
# INFLATE 999: the guest's script never sees an inflation; memwave holds
# until the migration moves it and the destination is shut down.
CL="console=ttyS0 reboot=k panic=-1 lab.memwave=16,$W,$N,3,900,999"
jnum() { grep -o "\"$1\": *[0-9]*" | head -1 | sed "s/.*: *//"; }
one() { # ROUND REPORTING
    vm=r$1$2
    rm -f /tmp/$vm.sock /tmp/$vm.snap /tmp/$vm.in /tmp/$vm.dsock
    timeout 1200 hover run $K --balloon reporting=$2 --api-socket /tmp/$vm.sock --cmdline "$CL" \
        --console file:/tmp/$vm.log --json > /tmp/$vm.json 2> /tmp/$vm.err &
    pid=$!
    if ! wait_for_text "MEMWAVE: waves done" /tmp/$vm.log 9000; then
        mark "round $1 reporting $2: the waves did not end; $(tail -2 /tmp/$vm.err | tr '\n' ' ')"
        kill $pid; wait $pid; return
    fi
    sleep 5
    timeout 30 hover ctl --api-socket /tmp/$vm.sock --json stats > /tmp/$vm.st
    timeout 300 hover ctl --api-socket /tmp/$vm.sock --json snapshot /tmp/$vm.snap > /tmp/$vm.sn 2>&1
    snap_kib=$(du -k /tmp/$vm.snap | cut -f1)
    rm -f /tmp/$vm.snap
    timeout 900 hover receive --listen unix:/tmp/$vm.in --api-socket /tmp/$vm.dsock --console file:/tmp/$vm.dlog --json > /tmp/$vm.djson 2> /tmp/$vm.derr &
    recv=$!
    wait_for /tmp/$vm.in
    timeout 600 hover ctl --api-socket /tmp/$vm.sock --json migrate --to unix:/tmp/$vm.in > /tmp/$vm.mig 2>&1
    wait $pid
    wait_for /tmp/$vm.dsock
    timeout 30 hover ctl --api-socket /tmp/$vm.dsock shutdown > /dev/null 2>&1
    wait $recv
    work=$(sed -n 's/.*waves done [0-9]* in \([0-9]*\) ms.*/\1/p' /tmp/$vm.log)
    mark "round $1 reporting $2: work ${work:-?} ms; store reads $(jnum store_reads < /tmp/$vm.st), writes $(jnum writebacks < /tmp/$vm.st); reported $(jnum reported_pages < /tmp/$vm.st), dropped $(jnum dropped_pages < /tmp/$vm.st); snapshot ${snap_kib:-?} KiB on disk; migration $(jnum pages_sent < /tmp/$vm.mig) pages, $(jnum bytes_sent < /tmp/$vm.mig) bytes"
}
r=1
while [ $r -le $R ]; do
    if [ $((r % 2)) = 1 ]; then order="off on"; else order="on off"; fi
    for rep in $order; do one $r $rep; done
    r=$((r + 1))
done
exit 0
