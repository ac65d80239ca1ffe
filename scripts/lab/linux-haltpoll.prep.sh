# On the host, for scripts/lab/linux-haltpoll.sh: Debian's 6.12 cloud
# kernel as the guest (the lab's 6.1 guest kernel has the cpuidle-haltpoll
# driver but not the haltpoll governor, so it would poll ~1 us at most),
# from the lab's own extraction of the L1's kernel package, with the
# virtio modules it needs; and the disk benchmark (blkbench.c, static).
set -eu
l1=$1 guest=$2
HERE=$(cd "$(dirname "$0")" && pwd)
LAB=${LAB_DIR:-$HERE/../../target/lab}
x=$(ls -d "$LAB"/x/linux-image-6.12* 2>/dev/null | head -1)
[ -n "$x" ] || { echo "no 6.12 kernel in $LAB/x (scripts/kvm-lab.sh prepare extracts it)" >&2; exit 1; }
cp "$x"/boot/vmlinuz-* "$l1/vmlinuz-6.12"
mkdir -p "$guest/mods-6.12"
for m in failover net_failover virtio_mmio virtio_blk virtio_net; do
    ko=$(find "$x/lib/modules" -name "$m.ko*" | head -1)
    [ -n "$ko" ] || { echo "the 6.12 kernel has no module $m" >&2; exit 1; }
    case $ko in
        *.xz) xz -dc "$ko" > "$guest/mods-6.12/$m.ko" ;;
        *.zst) zstd -dqc "$ko" > "$guest/mods-6.12/$m.ko" ;;
        *) cp "$ko" "$guest/mods-6.12/$m.ko" ;;
    esac
done
gcc -O2 -static -o "$guest/blkbench" "$HERE/blkbench.c"
