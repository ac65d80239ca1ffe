//! Guest memory into and out of a snapshot.
//!
//! Saving writes only pages that hold something: a page the guest never
//! touched is not resident (mincore), and a resident page of zeros is
//! skipped too. Under the pager, a page that is not resident is read from
//! where it lives (the page store, or the snapshot a lazy restore came
//! from), with every page held still meanwhile.

use std::io;

use hover_abi::layout::PAGE_SIZE;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::file::{Snapshot, SnapshotError, SnapshotWriter};
use crate::memory::paged::{PageContent, PageReader, Pager};
use crate::memory::store::PageBuf;
use crate::memory::GuestRam;

/// Pages written.
pub type PageCount = u64;

/// One region of guest RAM, as host memory.
struct Region {
    gpa: u64,
    host: *mut u8,
    len: u64,
}

fn regions(ram: &GuestRam) -> io::Result<Vec<Region>> {
    ram.memory()
        .iter()
        .map(|r| {
            let host = r
                .get_host_address(MemoryRegionAddress(0))
                .map_err(|e| io::Error::other(e.to_string()))?;
            Ok(Region {
                gpa: r.start_addr().0,
                host,
                len: r.len(),
            })
        })
        .collect()
}

/// Which pages of `r` are resident, one bool per page.
fn resident(r: &Region) -> io::Result<Vec<bool>> {
    let pages = (r.len / PAGE_SIZE) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: host..host+len is the region's live mapping; vec has one byte per page.
    let rc = unsafe { libc::mincore(r.host.cast(), r.len as usize, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.into_iter().map(|b| b & 1 != 0).collect())
}

/// The resident pages of guest RAM (those the guest or the monitor ever
/// touched), ascending.
pub fn resident_pages(ram: &GuestRam) -> io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for r in regions(ram)? {
        for (i, present) in resident(&r)?.into_iter().enumerate() {
            if present {
                out.push(r.gpa + i as u64 * PAGE_SIZE);
            }
        }
    }
    Ok(out)
}

/// The pages a migration's first round and a digest read: the resident
/// ones, and under a pager every page (one may be evicted to the store or
/// still in the source of a lazy restore), ascending.
pub fn pages_to_send(ram: &GuestRam, pager: Option<&Pager>) -> io::Result<Vec<u64>> {
    if pager.is_none() {
        return resident_pages(ram);
    }
    Ok(regions(ram)?
        .iter()
        .flat_map(|r| (0..r.len / PAGE_SIZE).map(move |i| r.gpa + i * PAGE_SIZE))
        .collect())
}

/// Copy the pages at `gpas` into `out`, a page each. Under a pager, each is
/// read from where it lives, with the pager held still meanwhile (so keep
/// `gpas` short while the guest runs: its faults wait).
pub fn read_pages(
    ram: &GuestRam,
    pager: Option<&Pager>,
    gpas: &[u64],
    out: &mut [u8],
) -> io::Result<()> {
    let ps = PAGE_SIZE as usize;
    let pages = gpas.iter().zip(out.chunks_exact_mut(ps));
    let Some(pager) = pager else {
        for (&gpa, page) in pages {
            read_page(ram, gpa, page)?;
        }
        return Ok(());
    };
    pager.with_pages_still(|content| {
        let mut buf = PageBuf::new();
        for (&gpa, page) in pages {
            match content(gpa, &mut buf)? {
                Some(PageContent::Copied) => page.copy_from_slice(&buf.0),
                Some(PageContent::Zero) => page.fill(0),
                // Resident pages stay so while the pager is held still.
                Some(PageContent::Resident) | None => read_page(ram, gpa, page)?,
            }
        }
        Ok(())
    })
}

/// A digest of guest memory: CRC32 over every page that is not all zeros,
/// with its address, ascending (under a pager, evicted pages and pages
/// still in a lazy restore's source included). Two VMs whose memory holds
/// the same have the same digest, whatever pages each has touched.
pub fn digest(ram: &GuestRam, pager: Option<&Pager>) -> io::Result<u32> {
    const CHUNK: usize = 256;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; CHUNK * PAGE_SIZE as usize];
    for gpas in pages_to_send(ram, pager)?.chunks(CHUNK) {
        read_pages(ram, pager, gpas, &mut buf)?;
        for (gpa, page) in gpas.iter().zip(buf.chunks_exact(PAGE_SIZE as usize)) {
            if !is_zero(page) {
                h.update(&gpa.to_le_bytes());
                h.update(page);
            }
        }
    }
    Ok(h.finalize())
}

/// Copy the page at `gpa` out of guest RAM (through its mapping: under a
/// pager, a page not resident faults to the pager).
pub fn read_page(ram: &GuestRam, gpa: u64, out: &mut [u8]) -> io::Result<()> {
    use vm_memory::GuestAddress;
    let out = &mut out[..PAGE_SIZE as usize];
    if !ram.contains(gpa, PAGE_SIZE) {
        return Err(io::Error::other(format!(
            "page {gpa:#x} is outside guest memory"
        )));
    }
    let host = ram
        .memory()
        .get_host_address(GuestAddress(gpa))
        .map_err(|e| io::Error::other(e.to_string()))?;
    // SAFETY: the whole page lies in one mapped RAM region (checked above)
    // that lives as long as `ram`; a plain copy is what a migration round
    // wants (the guest may write the page meanwhile: the dirty log
    // catches that, and the page is sent again).
    unsafe { std::ptr::copy_nonoverlapping(host as *const u8, out.as_mut_ptr(), out.len()) };
    Ok(())
}

