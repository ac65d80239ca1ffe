//! How a destination waits for its source (`hover receive`): it accepts
//! connections and checks each one's opening (the hello and, where either
//! end has a key, the proofs both ways) on a thread of its own, under one
//! deadline for the whole opening, at most [`MAX_OPENING`] at once; the
//! first to open wins. A connection that fails is logged, told why if it
//! listens, and dropped, so neither garbage, nor a wrong key, nor a client
//! trickling its hello keeps the real migration out; when all are taken,
//! the oldest is turned away to make room. Until a peer has proved the
//! key, it may send frames of at most 4 KiB, and its text is quoted cut.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

/// Failed openings are outside input: at most 10 lines a minute of them.
static HANDSHAKE_LOG: crate::host::log_budget::LogBudget =
    crate::host::log_budget::LogBudget::new(10, std::time::Duration::from_secs(60));
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::auth;
use super::message::Message;
use super::transport::{Conn, Listener, Timed};
use super::wire::{FrameReader, FrameWriter};
use super::MigrationError;
use crate::config::MigrationKey;

/// How long a new connection may take to open its stream, in all.
pub const OPENING_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections opening at once; one more turns the oldest away, so a
/// peer that holds them all cannot keep a source out for longer than its
/// own opening takes.
pub const MAX_OPENING: usize = 16;
/// Largest frame a peer may send before it has proved anything (AUTH
/// frames are 32 or 64 bytes; an ERROR's reason fits).
const OPENING_FRAME: u64 = 4096;

/// How the destination waits.
#[derive(Clone, Debug, Default)]
pub struct Waiting {
    /// The key a source must prove (`None`: none, and a source that
    /// offers one is refused).
    pub key: Option<Arc<MigrationKey>>,
    /// Give up when no source has opened a stream by then.
    pub deadline: Option<Instant>,
    /// Give up when this is set (looked at every 50 ms).
    pub stop: Option<Arc<AtomicBool>>,
}

/// A source whose stream is open: the connection, and its reader and
/// writer past the opening.
pub struct Opened {
    /// The connection.
    pub conn: Conn,
    /// Its frames from the source.
    pub reader: FrameReader<Conn>,
    /// Its frames to the source.
    pub writer: FrameWriter<Conn>,
}

/// Why no source arrived.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The deadline passed.
    #[error("no migration arrived within {} (hover receive --timeout)", crate::config::duration_text(*.0))]
    TimedOut(Duration),
    /// The wait was called off.
    #[error("the wait for a source was called off")]
    Stopped,
    /// The listener failed.
    #[error("accepting a connection: {0}")]
    Accept(std::io::Error),
}

/// Check one connection's opening, in all within [`OPENING_TIMEOUT`].
fn open(conn: &Conn, key: Option<&MigrationKey>) -> Result<Opened, MigrationError> {
    let io = |e: std::io::Error| MigrationError::Host(e.to_string());
    conn.set_timeout(Some(OPENING_TIMEOUT)).map_err(io)?;
    let timed = Timed::new(
        conn.try_clone().map_err(io)?,
        Instant::now() + OPENING_TIMEOUT,
    );
    let mut r = FrameReader::new(timed);
    r.set_limit(OPENING_FRAME);
    let mut w = FrameWriter::new(conn.try_clone().map_err(io)?);
    let flags = r.hello()?;
    auth::server(key, flags, &mut r, &mut w)?;
    let mut reader = r.map_inner(Timed::into_inner);
    reader.set_limit(super::wire::MAX_FRAME);
    Ok(Opened {
        conn: conn.try_clone().map_err(io)?,
        reader,
        writer: w,
    })
}

/// Tell `w`'s peer why it is turned away (if it listens), and close.
fn turn_away(conn: &Conn, w: Option<&mut FrameWriter<Conn>>, why: &str) {
    match w {
        Some(w) => {
            let _ = w.send(&Message::Error(why.into()));
        }
        None => {
            if let Ok(c) = conn.try_clone() {
                let _ = FrameWriter::new(c).send(&Message::Error(why.into()));
            }
        }
    }
    conn.shutdown();
}

