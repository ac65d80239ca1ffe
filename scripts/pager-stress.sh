#!/bin/sh
# Pager integrity stress, long version (crates/hover/tests/pager_stress.rs):
# MEMORY MiB of guest memory (default 1024) under an eighth of it as the
# budget, random page-store latency, async PF on and off; kvstore random
# writes for SECONDS (default 60) and a full memtouch pass; every record and
# byte checked. Needs /dev/kvm.
set -eu
cd "$(dirname "$0")/.."
# Long by design: the test watchdog (480 s) is off.
HOVER_TEST_DEADLINE_SECS=0 HOVER_STRESS_MEMORY_MIB=${1:-1024} HOVER_STRESS_SECONDS=${2:-60} \
    cargo test --release -p hover --test pager_stress -- --nocapture 2>&1 |
    grep -E "wrong|test result|panicked|left|right"