/// Whether a page is all zeros.
pub fn is_zero(page: &[u8]) -> bool {
    let chunks = page.chunks_exact(16);
    let rest = chunks.remainder();
    chunks
        .map(|c| u128::from_ne_bytes(c.try_into().expect("16 bytes")))
        .all(|w| w == 0)
        && rest.iter().all(|&b| b == 0)
}

/// Write every page of guest memory that holds something to `w` (the VM is
/// paused). With a pager, pages are read wherever they live.
pub fn save(
    ram: &GuestRam,
    pager: Option<&Pager>,
    w: &mut SnapshotWriter,
) -> Result<PageCount, SnapshotError> {
    let io_err = |w: &SnapshotWriter, source| SnapshotError::Io {
        path: w.path().into(),
        what: "cannot read guest memory",
        source,
    };
    let regions = regions(ram).map_err(|e| io_err(w, e))?;
    let mut buf = PageBuf::new();
    let mut written = 0;
    let mut walk =
        |content: Option<&PageReader<'_>>, w: &mut SnapshotWriter| -> Result<(), SnapshotError> {
            for r in &regions {
                let present = resident(r).map_err(|e| io_err(w, e))?;
                for (i, &is_resident) in present.iter().enumerate() {
                    let gpa = r.gpa + i as u64 * PAGE_SIZE;
                    let what = match content {
                        Some(c) => c(gpa, &mut buf).map_err(|e| io_err(w, e))?,
                        None => None,
                    };
                    let data: &[u8] = match what {
                        Some(PageContent::Copied) => &buf.0,
                        Some(PageContent::Zero) => continue,
                        // Resident, or outside the pager's range (always resident).
                        Some(PageContent::Resident) | None => {
                            if !is_resident {
                                continue;
                            }
                            // SAFETY: the page lies inside the region's live
                            // mapping and is resident, so reading it neither
                            // faults to the pager nor races a guest write (the
                            // VM is paused and its devices frozen).
                            unsafe {
                                std::slice::from_raw_parts(
                                    r.host.add(i * PAGE_SIZE as usize),
                                    PAGE_SIZE as usize,
                                )
                            }
                        }
                    };
                    if is_zero(data) {
                        continue;
                    }
                    w.page(gpa, data)?;
                    written += 1;
                }
            }
            Ok(())
        };
    match pager {
        Some(p) => p.with_pages_still(|c| walk(Some(c), w))?,
        None => walk(None, w)?,
    }
    Ok(written)
}

/// Copy the pages `snap` holds below guest-physical `end` into guest RAM:
/// all of them for an eager restore (`end` = `u64::MAX`), the part the
/// pager never serves (boot area, guest image) for a lazy one. Each page's
/// CRC is checked before the guest can see it.
pub fn load(snap: &Snapshot, ram: &GuestRam, end: u64) -> Result<PageCount, SnapshotError> {
    let regions = regions(ram).map_err(|source| SnapshotError::Io {
        path: snap.path().into(),
        what: "cannot map guest memory",
        source,
    })?;
    let ps = PAGE_SIZE as usize;
    // Runs of pages next to each other in guest memory, read straight into
    // it with one `pread` each (a page at a time, 16,000 calls took about
    // as long as the copies on this host).
    let mut run: Vec<u64> = Vec::with_capacity(LOAD_RUN);
    let mut n = 0;
    let mut flush = |run: &mut Vec<u64>| -> Result<(), SnapshotError> {
        let Some(&first) = run.first() else {
            return Ok(());
        };
        let r = regions
            .iter()
            .find(|r| first >= r.gpa && first < r.gpa + r.len)
            .expect("the index was checked against the RAM layout");
        // SAFETY: the run lies inside one region's live mapping (a run
        // never crosses a region's end), which no vCPU runs on yet.
        let out = unsafe {
            std::slice::from_raw_parts_mut(r.host.add((first - r.gpa) as usize), run.len() * ps)
        };
        snap.read_pages(run, out)?;
        n += run.len() as PageCount;
        run.clear();
        Ok(())
    };
    for (gpa, _) in snap.stored_pages().take_while(|&(gpa, _)| gpa < end) {
        let joins = run.last().is_some_and(|&last| {
            gpa == last + PAGE_SIZE
                && run.len() < LOAD_RUN
                && regions
                    .iter()
                    .any(|r| last >= r.gpa && gpa + PAGE_SIZE <= r.gpa + r.len)
        });
        if !joins {
            flush(&mut run)?;
        }
        run.push(gpa);
    }
    flush(&mut run)?;
    Ok(n)
}

/// Most pages an eager load reads with one call (1 MiB).
const LOAD_RUN: usize = 256;
