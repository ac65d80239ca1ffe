//! `ctxsw`: the cost of a task switch on vCPU 0.
//! - `mode=yield`: two tasks yield to each other; cost = elapsed / switches.
//! - `mode=preempt`: two tasks spin and the timer (`hz=`) preempts them; each
//!   switch costs from the old task's last TSC reading to the new task's
//!   first (interrupt delivery, the emulated handler, the native switch).

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{now, println, ticks_per_sec, ticks_to_ns, yield_now, Placement, Reports};

static END: AtomicU64 = AtomicU64::new(0);
static YIELDS: AtomicU64 = AtomicU64::new(0);
/// Each task's latest TSC reading. Per task, because a preempted task
/// resumes holding a reading from before the switch and stores it once more:
/// in a shared slot that would overwrite the other task's last reading.
static LAST: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];
static SWITCH_TICKS: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];
static SWITCHES: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];
static MAX_TICKS: [AtomicU64; 2] = [const { AtomicU64::new(0) }; 2];

fn yielder(_: usize) {
    let end = END.load(Ordering::Relaxed);
    let mut n = 0;
    while now() < end {
        yield_now();
        n += 1;
    }
    YIELDS.fetch_add(n, Ordering::Relaxed);
}

fn spinner(i: usize) {
    let end = END.load(Ordering::Relaxed);
    // A gap of more than 2 us between two readings means this task was
    // switched out (or interrupted); if the other task ran meanwhile, its
    // last reading marks when the switch back began.
    let gap = ticks_per_sec() / 500_000;
    let mut mine = now();
    let (mut sum, mut n, mut max) = (0u64, 0u64, 0u64);
    loop {
        let t = now();
        if t >= end {
            break;
        }
        if t - mine > gap {
            let cost = t.saturating_sub(LAST[1 - i].load(Ordering::Relaxed));
            if cost < t - mine {
                sum += cost;
                n += 1;
                max = max.max(cost);
            }
        }
        mine = t;
        LAST[i].store(t, Ordering::Relaxed);
    }
    SWITCH_TICKS[i].store(sum, Ordering::Relaxed);
    SWITCHES[i].store(n, Ordering::Relaxed);
    MAX_TICKS[i].store(max, Ordering::Relaxed);
}

pub fn run(ctx: &Context) -> u32 {
    let mode = ctx.choice("mode");
    let seconds = ctx.number("seconds");
    let start = now();
    END.store(start + seconds * ticks_per_sec(), Ordering::Relaxed);
    let entry = if mode == "yield" { yielder } else { spinner };
    let Some(ids) = spawn_all(2, entry, |_| Placement::Pinned(0)) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..2]);
    let mut r = Reports::new();
    let (switches, ns) = if mode == "yield" {
        let n = YIELDS.load(Ordering::Relaxed);
        (
            n,
            ticks_to_ns(END.load(Ordering::Relaxed) - start) / n.max(1),
        )
    } else {
        let n: u64 = SWITCHES.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        let t: u64 = SWITCH_TICKS.iter().map(|s| s.load(Ordering::Relaxed)).sum();
        let max = MAX_TICKS
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0);
        r.u64(format_args!("ctxsw.max_ns"), ticks_to_ns(max));
        (n, ticks_to_ns(t) / n.max(1))
    };
    r.u64(format_args!("ctxsw.switches"), switches);
    r.u64(format_args!("ctxsw.ns_per_switch"), ns);
    r.send();
    println!(
        "ctxsw: mode={} {} switches, {} ns per switch",
        mode, switches, ns
    );
    exit_code::OK
}
