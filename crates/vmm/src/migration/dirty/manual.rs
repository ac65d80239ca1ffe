//! The `manual` tracker: `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` with
//! `INITIALLY_SET`. `KVM_GET_DIRTY_LOG` then only reads the bitmap, and the
//! monitor re-protects what it chooses with `KVM_CLEAR_DIRTY_LOG`, here one
//! call per run of dirty 64-page words: the cost of a harvest follows the
//! dirty pages, not the guest's size (the bitmap read itself is 1 bit per
//! page). kvm-ioctls lacks `KVM_CLEAR_DIRTY_LOG`; `clear` wraps it.

use std::sync::Arc;

use kvm_bindings::{
    kvm_clear_dirty_log, kvm_enable_cap, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
    KVM_DIRTY_LOG_INITIALLY_SET, KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE,
};
use kvm_ioctls::VmFd;
use vmm_sys_util::ioctl::ioctl_with_ref;

use super::{bits_to_gpas, logging_off, set_logging, slots, DirtyError, DirtyTracker, Slot};
use crate::memory::GuestRam;

mod ioctls {
    #![allow(missing_docs)]
    use kvm_bindings::{kvm_clear_dirty_log, KVMIO};
    use vmm_sys_util::ioctl_iowr_nr;
    ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, KVMIO, 0xc0, kvm_clear_dirty_log);
}

fn err(tracker: &'static str, what: &'static str) -> impl Fn(kvm_ioctls::Error) -> DirtyError {
    move |source| DirtyError {
        tracker,
        what,
        source,
    }
}

/// Re-protect the pages of `slot` from `first_page` whose bits are set in
/// `bitmap` (one bit per page; `first_page` a multiple of 64).
pub fn clear(
    vm: &VmFd,
    slot: u32,
    first_page: u64,
    bitmap: &[u64],
    pages: u32,
) -> Result<(), kvm_ioctls::Error> {
    let mut c = kvm_clear_dirty_log {
        slot,
        num_pages: pages,
        first_page,
        ..Default::default()
    };
    c.__bindgen_anon_1.dirty_bitmap = bitmap.as_ptr() as *mut libc::c_void;
    // SAFETY: the bitmap holds at least `pages` bits and lives across the
    // call; KVM only reads it. The result is checked.
    let rc = unsafe { ioctl_with_ref(vm, ioctls::KVM_CLEAR_DIRTY_LOG(), &c) };
    if rc < 0 {
        return Err(kvm_ioctls::Error::last());
    }
    Ok(())
}

/// Manual-protect logging on a VM's memslots, shared by `manual` and `hybrid`.
pub(super) struct ManualLog {
    pub(super) vm: Arc<VmFd>,
    pub(super) slots: Vec<Slot>,
    on: bool,
    name: &'static str,
}

impl ManualLog {
    pub(super) fn new(vm: Arc<VmFd>, ram: &GuestRam, name: &'static str) -> Self {
        ManualLog {
            vm,
            slots: slots(ram),
            on: false,
            name,
        }
    }

    fn set_cap(&self, flags: u32) -> Result<(), DirtyError> {
        let mut cap = kvm_enable_cap {
            cap: KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
            ..Default::default()
        };
        cap.args[0] = flags as u64;
        self.vm
            .enable_cap(&cap)
            .map_err(err(self.name, "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2"))
    }

    /// Turn logging on and protect every page (INITIALLY_SET starts with
    /// every bit set and nothing protected).
    pub(super) fn start(&mut self) -> Result<(), DirtyError> {
        self.set_cap(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET)?;
        self.on = true;
        for s in &self.slots {
            set_logging(&self.vm, s, true)
                .map_err(err(self.name, "enable logging on a memslot"))?;
            let pages = s.len / 4096;
            let all = vec![u64::MAX; pages.div_ceil(64) as usize];
            clear(&self.vm, s.index, 0, &all, pages as u32)
                .map_err(err(self.name, "KVM_CLEAR_DIRTY_LOG"))?;
        }
        Ok(())
    }

    /// Each slot's bitmap (nothing is cleared).
    pub(super) fn read(&self) -> Result<Vec<Vec<u64>>, DirtyError> {
        self.slots
            .iter()
            .map(|s| {
                self.vm
                    .get_dirty_log(s.index, s.len as usize)
                    .map_err(err(self.name, "KVM_GET_DIRTY_LOG"))
            })
            .collect()
    }

    /// Re-protect the words `[from, to)` of slot `k`'s bitmap `bits`.
    pub(super) fn clear_words(
        &self,
        k: usize,
        bits: &[u64],
        from: usize,
        to: usize,
    ) -> Result<(), DirtyError> {
        let s = &self.slots[k];
        let total = s.len / 4096;
        let first = from as u64 * 64;
        let pages = ((to - from) as u64 * 64).min(total - first) as u32;
        clear(&self.vm, s.index, first, &bits[from..to], pages)
            .map_err(err(self.name, "KVM_CLEAR_DIRTY_LOG"))
    }

    pub(super) fn stop(&mut self) {
        if std::mem::take(&mut self.on) {
            logging_off(&self.vm, &self.slots);
            // Back to KVM's default, so that a later bitmap tracker works.
            if let Err(e) = self.set_cap(0) {
                tracing::warn!("{e}");
            }
        }
    }
}

impl Drop for ManualLog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs of consecutive non-zero words in `bits`: `[from, to)`.
pub(super) fn dirty_runs(bits: &[u64]) -> Vec<(usize, usize)> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, &w) in bits.iter().enumerate() {
        match (w != 0, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push((s, bits.len()));
    }
    runs
}

/// See the module documentation.
pub struct ManualTracker {
    log: ManualLog,
}

impl ManualTracker {
    /// A tracker for `vm`'s RAM.
    pub fn new(vm: Arc<VmFd>, ram: &GuestRam) -> Self {
        ManualTracker {
            log: ManualLog::new(vm, ram, "manual"),
        }
    }
}

impl DirtyTracker for ManualTracker {
    fn name(&self) -> &'static str {
        "manual"
    }

    fn start(&mut self) -> Result<(), DirtyError> {
        self.log.start()
    }

    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError> {
        let mut out = Vec::new();
        for (k, bits) in self.log.read()?.into_iter().enumerate() {
            for (from, to) in dirty_runs(&bits) {
                self.log.clear_words(k, &bits, from, to)?;
            }
            bits_to_gpas(&bits, self.log.slots[k].gpa, &mut out);
        }
        Ok(out)
    }

    fn stop(&mut self) {
        self.log.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_dirty_words() {
        assert_eq!(dirty_runs(&[0, 1, 2, 0, 0, 5]), vec![(1, 3), (5, 6)]);
        assert_eq!(dirty_runs(&[0, 0]), vec![]);
        assert_eq!(dirty_runs(&[7]), vec![(0, 1)]);
    }
}
