#!/usr/bin/env python3
"""A duty-cycle CPU hog: spin ON ms, sleep OFF ms, for SECONDS seconds.

    taskset -c N chrt -f 99 python3 scripts/dutyhog.py ON OFF SECONDS

Run one per core under SCHED_FIFO to load a host the way a real-time
neighbour would (docs/BENCHMARKS.md, "A kept boost outlasts a loaded host").
"""
import sys
import time


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    on, off, seconds = (float(a) for a in sys.argv[1:])
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        spin_until = time.monotonic() + on / 1000.0
        while time.monotonic() < spin_until:
            pass
        time.sleep(off / 1000.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