/// A connection in its opening, as the waiting loop keeps it.
struct InFlight {
    /// Another handle on it, to turn it away when newer ones need room.
    conn: Conn,
    /// Already turned away (its thread has yet to report).
    evicted: bool,
}

/// Wait on `listener` for the first connection that opens a stream.
pub fn wait(listener: &Listener, how: &Waiting) -> Result<Opened, WaitError> {
    let at = listener.local();
    let started = Instant::now();
    let (tx, rx) = mpsc::channel::<(u64, Option<Opened>)>();
    let mut in_flight: BTreeMap<u64, InFlight> = BTreeMap::new();
    let mut next_id = 0u64;
    loop {
        while let Ok((id, opened)) = rx.try_recv() {
            in_flight.remove(&id);
            if let Some(o) = opened {
                return Ok(o);
            }
        }
        if how.stop.as_ref().is_some_and(|s| s.load(Ordering::Acquire)) {
            return Err(WaitError::Stopped);
        }
        let tick = Duration::from_millis(50);
        let wait = match how.deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(WaitError::TimedOut(started.elapsed()));
                }
                left.min(tick)
            }
            None => tick,
        };
        let conn = match listener.accept_within(wait) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            // A connection that died before it was taken, or no
            // descriptor free for a moment: wait for the next one.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(
                        libc::ECONNABORTED
                            | libc::EPROTO
                            | libc::EINTR
                            | libc::EMFILE
                            | libc::ENFILE
                    )
                ) =>
            {
                tracing::warn!("hover receive: accepting a connection: {e}; waiting on");
                std::thread::sleep(tick);
                continue;
            }
            Err(e) => return Err(WaitError::Accept(e)),
        };
        // Room for it: the oldest opening still under way is turned away
        // (its thread ends at once, on a closed connection).
        let live = in_flight.values().filter(|f| !f.evicted).count();
        if live >= MAX_OPENING {
            if let Some(oldest) = in_flight.values_mut().find(|f| !f.evicted) {
                crate::host::log_budget::warn_within(&HANDSHAKE_LOG, || {
                    format!("hover receive: {MAX_OPENING} connections are opening at once; turning the oldest away")
                });
                oldest.conn.shutdown();
                oldest.evicted = true;
            }
        }
        if in_flight.len() >= 2 * MAX_OPENING {
            turn_away(&conn, None, "too many connections are opening; try again");
            continue;
        }
        let Ok(handle) = conn.try_clone() else {
            turn_away(&conn, None, "no descriptor free; try again");
            continue;
        };
        let (tx, key, at, id) = (tx.clone(), how.key.clone(), at.clone(), next_id);
        let spawned = std::thread::Builder::new()
            .name("hover-opening".into())
            .spawn(move || match open(&conn, key.as_deref()) {
                Ok(mut o) => {
                    if let Err(mpsc::SendError((_, Some(lost)))) = tx.send((id, Some(o))) {
                        // Another source's stream was taken first.
                        o = lost;
                        turn_away(
                            &o.conn,
                            Some(&mut o.writer),
                            "another migration arrived first",
                        );
                    }
                }
                Err(e) => {
                    crate::host::log_budget::warn_within(&HANDSHAKE_LOG, || {
                        format!("hover receive: a connection failed the handshake ({e}); still waiting for a migration on {at}")
                    });
                    turn_away(&conn, None, &e.to_string());
                    let _ = tx.send((id, None));
                }
            });
        match spawned {
            Ok(_) => {
                in_flight.insert(
                    id,
                    InFlight {
                        conn: handle,
                        evicted: false,
                    },
                );
                next_id += 1;
            }
            Err(e) => tracing::warn!("hover receive: no thread to check a connection: {e}"),
        }
    }
}
