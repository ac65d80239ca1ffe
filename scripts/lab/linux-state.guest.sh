# Inside the Linux guest of scripts/lab/linux-state.sh and linux-migrate.sh:
# a process that counts each second, printing the count and the guest's
# uptime, and writing the count to its disk (4 KiB in, flushed) after
# printing it. With lab.ping=1 the guest also has 169.254.1.2 on eth0 and
# pings the L1 (169.254.1.1) before each count, saying whether it answered.
# With lab.tick=1 it instead prints ticks as fast as its console takes
# them (restore-vs-qemu.sh: the first line after a restore is at once).
if grep -q "lab.tick=1" /proc/cmdline; then
    n=0
    while true; do n=$((n + 1)); echo "GUEST: tick $n"; done
fi
if grep -q "lab.count=1" /proc/cmdline; then
    ping=
    if grep -q "lab.ping=1" /proc/cmdline; then
        ip link set eth0 up && ip addr add 169.254.1.2/16 dev eth0 && ping=1
    fi
    n=0
    while true; do
        n=$((n + 1))
        net=
        if [ -n "$ping" ]; then
            if ping -c 1 -W 1 169.254.1.1 > /dev/null 2>&1; then net=" net=ok"; else net=" net=fail"; fi
        fi
        echo "GUEST: count $n t=$(cut -d' ' -f1 /proc/uptime)$net"
        printf '%08d' $n | dd of=/dev/vda bs=4096 seek=1 conv=notrunc,fsync 2>/dev/null
        sleep 1
    done
fi
