# Async page faults with Linux's own guest side, the seed's experiment (not
# in the suite: `LAB_APPEND=lab.rounds=3 scripts/kvm-lab.sh run linux-apf`):
# Debian's 6.1 guest, 256 MiB, 2 vCPUs, under a 96 MiB --memory-budget;
# the series' benchmark (bm.c: `bm -f 4 -w 4 -t T -m 160MiB`, the array
# larger than the budget) with async PF off and on, one VM each per round,
# the order alternating. Per run: the working threads' total (the figure),
# the guest's "page ready" interrupts (HYP in /proc/interrupts), the
# pager's faults. Ratios only: TCG (docs/LAB.md).
. /lab/lib.sh
R=$(lab_number rounds 2)
T=$(lab_number seconds 20)
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M --vcpus 2 --memory-budget 96M --rng off"
CL="console=ttyS0 reboot=k panic=-1 lab.bm=4,4,$T,167772160"
num() { grep -o "\"$1\": *[0-9]*" "$2" | head -1 | sed 's/.*: *//'; }
r=1
while [ $r -le $R ]; do
    if [ $((r % 2)) = 1 ]; then order="off on"; else order="on off"; fi
    for apf in $order; do
        timeout 900 hover run $K --async-pf $apf --cmdline "$CL" --console file:/tmp/$apf.log --json > /tmp/$apf.json 2> /tmp/$apf.err
        rc=$?
        mark "round $r async-pf $apf: exit $rc; $(grep -a 'BM: start' /tmp/$apf.log | cut -c5-); $(grep -a 'BM: total' /tmp/$apf.log | cut -c5-); $(grep -a 'GUEST: hyp' /tmp/$apf.log | cut -c8-); pager faults $(num faults /tmp/$apf.json), store reads $(num store_reads /tmp/$apf.json)"
        grep -q "BM: total" /tmp/$apf.log || { tail -5 /tmp/$apf.log | sed 's/^/LAB: guest: /'; tail -3 /tmp/$apf.err | sed 's/^/LAB: err: /'; }
    done
    r=$((r + 1))
done
exit 0
