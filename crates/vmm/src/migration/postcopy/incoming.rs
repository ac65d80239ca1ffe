//! The destination of a post-copy migration: the guest runs while its
//! memory arrives. [`RemotePages`] is the pager's page source: a page still
//! at the source is asked for over the connection (a REQUEST frame) and the
//! fetch waits for it; [`Incoming`] reads the source's frames, places pushed
//! pages straight into guest memory (one `UFFDIO_COPY` per contiguous run)
//! or keeps them for a waiting fetch, and re-establishes a broken connection
//! when the source comes back with RECOVER.

use crate::sync::Locked;
use std::time::{Duration, Instant};

use super::{page_hash, PostcopyError, PostcopyReport};
use crate::memory::paged::Placer;
use crate::migration::message::{Digest, Message, PageSet};
use crate::migration::opening::{self, Opened, WaitError, Waiting};
use crate::migration::transport::{Addr, Conn, Listener};
use crate::migration::wire::{FrameReader, FrameWriter, WireError};

/// Why a connection that came to recover the link was not taken (the
/// destination goes on waiting for another).
#[derive(Debug, thiserror::Error)]
enum RecoveryRefused {
    /// The connection failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Its first frame did not come whole.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// Its first frame was of another kind.
    #[error("the first frame was {0}, not RECOVER")]
    NotRecover(&'static str),
}

pub use super::remote::{RemotePages, DEFAULT_PAGE_TIMEOUT};

/// Why receiving stopped.
enum Broken {
    /// The link or what came over it: recoverable by a new connection.
    Link(String),
    /// This host failed (placing or keeping a page): the VM must stop.
    Local(String),
}

/// What the destination's receiving thread is told to do when the link
/// breaks and comes back (pause and resume the guest).
pub trait LinkEvents: Send {
    /// The connection to the source broke; the guest should wait.
    fn lost(&self, why: &str);
    /// A new connection carries on.
    fn recovered(&self);
}

/// The receiving side of the post-copy phase.
pub struct Incoming {
    /// The pages.
    pub pages: std::sync::Arc<RemotePages>,
    /// Places pushed pages in guest memory.
    pub placer: Placer,
    /// The source's frames.
    pub reader: FrameReader<Conn>,
    /// Where to listen for the source's recovery connection.
    pub recover_at: Addr,
    /// The key the recovering source must prove, as the first connection's
    /// source did.
    pub key: Option<std::sync::Arc<crate::config::MigrationKey>>,
    /// Order-free hash of the memory image as of the switch: pages held
    /// before it (those not pending), added to as pages arrive.
    pub hash: u64,
    /// Guest-physical end of memory.
    pub end: u64,
    /// When the guest was started here.
    pub started: Instant,
    /// Set when the run ends: stop waiting for a source that may never
    /// come back.
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Incoming {
    /// Receive until the source says every page was sent; the report. On a
    /// bad stream every waiting fetch fails (the VM stops: no page is ever
    /// served wrong) and the error is returned.
    pub fn run(mut self, events: &dyn LinkEvents) -> Result<PostcopyReport, PostcopyError> {
        let mut report = PostcopyReport {
            pages_at_switch: self.pages.remaining(),
            ..Default::default()
        };
        let result = self.receive(events, &mut report);
        self.pages.fill_report(&mut report);
        report.all_arrived_ms = self.started.elapsed().as_secs_f64() * 1e3;
        if let Err(e) = &result {
            let why = e.to_string();
            self.pages.fail(&why);
            let mut l = self.pages.link.locked();
            if let Some(w) = l.writer.as_mut() {
                let _ = w.send(&Message::Error(why));
            }
            l.writer = None;
        }
        result.map(|()| report)
    }

    fn receive(
        &mut self,
        events: &dyn LinkEvents,
        report: &mut PostcopyReport,
    ) -> Result<(), PostcopyError> {
        let mut expected: Option<u64> = None;
        loop {
            match self.step(&mut expected, report) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(Broken::Local(e)) => return Err(PostcopyError::Local(e)),
                Err(Broken::Link(why)) => {
                    // Whatever broke the link (a cut, a corrupted frame, a
                    // peer that sends what it must not, a page that never
                    // came), the source still has every page missing here:
                    // drop the link, hold the guest, wait for a recovery.
                    self.pages.drop_link();
                    // Listening before the guest is held: whoever sees it
                    // held (`GET /vm`: paused) may start the recovery at once.
                    let listener = Listener::bind(&self.recover_at).map_err(|source| {
                        PostcopyError::Listen {
                            at: self.recover_at.to_string(),
                            source,
                        }
                    })?;
                    tracing::error!(
                        "post-copy: {why}; the guest waits for `hover ctl migrate --recover --to {}` on the source",
                        self.recover_at
                    );
                    events.lost(&why);
                    self.reconnect(&listener)?;
                    report.recoveries += 1;
                    events.recovered();
                }
            }
        }
    }

