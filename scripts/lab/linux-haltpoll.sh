# Halt polling with a Linux guest, the seed's experiment (not in the test
# suite: `LAB_APPEND=lab.rounds=5 scripts/kvm-lab.sh run linux-haltpoll`):
# 4 KiB O_DSYNC writes to a virtio-blk disk from Debian's 6.12 guest
# (blkbench), with polling off (--halt-poll-ns 0), a host window
# (lab.window=US, default 200), the governor (--halt-poll auto), and the
# guest's own polling up to the same (--guest-halt-poll-max: cpuidle-haltpoll
# with the haltpoll governor; the guest turns the host's polling off). One VM per configuration, the four in turn each round (the
# order rotated each round); each line: the writes' time, KVM's halt and
# poll counts, the guest's polls. Ratios only: TCG (docs/LAB.md).
. /lab/lib.sh
R=$(lab_number rounds 3)
N=$(lab_number writes 300)
# The host's window and the guest's limit, microseconds (lab.window=).
W=$(lab_number window 200)
K="--kernel /lab/vmlinuz-6.12 --initrd /lab/initrd --memory 256M --vcpus 1"
CL="console=ttyS0 reboot=k panic=-1 lab.writes=$N"
dd if=/dev/zero of=/tmp/d.img bs=1M count=16 2>/dev/null
sum() { grep -o "\"$1\": *[0-9]*" "$2" | awk -F: '{ s += $2 } END { print s + 0 }'; }
flags() {
    case $1 in
        off) echo "--halt-poll-ns 0" ;;
        host) echo "--halt-poll-ns $((W * 1000))" ;;
        governor) echo "--halt-poll auto" ;;
        guest) echo "--halt-poll-ns $((W * 1000)) --guest-halt-poll-max ${W}us" ;;
    esac
}
r=0
while [ $r -lt $R ]; do
    r=$((r + 1))
    case $((r % 4)) in
        1) order="off host governor guest" ;;
        2) order="host governor guest off" ;;
        3) order="governor guest off host" ;;
        0) order="guest off host governor" ;;
    esac
    for cfg in $order; do
        timeout 600 hover run $K --disk /tmp/d.img $(flags $cfg) --cmdline "$CL" --console file:/tmp/$cfg.log --json > /tmp/$cfg.json 2> /tmp/$cfg.err
        rc=$?
        us=$(grep -a "BLK: write" /tmp/$cfg.log | awk '{print $4}')
        mark "round $r $cfg (window ${W} us): exit $rc, $N writes in ${us:-?} us; halts $(sum halt_exits /tmp/$cfg.json), polls $(sum halt_attempted_poll /tmp/$cfg.json) ($(sum halt_successful_poll /tmp/$cfg.json) successful); $(grep -a 'GUEST: cpuidle' /tmp/$cfg.log | cut -c8-); $(grep -a 'GUEST: polled' /tmp/$cfg.log | cut -c8-)"
        [ -n "$us" ] || { tail -5 /tmp/$cfg.log; tail -3 /tmp/$cfg.err; FAILED=1; }
    done
done
exit $FAILED
