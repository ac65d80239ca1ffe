# Inside the Linux guest (scripts/lab/guest-init runs it): the checks of
# scripts/lab/linux.sh that the command line asks for.
if grep -q "lab.disks=1" /proc/cmdline; then
    echo "GUEST: vda $(cat /sys/block/vda/size 2>/dev/null) sectors, vdb ro=$(cat /sys/block/vdb/ro 2>/dev/null)"
    echo "GUEST: read $(dd if=/dev/vda bs=4096 skip=1 count=1 2>/dev/null | head -c 11)"
    printf GUESTWROTE | dd of=/dev/vda bs=4096 seek=2 conv=notrunc,fsync 2>/dev/null
    echo "GUEST: wrote rc=$?"
    if printf x | dd of=/dev/vdb conv=fsync 2>/dev/null; then echo "GUEST: ro-write accepted"; else echo "GUEST: ro-write refused"; fi
    echo "GUEST: rng $(cat /sys/class/misc/hw_random/rng_current 2>/dev/null) $(dd if=/dev/hwrng bs=16 count=1 2>/dev/null | od -An -tx1 | tr -d ' \n' | head -c 32)"
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
fi
