//! The `bitmap` tracker.

use std::sync::Arc;

use kvm_ioctls::VmFd;

use super::{bits_to_gpas, logging_off, logging_on, slots, DirtyError, DirtyTracker, Slot};
use crate::memory::GuestRam;

/// `KVM_GET_DIRTY_LOG`: KVM returns and clears each slot's bitmap and
/// write-protects the pages again, in one call per slot. Its cost grows
/// with guest memory (the whole bitmap is copied every round).
pub struct BitmapTracker {
    vm: Arc<VmFd>,
    slots: Vec<Slot>,
    on: bool,
}

impl BitmapTracker {
    /// A tracker for `vm`'s RAM.
    pub fn new(vm: Arc<VmFd>, ram: &GuestRam) -> Self {
        BitmapTracker {
            vm,
            slots: slots(ram),
            on: false,
        }
    }
}

impl DirtyTracker for BitmapTracker {
    fn name(&self) -> &'static str {
        "bitmap"
    }

    fn start(&mut self) -> Result<(), DirtyError> {
        // On before the slots are: a start that fails part-way is still
        // turned off by `stop` (or the drop).
        self.on = true;
        logging_on(&self.vm, &self.slots, "bitmap")
    }

    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError> {
        let mut out = Vec::new();
        for s in &self.slots {
            let bitmap = self
                .vm
                .get_dirty_log(s.index, s.len as usize)
                .map_err(|source| DirtyError {
                    tracker: "bitmap",
                    what: "KVM_GET_DIRTY_LOG",
                    source,
                })?;
            bits_to_gpas(&bitmap, s.gpa, &mut out);
        }
        Ok(out)
    }

    fn stop(&mut self) {
        if std::mem::take(&mut self.on) {
            logging_off(&self.vm, &self.slots);
        }
    }
}

impl Drop for BitmapTracker {
    fn drop(&mut self) {
        self.stop();
    }
}
