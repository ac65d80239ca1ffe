# On the host, for scripts/lab/linux-migrate.sh: the RARP watcher
# (rarpwatch.c, static) for the L1's /lab.
set -eu
l1=$1
HERE=$(cd "$(dirname "$0")" && pwd)
gcc -O2 -static -o "$l1/rarpwatch" "$HERE/rarpwatch.c"
