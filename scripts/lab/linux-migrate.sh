# A Linux guest with a disk and a network card moved live between Hover
# processes in one L1 (crates/hover/tests/linux.rs asserts each mark):
# pre-copy with the bitmap, manual and hybrid trackers, post-copy and
# hybrid mode, hop after hop (the guest goes on from each destination to
# the next), then a VM with dirty rings moved with the ring tracker. The
# disk is one file both sides open (each destination names it, as a
# restore does); the card's tap alternates between tap0 and tap1 (one each
# side; both carry the L1's 169.254.1.1 and the same MAC, and the L1's
# route to the guest follows it, as a network's orchestrator would). At
# each hop: --verify passes; the counting process goes on (the first count
# at the destination follows the last at the source); paused there, the
# disk holds its last count; the destination announces the guest's MAC on
# its tap (a RARP the L1 sees); and the guest's pings reach the L1 again.
. /lab/lib.sh
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 128M"
CL="console=ttyS0 reboot=k panic=-1 lab.count=1 lab.ping=1"
MAC=06:00:ac:10:00:02
dd if=/dev/zero of=/tmp/c.img bs=1M count=4 2>/dev/null
for t in tap0 tap1; do
    tunctl -t $t > /dev/null
    ip link set $t address 02:00:00:00:00:01
    ip addr add 169.254.1.1/32 dev $t && ip link set $t up
done
ip route add 169.254.1.2/32 dev tap0
on_disk() { dd if=/tmp/c.img bs=4096 skip=1 count=1 2>/dev/null | head -c 8 | sed 's/^0*//'; }

# start NAME TAP [FLAGS...]: a VM counting, its API at /tmp/NAME.sock.
# A boot that ends before the guest counts is tried once more, saying so
# (a 2-vCPU Linux boot under the lab's emulated SVM now and then stops at
# its start: docs/LAB.md); a second failure fails the scenario.
start() {
    vm=$1 tap=$2; shift 2
    for try in 1 2; do
        rm -f /tmp/$vm.sock
        ip route replace 169.254.1.2/32 dev $tap
        timeout 900 hover run $K --vcpus 2 --disk /tmp/c.img,id=data --net tap=$tap,mac=$MAC,id=net0 --cmdline "$CL" --console file:/tmp/$vm.log --api-socket /tmp/$vm.sock --json "$@" > /tmp/$vm.json 2> /tmp/$vm.err &
        pid=$!
        if wait_for_text "GUEST: count 3 " /tmp/$vm.log 1800; then
            mark "$vm counts"
            return 0
        fi
        mark "$vm did not count (try $try): $(grep -a -m1 error /tmp/$vm.err)"
        kill $pid 2> /dev/null
        wait $pid
    done
    check $vm-boots-and-counts false
    return 1
}

# hop FROM TO TAP CHECK [MIGRATE-FLAGS...]: move the VM at FROM to a new
# Hover process TO on TAP; marks CHECK-*.
hop() {
    from=$1 to=$2 tap=$3 hn=$4; shift 4
    rm -f /tmp/$to.sock /tmp/$to.in
    /lab/rarpwatch $tap 600 > /tmp/$to.rarp 2>&1 &
    watch=$!
    timeout 900 hover receive --listen unix:/tmp/$to.in --disk data=/tmp/c.img --net net0=tap=$tap --console file:/tmp/$to.log --api-socket /tmp/$to.sock --json > /tmp/$to.json 2> /tmp/$to.err &
    recv=$!
    wait_for /tmp/$to.in
    timeout 600 hover ctl --api-socket /tmp/$from.sock migrate --to unix:/tmp/$to.in --verify "$@" > /tmp/$to.mig 2>&1
    rc=$?
    mark "$hn: migrate exit $rc: $(tail -1 /tmp/$to.mig)"
    if [ $rc != 0 ]; then
        sed "s/^/LAB: $hn: /" /tmp/$to.mig | head -5
        tail -5 /tmp/$from.err | sed "s/^/LAB: $hn: source: /"
        tail -5 /tmp/$to.err | sed "s/^/LAB: $hn: destination: /"
        check $hn-migrates-with-verify false
        kill $pid $recv $watch 2> /dev/null
        wait $pid $recv
        return 1
    fi
    wait $pid # the source ends once the guest runs at the destination
    ip route replace 169.254.1.2/32 dev $tap
    n=$(last_count /tmp/$from.log)
    wait_for_text "GUEST: count $((n + 3)) " /tmp/$to.log 1800
    wait_for_text "net=ok" /tmp/$to.log 600
    timeout 60 hover ctl --api-socket /tmp/$to.sock pause > /dev/null 2>&1
    f=$(first_count /tmp/$to.log) l=$(last_count /tmp/$to.log) d=$(on_disk)
    timeout 60 hover ctl --api-socket /tmp/$to.sock resume > /dev/null 2>&1
    kill $watch 2> /dev/null
    mark "$hn: last count at the source $n, first at the destination $f, last $l, on disk $d; $(grep -c "RARP $MAC" /tmp/$to.rarp) announcements"
    check $hn-migrates-with-verify [ $rc = 0 ]
    check $hn-goes-on [ "$f" = "$((n + 1))" ]
    check $hn-disk-holds-the-last-count [ -n "$l" -a \( "$d" = "$l" -o "$d" = "$((l - 1))" \) ]
    check $hn-announces-the-mac grep -q "RARP $MAC" /tmp/$to.rarp
    check $hn-network-goes-on grep -q "GUEST: count .* net=ok" /tmp/$to.log
    pid=$recv
}

# A failed hop ends its chain (the guest stays where it was).
start v0 tap0 &&
    hop v0 v1 tap1 linux-precopy-bitmap --dirty-tracking bitmap &&
    hop v1 v2 tap0 linux-precopy-manual --dirty-tracking manual &&
    hop v2 v3 tap1 linux-precopy-hybrid --dirty-tracking hybrid &&
    hop v3 v4 tap0 linux-postcopy --mode postcopy &&
    hop v4 v5 tap1 linux-hybrid-mode --mode hybrid
timeout 60 hover ctl --api-socket /tmp/$to.sock shutdown > /dev/null 2>&1
wait $pid

start r0 tap0 --dirty-ring 4096 &&
    hop r0 r1 tap1 linux-precopy-ring --dirty-tracking ring
timeout 60 hover ctl --api-socket /tmp/r1.sock shutdown > /dev/null 2>&1
wait $pid
[ $FAILED = 0 ] || { tail -5 /tmp/v0.log; tail -5 /tmp/v0.err; }
exit $FAILED
