//! Which guest pages changed since the last look: the dirty trackers the
//! pre-copy engine drives, behind one trait (`bitmap`: KVM_GET_DIRTY_LOG;
//! `manual`: manual re-protection with KVM_CLEAR_DIRTY_LOG; `hybrid`:
//! sections that stay hot are left unprotected, seed 4; `ring`: the
//! per-vCPU dirty rings of a VM started with `--dirty-ring`), which one a
//! VM gets and tracking asked for on its own (`choice`). The record of
//! the monitor's own writes to guest memory (KVM logs only the guest's) is
//! `memory::host_writes`, where the monitor's writer keeps it.

mod bitmap;
mod choice;
mod hybrid;
mod manual;
pub mod ring;

pub use bitmap::BitmapTracker;
pub use choice::{tracker, ChoiceError, DirtyLogReport, DirtyLogRequest, MAX_DIRTY_LOG};
pub use hybrid::{HotSections, HybridTracker, SECTION_PAGES};
pub use manual::ManualTracker;
pub use ring::{RingSet, RingTracker};

use crate::memory::host_writes::bits_to_gpas;

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::memory::GuestRam;

/// Why dirty tracking failed.
#[derive(Debug, thiserror::Error)]
#[error("dirty tracking ({tracker}): {what}: {source}")]
pub struct DirtyError {
    /// The tracker.
    pub tracker: &'static str,
    /// What failed.
    pub what: &'static str,
    /// KVM's error.
    pub source: kvm_ioctls::Error,
}

/// Tracks the pages the guest writes.
pub trait DirtyTracker: Send {
    /// The tracker's name (`bitmap`, ...).
    fn name(&self) -> &'static str;
    /// Start tracking: writes from now on are reported by [`Self::harvest`].
    fn start(&mut self) -> Result<(), DirtyError>;
    /// The guest-physical addresses of the pages written since the last
    /// harvest (or since start), ascending; tracking goes on.
    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError>;
    /// Everything still to send for the final round (the VM is paused):
    /// what [`Self::harvest`] gives, plus pages a tracker held back.
    fn harvest_final(&mut self) -> Result<Vec<u64>, DirtyError> {
        self.harvest()
    }
    /// Pages held back for the final round (counted in the downtime).
    fn deferred_pages(&self) -> u64 {
        0
    }
    /// How many pages the tracker may hold back for the final round.
    fn set_deferral_budget(&mut self, _pages: u64) {}
    /// Pages each vCPU dirtied since the last call, if the tracker can
    /// tell (rings can; bitmaps cannot say who wrote).
    fn vcpu_dirty_pages(&mut self) -> Option<Vec<u64>> {
        None
    }
    /// Stop tracking (also after a failed migration: the guest runs on
    /// without write faults).
    fn stop(&mut self);
}

/// One memslot as the trackers see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    pub(crate) index: u32,
    pub(crate) gpa: u64,
    pub(crate) len: u64,
    pub(crate) host: u64,
}

pub(crate) fn slots(ram: &GuestRam) -> Vec<Slot> {
    ram.memory()
        .iter()
        .enumerate()
        .map(|(i, r)| Slot {
            index: i as u32,
            gpa: r.start_addr().0,
            len: r.len(),
            host: r
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map(|p| p as u64)
                .unwrap_or(0),
        })
        .collect()
}

pub(crate) fn set_logging(vm: &VmFd, s: &Slot, on: bool) -> Result<(), kvm_ioctls::Error> {
    let r = kvm_userspace_memory_region {
        slot: s.index,
        guest_phys_addr: s.gpa,
        memory_size: s.len,
        userspace_addr: s.host,
        flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
    };
    // SAFETY: the same slot, address and mapping as registered at build
    // time (the Vm owns the mapping); only the logging flag changes.
    unsafe { vm.set_user_memory_region(r) }
}

/// Turn logging on for every slot (a tracker's start).
pub(crate) fn logging_on(
    vm: &VmFd,
    slots: &[Slot],
    tracker: &'static str,
) -> Result<(), DirtyError> {
    for s in slots {
        set_logging(vm, s, true).map_err(|source| DirtyError {
            tracker,
            what: "enable logging on a memslot",
            source,
        })?;
    }
    Ok(())
}

/// Turn logging off for every slot (a tracker's stop: failures are logged,
/// the guest runs on).
pub(crate) fn logging_off(vm: &VmFd, slots: &[Slot]) {
    for s in slots {
        if let Err(e) = set_logging(vm, s, false) {
            tracing::warn!("cannot turn dirty logging off on slot {}: {e}", s.index);
        }
    }
}

/// Merge two ascending address lists into one, without duplicates.
pub fn merge(a: Vec<u64>, b: Vec<u64>) -> Vec<u64> {
    if b.is_empty() {
        return a;
    }
    let mut out = Vec::with_capacity(a.len() + b.len());
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let next = match (a.get(i), b.get(j)) {
            (Some(&x), Some(&y)) if x == y => {
                i += 1;
                j += 1;
                x
            }
            (Some(&x), Some(&y)) if x < y => {
                i += 1;
                x
            }
            (_, Some(&y)) => {
                j += 1;
                y
            }
            (Some(&x), None) => {
                i += 1;
                x
            }
            (None, None) => unreachable!(),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_order_and_drops_duplicates() {
        assert_eq!(merge(vec![1, 3, 5], vec![2, 3, 6]), vec![1, 2, 3, 5, 6]);
        assert_eq!(merge(vec![], vec![4]), vec![4]);
        assert_eq!(merge(vec![4], vec![]), vec![4]);
    }
}
