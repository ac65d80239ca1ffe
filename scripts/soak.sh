#!/bin/sh
# Soak: CYCLES create/run/destroy cycles (default 200) and a quarter as
# many snapshot/restore cycles (50 for 200) in one process, then a census
# of file descriptors, threads, guest RAM mappings and files
# (crates/vmm/tests/soak.rs; the normal suite runs 12). Needs /dev/kvm.
set -eu
cd "$(dirname "$0")/.."
# Long by design: the test watchdog (480 s) is off.
HOVER_TEST_DEADLINE_SECS=0 HOVER_SOAK_CYCLES=${1:-200} cargo test --release -p hover-vmm --test soak -- --nocapture 2>&1 |
    grep -E "run cycles|test result|panicked|left|right"
