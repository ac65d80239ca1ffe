# Inside the Linux guest of scripts/lab/linux-boost.sh: the O_DSYNC writes
# (each one a virtio-blk request and its completion interrupt).
n=$(sed -n 's/.*lab.writes=\([0-9]*\).*/\1/p' /proc/cmdline)
/blkbench write /dev/vda ${n:-300}
