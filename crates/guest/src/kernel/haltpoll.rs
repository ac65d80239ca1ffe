//! `idle=haltpoll`: guest-side adaptive halt polling (docs/ABI.md,
//! `hover_abi::haltpoll`; Linux's cpuidle-haltpoll is the model).
//!
//! HLT costs a trip through the nub (emulated CPL0) and, once halted, a
//! wake-up needs an interrupt delivered through emulated CPL0 as well. An
//! idle vCPU therefore first polls in CPL3 for a window: its run queue and
//! the one completion counter its waiting task named with [`watch`]. With
//! the monitor's consent (`SUPPRESS_IRQ`) it says it is polling, and the
//! monitor skips the I/O completion interrupt: a completion found by the
//! poll costs no exit at all.
//!
//! The window adapts per vCPU as in Linux's haltpoll governor: when the
//! vCPU's idle period ended after the window but within the maximum, the
//! window grows (to 50 us, then doubling); when it outlasted the maximum,
//! it halves, so a vCPU that only sees timer ticks stops polling.

use core::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use hover_abi::haltpoll::{area_gpa, flags};
use hover_abi::layout::MAX_VCPUS;

use crate::arch::percpu::PerCpu;
use crate::kernel::clock::{now, ticks_for_us, ticks_to_ns};

/// First window after a poll that would have caught the wake-up (Linux's
/// `guest_halt_poll_grow_start`).
const GROW_START_NS: u64 = 50_000;

/// The shared area: the ABI's own type.
type Area = hover_abi::haltpoll::HaltPollArea;

fn area(cpu: usize) -> &'static Area {
    // SAFETY: the boot area is identity-mapped (user, writable) for the
    // whole run, the monitor placed vCPU `cpu`'s area there, and both sides
    // use it only through atomics.
    unsafe { &*(area_gpa(cpu) as *const Area) }
}

/// Per-vCPU state the monitor does not see.
struct Local {
    /// The poll limit in force: the window, ns.
    window_ns: AtomicU64,
    /// Address of the counter the task waiting here watches (0: none).
    watch_addr: AtomicU64,
    /// The value it waits for the counter to reach.
    watch_target: AtomicU64,
    /// The device vector to signal when it does.
    watch_vector: AtomicU32,
    grows: AtomicU64,
    shrinks: AtomicU64,
    halts: AtomicU64,
    polled_ns: AtomicU64,
    window_peak_ns: AtomicU64,
}

static LOCAL: [Local; MAX_VCPUS] = [const {
    Local {
        window_ns: AtomicU64::new(0),
        watch_addr: AtomicU64::new(0),
        watch_target: AtomicU64::new(0),
        watch_vector: AtomicU32::new(0),
        grows: AtomicU64::new(0),
        shrinks: AtomicU64::new(0),
        halts: AtomicU64::new(0),
        polled_ns: AtomicU64::new(0),
        window_peak_ns: AtomicU64::new(0),
    }
}; MAX_VCPUS];

/// Whether this guest runs in `idle=haltpoll` mode.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Switch `idle=haltpoll` mode on (at boot, before any task runs).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// The running task is about to wait on this vCPU until the 64-bit counter
/// at `addr` reaches `target`, and is woken through device vector `vector`.
/// From here until this vCPU runs another task or halts, the vCPU watches
/// the counter itself (the task's own check, then the idle poll), so with
/// the monitor's consent it says it is polling and the completion
/// interrupt is skipped.
pub fn watch(pc: &PerCpu, addr: *const u64, target: u64, vector: u8) {
    let (l, a) = (&LOCAL[pc.index()], area(pc.index()));
    l.watch_target.store(target, Ordering::Relaxed);
    l.watch_vector.store(vector as u32, Ordering::Relaxed);
    l.watch_addr.store(addr as u64, Ordering::Release);
    if ENABLED.load(Ordering::Relaxed)
        && a.max_ns.load(Ordering::Relaxed) > 0
        && a.flags.load(Ordering::Relaxed) & flags::SUPPRESS_IRQ != 0
    {
        a.polling.store(1, Ordering::SeqCst);
    }
}

/// The watch set by [`watch`] is over (its counter got there).
pub fn unwatch(pc: &PerCpu) {
    LOCAL[pc.index()].watch_addr.store(0, Ordering::Release);
    area(pc.index()).polling.store(0, Ordering::Release);
}

/// This vCPU stops watching (it switches to another task, or halts): from
/// here completions must interrupt it. Whether the watched counter had
/// already got there (its waiter is then signaled).
pub fn stop_polling(pc: &PerCpu) -> bool {
    let cpu = pc.index();
    let a = area(cpu);
    if a.polling.load(Ordering::Relaxed) == 0 {
        return false;
    }
    a.polling.store(0, Ordering::SeqCst);
    // Pairs with the monitor's fence between writing the completion
    // counter and reading `polling`: one side sees the other.
    fence(Ordering::SeqCst);
    watch_fired(cpu)
}

