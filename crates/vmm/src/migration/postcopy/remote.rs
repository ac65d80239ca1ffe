//! The pages of a post-copy still at the source, as the destination's
//! pager sees them ([`RemotePages`], its page source): a page still missing
//! is asked for over the connection (a REQUEST frame) and the fetch waits
//! for it; pages that arrive are placed in guest memory or kept for a
//! waiting fetch. The receiving side (`incoming.rs`) feeds it.

use crate::sync::{wait_timeout, Locked};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;

use super::{page_hash, LatencyHist, PostcopyReport};
use crate::memory::paged::{PageSource, Placer};
use crate::memory::store::PageBuf;
use crate::migration::message::{Message, Request};
use crate::migration::page_lists::PageListError;
use crate::migration::received::ReceivedPages;
use crate::migration::transport::Conn;
use crate::migration::wire::FrameWriter;

/// This host failed taking in pages that arrived: the destination's
/// trouble, not the stream's.
#[derive(Debug, thiserror::Error)]
pub enum ArriveError {
    /// Placing them in guest memory failed.
    #[error("placing pushed pages (UFFDIO_COPY): {0}")]
    Place(io::Error),
    /// Keeping one for a waiting fetch failed.
    #[error("keeping page {gpa:#x}: {source}")]
    Keep {
        /// The page.
        gpa: u64,
        /// The OS error.
        source: io::Error,
    },
}

/// How long a demanded page may take while the connection is up.
pub const DEFAULT_PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The connection as the fetches share it.
pub(super) struct Link {
    pub(super) writer: Option<FrameWriter<Conn>>,
    /// Bumped on each new connection: a fetch waiting across one asks again.
    epoch: u64,
    /// Set once the stream proved bad: every fetch fails from then on.
    failed: Option<String>,
}

/// Guest pages of a post-copy migration, by guest-physical address: kept
/// here (`local`), or still at the source (`pending`).
pub struct RemotePages {
    local: ReceivedPages,
    pending: Vec<AtomicBool>,
    remaining: AtomicU64,
    pub(super) link: Mutex<Link>,
    arrived: Condvar,
    timeout: Duration,
    demand: AtomicU64,
    requests: AtomicU64,
    latency: LatencyHist,
}

impl RemotePages {
    /// Pages below `end`, those held so far in `local`.
    pub fn new(local: ReceivedPages, end: u64, timeout: Duration) -> Self {
        RemotePages {
            local,
            pending: (0..end / PAGE_SIZE)
                .map(|_| AtomicBool::new(false))
                .collect(),
            remaining: AtomicU64::new(0),
            link: Mutex::new(Link {
                writer: None,
                epoch: 0,
                failed: None,
            }),
            arrived: Condvar::new(),
            timeout,
            demand: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            latency: LatencyHist::default(),
        }
    }

    /// Keep a page that arrived before the switch (a pre-copy round).
    pub fn keep(&self, gpa: u64, page: &[u8]) -> io::Result<()> {
        self.local.write(gpa, page)
    }

    /// The pages at `gpas` are at the source from now on (those kept here
    /// are stale).
    pub fn mark_pending(&self, gpas: &[u64]) -> Result<(), PageListError> {
        for &g in gpas {
            let slot = self
                .pending
                .get((g / PAGE_SIZE) as usize)
                .ok_or(PageListError::OutsideMemory(g))?;
            if !slot.swap(true, Ordering::AcqRel) {
                self.remaining.fetch_add(1, Ordering::AcqRel);
            }
        }
        Ok(())
    }

