//! A prefetching restore's loader: while the guest runs, a background
//! thread fills the rest of guest memory from the page source in large
//! copies (one `UFFDIO_COPY` per run of pages contiguous in guest memory,
//! read with one `pread` per run contiguous in the file), in the order it
//! is given ([`block_order`]: the blocks around the hot set first, then
//! everything else).
//!
//! Demand faults never wait behind it: the loader reads a chunk without
//! claiming any page, and claims a run (ABSENT -> FETCHING) only for the
//! `UFFDIO_COPY` itself (at most [`CHUNK_PAGES`] pages). A page the guest
//! touches first is served by the pager's fetch workers as on a lazy
//! restore, and the loader then leaves it out. Under a memory budget the
//! loader is given only the hot set and stops at nine tenths of the
//! budget: the rest comes on demand.

use crate::sync::Locked;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;

use super::{Pager, PagerError, Placer, Shared, ABSENT, RESIDENT, STATE};

/// Pages read and placed at a time (1 MiB).
pub const CHUNK_PAGES: usize = 256;

/// Pages loaded together around a hot page (256 KiB): on this host a
/// system call costs about what copying a few pages does, so a hot set
/// scattered over guest memory is loaded fastest as whole blocks, each one
/// `pread` and one `UFFDIO_COPY`, rather than page by page (measured on a
/// 64 MiB random working set: 16,000 single-page calls took 40 ms of CPU
/// to read and 35 ms to place).
pub const BLOCK_PAGES: u64 = 64;

/// A page source that reads many pages at once (a snapshot file).
pub trait BulkSource: Send + Sync {
    /// Fill `out` with the pages at `gpas`, a page each, in order.
    fn read_pages(&self, gpas: &[u64], out: &mut [u8]) -> io::Result<()>;
}

/// When a prefetch loader begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoaderStart {
    /// At once.
    Now,
    /// Once [`Pager::let_loader_go`] is called (a restore: once the vCPUs
    /// run, so that the loader's reads and copies, above the vCPUs'
    /// priority, do not hold up their start on a host with few CPUs).
    Held,
}

impl Pager {
    /// Let a loader started with [`LoaderStart::Held`] begin.
    pub fn let_loader_go(&mut self) {
        if let Some(go) = self.loader_go.take() {
            let _ = go.send(());
        }
    }

    /// Start loading the pages `order` gives from `source` in the
    /// background, at most `rate` pages a second (`None`: as fast as it
    /// goes). `order` runs on the loader's thread: working out the order
    /// (about 1 ms for a 64 MiB snapshot here) is not in the way of the
    /// vCPUs' start. The pager's `stop` ends the loader too.
    /// `loaded` is called once every page of `order` is in place (not
    /// when the loader stops early: a failure, the pager stopping, a full
    /// budget).
    pub fn prefetch(
        &mut self,
        order: impl FnOnce() -> Vec<u64> + Send + 'static,
        source: Arc<dyn BulkSource>,
        rate: Option<u64>,
        loaded: Box<dyn FnOnce() + Send>,
        start: LoaderStart,
    ) -> Result<(), PagerError> {
        let sh = self.shared.clone();
        let go = match start {
            LoaderStart::Now => None,
            LoaderStart::Held => {
                let (tx, rx) = std::sync::mpsc::channel();
                self.loader_go = Some(tx);
                Some(rx)
            }
        };
        let t = crate::seccomp::spawn(
            crate::seccomp::Kind::Pager,
            "pager-prefetch".into(),
            move || {
                if go.is_some_and(|go| go.recv().is_err()) {
                    return; // the pager stopped first
                }
                if load(&sh, &order(), source.as_ref(), rate) {
                    loaded();
                }
            },
        )
        .map_err(PagerError::Thread)?;
        self.threads.push(t);
        Ok(())
    }

