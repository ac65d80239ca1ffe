# On the host, for scripts/lab/linux-balloon.sh: memwave (static) for the
# guest's initramfs.
set -eu
guest=$2
HERE=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -static -o "$guest/memwave" "$HERE/memwave.c"
