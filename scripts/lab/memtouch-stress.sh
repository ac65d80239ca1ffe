# Repeats the pager check: how often does it pass in one L1?
. /lab/lib.sh
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    check "memtouch-$i" sh -c 'timeout 300 hover run --memory 128M --memory-budget 32M --async-pf on --cmdline "workload=memtouch size=48M" --console off > /tmp/mt.out 2>&1 || { tail -5 /tmp/mt.out; exit 1; }'
done
exit $FAILED
