# Inside the Linux guest of scripts/lab/vs-qemu.sh: the disk benchmark.
if grep -q "lab.blk=1" /proc/cmdline; then
    /blkbench write /dev/vda 200
    /blkbench read /dev/vda 33554432
fi
