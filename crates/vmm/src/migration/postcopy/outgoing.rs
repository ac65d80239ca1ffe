//! The source of a post-copy migration: with its guest paused for good, it
//! serves the destination's page requests ahead of a background push of
//! every page still missing there, and ends when the destination has them
//! all. A broken connection is not the end: the source keeps the pages and
//! carries on when `hover ctl migrate --recover` reconnects.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;

use super::PostcopyReport;
use crate::migration::batch::ReadPages;
use crate::migration::message::{Digest, Message};
use crate::migration::transport::Conn;
use crate::migration::wire::{FrameReader, FrameWriter};

/// How long the destination may stay silent once every page is sent.
const DONE_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the post-copy phase stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The connection broke: the pages stay here for a recovery.
    #[error("the connection broke during post-copy: {0}")]
    Lost(String),
    /// The destination refused or sent what does not belong.
    #[error("the destination: {0}")]
    Refused(String),
    /// Reading guest memory failed here.
    #[error("{0}")]
    Host(String),
}

/// Pages still to send, by page index.
pub struct Pending {
    unsent: Vec<bool>,
    left: u64,
    cursor: usize,
    /// Pushed before the rest: the hot set, ascending (runs stay runs).
    hot: std::collections::VecDeque<u64>,
}

impl Pending {
    /// The pages at `gpas` (each below `end`) still to send.
    pub fn new(gpas: &[u64], end: u64) -> Self {
        let mut p = Pending {
            unsent: vec![false; (end / PAGE_SIZE) as usize],
            left: 0,
            cursor: 0,
            hot: Default::default(),
        };
        p.reset(gpas);
        p
    }

    /// Push these pages (the ones still unsent) before the others: what the
    /// guest was writing when it stopped here is what it touches first there.
    /// Returns how many that is.
    pub fn prioritize(&mut self, gpas: &[u64]) -> u64 {
        let mut hot: Vec<u64> = gpas
            .iter()
            .copied()
            .filter(|&g| self.unsent.get((g / PAGE_SIZE) as usize) == Some(&true))
            .collect();
        hot.sort_unstable();
        hot.dedup();
        let n = hot.len() as u64;
        self.hot = hot.into();
        n
    }

    /// From now on exactly `gpas` are still to send (what the destination
    /// says it misses after a reconnect: pages in flight were lost).
    pub fn reset(&mut self, gpas: &[u64]) {
        self.unsent.fill(false);
        self.left = 0;
        self.cursor = 0;
        for &g in gpas {
            if let Some(u) = self.unsent.get_mut((g / PAGE_SIZE) as usize) {
                if !*u {
                    *u = true;
                    self.left += 1;
                }
            }
        }
    }

    /// Pages still to send.
    pub fn left(&self) -> u64 {
        self.left
    }

    fn take(&mut self, gpa: u64) -> bool {
        match self.unsent.get_mut((gpa / PAGE_SIZE) as usize) {
            Some(u) if *u => {
                *u = false;
                self.left -= 1;
                true
            }
            _ => false,
        }
    }

    /// Up to `n` unsent pages in address order from where the last call
    /// stopped (runs the destination places with one copy each).
    fn next_background(&mut self, n: usize, out: &mut Vec<u64>) {
        while out.len() < n {
            let Some(g) = self.hot.pop_front() else { break };
            if self.take(g) {
                out.push(g);
            }
        }
        while out.len() < n && self.cursor < self.unsent.len() {
            if self.unsent[self.cursor] {
                self.unsent[self.cursor] = false;
                self.left -= 1;
                out.push(self.cursor as u64 * PAGE_SIZE);
            }
            self.cursor += 1;
        }
        if out.is_empty() && self.left > 0 {
            // Pages handed back by a reset behind the cursor.
            self.cursor = 0;
            self.next_background(n, out);
        }
    }
}

enum Msg {
    Request(Vec<u64>),
    Done,
    Refused(String),
    Lost(String),
}

/// Read the destination's frames on a thread of their own, so requests
/// are seen while pages go out.
fn listen(mut r: FrameReader<Conn>, end: u64) -> Receiver<Msg> {
    let (tx, rx) = mpsc::channel();
    let spawned = crate::seccomp::spawn(
        crate::seccomp::Kind::Migration,
        "postcopy-requests".into(),
        move || loop {
            let msg = match r.message() {
                Ok(got) => match got.message {
                    Message::Request(req) => match req.pages(end) {
                        Ok(g) => Msg::Request(g),
                        Err(e) => {
                            Msg::Refused(format!("REQUEST frame at offset {}: {e}", got.offset))
                        }
                    },
                    Message::Done => Msg::Done,
                    Message::Error(why) => Msg::Refused(why),
                    other => Msg::Refused(format!(
                        "a {} frame at offset {} does not belong in post-copy",
                        other.kind().name(),
                        got.offset
                    )),
                },
                // A frame that is not what its kind carries: the
                // destination sent it, the link did not break.
                Err(e @ crate::migration::wire::WireError::Unfit { .. }) => {
                    Msg::Refused(e.to_string())
                }
                Err(e) => Msg::Lost(e.to_string()),
            };
            let last = !matches!(msg, Msg::Request(_));
            if tx.send(msg).is_err() || last {
                return;
            }
        },
    );
    if let Err(e) = spawned {
        let (tx, rx) = mpsc::channel();
        let _ = tx.send(Msg::Lost(format!("cannot start the request reader: {e}")));
        return rx;
    }
    rx
}

