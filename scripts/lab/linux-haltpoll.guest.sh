# Inside the 6.12 guest of scripts/lab/linux-haltpoll.sh: the virtio
# modules of this kernel (the initramfs's own are 6.1's), which idle driver
# and governor run with what poll limit, the O_DSYNC writes, and how often
# and how long the guest polled (cpuidle state 0 is polling).
for m in failover net_failover virtio_mmio virtio_blk; do insmod /mods-6.12/$m.ko 2>/dev/null; done
n=$(sed -n 's/.*lab.writes=\([0-9]*\).*/\1/p' /proc/cmdline)
c=/sys/devices/system/cpu/cpuidle
echo "GUEST: cpuidle $(cat $c/current_driver 2>/dev/null || echo none) $(cat $c/current_governor_ro 2>/dev/null || cat $c/current_governor 2>/dev/null) limit=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null)"
s0=/sys/devices/system/cpu/cpu0/cpuidle/state0
u0=$(cat $s0/usage 2>/dev/null || echo 0) t0=$(cat $s0/time 2>/dev/null || echo 0)
/blkbench write /dev/vda ${n:-300}
echo "GUEST: polled $(( $(cat $s0/usage 2>/dev/null || echo 0) - u0 )) times, $(( $(cat $s0/time 2>/dev/null || echo 0) - t0 )) us"
