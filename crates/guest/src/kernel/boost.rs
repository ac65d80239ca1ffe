//! vCPU priority boosting, the guest half (docs/ABI.md, `hover_abi::boost`).
//!
//! Each vCPU registers its own shared area at boot. The runtime then sets
//! request bits where latency matters and keeps running: [`request::IRQ`]
//! from the pass of the scheduler that hands a device interrupt to its task
//! until the next pass, [`request::RT`] while a real-time task runs, and
//! [`request::CRITICAL`] inside [`critical_begin`]/[`critical_end`]. A
//! sleeping real-time task's deadline is published as `wake_at`, so the
//! monitor can boost the vCPU just before the timer fires. When the bits
//! clear and the monitor's status says the vCPU is boosted, the runtime
//! makes the synchronous unboost call, unless the host offers to keep
//! (`keep_us`) and the offer covers the next announced wake-up or the vCPU
//! halts: then it bumps the area's quiet count and the monitor settles
//! the boost at its next look (a quiet unboost: no exit). Otherwise
//! nothing leaves the guest.

use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use hover_abi::boost::{self, request, status, BOOST_AREA_VERSION};
use hover_abi::control::{op, status as control_status, ControlRequest};
use hover_abi::layout::MAX_VCPUS;

use crate::arch::percpu::PerCpu;

/// The shared area: the ABI's own type.
type Area = boost::BoostArea;

/// Per-vCPU state beside the shared area.
struct Local {
    /// The monitor accepted this vCPU's area.
    enabled: AtomicBool,
    /// Nesting depth of critical sections on this vCPU.
    critical: AtomicU32,
    /// Unboost calls made.
    unboost_calls: AtomicU64,
    /// The area's `boosts` at this vCPU's last unboost (call or quiet): a
    /// boost the host granted after the guest last looked is unanswered.
    answered: AtomicU64,
}

static AREAS: [Area; MAX_VCPUS] = [const { Area::new() }; MAX_VCPUS];

static LOCAL: [Local; MAX_VCPUS] = [const {
    Local {
        enabled: AtomicBool::new(false),
        critical: AtomicU32::new(0),
        unboost_calls: AtomicU64::new(0),
        answered: AtomicU64::new(0),
    }
}; MAX_VCPUS];

/// Register this vCPU's area with the monitor (at boot, on that vCPU).
pub fn init_cpu(pc: &PerCpu) {
    let cpu = pc.index();
    let area = &AREAS[cpu];
    area.version.store(BOOST_AREA_VERSION, Ordering::Relaxed);
    let mut req = ControlRequest {
        op: op::BOOST_REGISTER,
        status: 0,
        arg0: area as *const Area as u64,
        arg1: BOOST_AREA_VERSION as u64,
    };
    let st = crate::drivers::control::send(&mut req);
    LOCAL[cpu]
        .enabled
        .store(st == control_status::OK, Ordering::Relaxed);
}

fn this() -> Option<(usize, &'static Area)> {
    let cpu = crate::arch::percpu::cpu_index()?;
    LOCAL[cpu]
        .enabled
        .load(Ordering::Relaxed)
        .then(|| (cpu, &AREAS[cpu]))
}

/// After bits were cleared: the unboost, only if they are all clear and
/// the monitor says the vCPU is boosted; quiet (a count in the area, no
/// exit) when the host reads quiet unboosts (its `keep_us` offer is
/// non-zero) and either the offer covers the next announced wake-up or
/// the vCPU `halts` (a halted vCPU holds no host CPU while the monitor
/// settles the boost, and an interrupt-driven vCPU spared an exit per
/// interrupt keeps the speed it has unboosted).
fn maybe_unboost(cpu: usize, area: &Area, halts: bool) {
    if area.request.load(Ordering::SeqCst) == 0
        && area.status.load(Ordering::SeqCst) & status::BOOSTED != 0
    {
        LOCAL[cpu]
            .answered
            .store(area.boosts.load(Ordering::SeqCst), Ordering::Relaxed);
        let keep_us = area.keep_us.load(Ordering::SeqCst) as u64;
        let wake_at = area.wake_at.load(Ordering::SeqCst);
        let now = crate::kernel::clock::now();
        // A deadline already past is covered: the task is about to run, and
        // the host keeps a boost for a wake-up that is due.
        let wake_covered = wake_at != 0
            && wake_at.saturating_sub(now) <= crate::kernel::clock::ticks_for_us(keep_us);
        if keep_us != 0 && (halts || wake_covered) {
            area.quiet_unboosts.fetch_add(1, Ordering::SeqCst);
            return;
        }
        LOCAL[cpu].unboost_calls.fetch_add(1, Ordering::Relaxed);
        let mut req = ControlRequest {
            op: op::BOOST_UNBOOST,
            status: 0,
            arg0: 0,
            arg1: 0,
        };
        crate::drivers::control::send(&mut req);
    }
}

