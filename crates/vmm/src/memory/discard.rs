//! Giving guest pages back to the host: what a balloon's inflate and a
//! free-page report do with the pages the guest names. Each page leaves the
//! host's memory at once (`MADV_DONTNEED` on private memory, `MADV_REMOVE`
//! on a memfd, whose pages another mapping would otherwise keep), or
//! through the pager when it serves the page (then it also leaves the
//! budget and the page store). The next touch finds zeros. A migration
//! under way is told the page changed (the destination gets the zeros:
//! KVM's dirty log does not see a page the host dropped).

use crate::sync::ReadWrite;
use std::io;
use std::sync::{Arc, RwLock};

use hover_abi::layout::PAGE_SIZE;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::host_writes::HostWrites;
use super::paged::{Dropped, PagerDiscard};
use super::GuestRam;
use crate::config::MemoryBackend;

/// One RAM region as the discarder sees it.
struct Region {
    gpa: u64,
    len: u64,
    host: u64,
}

/// Pages given back so far, by what became of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiscardCount {
    /// Pages dropped (resident or stored ones freed, and pages never
    /// touched, whose source is forgotten).
    pub dropped: u64,
    /// Pages the pager was fetching or evicting just then: left as they
    /// were.
    pub busy: u64,
}

impl std::ops::AddAssign for DiscardCount {
    fn add_assign(&mut self, o: Self) {
        self.dropped += o.dropped;
        self.busy += o.busy;
    }
}

/// Drops ranges of guest RAM. Shares the VM's mapping: it lives no longer
/// than the VM's devices, which the VM drops before its RAM.
pub struct Discarder {
    regions: Vec<Region>,
    advice: libc::c_int,
    pager: RwLock<Option<PagerDiscard>>,
    writes: Arc<HostWrites>,
}

impl Discarder {
    /// A discarder for `ram`, telling `writes` what it dropped.
    pub fn new(ram: &GuestRam, writes: Arc<HostWrites>) -> io::Result<Self> {
        let mut regions = Vec::new();
        for r in ram.memory().iter() {
            let host = r
                .get_host_address(MemoryRegionAddress(0))
                .map_err(|e| io::Error::other(e.to_string()))? as u64;
            regions.push(Region {
                gpa: r.start_addr().0,
                len: r.len(),
                host,
            });
        }
        Ok(Discarder {
            regions,
            advice: match ram.backend() {
                MemoryBackend::Anonymous => libc::MADV_DONTNEED,
                MemoryBackend::Memfd => libc::MADV_REMOVE,
            },
            pager: RwLock::new(None),
            writes,
        })
    }

    /// From now on pages the pager serves are dropped through it
    /// (`None`: the pager stopped or released guest memory).
    pub fn attach_pager(&self, pager: Option<PagerDiscard>) {
        *self.pager.write_now() = pager;
    }

    /// Drop `[gpa, gpa + len)`: whole pages inside one RAM region. A range
    /// that is not is refused whole (the guest's mistake; nothing dropped).
    pub fn discard(&self, gpa: u64, len: u64) -> Result<DiscardCount, DiscardError> {
        if len == 0 || !gpa.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(DiscardError::NotWholePages { gpa, len });
        }
        let Some(region) = self
            .regions
            .iter()
            .find(|r| gpa >= r.gpa && gpa.checked_add(len).is_some_and(|e| e <= r.gpa + r.len))
        else {
            return Err(DiscardError::OutsideRam { gpa, len });
        };
        let pager = self.pager.read_now();
        let mut count = DiscardCount::default();
        // Runs of pages the pager does not serve go to the kernel at once.
        let mut run: Option<(u64, u64)> = None;
        let mut page = gpa;
        while page < gpa + len {
            let by_pager = match pager.as_ref() {
                Some(p) => p.drop_page(page),
                None => Dropped::NotPaged,
            };
            match by_pager {
                Dropped::NotPaged => match &mut run {
                    Some((_, n)) => *n += PAGE_SIZE,
                    None => run = Some((page, PAGE_SIZE)),
                },
                other => {
                    if let Some((at, n)) = run.take() {
                        self.advise(region, at, n);
                        count.dropped += n / PAGE_SIZE;
                    }
                    match other {
                        Dropped::Busy => count.busy += 1,
                        _ => count.dropped += 1,
                    }
                }
            }
            page += PAGE_SIZE;
        }
        if let Some((at, n)) = run {
            self.advise(region, at, n);
            count.dropped += n / PAGE_SIZE;
        }
        self.writes.mark(gpa, len);
        Ok(count)
    }

    fn advise(&self, region: &Region, gpa: u64, len: u64) {
        let host = region.host + (gpa - region.gpa);
        // SAFETY: whole pages of the VM's own guest mapping, which lives
        // as long as this discarder; the guest gave them up.
        let rc = unsafe { libc::madvise(host as *mut libc::c_void, len as usize, self.advice) };
        if rc != 0 {
            tracing::debug!(
                "dropping guest pages at {gpa:#x} (+{len:#x}): {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// A range the guest gave back that is not whole pages of its RAM (the
/// guest's mistake: nothing of it is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DiscardError {
    /// Empty, or not on page boundaries.
    #[error("{len:#x} bytes at {gpa:#x}: not whole 4 KiB pages")]
    NotWholePages {
        /// Where it starts.
        gpa: u64,
        /// Its bytes.
        len: u64,
    },
    /// Not inside one RAM region.
    #[error("{len:#x} bytes at {gpa:#x}: not inside guest RAM")]
    OutsideRam {
        /// Where it starts.
        gpa: u64,
        /// Its bytes.
        len: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn dropped_pages_read_zeros_and_leave_the_host_and_bad_ranges_change_nothing() {
        for backend in [MemoryBackend::Anonymous, MemoryBackend::Memfd] {
            let ram = GuestRam::new(1 << 20, backend).unwrap();
            let writes = Arc::new(HostWrites::new(ram.end()));
            writes.record(true);
            let d = Discarder::new(&ram, writes.clone()).unwrap();
            let mem = ram.memory();
            for p in 0..16u64 {
                mem.write_obj(p + 1, GuestAddress(p * PAGE_SIZE)).unwrap();
            }
            let before = ram.resident_bytes().unwrap();
            assert_eq!(
                d.discard(4 * PAGE_SIZE, 4 * PAGE_SIZE).unwrap(),
                DiscardCount {
                    dropped: 4,
                    busy: 0
                }
            );
            assert_eq!(
                ram.resident_bytes().unwrap(),
                before - 4 * PAGE_SIZE,
                "{backend:?}"
            );
            for p in 0..16u64 {
                let v: u64 = mem.read_obj(GuestAddress(p * PAGE_SIZE)).unwrap();
                let want = if (4..8).contains(&p) { 0 } else { p + 1 };
                assert_eq!(v, want, "{backend:?} page {p}");
            }
            assert_eq!(
                writes.take(),
                (4..8).map(|p| p * PAGE_SIZE).collect::<Vec<_>>(),
                "a migration resends them"
            );
            for (gpa, len) in [
                (1, PAGE_SIZE),
                (0, 100),
                (0, 0),
                (1 << 20, PAGE_SIZE),
                (0, 2 << 20),
            ] {
                assert!(d.discard(gpa, len).is_err(), "{gpa:#x}+{len:#x}");
            }
            let v: u64 = mem.read_obj(GuestAddress(0)).unwrap();
            assert_eq!(v, 1, "a refused range drops nothing");
        }
    }
}