    /// Pages still at the source.
    pub fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Acquire)
    }

    /// Whether the page at `gpa` is still at the source.
    pub fn is_pending(&self, gpa: u64) -> bool {
        self.pending
            .get((gpa / PAGE_SIZE) as usize)
            .is_some_and(|p| p.load(Ordering::Acquire))
    }

    /// The order-free hash ([`page_hash`]) of the pages held here and not
    /// at the source: the memory image's part that came before the switch.
    pub fn held_hash(&self) -> io::Result<u64> {
        let mut buf = PageBuf::new();
        let mut sum = 0u64;
        for g in self.local.held() {
            if !self.is_pending(g) && self.local.read(g, &mut buf)? {
                sum = sum.wrapping_add(page_hash(g, &buf.0));
            }
        }
        Ok(sum)
    }

    /// Fill `buf` with the page at `gpa` held here; `Ok(false)`: zeros.
    fn held(&self, gpa: u64, buf: &mut PageBuf) -> io::Result<bool> {
        self.local.read(gpa, buf)
    }

    pub(super) fn pending_gpas(&self) -> Vec<u64> {
        (0..self.pending.len())
            .filter(|&i| self.pending[i].load(Ordering::Acquire))
            .map(|i| i as u64 * PAGE_SIZE)
            .collect()
    }

    pub(super) fn set_writer(&self, w: Option<FrameWriter<Conn>>) {
        let mut l = self.link.locked();
        if w.is_some() {
            l.epoch += 1;
        }
        l.writer = w;
        self.arrived.notify_all();
    }

    /// Make every fetch fail from now on (the stream is bad).
    pub fn fail(&self, why: &str) {
        let mut l = self.link.locked();
        l.failed.get_or_insert_with(|| why.to_string());
        self.arrived.notify_all();
    }

    /// Take in a batch the source pushed or was asked for: placed in guest
    /// memory where the pager lets it, kept here for a waiting fetch
    /// otherwise. Every page must be one still missing.
    pub(super) fn arrive(
        &self,
        gpas: &[u64],
        data: &[u8],
        placer: &Placer,
    ) -> Result<(), ArriveError> {
        let ps = PAGE_SIZE as usize;
        let left = placer.place(gpas, data).map_err(ArriveError::Place)?;
        for &i in &left {
            self.local
                .write(gpas[i], &data[i * ps..(i + 1) * ps])
                .map_err(|source| ArriveError::Keep {
                    gpa: gpas[i],
                    source,
                })?;
        }
        let _l = self.link.locked();
        for &g in gpas {
            self.pending[(g / PAGE_SIZE) as usize].store(false, Ordering::Release);
        }
        self.remaining
            .fetch_sub(gpas.len() as u64, Ordering::AcqRel);
        self.arrived.notify_all();
        Ok(())
    }

    /// Every page of a batch must be one still missing here (not sent
    /// twice, inside guest memory, among those the source listed).
    pub fn check_arrivals(&self, gpas: &[u64]) -> Result<(), PageListError> {
        let mut seen = std::collections::HashSet::new();
        for &g in gpas {
            if !self.is_pending(g) || !seen.insert(g) {
                return Err(PageListError::NotMissing(g));
            }
        }
        Ok(())
    }

    /// Cut the link (a page overdue, or the stream bad): the receiving
    /// side sees it and waits for a recovery.
    pub(super) fn drop_link(&self) {
        let mut l = self.link.locked();
        if let Some(w) = l.writer.take() {
            w.get_ref().shutdown();
        }
        self.arrived.notify_all();
    }

    /// What the fetches saw.
    pub(super) fn fill_report(&self, r: &mut PostcopyReport) {
        r.demand_pages = self.demand.load(Ordering::Relaxed);
        r.requests = self.requests.load(Ordering::Relaxed);
        (r.fault_p50_us, r.fault_p99_us, r.fault_max_us) = self.latency.percentiles();
    }
}

/// Once every page has arrived, the pages held here since before the
/// switch (a hybrid's pre-copy rounds) are loaded into guest memory like a
/// snapshot's, so that the pager can let go of it.
impl crate::memory::paged::BulkSource for RemotePages {
    fn read_pages(&self, gpas: &[u64], out: &mut [u8]) -> io::Result<()> {
        let mut buf = PageBuf::new();
        for (&g, page) in gpas.iter().zip(out.chunks_exact_mut(PAGE_SIZE as usize)) {
            if self.is_pending(g) {
                return Err(io::Error::other(format!("page {g:#x} has not arrived")));
            }
            if self.held(g, &mut buf)? {
                page.copy_from_slice(&buf.0);
            } else {
                page.fill(0);
            }
        }
        Ok(())
    }
}

impl RemotePages {
    /// Every page kept here since it came: some were placed in guest
    /// memory since (a newer copy arrived and went in directly; the loader
    /// skips pages already in place), the rest only here.
    pub fn held_pages(&self) -> Vec<u64> {
        self.local.held()
    }
}

