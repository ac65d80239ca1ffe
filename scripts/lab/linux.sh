# A stock Linux kernel (Debian's 6.1 cloud kernel) under Hover on the L1's
# hardware-style KVM (crates/hover/tests/linux.rs asserts each mark).
. /lab/lib.sh
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M"
CL="console=ttyS0 reboot=k panic=-1"

# Halt polling as for the built-in guest, read in KVM's statistics: this
# boot with no host-side window, the disk run with 10 ms (its guest then
# sleeps 0.5 ms 50 times: KVM polls once a halt ended inside the window),
# the network run under the governor.
# polls FILE: the halt polls KVM attempted, over the vCPUs of a run's JSON.
polls() { grep -o '"halt_attempted_poll": *[0-9]*' "$1" | awk -F: '{ s += $2 } END { print s + 0 }'; }
halts() { grep -o '"halt_exits": *[0-9]*' "$1" | awk -F: '{ s += $2 } END { print s + 0 }'; }
boot_run() {
    timeout 300 hover run $K --vcpus 2 --halt-poll-ns 0 --cmdline "$CL" --console file:/tmp/boot.log --json > /tmp/boot.json 2> /tmp/boot.err
    echo "LAB: boot exit $?"
}
once_more_if_triple boot /tmp/boot.err boot_run
tail -3 /tmp/boot.err | sed 's/^/LAB: stderr: /'
grep -a "GUEST:" /tmp/boot.log | sed 's/^/LAB: /'
check linux-boots-to-init grep -q "GUEST: up" /tmp/boot.log
check linux-sees-2-cpus grep -q "GUEST: up .* cpus=2" /tmp/boot.log
check linux-poweroff-ends-power-off grep -q '"ended": *"power_off"' /tmp/boot.json
check linux-poweroff-exit-0 grep -q '"exit_code": *0' /tmp/boot.json

