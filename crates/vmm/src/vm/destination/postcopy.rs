//! The destination's post-copy phase as part of its VM: the receiving
//! thread ([`Incoming`]) started once the guest may run, pausing the guest
//! while the connection is down, and its report at the end of the run.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::control::{Command, Controller, VmEvent};
use super::super::Vm;
use crate::migration::postcopy::incoming::{Incoming, LinkEvents, RemotePages};
use crate::migration::postcopy::{page_hash, PostcopyError, PostcopyReport};
use crate::migration::transport::{Addr, Conn};
use crate::migration::wire::{FrameReader, FrameWriter};
use hover_abi::layout::PAGE_SIZE;

/// How long the end of a run waits for the last pages before it gives up
/// on them (the guest has ended; the source is told by the closed link).
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);
/// How long pausing or resuming the guest around a broken link may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The receiving thread of a running post-copy, and its result.
pub(crate) struct IncomingHandle {
    done: Receiver<Result<PostcopyReport, PostcopyError>>,
    conn: Conn,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The pages, for loading those held here once all have arrived.
    pages: Arc<RemotePages>,
}

impl IncomingHandle {
    /// Wait for the post-copy phase to end; its report.
    pub(crate) fn finish(self) -> Result<PostcopyReport, PostcopyError> {
        // Memory still arriving keeps coming; a wait for a source that
        // broke off ends now (the guest is gone: nobody would need it).
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        match self.done.recv_timeout(FINISH_TIMEOUT) {
            Ok(r) => r,
            Err(RecvTimeoutError::Timeout) => {
                self.conn.shutdown();
                Err(PostcopyError::Unfinished(FINISH_TIMEOUT))
            }
            Err(RecvTimeoutError::Disconnected) => Err(PostcopyError::ReceiverGone),
        }
    }
}

/// Pauses the guest while the link is down, resumes it after.
struct GuestHold(Controller);

impl LinkEvents for GuestHold {
    fn lost(&self, why: &str) {
        if let Err(e) = self.0.request(Command::Pause, COMMAND_TIMEOUT) {
            tracing::warn!("post-copy link lost ({why}); the guest could not be paused: {e}");
        }
    }

    fn recovered(&self) {
        if let Err(e) = self.0.request(Command::Resume, COMMAND_TIMEOUT) {
            tracing::warn!("post-copy link recovered; the guest could not be resumed: {e}");
        }
    }
}

/// The hash of the pinned boot area as the guest will find it, kept up as
/// its pages arrive (a page sent again replaces its hash), so the switch
/// adds up a few thousand numbers instead of reading and hashing the area
/// in the downtime (3.5-9 ms for the built-in guest, measured 2026-11-25).
/// Pages never sent are zero here and hash to 0, as at the source.
pub(in crate::vm) struct PinnedHash {
    hashes: Vec<u64>,
}

impl PinnedHash {
    /// For the area below guest-physical `image_end`.
    pub(in crate::vm) fn new(image_end: u64) -> PinnedHash {
        PinnedHash {
            hashes: vec![0; image_end.div_ceil(PAGE_SIZE) as usize],
        }
    }

    /// The page at `gpa` arrived with `page`; pages above the area are not
    /// its business.
    pub(in crate::vm) fn note(&mut self, gpa: u64, page: &[u8]) {
        if let Some(h) = self.hashes.get_mut((gpa / PAGE_SIZE) as usize) {
            *h = page_hash(gpa, page);
        }
    }

    /// The area's hash.
    pub(in crate::vm) fn sum(&self) -> u64 {
        self.hashes.iter().fold(0u64, |a, h| a.wrapping_add(*h))
    }
}

/// A post-copy destination's memory: still arriving through the
/// receiving thread, or all arrived (its report).
pub(in crate::vm) enum PostcopyIn {
    /// The receiving thread runs.
    Arriving(IncomingHandle),
    /// Every page arrived (or the phase failed): its report.
    Arrived(Result<PostcopyReport, PostcopyError>),
}

