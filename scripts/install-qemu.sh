#!/bin/sh
# Install QEMU (Debian package qemu-system-x86) if it is missing: the peer
# VMM of `hover bench boot --peer qemu` and of crates/hover/tests/peer.rs.
# Used by .ci/run; harmless when QEMU is already there.
set -eu
command -v qemu-system-x86_64 > /dev/null && exit 0
export DEBIAN_FRONTEND=noninteractive
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
$SUDO apt-get install -y -q --no-install-recommends qemu-system-x86 > /dev/null ||
    { $SUDO apt-get update -q > /dev/null && $SUDO apt-get install -y -q --no-install-recommends qemu-system-x86 > /dev/null; }
qemu-system-x86_64 --version | head -1
