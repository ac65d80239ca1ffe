//! A place for a VM's [`Routes`] in a server that outlives the VM (the
//! Firecracker API's, which listens before any VM exists): the VM's run
//! fills it as its vCPUs start and empties it when the run ends.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::Routes;

#[derive(Default)]
enum State {
    /// No run has filled it yet.
    #[default]
    Empty,
    /// A run's routes.
    Filled(Arc<Routes>),
    /// The run has ended (or never started).
    Closed,
}

/// Shared between the server and the VM's run; cheap to clone.
#[derive(Clone, Default)]
pub struct ApiSlot(Arc<(Mutex<State>, Condvar)>);

/// What [`ApiSlot::wait`] found.
pub enum Waited {
    /// The VM runs: its routes.
    Running(Arc<Routes>),
    /// The run ended, or the VM never ran.
    Closed,
    /// Neither within the time given.
    TimedOut,
}

impl ApiSlot {
    /// The routes of the VM running now, if one is.
    pub fn routes(&self) -> Option<Arc<Routes>> {
        match &*self.0 .0.lock().unwrap_or_else(|p| p.into_inner()) {
            State::Filled(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Wait up to `timeout` until a run fills the slot or it is closed.
    pub fn wait(&self, timeout: Duration) -> Waited {
        let (lock, cv) = &*self.0;
        let until = Instant::now() + timeout;
        let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*s {
                State::Filled(r) => return Waited::Running(r.clone()),
                State::Closed => return Waited::Closed,
                State::Empty => {}
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Waited::TimedOut;
            }
            s = cv
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Put a run's routes in; the guard closes the slot when dropped.
    pub(crate) fn fill(&self, routes: Routes) -> SlotFill {
        self.set(State::Filled(Arc::new(routes)));
        SlotFill(self.clone())
    }

    /// Say that no run will fill it (the VM failed before it ran).
    pub fn close(&self) {
        self.set(State::Closed);
    }

    fn set(&self, state: State) {
        let (lock, cv) = &*self.0;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = state;
        cv.notify_all();
    }
}

/// A run's hold on an [`ApiSlot`].
pub(crate) struct SlotFill(ApiSlot);

impl Drop for SlotFill {
    fn drop(&mut self) {
        self.0.close();
    }
}
