//! The LAPIC timer in TSC-deadline mode: the scheduler tick and sleepers.
//!
//! While tasks run, the timer fires every `tick_period` (the nub rearms it).
//! A sleeping task's deadline arms it earlier when needed. An idle vCPU arms
//! it only for its earliest sleeper, or not at all (no tick while idle).

use core::sync::atomic::Ordering;

use hover_abi::layout::MAX_VCPUS;
use hover_abi::vectors;

use crate::percpu::{this_cpu, PerCpu};
use crate::sched::{self, MAX_TASKS};
use crate::sync::{preempt_disable, preempt_enable, SpinLock};
use crate::{clock, nub};

const LVT_TIMER: u32 = 0x832;
const TSC_DEADLINE_MODE: u64 = 0b10 << 17;

/// The sleeping tasks of one vCPU.
struct Sleepers {
    entries: [(u64, usize); MAX_TASKS],
    len: usize,
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
        nub::set_deadline(want);
    }
}

/// Before idling: arm the timer for the earliest sleeper only, or disarm it.
pub fn program_idle(pc: &PerCpu) {
    let want = SLEEPERS[pc.index()].lock().earliest().unwrap_or(0);
    if pc.armed_deadline.load(Ordering::Relaxed) != want {
        nub::set_deadline(want);
    }
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
        }
        let armed = pc.armed_deadline.load(Ordering::Relaxed);
        if armed == 0 || deadline < armed {
            nub::set_deadline(deadline);
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
    }
    for &id in &due[..n] {
        sched::wake(id);
    }
}
