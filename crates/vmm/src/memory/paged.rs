//! The pager: guest RAM larger than what the host gives it, or guest RAM
//! whose content arrives only when the guest touches it.
//!
//! The pageable part of guest RAM (everything above the guest image: the
//! boot area and the guest's own code, data and stacks are never evicted) is
//! registered with userfaultfd in MISSING mode. A fault thread reads fault
//! addresses and queues fetches; a pool of fetch workers serves them, so many
//! faults are in flight at once (KVM queues async page faults per vCPU):
//! - a page never touched comes from the [`PageSource`]: a snapshot file
//!   for a lazy restore (later: a migration connection), or zeros;
//! - a page evicted earlier is read back from the page store (after the
//!   configured extra latency, which models a slower device);
//! - before bringing a page in over the budget, the worker evicts the oldest
//!   resident pages (FIFO), a batch at a time (`evict`): `UFFDIO_MOVE` takes
//!   each out of guest RAM atomically (any access from then on faults and
//!   waits), the batch is written to the store with one submission and the
//!   moved pages are dropped. A store error puts the pages back and stops
//!   the VM: no access is ever served wrong data.
//!
//! - a page the guest gave up (a balloon; `discard`) leaves RAM and the
//!   store, and comes back as zeros.
//!
//! Page states: ABSENT (never touched) -> FETCHING -> RESIDENT -> EVICTING ->
//! STORED -> FETCHING -> ... A fault that arrives while its page is being
//! evicted marks it WANTED; the evictor queues its fetch when done.

use crate::sync::Locked;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;
use vmm_sys_util::eventfd::EventFd;

use super::store::{PageBuf, PageStore, StoreError};
pub use super::uffd::EvictMode;
use super::uffd::{open_for_pager, Uffd};
use super::GuestRam;
use workers::{fault_loop, start_workers, RawEventFd};

mod delay;
mod discard;
mod evict;
mod place;
mod prefetch;
mod setup;
mod source;
mod stats;
mod workers;
mod zeroed;

use evict::Evictor;

pub use discard::{Dropped, PagerDiscard};
pub use place::Placer;
pub use prefetch::{block_order, BulkSource, LoaderStart, BLOCK_PAGES};
pub use source::{PageContent, PageReader, PageSource};
pub use stats::PagerStats;

const ABSENT: u8 = 0;
// The state arrays start zeroed (`zeroed`): every page ABSENT.
const _: () = assert!(ABSENT == 0);
const RESIDENT: u8 = 1;
const FETCHING: u8 = 2;
const EVICTING: u8 = 3;
const STORED: u8 = 4;
const WANTED: u8 = 0x80;
const STATE: u8 = 0x7f;

/// Fetch workers: enough to keep many faults in flight (KVM allows 64 async
/// page faults per vCPU; beyond a few dozen the store is the bottleneck).
pub const WORKERS: usize = 16;
/// Resident pages a pageable region needs at the least (4 MiB).
pub const MIN_BUDGET_PAGES: u64 = 1024;
const HIST_BUCKETS: usize = 20;
/// Eviction attempts per page-in before going over budget instead.
const MAX_EVICT_ATTEMPTS: usize = 64;

/// How guest memory is overcommitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PagingConfig {
    /// Most guest RAM resident at once, in bytes (guest image included).
    pub budget: u64,
    /// Where evicted pages go (`None`: a temporary file).
    pub store: Option<PathBuf>,
    /// Extra delay on every read from the store.
    pub store_latency: Duration,
    /// A further delay on each read, uniformly random up to this much (a
    /// device whose latency varies; the pager stress uses it). Not kept in
    /// a snapshot: the host that restores decides.
    pub store_jitter: Duration,
    /// How pages leave guest RAM (`None`: `UFFDIO_MOVE` where the kernel
    /// has it, else write-protection).
    pub evict: Option<EvictMode>,
}

/// Why the pager could not start.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// The page store could not be set up.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// userfaultfd (with UFFDIO_MOVE) is not available or refused a call.
    #[error("cannot set up userfaultfd for guest memory ({what}): {source}; the pager needs Linux 5.7+ (6.8+ for --pager-evict move) and permission to use userfaultfd (vm.unprivileged_userfaultfd=1, or CAP_SYS_PTRACE)")]
    Uffd {
        /// The call that failed.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// A pager thread could not start.
    #[error("cannot start a pager thread: {0}")]
    Thread(io::Error),
}

