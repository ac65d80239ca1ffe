//! Time from the TSC, whose rate the boot-info page gives (CPUID at CPL3 shows
//! the outer host here, so the guest cannot ask the CPU).

use core::sync::atomic::{AtomicU64, Ordering};

static TSC_KHZ: AtomicU64 = AtomicU64::new(1_000_000);

/// Record the TSC rate from the boot-info page.
pub fn init(tsc_khz: u64) {
    if tsc_khz != 0 {
        TSC_KHZ.store(tsc_khz, Ordering::Relaxed);
    }
}

/// The TSC (native at CPL3).
#[inline]
pub fn now() -> u64 {
    // SAFETY: rdtsc has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// TSC ticks in `us` microseconds.
pub fn ticks_for_us(us: u64) -> u64 {
    us.saturating_mul(TSC_KHZ.load(Ordering::Relaxed)) / 1000
}

/// The TSC value `us` microseconds from now.
pub fn deadline_after_us(us: u64) -> u64 {
    now().saturating_add(ticks_for_us(us))
}

/// TSC ticks per second.
pub fn ticks_per_sec() -> u64 {
    TSC_KHZ.load(Ordering::Relaxed) * 1000
}

/// Nanoseconds in `ticks` TSC ticks.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    (ticks as u128 * 1_000_000 / TSC_KHZ.load(Ordering::Relaxed).max(1) as u128) as u64
}
