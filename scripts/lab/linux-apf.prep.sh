# On the host, for scripts/lab/linux-apf.sh: the async-PF series'
# benchmark (bm.c, static) for the guest's initramfs.
set -eu
guest=$2
HERE=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -static -pthread -o "$guest/bm" "$HERE/bm.c"