/// A pageable range of host memory.
struct Range {
    host: u64,
    len: u64,
    gpa: u64,
    first_page: usize,
}

struct Shared {
    uffd: Uffd,
    /// How pages leave guest RAM.
    evict_mode: EvictMode,
    ranges: Vec<Range>,
    states: Vec<AtomicU8>,
    stored: Vec<AtomicBool>,
    /// Pages the guest gave up (`discard`): zeros when next touched, unless
    /// evicted again since (`stored` comes first).
    dropped: Vec<AtomicBool>,
    /// Pages dropped so far, and those of them whose store slot was freed.
    discarded: AtomicU64,
    discarded_stored: AtomicU64,
    /// CRC32 of each page as stored, checked when read back: a store that
    /// loses or changes data stops the VM instead of feeding the guest.
    crcs: Vec<std::sync::atomic::AtomicU32>,
    fifo: Mutex<VecDeque<u32>>,
    /// Whether a page has an entry in `fifo`: each page at most once, so
    /// pages dropped and fetched again (a balloon) do not grow it.
    in_fifo: Vec<AtomicBool>,
    /// Held (shared) by a worker serving a fault; held exclusively while
    /// guest memory is read for a snapshot, so no page moves meanwhile.
    busy: RwLock<()>,
    source: Option<Arc<dyn PageSource>>,
    source_reads: AtomicU64,
    pushed: AtomicU64,
    push_copies: AtomicU64,
    /// Pageable pages in the order the guest first touched them.
    first_touch: Mutex<Vec<u32>>,
    /// How long the prefetch loader took, once it is done (microseconds + 1).
    prefetch_done_us: AtomicU64,
    /// Set once guest memory is unregistered (`Pager::release`).
    released: AtomicBool,
    queue: Mutex<VecDeque<(u32, Instant)>>,
    queued: Condvar,
    resident: AtomicU64,
    budget: u64,
    /// `None` when the budget covers all pageable memory (nothing is evicted).
    store: Option<PageStore>,
    latency: Duration,
    jitter: Duration,
    stop: AtomicBool,
    faults: AtomicU64,
    zero_fills: AtomicU64,
    store_reads: AtomicU64,
    evictions: AtomicU64,
    retries: AtomicU64,
    hist: [AtomicU64; HIST_BUCKETS],
    latency_sum_us: AtomicU64,
    on_failure: Box<dyn Fn(String) + Send + Sync>,
}

/// The running pager; dropping it stops its threads.
pub struct Pager {
    shared: Arc<Shared>,
    wake: EventFd,
    threads: Vec<JoinHandle<()>>,
    staging: (u64, usize),
    /// Lets a held prefetch loader begin ([`Pager::let_loader_go`]);
    /// dropped, it ends a loader that never began.
    loader_go: Option<std::sync::mpsc::Sender<()>>,
}

impl Shared {
    fn page_of(&self, addr: u64) -> Option<usize> {
        self.ranges
            .iter()
            .find(|r| addr >= r.host && addr < r.host + r.len)
            .map(|r| r.first_page + ((addr - r.host) / PAGE_SIZE) as usize)
    }

    /// The range holding `page`, and the page's byte offset in it.
    fn locate(&self, page: usize) -> (&Range, u64) {
        let r = self
            .ranges
            .iter()
            .rev()
            .find(|r| page >= r.first_page)
            .expect("page in a range");
        (r, (page - r.first_page) as u64 * PAGE_SIZE)
    }

    fn host_of(&self, page: usize) -> u64 {
        let (r, off) = self.locate(page);
        r.host + off
    }

    fn page_of_gpa(&self, gpa: u64) -> Option<usize> {
        self.ranges
            .iter()
            .find(|r| gpa >= r.gpa && gpa < r.gpa + r.len)
            .map(|r| r.first_page + ((gpa - r.gpa) / PAGE_SIZE) as usize)
    }

    fn gpa_of(&self, page: usize) -> u64 {
        let (r, off) = self.locate(page);
        r.gpa + off
    }

    fn enqueue(&self, page: usize, at: Instant) {
        self.queue.locked().push_back((page as u32, at));
        self.queued.notify_one();
    }

    /// Tell the fetch workers to end. Set under the queue's lock: a worker
    /// checks `stop` and then waits with that lock held, so a flag set
    /// (and notified) between its check and its wait would be a lost
    /// wake-up, and joining it would hang for ever.
    fn halt(&self) {
        {
            let _q = self.queue.locked();
            self.stop.store(true, Ordering::Release);
        }
        self.queued.notify_all();
    }

