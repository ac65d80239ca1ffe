//! Guest RAM: its layout in guest-physical space and its backing (anonymous
//! memory by default, a memfd on request so another process can map it).

pub mod aio;
pub mod discard;
pub mod host_writes;
pub mod paged;
pub mod store;
pub mod uffd;

use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

use hover_abi::layout::{MMIO_HOLE_END, MMIO_HOLE_START, PAGE_SIZE};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::config::MemoryBackend;

/// Why guest RAM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// memfd_create or ftruncate failed.
    #[error("cannot create a {size}-byte memfd for guest RAM: {source}")]
    Memfd {
        /// Requested size.
        size: u64,
        /// The OS error.
        source: io::Error,
    },
    /// mmap failed (usually: not enough address space or memory).
    #[error("cannot map {size} bytes of guest RAM: {source}")]
    Map {
        /// Requested size.
        size: u64,
        /// vm-memory's error.
        source: vm_memory::mmap::FromRangesError,
    },
}

/// The guest-physical ranges `size` bytes of RAM occupy: below the MMIO hole,
/// then from 4 GiB on.
pub fn ram_ranges(size: u64) -> Vec<(u64, u64)> {
    if size <= MMIO_HOLE_START {
        vec![(0, size)]
    } else {
        vec![
            (0, MMIO_HOLE_START),
            (MMIO_HOLE_END, size - MMIO_HOLE_START),
        ]
    }
}

/// Guest RAM, mapped in this process.
pub struct GuestRam {
    memory: GuestMemoryMmap,
    backend: MemoryBackend,
    size: u64,
}

impl GuestRam {
    /// Map `size` bytes of RAM with `backend`. Nothing is touched yet, so the
    /// host commits pages only as the guest uses them.
    pub fn new(size: u64, backend: MemoryBackend) -> Result<Self, MemoryError> {
        let ranges = ram_ranges(size);
        let memory = match backend {
            MemoryBackend::Anonymous => {
                let r: Vec<(GuestAddress, usize)> = ranges
                    .iter()
                    .map(|&(b, s)| (GuestAddress(b), s as usize))
                    .collect();
                GuestMemoryMmap::from_ranges(&r)
            }
            MemoryBackend::Memfd => {
                let file = memfd(size).map_err(|source| MemoryError::Memfd { size, source })?;
                let file = std::sync::Arc::new(file);
                let mut offset = 0u64;
                let r: Vec<(GuestAddress, usize, Option<FileOffset>)> = ranges
                    .iter()
                    .map(|&(b, s)| {
                        let fo = FileOffset::from_arc(file.clone(), offset);
                        offset += s;
                        (GuestAddress(b), s as usize, Some(fo))
                    })
                    .collect();
                GuestMemoryMmap::from_ranges_with_files(r)
            }
        }
        .map_err(|source| MemoryError::Map { size, source })?;
        Ok(GuestRam {
            memory,
            backend,
            size,
        })
    }

    /// The vm-memory view of RAM.
    pub fn memory(&self) -> &GuestMemoryMmap {
        &self.memory
    }

    /// Total RAM in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// How RAM is backed.
    pub fn backend(&self) -> MemoryBackend {
        self.backend
    }

    /// One past the highest guest-physical RAM address.
    pub fn end(&self) -> u64 {
        ram_ranges(self.size)
            .last()
            .map(|&(b, s)| b + s)
            .unwrap_or(0)
    }

    /// Whether `[gpa, gpa + len)` lies inside one RAM range.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        ram_ranges(self.size)
            .iter()
            .any(|&(b, s)| gpa >= b && gpa.checked_add(len).is_some_and(|e| e <= b + s))
    }

    /// Bytes of guest RAM resident in this process (what the guest or the
    /// monitor has touched), counted with mincore(2).
    pub fn resident_bytes(&self) -> io::Result<u64> {
        let mut total = 0u64;
        for region in self.memory.iter() {
            let len = region.len() as usize;
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map_err(|e| io::Error::other(e.to_string()))?;
            let pages = len.div_ceil(PAGE_SIZE as usize);
            let mut vec = vec![0u8; pages];
            // SAFETY: host..host+len is this region's live mapping and vec has
            // one byte per page, as mincore requires.
            let rc = unsafe { libc::mincore(host.cast(), len, vec.as_mut_ptr()) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            total += vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * PAGE_SIZE;
        }
        Ok(total)
    }
}

/// A new memfd of `size` bytes (guest RAM; the snapshot fuzz target's file).
pub(crate) fn memfd(size: u64) -> io::Result<File> {
    // SAFETY: the name is a valid C string; the result is checked.
    let fd = unsafe { libc::memfd_create(c"hover-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor we own.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    #[test]
    fn ranges_skip_the_mmio_hole() {
        assert_eq!(ram_ranges(256 << 20), vec![(0, 256 << 20)]);
        assert_eq!(ram_ranges(4 << 30), vec![(0, 3 << 30), (4 << 30, 1 << 30)]);
    }

    #[test]
    fn both_backends_map_and_count_residency() {
        for backend in [MemoryBackend::Anonymous, MemoryBackend::Memfd] {
            let ram = GuestRam::new(16 << 20, backend).unwrap();
            assert_eq!(
                ram.resident_bytes().unwrap(),
                0,
                "{backend:?}: untouched RAM is not resident"
            );
            ram.memory()
                .write_obj(0xabu8, GuestAddress(0x5000))
                .unwrap();
            assert_eq!(ram.resident_bytes().unwrap(), PAGE_SIZE, "{backend:?}");
            assert!(ram.contains(0, 16 << 20));
            assert!(!ram.contains(1, 16 << 20));
            assert_eq!(ram.end(), 16 << 20);
        }
    }
}
