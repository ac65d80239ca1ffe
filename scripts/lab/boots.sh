# Diagnostic, not in the suite: boot the Linux guest N times on 2 vCPUs
# (the L1's command line gives lab.boots=N, default 20) and count the runs
# a vCPU's triple fault ended: the rate of the lab's emulated-SVM trouble
# (docs/LAB.md, "A vCPU triple-faults now and then").
. /lab/lib.sh
T0=$(date +%s)
took() { echo "$(($(date +%s) - T0)) s"; }
n=$(lab_number boots 20)
ok=0 tf=0 other=0
i=0
while [ $i -lt "$n" ]; do
    i=$((i + 1))
    timeout 300 hover run --kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M --vcpus 2 \
        --cmdline "console=ttyS0 reboot=k panic=-1" --console file:/tmp/b.log > /dev/null 2> /tmp/b.err
    rc=$?
    if grep -q "triple fault" /tmp/b.err; then
        tf=$((tf + 1))
        mark "boot $i: $(grep -o 'vCPU [0-9]* stopped with a triple fault' /tmp/b.err) after $(grep -ac . /tmp/b.log) console lines; last: $(tail -1 /tmp/b.log | tr -cd '[:print:]' | cut -c1-90)"
    elif [ $rc = 0 ]; then
        ok=$((ok + 1))
    else
        other=$((other + 1)); mark "boot $i: exit $rc: $(tail -1 /tmp/b.err)"
    fi
done
mark "boots: $ok clean, $tf triple faults, $other other, of $n ($(took))"
[ $tf = 0 ] && [ $other = 0 ]
