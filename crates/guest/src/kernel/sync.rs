//! Preemption control and a spinlock.
//!
//! Interrupts cannot be masked at CPL3 here, so the runtime protects its own
//! critical sections by raising this CPU's `preempt_count`: the nub then
//! only records that a reschedule is due, and [`preempt_enable`] acts on it.
//! The nub's handlers never take locks, so a lock holder with preemption off
//! cannot be interrupted into a deadlock.

use core::cell::UnsafeCell;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{compiler_fence, AtomicBool, Ordering};

use crate::arch::percpu::this_cpu;

/// Forbid task switches on this CPU until the matching [`preempt_enable`].
#[inline]
pub fn preempt_disable() {
    let pc = this_cpu();
    // Not an atomic read-modify-write: an interrupt in between restores the
    // count before this code runs again (the preemption path leaves it as it
    // found it), so the store cannot lose an update.
    pc.preempt_count.store(
        pc.preempt_count.load(Ordering::Relaxed) + 1,
        Ordering::Relaxed,
    );
    compiler_fence(Ordering::SeqCst);
}

/// Allow task switches again; switch now if one became due meanwhile.
#[inline]
pub fn preempt_enable() {
    compiler_fence(Ordering::SeqCst);
    let pc = this_cpu();
    let count = pc.preempt_count.load(Ordering::Relaxed) - 1;
    if count == 0 && pc.need_resched.load(Ordering::Relaxed) != 0 {
        crate::kernel::sched::reschedule();
    } else {
        pc.preempt_count.store(count, Ordering::Relaxed);
    }
}

/// A spinlock for data shared between vCPUs. Locking disables preemption for
/// as long as the guard lives.
pub struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialized by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// An unlocked lock holding `value`.
    pub const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// Take the lock (with preemption disabled).
    pub fn lock(&self) -> SpinGuard<'_, T> {
        preempt_disable();
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        SpinGuard { lock: self }
    }
}

/// Holds a [`SpinLock`].
pub struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard holds the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
        preempt_enable();
    }
}
