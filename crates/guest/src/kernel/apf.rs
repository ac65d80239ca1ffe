//! Asynchronous page faults, the guest half (seed 1).
//!
//! When a task touches a page the host must fetch, KVM injects a #PF with
//! reason "page not present" and a token instead of stalling the vCPU. The
//! nub hands the token to the preemption path, which parks the task here and
//! runs another. When the page is in, KVM raises the "page ready" interrupt
//! with the same token; the nub queues it and the scheduler wakes the task,
//! which retries its access. A ready that arrives before its task was parked
//! is remembered; the broadcast token wakes every parked task.
//!
//! With `apf_min_us=N` (N > 0) the guest keeps async PF on only while it
//! pays (`hover_abi::apf_policy` decides; [`policy`] applies it).

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use hover_abi::apf_policy::{self, Window};
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
/// TSC ticks tasks spent parked, and how many parkings ended by "page
/// ready" (since boot; the report counts from the bases).
static WAITED: AtomicU64 = AtomicU64::new(0);
static WAITS_DONE: AtomicU64 = AtomicU64::new(0);
static WAITED_BASE: AtomicU64 = AtomicU64::new(0);
static WAITS_DONE_BASE: AtomicU64 = AtomicU64::new(0);
/// "Page ready" notifications the nub handed over with a redirect into
/// the preemption path (the others went through the ring).
static READY_REDIRECTED: AtomicU64 = AtomicU64::new(0);
/// "Page ready" notifications that came before their task parked.
static EARLY_READIES: AtomicU64 = AtomicU64::new(0);

/// The adaptive policy (`apf_min_us`): its threshold (0: always on), the
/// wanted state, and the window it measures.
static MIN_US: AtomicU64 = AtomicU64::new(0);
static WANT_ON: AtomicBool = AtomicBool::new(true);
/// TSC at which the current window (on) or pause (off) ends; 0 before the
/// policy starts.
static UNTIL: AtomicU64 = AtomicU64::new(0);
/// Totals at the window's start: not-present, parked time, parkings
/// ended, early readies.
static WINDOW: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
/// Each vCPU's async PF state as its MSR has it (1 on, 0 off).
static VCPU_ON: [AtomicU8; MAX_VCPUS] = [const { AtomicU8::new(0) }; MAX_VCPUS];
/// How often the policy turned async PF off, and the TSC ticks it was off.
static TURNED_OFF: AtomicU64 = AtomicU64::new(0);
static OFF_TICKS: AtomicU64 = AtomicU64::new(0);
static OFF_SINCE: AtomicU64 = AtomicU64::new(0);

/// Turn async page faults on for this vCPU if the monitor offers them
/// (ASYNC_PF and ASYNC_PF_INT in the boot-info page). Call after the LAPIC
/// is software-enabled: KVM must be able to deliver "page ready".
pub fn enable(pc: &PerCpu, boot: &BootInfo) -> bool {
    let wanted = FEATURE_ASYNC_PF | FEATURE_ASYNC_PF_INT;
    if boot.pv_features & wanted != wanted {
        return false;
    }
    nub::wrmsr(MSR_KVM_ASYNC_PF_INT, vectors::ASYNC_PF_READY as u64);
    set_msr(pc, true);
    ENABLED.store(true, Ordering::Relaxed);
    true
}

fn set_msr(pc: &PerCpu, on: bool) {
    let area = &pc.apf_area as *const _ as u64;
    let value = if on {
        area | ASYNC_PF_ENABLED | ASYNC_PF_DELIVERY_AS_INT
    } else {
        area
    };
    nub::wrmsr(MSR_KVM_ASYNC_PF_EN, value);
    VCPU_ON[pc.index()].store(u8::from(on), Ordering::Relaxed);
}

/// Keep async PF on only while faults wait at least `min_us` on average
/// (0: always on). Called once, by the boot vCPU, before the workload.
pub fn set_min_us(min_us: u64) {
    MIN_US.store(min_us, Ordering::Relaxed);
}

