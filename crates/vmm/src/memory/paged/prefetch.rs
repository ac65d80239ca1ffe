//! A prefetching restore's loader: while the guest runs, a background
//! thread fills the rest of guest memory from the page source in large
//! copies (one `UFFDIO_COPY` per run of pages contiguous in guest memory,
//! read with one `pread` per run contiguous in the file), in the order it
//! is given: the hot set first, then everything else.
//!
//! Demand faults never wait behind it: the loader reads a chunk without
//! claiming any page, and claims a run (ABSENT -> FETCHING) only for the
//! `UFFDIO_COPY` itself (at most [`CHUNK_PAGES`] pages). A page the guest
//! touches first is served by the pager's fetch workers as on a lazy
//! restore, and the loader then leaves it out. Under a memory budget the
//! loader is given only the hot set and stops at nine tenths of the
//! budget: the rest comes on demand.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;

use super::{Pager, PagerError, Placer, Shared, ABSENT, STATE};

/// Pages read and placed at a time (1 MiB).
pub const CHUNK_PAGES: usize = 256;

/// A page source that reads many pages at once (a snapshot file).
pub trait BulkSource: Send + Sync {
    /// Fill `out` with the pages at `gpas`, a page each, in order.
    fn read_pages(&self, gpas: &[u64], out: &mut [u8]) -> io::Result<()>;
}

impl Pager {
    /// Start loading the pages at `order` from `source` in the background,
    /// at most `rate` pages a second (`None`: as fast as it goes). The
    /// pager's `stop` ends the loader too.
    pub fn prefetch(
        &mut self,
        order: Vec<u64>,
        source: Arc<dyn BulkSource>,
        rate: Option<u64>,
    ) -> Result<(), PagerError> {
        let sh = self.shared.clone();
        let t = crate::seccomp::spawn(
            crate::seccomp::Kind::Pager,
            "pager-prefetch".into(),
            move || load(&sh, &order, source.as_ref(), rate),
        )
        .map_err(PagerError::Thread)?;
        self.threads.push(t);
        Ok(())
    }

    /// Guest-physical addresses of the pageable pages in the order the
    /// guest first touched them (a lazily restored or overcommitted VM's
    /// own hot set).
    pub fn first_touches(&self) -> Vec<u64> {
        let sh = &self.shared;
        sh.first_touch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|&p| sh.gpa_of(p as usize))
            .collect()
    }
}

/// The next chunk of `order` from `*i`: pages still absent, sorted so that
/// neighbours form runs.
fn next_chunk(sh: &Shared, order: &[u64], i: &mut usize) -> Vec<u64> {
    let mut chunk = Vec::with_capacity(CHUNK_PAGES);
    while *i < order.len() && chunk.len() < CHUNK_PAGES {
        let gpa = order[*i];
        *i += 1;
        let absent = sh
            .page_of_gpa(gpa)
            .is_some_and(|p| sh.states[p].load(Ordering::Acquire) & STATE == ABSENT);
        if absent {
            chunk.push(gpa);
        }
    }
    chunk.sort_unstable();
    chunk.dedup();
    chunk
}

fn load(sh: &Arc<Shared>, order: &[u64], source: &dyn BulkSource, rate: Option<u64>) {
    let started = Instant::now();
    let placer = Placer::new(sh.clone());
    let ps = PAGE_SIZE as usize;
    let mut buf = vec![0u8; CHUNK_PAGES * ps];
    let (mut i, mut placed) = (0usize, 0u64);
    while i < order.len() && !sh.stop.load(Ordering::Acquire) {
        // Under a budget, what does not fit comes on demand; a tenth of
        // it is left for the guest's own faults, which would otherwise
        // evict what was just loaded.
        if sh.resident.load(Ordering::Acquire) >= sh.budget - sh.budget / 10 {
            break;
        }
        let chunk = next_chunk(sh, order, &mut i);
        if chunk.is_empty() {
            continue;
        }
        let out = &mut buf[..chunk.len() * ps];
        if let Err(e) = source.read_pages(&chunk, out) {
            sh.fail(format!(
                "prefetching guest pages {:#x}-{:#x} from the snapshot failed: {e}",
                chunk[0],
                chunk[chunk.len() - 1]
            ));
            break;
        }
        if let Err(e) = placer.place(&chunk, out) {
            sh.fail(format!(
                "placing prefetched guest pages at {:#x} failed: {e}",
                chunk[0]
            ));
            break;
        }
        placed += chunk.len() as u64;
        if let Some(r) = rate.filter(|&r| r > 0) {
            let due = started + Duration::from_secs_f64(placed as f64 / r as f64);
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
    sh.prefetch_done_us
        .store(started.elapsed().as_micros() as u64 + 1, Ordering::Release);
}
