//! Dropping pages the guest gave up (a balloon's inflate, a free-page
//! report): each leaves guest RAM, the budget and the page store, and its
//! next touch gets a page of zeros, as after a fresh boot, never the page
//! source's content (a lazy restore's snapshot, a post-copy's source).
//!
//! The guest does not touch a page while it gives it up (the balloon
//! driver owns it; a reported page is off the free lists until the report
//! returns), so the only races are the pager's own (an eviction or a fetch
//! of the same page under way): such a page is left as it is and counted
//! busy. A guest that touches pages it reported hurts only itself (it may
//! read zeros or an older copy of them); nothing else is affected.

use crate::sync::ReadWrite;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use hover_abi::layout::PAGE_SIZE;

use super::{Shared, ABSENT, EVICTING, FETCHING, RESIDENT, STATE, STORED, WANTED};

/// What became of one page asked to be dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dropped {
    /// Not a page the pager serves (the pinned boot area, or the pager
    /// released guest memory): the caller drops it itself.
    NotPaged,
    /// It was resident or stored and is gone now.
    Freed,
    /// It was neither (never touched): only its source is forgotten.
    WasAbsent,
    /// A fetch or an eviction of it was under way: left as it is.
    Busy,
}

/// Drops guest pages the pager serves (from the balloon's thread).
#[derive(Clone)]
pub struct PagerDiscard {
    shared: Arc<Shared>,
}

impl PagerDiscard {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        PagerDiscard { shared }
    }

    /// Drop the page at guest-physical `gpa`.
    pub fn drop_page(&self, gpa: u64) -> Dropped {
        let sh = &self.shared;
        // Held still against a snapshot reading guest memory.
        let _busy = sh.busy.read_now();
        if sh.released.load(Ordering::Acquire) || sh.stop.load(Ordering::Acquire) {
            return Dropped::NotPaged;
        }
        let Some(page) = sh.page_of_gpa(gpa) else {
            return Dropped::NotPaged;
        };
        let st = &sh.states[page];
        let s = st.load(Ordering::Acquire);
        // Claimed as an eviction is: a fault meanwhile marks it WANTED
        // and waits, and is served (with zeros) once it is dropped.
        let claimed = match s & STATE {
            RESIDENT | STORED => st
                .compare_exchange(s, EVICTING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok(),
            ABSENT => {
                sh.dropped[page].store(true, Ordering::Release);
                sh.discarded.fetch_add(1, Ordering::Relaxed);
                return Dropped::WasAbsent;
            }
            FETCHING | EVICTING => false,
            _ => false,
        };
        if !claimed {
            return Dropped::Busy;
        }
        // From here a fetch of the page (a fault, WANTED) gives zeros.
        sh.dropped[page].store(true, Ordering::Release);
        let was_stored = sh.stored[page].swap(false, Ordering::AcqRel);
        if was_stored {
            if let Some(store) = &sh.store {
                store.forget(page as u64);
            }
            sh.discarded_stored.fetch_add(1, Ordering::Relaxed);
        }
        if s & STATE == RESIDENT {
            // SAFETY: one page of our own guest mapping, which the pager
            // holds (EVICTING): nobody else maps or moves it meanwhile.
            unsafe {
                libc::madvise(
                    sh.host_of(page) as *mut libc::c_void,
                    PAGE_SIZE as usize,
                    libc::MADV_DONTNEED,
                )
            };
            sh.resident.fetch_sub(1, Ordering::AcqRel);
        }
        if st.swap(ABSENT, Ordering::AcqRel) & WANTED != 0
            && st
                .compare_exchange(ABSENT, FETCHING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            sh.enqueue(page, Instant::now());
        }
        sh.discarded.fetch_add(1, Ordering::Relaxed);
        Dropped::Freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MemoryBackend;
    use crate::memory::paged::Pager;
    use crate::memory::GuestRam;

    #[test]
    fn dropped_pages_leave_ram_and_store_and_come_back_as_zeros_others_keep_their_data() {
        if !super::super::usable_for_test() {
            return;
        }
        const PAGES: u64 = 512;
        let ram = GuestRam::new(PAGES * PAGE_SIZE, MemoryBackend::Anonymous).unwrap();
        let config = super::super::test_config(PAGES / 2 * PAGE_SIZE, None);
        let pager = Pager::start(&ram, 0, &config, None, Box::new(|m| panic!("{m}"))).unwrap();
        let base = pager.shared.host_of(0);
        let at = |p: u64| (base + p * PAGE_SIZE) as *mut u64;
        for p in 0..PAGES {
            // SAFETY: guest RAM mapped by `ram`, which outlives the pager;
            // each access is served by the pager's threads.
            unsafe { std::ptr::write_volatile(at(p), p + 1) };
        }
        let s = pager.stats();
        assert!(s.evictions > 0, "the budget made the pager evict: {s:?}");
        let stored = (0..PAGES as usize)
            .filter(|&p| pager.shared.stored[p].load(Ordering::Acquire))
            .count();
        assert!(stored > 0);
        let d = pager.discarder();
        let mut freed = 0;
        for p in 0..PAGES {
            if p % 2 == 0 {
                match d.drop_page(p * PAGE_SIZE) {
                    Dropped::Freed => freed += 1,
                    other => panic!("page {p}: {other:?} (no fetch under way)"),
                }
            }
        }
        assert_eq!(freed, PAGES / 2);
        let s = pager.stats();
        assert_eq!(s.discarded_pages, PAGES / 2);
        assert!(
            s.discarded_stored_pages > 0,
            "some were in the store: {s:?}"
        );
        assert!(
            s.resident_pages <= PAGES / 2,
            "dropped pages left the budget: {s:?}"
        );
        for p in (0..PAGES as usize).step_by(2) {
            assert!(
                !pager.shared.stored[p].load(Ordering::Acquire),
                "page {p} left the store"
            );
        }
        for p in 0..PAGES {
            // SAFETY: as above.
            let v = unsafe { std::ptr::read_volatile(at(p)) };
            let want = if p % 2 == 0 { 0 } else { p + 1 };
            assert_eq!(v, want, "page {p}");
        }
        assert_eq!(
            d.drop_page(PAGES * PAGE_SIZE),
            Dropped::NotPaged,
            "outside the pager's memory"
        );
        // Dropped and touched again, over and over: the pager's records of
        // pages stay one entry per page at most.
        for _ in 0..3 {
            for p in (0..PAGES).step_by(2) {
                d.drop_page(p * PAGE_SIZE);
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(at(p), 1) };
            }
        }
        assert!(pager.shared.fifo.lock().unwrap().len() <= PAGES as usize);
        assert!(pager.shared.first_touch.lock().unwrap().len() <= PAGES as usize);
    }
}
