# The tests' own retry (crates/hover/tests/common/lab.rs, docs/LAB.md):
# the first run fails as a run the lab's emulated SVM lost to a vCPU's
# triple fault fails (Hover's message in a file under /tmp, a FAIL mark;
# l1-init then marks TRIPLE-FAULT); the run made again (lab.attempt=2 on
# the L1's command line) passes. No VM runs: this checks the harness.
. /lab/lib.sh
attempt=$(lab_number attempt 1)
mark "attempt $attempt"
if [ "$attempt" = 1 ]; then
    echo "hover: error: the guest crashed: vCPU 0 stopped with a triple fault (KVM_EXIT_SHUTDOWN)" > /tmp/retry.err
    mark "FAIL retried-after-a-triple-fault: attempt 1 stands for a run the lab lost"
    exit 1
fi
mark "ok retried-after-a-triple-fault"
