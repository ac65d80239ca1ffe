# Inside the Linux guest (scripts/lab/guest-init runs it): with lab.disks=1
# on the command line, the disk and entropy checks of scripts/lab/linux.sh.
grep -q "lab.disks=1" /proc/cmdline || exit 0
echo "GUEST: vda $(cat /sys/block/vda/size 2>/dev/null) sectors, vdb ro=$(cat /sys/block/vdb/ro 2>/dev/null)"
echo "GUEST: read $(dd if=/dev/vda bs=4096 skip=1 count=1 2>/dev/null | head -c 11)"
printf GUESTWROTE | dd of=/dev/vda bs=4096 seek=2 conv=notrunc,fsync 2>/dev/null
echo "GUEST: wrote rc=$?"
if printf x | dd of=/dev/vdb conv=fsync 2>/dev/null; then echo "GUEST: ro-write accepted"; else echo "GUEST: ro-write refused"; fi
echo "GUEST: rng $(cat /sys/class/misc/hw_random/rng_current 2>/dev/null) $(dd if=/dev/hwrng bs=16 count=1 2>/dev/null | od -An -tx1 | tr -d ' \n' | head -c 32)"
