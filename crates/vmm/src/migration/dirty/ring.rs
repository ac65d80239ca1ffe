//! The `ring` tracker: KVM's per-vCPU dirty rings (`KVM_CAP_DIRTY_LOG_RING`).
//!
//! KVM pushes the address of every page a vCPU dirties into that vCPU's
//! ring (shared memory); the monitor reads entries, marks them harvested and
//! calls `KVM_RESET_DIRTY_RINGS`, which re-protects those pages. A harvest
//! costs what was dirtied, whatever the guest's size. The rings must exist
//! before any vCPU does, so a VM tracks with rings only if it was started
//! with `--dirty-ring ENTRIES`; KVM then refuses the bitmap ioctls on it.
//! A ring that fills stops its vCPU (`KVM_EXIT_DIRTY_RING_FULL`); the vCPU
//! thread then harvests its own ring into an overflow list and resets it.
//! The same page may appear twice (KVM adds one duplicate per ring-full
//! exit); duplicates are merged.

use crate::sync::Locked;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kvm_bindings::{kvm_enable_cap, KVM_CAP_DIRTY_LOG_RING, KVM_DIRTY_LOG_PAGE_OFFSET};
use kvm_ioctls::{VcpuFd, VmFd};
use vmm_sys_util::ioctl::ioctl;

use super::{logging_off, logging_on, slots, DirtyError, DirtyTracker, Slot};
use crate::memory::GuestRam;
use hover_abi::layout::PAGE_SIZE;

mod ioctls {
    #![allow(missing_docs)]
    use kvm_bindings::KVMIO;
    use vmm_sys_util::ioctl_io_nr;
    ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, KVMIO, 0xc7);
}

/// `kvm_dirty_gfn.flags`: the entry holds a dirty page.
const DIRTY: u32 = 1;
/// `kvm_dirty_gfn.flags`: the monitor has harvested the entry.
const RESET: u32 = 2;
/// Smallest and largest ring accepted, entries.
pub const MIN_ENTRIES: u32 = 256;
/// See [`MIN_ENTRIES`].
pub const MAX_ENTRIES: u32 = 65536;

/// Why dirty rings could not be enabled.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// This KVM has none.
    #[error("this KVM has no dirty rings (KVM_CAP_DIRTY_LOG_RING)")]
    Unsupported,
    /// Rings larger than this KVM allows.
    #[error("{entries} entries is more than this KVM allows ({max} at most)")]
    TooLarge {
        /// Entries asked for.
        entries: u32,
        /// This KVM's most.
        max: i64,
    },
    /// KVM refused to enable them.
    #[error("KVM_CAP_DIRTY_LOG_RING: {0}")]
    Enable(kvm_ioctls::Error),
}

/// Enable dirty rings of `entries` entries on `vm` (before any vCPU).
pub fn enable(vm: &VmFd, entries: u32) -> Result<(), RingError> {
    let max = vm.check_extension_raw(KVM_CAP_DIRTY_LOG_RING as libc::c_ulong);
    let bytes = entries as u64 * 16;
    if max <= 0 {
        return Err(RingError::Unsupported);
    }
    if bytes > max as u64 {
        return Err(RingError::TooLarge {
            entries,
            max: (max / 16) as i64,
        });
    }
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_DIRTY_LOG_RING,
        ..Default::default()
    };
    cap.args[0] = bytes;
    vm.enable_cap(&cap).map_err(RingError::Enable)
}

/// One vCPU's ring, mapped from its fd.
struct Ring {
    base: *mut u8,
    entries: u32,
    /// Next entry to read; the lock also keeps two harvesters apart.
    fetch: Mutex<u32>,
}

// SAFETY: the mapping is shared memory owned by the RingSet for its whole
// life; entries are read and written with atomics under `fetch`'s lock.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    fn map(vcpu: &VcpuFd, entries: u32) -> std::io::Result<Ring> {
        use std::os::fd::AsRawFd;
        let len = entries as usize * 16;
        // SAFETY: mapping the vCPU's dirty ring as KVM documents (offset
        // KVM_DIRTY_LOG_PAGE_OFFSET pages, the size enabled); checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                vcpu.as_raw_fd(),
                KVM_DIRTY_LOG_PAGE_OFFSET as libc::off_t * PAGE_SIZE as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Ring {
            base: p.cast(),
            entries,
            fetch: Mutex::new(0),
        })
    }

    /// Take every dirty entry: (slot, page offset in the slot).
    fn harvest(&self, out: &mut Vec<(u32, u64)>) -> usize {
        let mut fetch = self.fetch.locked();
        let mut n = 0;
        loop {
            let at = (*fetch % self.entries) as usize * 16;
            // SAFETY: `at` is inside the mapping; `flags` is a naturally
            // aligned u32 KVM writes with release semantics.
            let flags = unsafe { &*(self.base.add(at) as *const AtomicU32) };
            if flags.load(Ordering::Acquire) & DIRTY == 0 {
                break;
            }
            // SAFETY: slot (u32 at +4) and offset (u64 at +8) of the entry.
            let (slot, offset) = unsafe {
                (
                    (self.base.add(at + 4) as *const u32).read_volatile(),
                    (self.base.add(at + 8) as *const u64).read_volatile(),
                )
            };
            out.push((slot, offset));
            flags.store(RESET, Ordering::Release);
            *fetch = fetch.wrapping_add(1);
            n += 1;
        }
        n
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; nothing reads it any more.
        unsafe { libc::munmap(self.base.cast(), self.entries as usize * 16) };
    }
}

