//! The pager's threads: the fault reader and the fetch workers.

use crate::sync::{Locked, ReadWrite};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use hover_abi::layout::PAGE_SIZE;

use super::evict::{Evictor, EVICT_BATCH};
use super::{PageBuf, Shared, WORKERS};

/// A page that faults this many times in a row, with no other fault
/// between, while the pager holds it resident is a fault the pager cannot
/// serve (its account and the page tables disagree): the VM is stopped,
/// naming the page, rather than the fault thread spinning on it for ever
/// (seen once in CI, 2026-11-25). A resident page's fault is otherwise a
/// race (the fault was read after the page was placed) and comes once.
const STUCK_FAULTS: u32 = 100_000;

pub(super) fn fault_loop(sh: Arc<Shared>, wake: RawEventFd) {
    raise_priority();
    let mut addrs = Vec::new();
    // The page that last faulted while resident, and how many times in a row.
    let mut stuck = (usize::MAX, 0u32);
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sh.uffd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake.0,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds; the result is checked.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        if rc < 0 {
            continue;
        }
        addrs.clear();
        if let Err(e) = sh.uffd.read_faults(&mut addrs) {
            sh.fail(format!(
                "reading guest page faults from userfaultfd failed: {e}"
            ));
            return;
        }
        let now = Instant::now();
        sh.faults.fetch_add(addrs.len() as u64, Ordering::Relaxed);
        for &a in &addrs {
            match sh.page_of(a) {
                Some(p) => {
                    let resident = sh.on_fault(p, now);
                    // Only an unbroken run counts: any other page's fault,
                    // or this page's while it is not placed (an eviction
                    // and refetch of a hot page), starts it again.
                    stuck = match (resident, stuck.0 == p) {
                        (true, true) => (p, stuck.1 + 1),
                        (true, false) => (p, 1),
                        (false, _) => (usize::MAX, 0),
                    };
                    if stuck.1 >= STUCK_FAULTS {
                        sh.fail(format!(
                            "the guest keeps faulting on a page the pager has placed \
                             ({} times in a row, no other fault between; {}): stopping the VM",
                            stuck.1,
                            describe(&sh, p)
                        ));
                        return;
                    }
                }
                None => {
                    tracing::warn!("userfaultfd fault at {a:#x}, outside pageable guest memory")
                }
            }
        }
    }
}

/// What the kernel and the pager each say of `page`, for a failure
/// message about it.
fn describe(sh: &Shared, page: usize) -> String {
    let mut v = [0u8; 1];
    // SAFETY: mincore reads the page tables of one page of our own
    // mapping and writes one byte into `v`.
    let rc = unsafe {
        libc::mincore(
            sh.host_of(page) as *mut libc::c_void,
            PAGE_SIZE as usize,
            v.as_mut_ptr(),
        )
    };
    let kernel = match rc {
        0 if v[0] & 1 != 0 => "in memory",
        0 => "not in memory",
        _ => "unknown (mincore failed)",
    };
    format!(
        "guest page {:#x}: pager state {}, stored copy {}, kernel: {kernel}",
        sh.gpa_of(page),
        sh.states[page].load(Ordering::Acquire),
        sh.stored[page].load(Ordering::Acquire),
    )
}

/// Pager threads run ahead of vCPU threads: a page-in is short work that a
/// vCPU (or a whole guest) is waiting for, and with async page faults the
/// vCPU threads keep their host CPUs busy meanwhile. Without this, on a host
/// with few CPUs every step of a page-in waits for a scheduler slot.
pub(super) fn raise_priority() {
    // SAFETY: setpriority on this thread (a tid is a valid PRIO_PROCESS id
    // on Linux); failure (no permission) just leaves the default priority.
    let rc =
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, PAGER_NICE) };
    if rc != 0 {
        tracing::debug!(
            "pager thread keeps its priority: {}",
            io::Error::last_os_error()
        );
    }
}