/// The adaptive policy, from every vCPU's scheduler (`preempt_count == 1`).
///
/// One vCPU at a time decides, when a window or pause ends
/// (`apf_policy::next`); each vCPU then brings its own MSR in line.
/// Turning async PF off makes KVM drop its pending "page ready"s, so the
/// vCPU wakes every task parked on it: each retries its access and, if the
/// page is still out, waits for it as any vCPU without async PF does.
pub fn policy(pc: &PerCpu) {
    let min_us = MIN_US.load(Ordering::Relaxed);
    if min_us == 0 || !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let now = clock::now();
    let until = UNTIL.load(Ordering::Relaxed);
    if now >= until
        && UNTIL
            .compare_exchange(until, u64::MAX, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    {
        decide(now, until == 0, min_us);
    }
    let want = WANT_ON.load(Ordering::Relaxed);
    if (VCPU_ON[pc.index()].load(Ordering::Relaxed) == 1) != want {
        set_msr(pc, want);
        if !want {
            wake_all_parked(pc);
        }
    }
}

/// The deciding vCPU's part of [`policy`] (it holds `UNTIL` at `u64::MAX`).
fn decide(now: u64, first: bool, min_us: u64) {
    let totals = [
        not_present_total(),
        WAITED.load(Ordering::Relaxed),
        WAITS_DONE.load(Ordering::Relaxed),
        EARLY_READIES.load(Ordering::Relaxed),
    ];
    let d: [u64; 4] =
        core::array::from_fn(|i| totals[i].wrapping_sub(WINDOW[i].load(Ordering::Relaxed)));
    let window = Window {
        not_present: d[0],
        parked_ns: clock::ticks_to_ns(d[1]),
        parkings: d[2],
        early: d[3],
    };
    let on = WANT_ON.load(Ordering::Relaxed);
    // The first call starts the first window.
    let (next_on, span_ms) = if first {
        (true, apf_policy::WINDOW_MS)
    } else {
        apf_policy::next(on, window, min_us)
    };
    if !on && next_on {
        OFF_TICKS.fetch_add(
            now.saturating_sub(OFF_SINCE.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
    } else if on && !next_on {
        TURNED_OFF.fetch_add(1, Ordering::Relaxed);
        OFF_SINCE.store(now, Ordering::Relaxed);
    }
    for (w, t) in WINDOW.iter().zip(totals) {
        w.store(t, Ordering::Relaxed);
    }
    WANT_ON.store(next_on, Ordering::Relaxed);
    UNTIL.store(now + clock::ticks_for_us(span_ms * 1000), Ordering::Release);
}

fn not_present_total() -> u64 {
    (0..MAX_VCPUS)
        .map(|c| percpu::of(c).apf_not_present.load(Ordering::Relaxed))
        .sum()
}

/// Wake every task parked on this vCPU (async PF was just turned off).
fn wake_all_parked(pc: &PerCpu) {
    let mut wake = [0usize; MAX_TASKS];
    let n = {
        let mut w = WAITS[pc.index()].lock();
        let n = w.parked_len;
        for (slot, &(_, task, _)) in wake.iter_mut().zip(&w.parked[..n]) {
            *slot = task;
        }
        w.parked_len = 0;
        w.early_len = 0;
        n
    };
    for &task in &wake[..n] {
        sched::wake(task);
    }
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

/// The nub has handed over "page ready" tokens the scheduler has not taken.
pub fn ready_pending(pc: &PerCpu) -> bool {
    pc.apf_ready_one.load(Ordering::Relaxed) != 0
        || pc.apf_ready_head.load(Ordering::Acquire) != pc.apf_ready_tail.load(Ordering::Relaxed)
}

/// Wake the tasks whose pages the nub has been told are ready (scheduler,
/// `preempt_count == 1`, so the nub writes neither `apf_ready_one` nor the
/// ring's slots behind `head` meanwhile).
pub fn process_ready(pc: &PerCpu) {
    let one = pc.apf_ready_one.load(Ordering::Relaxed);
    let head = pc.apf_ready_head.load(Ordering::Acquire);
    let mut tail = pc.apf_ready_tail.load(Ordering::Relaxed);
    if tail == head && one == 0 {
        return;
    }
    pc.apf_ready.fetch_add(
        u64::from(head.wrapping_sub(tail)) + u64::from(one != 0),
        Ordering::Relaxed,
    );
    let mut wake = Wakes {
        tasks: [0; MAX_TASKS],
        n: 0,
    };
    {
        let mut w = WAITS[pc.index()].lock();
        if one != 0 {
            pc.apf_ready_one.store(0, Ordering::Relaxed);
            READY_REDIRECTED.fetch_add(1, Ordering::Relaxed);
            take_ready(&mut w, one, &mut wake);
        }
        while tail != head {
            let token = pc.apf_ready_ring[usize::from(tail)].load(Ordering::Relaxed);
            tail = tail.wrapping_add(1);
            take_ready(&mut w, token, &mut wake);
        }
    }
    pc.apf_ready_tail.store(tail, Ordering::Relaxed);
    for &task in &wake.tasks[..wake.n] {
        sched::wake(task);
    }
}

/// Tasks to wake once `WAITS` is unlocked.
struct Wakes {
    tasks: [usize; MAX_TASKS],
    n: usize,
}

/// One "page ready": the task parked on `token` (every parked task for the
/// broadcast token) is to be woken; a token nobody waits on yet is kept.
fn take_ready(w: &mut Waits, token: u32, wake: &mut Wakes) {
    if token == ASYNC_PF_BROADCAST_TOKEN {
        for &(_, task, _) in &w.parked[..w.parked_len] {
            wake.tasks[wake.n] = task;
            wake.n += 1;
        }
        w.parked_len = 0;
    } else if let Some(i) = w.parked[..w.parked_len]
        .iter()
        .position(|&(t, _, _)| t == token)
    {
        wake.tasks[wake.n] = w.parked[i].1;
        wake.n += 1;
        WAITED.fetch_add(clock::now() - w.parked[i].2, Ordering::Relaxed);
        WAITS_DONE.fetch_add(1, Ordering::Relaxed);
        let last = w.parked_len - 1;
        w.parked[i] = w.parked[last];
        w.parked_len = last;
    } else {
        // Ready before its not-present was handled (or for an access KVM
        // resolved while the vCPU waited): keep the newest ones.
        EARLY_READIES.fetch_add(1, Ordering::Relaxed);
        if w.early_len == EARLY {
            w.early.copy_within(1.., 0);
            w.early_len -= 1;
        }
        let e = w.early_len;
        w.early[e] = token;
        w.early_len += 1;
    }
}

/// Start the parked-time statistic afresh (a workload's measured phase begins).
pub fn reset_parked_time() {
    WAITED_BASE.store(WAITED.load(Ordering::Relaxed), Ordering::Relaxed);
    WAITS_DONE_BASE.store(WAITS_DONE.load(Ordering::Relaxed), Ordering::Relaxed);
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
        format_args!("apf.ready_redirected"),
        READY_REDIRECTED.load(Ordering::Relaxed),
    );
    r.u64(
        format_args!("apf.sync_faults"),
        sum(|p| p.apf_sync.load(Ordering::Relaxed)),
    );
    let done = WAITS_DONE.load(Ordering::Relaxed) - WAITS_DONE_BASE.load(Ordering::Relaxed);
    let waited = WAITED.load(Ordering::Relaxed) - WAITED_BASE.load(Ordering::Relaxed);
    r.u64(format_args!("apf.parked"), done);
    r.u64(
        format_args!("apf.parked_avg_us"),
        clock::ticks_to_ns(waited.checked_div(done).unwrap_or(0)) / 1000,
    );
    r.u64(
        format_args!("apf.early_readies"),
        EARLY_READIES.load(Ordering::Relaxed),
    );
    if MIN_US.load(Ordering::Relaxed) != 0 {
        r.u64(
            format_args!("apf.turned_off"),
            TURNED_OFF.load(Ordering::Relaxed),
        );
        // A pause under way counts up to now.
        let current = if WANT_ON.load(Ordering::Relaxed) {
            0
        } else {
            clock::now().saturating_sub(OFF_SINCE.load(Ordering::Relaxed))
        };
        r.u64(
            format_args!("apf.off_ms"),
            clock::ticks_to_ns(OFF_TICKS.load(Ordering::Relaxed) + current) / 1_000_000,
        );
    }
}