impl PostcopyIn {
    /// Its report, the receiving thread stopped first if it still runs.
    pub(in crate::vm) fn finish(self) -> Result<PostcopyReport, PostcopyError> {
        match self {
            PostcopyIn::Arriving(h) => h.finish(),
            PostcopyIn::Arrived(report) => report,
        }
    }
}

impl Vm {
    /// Start receiving the rest of a post-copy on `r`/`w`: the pages go to
    /// `remote` and the pager. `pinned_hash`: with verification, the boot
    /// area's hash (the pages held so far are added here).
    pub(in crate::vm) fn start_incoming(
        &mut self,
        remote: Arc<RemotePages>,
        r: FrameReader<Conn>,
        w: FrameWriter<Conn>,
        recover_at: Addr,
        pinned_hash: Option<u64>,
    ) -> std::io::Result<()> {
        let placer = self
            .paging
            .pager()
            .expect("a post-copy destination runs a pager")
            .placer();
        let conn = w.get_ref().try_clone()?;
        let hold = GuestHold(self.controller());
        let events = self.events.tx.clone();
        let end = self.ram.end();
        let (tx, done) = mpsc::channel();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pages = remote.clone();
        let incoming = Incoming {
            pages: remote,
            placer,
            reader: r,
            recover_at,
            key: self.hosting.migration_key.clone(),
            hash: 0,
            end,
            started: Instant::now(),
            stop: stop.clone(),
        };
        incoming.connect(w);
        crate::seccomp::spawn(
            crate::seccomp::Kind::Migration,
            "postcopy-in".into(),
            move || {
                let mut incoming = incoming;
                if let Some(h) = pinned_hash {
                    match incoming.pages.held_hash() {
                        Ok(held) => incoming.hash = h.wrapping_add(held),
                        Err(e) => tracing::warn!("post-copy: cannot hash the pages held: {e}"),
                    }
                }
                let result = incoming.run(&hold);
                let failed = result.as_ref().err().map(|e| format!("post-copy: {e}"));
                let _ = tx.send(result);
                let _ = events.send(match failed {
                    Some(e) => VmEvent::PagerFailed(e),
                    None => VmEvent::PostcopyArrived,
                });
            },
        )?;
        self.arrival.postcopy_in = Some(PostcopyIn::Arriving(IncomingHandle {
            done,
            conn,
            stop,
            pages,
        }));
        Ok(())
    }

    /// Every page of a post-copy has arrived: keep its report, and for a
    /// VM without a memory budget load the pages held here since before
    /// the switch into guest memory, after which the pager lets go of it
    /// (`PrefetchLoaded`, [`Vm::release_loaded_pager`]): a first touch of
    /// fresh memory is then an ordinary fault, not a trip through the pager.
    pub(in crate::vm) fn postcopy_arrived(&mut self) {
        let h = match self.arrival.postcopy_in.take() {
            Some(PostcopyIn::Arriving(h)) => h,
            other => {
                self.arrival.postcopy_in = other;
                return;
            }
        };
        let pages = h.pages.clone();
        let report = h.finish();
        let arrived = report.is_ok();
        self.arrival.postcopy_in = Some(PostcopyIn::Arrived(report));
        if !arrived || self.config().memory_budget.is_some() {
            return;
        }
        let Some(pager) = self.paging.pager_mut() else {
            return;
        };
        let events = self.events.tx.clone();
        let loaded = Box::new(move || {
            let _ = events.send(VmEvent::PrefetchLoaded);
        });
        // Only a speed-up: without it the pager goes on serving faults.
        let held = pages.clone();
        if let Err(e) = pager.prefetch(
            move || held.held_pages(),
            pages,
            None,
            loaded,
            crate::memory::paged::LoaderStart::Now,
        ) {
            tracing::warn!("post-copy: cannot load the pages held since the switch (the pager keeps serving them): {e}");
        }
    }
}
