//! The memory index of a snapshot: which guest pages it holds, in which
//! order, and the CRC32 of each.

use hover_abi::layout::PAGE_SIZE;
use serde::{Deserialize, Serialize};

/// The memory index: which pages the file holds, where, and their CRCs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryIndex {
    /// Runs of consecutive guest pages: (first guest-physical address, pages),
    /// ascending; their pages are stored in this order from the data offset.
    pub runs: Vec<(u64, u32)>,
    /// CRC32 of each stored page, in storage order.
    pub crcs: Vec<u32>,
}

impl MemoryIndex {
    /// Pages stored.
    pub fn pages(&self) -> u64 {
        self.crcs.len() as u64
    }

    pub(super) fn push(&mut self, gpa: u64, crc: u32) {
        match self.runs.last_mut() {
            Some((start, n)) if *start + *n as u64 * PAGE_SIZE == gpa && *n < u32::MAX => *n += 1,
            _ => self.runs.push((gpa, 1)),
        }
        self.crcs.push(crc);
    }

    /// Check the runs are ascending, in `memory` bytes of RAM, and match
    /// the CRC count; returns each run's first storage slot.
    pub(super) fn check(
        &self,
        contains: impl Fn(u64, u64) -> bool,
    ) -> Result<Vec<u64>, IndexError> {
        let mut slots = Vec::with_capacity(self.runs.len());
        let (mut slot, mut end) = (0u64, 0u64);
        for &(gpa, n) in &self.runs {
            let len = n as u64 * PAGE_SIZE;
            if !gpa.is_multiple_of(PAGE_SIZE) || gpa < end || n == 0 || !contains(gpa, len) {
                return Err(IndexError::BadRun { gpa, pages: n });
            }
            slots.push(slot);
            slot += n as u64;
            end = gpa + len;
        }
        if slot != self.pages() {
            return Err(IndexError::Count {
                pages: slot,
                crcs: self.pages(),
            });
        }
        Ok(slots)
    }
}

/// A memory index that does not fit its snapshot.
#[derive(Debug, thiserror::Error)]
pub(super) enum IndexError {
    /// A run unaligned, overlapping the one before, or outside guest RAM.
    #[error("page run {gpa:#x} (+{pages} pages) is unaligned, out of order or outside guest RAM")]
    BadRun {
        /// Its first page's address.
        gpa: u64,
        /// Its pages.
        pages: u32,
    },
    /// Runs and CRCs that do not count the same pages.
    #[error("the runs hold {pages} pages but {crcs} CRCs are stored")]
    Count {
        /// Pages the runs hold.
        pages: u64,
        /// CRCs stored.
        crcs: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_merges_runs_and_finds_pages() {
        let mut ix = MemoryIndex::default();
        for gpa in [0x1000u64, 0x2000, 0x3000, 0x10_0000, 0x10_1000] {
            ix.push(gpa, 7);
        }
        assert_eq!(ix.runs, vec![(0x1000, 3), (0x10_0000, 2)]);
        let slots = ix.check(|_, _| true).unwrap();
        assert_eq!(slots, vec![0, 3]);
        assert!(ix.check(|g, _| g < 0x10_0000).is_err(), "outside RAM");
        let mut bad = ix.clone();
        bad.crcs.pop();
        assert!(bad.check(|_, _| true).is_err(), "count mismatch");
        let mut bad = ix;
        bad.runs.swap(0, 1);
        assert!(bad.check(|_, _| true).is_err(), "out of order");
    }
}