# This one also polls before it halts: Linux's cpuidle-haltpoll loads
# (the first boot, not asked to poll, runs another idle driver).
reboot_run() {
    timeout 300 hover run $K --vcpus 1 --guest-halt-poll-max 150us --cmdline "$CL lab.then=reboot" --console file:/tmp/reboot.log --json > /tmp/reboot.json 2> /tmp/reboot.err
    echo "LAB: reboot exit $?"
}
once_more_if_triple reboot /tmp/reboot.err reboot_run
check linux-reboot-ends-reboot grep -q '"ended": *"reboot"' /tmp/reboot.json
grep -a "GUEST: cpuidle" /tmp/boot.log /tmp/reboot.log | sed 's/^/LAB: /'
check linux-guest-polling-loads-cpuidle-haltpoll-when-asked sh -c 'grep -q "GUEST: cpuidle haltpoll haltpoll_ns=150000" /tmp/reboot.log && grep -q "GUEST: cpuidle" /tmp/boot.log && ! grep -q "GUEST: cpuidle haltpoll" /tmp/boot.log'
# Disks: one the guest reads (the host wrote "HOSTPATTERN" at 4 KiB) and
# writes ("GUESTWROTE" at 8 KiB, flushed), one read-only; and entropy.
dd if=/dev/zero of=/tmp/d0.img bs=1M count=1 2>/dev/null
printf HOSTPATTERN | dd of=/tmp/d0.img bs=4096 seek=1 conv=notrunc 2>/dev/null
dd if=/dev/zero of=/tmp/d1.img bs=64k count=1 2>/dev/null
disk_run() {
    rm -f /tmp/l.sock
    timeout 300 hover run $K --vcpus 1 --halt-poll-ns 10000000 --disk /tmp/d0.img --disk /tmp/d1.img,readonly,id=ro --cmdline "$CL lab.disks=1" --console file:/tmp/disk.log --json --api-socket /tmp/l.sock > /tmp/disk.json 2> /tmp/disk.err &
    wait_for /tmp/l.sock
    timeout 60 hover ctl --api-socket /tmp/l.sock --json get > /tmp/get.json 2>&1
    wait $!
    echo "LAB: disk run exit $?"
}
once_more_if_triple disk /tmp/disk.err disk_run
check linux-get-shows-kernel-initrd-and-disks sh -c 'grep -q "\"kernel\": *\"vmlinuz\"" /tmp/get.json && grep -q "\"initrd\": *\"initrd\"" /tmp/get.json && grep -q "\"id\": *\"ro\"" /tmp/get.json && grep -q "\"kind\": *\"rng\"" /tmp/get.json || { cat /tmp/get.json; false; }'
grep -a "GUEST:" /tmp/disk.log | sed 's/^/LAB: /'
tail -3 /tmp/disk.err | sed 's/^/LAB: stderr: /'
check linux-reads-a-disk-the-host-wrote grep -q "GUEST: read HOSTPATTERN" /tmp/disk.log
check linux-writes-a-disk-the-host-reads sh -c '[ "$(dd if=/tmp/d0.img bs=4096 skip=2 count=1 2>/dev/null | head -c 10)" = GUESTWROTE ]'
check linux-readonly-disk-refuses-writes sh -c 'grep -q "GUEST: ro-write refused" /tmp/disk.log && grep -q "vdb ro=1" /tmp/disk.log && [ "$(od -An -tx1 -N1 /tmp/d1.img | tr -d " ")" = 00 ]'
check linux-gets-entropy grep -q "GUEST: rng virtio_rng.0 [0-9a-f]\{32\}" /tmp/disk.log
# A network card on a tap made beforehand (Hover opens taps, never makes
# them); the L1's side gets a link-local address, and the guest pings it
# (nothing leaves the L1: it has no NIC). A second VM on the same tap
# while the first holds it is refused as busy.
tunctl -t tap0 > /dev/null
ip addr add 169.254.1.1/16 dev tap0 && ip link set tap0 up
# 2 MiB each way over TCP: the guest sends to 5000, 5001 sends to it.
# With dynamic boosting: a Linux guest shares no boost area, so each
# interrupt the card raises boosts the vCPU it reaches and Hover ends the
# boost as the vCPU halts (host-side boosts); the card's interrupts are
# then raised by the I/O thread itself (KVM_IRQ_LINE), not its irqfd.
dd if=/dev/urandom of=/tmp/blob2 bs=64k count=32 2>/dev/null
net_run() {
    nc -l -p 5000 > /tmp/from-guest &
    n0=$!
    nc -l -p 5001 -e cat /tmp/blob2 &
    n1=$!
    timeout 300 hover run $K --vcpus 1 --halt-poll auto --boost on --net tap=tap0,mac=06:00:ac:10:00:02 --rng off --cmdline "$CL lab.net=1" --console file:/tmp/net.log --json > /tmp/net.json 2> /tmp/net.err &
    hp=$!
    wait_for_text "GUEST: up" /tmp/net.log
    timeout 60 hover run $K --vcpus 1 --net tap=tap0 --console off > /dev/null 2> /tmp/busy.err
    busy=$?
    wait $hp
    echo "LAB: net run exit $?"
    # Listeners a crashed guest never reached would hold the ports (a
    # finished transfer's end by themselves: never cut one short).
    if grep -q "triple fault" /tmp/net.err; then kill $n0 $n1 2>/dev/null; fi
}
once_more_if_triple net /tmp/net.err net_run
grep -a "GUEST:" /tmp/net.log | sed 's/^/LAB: /'
tail -3 /tmp/net.err | sed 's/^/LAB: stderr: /'
check linux-pings-the-l1-over-virtio-net grep -q "GUEST: ping ok" /tmp/net.log
check linux-net-has-the-mac-given grep -q "GUEST: eth0 06:00:ac:10:00:02" /tmp/net.log
check linux-net-offloads-negotiated grep -q "GUEST: offloads csum=1 guest_csum=1 guest_tso4=1 host_tso4=1" /tmp/net.log
check linux-net-tcp-to-the-l1-intact sh -c 'grep -q "GUEST: sent md5 $(md5sum < /tmp/from-guest | cut -d" " -f1)" /tmp/net.log'
check linux-net-tcp-from-the-l1-intact sh -c 'grep -q "GUEST: got md5 $(md5sum < /tmp/blob2 | cut -d" " -f1) bytes 2097152" /tmp/net.log'
check linux-net-busy-tap-refused sh -c '[ '$busy' = 2 ] && grep -q "tap=tap0: busy" /tmp/busy.err || { cat /tmp/busy.err; false; }'
mark "boosting: $(grep -o '"boosts_interrupt": *[0-9]*' /tmp/net.json) $(grep -o '"host_ended_halted": *[0-9]*' /tmp/net.json) $(grep -o '"host_ended_budget": *[0-9]*' /tmp/net.json) $(grep -o '"errors": *[0-9]*' /tmp/net.json | head -1)"
check linux-net-interrupts-boost-the-vcpu-and-hover-ends-each-boost sh -c 'grep -q "\"boosts_interrupt\": *[1-9]" /tmp/net.json && grep -q "\"host_ended_halted\": *[1-9]" /tmp/net.json && grep -q "\"errors\": *0" /tmp/net.json && ! grep -q "\"errors\": *[1-9]" /tmp/net.json'
timeout 60 hover run $K --vcpus 1 --net tap=tap9 --console off > /dev/null 2> /tmp/notap.err
notap=$?
check linux-net-missing-tap-refused sh -c '[ '$notap' = 2 ] && grep -q "tap=tap9: no such network device" /tmp/notap.err || { cat /tmp/notap.err; false; }'
# --console stdio: what is typed reaches the guest's shell on ttyS0, and
# Ctrl-A x ends the VM.
stdio_run() {
    rm -f /tmp/tty.in; mkfifo /tmp/tty.in
    timeout 300 hover run $K --vcpus 1 --rng off --cmdline "$CL lab.then=shell" --console stdio < /tmp/tty.in > /tmp/tty.log 2> /tmp/tty.err &
    hp=$!
    exec 3> /tmp/tty.in
    # A Hover that ended early closes the FIFO: the writes below then fail
    # (EPIPE) instead of killing this script, and its end is reported.
    trap '' PIPE
    if ! wait_for_text "GUEST: done, shell" /tmp/tty.log 3000; then
        mark "stdio: no shell after 300 s; Hover $(kill -0 $hp 2>/dev/null && echo runs || echo ended)"
        tail -5 /tmp/tty.log; cat /tmp/tty.err
    fi
    sleep 1
    printf 'echo typed-$((6*7))\n' >&3
    wait_for_text "typed-42" /tmp/tty.log 300
    printf '\001x' >&3
    exec 3>&-
    trap - PIPE
    wait $hp
    tty=$?
    echo "LAB: stdio run exit $tty"
}
once_more_if_triple stdio /tmp/tty.err stdio_run
check linux-console-stdio-reaches-the-shell grep -q "^typed-42" /tmp/tty.log
check linux-console-ctrl-a-x-ends-the-vm sh -c '[ '$tty' = 0 ] && grep -q "shut down" /tmp/tty.log || { tail -5 /tmp/tty.log; cat /tmp/tty.err; false; }'
h0=$(halts /tmp/boot.json) p0=$(polls /tmp/boot.json) h1=$(halts /tmp/disk.json) p1=$(polls /tmp/disk.json)
mark "halt polling: window 0: $h0 halts, $p0 polls; 10 ms: $h1 halts, $p1 polls; governor: $(grep -o '"decisions": *[0-9]*' /tmp/net.json) $(grep -o '"final_window_ns": *[0-9]*' /tmp/net.json)"
check linux-halt-poll-window-0-polls-never [ "$h0" -gt 0 -a "$p0" = 0 ]
check linux-halt-poll-window-polls [ "$p1" -gt 0 ]
check linux-halt-poll-governor-decides grep -q '"decisions": *[1-9]' /tmp/net.json
[ $FAILED = 0 ] || { tail -40 /tmp/boot.log; cat /tmp/boot.err; tail -40 /tmp/disk.log; }
exit $FAILED
