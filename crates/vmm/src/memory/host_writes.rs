//! The monitor's own writes into guest memory. KVM's dirty log sees only
//! the guest's writes, so a page the monitor wrote (a control request's
//! status, an I/O completion, a boost or halt-poll area) would never be
//! sent by a migration unless recorded: [`GuestWriter`] is how the monitor
//! writes guest memory, and it records every write in [`HostWrites`] by
//! itself, so no write can go unrecorded. The virtio devices write through
//! vm-memory and virtio-queue instead (used rings, received frames, disk
//! reads): they get [`DeviceMemory`], a view of the same mapping whose
//! regions carry vm-memory's dirty bitmap, which every write through it
//! sets; [`HostWrites::take`] drains it with the rest.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use hover_abi::layout::PAGE_SIZE;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{
    AtomicAccess, ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryError,
    GuestMemoryMmap, GuestMemoryRegion, GuestRegionMmap, MmapRegion,
};

/// Guest memory as the virtio devices use it: every write through it sets
/// its region's dirty bitmap.
pub type TrackedMemory = GuestMemoryMmap<AtomicBitmap>;

/// [`TrackedMemory`] over a VM's guest RAM, with the mapping it views.
#[derive(Clone)]
pub struct DeviceMemory {
    view: TrackedMemory,
    /// The mapping the view points into: unmapped only when the last view
    /// is gone too.
    _mapping: GuestMemoryMmap,
}

impl DeviceMemory {
    /// A tracked view of `mapping`'s regions (the same host pages).
    pub fn new(mapping: &GuestMemoryMmap) -> io::Result<Self> {
        let regions = mapping
            .iter()
            .map(|r| {
                let host = r.as_ptr();
                // SAFETY: `host` is the start of a live mapping of
                // `r.len()` bytes, and `_mapping` keeps it mapped as long
                // as this view exists; the view does not own (or unmap) it.
                let region = unsafe {
                    MmapRegion::<AtomicBitmap>::build_raw(
                        host,
                        r.len() as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                    )
                }
                .map_err(io::Error::other)?;
                GuestRegionMmap::new(region, r.start_addr())
                    .ok_or_else(|| io::Error::other("a guest region past the address space"))
            })
            .collect::<io::Result<Vec<_>>>()?;
        let view = GuestMemoryMmap::from_regions(regions).map_err(io::Error::other)?;
        Ok(DeviceMemory {
            view,
            _mapping: mapping.clone(),
        })
    }

    /// The view, to hand to devices.
    pub fn view(&self) -> &TrackedMemory {
        &self.view
    }

    /// Append the pages written through the view since the last call (or
    /// [`Self::clear`]) to `out`, and forget them.
    fn drain(&self, out: &mut Vec<u64>) {
        for r in self.view.iter() {
            let region: &MmapRegion<AtomicBitmap> = r;
            let words = region.bitmap().get_and_reset();
            bits_to_gpas(&words, r.start_addr().0, out);
        }
    }

