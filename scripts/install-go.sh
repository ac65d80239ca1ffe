#!/usr/bin/env bash
# The Go toolchain the Firecracker SDK test needs (compat/firecracker-sdk,
# run by crates/hover/tests/firecracker_sdk.rs): the machine image has it
# in /usr/local/go; elsewhere Debian's golang-go is installed.
set -euo pipefail
if command -v go >/dev/null 2>&1 || [ -x /usr/local/go/bin/go ]; then
    exit 0
fi
echo "install-go: installing Debian's golang-go"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q golang-go
