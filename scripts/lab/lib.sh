# Helpers for lab scenarios (sourced inside the L1).
# mark TEXT: a line the host side prints and tests read.
mark() { echo "LAB: $*"; }
FAILED=0
# check NAME COMMAND...: run it, mark "ok NAME" or "FAIL NAME (exit N)".
check() {
    name=$1; shift
    if "$@"; then mark "ok $name"; else mark "FAIL $name (exit $?)"; FAILED=1; fi
}
# wait_for PATH [TENTHS]: until the path exists (an API socket).
wait_for() {
    _w=0; while [ ! -e "$1" ] && [ $_w -lt "${2:-600}" ]; do sleep 0.1; _w=$((_w+1)); done
    [ -e "$1" ]
}
# once_more_if_triple NAME ERR FUNCTION: run FUNCTION; if the run ended in
# a vCPU's triple fault (its stderr ERR says so), say so and run it once
# more: the lab's emulated SVM now and then triple-faults a vCPU, async PF
# or not (docs/LAB.md); a second one stands.
once_more_if_triple() {
    "$3"
    if grep -q "triple fault" "$2" 2>/dev/null; then
        mark "$1: a vCPU triple-faulted (the lab's emulated SVM); once more"
        "$3"
    fi
}
# wait_for_text TEXT FILE [TENTHS]: until FILE holds TEXT (a guest's mark).
wait_for_text() {
    _w=0; while ! grep -qa "$1" "$2" 2>/dev/null && [ $_w -lt "${3:-600}" ]; do sleep 0.1; _w=$((_w+1)); done
    grep -qa "$1" "$2"
}
# first_count/last_count LOG: the first or last count the counting guest
# (linux-state.guest.sh) printed in its console log.
first_count() { grep -a "GUEST: count" "$1" | head -1 | sed 's/.*count \([0-9]*\).*/\1/'; }
last_count() { grep -a "GUEST: count" "$1" | tail -1 | sed 's/.*count \([0-9]*\).*/\1/'; }
# lab_number NAME DEFAULT: the number the L1's command line gives as
# lab.NAME= (LAB_APPEND), or DEFAULT.
lab_number() {
    _v=$(sed -n "s/.*lab\.$1=\([0-9]*\).*/\1/p" "${LAB_CMDLINE:-/proc/cmdline}")
    echo "${_v:-$2}"
}
