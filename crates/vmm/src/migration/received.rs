//! Where a destination keeps the memory of a VM under a pager (a memory
//! budget) while it arrives: pages above the pinned boot area go to a
//! sparse file, not into guest RAM, so the budget holds from the first
//! page; once the guest runs, the pager brings each in on first touch, as
//! on a lazy restore (this is its [`PageSource`]).

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use hover_abi::layout::PAGE_SIZE;

use crate::memory::paged::PageSource;
use crate::memory::store::{PageBuf, PageStore, StoreError};

/// Pages received for a paged VM, by guest-physical address.
pub struct ReceivedPages {
    store: PageStore,
    present: Vec<AtomicBool>,
}

impl ReceivedPages {
    /// A store for pages below guest-physical `end`, in a new file at
    /// `path` (or a directory to create it in; `None`: a temporary file),
    /// without a name (it goes with the process).
    pub fn create(path: Option<&Path>, end: u64) -> Result<Self, StoreError> {
        Ok(ReceivedPages {
            // Room is checked as pages arrive: a full disk fails the write.
            store: PageStore::create(path, 0)?,
            present: (0..end / PAGE_SIZE)
                .map(|_| AtomicBool::new(false))
                .collect(),
        })
    }

    /// Keep the page at `gpa` (a later copy replaces an earlier one).
    pub fn write(&self, gpa: u64, page: &[u8]) -> io::Result<()> {
        let index = gpa / PAGE_SIZE;
        let slot = self
            .present
            .get(index as usize)
            .ok_or_else(|| io::Error::other(format!("page {gpa:#x} is outside guest memory")))?;
        let mut buf = PageBuf::new();
        buf.0.copy_from_slice(&page[..PAGE_SIZE as usize]);
        self.store.write(index, &buf)?;
        slot.store(true, Ordering::Release);
        Ok(())
    }

    /// The addresses of the pages kept, ascending.
    pub fn held(&self) -> Vec<u64> {
        (0..self.present.len())
            .filter(|&i| self.present[i].load(Ordering::Acquire))
            .map(|i| i as u64 * PAGE_SIZE)
            .collect()
    }

    /// The name the file had (see [`PageStore::path`]).
    pub fn path(&self) -> &Path {
        self.store.path()
    }
}

impl PageSource for ReceivedPages {
    fn read(&self, gpa: u64, buf: &mut PageBuf) -> io::Result<bool> {
        let index = gpa / PAGE_SIZE;
        match self.present.get(index as usize) {
            Some(p) if p.load(Ordering::Acquire) => {
                self.store.read(index, buf)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_come_back_as_written_and_others_are_zeros() {
        let dir = std::env::temp_dir();
        let r = ReceivedPages::create(Some(&dir), 16 * PAGE_SIZE).unwrap();
        let path = r.path().to_path_buf();
        r.write(3 * PAGE_SIZE, &[7u8; 4096]).unwrap();
        r.write(3 * PAGE_SIZE, &[9u8; 4096]).unwrap();
        let mut buf = PageBuf::new();
        assert!(r.read(3 * PAGE_SIZE, &mut buf).unwrap());
        assert!(buf.0.iter().all(|&b| b == 9));
        assert!(!r.read(4 * PAGE_SIZE, &mut buf).unwrap());
        assert!(r.write(16 * PAGE_SIZE, &[1u8; 4096]).is_err());
        drop(r);
        assert!(!path.exists(), "the file goes with the store");
    }
}
