//! A one-waiter event: a task waits until another task, or an interrupt, signals.
//! Async page faults will park tasks on tokens with it; I/O waits on completions.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::kernel::sched;
use crate::kernel::sync::{preempt_disable, preempt_enable};

const NO_WAITER: usize = usize::MAX;

/// An event with at most one waiter at a time. A signal with no waiter is
/// remembered until the next wait consumes it.
pub struct Event {
    signaled: AtomicBool,
    waiter: AtomicUsize,
}

impl Event {
    /// A new, unsignaled event.
    pub const fn new() -> Self {
        Event {
            signaled: AtomicBool::new(false),
            waiter: AtomicUsize::new(NO_WAITER),
        }
    }

    /// Signal: wake the waiter, or let the next wait return at once.
    pub fn signal(&self) {
        self.signaled.store(true, Ordering::SeqCst);
        let w = self.waiter.swap(NO_WAITER, Ordering::SeqCst);
        if w != NO_WAITER {
            sched::wake(w);
        }
    }

    /// Block the calling task until the event is signaled, then consume the signal.
    pub fn wait(&self) {
        preempt_disable();
        loop {
            if self.signaled.swap(false, Ordering::SeqCst) {
                break;
            }
            let me = sched::current();
            sched::mark_blocked(me);
            self.waiter.store(me, Ordering::SeqCst);
            // A signal between the first check and publishing the waiter
            // would find no waiter: look again, and if it happened, take our
            // registration back unless the signaler already took it (then it
            // wakes us, and schedule() below returns promptly).
            if self.signaled.load(Ordering::SeqCst)
                && self
                    .waiter
                    .compare_exchange(me, NO_WAITER, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                sched::mark_running(me);
                continue;
            }
            sched::block();
        }
        preempt_enable();
    }
}
