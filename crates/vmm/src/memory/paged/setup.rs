//! What a pager is made of before its threads start: guest memory above
//! the pinned boot area registered with userfaultfd (as 4 KiB pages), the
//! staging pages its workers evict through, and the state its threads
//! share. Each step's failure says which step it was.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, RwLock};

use hover_abi::layout::PAGE_SIZE;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::evict::EVICT_BATCH;
use super::zeroed::zeroed;
use super::{
    EvictMode, GuestRam, PageSource, PageStore, PagerError, PagingConfig, Range, Shared, Uffd,
    HIST_BUCKETS, WORKERS,
};

/// A userfaultfd step's failure, named.
pub(super) fn uffd_err(what: &'static str) -> impl Fn(io::Error) -> PagerError {
    move |source| PagerError::Uffd { what, source }
}

/// Register guest memory above `pinned_end` with `uffd` (write-protect
/// too, for `wp` eviction), without huge pages: its ranges and pages.
pub(super) fn register(
    uffd: &Uffd,
    ram: &GuestRam,
    pinned_end: u64,
    wp: bool,
) -> Result<(Vec<Range>, usize), PagerError> {
    let mut ranges = Vec::new();
    let mut pages = 0usize;
    for region in ram.memory().iter() {
        let (gpa, len) = (region.start_addr().0, region.len());
        let start = pinned_end.clamp(gpa, gpa + len);
        if start >= gpa + len {
            continue;
        }
        let host = region
            .get_host_address(MemoryRegionAddress(start - gpa))
            .map_err(|e| PagerError::Uffd {
                what: "find guest memory",
                source: io::Error::other(e.to_string()),
            })? as u64;
        let rlen = gpa + len - start;
        // SAFETY: advice on our own guest mapping; 4 KiB pages are what the pager moves.
        unsafe {
            libc::madvise(
                host as *mut libc::c_void,
                rlen as usize,
                libc::MADV_NOHUGEPAGE,
            )
        };
        uffd.register(host, rlen, wp)
            .map_err(uffd_err("register guest memory"))?;
        ranges.push(Range {
            host,
            len: rlen,
            gpa: start,
            first_page: pages,
        });
        pages += (rlen / PAGE_SIZE) as usize;
    }
    Ok((ranges, pages))
}

/// A batch of staging pages per worker, mapped without huge pages:
/// address and length.
pub(super) fn map_staging() -> Result<(u64, usize), PagerError> {
    // A batch of staging pages per worker, registered too (UFFDIO_MOVE's destination must be).
    let staging_len = WORKERS * EVICT_BATCH * PAGE_SIZE as usize;
    // SAFETY: a fresh anonymous mapping, checked below.
    let staging = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            staging_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if staging == libc::MAP_FAILED {
        return Err(PagerError::Uffd {
            what: "map staging pages",
            source: io::Error::last_os_error(),
        });
    }
    let staging = staging as u64;
    // SAFETY: as above.
    unsafe {
        libc::madvise(
            staging as *mut libc::c_void,
            staging_len,
            libc::MADV_NOHUGEPAGE,
        )
    };
    Ok((staging, staging_len))
}

/// The parts the shared state is made from.
pub(super) struct Parts {
    /// The userfaultfd guest memory is registered with.
    pub uffd: Uffd,
    /// How pages are evicted.
    pub evict_mode: EvictMode,
    /// The registered ranges.
    pub ranges: Vec<Range>,
    /// Pages in them.
    pub pages: usize,
    /// Pages that may be resident.
    pub budget: u64,
    /// Where evicted pages go, when any may be.
    pub store: Option<PageStore>,
    /// Where pages not yet here come from (a lazy restore, a post-copy).
    pub source: Option<Arc<dyn PageSource>>,
    /// Told when a page cannot be served.
    pub on_failure: Box<dyn Fn(String) + Send + Sync>,
}

impl Parts {
    /// The state the pager's threads share, every count at zero.
    pub(super) fn shared(self, config: &PagingConfig) -> Shared {
        let Parts {
            uffd,
            evict_mode,
            ranges,
            pages,
            budget,
            store,
            source,
            on_failure,
        } = self;
        Shared {
            uffd,
            evict_mode,
            ranges,
            states: zeroed(pages),
            stored: zeroed(pages),
            dropped: zeroed(pages),
            discarded: AtomicU64::new(0),
            discarded_stored: AtomicU64::new(0),
            crcs: zeroed(pages),
            fifo: Mutex::new(VecDeque::new()),
            in_fifo: zeroed(pages),
            busy: RwLock::new(()),
            source,
            source_reads: AtomicU64::new(0),
            pushed: AtomicU64::new(0),
            push_copies: AtomicU64::new(0),
            first_touch: Mutex::new(Vec::new()),
            prefetch_done_us: AtomicU64::new(0),
            released: AtomicBool::new(false),
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            resident: AtomicU64::new(0),
            budget,
            store,
            latency: config.store_latency,
            jitter: config.store_jitter,
            stop: AtomicBool::new(false),
            faults: AtomicU64::new(0),
            zero_fills: AtomicU64::new(0),
            store_reads: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            hist: [const { AtomicU64::new(0) }; HIST_BUCKETS],
            latency_sum_us: AtomicU64::new(0),
            on_failure,
        }
    }
}