/// Nice value of the pager's threads.
const PAGER_NICE: i32 = -10;

pub(super) fn worker_loop(sh: Arc<Shared>, staging: u64) {
    raise_priority();
    let evictor = Evictor::new(staging);
    // Sleeps model device latency; Linux's default 50 us timer slack would add to each.
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and affects only this thread.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    let mut buf = PageBuf::new();
    loop {
        let item = {
            let mut q = sh.queue.locked();
            loop {
                if sh.stop.load(Ordering::Acquire) {
                    return;
                }
                if let Some(item) = q.pop_front() {
                    break item;
                }
                q = crate::sync::wait(&sh.queued, q);
            }
        };
        let _busy = sh.busy.read_now();
        sh.fetch(item.0 as usize, item.1, &mut buf, &evictor);
    }
}

#[derive(Clone, Copy)]
pub(super) struct RawEventFd(pub(super) i32);

/// The fetch workers, each with its own staging pages, joined when dropped
/// (after `stop`; also if the fault thread unwinds, so that none outlives
/// the staging pages).
pub(super) struct Workers(pub(super) Vec<JoinHandle<()>>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in self.0.drain(..) {
            let _ = w.join();
        }
    }
}

/// Start the fetch workers (from the fault thread, whose filter they
/// inherit). `first` hears once the first one runs (or could not start):
/// from then on every fault is served. A later one that cannot start stops
/// the VM with a message (the pager serves on with fewer meanwhile).
pub(super) fn start_workers(
    sh: &Arc<Shared>,
    staging: u64,
    first: std::sync::mpsc::Sender<io::Result<()>>,
) -> Workers {
    let mut workers = Workers(Vec::with_capacity(WORKERS));
    for i in 0..WORKERS {
        let w = sh.clone();
        let page = staging + (i * EVICT_BATCH) as u64 * PAGE_SIZE;
        match crate::seccomp::spawn_member(
            crate::seccomp::Kind::Pager,
            format!("pager-{i}"),
            move || worker_loop(w, page),
        ) {
            Ok(t) => {
                workers.0.push(t);
                if i == 0 {
                    let _ = first.send(Ok(()));
                }
            }
            Err(e) if i == 0 => {
                let _ = first.send(Err(e));
                break;
            }
            Err(e) => {
                sh.fail(format!("cannot start pager worker {i} of {WORKERS}: {e}"));
                break;
            }
        }
    }
    workers
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::super::{Pager, RESIDENT};
    use crate::memory::{GuestRam, MemoryBackend};

    /// A page the pager believes placed but the kernel does not have
    /// (the disagreement behind a fault thread seen spinning once) stops
    /// the VM with a message naming it, instead of faulting for ever.
    #[test]
    fn a_resident_page_that_keeps_faulting_stops_the_vm() {
        if !super::super::usable_for_test() {
            return;
        }
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let config = super::super::test_config(1 << 20, None);
        let on_failure = Box::new(move |m: String| {
            let _ = tx.lock().unwrap().send(m);
        });
        let pager = Pager::start(&ram, 0, &config, None, on_failure).unwrap();
        // The pager's account says resident; the page tables say missing.
        pager.shared.states[0].store(RESIDENT, std::sync::atomic::Ordering::Release);
        let host = pager.shared.host_of(0) as usize;
        let toucher = std::thread::spawn(move || {
            // SAFETY: a read of guest RAM mapped by `ram`, which outlives
            // this thread (joined below, before `ram` drops).
            unsafe { std::ptr::read_volatile(host as *const u8) }
        });
        let msg = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the pager reports the stuck page");
        assert!(msg.contains("keeps faulting"), "{msg}");
        assert!(msg.contains("guest page 0x0"), "{msg}");
        assert!(msg.contains("kernel: not in memory"), "{msg}");
        // Closing the userfaultfd lets the blocked read take a zero page.
        drop(pager);
        assert_eq!(toucher.join().unwrap(), 0);
    }
}
