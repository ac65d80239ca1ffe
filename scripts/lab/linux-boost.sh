# Host-side boosts with a Linux guest on a busy host (not in the test
# suite: `LAB_APPEND=lab.rounds=3 scripts/kvm-lab.sh run linux-boost`):
# the lab's 6.1 guest does 4 KiB O_DSYNC writes to a virtio-blk disk
# (blkbench) while a CPU hog runs on each of the L1's two CPUs, with
# boosting off, dynamic (each completion interrupt boosts the vCPU it
# reaches; Hover ends the boost as the vCPU halts: the guest shares no
# boost area) and static (--vcpu-rt: the vCPU real-time all along). One VM
# per configuration, the three in turn each round (the order rotated);
# each line: the writes' time, the hogs' loops per second meanwhile (what
# the host kept), and the boosts. Ratios only: TCG (docs/LAB.md).
. /lab/lib.sh
R=$(lab_number rounds 3)
N=$(lab_number writes 300)
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M --vcpus 1"
CL="console=ttyS0 reboot=k panic=-1 lab.writes=$N"
dd if=/dev/zero of=/tmp/d.img bs=1M count=16 2>/dev/null
# The hogs: each counts its loops into a file every 100000.
hog() { i=0; while :; do i=$((i + 1)); [ $((i % 100000)) = 0 ] && echo $i > /tmp/hog$1; done; }
hog 0 & h0=$!
hog 1 & h1=$!
cs() { awk '{ printf "%d", $1 * 100 }' /proc/uptime; }
loops() { echo $(( $(cat /tmp/hog0 2>/dev/null || echo 0) + $(cat /tmp/hog1 2>/dev/null || echo 0) )); }
sum() { grep -o "\"$1\": *[0-9]*" "$2" | awk -F: '{ s += $2 } END { print s + 0 }'; }
flags() {
    case $1 in
        off) echo "--boost off" ;;
        dynamic) echo "--boost on" ;;
        static) echo "--vcpu-rt" ;;
    esac
}
r=0
while [ $r -lt $R ]; do
    r=$((r + 1))
    case $((r % 3)) in
        1) order="off dynamic static" ;;
        2) order="dynamic static off" ;;
        0) order="static off dynamic" ;;
    esac
    for cfg in $order; do
        l0=$(loops) t0=$(cs)
        timeout 900 hover run $K --disk /tmp/d.img $(flags $cfg) --cmdline "$CL" --console file:/tmp/$cfg.log --json > /tmp/$cfg.json 2> /tmp/$cfg.err
        rc=$?
        l1=$(loops) t1=$(cs)
        us=$(grep -a "BLK: write" /tmp/$cfg.log | awk '{print $4}')
        mark "round $r $cfg: exit $rc, $N writes in ${us:-?} us; hog loops $(( (l1 - l0) * 100 / (t1 - t0 + 1) ))/s; boosts $(sum boosts /tmp/$cfg.json) (interrupt $(sum boosts_interrupt /tmp/$cfg.json), ended halted $(sum host_ended_halted /tmp/$cfg.json), at budget $(sum host_ended_budget /tmp/$cfg.json)), boosted $(sum boosted_us /tmp/$cfg.json) us, errors $(sum errors /tmp/$cfg.json)"
        [ -n "$us" ] || { tail -5 /tmp/$cfg.log; tail -3 /tmp/$cfg.err; FAILED=1; }
    done
done
kill $h0 $h1 2>/dev/null
exit $FAILED