impl PageSource for RemotePages {
    fn read(&self, gpa: u64, buf: &mut PageBuf) -> io::Result<bool> {
        if !self.is_pending(gpa) {
            return self.held(gpa, buf);
        }
        let t0 = Instant::now();
        self.demand.fetch_add(1, Ordering::Relaxed);
        let mut l = self.link.locked();
        let mut asked_in = None;
        let mut deadline = t0 + self.timeout;
        while self.is_pending(gpa) {
            if let Some(f) = &l.failed {
                return Err(io::Error::other(format!(
                    "page {gpa:#x} will not arrive: {f}"
                )));
            }
            if asked_in != Some(l.epoch) {
                if let Some(w) = l.writer.as_mut() {
                    // A broken connection shows on the reading side too.
                    if w.send(&Message::Request(Request::of(&[gpa]))).is_ok() {
                        self.requests.fetch_add(1, Ordering::Relaxed);
                        asked_in = Some(l.epoch);
                        deadline = Instant::now() + self.timeout;
                    }
                }
            }
            let now = Instant::now();
            let connected = l.writer.is_some();
            if connected && asked_in.is_some() && now >= deadline {
                // The source holds the page still: a new connection will
                // bring it. Cut this one; the receiver waits for the next.
                tracing::error!(
                    "post-copy: page {gpa:#x} did not arrive within {} of asking for it; dropping the link",
                    crate::config::duration_text(self.timeout)
                );
                if let Some(w) = l.writer.take() {
                    w.get_ref().shutdown();
                }
                self.arrived.notify_all();
                continue;
            }
            // Waiting for a reconnect is not bounded: nothing is lost as
            // long as the source keeps the page.
            let wait = if connected {
                deadline
                    .saturating_duration_since(now)
                    .max(Duration::from_millis(1))
            } else {
                Duration::from_secs(1)
            };
            l = wait_timeout(&self.arrived, l, wait).0;
        }
        drop(l);
        self.latency.record(t0.elapsed());
        self.held(gpa, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::wire::FrameReader;

    fn pages(n: u64) -> RemotePages {
        let store = ReceivedPages::create(Some(&std::env::temp_dir()), n * PAGE_SIZE).unwrap();
        RemotePages::new(store, n * PAGE_SIZE, Duration::from_millis(50))
    }

    #[test]
    fn only_missing_pages_may_arrive_once_each() {
        let ps = PAGE_SIZE;
        let r = pages(8);
        r.mark_pending(&[2 * ps, 3 * ps]).unwrap();
        assert_eq!(r.remaining(), 2);
        assert!(r.check_arrivals(&[2 * ps, 3 * ps]).is_ok());
        assert!(
            r.check_arrivals(&[2 * ps, 2 * ps]).is_err(),
            "twice in a batch"
        );
        assert!(r.check_arrivals(&[4 * ps]).is_err(), "never listed");
        assert!(
            r.check_arrivals(&[64 * ps]).is_err(),
            "outside guest memory"
        );
        assert!(r.mark_pending(&[64 * ps]).is_err());
    }

    #[test]
    fn an_overdue_page_drops_the_link_and_the_fetch_waits_on() {
        use std::io::Read;
        use std::os::unix::net::UnixStream;
        let ps = PAGE_SIZE;
        let r = std::sync::Arc::new(pages(8));
        r.mark_pending(&[2 * ps]).unwrap();
        let (ours, mut source) = UnixStream::pair().unwrap();
        r.set_writer(Some(FrameWriter::new(Conn::Unix(ours))));
        let fetch = {
            let r = r.clone();
            std::thread::spawn(move || r.read(2 * ps, &mut PageBuf::new()))
        };
        // The source sees the request, then (50 ms on, nothing sent) the
        // link closed by the destination.
        let mut got = Vec::new();
        source.read_to_end(&mut got).unwrap();
        let mut f = FrameReader::new(&got[..]);
        let Message::Request(req) = f.message().unwrap().message else {
            panic!("not a request")
        };
        assert_eq!(req.pages(8 * ps).unwrap(), vec![2 * ps]);
        // The fetch is still waiting (for a recovery), not failed.
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !fetch.is_finished(),
            "an overdue page must not fail the fetch"
        );
        r.fail("given up");
        assert!(fetch.join().unwrap().is_err());
    }

    #[test]
    fn held_pages_are_served_and_stale_ones_are_not() {
        let ps = PAGE_SIZE;
        let r = pages(8);
        r.keep(ps, &[5u8; 4096]).unwrap();
        r.keep(2 * ps, &[6u8; 4096]).unwrap();
        // Page 2 was dirtied after it was sent: its copy here is stale.
        r.mark_pending(&[2 * ps]).unwrap();
        let mut buf = PageBuf::new();
        assert!(r.read(ps, &mut buf).unwrap());
        assert!(buf.0.iter().all(|&b| b == 5));
        assert!(!r.read(3 * ps, &mut buf).unwrap(), "never sent: zeros");
        assert_eq!(r.held_hash().unwrap(), page_hash(ps, &[5u8; 4096]));
        // With the stream failed, a fetch of a remote page errs, never
        // returning the stale copy.
        r.fail("test");
        let e = r.read(2 * ps, &mut buf).unwrap_err();
        assert!(e.to_string().contains("will not arrive"), "{e}");
    }
}
