//! Sending guest pages in a migration's rounds: in batches of frames,
//! each batch copied out of guest memory first (a frame's CRC needs a copy
//! the running guest cannot change under it), or by a sender process
//! (`sender.rs`), held to the migration's bandwidth.

use std::time::{Duration, Instant};

use super::batch::{BatchError, Batcher};
use super::sender::ProcessSender;
use super::transport::Conn;
use super::wire::FrameWriter;
use super::MigrationError;
use crate::memory::paged::Pager;
use crate::memory::GuestRam;
use crate::state::memory;

/// The stream a source writes.
pub type Writer = FrameWriter<Conn>;

/// Pages asked of a sender process at a time: fine enough for the
/// bandwidth limit's pacing, coarse enough that its round trips do not
/// count.
const PROCESS_CHUNK: usize = 1024;

/// Sends pages in batches, copying each batch out of guest memory first (a
/// frame's CRC needs a copy the running guest cannot change under it), or
/// has a sender process do it.
pub struct PageSender {
    frames: Batcher,
    /// Bytes a second the migration may use (`None`: no limit).
    pub bandwidth: Option<u64>,
    /// When sending began (the bandwidth is kept from here).
    pub started: Instant,
    /// Pages sent so far.
    pub pages: u64,
    /// Sending had to wait for the bandwidth at least once.
    pub throttled: bool,
    process: Option<ProcessSender>,
    /// Bytes the sender process wrote.
    process_bytes: u64,
}

impl PageSender {
    /// Send in batches of `batch_pages`, within `bandwidth`, from this
    /// thread or through the sender `process`.
    pub fn new(batch_pages: usize, bandwidth: Option<u64>, process: Option<ProcessSender>) -> Self {
        PageSender {
            frames: Batcher::new(batch_pages),
            bandwidth,
            started: Instant::now(),
            pages: 0,
            throttled: false,
            process,
            process_bytes: 0,
        }
    }

    /// The sender process's CPU time, us (0 without one).
    pub fn process_cpu_us(&self) -> u64 {
        self.process.as_ref().map_or(0, |p| p.cpu_us)
    }

    /// Bytes sent so far, by this thread and the sender process.
    pub fn bytes(&self, w: &Writer) -> u64 {
        w.bytes + self.process_bytes
    }

    /// Send the pages of `ram` at `gpas`; in the first round, pages of
    /// zeros are skipped (the destination's memory starts as zeros).
    /// Returns pages sent.
    pub fn send(
        &mut self,
        ram: &GuestRam,
        pager: Option<&Pager>,
        w: &mut Writer,
        gpas: &[u64],
        skip_zero: bool,
    ) -> Result<u64, MigrationError> {
        if let Some(p) = &mut self.process {
            let mut sent = 0;
            for chunk in gpas.chunks(PROCESS_CHUNK) {
                // The helper's own failures are this host's, not the link's.
                let (n, bytes) = p
                    .send(chunk, skip_zero, w.mac_mut())
                    .map_err(|e| MigrationError::host("sending memory", e))?;
                sent += n;
                self.pages += n;
                self.process_bytes += bytes;
                self.throttled |= pace(self.bandwidth, self.started, w.bytes + self.process_bytes);
            }
            return Ok(sent);
        }
        let (bandwidth, started, process_bytes) =
            (self.bandwidth, self.started, self.process_bytes);
        let mut throttled = false;
        let sent = self
            .frames
            .send(
                w,
                gpas,
                skip_zero,
                &mut |chunk, out| memory::read_pages(ram, pager, chunk, out),
                &mut |w| throttled |= pace(bandwidth, started, w.bytes + process_bytes),
            )
            .map_err(|e| match e {
                BatchError::Read(e) => MigrationError::host("reading guest memory", e),
                BatchError::Write(e) => MigrationError::link("sending memory", e),
            })?;
        self.throttled |= throttled;
        self.pages += sent;
        Ok(sent)
    }
}

/// Hold back to `bandwidth` after `bytes` sent since `started`; whether it
/// had to wait.
pub fn pace(bandwidth: Option<u64>, started: Instant, bytes: u64) -> bool {
    let wait = pace_wait(bandwidth, started, bytes);
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
    !wait.is_zero()
}

/// How long a sender that has sent `bytes` since `started` must wait to
/// keep to `bandwidth` (zero: it may go on now).
pub fn pace_wait(bandwidth: Option<u64>, started: Instant, bytes: u64) -> Duration {
    let Some(bw) = bandwidth else {
        return Duration::ZERO;
    };
    let due = Duration::from_secs_f64(bytes as f64 / bw as f64);
    due.saturating_sub(started.elapsed())
}
