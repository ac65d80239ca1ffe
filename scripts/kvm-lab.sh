#!/usr/bin/env bash
# The KVM lab: a Linux L1 under QEMU's TCG (which emulates AMD SVM with
# nested paging) loads kvm_amd and gives Hover a real, hardware-style
# /dev/kvm on any machine, slowly. docs/LAB.md says how it works and what
# it can show.
#
#   scripts/kvm-lab.sh prepare            fetch and cache the parts under target/lab/
#   scripts/kvm-lab.sh run SCENARIO       boot an L1 that runs scripts/lab/SCENARIO.sh
#   scripts/kvm-lab.sh shell              a shell in the L1 (hover, the guest kernel at hand)
#
# Environment: HOVER (the hover binary to put in the L1; default
# target/release/hover), LAB_TIMEOUT (seconds before a run is killed; 600),
# LAB_OUT (folder for a run's console and result; a new one under
# target/lab/runs by default), LAB_MEM (the L1's RAM; 3G), LAB_KEEP (keep the
# run's L1 root and initramfs, removed after the run otherwise), LAB_L1 (the
# L1's kernel: 6.12, the default, or 6.1, Debian 12's own, without
# UFFDIO_MOVE), LAB_ACCEL (QEMU's -accel for the L1; tcg, multi-threaded).
#
# `run` prints the L1's console lines the scenario marked with "LAB: " and
# ends with the scenario's own exit status (0 when it passed), 124 when the
# deadline passed, 125 when the lab itself failed (its parts missing, QEMU
# or the L1 kernel broken). The whole console is kept in LAB_OUT.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LAB=${LAB_DIR:-$ROOT/target/lab}
HERE=$ROOT/scripts/lab
die() { echo "kvm-lab: $*" >&2; exit 125; }

# A private apt state: the machine's own sources and lists are left alone.
APT_OPTS=(-o "Dir::Etc::SourceList=$LAB/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$LAB/apt/lists" -o "Dir::Cache=$LAB/apt/cache"
          -o Debug::NoLocking=1 -o APT::Get::List-Cleanup=0 -q)
MIRROR=${LAB_MIRROR:-http://deb.debian.org/debian}

apt_setup() {
    mkdir -p "$LAB/apt/lists/partial" "$LAB/apt/cache/archives/partial" "$LAB/debs"
    printf 'deb %s bookworm main\ndeb %s bookworm-backports main\n' "$MIRROR" "$MIRROR" > "$LAB/apt/sources.list"
    apt-get "${APT_OPTS[@]}" update > "$LAB/apt/update.log" 2>&1 || { cat "$LAB/apt/update.log" >&2; die "apt-get update failed (is $MIRROR reachable?)"; }
}

# The package a metapackage depends on in a suite (the versioned kernel).
versioned() { # SUITE META
    apt-cache "${APT_OPTS[@]}" depends -t "$1" "$2" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}

# Download PACKAGE (optionally =VERSION / from SUITE) into debs/, print its path.
fetch_deb() { # SUITE PACKAGE
    local suite=$1 pkg=$2 f
    f=$(ls "$LAB/debs/${pkg}_"*.deb 2>/dev/null | head -1 || true)
    if [ -z "$f" ]; then
        (cd "$LAB/debs" && apt-get "${APT_OPTS[@]}" download -t "$suite" "$pkg" > /dev/null) || die "apt-get download $pkg ($suite) failed"
        f=$(ls "$LAB/debs/${pkg}_"*.deb | head -1)
    fi
    echo "$f"
}

# Extract a kernel package: its vmlinuz and the named modules, decompressed
# (busybox's insmod reads plain .ko files).
kernel() { # SUITE DEST MODULE...
    local suite=$1 dest=$2; shift 2
    local pkg deb x
    pkg=$(versioned "$suite" linux-image-cloud-amd64)
    [ -n "$pkg" ] || die "no linux-image-cloud-amd64 in $suite"
    deb=$(fetch_deb "$suite" "$pkg")
    x=$LAB/x/$pkg
    if [ ! -d "$x" ]; then rm -rf "$x.tmp"; mkdir -p "$x.tmp"; dpkg-deb -x "$deb" "$x.tmp"; mv "$x.tmp" "$x"; fi
    rm -rf "$dest"; mkdir -p "$dest/mods"
    cp "$x"/boot/vmlinuz-* "$dest/vmlinuz"
    echo "${pkg#linux-image-}" > "$dest/version"
    for m in "$@"; do
        local ko
        ko=$(find "$x/lib/modules" -name "$m.ko*" | head -1)
        [ -n "$ko" ] || die "$pkg has no module $m"
        case $ko in
            *.xz) xz -dc "$ko" > "$dest/mods/$m.ko" ;;
            *.zst) zstd -dqc "$ko" > "$dest/mods/$m.ko" ;;
            *) cp "$ko" "$dest/mods/$m.ko" ;;
        esac
    done
}