    /// Hand guest memory back to the kernel: stop the pager's threads and
    /// unregister every range from userfaultfd, so that a page nobody has
    /// touched yet is an ordinary zero-filled fault again, not a round trip
    /// through the pager (a guest touching 900 MiB of new memory after a
    /// prefetching restore took 40 s through the pager, 3.5-5 s after an
    /// eager one). Only for a pager without a budget whose source is fully
    /// loaded: from here on every page the source held is resident, and
    /// the rest are zeros. What the pager did, for the VM's report.
    pub fn release(mut self) -> Result<super::PagerStats, PagerError> {
        // Threads first: one that read a fault just before the unregister
        // would fail to place its page (the range is gone) and stop the VM.
        // A fault left unread meanwhile is woken by the unregister.
        self.stop();
        for r in &self.shared.ranges {
            self.shared
                .uffd
                .unregister(r.host, r.len)
                .map_err(|source| PagerError::Uffd {
                    what: "unregister guest memory",
                    source,
                })?;
        }
        self.shared.released.store(true, Ordering::Release);
        Ok(self.stats())
    }

    /// Guest-physical addresses of the pageable pages in the order the
    /// guest first touched them (a lazily restored or overcommitted VM's
    /// own hot set).
    pub fn first_touches(&self) -> Vec<u64> {
        let sh = &self.shared;
        sh.first_touch
            .locked()
            .iter()
            .map(|&p| sh.gpa_of(p as usize))
            .collect()
    }
}

/// The order to load `stored` (the ascending guest-physical addresses a
/// source holds) in: the block of [`BLOCK_PAGES`] around each page of
/// `hot` when that page comes up (each block ascending), then the blocks left,
/// ascending. A page in `hot` that `stored` lacks is left out.
pub fn block_order(hot: &[u64], stored: &[u64]) -> Vec<u64> {
    let block_bytes = BLOCK_PAGES * PAGE_SIZE;
    let block = |gpa: u64| gpa / block_bytes;
    // The index range of each block's pages in `stored`.
    let mut ranges = std::collections::HashMap::new();
    let mut i = 0;
    while i < stored.len() {
        let b = block(stored[i]);
        let end = i + stored[i..].partition_point(|&g| block(g) == b);
        ranges.insert(b, i..end);
        i = end;
    }
    let mut order = Vec::with_capacity(stored.len());
    let mut left: Vec<u64> = ranges.keys().copied().collect();
    left.sort_unstable();
    for b in hot.iter().map(|&g| block(g)).chain(left) {
        if let Some(r) = ranges.remove(&b) {
            order.extend_from_slice(&stored[r]);
        }
    }
    order
}

/// The next chunk of `order` from `*i`: pages still absent, sorted so that
/// neighbours form runs.
fn next_chunk(sh: &Shared, order: &[u64], i: &mut usize) -> Vec<u64> {
    let mut chunk = Vec::with_capacity(CHUNK_PAGES);
    while *i < order.len() && chunk.len() < CHUNK_PAGES {
        let gpa = order[*i];
        *i += 1;
        // Pages the guest gave up (a balloon) stay out: zeros on a touch.
        let absent = sh.page_of_gpa(gpa).is_some_and(|p| {
            sh.states[p].load(Ordering::Acquire) & STATE == ABSENT
                && !sh.dropped[p].load(Ordering::Acquire)
        });
        if absent {
            chunk.push(gpa);
        }
    }
    chunk.sort_unstable();
    chunk.dedup();
    chunk
}

/// Load `order`; whether every page of it is resident at the end (never
/// under a budget, where pages come and go).
fn load(sh: &Arc<Shared>, order: &[u64], source: &dyn BulkSource, rate: Option<u64>) -> bool {
    // At the fetch workers' priority: the guest's vCPUs would otherwise
    // take half the loader's CPU, while the guest's speed hangs on what
    // the loader has not placed yet (1 GiB guest, 64 MiB hot: 60-170 ms
    // to load at the default priority, 43-69 ms above it). A loader held
    // to a rate is meant to be gentle: it keeps the default.
    if rate.is_none() {
        super::workers::raise_priority();
    }
    let started = Instant::now();
    let budgeted = (sh.budget as usize) < sh.states.len();
    let mut loader = Loader {
        sh,
        placer: Placer::new(sh.clone()),
        source,
        rate,
        started,
        placed: 0,
        budgeted,
        pages: crate::memory::store::PageBufs::new(CHUNK_PAGES),
    };
    let mut todo = order.to_vec();
    let complete = loop {
        if !loader.pass(&todo) || budgeted {
            break false;
        }
        // A page a fetch worker had claimed for a demand fault was left
        // to it: wait until it is in (a release before that would drop
        // the worker's queued fetch and leave the page to the kernel's
        // zeros), and load whatever is still absent.
        todo.retain(|&g| {
            sh.page_of_gpa(g).is_some_and(|p| {
                let s = sh.states[p].load(Ordering::Acquire) & STATE;
                s != RESIDENT && !(s == ABSENT && sh.dropped[p].load(Ordering::Acquire))
            })
        });
        if todo.is_empty() {
            break true;
        }
        if sh.stop.load(Ordering::Acquire) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    sh.prefetch_done_us
        .store(started.elapsed().as_micros() as u64 + 1, Ordering::Release);
    complete
}

/// The loader's state across its passes over what is left.
struct Loader<'a> {
    sh: &'a Arc<Shared>,
    placer: Placer,
    source: &'a dyn BulkSource,
    rate: Option<u64>,
    started: Instant,
    placed: u64,
    budgeted: bool,
    pages: crate::memory::store::PageBufs,
}

