//! The VM's pager over its life: none, serving guest memory, or released
//! once a prefetching restore (or a post-copy arrival) had every page in
//! place. What a released pager did is kept for the run's outcome and a
//! later snapshot's hot set.

use crate::memory::paged::{Pager, PagerError, PagerStats};

/// Who serves guest memory.
pub(super) enum Paging {
    /// The kernel: no pager ran.
    Off,
    /// The pager.
    On(Pager),
    /// The kernel again: a pager ran and let go.
    Released {
        /// What it did.
        stats: PagerStats,
        /// The order its pages were first touched.
        first_touches: Vec<u64>,
    },
}

impl Paging {
    /// The pager a VM was built with, if any.
    pub(super) fn new(pager: Option<Pager>) -> Paging {
        pager.map_or(Paging::Off, Paging::On)
    }

    /// The running pager.
    pub(super) fn pager(&self) -> Option<&Pager> {
        match self {
            Paging::On(p) => Some(p),
            _ => None,
        }
    }

    /// The running pager, to change.
    pub(super) fn pager_mut(&mut self) -> Option<&mut Pager> {
        match self {
            Paging::On(p) => Some(p),
            _ => None,
        }
    }

    /// What the pager has done (`None`: none ran).
    pub(super) fn stats(&self) -> Option<PagerStats> {
        match self {
            Paging::Off => None,
            Paging::On(p) => Some(p.stats()),
            Paging::Released { stats, .. } => Some(stats.clone()),
        }
    }

    /// The pageable pages in the order the guest first touched them
    /// (empty without a pager).
    pub(super) fn first_touches(&self) -> Vec<u64> {
        match self {
            Paging::Off => Vec::new(),
            Paging::On(p) => p.first_touches(),
            Paging::Released { first_touches, .. } => first_touches.clone(),
        }
    }

    /// Let the running pager go: guest memory back to the kernel. Its
    /// statistics, or `None` when no pager runs. On an error the pager is
    /// gone all the same (the VM must end).
    pub(super) fn release(&mut self) -> Result<Option<PagerStats>, PagerError> {
        match std::mem::replace(self, Paging::Off) {
            Paging::On(p) => {
                let first_touches = p.first_touches();
                let stats = p.release()?;
                *self = Paging::Released {
                    stats: stats.clone(),
                    first_touches,
                };
                Ok(Some(stats))
            }
            other => {
                *self = other;
                Ok(None)
            }
        }
    }
}
