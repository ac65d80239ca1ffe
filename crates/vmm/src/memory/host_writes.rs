//! The monitor's own writes into guest memory. KVM's dirty log sees only
//! the guest's writes, so a page the monitor wrote (a control request's
//! status, an I/O completion, a boost or halt-poll area) would never be
//! sent by a migration unless recorded: [`GuestWriter`] is how the monitor
//! writes guest memory, and it records every write in [`HostWrites`] by
//! itself, so no write can go unrecorded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use hover_abi::layout::PAGE_SIZE;
use vm_memory::{AtomicAccess, ByteValued, Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

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
}