/// Whether the watched counter has reached its target; if so, the watch is
/// over and its waiter signaled.
fn watch_fired(cpu: usize) -> bool {
    let l = &LOCAL[cpu];
    let addr = l.watch_addr.load(Ordering::Acquire);
    if addr == 0 {
        return false;
    }
    // SAFETY: `watch` was handed the address of a live, aligned u64 that
    // stays valid until `unwatch` (the waiting task's ring).
    let value = unsafe { (*(addr as *const AtomicU64)).load(Ordering::Acquire) };
    if value < l.watch_target.load(Ordering::Relaxed) {
        return false;
    }
    l.watch_addr.store(0, Ordering::Relaxed);
    crate::kernel::irq::signal_local(cpu, l.watch_vector.load(Ordering::Relaxed) as u8);
    true
}

/// Linux's haltpoll window update for an idle period of `block_ns`.
fn adjust(l: &Local, block_ns: u64, max_ns: u64) {
    let w = l.window_ns.load(Ordering::Relaxed);
    let next = if block_ns > w && block_ns <= max_ns {
        (w * 2).max(GROW_START_NS).min(max_ns)
    } else if block_ns > max_ns {
        w / 2
    } else {
        w
    };
    if next > w {
        l.grows.fetch_add(1, Ordering::Relaxed);
    } else if next < w {
        l.shrinks.fetch_add(1, Ordering::Relaxed);
    }
    let next = next.min(max_ns);
    l.window_ns.store(next, Ordering::Relaxed);
    l.window_peak_ns.fetch_max(next, Ordering::Relaxed);
}

/// One idle pass in `idle=haltpoll` mode with the guest's own maximum
/// `poll_us`: poll for the window, then halt with `halt` unless work showed
/// up (a woken task, or the watched counter reaching its target).
pub fn idle(pc: &PerCpu, poll_us: u64, halt: impl FnOnce()) {
    let cpu = pc.index();
    let (a, l) = (area(cpu), &LOCAL[cpu]);
    let max_ns = (poll_us * 1000).min(a.max_ns.load(Ordering::Relaxed));
    if max_ns == 0 {
        if stop_polling(pc) || watch_fired(cpu) {
            return;
        }
        l.halts.fetch_add(1, Ordering::Relaxed);
        halt();
        return;
    }
    let suppress = a.flags.load(Ordering::Relaxed) & flags::SUPPRESS_IRQ != 0;
    let window = l.window_ns.load(Ordering::Relaxed).min(max_ns);
    let start = now();
    let work = |cpu| pc.need_resched.load(Ordering::Relaxed) != 0 || watch_fired(cpu);
    let mut found = false;
    if window > 0 {
        a.polls.fetch_add(1, Ordering::Relaxed);
        if suppress {
            a.polling.store(1, Ordering::SeqCst);
        }
        // ticks_for_us(ns) / 1000 = ticks in `window` nanoseconds.
        let end = start + (ticks_for_us(window) / 1000).max(1);
        loop {
            if work(cpu) {
                found = true;
                break;
            }
            if now() >= end {
                break;
            }
            core::hint::spin_loop();
        }
        found = stop_polling(pc) || found || work(cpu);
        l.polled_ns
            .fetch_add(ticks_to_ns(now() - start), Ordering::Relaxed);
        if found {
            a.hits.fetch_add(1, Ordering::Relaxed);
        }
    } else {
        found = stop_polling(pc) || watch_fired(cpu);
    }
    if !found {
        l.halts.fetch_add(1, Ordering::Relaxed);
        halt();
    }
    adjust(l, ticks_to_ns(now() - start), max_ns);
    a.window_ns
        .store(l.window_ns.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Add each vCPU's window now as `PREFIX.N`.
pub fn report_windows(r: &mut crate::kernel::report::Reports, prefix: &str, vcpus: usize) {
    for (c, l) in LOCAL[..vcpus].iter().enumerate() {
        r.u64(
            format_args!("{}.{}", prefix, c),
            l.window_ns.load(Ordering::Relaxed),
        );
    }
}

/// Add the `haltpoll.*` counters (all vCPUs) to `r`.
pub fn report(r: &mut crate::kernel::report::Reports, vcpus: usize) {
    let sum_local = |f: fn(&Local) -> &AtomicU64| {
        LOCAL[..vcpus]
            .iter()
            .map(|l| f(l).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let sum_area = |f: fn(&Area) -> &AtomicU64| {
        (0..vcpus)
            .map(|c| f(area(c)).load(Ordering::Relaxed))
            .sum::<u64>()
    };
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let polls = sum_area(|a| &a.polls);
    r.u64(
        format_args!("haltpoll.max_ns"),
        area(0).max_ns.load(Ordering::Relaxed),
    );
    r.u64(format_args!("haltpoll.polls"), polls);
    r.u64(format_args!("haltpoll.hits"), sum_area(|a| &a.hits));
    r.u64(format_args!("haltpoll.halts"), sum_local(|l| &l.halts));
    r.u64(format_args!("haltpoll.grows"), sum_local(|l| &l.grows));
    r.u64(format_args!("haltpoll.shrinks"), sum_local(|l| &l.shrinks));
    r.u64(
        format_args!("haltpoll.polled_us"),
        sum_local(|l| &l.polled_ns) / 1000,
    );
    r.u64(
        format_args!("haltpoll.window_peak_ns"),
        LOCAL[..vcpus]
            .iter()
            .map(|l| l.window_peak_ns.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0),
    );
    report_windows(r, "haltpoll.window_ns", vcpus);
    r.u64(
        format_args!("haltpoll.irqs_skipped"),
        sum_area(|a| &a.irqs_skipped),
    );
}
