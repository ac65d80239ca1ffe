# On the host, for scripts/lab/vs-qemu.sh: the peer (the machine's QEMU,
# scripts/install-qemu.sh: its binary, the libraries it links and the
# microvm firmware) for the L1's /lab/qemu, and the disk benchmark
# (blkbench.c, static) for the guest's initramfs.
set -eu
l1=$1 guest=$2
HERE=$(cd "$(dirname "$0")" && pwd)
q=$(command -v qemu-system-x86_64) || { echo "no qemu-system-x86_64 (scripts/install-qemu.sh)" >&2; exit 1; }
mkdir -p "$l1/qemu/lib" "$l1/qemu/share"
cp "$q" "$l1/qemu/qemu-system-x86_64"
for l in $(ldd "$q" | grep -oE '/[^ ]+\.so[^ ]*'); do cp -L "$l" "$l1/qemu/lib/"; done
for f in bios-microvm.bin linuxboot_dma.bin linuxboot.bin kvmvapic.bin; do
    [ -f "/usr/share/qemu/$f" ] && cp -L "/usr/share/qemu/$f" "$l1/qemu/share/"
done
"$q" --version | head -1 > "$l1/qemu/version"
gcc -O2 -static -o "$guest/blkbench" "$HERE/blkbench.c"
