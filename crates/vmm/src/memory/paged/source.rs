//! Where a page's content comes from when it is not resident: the page
//! store for a page the pager evicted, otherwise the page source (a snapshot
//! file on a lazy restore; later a migration connection), or zeros. Also how
//! whoever saves guest memory reads every page with the pager held still.

use crate::sync::ReadWrite;
use std::io;
use std::sync::atomic::Ordering;

use super::{Pager, Shared, RESIDENT, STATE};
use crate::memory::store::PageBuf;

/// Where the first content of a guest page comes from.
pub trait PageSource: Send + Sync {
    /// Fill `buf` with the page at guest-physical `gpa`; `Ok(false)` if the
    /// page is all zeros (`buf` is then left as it was).
    fn read(&self, gpa: u64, buf: &mut PageBuf) -> io::Result<bool>;
}

/// What a page holds, for whoever saves guest memory.
pub enum PageContent {
    /// Resident in guest RAM: read it there.
    Resident,
    /// Not resident; its content is in the buffer given.
    Copied,
    /// All zeros.
    Zero,
}

/// Reads a guest page for [`Pager::with_pages_still`]: `None` if the
/// pager does not serve that address.
pub type PageReader<'a> = dyn Fn(u64, &mut PageBuf) -> io::Result<Option<PageContent>> + 'a;

impl Shared {
    /// Fill `buf` with `page` as it is when not resident: from the store if
    /// it was evicted, else from the source (or zeros). `Ok(false)`: zeros.
    pub(super) fn initial_or_stored(&self, page: usize, buf: &mut PageBuf) -> io::Result<bool> {
        if self.stored[page].load(Ordering::Acquire) {
            let store = self
                .store
                .as_ref()
                .expect("pages are stored only with a store");
            store.read(page as u64, buf)?;
            let (want, got) = (
                self.crcs[page].load(Ordering::Acquire),
                crc32fast::hash(&buf.0),
            );
            if got != want {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the page store returned other data than was written (CRC {got:#010x}, written {want:#010x}): the store file was changed or its device failed"
                    ),
                ));
            }
            return Ok(true);
        }
        if self.dropped[page].load(Ordering::Acquire) {
            buf.0.fill(0);
            return Ok(false);
        }
        let filled = match &self.source {
            Some(src) => {
                self.source_reads.fetch_add(1, Ordering::Relaxed);
                src.read(self.gpa_of(page), buf)?
            }
            None => false,
        };
        if !filled {
            buf.0.fill(0);
        }
        Ok(filled)
    }
}

impl Pager {
    /// Run `f` with every page held still (no fault served meanwhile), giving
    /// it a way to read any guest page: for saving guest memory.
    pub fn with_pages_still<R>(&self, f: impl FnOnce(&PageReader<'_>) -> R) -> R {
        let _still = self.shared.busy.write_now();
        let sh = &self.shared;
        let content = |gpa: u64, buf: &mut PageBuf| -> io::Result<Option<PageContent>> {
            let Some(page) = sh.page_of_gpa(gpa) else {
                return Ok(None);
            };
            if sh.states[page].load(Ordering::Acquire) & STATE == RESIDENT {
                return Ok(Some(PageContent::Resident));
            }
            Ok(Some(if sh.initial_or_stored(page, buf)? {
                PageContent::Copied
            } else {
                PageContent::Zero
            }))
        };
        f(&content)
    }

    /// Stop the pager's threads (faults still pending stay unserved).
    pub fn stop(&mut self) {
        self.shared.halt();
        // A loader still held ends without loading.
        self.loader_go = None;
        let _ = self.wake.write(1);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