# QEMU from bookworm-backports in a private prefix (the system's QEMU, if
# any, is the peer tests' and stays as it is), with any library it needs
# that this machine lacks beside it.
qemu() {
    local q=$LAB/qemu p
    rm -rf "$q.tmp"; mkdir -p "$q.tmp"
    for p in qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu; do
        dpkg-deb -x "$(fetch_deb bookworm-backports "$p")" "$q.tmp"
    done
    export LD_LIBRARY_PATH=$q.tmp/usr/lib/x86_64-linux-gnu:$q.tmp/lib/x86_64-linux-gnu
    local missing round
    for round in 1 2 3 4; do
        missing=$(ldd "$q.tmp/usr/bin/qemu-system-x86_64" | awk '/not found/ {print $1}')
        [ -z "$missing" ] && break
        for lib in $missing; do
            # The Debian package of a library is named after its soname:
            # libfoo.so.1 -> libfoo1, libfoo-2.so.3 -> libfoo-2-3.
            local base=${lib%%.so*} ver=${lib##*.so.} cand
            ver=${ver%%.*}
            for cand in "$base$ver" "$base-$ver" "${base}${ver}t64"; do
                cand=$(echo "$cand" | tr '_' '-')
                if apt-cache "${APT_OPTS[@]}" show "$cand" > /dev/null 2>&1; then
                    dpkg-deb -x "$(fetch_deb bookworm "$cand")" "$q.tmp"
                    break
                fi
            done
        done
    done
    missing=$(ldd "$q.tmp/usr/bin/qemu-system-x86_64" | awk '/not found/ {print $1}')
    [ -z "$missing" ] || die "QEMU 10 needs libraries this machine lacks: $missing"
    rm -rf "$q"; mv "$q.tmp" "$q"
    LD_LIBRARY_PATH=$q/usr/lib/x86_64-linux-gnu:$q/lib/x86_64-linux-gnu "$q/usr/bin/qemu-system-x86_64" --version | head -1 > "$q/version"
}

prepare() {
    command -v apt-get > /dev/null || die "apt-get not found: the lab fetches Debian packages"
    command -v dpkg-deb > /dev/null || die "dpkg-deb not found: the lab unpacks Debian packages"
    if ! command -v cpio > /dev/null || ! command -v xz > /dev/null; then
        local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends cpio xz-utils > /dev/null ||
            die "cpio and xz are needed: apt-get install cpio xz-utils"
    fi
    mkdir -p "$LAB"
    rm -f "$LAB/READY"
    apt_setup
    # The L1: Debian's 6.12 cloud kernel and the modules that give it
    # /dev/kvm and taps; and Debian 12's own 6.1 (LAB_L1=6.1), which has no
    # UFFDIO_MOVE: the pager's write-protect eviction runs there.
    kernel bookworm-backports "$LAB/l1" irqbypass kvm kvm-amd tun
    kernel bookworm "$LAB/l1-6.1" irqbypass kvm kvm-amd tun
    # The guest Hover boots: Debian's 6.1 cloud kernel; its virtio drivers
    # are modules.
    kernel bookworm "$LAB/guest" virtio virtio_ring virtio_mmio virtio_blk virtio_net net_failover failover virtio-rng virtio_balloon
    dpkg-deb -x "$(fetch_deb bookworm busybox-static)" "$LAB/x/busybox"
    cp "$LAB/x/busybox/bin/busybox" "$LAB/busybox"
    qemu
    date -u +%FT%TZ > "$LAB/READY"
    echo "kvm-lab: ready in $LAB: L1 $(cat "$LAB/l1/version"), guest $(cat "$LAB/guest/version"), $(cat "$LAB/qemu/version"), $(du -sh "$LAB" | cut -f1)"
}

ready() {
    [ -f "$LAB/READY" ] || die "the lab is not prepared: run scripts/kvm-lab.sh prepare"
}

QEMU_BIN() { echo "$LAB/qemu/usr/bin/qemu-system-x86_64"; }

# Copy a binary and the shared libraries it links into the root R.
copy_bin() { # R BINARY [NAME]
    local r=$1 bin=$2 name=${3:-$(basename "$2")} l
    cp "$bin" "$r/bin/$name"
    strip --strip-debug "$r/bin/$name" 2>/dev/null || true
    for l in $(ldd "$bin" | grep -oE '/[^ ]+\.so[^ ]*'); do
        mkdir -p "$r$(dirname "$l")"; cp -L "$l" "$r$l"
    done
}

busybox_root() { # R: a root with busybox and its applets
    local r=$1 a
    mkdir -p "$r"/{bin,sbin,proc,sys,dev,tmp,run,etc,root,mnt,lib,lib64}
    cp "$LAB/busybox" "$r/bin/busybox"
    for a in $("$LAB/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$r/bin/$a"; done
}

# The guest's initramfs: busybox, the virtio modules, the lab's guest init
# (scripts/lab/guest-init) and the scenario's guest script if it has one.
guest_initrd() { # SCENARIO OUT
    local r=$WORK/guest-root
    rm -rf "$r"; busybox_root "$r"
    mkdir -p "$r/mods"; cp "$LAB/guest/mods/"*.ko "$r/mods/"
    cp "$HERE/guest-init" "$r/init"; chmod +x "$r/init"
    [ -f "$HERE/$1.guest.sh" ] && cp "$HERE/$1.guest.sh" "$r/guest.sh"
    [ -d "$WORK/guest-files" ] && cp -r "$WORK/guest-files/." "$r/"
    (cd "$r" && find . | cpio -o -H newc 2>/dev/null) > "$2"
}

l1_initrd() { # SCENARIO
    local s=$1 r=$WORK/l1-root
    rm -rf "$r"; busybox_root "$r"
    mkdir -p "$r/mods" "$r/lab"
    cp "$(l1_dir)/mods/"*.ko "$r/mods/"
    copy_bin "$r" "$HOVER" hover
    cp "$LAB/guest/vmlinuz" "$r/lab/vmlinuz"
    guest_initrd "$s" "$r/lab/initrd"
    cp "$HERE/l1-init" "$r/init"; chmod +x "$r/init"
    cp "$HERE/lib.sh" "$r/lab/lib.sh"
    # What the scenario's host-side step made (scripts/lab/SCENARIO.prep.sh).
    [ -d "$WORK/files" ] && cp -r "$WORK/files/." "$r/lab/"
    if [ "$s" = shell ]; then : > "$r/lab/shell"; else cp "$HERE/$s.sh" "$r/lab/scenario.sh"; fi
    # Uncompressed: TCG would spend longer inflating it than copying it.
    (cd "$r" && find . | cpio -o -H newc 2>/dev/null) > "$WORK/l1.cpio"
}

# The L1 kernel's folder: LAB_L1=6.12 (the default) or 6.1.
l1_dir() {
    case ${LAB_L1:-6.12} in
        6.12) echo "$LAB/l1" ;;
        6.1) [ -d "$LAB/l1-6.1" ] || die "no 6.1 L1 in $LAB: run scripts/kvm-lab.sh prepare again"
             echo "$LAB/l1-6.1" ;;
        *) die "LAB_L1=${LAB_L1}: give 6.12 or 6.1" ;;
    esac
}

