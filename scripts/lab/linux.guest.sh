# Inside the Linux guest (scripts/lab/guest-init runs it): the checks of
# scripts/lab/linux.sh that the command line asks for.
# Which idle driver runs (haltpoll: guest-side polling, loaded only when
# Hover gives the "realtime" hint), and the poll limit Hover handed it.
echo "GUEST: cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo none) haltpoll_ns=$(grep -o 'haltpoll.guest_halt_poll_ns=[0-9]*' /proc/cmdline | cut -d= -f2)"
if grep -q "lab.disks=1" /proc/cmdline; then
    echo "GUEST: vda $(cat /sys/block/vda/size 2>/dev/null) sectors, vdb ro=$(cat /sys/block/vdb/ro 2>/dev/null)"
    echo "GUEST: read $(dd if=/dev/vda bs=4096 skip=1 count=1 2>/dev/null | head -c 11)"
    printf GUESTWROTE | dd of=/dev/vda bs=4096 seek=2 conv=notrunc,fsync 2>/dev/null
    echo "GUEST: wrote rc=$?"
    if printf x | dd of=/dev/vdb conv=fsync 2>/dev/null; then echo "GUEST: ro-write accepted"; else echo "GUEST: ro-write refused"; fi
    echo "GUEST: rng $(cat /sys/class/misc/hw_random/rng_current 2>/dev/null) $(dd if=/dev/hwrng bs=16 count=1 2>/dev/null | od -An -tx1 | tr -d ' \n' | head -c 32)"
    # 50 short sleeps: halts that end well inside the host's window, so
    # KVM grows its per-vCPU poll time and polls the next ones.
    i=0; while [ $i -lt 50 ]; do usleep 500; i=$((i + 1)); done
fi
if grep -q "lab.net=1" /proc/cmdline; then
    echo "GUEST: eth0 $(cat /sys/class/net/eth0/address 2>/dev/null)"
    ip link set eth0 up && ip addr add 169.254.1.2/16 dev eth0
    n=0
    while [ $n -lt 30 ]; do
        if ping -c 1 -W 1 169.254.1.1 > /dev/null 2>&1; then echo "GUEST: ping ok"; break; fi
        n=$((n+1)); sleep 0.5
    done
    [ $n -lt 30 ] || echo "GUEST: ping failed"
    # The features the driver took (a string of bits, bit 0 first): CSUM
    # (0), GUEST_CSUM (1), GUEST_TSO4 (7), HOST_TSO4 (11).
    f=$(cat /sys/class/net/eth0/device/features)
    bit() { echo "$f" | cut -c$(($1 + 1)); }
    echo "GUEST: offloads csum=$(bit 0) guest_csum=$(bit 1) guest_tso4=$(bit 7) host_tso4=$(bit 11)"
    # 2 MiB each way over TCP (the L1 listens on 5000 and serves on 5001).
    dd if=/dev/urandom of=/tmp/blob bs=64k count=32 2>/dev/null
    echo "GUEST: sent md5 $(md5sum < /tmp/blob | cut -d' ' -f1)"
    nc 169.254.1.1 5000 -e cat /tmp/blob
    nc 169.254.1.1 5001 > /tmp/got
    echo "GUEST: got md5 $(md5sum < /tmp/got | cut -d' ' -f1) bytes $(wc -c < /tmp/got)"
fi
