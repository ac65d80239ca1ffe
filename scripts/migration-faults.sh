#!/usr/bin/env bash
# Fault injection into live migrations, the long run (issue #13): TRIALS
# migrations of a running kvstore guest through a proxy that cuts the
# connection or flips a byte at a pseudo-random point; the source must run
# on every time and the destination never start. Prints the tally line for
# docs/RELIABILITY.md. Usage: scripts/migration-faults.sh [TRIALS]
set -euo pipefail
trials=${1:-100}
cd "$(dirname "$0")/.."
HOVER_FAULT_TRIALS=$trials cargo test -q -p hover --test migration_faults -- --nocapture 2>&1 \
  | grep -E "faulty migrations|test result|panicked|assertion"
