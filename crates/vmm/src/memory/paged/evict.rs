//! Making room: evicting the oldest resident pages to the page store, a
//! batch at a time.
//!
//! A page leaves guest RAM by `UFFDIO_MOVE` into one of the fetch worker's
//! staging pages (atomic: any access from then on faults and waits), is
//! written to the store, and its staging page is dropped. Where the kernel
//! has no `UFFDIO_MOVE` (before 6.8) the page is write-protected instead
//! (`UFFDIO_WRITEPROTECT`: a guest write from then on faults and waits),
//! copied into the staging page, written to the store and then dropped
//! from guest RAM (`MADV_DONTNEED`); the writer is served when the page is
//! fetched again (its fault marked the page WANTED), so no write is lost.
//! Reads meanwhile see the page as it is being stored. Done one page at
//! a time, each eviction cost a store write of its own (on a virtio disk,
//! a device notification and a completion interrupt each) and a TLB
//! shootdown to drop the staging page. A batch of [`EVICT_BATCH`] pages is
//! written with one submission (`aio`, where the kernel has it) and its
//! staging pages dropped with one `madvise`. A store error puts the pages
//! back and stops the VM: no access is ever served wrong data.

use crate::sync::Locked;
use std::io;
use std::sync::atomic::Ordering;
use std::time::Instant;

use hover_abi::layout::PAGE_SIZE;

use super::{EvictMode, Shared, EVICTING, FETCHING, RESIDENT, STORED, WANTED};
use crate::memory::aio::Aio;

/// Pages a worker evicts at once when it needs room: the store writes of a
/// batch share one submission. (The budget is then undershot by up to this
/// many pages per worker until the next fetches fill it.)
pub const EVICT_BATCH: usize = 16;

/// A fetch worker's means of making room: its [`EVICT_BATCH`] staging
/// pages (registered with the pager's userfaultfd, as `UFFDIO_MOVE`'s
/// destination must be) and its AIO context, if the kernel gave one.
pub(super) struct Evictor {
    staging: u64,
    aio: Option<Aio>,
}

impl Evictor {
    /// Staging pages at `staging` ([`EVICT_BATCH`] of them).
    pub(super) fn new(staging: u64) -> Self {
        let aio = Aio::new(EVICT_BATCH)
            .inspect_err(|e| {
                tracing::debug!("no AIO for the pager ({e}): one store write per page")
            })
            .ok();
        Evictor { staging, aio }
    }

    fn slot(&self, i: usize) -> u64 {
        self.staging + i as u64 * PAGE_SIZE
    }
}

impl Shared {
    /// Evict up to [`EVICT_BATCH`] of the oldest resident pages through
    /// `ev`. `false`: nothing more can be evicted now.
    pub(super) fn evict_batch(&self, ev: &Evictor) -> bool {
        let Some(store) = &self.store else {
            return false;
        };
        let (moved, more) = self.take_victims(ev);
        if moved.is_empty() {
            return more;
        }
        for &(v, slot) in &moved {
            // SAFETY: `slot` is a staging page of this worker, holding the
            // page just moved there.
            let page = unsafe { std::slice::from_raw_parts(slot as *const u8, PAGE_SIZE as usize) };
            self.crcs[v].store(crc32fast::hash(page), Ordering::Release);
        }
        let pages: Vec<(u64, *const u8)> = moved
            .iter()
            .map(|&(v, slot)| (v as u64, slot as *const u8))
            .collect();
        // SAFETY: each source is a staging page holding a moved page; they
        // stay mapped and untouched until the batch is written.
        let results = unsafe { store.write_batch(ev.aio.as_ref(), &pages) };
        let mut failure = None;
        let mut stranded = false;
        for (&(v, slot), result) in moved.iter().zip(results) {
            match result {
                Ok(()) => {
                    if self.evict_mode == EvictMode::WriteProtect {
                        // Stored: now out of guest RAM. A writer held by
                        // the protection waits for the page's fetch.
                        // SAFETY: one page of our guest mapping, which the
                        // pager holds (EVICTING).
                        unsafe {
                            libc::madvise(
                                self.host_of(v) as *mut libc::c_void,
                                PAGE_SIZE as usize,
                                libc::MADV_DONTNEED,
                            )
                        };
                    }
                    self.stored_out(v)
                }
                Err(e) => {
                    let (f, back) = self.put_back(v, slot, e);
                    stranded |= !back;
                    failure.get_or_insert(f);
                }
            }
        }
        // A page that could not be moved back has its only copy in its
        // staging page: keep them all (the VM stops; nothing reuses them).
        if !stranded {
            // SAFETY: our own staging pages; their pages are written out
            // or were moved back.
            unsafe {
                libc::madvise(
                    ev.staging as *mut libc::c_void,
                    moved.len() * PAGE_SIZE as usize,
                    libc::MADV_DONTNEED,
                )
            };
        }
        if let Some(f) = failure {
            self.fail(f);
            return false;
        }
        more
    }

