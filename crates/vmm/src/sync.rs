//! Locks that outlive a panic: the one policy for a poisoned lock.
//!
//! A thread of this VMM that panics while holding a lock (a bug) poisons
//! it. Every critical section here is a handful of field writes or a
//! device register access, so the data behind a poisoned lock is still a
//! value the code wrote, never one half-built; and the thread that
//! panicked has already reported itself (the panic hook, or its join). So
//! the VMM takes the lock as if nothing happened: a second panic in every
//! thread that touches the same device, monitor or report would turn one
//! bug into a crashed VM, and a user would lose the guest for a failure
//! the guest could have outlived. Use these instead of `.lock().unwrap()`
//! and its kin everywhere in the monitor.

use std::sync::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// A mutex taken whatever a panicking holder left (see the module).
pub trait Locked<T: ?Sized> {
    /// The guard, poisoned or not.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Locked<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A read-write lock taken whatever a panicking holder left.
pub trait ReadWrite<T: ?Sized> {
    /// A read guard, poisoned or not.
    fn read_now(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard, poisoned or not.
    fn write_now(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> ReadWrite<T> for RwLock<T> {
    fn read_now(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|p| p.into_inner())
    }
    fn write_now(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Wait on `cv` with `guard` (a poisoned lock as [`Locked`] takes it).
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// Wait on `cv` with `guard` for at most `timeout`: the guard back, and
/// whether the wait timed out (a poisoned lock as [`Locked`] takes it).
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> (MutexGuard<'a, T>, bool) {
    let (g, t) = cv
        .wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner());
    (g, t.timed_out())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_poisoned_by_a_panic_is_taken_with_what_was_written() {
        let m = Arc::new(Mutex::new(1));
        let rw = Arc::new(RwLock::new(1));
        let (m2, rw2) = (m.clone(), rw.clone());
        let _ = std::thread::spawn(move || {
            let mut g = m2.lock().unwrap();
            let mut w = rw2.write().unwrap();
            *g = 2;
            *w = 2;
            panic!("a bug while holding both");
        })
        .join();
        assert!(m.is_poisoned() && rw.is_poisoned());
        assert_eq!(*m.locked(), 2);
        assert_eq!(*rw.read_now(), 2);
        *rw.write_now() = 3;
        assert_eq!(*rw.read_now(), 3);
        let cv = Condvar::new();
        let (g, timed_out) = wait_timeout(&cv, m.locked(), Duration::from_millis(1));
        assert!(timed_out);
        assert_eq!(*g, 2);
    }
}
