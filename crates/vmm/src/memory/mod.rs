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

use hover_abi::layout::{MMIO_HOLE_END, MMIO_HOLE_START};
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
    /// madvise(MADV_DONTDUMP) on the new mapping failed.
    #[error("cannot keep guest RAM out of core dumps (madvise): {0}")]
    Advise(io::Error),
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
        // Guest RAM stays out of a core dump of the monitor (the guest's
        // data is not the monitor's to spill, and it may be gigabytes).
        // The flag also keeps its mappings apart from the monitor's own,
        // which the kernel would otherwise merge with them: that is what
        // lets `resident_bytes` read them alone in /proc/self/smaps.
        for region in memory.iter() {
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .expect("a mapped region has its host address at offset 0");
            // SAFETY: advice on this region's own live mapping; it changes
            // no contents.
            let rc =
                unsafe { libc::madvise(host.cast(), region.len() as usize, libc::MADV_DONTDUMP) };
            if rc != 0 {
                return Err(MemoryError::Advise(io::Error::last_os_error()));
            }
        }
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
    /// monitor has touched): the `Rss` of the mappings that hold it, from
    /// /proc/self/smaps. Not mincore(2): it also counts pages only read,
    /// which map the kernel's one shared zero page and take no memory,
    /// and so a restored guest that read untouched memory showed more
    /// guest memory resident than the whole process.
    pub fn resident_bytes(&self) -> io::Result<u64> {
        let smaps = std::fs::read_to_string("/proc/self/smaps")?;
        let mut ranges = Vec::new();
        for region in self.memory.iter() {
            let host = region
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .map_err(|e| io::Error::other(e.to_string()))? as u64;
            ranges.push((host, host + region.len()));
        }
        Ok(rss_within(&smaps, &ranges))
    }
}

/// The `Rss` of the guest's mappings in `smaps` (the text of
/// /proc/PID/smaps): those that overlap one of `ranges` (host addresses,
/// end exclusive) and carry `dd` (MADV_DONTDUMP, set on guest RAM alone,
/// so no mapping of the monitor's own is merged into one of them); a
/// mapping split by userfaultfd registration counts in parts.
fn rss_within(smaps: &str, ranges: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    let (mut overlaps, mut rss) = (false, 0u64);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        let span = first.split_once('-').and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        });
        if let Some((start, end)) = span {
            overlaps = ranges.iter().any(|&(lo, hi)| start < hi && end > lo);
            rss = 0;
        } else if first == "Rss:" {
            rss = words
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
                << 10;
        } else if first == "VmFlags:" && overlaps && words.any(|f| f == "dd") {
            total += rss;
        }
    }
    total
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
    fn rss_is_summed_over_the_mappings_inside_the_ranges() {
        let smaps = "\
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
Size:               1024 kB
Rss:                 512 kB
VmFlags: rd wr mr mw me dd ac
7f0000100000-7f0000200000 rw-p 00000000 00:00 0
Rss:                 256 kB
VmFlags: rd wr mr mw me dd ac um uw
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
Rss:                 100 kB
VmFlags: rd wr mr mw me ac
7f0000300000-7f0000400000 r-xp 00000000 00:00 0 /usr/bin/hover
Rss:                1000 kB
VmFlags: rd ex mr mw me dd
";
        // The third overlaps the RAM but is the monitor's (no dd); the
        // fourth has dd but lies outside.
        let ram = [(0x7f00_0000_0000, 0x7f00_0030_0000)];
        assert_eq!(rss_within(smaps, &ram), (512 + 256) << 10);
        assert_eq!(rss_within(smaps, &[]), 0);
    }

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
            assert_eq!(
                ram.resident_bytes().unwrap(),
                hover_abi::layout::PAGE_SIZE,
                "{backend:?}"
            );
            // A page only read maps the shared zero page: no memory.
            let _: u8 = ram.memory().read_obj(GuestAddress(0x9000)).unwrap();
            if backend == MemoryBackend::Anonymous {
                assert_eq!(
                    ram.resident_bytes().unwrap(),
                    hover_abi::layout::PAGE_SIZE,
                    "a read page"
                );
            }
            assert!(ram.contains(0, 16 << 20));
            assert!(!ram.contains(1, 16 << 20));
            assert_eq!(ram.end(), 16 << 20);
        }
    }
}
