# Inside the Linux guest the Firecracker Go SDK boots (scripts/lab/sdk.sh):
# the root drive the command line names, read and written.
root=none; mode=
for a in $(cat /proc/cmdline); do
    case $a in root=*) root=$a ;; rw|ro) mode=$a ;; esac
done
echo "GUEST: $root $mode"
echo "GUEST: read $(dd if=/dev/vda bs=4096 skip=1 count=1 2>/dev/null | head -c 11)"
printf GUESTWROTE | dd of=/dev/vda bs=4096 seek=2 conv=notrunc,fsync 2>/dev/null
echo "GUEST: wrote rc=$?"
# lab.hold=N: stay up N seconds (the balloon test steers the guest
# meanwhile, then stops the VMM).
hold=$(sed -n 's/.*lab.hold=\([0-9]*\).*/\1/p' /proc/cmdline)
[ -n "$hold" ] && { echo "GUEST: holding ${hold}s"; sleep "$hold"; }
