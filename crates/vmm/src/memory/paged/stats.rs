//! What the pager reports.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::Shared;

/// What the pager did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PagerStats {
    /// Pages the budget allows in the pageable region.
    pub budget_pages: u64,
    /// Pages in the pageable region: guest memory less the pinned boot
    /// area and guest image. A budget at least this large is no budget (a
    /// lazy restore's or a post-copy destination's pager).
    pub pageable_pages: u64,
    /// Pageable pages resident now.
    pub resident_pages: u64,
    /// Page faults reported by userfaultfd (repeats included).
    pub faults: u64,
    /// First touches served with a zero page.
    pub zero_fills: u64,
    /// Pages read back from the store.
    pub store_reads: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Pages written to the store.
    pub writebacks: u64,
    /// Evictions retried because the kernel could not move the page then.
    pub eviction_retries: u64,
    /// Fetch latency from fault to page in place, for pages read from the
    /// store: bucket 0 < 1 us, bucket k in [2^(k-1), 2^k) us, last: larger.
    pub fetch_latency_hist_us: Vec<u64>,
    /// Mean of the above, microseconds.
    pub fetch_latency_avg_us: f64,
    /// Whether the store bypasses the page cache (O_DIRECT).
    pub store_direct: bool,
    /// How pages leave guest RAM: `move` (UFFDIO_MOVE, Linux 6.8+) or
    /// `write-protect` (UFFDIO_WRITEPROTECT and MADV_DONTNEED, 5.7+).
    pub evict_mode: &'static str,
    /// Pages read from the page source (a snapshot file on a lazy restore).
    pub source_reads: u64,
    /// Pages placed before the guest touched them (pushed by a post-copy
    /// source, or loaded by a prefetching restore), and the `UFFDIO_COPY`
    /// calls that placed them.
    pub pushed_pages: u64,
    /// See `pushed_pages`.
    pub push_copies: u64,
    /// A prefetching restore's loader: how long it took to place the pages
    /// it was given, milliseconds (`None`: none ran, or it is still running).
    pub prefetch_ms: Option<f64>,
    /// Pages dropped because the guest gave them up (a balloon).
    pub discarded_pages: u64,
    /// Of those, pages that were in the page store (their slots freed).
    pub discarded_stored_pages: u64,
    /// Guest memory was handed back to the kernel once the prefetch had
    /// loaded it all (no budget): these figures stopped there.
    pub released: bool,
}

impl Shared {
    pub(super) fn stats(&self) -> PagerStats {
        let sh = self;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let reads = load(&sh.store_reads);
        PagerStats {
            budget_pages: sh.budget,
            pageable_pages: sh.states.len() as u64,
            released: sh.released.load(Ordering::Acquire),
            resident_pages: load(&sh.resident),
            faults: load(&sh.faults),
            zero_fills: load(&sh.zero_fills),
            store_reads: reads,
            evictions: load(&sh.evictions),
            writebacks: load(&sh.evictions),
            eviction_retries: load(&sh.retries),
            fetch_latency_hist_us: sh.hist.iter().map(load).collect(),
            fetch_latency_avg_us: if reads == 0 {
                0.0
            } else {
                load(&sh.latency_sum_us) as f64 / reads as f64
            },
            store_direct: sh.store.as_ref().is_some_and(|s| s.is_direct()),
            evict_mode: sh.evict_mode.name(),
            source_reads: load(&sh.source_reads),
            pushed_pages: load(&sh.pushed),
            discarded_pages: load(&sh.discarded),
            discarded_stored_pages: load(&sh.discarded_stored),
            push_copies: load(&sh.push_copies),
            prefetch_ms: match load(&sh.prefetch_done_us) {
                0 => None,
                us => Some((us - 1) as f64 / 1e3),
            },
        }
    }
}
