# Inside the Linux guest of scripts/lab/linux-apf.sh: the async-PF series'
# benchmark (bm.c) as its command line asks (lab.bm=F,W,T,BYTES), with the
# guest's count of hypervisor callback interrupts (KVM's "page ready"
# notifications, the HYP line of /proc/interrupts) before and after.
a=$(sed -n 's/.*lab.bm=\([0-9,]*\).*/\1/p' /proc/cmdline)
if [ -n "$a" ]; then
    IFS=, read -r f w t m <<E
$a
E
    hyp() { grep '^ *HYP:' /proc/interrupts | awk '{ s = 0; for (i = 2; i <= NF; i++) if ($i ~ /^[0-9]+$/) s += $i; print s }'; }
    h0=$(hyp)
    /bm -f "$f" -w "$w" -t "$t" -m "$m"
    echo "GUEST: hyp ${h0:-none} $(hyp)"
fi