    /// Forget every write so far.
    fn clear(&self) {
        for r in self.view.iter() {
            let region: &MmapRegion<AtomicBitmap> = r;
            region.bitmap().reset();
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
/// status, I/O completions, virtio devices' writes) while recording is on:
/// KVM's dirty log sees only the guest's writes, and a status the
/// destination never got would leave the guest waiting forever.
#[derive(Default)]
pub struct HostWrites {
    on: AtomicBool,
    bits: Vec<AtomicU64>,
    /// The virtio devices' view, whose own bitmaps are drained with ours.
    devices: Option<DeviceMemory>,
}

impl HostWrites {
    /// A record for guest RAM ending at guest-physical `end`.
    pub fn new(end: u64) -> Self {
        HostWrites {
            on: AtomicBool::new(false),
            bits: (0..(end / PAGE_SIZE).div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            devices: None,
        }
    }

    /// A record for guest RAM ending at `end` that also takes every write
    /// made through `devices`.
    pub fn with_devices(end: u64, devices: DeviceMemory) -> Self {
        HostWrites {
            devices: Some(devices),
            ..HostWrites::new(end)
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
        // The device view's bitmap is always set: what it holds from
        // before recording began is forgotten as ours is.
        if let Some(d) = &self.devices {
            d.clear();
        }
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
        if let Some(d) = &self.devices {
            let mut theirs = Vec::new();
            d.drain(&mut theirs);
            if !theirs.is_empty() {
                out.extend(theirs);
                out.sort_unstable();
                out.dedup();
            }
        }
        out
    }
}

/// Guest memory as the monitor writes it: each write is recorded in the
/// VM's [`HostWrites`] (reads go through [`GuestWriter::memory`]).
#[derive(Clone)]
pub struct GuestWriter {
    memory: GuestMemoryMmap,
    writes: Arc<HostWrites>,
}

impl GuestWriter {
    /// Writes into `memory`, recorded in `writes`.
    pub fn new(memory: GuestMemoryMmap, writes: Arc<HostWrites>) -> Self {
        GuestWriter { memory, writes }
    }

    /// Writes recorded nowhere (a device outside any VM: tests, tools).
    pub fn unrecorded(memory: GuestMemoryMmap) -> Self {
        GuestWriter::new(memory, Arc::default())
    }

    /// The memory, to read.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// Write `value` at `gpa`.
    pub fn write_obj<T: ByteValued>(&self, value: T, gpa: u64) -> Result<(), GuestMemoryError> {
        self.memory.write_obj(value, GuestAddress(gpa))?;
        self.writes.mark(gpa, std::mem::size_of::<T>() as u64);
        Ok(())
    }

    /// Store `value` at `gpa` atomically with `order` (a word the guest
    /// reads without locks).
    pub fn store<T: AtomicAccess>(
        &self,
        value: T,
        gpa: u64,
        order: Ordering,
    ) -> Result<(), GuestMemoryError> {
        self.memory.store(value, GuestAddress(gpa), order)?;
        self.writes.mark(gpa, std::mem::size_of::<T>() as u64);
        Ok(())
    }
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
    fn every_write_through_the_writer_is_recorded() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let writes = Arc::new(HostWrites::new(1 << 20));
        let w = GuestWriter::new(mem.clone(), writes.clone());
        w.write_obj(7u32, 0x1000).unwrap();
        assert!(writes.take().is_empty(), "not while recording is off");
        writes.record(true);
        w.write_obj(7u64, 0x2ffc).unwrap(); // straddles two pages
        w.store(9u32, 0x9000, Ordering::Release).unwrap();
        assert!(w.write_obj(1u64, 2 << 20).is_err(), "outside guest memory");
        assert_eq!(writes.take(), vec![0x2000, 0x3000, 0x9000]);
        assert_eq!(mem.read_obj::<u32>(GuestAddress(0x9000)).unwrap(), 9);
    }

    #[test]
    fn writes_through_the_device_view_are_recorded_and_land_in_guest_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 1 << 20),
            (GuestAddress(4 << 20), 1 << 20),
        ])
        .unwrap();
        let dm = DeviceMemory::new(&mem).unwrap();
        let writes = HostWrites::with_devices(5 << 20, dm.clone());
        dm.view().write_obj(1u32, GuestAddress(0x3000)).unwrap();
        writes.record(true);
        assert!(
            writes.take().is_empty(),
            "writes before recording are forgotten"
        );
        // A used ring's index (an atomic store), a frame or disk read
        // straddling two pages in the second region, a monitor write.
        dm.view()
            .store(5u16, GuestAddress(0x7002), Ordering::Release)
            .unwrap();
        dm.view()
            .write_slice(&[0xab; 100], GuestAddress((4 << 20) + 0x1fd0))
            .unwrap();
        writes.mark(0x7000, 8);
        let mut file: &[u8] = &[0xcd; 64];
        dm.view()
            .read_exact_volatile_from(GuestAddress(0x9000), &mut file, 64)
            .unwrap();
        assert_eq!(
            writes.take(),
            vec![0x7000, 0x9000, (4 << 20) + 0x1000, (4 << 20) + 0x2000]
        );
        assert!(writes.take().is_empty(), "taking clears");
        assert_eq!(mem.read_obj::<u16>(GuestAddress(0x7002)).unwrap(), 5);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x9000 + 63)).unwrap(), 0xcd);
        assert_eq!(
            mem.read_obj::<u8>(GuestAddress((4 << 20) + 0x2000))
                .unwrap(),
            0xab
        );
        drop(mem);
        dm.view().write_obj(2u8, GuestAddress(0)).unwrap(); // the view keeps it mapped
        writes.record(false);
        assert!(writes.take().is_empty());
    }
}
