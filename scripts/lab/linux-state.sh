# A Linux guest's state saved and loaded (crates/hover/tests/linux.rs):
# pause and resume, then a snapshot (--stop) restored eagerly, lazily and
# by prefetch, each with a copy of the disk as it was at the snapshot:
# the guest's counting process goes on from where it stopped (it does not
# start again), its uptime does not go backwards, and the disk holds the
# last count it wrote.
. /lab/lib.sh
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M"
CL="console=ttyS0 reboot=k panic=-1 lab.count=1"
dd if=/dev/zero of=/tmp/c.img bs=1M count=4 2>/dev/null
last_t() { grep -a "GUEST: count" "$1" | tail -1 | sed 's/.* t=\([0-9.]*\).*/\1/'; }
first_t() { grep -a "GUEST: count" "$1" | head -1 | sed 's/.* t=\([0-9.]*\).*/\1/'; }
on_disk() { dd if="$1" bs=4096 skip=1 count=1 2>/dev/null | head -c 8 | sed 's/^0*//'; }

start_counting() {
    rm -f /tmp/a.sock
    timeout 600 hover run $K --vcpus 2 --disk /tmp/c.img,id=data --cmdline "$CL" --console file:/tmp/a.log --api-socket /tmp/a.sock --json > /tmp/a.json 2> /tmp/a.err &
    hp=$!
    wait_for_text "GUEST: count 3 " /tmp/a.log 1200
}
# A boot a vCPU's triple fault ends (the lab's emulated SVM, docs/LAB.md)
# is made once more, saying so.
if ! start_counting; then
    kill $hp 2>/dev/null; wait $hp
    grep -q "triple fault" /tmp/a.err && mark "boot: a vCPU triple-faulted (the lab's emulated SVM); once more" && start_counting
fi || { mark "the guest did not count: $(tail -3 /tmp/a.err | tr '\n' ' ')"; tail -5 /tmp/a.log; kill $hp; exit 1; }
timeout 60 hover ctl --api-socket /tmp/a.sock pause > /tmp/pause.out 2>&1
p_count=$(last_count /tmp/a.log)
sleep 3
timeout 60 hover ctl --api-socket /tmp/a.sock --json get > /tmp/get.json 2>&1
held=$(last_count /tmp/a.log)
timeout 60 hover ctl --api-socket /tmp/a.sock resume > /tmp/resume.out 2>&1
grep -q '"state": *"paused"' /tmp/get.json || { cat /tmp/pause.out /tmp/get.json; held=x; }
check linux-pause-holds-the-guest [ "$held" = "$p_count" ]
wait_for_text "GUEST: count $((p_count + 2)) " /tmp/a.log 600
check linux-resume-goes-on grep -q "GUEST: count $((p_count + 1)) " /tmp/a.log
timeout 120 hover ctl --api-socket /tmp/a.sock snapshot /tmp/s.snap --stop > /tmp/snap.out 2>&1
echo "LAB: snapshot: $(tail -1 /tmp/snap.out)"
wait $hp
echo "LAB: run exit $?"
cp /tmp/c.img /tmp/c-base.img
n=$(last_count /tmp/a.log); t=$(last_t /tmp/a.log); d=$(on_disk /tmp/c-base.img)
mark "at the snapshot: count $n, uptime $t, on disk $d"
check linux-snapshot-disk-holds-the-last-count [ "$d" = "$n" -o "$d" = "$((n - 1))" ]
for mode in eager lazy prefetch; do
    cp /tmp/c-base.img /tmp/c-$mode.img
    rm -f /tmp/r.sock
    timeout 600 hover restore /tmp/s.snap --memory-restore $mode --disk data=/tmp/c-$mode.img --console file:/tmp/r-$mode.log --api-socket /tmp/r.sock --json > /tmp/r-$mode.json 2> /tmp/r-$mode.err &
    rp=$!
    wait_for_text "GUEST: count $((n + 3)) " /tmp/r-$mode.log 1200
    timeout 60 hover ctl --api-socket /tmp/r.sock shutdown > /dev/null 2>&1
    wait $rp
    echo "LAB: restore $mode exit $?"
    tail -2 /tmp/r-$mode.err | sed "s/^/LAB: $mode stderr: /"
    f=$(first_count /tmp/r-$mode.log); ft=$(first_t /tmp/r-$mode.log); l=$(last_count /tmp/r-$mode.log)
    x=$(on_disk /tmp/c-$mode.img)
    mark "$mode: first count $f at uptime $ft, last $l, on disk $x"
    [ "$f" = "$((n + 1))" ] || { tail -5 /tmp/r-$mode.log; cat /tmp/r-$mode.err; }
    check linux-restore-$mode-goes-on [ "$f" = "$((n + 1))" ]
    check linux-restore-$mode-clock-not-backwards awk -v a="$t" -v b="${ft:-0}" 'BEGIN { exit !(b + 0 > a + 0) }'
    check linux-restore-$mode-disk-written [ -n "$l" -a \( "$x" = "$l" -o "$x" = "$((l - 1))" \) ]
done
# A restore that does not name the VM's disk, or names another, is refused.
timeout 60 hover restore /tmp/s.snap --console off > /dev/null 2> /tmp/nodisk.err
nodisk=$?
grep -q "missing: data" /tmp/nodisk.err || { cat /tmp/nodisk.err; nodisk=x; }
check linux-restore-without-its-disk-refused [ "$nodisk" = 2 ]
dd if=/dev/zero of=/tmp/small.img bs=1M count=1 2>/dev/null
timeout 60 hover restore /tmp/s.snap --disk data=/tmp/small.img --console off > /dev/null 2> /tmp/small.err
small=$?
grep -q "bytes" /tmp/small.err || { cat /tmp/small.err; small=x; }
check linux-restore-with-a-disk-of-another-size-refused [ "$small" = 2 ]
[ $FAILED = 0 ] || { tail -20 /tmp/a.log; cat /tmp/a.err; }
exit $FAILED
