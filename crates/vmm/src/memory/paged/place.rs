//! Placing pages that arrive before the guest touches them.

use crate::sync::ReadWrite;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hover_abi::layout::PAGE_SIZE;

use super::{Shared, ABSENT, FETCHING};

/// Places pages that arrive before the guest asks for them (a post-copy
/// migration's background push): each run of pages contiguous in guest
/// memory and in the batch goes in with one `UFFDIO_COPY` (seed 3: the
/// per-page system call, not the copy, is what costs).
pub struct Placer {
    shared: Arc<Shared>,
}

impl Placer {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        Placer { shared }
    }

    /// Place the pages at `gpas`, whose contents follow one another in
    /// `data`. A page the pager is fetching already, or has, or that the
    /// budget has no room for is left out: the indices into `gpas` of
    /// those are returned, for the caller to keep where the page source
    /// finds them.
    pub fn place(&self, gpas: &[u64], data: &[u8]) -> io::Result<Vec<usize>> {
        let sh = &self.shared;
        let _busy = sh.busy.read_now();
        let ps = PAGE_SIZE as usize;
        let mut left = Vec::new();
        let mut i = 0;
        while i < gpas.len() {
            // Claim a run: pages next to each other in guest and host
            // memory, each ABSENT until claimed here.
            let mut run: Vec<usize> = Vec::new();
            while i < gpas.len() {
                let page = sh.page_of_gpa(gpas[i]);
                let joins = match (page, run.last()) {
                    (Some(p), Some(&last)) => {
                        p == last + 1 && sh.host_of(p) == sh.host_of(last) + PAGE_SIZE
                    }
                    (Some(_), None) => true,
                    (None, _) => false,
                };
                if !joins {
                    if run.is_empty() {
                        left.push(i);
                        i += 1;
                        continue;
                    }
                    break;
                }
                let p = page.expect("joins only with a page");
                let room = sh.resident.load(Ordering::Acquire) + (run.len() as u64) < sh.budget;
                // A page the guest gave up is not filled again: zeros on its touch.
                if room
                    && !sh.dropped[p].load(Ordering::Acquire)
                    && sh.states[p]
                        .compare_exchange(ABSENT, FETCHING, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                {
                    run.push(p);
                    i += 1;
                } else if run.is_empty() {
                    left.push(i);
                    i += 1;
                } else {
                    break;
                }
            }
            if run.is_empty() {
                continue;
            }
            let first = i - run.len();
            let src = data[first * ps..].as_ptr();
            let len = run.len() as u64 * PAGE_SIZE;
            if let Err(e) = sh.uffd.copy(sh.host_of(run[0]), src, len) {
                for &p in &run {
                    sh.states[p].store(ABSENT, Ordering::Release);
                }
                return Err(e);
            }
            sh.resident.fetch_add(run.len() as u64, Ordering::AcqRel);
            for &p in &run {
                sh.now_resident(p);
            }
            sh.pushed.fetch_add(run.len() as u64, Ordering::Relaxed);
            sh.push_copies.fetch_add(1, Ordering::Relaxed);
        }
        Ok(left)
    }
}