    /// Move up to a batch of the FIFO's oldest resident pages into `ev`'s
    /// staging pages: `(page, staging page)` each, and whether more may be
    /// evicted after them.
    fn take_victims(&self, ev: &Evictor) -> (Vec<(usize, u64)>, bool) {
        let mut moved = Vec::with_capacity(EVICT_BATCH);
        // Pages briefly unmovable (EBUSY) go back to the FIFO's end; a
        // bound on tries keeps a FIFO of only such pages from spinning.
        for _ in 0..2 * EVICT_BATCH {
            if moved.len() == EVICT_BATCH {
                break;
            }
            let Some(v) = self.fifo.locked().pop_front() else {
                return (moved, false);
            };
            let v = v as usize;
            self.in_fifo[v].store(false, Ordering::Release);
            let st = &self.states[v];
            if st
                .compare_exchange(RESIDENT, EVICTING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            let slot = ev.slot(moved.len());
            if let Err(e) = self.take_out(v, slot) {
                self.now_resident(v);
                self.retries.fetch_add(1, Ordering::Relaxed);
                if !matches!(e.raw_os_error(), Some(libc::EBUSY) | Some(libc::EAGAIN)) {
                    return (moved, false);
                }
                continue;
            }
            moved.push((v, slot));
        }
        (moved, true)
    }

    /// Take page `v` (EVICTING, ours) into staging page `slot`: moved out
    /// of guest RAM, or write-protected and copied (dropped once stored).
    fn take_out(&self, v: usize, slot: u64) -> io::Result<()> {
        let host = self.host_of(v);
        match self.evict_mode {
            EvictMode::Move => self.uffd.move_pages(slot, host, PAGE_SIZE),
            EvictMode::WriteProtect => {
                self.uffd.write_protect(host, PAGE_SIZE, true)?;
                // SAFETY: `host` is a resident page of our guest mapping,
                // read-only to the guest now; `slot` is this worker's own
                // staging page (not registered: the copy does not fault).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        host as *const u8,
                        slot as *mut u8,
                        PAGE_SIZE as usize,
                    )
                };
                Ok(())
            }
        }
    }

    /// Page `v` is in the store: count it out, and fetch it again at once
    /// if a fault wanted it meanwhile.
    fn stored_out(&self, v: usize) {
        self.stored[v].store(true, Ordering::Release);
        self.resident.fetch_sub(1, Ordering::AcqRel);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        let st = &self.states[v];
        if st.swap(STORED, Ordering::AcqRel) & WANTED != 0
            && st
                .compare_exchange(STORED, FETCHING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.enqueue(v, Instant::now());
        }
    }

    /// The store write of page `v` failed with `e`: put the page back into
    /// guest RAM from `slot` (its only copy); the failure to report, and
    /// whether the page is back.
    fn put_back(&self, v: usize, slot: u64, e: io::Error) -> (String, bool) {
        let host = self.host_of(v);
        let back = match self.evict_mode {
            EvictMode::Move => self.uffd.move_pages(host, slot, PAGE_SIZE),
            // Still in guest RAM: lift the protection (waking its writers).
            EvictMode::WriteProtect => self.uffd.write_protect(host, PAGE_SIZE, false),
        };
        self.now_resident(v);
        let gpa = self.gpa_of(v);
        match back {
            Ok(()) => (format!("page store write of guest page {gpa:#x} failed: {e}"), true),
            Err(b) => (
                format!("page store write of guest page {gpa:#x} failed ({e}) and restoring it failed ({b})"),
                false,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use hover_abi::layout::PAGE_SIZE;

    use crate::config::MemoryBackend;
    use crate::memory::paged::{EvictMode, Pager};
    use crate::memory::GuestRam;

    /// Two threads each add 1 to their own word of every page, round after
    /// round, through a budget of a quarter of the pages: every page is
    /// evicted and fetched again many times, while the other thread writes
    /// to it. Each word ends at the number of rounds, in both modes.
    #[test]
    fn evictions_under_concurrent_writes_lose_nothing_in_either_mode() {
        if !super::super::usable_for_test() {
            return;
        }
        const PAGES: u64 = 512;
        const ROUNDS: u64 = 6;
        for mode in [EvictMode::Move, EvictMode::WriteProtect] {
            let ram = GuestRam::new(PAGES * PAGE_SIZE, MemoryBackend::Anonymous).unwrap();
            let config = super::super::test_config(PAGES / 4 * PAGE_SIZE, Some(mode));
            let pager = match Pager::start(&ram, 0, &config, None, Box::new(|m| panic!("{m}"))) {
                Ok(p) => p,
                Err(e) if mode == EvictMode::Move && std::env::var_os("CI").is_none() => {
                    eprintln!("skipping move: {e}");
                    continue;
                }
                Err(e) => panic!("{mode:?}: {e}"),
            };
            let base = pager.shared.host_of(0);
            let writers: Vec<_> = (0..2u64)
                .map(|t| {
                    std::thread::spawn(move || {
                        for _ in 0..ROUNDS {
                            for p in 0..PAGES {
                                let at = (base + p * PAGE_SIZE + 8 * t) as *mut u64;
                                // SAFETY: guest RAM mapped by `ram`, which
                                // outlives the writers (joined below).
                                unsafe { at.write_volatile(at.read_volatile() + 1) };
                            }
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
            let s = pager.stats();
            assert_eq!(s.evict_mode, mode.name());
            assert!(
                s.evictions > PAGES,
                "{mode:?}: pages went out and in: {s:?}"
            );
            for p in 0..PAGES {
                for t in 0..2 {
                    let at = (base + p * PAGE_SIZE + 8 * t) as *const u64;
                    // SAFETY: as above.
                    let v = unsafe { at.read_volatile() };
                    assert_eq!(v, ROUNDS, "{mode:?}: page {p}, thread {t}");
                }
            }
            assert!(pager.shared.resident.load(Ordering::Acquire) <= PAGES / 4 + 16);
        }
    }
}
