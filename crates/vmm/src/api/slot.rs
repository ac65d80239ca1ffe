//! A place for a VM's [`Routes`] in a server that outlives the VM (the
//! Firecracker API's, which listens before any VM exists): the VM's run
//! fills it once its vCPUs run and marks it ended when the run ends.

use crate::sync::Locked;
use std::sync::{Arc, Condvar, Mutex};

use super::Routes;

#[derive(Default)]
enum State {
    /// No run has filled it yet.
    #[default]
    Empty,
    /// A run's routes.
    Filled(Arc<Routes>),
    /// The run that filled it has ended: its routes, for a last look.
    Ended(Arc<Routes>),
    /// No run will fill it (the VM failed before its vCPUs ran).
    Closed,
}

/// Shared between the server and the VM's run; cheap to clone.
#[derive(Clone, Default)]
pub struct ApiSlot(Arc<(Mutex<State>, Condvar)>);

/// What [`ApiSlot::wait`] found.
pub enum Waited {
    /// The VM runs: its routes.
    Running(Arc<Routes>),
    /// The VM ran, and its run has ended.
    Ended,
    /// The VM never ran.
    Closed,
}

impl ApiSlot {
    /// The routes of the VM running now, if one is.
    pub fn routes(&self) -> Option<Arc<Routes>> {
        match &*self.0 .0.locked() {
            State::Filled(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Wait until a run fills the slot, or it is closed. A built VM's run
    /// does one or the other within its start-up (no timeout: a request
    /// answered before would say nothing true about the VM).
    pub fn wait(&self) -> Waited {
        let (lock, cv) = &*self.0;
        let mut s = lock.locked();
        loop {
            match &*s {
                State::Filled(r) => return Waited::Running(r.clone()),
                State::Ended(_) => return Waited::Ended,
                State::Closed => return Waited::Closed,
                State::Empty => {}
            }
            s = crate::sync::wait(cv, s);
        }
    }

    /// The routes of the last run, running or ended (its final figures).
    pub fn last_routes(&self) -> Option<Arc<Routes>> {
        match &*self.0 .0.locked() {
            State::Filled(r) | State::Ended(r) => Some(r.clone()),
            _ => None,
        }
    }

    /// Put a run's routes in; the guard closes the slot when dropped.
    pub(crate) fn fill(&self, routes: Routes) -> SlotFill {
        self.set(State::Filled(Arc::new(routes)));
        SlotFill(self.clone())
    }

    /// Say that no run will fill it (the VM failed before it ran); a slot
    /// a run filled keeps its routes.
    pub fn close(&self) {
        let (lock, cv) = &*self.0;
        let mut s = lock.locked();
        if matches!(*s, State::Empty) {
            *s = State::Closed;
        }
        cv.notify_all();
    }

    fn end(&self) {
        let (lock, cv) = &*self.0;
        let mut s = lock.locked();
        if let State::Filled(r) = &*s {
            *s = State::Ended(r.clone());
        }
        cv.notify_all();
    }

    fn set(&self, state: State) {
        let (lock, cv) = &*self.0;
        *lock.locked() = state;
        cv.notify_all();
    }
}

/// A run's hold on an [`ApiSlot`].
pub(crate) struct SlotFill(ApiSlot);

impl Drop for SlotFill {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A VM's API in an [`ApiSlot`] of a server that outlives it: filled once
/// the vCPUs run, marked ended when the run ends.
pub struct SlotApi {
    slot: ApiSlot,
    routes: Option<Routes>,
    fill: Option<SlotFill>,
}

impl SlotApi {
    /// Serve the VM's API in `slot` while it runs.
    pub fn new(slot: ApiSlot) -> Self {
        SlotApi {
            slot,
            routes: None,
            fill: None,
        }
    }
}

impl crate::vm::ApiHost for SlotApi {
    fn start(
        &mut self,
        sources: crate::vm::LiveSources,
        controller: crate::vm::Controller,
    ) -> Result<(), crate::Error> {
        self.routes = Some(Routes::new(sources, controller));
        Ok(())
    }

    fn publish(&mut self) -> Result<(), crate::Error> {
        if let Some(routes) = self.routes.take() {
            self.fill = Some(self.slot.fill(routes));
        }
        Ok(())
    }

    fn stop(&mut self) {
        // Dropping the fill marks the run ended; the routes stay for a
        // last look.
        self.fill = None;
    }
}