boot_l1() { # SERIAL-ARGS...
    local q
    q=$(QEMU_BIN)
    LD_LIBRARY_PATH=$LAB/qemu/usr/lib/x86_64-linux-gnu:$LAB/qemu/lib/x86_64-linux-gnu "$q" -L "$LAB/qemu/usr/share/qemu" -L "$LAB/qemu/usr/share/seabios" \
        -accel "${LAB_ACCEL:-tcg}" -cpu max -smp 2 -m "${LAB_MEM:-3G}" -nodefaults -no-reboot -display none \
        -device isa-debug-exit,iobase=0xf4,iosize=0x04 -d cpu_reset,guest_errors -D "$WORK/qemu-cpu.log" \
        -kernel "$L1DIR/vmlinuz" -initrd "$WORK/l1.cpio" \
        -append "console=ttyS0 panic=-1 loglevel=4 mitigations=off lab.timeout=${LAB_TIMEOUT:-600} ${LAB_APPEND:-}" "$@"
}

run() { # SCENARIO
    local s=$1
    ready
    [ -f "$HERE/$s.sh" ] || die "no scenario $s (scripts/lab/*.sh: $(cd "$HERE" && ls *.sh | grep -v -e '^lib.sh$' -e '\.guest\.sh$' -e '\.prep\.sh$' | sed 's/\.sh$//' | tr '\n' ' '))"
    HOVER=${HOVER:-$ROOT/target/release/hover}
    [ -x "$HOVER" ] || die "no hover binary at $HOVER (cargo build --release -p hover, or set HOVER)"
    WORK=${LAB_OUT:-$LAB/runs/$s-$(date +%s)-$$}
    mkdir -p "$WORK"
    if [ -f "$HERE/$s.prep.sh" ]; then
        mkdir -p "$WORK/files" "$WORK/guest-files"
        bash "$HERE/$s.prep.sh" "$WORK/files" "$WORK/guest-files" > "$WORK/prep.log" 2>&1 || { cat "$WORK/prep.log" >&2; die "$s.prep.sh failed"; }
    fi
    l1_initrd "$s"
    local rc=0
    timeout --foreground -k 10 "${LAB_TIMEOUT:-600}" bash -c "$(declare -f boot_l1 QEMU_BIN); LAB='$LAB' L1DIR='$(l1_dir)' WORK='$WORK' LAB_MEM='${LAB_MEM:-}' LAB_TIMEOUT='${LAB_TIMEOUT:-600}' boot_l1 -serial file:'$WORK/console.log' -monitor none" \
        > "$WORK/qemu.log" 2>&1 || rc=$?
    tr -d '\r' < "$WORK/console.log" > "$WORK/console.txt" 2>/dev/null || true
    # The L1's root and initramfs are rebuilt by every run (~100-200 MB
    # each); the console and logs are what a reader needs afterwards.
    [ -n "${LAB_KEEP:-}" ] || rm -rf "$WORK/l1-root" "$WORK/l1.cpio" "$WORK/guest-root"
    grep -a '^LAB: ' "$WORK/console.txt" || true
    local verdict
    verdict=$(grep -a '^LAB-RESULT ' "$WORK/console.txt" | tail -1 | awk '{print $2}' || true)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "kvm-lab: $s: the deadline (${LAB_TIMEOUT:-600} s) passed; console: $WORK/console.log" >&2; exit 124
    fi
    if [ -z "$verdict" ]; then
        echo "kvm-lab: $s: the L1 ended without a result (QEMU exit $rc); console: $WORK/console.log" >&2
        tail -20 "$WORK/console.log" >&2 || true; cat "$WORK/qemu.log" >&2 || true
        exit 125
    fi
    echo "kvm-lab: $s: scenario exit $verdict; console: $WORK/console.log" >&2
    exit "$verdict"
}

shell() {
    ready
    HOVER=${HOVER:-$ROOT/target/release/hover}
    [ -x "$HOVER" ] || die "no hover binary at $HOVER (cargo build --release -p hover, or set HOVER)"
    WORK=$LAB/runs/shell; mkdir -p "$WORK"
    l1_initrd shell
    echo "kvm-lab: booting the L1 (about a minute under TCG); Ctrl-A X quits QEMU" >&2
    L1DIR=$(l1_dir) boot_l1 -serial mon:stdio
}

case "${1:-}" in
    prepare) prepare ;;
    run) [ -n "${2:-}" ] || die "run: name a scenario"; run "$2" ;;
    shell) shell ;;
    *) echo "usage: $0 prepare | run SCENARIO | shell" >&2; exit 2 ;;
esac