impl Loader<'_> {
    /// One pass over `order`: false if it failed, was stopped, or (under
    /// a budget) filled it.
    fn pass(&mut self, order: &[u64]) -> bool {
        let sh = self.sh;
        let ps = PAGE_SIZE as usize;
        let buf = self.pages.bytes_mut();
        let mut i = 0usize;
        while i < order.len() {
            if sh.stop.load(Ordering::Acquire) {
                return false;
            }
            // Under a budget, what does not fit comes on demand; a tenth of
            // it is left for the guest's own faults, which would otherwise
            // evict what was just loaded.
            if self.budgeted && sh.resident.load(Ordering::Acquire) >= sh.budget - sh.budget / 10 {
                return false;
            }
            let chunk = next_chunk(sh, order, &mut i);
            if chunk.is_empty() {
                continue;
            }
            let out = &mut buf[..chunk.len() * ps];
            if let Err(e) = self.source.read_pages(&chunk, out) {
                sh.fail(format!(
                    "prefetching guest pages {:#x}-{:#x} from the snapshot failed: {e}",
                    chunk[0],
                    chunk[chunk.len() - 1]
                ));
                return false;
            }
            if let Err(e) = self.placer.place(&chunk, out) {
                sh.fail(format!(
                    "placing prefetched guest pages at {:#x} failed: {e}",
                    chunk[0]
                ));
                return false;
            }
            self.placed += chunk.len() as u64;
            if let Some(r) = self.rate.filter(|&r| r > 0) {
                let due = self.started + Duration::from_secs_f64(self.placed as f64 / r as f64);
                // In slices, so that stopping the pager is not held up.
                while !sh.stop.load(Ordering::Acquire) {
                    let left = due.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::sleep(left.min(Duration::from_millis(10)));
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = BLOCK_PAGES * PAGE_SIZE;

    #[test]
    fn hot_pages_bring_their_blocks_first_then_the_rest_ascending() {
        let stored: Vec<u64> = (0..4 * BLOCK_PAGES).map(|i| i * PAGE_SIZE).collect();
        let hot = [3 * BLOCK + 5 * PAGE_SIZE, BLOCK + PAGE_SIZE, 3 * BLOCK];
        let order = block_order(&hot, &stored);
        let blocks: Vec<u64> = order.iter().map(|g| g / BLOCK).collect();
        let n = BLOCK_PAGES as usize;
        assert_eq!(order.len(), stored.len(), "every stored page once");
        assert!(blocks[..n].iter().all(|&b| b == 3));
        assert!(blocks[n..2 * n].iter().all(|&b| b == 1));
        assert!(blocks[2 * n..3 * n].iter().all(|&b| b == 0));
        assert!(blocks[3 * n..].iter().all(|&b| b == 2));
        assert!(order[..n].windows(2).all(|w| w[0] + PAGE_SIZE == w[1]));
    }

    #[test]
    fn pages_the_source_lacks_are_never_ordered() {
        // Blocks 0 and 2 hold a page each; block 1 holds none.
        let stored = [PAGE_SIZE, 2 * BLOCK];
        let hot = [BLOCK + PAGE_SIZE, 2 * BLOCK + PAGE_SIZE];
        assert_eq!(block_order(&hot, &stored), vec![2 * BLOCK, PAGE_SIZE]);
        assert!(block_order(&hot, &[]).is_empty());
    }
}
