# On the host, for scripts/lab/linux-boost.sh: the disk benchmark
# (blkbench.c, static) for the guest's initramfs.
set -eu
guest=$2
HERE=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -static -o "$guest/blkbench" "$HERE/blkbench.c"
