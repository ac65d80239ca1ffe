//! How a destination waits for its source (`hover receive`): it accepts
//! connections and checks each one's opening (the hello and, where either
//! end has a key, the proofs both ways) on a thread of its own, under one
//! deadline for the whole opening, at most [`MAX_OPENING`] at once; the
//! first to open wins. A connection that fails is logged, told why if it
//! listens, and dropped, so neither garbage, nor a wrong key, nor a client
//! trickling its hello keeps the real migration out.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::auth;
use super::transport::{Conn, Listener, Timed};
use super::wire::{FrameReader, FrameWriter, Kind};
use super::MigrationError;
use crate::config::MigrationKey;

/// How long a new connection may take to open its stream, in all.
pub const OPENING_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections opening at once; one more is turned away at once.
pub const MAX_OPENING: usize = 16;

/// How the destination waits.
#[derive(Clone, Debug, Default)]
pub struct Waiting {
    /// The key a source must prove (`None`: none, and a source that
    /// offers one is refused).
    pub key: Option<Arc<MigrationKey>>,
    /// Give up when no source has opened a stream by then.
    pub deadline: Option<Instant>,
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
    #[error("no migration arrived within {0:?} (hover receive --timeout)")]
    TimedOut(Duration),
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
    let mut w = FrameWriter::new(conn.try_clone().map_err(io)?);
    let flags = r.hello()?;
    auth::server(key, flags, &mut r, &mut w)?;
    Ok(Opened {
        conn: conn.try_clone().map_err(io)?,
        reader: r.map_inner(Timed::into_inner),
        writer: w,
    })
}

/// Turn `conn` away with `why` (if it listens) and log it.
fn drop_failed(conn: &Conn, why: &dyn std::fmt::Display, at: &str) {
    tracing::warn!(
        "hover receive: a connection failed the handshake ({why}); still waiting for a migration on {at}"
    );
    if let Ok(c) = conn.try_clone() {
        let _ = FrameWriter::new(c).frame(Kind::Error, &[why.to_string().as_bytes()]);
    }
    conn.shutdown();
}

/// Wait on `listener` for the first connection that opens a stream.
pub fn wait(listener: &Listener, how: &Waiting) -> Result<Opened, WaitError> {
    let at = listener.local();
    let started = Instant::now();
    let (tx, rx) = mpsc::channel::<(Conn, Result<Opened, MigrationError>)>();
    let mut opening = 0usize;
    loop {
        while let Ok((conn, result)) = rx.try_recv() {
            opening -= 1;
            match result {
                Ok(o) => return Ok(o),
                Err(e) => drop_failed(&conn, &e, &at),
            }
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
        if opening >= MAX_OPENING {
            drop_failed(
                &conn,
                &format!("{MAX_OPENING} connections are opening already; try again"),
                &at,
            );
            continue;
        }
        let (tx, key) = (tx.clone(), how.key.clone());
        let spawned = std::thread::Builder::new()
            .name("hover-opening".into())
            .spawn(move || {
                let result = open(&conn, key.as_deref());
                // Nobody listens once another connection won: this one
                // is dropped, and with it the connection.
                let _ = tx.send((conn, result));
            });
        match spawned {
            Ok(_) => opening += 1,
            Err(e) => tracing::warn!("hover receive: no thread to check a connection: {e}"),
        }
    }
}
