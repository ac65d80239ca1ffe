//! The LAPIC timer in TSC-deadline mode: the scheduler tick and sleepers.
//!
//! While tasks run, the timer fires every `tick_period` (the nub rearms it).
//! A sleeping task's deadline arms it earlier when needed. An idle vCPU arms
//! it only for its earliest sleeper, or not at all (no tick while idle).

use core::sync::atomic::Ordering;

use hover_abi::layout::MAX_VCPUS;
use hover_abi::vectors;

use crate::arch::nub;
use crate::arch::percpu::{this_cpu, PerCpu};
use crate::kernel::clock;
use crate::kernel::sched::{self, MAX_TASKS};
use crate::kernel::sync::{preempt_disable, preempt_enable, SpinLock};

const LVT_TIMER: u32 = 0x832;
const TSC_DEADLINE_MODE: u64 = 0b10 << 17;

/// The sleeping tasks of one vCPU.
struct Sleepers {
    entries: [(u64, usize); MAX_TASKS],
    len: usize,
}

/// Announce the earliest real-time sleeper's deadline on this vCPU (the
/// monitor boosts the vCPU just before it; `boost`).
fn announce_rt(s: &Sleepers) {
    let rt = s.entries[..s.len]
        .iter()
        .filter(|e| sched::is_realtime(e.1))
        .map(|e| e.0)
        .min();
    crate::kernel::boost::set_wake_at(rt.unwrap_or(0));
}

impl Sleepers {
    const EMPTY: Sleepers = Sleepers {
        entries: [(0, 0); MAX_TASKS],
        len: 0,
    };

    fn earliest(&self) -> Option<u64> {
        self.entries[..self.len].iter().map(|e| e.0).min()
    }
}

static SLEEPERS: [SpinLock<Sleepers>; MAX_VCPUS] =
    [const { SpinLock::new(Sleepers::EMPTY) }; MAX_VCPUS];

/// Put this vCPU's timer in TSC-deadline mode with a tick of `hz`.
pub fn init_cpu(pc: &PerCpu, hz: u64) {
    pc.tick_period
        .store(clock::ticks_per_sec() / hz.max(1), Ordering::Relaxed);
    nub::wrmsr(LVT_TIMER, vectors::TIMER as u64 | TSC_DEADLINE_MODE);
}

/// Make sure a tick is armed no later than one period from now (a task is
/// about to run).
pub fn ensure_tick(pc: &PerCpu) {
    let want = clock::now() + pc.tick_period.load(Ordering::Relaxed);
    let armed = pc.armed_deadline.load(Ordering::Relaxed);
    if armed == 0 || armed > want {
        set_deadline(pc, want);
    }
}

/// Before idling: arm the timer for the earliest sleeper only, or disarm it.
///
/// `lazy` (the first idle pass after a task ran) keeps a pending tick armed
/// and only moves it earlier for a sleeper: a vCPU idle for less than a tick
/// (waiting for an I/O completion, say) then saves the two emulated nub
/// calls of disarming and re-arming. If the tick fires while idle, the next
/// pass is not lazy and disarms, so a long idle costs one extra interrupt.
pub fn program_idle(pc: &PerCpu, lazy: bool) {
    let sleeper = SLEEPERS[pc.index()].lock().earliest();
    let armed = pc.armed_deadline.load(Ordering::Relaxed);
    let want = match sleeper {
        Some(s) if lazy && armed != 0 => s.min(armed),
        Some(s) => s,
        None if lazy => armed,
        None => 0,
    };
    if armed != want {
        set_deadline(pc, want);
    }
}

fn set_deadline(pc: &PerCpu, deadline: u64) {
    pc.deadline_writes.fetch_add(1, Ordering::Relaxed);
    nub::set_deadline(deadline);
}

/// Add the timer's counters (all vCPUs) to `r`: interrupts taken and nub
/// calls spent on programming the timer.
pub fn report(r: &mut crate::kernel::report::Reports, vcpus: usize) {
    let sum = |f: fn(&PerCpu) -> u64| {
        (0..vcpus)
            .map(|c| f(crate::arch::percpu::of(c)))
            .sum::<u64>()
    };
    r.u64(
        format_args!("runtime.timer_irqs"),
        sum(|p| p.ticks.load(Ordering::Relaxed)),
    );
    r.u64(
        format_args!("runtime.deadline_writes"),
        sum(|p| p.deadline_writes.load(Ordering::Relaxed)),
    );
}

/// Block the current task until the TSC reaches `deadline`.
pub fn sleep_until(deadline: u64) {
    preempt_disable();
    if clock::now() < deadline {
        let pc = this_cpu();
        let me = sched::current();
        sched::mark_blocked(me);
        {
            let mut s = SLEEPERS[pc.index()].lock();
            let n = s.len;
            s.entries[n] = (deadline, me);
            s.len += 1;
            if sched::is_realtime(me) {
                announce_rt(&s);
            }
        }
        let armed = pc.armed_deadline.load(Ordering::Relaxed);
        if armed == 0 || deadline < armed {
            set_deadline(pc, deadline);
        }
        sched::block();
    }
    preempt_enable();
}

/// Wake this vCPU's sleepers whose deadline has passed.
pub fn expire(cpu: usize) {
    let now = clock::now();
    let mut due = [0usize; MAX_TASKS];
    let mut n = 0;
    {
        let mut s = SLEEPERS[cpu].lock();
        let mut i = 0;
        while i < s.len {
            if s.entries[i].0 <= now {
                due[n] = s.entries[i].1;
                n += 1;
                let last = s.len - 1;
                s.entries[i] = s.entries[last];
                s.len = last;
            } else {
                i += 1;
            }
        }
        if n > 0 {
            announce_rt(&s);
        }
    }
    for &id in &due[..n] {
        sched::wake(id);
    }
}