/// How the source sends in the post-copy phase.
pub struct Serve<'a> {
    /// Pages per PAGES frame of the background push.
    pub batch: usize,
    /// Guest-physical end of memory.
    pub end: u64,
    /// The memory image's hash (with `verify`), sent before END.
    pub hash: Option<u64>,
    /// Reads guest pages.
    pub read: &'a mut ReadPages<'a>,
    /// After each frame: how long the background push must hold back to
    /// keep to the bandwidth limit. Requested pages do not wait for it (a
    /// task waits on each; the push pays their bytes back).
    pub hold: &'a mut dyn FnMut(&FrameWriter<Conn>) -> Duration,
}

impl Serve<'_> {
    /// Serve on `conn` (whose frames from the destination `r` reads, and
    /// `w` writes to) until the destination has every page.
    pub fn run(
        &mut self,
        r: FrameReader<Conn>,
        w: &mut FrameWriter<Conn>,
        pending: &mut Pending,
        report: &mut PostcopyReport,
    ) -> Result<(), ServeError> {
        let rx = listen(r, self.end);
        let ps = PAGE_SIZE as usize;
        let mut demand: std::collections::VecDeque<u64> = Default::default();
        let mut gpas = Vec::with_capacity(self.batch);
        let mut data = vec![0u8; self.batch * ps];
        let mut ended = false;
        let mut hold_until = Instant::now();
        loop {
            let now = Instant::now();
            let held = !ended && demand.is_empty() && hold_until > now;
            let msg = if held {
                // Paced: wait for the push's turn, or for a request.
                match rx.recv_timeout(hold_until - now) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(ServeError::Lost("the request reader stopped".into()))
                    }
                }
            } else if ended {
                match rx.recv_timeout(DONE_TIMEOUT) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => {
                        return Err(ServeError::Lost(format!(
                            "no DONE from the destination within {DONE_TIMEOUT:?} of the last page"
                        )))
                    }
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(ServeError::Lost("the request reader stopped".into()))
                    }
                }
            } else {
                rx.try_recv().ok()
            };
            match msg {
                Some(Msg::Request(g)) => {
                    demand.extend(g);
                    continue;
                }
                Some(Msg::Done) if ended => return Ok(()),
                Some(Msg::Done) => {
                    return Err(ServeError::Refused(format!(
                        "DONE with {} pages still unsent",
                        pending.left()
                    )))
                }
                Some(Msg::Refused(e)) => return Err(ServeError::Refused(e)),
                Some(Msg::Lost(e)) => return Err(ServeError::Lost(e)),
                None if ended => continue,
                None => {}
            }
            if demand.is_empty() && hold_until > Instant::now() {
                continue;
            }
            gpas.clear();
            // Demanded pages first: a vCPU (or a parked task) waits on each.
            while gpas.len() < self.batch {
                match demand.pop_front() {
                    Some(g) if pending.take(g) => gpas.push(g),
                    Some(_) => {}
                    None => break,
                }
            }
            let demanded = gpas.len() as u64;
            if gpas.is_empty() {
                pending.next_background(self.batch, &mut gpas);
            }
            if gpas.is_empty() {
                if let Some(h) = self.hash {
                    w.send(&Message::Digest(Digest::Postcopy(h)))
                        .map_err(|e| ServeError::Lost(e.to_string()))?;
                }
                w.send(&Message::End)
                    .map_err(|e| ServeError::Lost(e.to_string()))?;
                ended = true;
                continue;
            }
            gpas.sort_unstable();
            let buf = &mut data[..gpas.len() * ps];
            (self.read)(&gpas, buf)
                .map_err(|e| ServeError::Host(format!("reading guest memory: {e}")))?;
            if let Err(e) = w.send_pages(&gpas, buf) {
                // In flight or not, the destination will say what it misses.
                return Err(ServeError::Lost(e.to_string()));
            }
            report.pages_received += gpas.len() as u64;
            report.demanded_sent += demanded;
            hold_until = Instant::now() + (self.hold)(w);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_pages_go_once_in_address_order_and_reset() {
        let ps = PAGE_SIZE;
        let mut p = Pending::new(&[5 * ps, ps, 3 * ps, 3 * ps], 8 * ps);
        assert_eq!(p.left(), 3);
        assert!(p.take(3 * ps));
        assert!(!p.take(3 * ps), "a page goes once");
        let mut out = Vec::new();
        p.next_background(8, &mut out);
        assert_eq!(out, vec![ps, 5 * ps]);
        assert_eq!(p.left(), 0);
        p.reset(&[ps]);
        out.clear();
        p.next_background(8, &mut out);
        assert_eq!(out, vec![ps], "a reset page goes again");
    }

    #[test]
    fn the_hot_set_goes_first_and_once() {
        let ps = PAGE_SIZE;
        let mut p = Pending::new(&[ps, 2 * ps, 5 * ps, 6 * ps, 7 * ps], 8 * ps);
        // 3 is not pending: ignored; 6 and 5 go first, in address order.
        assert_eq!(p.prioritize(&[6 * ps, 3 * ps, 5 * ps]), 2);
        let mut out = Vec::new();
        p.next_background(3, &mut out);
        assert_eq!(out, vec![5 * ps, 6 * ps, ps]);
        out.clear();
        p.next_background(8, &mut out);
        assert_eq!(out, vec![2 * ps, 7 * ps]);
        assert_eq!(p.left(), 0);
    }
}
