//! The source's side of the stream's opening: the hello and, with a key,
//! the proofs both ways; what it sends unasked (configuration, mode) and
//! how it reads the destination's answers, where an ERROR frame is a
//! refusal; and the `SYNC` round trip before the pause.

use std::time::{Duration, Instant};

use super::link::{io, link, Reader, Writer};
use crate::config::MigrationKey;
use crate::migration::auth::{self, LinkAuth};
use crate::migration::message::Message;
use crate::migration::transport::{Addr, Conn};
use crate::migration::wire::{FrameReader, FrameWriter, Kind, HELLO_AUTH};
use crate::migration::MigrationError;

/// How a source that may not use `to` without a key is told to fix it.
const HOW: &str = "start this VMM with --migration-key FILE, the same key as the destination's, or ask for an unauthenticated migration (\"insecure\": true; hover ctl migrate --insecure)";

/// Whether a migration to `to` may go: over TCP only with a key or when
/// `insecure`.
pub(in crate::vm) fn allowed(
    key: Option<&std::sync::Arc<MigrationKey>>,
    to: &Addr,
    insecure: bool,
) -> Result<(), crate::migration::auth::Unauthenticated> {
    LinkAuth {
        key: key.cloned(),
        insecure,
    }
    .check(to, HOW)
}

/// Open the stream on `conn`: the hello and, with `key`, prove it and
/// check the destination's proof; from there every frame carries a MAC.
pub(in crate::vm) fn open(
    conn: &Conn,
    key: Option<&MigrationKey>,
) -> Result<(Writer, Reader), MigrationError> {
    let mut w = FrameWriter::new(conn.try_clone().map_err(io("cloning the connection"))?);
    let mut r = FrameReader::new(conn.try_clone().map_err(io("cloning the connection"))?);
    let flags = if key.is_some() { HELLO_AUTH } else { 0 };
    handshake(w.hello(flags), "sending the hello", &mut r)?;
    if let Some(k) = key {
        auth::client(k, &mut r, &mut w)?;
    }
    Ok((w, r))
}

/// Wait for a `want` message from the destination, what `pick` takes of
/// it; its ERROR becomes a refusal, any other message too.
pub(in crate::vm) fn expect<T>(
    r: &mut Reader,
    want: Kind,
    pick: fn(Message) -> Option<T>,
) -> Result<T, MigrationError> {
    let m = r.message()?.message;
    let found = m.kind();
    match m {
        Message::Error(why) => Err(MigrationError::Refused(why)),
        m => pick(m).ok_or_else(|| {
            MigrationError::Refused(format!(
                "the destination answered {} where {} belongs",
                found.name(),
                want.name()
            ))
        }),
    }
}

/// The outcome of a handshake write. A destination that refuses sends its
/// reason and closes, possibly before the source has written everything
/// it sends unasked (configuration, then mode), so a write that fails is
/// first checked against what the destination said: its ERROR frame is the
/// failure (a refusal, 502), not the broken pipe it left behind.
pub(in crate::vm) fn handshake(
    sent: std::io::Result<()>,
    what: &'static str,
    r: &mut Reader,
) -> Result<(), MigrationError> {
    let Err(e) = sent else { return Ok(()) };
    match r.message() {
        Ok(got) => match got.message {
            Message::Error(why) => Err(MigrationError::Refused(why)),
            _ => Err(link(what)(e)),
        },
        Err(_) => Err(link(what)(e)),
    }
}

/// Send `SYNC` and wait for the destination's `SYNCED`: once it answers,
/// every frame sent before is applied there. How long that took.
pub(in crate::vm) fn catch_up(w: &mut Writer, r: &mut Reader) -> Result<Duration, MigrationError> {
    let at = Instant::now();
    w.send(&Message::Sync)
        .map_err(link("asking the destination to catch up"))?;
    expect(r, Kind::Synced, |m| {
        matches!(m, Message::Synced).then_some(())
    })?;
    Ok(at.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::transport::Conn;
    use crate::migration::wire::{FrameReader, FrameWriter};
    use std::os::unix::net::UnixStream;

    /// A reader on one end of a socket pair whose other end wrote `frames`
    /// and closed.
    fn reader_after(frames: &[(Kind, &[u8])]) -> Reader {
        let (a, b) = UnixStream::pair().unwrap();
        let mut w = FrameWriter::new(Conn::Unix(b));
        for (kind, payload) in frames {
            w.frame(*kind, &[payload]).unwrap();
        }
        drop(w);
        FrameReader::new(Conn::Unix(a))
    }

    fn broken_pipe() -> std::io::Result<()> {
        Err(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }

    #[test]
    fn a_refusal_that_closed_the_connection_first_is_still_a_refusal() {
        let mut r = reader_after(&[(Kind::Error, b"no room for this VM here")]);
        match handshake(broken_pipe(), "sending the mode", &mut r) {
            Err(MigrationError::Refused(why)) => assert_eq!(why, "no room for this VM here"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_write_that_failed_without_a_reason_is_a_link_failure() {
        let mut r = reader_after(&[]);
        match handshake(broken_pipe(), "sending the mode", &mut r) {
            Err(MigrationError::Link(m)) => assert!(m.starts_with("sending the mode: "), "{m}"),
            other => panic!("{other:?}"),
        }
        // A write that worked reads nothing.
        let mut r = reader_after(&[(Kind::Error, b"unread")]);
        assert!(handshake(Ok(()), "sending the mode", &mut r).is_ok());
    }
}