    fn fail(&self, msg: String) {
        tracing::debug!("pager failure: {msg}");
        (self.on_failure)(msg);
    }

    /// `page` is (again) in guest RAM: mark it and queue it for eviction
    /// at the FIFO's end.
    fn now_resident(&self, page: usize) {
        self.states[page].store(RESIDENT, Ordering::Release);
        self.queue_for_eviction(page);
    }

    /// Put `page` at the FIFO's end unless it has an entry already (then
    /// it keeps its place: a page dropped and fetched again goes out a
    /// little early rather than the FIFO growing with every round trip).
    fn queue_for_eviction(&self, page: usize) {
        if !self.in_fifo[page].swap(true, Ordering::AcqRel) {
            self.fifo.locked().push_back(page as u32);
        }
    }

    /// A fault on `page`: fetch it unless that is under way already.
    /// `true`: the page was resident by the pager's account (the faulting
    /// thread is woken to find it).
    fn on_fault(&self, page: usize, at: Instant) -> bool {
        let st = &self.states[page];
        loop {
            let s = st.load(Ordering::Acquire);
            let next = match s & STATE {
                ABSENT | STORED => FETCHING,
                EVICTING if s & WANTED == 0 => s | WANTED,
                RESIDENT => {
                    // Fetched between the fault and now: make sure the
                    // faulting thread is not left waiting.
                    let _ = self.uffd.wake(self.host_of(page), PAGE_SIZE);
                    return true;
                }
                _ => return false,
            };
            if st
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if next == FETCHING {
                    // A page the guest gave up and touches again was
                    // recorded at its first touch already.
                    if s & STATE == ABSENT && !self.dropped[page].load(Ordering::Acquire) {
                        self.first_touch.locked().push(page as u32);
                    }
                    self.enqueue(page, at);
                }
                return false;
            }
        }
    }

    /// Bring `page` in (it is FETCHING and ours).
    fn fetch(&self, page: usize, since: Instant, buf: &mut PageBuf, ev: &Evictor) {
        // Count the page before making room for it: fetches running at
        // once each see the others' pages, so together they evict enough
        // (checking first and counting after, two workers could both find
        // one slot free and both take it: the budget overrun by one, seen
        // in a migration test). Bounded: if every resident page is
        // momentarily unmovable (EBUSY), bring this one in over budget
        // rather than spin.
        self.resident.fetch_add(1, Ordering::AcqRel);
        let mut attempts = 0;
        while self.resident.load(Ordering::Acquire) > self.budget
            && attempts < MAX_EVICT_ATTEMPTS
            && self.evict_batch(ev)
        {
            attempts += 1;
        }
        let from_store = self.stored[page].load(Ordering::Acquire);
        if from_store {
            let delay = self.latency + delay::jitter(self.jitter);
            if !delay.is_zero() {
                thread::sleep(delay);
            }
        }
        if let Err(e) = self.initial_or_stored(page, buf) {
            self.resident.fetch_sub(1, Ordering::AcqRel);
            // The faulting access stays blocked; the VM is stopped.
            self.fail(format!(
                "cannot read guest page {:#x}: {e}",
                self.gpa_of(page)
            ));
            return;
        }
        match self
            .uffd
            .copy(self.host_of(page), buf.0.as_ptr(), PAGE_SIZE)
        {
            Ok(_) => {
                self.now_resident(page);
            }
            Err(e) => {
                self.resident.fetch_sub(1, Ordering::AcqRel);
                self.fail(format!(
                    "cannot map guest page {:#x} (UFFDIO_COPY): {e}",
                    self.gpa_of(page)
                ));
                return;
            }
        }
        if from_store {
            let us = since.elapsed().as_micros() as u64;
            self.store_reads.fetch_add(1, Ordering::Relaxed);
            self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
            let bucket = if us == 0 {
                0
            } else {
                (64 - us.leading_zeros() as usize).min(HIST_BUCKETS - 1)
            };
            self.hist[bucket].fetch_add(1, Ordering::Relaxed);
        } else if self.source.is_none() {
            self.zero_fills.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Pager {
    /// Page guest RAM above `pinned_end` (guest-physical) under `config`,
    /// calling `on_failure` if a page cannot be served: guest memory
    /// registered, the store and the staging pages made (`setup.rs`),
    /// then the fault thread and its workers started.
    pub fn start(
        ram: &GuestRam,
        pinned_end: u64,
        config: &PagingConfig,
        source: Option<Arc<dyn PageSource>>,
        on_failure: Box<dyn Fn(String) + Send + Sync>,
    ) -> Result<Pager, PagerError> {
        let (uffd, evict_mode) =
            open_for_pager(config.evict).map_err(setup::uffd_err("open for the pager"))?;
        let (ranges, pages) = setup::register(
            &uffd,
            ram,
            pinned_end,
            evict_mode == EvictMode::WriteProtect,
        )?;
        let pinned_pages = pinned_end.div_ceil(PAGE_SIZE);
        let budget = (config.budget / PAGE_SIZE)
            .saturating_sub(pinned_pages)
            .max(1);
        let evictable = (pages as u64).saturating_sub(budget) * PAGE_SIZE;
        let store = if evictable > 0 {
            Some(PageStore::create(config.store.as_deref(), evictable)?)
        } else {
            None
        };
        let (staging, staging_len) = setup::map_staging()?;
        let shared = setup::Parts {
            uffd,
            evict_mode,
            ranges,
            pages,
            budget,
            store,
            source,
            on_failure,
        }
        .shared(config);
        let mut pager = Pager {
            shared: Arc::new(shared),
            wake: EventFd::new(libc::EFD_NONBLOCK).map_err(PagerError::Thread)?,
            threads: Vec::new(),
            staging: (staging, staging_len),
            loader_go: None,
        };
        // UFFDIO_MOVE's destination must be registered; a write-protect
        // eviction copies into the staging pages, which must not fault.
        if evict_mode == EvictMode::Move {
            pager
                .shared
                .uffd
                .register_missing(staging, staging_len as u64)
                .map_err(setup::uffd_err("register staging pages"))?;
        }
        let sh = pager.shared.clone();
        let wake = RawEventFd(pager.wake.as_raw_fd());
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        pager.threads.push(
            crate::seccomp::spawn(
                crate::seccomp::Kind::Pager,
                "pager-faults".into(),
                move || {
                    // The workers are started here, under this thread's
                    // filter, and end (stop) before it does.
                    let workers = start_workers(&sh, staging, started_tx);
                    if !workers.0.is_empty() {
                        fault_loop(sh, wake);
                    }
                },
            )
            .map_err(PagerError::Thread)?,
        );
        // Until a worker runs a fault could wait with nobody to serve it
        // (a restore touches guest memory before its vCPUs run): without
        // one the pager does not start (dropped, it stops what began).
        started_rx
            .recv()
            .unwrap_or_else(|_| {
                Err(io::Error::other(
                    "the pager's fault thread ended at its start",
                ))
            })
            .map_err(PagerError::Thread)?;
        tracing::debug!(pages, budget, evict = evict_mode.name(), store = ?pager.shared.store.as_ref().map(|s| s.path().to_path_buf()), "pager started");
        Ok(pager)
    }

    /// What the pager has done so far.
    pub fn stats(&self) -> PagerStats {
        self.shared.stats()
    }

    /// A handle that places pages pushed ahead of the guest's touch.
    pub fn placer(&self) -> Placer {
        Placer::new(self.shared.clone())
    }

    /// A handle that drops pages the guest gave up (the balloon's).
    pub fn discarder(&self) -> PagerDiscard {
        PagerDiscard::new(self.shared.clone())
    }

    /// A way to read [`Pager::stats`] from another thread while the pager runs.
    pub fn stats_source(&self) -> impl Fn() -> PagerStats + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.stats()
    }
}

impl Drop for Pager {
    fn drop(&mut self) {
        self.stop();
        // SAFETY: unmapping the staging pages we mapped; no thread uses them now.
        unsafe { libc::munmap(self.staging.0 as *mut libc::c_void, self.staging.1) };
    }
}

/// For the pager's tests: whether userfaultfd serves here (with `CI` set
/// it must; otherwise the test is skipped, saying why).
#[cfg(test)]
fn usable_for_test() -> bool {
    match super::uffd::pager_usable() {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but userfaultfd is refused: {e}"
            );
            eprintln!("skipping: userfaultfd refused: {e}");
            false
        }
    }
}

/// For the pager's tests: a budget of `budget` bytes, a temporary store,
/// no added latency.
#[cfg(test)]
fn test_config(budget: u64, evict: Option<EvictMode>) -> PagingConfig {
    PagingConfig {
        budget,
        store: None,
        store_latency: Duration::ZERO,
        store_jitter: Duration::ZERO,
        evict,
    }
}
