# On the host, for scripts/lab/restore-vs-qemu.sh: the peer, as for
# vs-qemu.sh (the machine's QEMU, its libraries and firmware).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
bash "$HERE/vs-qemu.prep.sh" "$@"
