# A stock Linux kernel (Debian's 6.1 cloud kernel) under Hover on the L1's
# hardware-style KVM (crates/hover/tests/linux.rs asserts each mark).
. /lab/lib.sh
K="--kernel /lab/vmlinuz --initrd /lab/initrd --memory 256M"
CL="console=ttyS0 reboot=k panic=-1"

timeout 300 hover run $K --vcpus 2 --cmdline "$CL" --console file:/tmp/boot.log --json > /tmp/boot.json 2> /tmp/boot.err
echo "LAB: boot exit $?"
tail -3 /tmp/boot.err | sed 's/^/LAB: stderr: /'
grep -a "GUEST:" /tmp/boot.log | sed 's/^/LAB: /'
check linux-boots-to-init grep -q "GUEST: up" /tmp/boot.log
check linux-sees-2-cpus grep -q "GUEST: up .* cpus=2" /tmp/boot.log
check linux-poweroff-ends-power-off grep -q '"ended": *"power_off"' /tmp/boot.json
check linux-poweroff-exit-0 grep -q '"exit_code": *0' /tmp/boot.json

timeout 300 hover run $K --vcpus 1 --cmdline "$CL lab.then=reboot" --console file:/tmp/reboot.log --json > /tmp/reboot.json 2> /tmp/reboot.err
echo "LAB: reboot exit $?"
check linux-reboot-ends-reboot grep -q '"ended": *"reboot"' /tmp/reboot.json
[ $FAILED = 0 ] || { tail -40 /tmp/boot.log; cat /tmp/boot.err; }
exit $FAILED
