//! Asynchronous page faults, the guest half (seed 1).
//!
//! When a task touches a page the host must fetch, KVM injects a #PF with
//! reason "page not present" and a token instead of stalling the vCPU. The
//! nub hands the token to the preemption path, which parks the task here and
//! runs another. When the page is in, KVM raises the "page ready" interrupt
//! with the same token; the nub queues it and the scheduler wakes the task,
//! which retries its access. A ready that arrives before its task was parked
//! is remembered; the broadcast token wakes every parked task.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hover_abi::boot::BootInfo;
use hover_abi::layout::MAX_VCPUS;
use hover_abi::pv::{
    ASYNC_PF_BROADCAST_TOKEN, ASYNC_PF_DELIVERY_AS_INT, ASYNC_PF_ENABLED, FEATURE_ASYNC_PF,
    FEATURE_ASYNC_PF_INT, MSR_KVM_ASYNC_PF_EN, MSR_KVM_ASYNC_PF_INT,
};
use hover_abi::vectors;

use crate::arch::nub;
use crate::arch::percpu::{self, PerCpu};
use crate::kernel::clock;
use crate::kernel::report::Reports;
use crate::kernel::sched::{self, MAX_TASKS};
use crate::kernel::sync::SpinLock;

const EARLY: usize = 64;

/// One vCPU's parked tasks and early "page ready" tokens.
struct Waits {
    /// Parked tasks: token, task, TSC when parked.
    parked: [(u32, usize, u64); MAX_TASKS],
    parked_len: usize,
    early: [u32; EARLY],
    early_len: usize,
}

impl Waits {
    const EMPTY: Waits = Waits {
        parked: [(0, 0, 0); MAX_TASKS],
        parked_len: 0,
        early: [0; EARLY],
        early_len: 0,
    };
}

static WAITS: [SpinLock<Waits>; MAX_VCPUS] = [const { SpinLock::new(Waits::EMPTY) }; MAX_VCPUS];
static ENABLED: AtomicBool = AtomicBool::new(false);
/// TSC ticks tasks spent parked, and how many parkings ended by "page ready".
static WAITED: AtomicU64 = AtomicU64::new(0);
static WAITS_DONE: AtomicU64 = AtomicU64::new(0);

/// Turn async page faults on for this vCPU if the monitor offers them
/// (ASYNC_PF and ASYNC_PF_INT in the boot-info page). Call after the LAPIC
/// is software-enabled: KVM must be able to deliver "page ready".
pub fn enable(pc: &PerCpu, boot: &BootInfo) -> bool {
    let wanted = FEATURE_ASYNC_PF | FEATURE_ASYNC_PF_INT;
    if boot.pv_features & wanted != wanted {
        return false;
    }
    nub::wrmsr(MSR_KVM_ASYNC_PF_INT, vectors::ASYNC_PF_READY as u64);
    let area = &pc.apf_area as *const _ as u64;
    nub::wrmsr(
        MSR_KVM_ASYNC_PF_EN,
        area | ASYNC_PF_ENABLED | ASYNC_PF_DELIVERY_AS_INT,
    );
    ENABLED.store(true, Ordering::Relaxed);
    true
}

/// The nub redirected a task that touched a page not present: count it
/// here at native speed and park the task (from the preemption path,
/// `preempt_count == 1`, which has cleared the area's flags).
pub fn park_faulted(pc: &PerCpu, token: u32) {
    pc.apf_not_present.fetch_add(1, Ordering::Relaxed);
    park(token);
}

/// Park the current task until "page ready" for `token`.
fn park(token: u32) {
    let cpu = percpu::this_cpu().index();
    let me = sched::current();
    {
        let mut w = WAITS[cpu].lock();
        if let Some(i) = w.early[..w.early_len].iter().position(|&t| t == token) {
            // The page is already in: retry the access at once.
            let last = w.early_len - 1;
            w.early[i] = w.early[last];
            w.early_len = last;
            return;
        }
        sched::mark_blocked(me);
        let n = w.parked_len;
        w.parked[n] = (token, me, clock::now());
        w.parked_len += 1;
    }
    sched::block();
}

/// Wake the tasks whose pages the nub has been told are ready (scheduler).
pub fn process_ready(pc: &PerCpu) {
    let head = pc.apf_ready_head.load(Ordering::Acquire);
    let mut tail = pc.apf_ready_tail.load(Ordering::Relaxed);
    if tail == head {
        return;
    }
    pc.apf_ready
        .fetch_add(u64::from(head.wrapping_sub(tail)), Ordering::Relaxed);
    let mut wake = [0usize; MAX_TASKS];
    let mut n = 0;
    {
        let mut w = WAITS[pc.index()].lock();
        while tail != head {
            let token = pc.apf_ready_ring[usize::from(tail)].load(Ordering::Relaxed);
            tail = tail.wrapping_add(1);
            if token == ASYNC_PF_BROADCAST_TOKEN {
                for &(_, task, _) in &w.parked[..w.parked_len] {
                    wake[n] = task;
                    n += 1;
                }
                w.parked_len = 0;
            } else if let Some(i) = w.parked[..w.parked_len]
                .iter()
                .position(|&(t, _, _)| t == token)
            {
                wake[n] = w.parked[i].1;
                n += 1;
                WAITED.fetch_add(clock::now() - w.parked[i].2, Ordering::Relaxed);
                WAITS_DONE.fetch_add(1, Ordering::Relaxed);
                let last = w.parked_len - 1;
                w.parked[i] = w.parked[last];
                w.parked_len = last;
            } else {
                // Ready before its not-present was handled (or for an access
                // KVM resolved while the vCPU waited): keep the newest ones.
                if w.early_len == EARLY {
                    w.early.copy_within(1.., 0);
                    w.early_len -= 1;
                }
                let e = w.early_len;
                w.early[e] = token;
                w.early_len += 1;
            }
        }
    }
    pc.apf_ready_tail.store(tail, Ordering::Relaxed);
    for &task in &wake[..n] {
        sched::wake(task);
    }
}

/// Start the parked-time statistic afresh (a workload's measured phase begins).
pub fn reset_parked_time() {
    WAITED.store(0, Ordering::Relaxed);
    WAITS_DONE.store(0, Ordering::Relaxed);
}

/// Add the guest's async-PF counters (all vCPUs) to `r`, if async PF is on.
pub fn report(r: &mut Reports, vcpus: usize) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let sum = |f: fn(&PerCpu) -> u64| (0..vcpus).map(|c| f(percpu::of(c))).sum::<u64>();
    r.u64(
        format_args!("apf.not_present"),
        sum(|p| p.apf_not_present.load(Ordering::Relaxed)),
    );
    r.u64(
        format_args!("apf.ready"),
        sum(|p| p.apf_ready.load(Ordering::Relaxed)),
    );
    r.u64(
        format_args!("apf.sync_faults"),
        sum(|p| p.apf_sync.load(Ordering::Relaxed)),
    );
    let done = WAITS_DONE.load(Ordering::Relaxed);
    let waited = WAITED.load(Ordering::Relaxed);
    r.u64(format_args!("apf.parked"), done);
    r.u64(
        format_args!("apf.parked_avg_us"),
        clock::ticks_to_ns(waited.checked_div(done).unwrap_or(0)) / 1000,
    );
}
