# Inside the Linux guest of scripts/lab/linux-balloon.sh: memwave as the
# command line asks (lab.memwave=KEEP,WAVE,WAVES,SLEEP,HOLD,INFLATE: MiB
# and seconds), and meanwhile a watch on the guest's MemTotal, which the
# balloon driver lowers by what it inflates: once it went down by INFLATE
# MiB (less 4) and came back, memwave is told to check the memory it kept.
a=$(sed -n 's/.*lab.memwave=\([0-9,]*\).*/\1/p' /proc/cmdline)
[ -n "$a" ] || exit 0
IFS=, read -r k w n s h i <<E
$a
E
if [ -d /sys/bus/virtio/drivers/virtio_balloon ]; then echo "GUEST: balloon driver bound"; fi
total() { awk '/^MemTotal/ { print $2 }' /proc/meminfo; }
t0=$(total)
/memwave -k "$k" -w "$w" -n "$n" -s "$s" -h "$h" -f /tmp/deflated &
pid=$!
low=$t0
# Watched every 0.2 s; the host waits for "down" before it deflates.
while kill -0 $pid 2>/dev/null; do
    t=$(total)
    [ "$t" -lt "$low" ] && low=$t
    if [ $((t0 - t)) -ge $(((i - 4) * 1024)) ] && [ ! -e /tmp/inflated ]; then
        echo "GUEST: MemTotal down from $t0 kB to $t kB"
        touch /tmp/inflated
    fi
    if [ -e /tmp/inflated ] && [ $((t0 - t)) -lt 4096 ] && [ ! -e /tmp/deflated ]; then
        echo "GUEST: MemTotal went from $t0 kB down to $low kB and back to $t kB"
        touch /tmp/deflated
    fi
    sleep 0.2
done
wait $pid
echo "GUEST: memwave exit $?"
