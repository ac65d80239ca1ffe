# Inside the Linux guest of scripts/lab/linux-state.sh: a process that
# counts each second, printing the count and the guest's uptime, and
# writing the count to its disk (4 KiB in, flushed) after printing it.
if grep -q "lab.count=1" /proc/cmdline; then
    n=0
    while true; do
        n=$((n + 1))
        echo "GUEST: count $n t=$(cut -d' ' -f1 /proc/uptime)"
        printf '%08d' $n | dd of=/dev/vda bs=4096 seek=1 conv=notrunc,fsync 2>/dev/null
        sleep 1
    done
fi
