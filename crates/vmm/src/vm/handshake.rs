//! The source's side of the stream's opening: what it sends unasked
//! (hello, configuration, mode) and how it reads the destination's
//! answers, where an ERROR frame is a refusal.

use super::link::{link, Reader};
use crate::migration::wire::Kind;
use crate::migration::MigrationError;

/// Wait for `want` from the destination; its ERROR becomes a refusal.
pub(super) fn expect(r: &mut Reader, want: Kind) -> Result<Vec<u8>, MigrationError> {
    let f = r.frame()?;
    match f.kind {
        k if k == want => Ok(f.payload),
        Kind::Error => Err(MigrationError::Refused(
            String::from_utf8_lossy(&f.payload).into_owned(),
        )),
        other => Err(MigrationError::Refused(format!(
            "the destination answered {other:?} where {want:?} belongs"
        ))),
    }
}

/// The outcome of a handshake write. A destination that refuses sends its
/// reason and closes, possibly before the source has written everything
/// it sends unasked (configuration, then mode), so a write that fails is
/// first checked against what the destination said: its ERROR frame is the
/// failure (a refusal, 502), not the broken pipe it left behind.
pub(super) fn handshake(
    sent: std::io::Result<()>,
    what: &'static str,
    r: &mut Reader,
) -> Result<(), MigrationError> {
    let Err(e) = sent else { return Ok(()) };
    match r.frame() {
        Ok(f) if f.kind == Kind::Error => Err(MigrationError::Refused(
            String::from_utf8_lossy(&f.payload).into_owned(),
        )),
        _ => Err(link(what)(e)),
    }
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
