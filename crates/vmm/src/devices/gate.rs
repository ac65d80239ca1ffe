//! A gate a device thread passes through for each piece of work, which the
//! VM closes to pause the device: closing waits until the work in progress
//! is done, and no new work starts until the gate opens again. A paused VM
//! is thus frozen whole: its vCPUs stopped and no device changes guest
//! memory or raises an interrupt, so its state can be saved consistently.

use crate::sync::Locked;
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    closed: bool,
    inside: u32,
}

/// See the module documentation.
#[derive(Default)]
pub struct Gate {
    state: Mutex<State>,
    changed: Condvar,
}

/// Proof of being inside the gate; leaving is dropping it.
pub struct Pass<'a>(&'a Gate);

impl Gate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Wait until the gate is open, then go in.
    pub fn enter(&self) -> Pass<'_> {
        let mut s = self.lock();
        while s.closed {
            s = crate::sync::wait(&self.changed, s);
        }
        s.inside += 1;
        Pass(self)
    }

    /// Go in if the gate is open now, without waiting.
    pub fn try_enter(&self) -> Option<Pass<'_>> {
        let mut s = self.lock();
        if s.closed {
            return None;
        }
        s.inside += 1;
        Some(Pass(self))
    }

    /// Close the gate and wait until nobody is inside.
    pub fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        while s.inside > 0 {
            s = crate::sync::wait(&self.changed, s);
        }
    }

    /// Open the gate.
    pub fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// Whether the gate is closed.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.lock().inside -= 1;
        self.0.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn closing_waits_for_work_in_progress_and_blocks_new_work() {
        let gate = Arc::new(Gate::default());
        let pass = gate.enter();
        let closed = Arc::new(AtomicBool::new(false));
        let (g, c) = (gate.clone(), closed.clone());
        let closer = std::thread::spawn(move || {
            g.close();
            c.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !closed.load(Ordering::SeqCst),
            "close returned with work inside"
        );
        drop(pass);
        closer.join().unwrap();
        assert!(gate.is_closed());
        let entered = Arc::new(AtomicBool::new(false));
        let (g, e) = (gate.clone(), entered.clone());
        let worker = std::thread::spawn(move || {
            let _p = g.enter();
            e.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!entered.load(Ordering::SeqCst), "entered a closed gate");
        gate.open();
        worker.join().unwrap();
        assert!(entered.load(Ordering::SeqCst));
    }
}
