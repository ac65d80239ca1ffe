//! Which guest pages changed since the last look: the dirty trackers the
//! pre-copy engine drives, behind one trait (`bitmap`: KVM_GET_DIRTY_LOG;
//! `manual`: manual re-protection with KVM_CLEAR_DIRTY_LOG; `hybrid`:
//! sections that stay hot are left unprotected, seed 4), and the record of
//! the monitor's own writes to guest memory (KVM logs only the guest's).

mod bitmap;
mod hybrid;
mod manual;
pub mod ring;

pub use bitmap::BitmapTracker;
pub use hybrid::{HotSections, HybridTracker, SECTION_PAGES};
pub use manual::ManualTracker;
pub use ring::{RingSet, RingTracker};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hover_abi::layout::PAGE_SIZE;
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

/// Append the addresses of the set bits of `bitmap` (one bit per page from `base`).
pub fn bits_to_gpas(bitmap: &[u64], base: u64, out: &mut Vec<u64>) {
    for (w, &word) in bitmap.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let b = bits.trailing_zeros() as u64;
            out.push(base + (w as u64 * 64 + b) * PAGE_SIZE);
            bits &= bits - 1;
        }
    }
}

/// Pages the monitor itself wrote into guest memory (control request
/// status, I/O completions) while recording is on: KVM's dirty log sees
/// only the guest's writes, and a status the destination never got would
/// leave the guest waiting forever.
#[derive(Default)]
pub struct HostWrites {
    on: AtomicBool,
    bits: Vec<AtomicU64>,
}

impl HostWrites {
    /// A record for guest RAM ending at guest-physical `end`.
    pub fn new(end: u64) -> Self {
        HostWrites {
            on: AtomicBool::new(false),
            bits: (0..(end / PAGE_SIZE).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// Note a write of `len` bytes at `gpa` (cheap when recording is off).
    pub fn mark(&self, gpa: u64, len: u64) {
        if !self.on.load(Ordering::Acquire) || len == 0 {
            return;
        }
        for page in gpa / PAGE_SIZE..=gpa.saturating_add(len - 1) / PAGE_SIZE {
            if let Some(w) = self.bits.get((page / 64) as usize) {
                w.fetch_or(1 << (page % 64), Ordering::AcqRel);
            }
        }
    }

    /// Start or stop recording (stopping forgets what was recorded).
    pub fn record(&self, on: bool) {
        self.on.store(on, Ordering::Release);
        if !on {
            for w in &self.bits {
                w.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Take the pages written since the last call, as addresses, ascending.
    pub fn take(&self) -> Vec<u64> {
        let words: Vec<u64> = self
            .bits
            .iter()
            .map(|w| w.swap(0, Ordering::AcqRel))
            .collect();
        let mut out = Vec::new();
        bits_to_gpas(&words, 0, &mut out);
        out
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
    fn bitmaps_become_addresses() {
        let mut out = Vec::new();
        bits_to_gpas(&[0b1011, 1 << 63], 0x10_0000, &mut out);
        assert_eq!(
            out,
            vec![0x10_0000, 0x10_1000, 0x10_3000, 0x10_0000 + 127 * 4096]
        );
    }

    #[test]
    fn host_writes_are_recorded_only_while_on() {
        let h = HostWrites::new(1 << 20);
        h.mark(0x2000, 8);
        assert!(h.take().is_empty());
        h.record(true);
        h.mark(0x2ffc, 8); // straddles two pages
        h.mark(0x8_0000, 1);
        h.mark(u64::MAX - 8, 8); // outside RAM: ignored, no panic
        assert_eq!(h.take(), vec![0x2000, 0x3000, 0x8_0000]);
        assert!(h.take().is_empty(), "taking clears");
        h.mark(0x5000, 1);
        h.record(false);
        assert!(h.take().is_empty());
    }

    #[test]
    fn merging_keeps_order_and_drops_duplicates() {
        assert_eq!(merge(vec![1, 3, 5], vec![2, 3, 6]), vec![1, 2, 3, 5, 6]);
        assert_eq!(merge(vec![], vec![4]), vec![4]);
        assert_eq!(merge(vec![4], vec![]), vec![4]);
    }
}