/// Every vCPU's ring, and what vCPUs harvested themselves when full.
pub struct RingSet {
    vm: Arc<VmFd>,
    rings: Vec<Ring>,
    overflow: Mutex<Vec<(u32, u64)>>,
    full_exits: AtomicU64,
    /// Entries harvested from each vCPU's ring since the last look.
    per_vcpu: Vec<AtomicU64>,
}

impl RingSet {
    /// Map the rings of `vcpus` (`entries` each, as enabled).
    pub fn map(vm: Arc<VmFd>, vcpus: &[&VcpuFd], entries: u32) -> std::io::Result<RingSet> {
        Ok(RingSet {
            vm,
            rings: vcpus
                .iter()
                .map(|v| Ring::map(v, entries))
                .collect::<Result<_, _>>()?,
            overflow: Mutex::new(Vec::new()),
            full_exits: AtomicU64::new(0),
            per_vcpu: vcpus.iter().map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn reset(&self) -> Result<(), kvm_ioctls::Error> {
        // SAFETY: KVM_RESET_DIRTY_RINGS takes no argument; checked.
        let rc = unsafe { ioctl(self.vm.as_ref(), ioctls::KVM_RESET_DIRTY_RINGS()) };
        if rc < 0 {
            return Err(kvm_ioctls::Error::last());
        }
        Ok(())
    }

    /// vCPU `index`'s ring is full (`KVM_EXIT_DIRTY_RING_FULL`): harvest it
    /// into the overflow list and reset, so the vCPU can go on.
    pub fn on_full(&self, index: usize) {
        self.full_exits.fetch_add(1, Ordering::Relaxed);
        let mut got = Vec::new();
        if let Some(r) = self.rings.get(index) {
            let n = r.harvest(&mut got);
            self.per_vcpu[index].fetch_add(n as u64, Ordering::Relaxed);
        }
        self.overflow.locked().extend(got);
        if let Err(e) = self.reset() {
            tracing::warn!("KVM_RESET_DIRTY_RINGS after a full ring: {e}");
        }
    }

    /// Ring-full exits so far.
    pub fn full_exits(&self) -> u64 {
        self.full_exits.load(Ordering::Relaxed)
    }

    /// Pages each vCPU dirtied (ring entries, duplicates included) since
    /// the last call.
    pub fn take_vcpu_counts(&self) -> Vec<u64> {
        self.per_vcpu
            .iter()
            .map(|c| c.swap(0, Ordering::Relaxed))
            .collect()
    }

    /// Harvest every ring and the overflow, reset the rings.
    fn harvest_all(&self) -> Result<Vec<(u32, u64)>, kvm_ioctls::Error> {
        let mut out = std::mem::take(&mut *self.overflow.locked());
        for (r, count) in self.rings.iter().zip(&self.per_vcpu) {
            count.fetch_add(r.harvest(&mut out) as u64, Ordering::Relaxed);
        }
        self.reset()?;
        Ok(out)
    }
}

/// See the module documentation.
pub struct RingTracker {
    rings: Arc<RingSet>,
    vm: Arc<VmFd>,
    slots: Vec<Slot>,
    on: bool,
}

impl RingTracker {
    /// A tracker over `rings` for `vm`'s RAM.
    pub fn new(vm: Arc<VmFd>, ram: &GuestRam, rings: Arc<RingSet>) -> Self {
        RingTracker {
            rings,
            vm,
            slots: slots(ram),
            on: false,
        }
    }
}

impl DirtyTracker for RingTracker {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn start(&mut self) -> Result<(), DirtyError> {
        // Forget entries from before (none should be there: logging was off).
        let _ = self.rings.harvest_all();
        self.rings.take_vcpu_counts();
        // On before the slots are: a start that fails part-way is still
        // turned off by `stop` (or the drop).
        self.on = true;
        logging_on(&self.vm, &self.slots, "ring")
    }

    fn harvest(&mut self) -> Result<Vec<u64>, DirtyError> {
        let got = self.rings.harvest_all().map_err(|source| DirtyError {
            tracker: "ring",
            what: "KVM_RESET_DIRTY_RINGS",
            source,
        })?;
        let mut out: Vec<u64> = got
            .into_iter()
            .filter_map(|(slot, offset)| {
                let s = self.slots.iter().find(|s| s.index == slot & 0xffff)?;
                (offset * PAGE_SIZE < s.len).then(|| s.gpa + offset * PAGE_SIZE)
            })
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    fn vcpu_dirty_pages(&mut self) -> Option<Vec<u64>> {
        Some(self.rings.take_vcpu_counts())
    }

    fn stop(&mut self) {
        if std::mem::take(&mut self.on) {
            logging_off(&self.vm, &self.slots);
            let _ = self.rings.harvest_all();
        }
    }
}

impl Drop for RingTracker {
    fn drop(&mut self) {
        self.stop();
    }
}