    /// Take one frame: `Ok(true)` once every page is here.
    fn step(
        &mut self,
        expected: &mut Option<u64>,
        report: &mut PostcopyReport,
    ) -> Result<bool, Broken> {
        let link = Broken::Link;
        let got = match self.reader.message() {
            Ok(got) => got,
            Err(e @ (WireError::Io { .. } | WireError::Truncated { .. })) => {
                return Err(link(format!("the connection to the source broke: {e}")))
            }
            Err(e) => return Err(link(format!("the stream is damaged: {e}"))),
        };
        let at = got.offset;
        match got.message {
            Message::Pages(p) => {
                self.pages
                    .check_arrivals(p.gpas())
                    .map_err(|r| link(format!("PAGES frame at offset {at}: {r}")))?;
                self.pages
                    .arrive(p.gpas(), p.data(), &self.placer)
                    .map_err(|e| Broken::Local(e.to_string()))?;
                for (g, page) in p.iter() {
                    self.hash = self.hash.wrapping_add(page_hash(g, page));
                }
                report.pages_received += p.gpas().len() as u64;
                Ok(false)
            }
            Message::Digest(Digest::Postcopy(h)) => {
                *expected = Some(h);
                Ok(false)
            }
            Message::End => {
                let left = self.pages.remaining();
                if left > 0 {
                    return Err(link(format!(
                        "END frame at offset {at} with {left} pages never sent"
                    )));
                }
                if let Some(want) = *expected {
                    // Every page is here and as sent (each frame's CRC
                    // held): a different sum is a fault of a host, not of
                    // the link.
                    if want != self.hash {
                        return Err(Broken::Local(format!(
                            "memory as received hashes to {:#x}, the source's to {want:#x}",
                            self.hash
                        )));
                    }
                    report.verified = Some(true);
                }
                let mut l = self.pages.link.locked();
                if let Some(w) = l.writer.as_mut() {
                    // Every page is here either way; the source also
                    // learns of the end from the closed link.
                    if let Err(e) = w.send(&Message::Done) {
                        tracing::warn!("post-copy: cannot tell the source we are done: {e}");
                    }
                }
                l.writer = None;
                Ok(true)
            }
            Message::Error(why) => Err(link(format!("the source gave up: {why}"))),
            other => Err(link(format!(
                "a {} frame at offset {at} does not belong in post-copy",
                other.kind().name()
            ))),
        }
    }

    /// Wait at `listener` for the source to come back with RECOVER, tell it
    /// what is still missing and carry on with the new connection.
    /// Connections are checked as `hover receive` checks them
    /// (migration/opening.rs): each on its own thread, the key proved
    /// again, 5 s for the opening. The listener stays open across failed
    /// attempts, so the address never goes away while the guest waits.
    fn reconnect(&mut self, listener: &Listener) -> Result<(), PostcopyError> {
        loop {
            let how = Waiting {
                key: self.key.clone(),
                deadline: None,
                stop: Some(self.stop.clone()),
            };
            let opened = match opening::wait(listener, &how) {
                Ok(o) => o,
                Err(WaitError::Stopped) => {
                    return Err(PostcopyError::NeverRecovered(self.pages.remaining()))
                }
                Err(e) => return Err(PostcopyError::Recovery(e.to_string())),
            };
            match self.take_recovery(opened) {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!("post-copy: a recovery attempt failed: {e}"),
            }
        }
    }

    fn take_recovery(&mut self, o: Opened) -> Result<(), RecoveryRefused> {
        let Opened {
            conn,
            reader: mut r,
            writer: mut w,
        } = o;
        conn.set_timeout(Some(Duration::from_secs(30)))?;
        let first = r.message().map(|got| got.message);
        if !matches!(first, Ok(Message::Recover)) {
            let _ = w.send(&Message::Error("expected RECOVER".into()));
            conn.shutdown();
            return Err(match first {
                Ok(m) => RecoveryRefused::NotRecover(m.kind().name()),
                Err(e) => e.into(),
            });
        }
        let missing = PageSet::of(self.pages.pending_gpas(), self.end);
        w.send(&Message::Missing(missing))?;
        self.reader = r;
        self.pages.set_writer(Some(w));
        Ok(())
    }

    /// Start the link: requests go out on `w`.
    pub fn connect(&self, w: FrameWriter<Conn>) {
        self.pages.set_writer(Some(w));
    }
}