/// Set the scheduler's bits for what this vCPU runs next: `irq` (a device
/// interrupt was handed over in this pass) and `rt` (the next task is
/// real-time); `halts`: nothing is runnable and the vCPU halts. Called by
/// the scheduler on every pass.
pub fn sched_bits(irq: bool, rt: bool, halts: bool) {
    let Some((cpu, area)) = this() else { return };
    let want = if irq { request::IRQ } else { 0 } | if rt { request::RT } else { 0 };
    let old = area.request.load(Ordering::Relaxed);
    let new = (old & !(request::IRQ | request::RT)) | want;
    if new != old {
        // Only this vCPU writes its request word, and interrupts do not.
        area.request.store(new, Ordering::SeqCst);
        if new & !old == 0 {
            maybe_unboost(cpu, area, halts);
        }
    } else if halts
        && new == 0
        && area.boosts.load(Ordering::SeqCst) != LOCAL[cpu].answered.load(Ordering::Relaxed)
    {
        // A boost granted after the bits last cleared (the host boosts an
        // interrupt's vCPU just after injecting it, so the guest may have
        // handled it and cleared its bit first): answer it before halting,
        // or it would last until the next bits cleared.
        maybe_unboost(cpu, area, halts);
    }
}

/// Publish the TSC deadline of the next real-time wake-up on this vCPU (0: none).
pub fn set_wake_at(deadline: u64) {
    if let Some((_, area)) = this() {
        area.wake_at.store(deadline, Ordering::SeqCst);
    }
}

/// Enter a critical section others wait on (nests).
pub fn critical_begin() {
    let Some((cpu, area)) = this() else { return };
    if LOCAL[cpu].critical.fetch_add(1, Ordering::Relaxed) == 0 {
        area.request.fetch_or(request::CRITICAL, Ordering::SeqCst);
    }
}

/// Leave a critical section; the last one out unboosts if nothing else asks.
pub fn critical_end() {
    let Some((cpu, area)) = this() else { return };
    if LOCAL[cpu].critical.fetch_sub(1, Ordering::Relaxed) == 1 {
        area.request.fetch_and(!request::CRITICAL, Ordering::SeqCst);
        maybe_unboost(cpu, area, false);
    }
}

/// This vCPU's status bits as the monitor last wrote them (0 if not registered).
pub fn status_bits() -> u32 {
    this().map_or(0, |(_, a)| a.status.load(Ordering::SeqCst))
}

/// Add `boost.registered`, `boost.host_boosts`, `boost.unboost_calls` and
/// `boost.quiet_unboosts` (sums over all vCPUs) to `r`.
pub fn report(r: &mut crate::kernel::report::Reports, vcpus: usize) {
    let vcpus = vcpus.min(MAX_VCPUS);
    let registered = (0..vcpus)
        .filter(|&c| LOCAL[c].enabled.load(Ordering::Relaxed))
        .count() as u64;
    r.u64(format_args!("boost.registered"), registered);
    if registered == 0 {
        return;
    }
    let sum = |f: fn(usize) -> u64| (0..vcpus).map(f).sum::<u64>();
    r.u64(
        format_args!("boost.host_boosts"),
        sum(|c| AREAS[c].boosts.load(Ordering::Relaxed)),
    );
    r.u64(
        format_args!("boost.unboost_calls"),
        sum(|c| LOCAL[c].unboost_calls.load(Ordering::Relaxed)),
    );
    r.u64(
        format_args!("boost.quiet_unboosts"),
        sum(|c| AREAS[c].quiet_unboosts.load(Ordering::Relaxed)),
    );
}
