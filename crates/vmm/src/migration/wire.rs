//! The migration stream (docs/MIGRATION.md): a hello, then frames, each a
//! 24-byte header (kind, length, CRC32 of the payload) and its payload;
//! on an authenticated link (`auth`), a MAC after each frame.
//!
//! ```text
//! authenticated links open with: HELLO, AUTH (both ways), AUTH (auth.rs)
//! pre-copy:
//! source -> destination: HELLO, CONF, MODE, PAGES..., STATE, [DIGEST], END
//! destination -> source: READY after MODE, RUNNING after END
//!                        (or ERROR with a message, at any point)
//! post-copy (and hybrid, which sends PAGES rounds before STATE):
//! source -> destination: HELLO, CONF, MODE, [PAGES...], STATE, POSTCOPY,
//!                        then PAGES (demanded first) ..., [DIGEST], END
//! destination -> source: READY, RUNNING after POSTCOPY, REQUEST... while
//!                        pages are missing, DONE after END
//! recovery of a post-copy whose connection broke:
//! source -> destination: HELLO, RECOVER; destination -> source: MISSING;
//!                        then as after RUNNING
//! ```
//! State payloads are the snapshot file's section types, encoded the same
//! way (postcard); a PAGES payload is a page count, the pages' guest
//! addresses and their contents.

use std::io::{self, IoSlice, Read, Write};

use hover_abi::layout::PAGE_SIZE;

use super::mac::{FrameMac, MAC_BYTES};

/// The hello's flag word: the source will authenticate (migration/auth.rs).
pub const HELLO_AUTH: u32 = 1;

/// The stream's magic.
pub const MAGIC: [u8; 8] = *b"HOVERMIG";
/// The stream version this build speaks.
/// 8 (2026-11-27): the snapshot format's version 5 in CONF and STATE.
/// 9 (2026-11-28): its version 6 (the balloon, a device's own state).
pub const VERSION: u32 = 9;
/// Largest page batch.
pub const MAX_BATCH: usize = 4096;
/// Largest frame payload: a full page batch, or a state document.
pub const MAX_FRAME: u64 = 8 + MAX_BATCH as u64 * (8 + PAGE_SIZE);
const HEADER: usize = 24;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Kind {
    /// `SavedMachine`: what to build.
    Conf = 1,
    /// A batch of pages.
    Pages = 2,
    /// `VmState`: vCPUs, irqchip, clock, devices.
    State = 3,
    /// A digest of every page that holds something (with `--verify`).
    Digest = 4,
    /// Nothing more: run the VM (post-copy: every page has been sent).
    End = 5,
    /// How memory will move, and whether a digest follows (message.rs).
    Mode = 6,
    /// Run the guest now; a page bitmap of what is still at the source.
    Postcopy = 7,
    /// The first frame of a connection that resumes a broken post-copy.
    Recover = 8,
    /// Either side, on an authenticated link: a nonce or a proof (auth.rs).
    Auth = 9,
    /// Source, before it pauses the guest: answer [`Kind::Synced`] once
    /// every frame before this one is applied (empty).
    Sync = 10,
    /// Destination: the VM is built, send memory.
    Ready = 16,
    /// Destination: the guest runs here now.
    Running = 17,
    /// Either side: a UTF-8 reason, then the connection closes.
    Error = 18,
    /// Destination, post-copy: the guest needs these pages (u64 addresses).
    Request = 19,
    /// Destination, post-copy: every page has arrived.
    Done = 20,
    /// Destination, on recovery: a page bitmap of what is still missing.
    Missing = 21,
    /// Destination: every frame before the [`Kind::Sync`] is applied (empty).
    Synced = 22,
}

impl Kind {
    /// Its name as docs/MIGRATION.md and error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Conf => "CONF",
            Kind::Pages => "PAGES",
            Kind::State => "STATE",
            Kind::Digest => "DIGEST",
            Kind::End => "END",
            Kind::Mode => "MODE",
            Kind::Postcopy => "POSTCOPY",
            Kind::Recover => "RECOVER",
            Kind::Auth => "AUTH",
            Kind::Sync => "SYNC",
            Kind::Ready => "READY",
            Kind::Running => "RUNNING",
            Kind::Error => "ERROR",
            Kind::Request => "REQUEST",
            Kind::Done => "DONE",
            Kind::Missing => "MISSING",
            Kind::Synced => "SYNCED",
        }
    }

    pub(crate) fn from(v: u32) -> Option<Kind> {
        Some(match v {
            1 => Kind::Conf,
            2 => Kind::Pages,
            3 => Kind::State,
            4 => Kind::Digest,
            5 => Kind::End,
            6 => Kind::Mode,
            7 => Kind::Postcopy,
            8 => Kind::Recover,
            9 => Kind::Auth,
            10 => Kind::Sync,
            16 => Kind::Ready,
            17 => Kind::Running,
            18 => Kind::Error,
            19 => Kind::Request,
            20 => Kind::Done,
            21 => Kind::Missing,
            22 => Kind::Synced,
            _ => return None,
        })
    }
}

/// Why the stream could not be read. Offsets count bytes from the stream's start.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Nothing arrived within the connection's timeout.
    #[error("{what}: timed out: the peer sent nothing within the migration's timeout (the link stalled, or the peer is stuck)")]
    Stalled {
        /// What was being done.
        what: &'static str,
    },
    /// The connection failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The peer is not a Hover migration source or speaks another version.
    #[error("not a Hover migration stream of version {VERSION} at offset {offset}: {found}")]
    Hello {
        /// Where.
        offset: u64,
        /// What was there.
        found: String,
    },
    /// A frame's header is wrong.
    #[error("frame at offset {offset}: {reason}")]
    Frame {
        /// Where.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// A frame's payload does not match its CRC.
    #[error("{kind:?} frame at offset {offset} is corrupted (CRC mismatch)")]
    Crc {
        /// The frame's kind.
        kind: Kind,
        /// Where.
        offset: u64,
    },
    /// A frame's MAC does not match: altered, replayed, reordered, or not
    /// from the peer that authenticated.
    #[error("{kind:?} frame at offset {offset} fails its MAC: altered in transit or not from the authenticated peer")]
    Mac {
        /// The frame's kind.
        kind: Kind,
        /// Where.
        offset: u64,
    },
    /// A frame's payload is not what its kind carries (message.rs).
    #[error("{} frame at offset {offset}: {reason}", kind.name())]
    Unfit {
        /// The frame's kind.
        kind: Kind,
        /// Where.
        offset: u64,
        /// Why.
        reason: String,
    },
    /// The stream ended early.
    #[error("the stream ended at offset {offset}, inside {what}")]
    Truncated {
        /// Where.
        offset: u64,
        /// Inside what.
        what: String,
    },
}

/// Reads frames, counting the offset for error messages.
pub struct FrameReader<R> {
    inner: R,
    offset: u64,
    mac: Option<FrameMac>,
    limit: u64,
}

/// A frame read: its kind, where it started, its payload.
#[derive(Debug)]
pub struct Frame {
    /// The kind.
    pub kind: Kind,
    /// The stream offset of its header.
    pub offset: u64,
    /// The payload.
    pub payload: Vec<u8>,
}

impl<R: Read> FrameReader<R> {
    /// Read from `inner`.
    pub fn new(inner: R) -> Self {
        FrameReader {
            inner,
            offset: 0,
            mac: None,
            limit: MAX_FRAME,
        }
    }

    /// Refuse frames over `bytes` (at most [`MAX_FRAME`]): before a peer
    /// has proved anything, it may not make this end allocate much.
    pub fn set_limit(&mut self, bytes: u64) {
        self.limit = bytes.min(MAX_FRAME);
    }

    /// From here on, every frame must carry a MAC under `mac`.
    pub fn set_mac(&mut self, mac: FrameMac) {
        self.mac = Some(mac);
    }

    /// The MAC state, on an authenticated link.
    pub fn mac(&self) -> Option<&FrameMac> {
        self.mac.as_ref()
    }

    fn exact(&mut self, buf: &mut [u8], what: impl Fn() -> String) -> Result<(), WireError> {
        match self.inner.read_exact(buf) {
            Ok(()) => {
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(WireError::Truncated {
                offset: self.offset,
                what: what(),
            }),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(WireError::Stalled {
                    what: "reading the stream",
                })
            }
            Err(source) => Err(WireError::Io {
                what: "reading the stream",
                source,
            }),
        }
    }

    /// Read and check the hello: its flags ([`HELLO_AUTH`]).
    pub fn hello(&mut self) -> Result<u32, WireError> {
        let mut h = [0u8; 16];
        self.exact(&mut h, || "the hello".into())?;
        let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        let flags = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"));
        // Unknown flags are refused: a damaged hello must not pass.
        if h[..8] != MAGIC || version != VERSION || flags & !HELLO_AUTH != 0 {
            return Err(WireError::Hello {
                offset: 0,
                found: format!(
                    "magic {:?}, version {version}, flags {flags:#x}",
                    String::from_utf8_lossy(&h[..8])
                ),
            });
        }
        Ok(flags)
    }

    /// Read the next frame, checking its kind, length and CRC.
    pub fn frame(&mut self) -> Result<Frame, WireError> {
        let at = self.offset;
        let mut h = [0u8; HEADER];
        self.exact(&mut h, || format!("a frame header at offset {at}"))?;
        let raw = u32::from_le_bytes(h[0..4].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(h[16..20].try_into().expect("4 bytes"));
        let kind = Kind::from(raw).ok_or_else(|| WireError::Frame {
            offset: at,
            reason: format!("unknown frame kind {raw}"),
        })?;
        // Reserved header words are zero: the CRC covers only the payload,
        // so damage there must show here.
        if h[4..8] != [0; 4] || h[20..24] != [0; 4] {
            return Err(WireError::Frame {
                offset: at,
                reason: "reserved header bytes are not zero".into(),
            });
        }
        if len > self.limit {
            return Err(WireError::Frame {
                offset: at,
                reason: format!(
                    "{kind:?} frame of {len} bytes is over the {}-byte limit",
                    self.limit
                ),
            });
        }
        let mut payload = vec![0u8; len as usize];
        self.exact(&mut payload, || {
            format!("the {kind:?} frame at offset {at}")
        })?;
        if self.mac.is_some() {
            let mut tag = [0u8; MAC_BYTES];
            self.exact(&mut tag, || {
                format!("the MAC of the {kind:?} frame at offset {at}")
            })?;
            let mac = self.mac.as_mut().expect("checked above");
            if !mac.verify(&h, &payload, &tag) {
                return Err(WireError::Mac { kind, offset: at });
            }
        }
        if crc32fast::hash(&payload) != crc {
            return Err(WireError::Crc { kind, offset: at });
        }
        Ok(Frame {
            kind,
            offset: at,
            payload,
        })
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The same stream read through `f(inner)` from here on (offset and
    /// MAC state carried over).
    pub fn map_inner<S>(self, f: impl FnOnce(R) -> S) -> FrameReader<S> {
        FrameReader {
            inner: f(self.inner),
            offset: self.offset,
            mac: self.mac,
            limit: self.limit,
        }
    }
}

/// Writes frames; counts bytes sent.
pub struct FrameWriter<W> {
    inner: W,
    /// Bytes written so far.
    pub bytes: u64,
    mac: Option<FrameMac>,
}

impl<W: Write> FrameWriter<W> {
    /// Write to `inner`.
    pub fn new(inner: W) -> Self {
        FrameWriter {
            inner,
            bytes: 0,
            mac: None,
        }
    }

    /// From here on, every frame carries a MAC under `mac`.
    pub fn set_mac(&mut self, mac: FrameMac) {
        self.mac = Some(mac);
    }

    /// The MAC state, on an authenticated link (a sender process carries
    /// on its sequence).
    pub fn mac(&self) -> Option<&FrameMac> {
        self.mac.as_ref()
    }

    /// The MAC state, to move its sequence on.
    pub fn mac_mut(&mut self) -> Option<&mut FrameMac> {
        self.mac.as_mut()
    }

    /// A writer to `inner`, the same stream, that carries on this one's
    /// MAC sequence: from then on only one of the two may write.
    pub fn hand_over<V: Write>(&self, inner: V) -> FrameWriter<V> {
        FrameWriter {
            inner,
            bytes: 0,
            mac: self.mac.clone(),
        }
    }

    /// The hello, with `flags` ([`HELLO_AUTH`] or 0).
    pub fn hello(&mut self, flags: u32) -> io::Result<()> {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&flags.to_le_bytes());
        self.inner.write_all(&h)?;
        self.bytes += h.len() as u64;
        Ok(())
    }

    /// One frame whose payload is the concatenation of `parts`, written
    /// with vectored writes (no copy into one buffer).
    pub fn frame(&mut self, kind: Kind, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut crc = crc32fast::Hasher::new();
        for p in parts {
            crc.update(p);
        }
        let mut h = [0u8; HEADER];
        h[0..4].copy_from_slice(&(kind as u32).to_le_bytes());
        h[8..16].copy_from_slice(&(len as u64).to_le_bytes());
        h[16..20].copy_from_slice(&crc.finalize().to_le_bytes());
        let tag = self.mac.as_mut().map(|m| m.tag(&h, parts));
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(parts.len() + 2);
        slices.push(IoSlice::new(&h));
        slices.extend(parts.iter().map(|p| IoSlice::new(p)));
        if let Some(t) = &tag {
            slices.push(IoSlice::new(t));
        }
        write_all_vectored(&mut self.inner, &mut slices)?;
        self.bytes += (HEADER + len + tag.map_or(0, |t| t.len())) as u64;
        Ok(())
    }

    /// Push buffered bytes out.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// The writer.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }

    /// The writer, given back.
    pub fn into_inner(self) -> W {
        self.inner
    }
}

/// `write_all` for vectored writes (std's is unstable).
fn write_all_vectored(w: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::page_lists::{pages_header, split_pages};

    fn stream(frames: &[(Kind, Vec<u8>)]) -> Vec<u8> {
        let mut w = FrameWriter::new(Vec::new());
        w.hello(0).unwrap();
        for (k, p) in frames {
            w.frame(*k, &[&p[..p.len() / 2], &p[p.len() / 2..]])
                .unwrap();
        }
        w.inner
    }

    #[test]
    fn frames_round_trip() {
        let page = vec![7u8; 4096];
        let pages = [pages_header(&[0x1000]), page.clone()].concat();
        let s = stream(&[(Kind::Conf, b"conf".to_vec()), (Kind::Pages, pages)]);
        let mut r = FrameReader::new(&s[..]);
        r.hello().unwrap();
        let f = r.frame().unwrap();
        assert_eq!(
            (f.kind, f.offset, &f.payload[..]),
            (Kind::Conf, 16, &b"conf"[..])
        );
        let f = r.frame().unwrap();
        let (gpas, data) = split_pages(&f.payload).unwrap();
        assert_eq!((gpas, data), (vec![0x1000], &page[..]));
        assert!(matches!(r.frame(), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn damage_is_named_with_its_offset() {
        let s = stream(&[(Kind::Conf, b"configuration".to_vec())]);
        let mut bad = s.clone();
        bad[16 + 24 + 3] ^= 1;
        let mut r = FrameReader::new(&bad[..]);
        r.hello().unwrap();
        let e = r.frame().unwrap_err();
        assert!(matches!(e, WireError::Crc { offset: 16, .. }), "{e}");
        let mut bad = s.clone();
        bad[0] = b'X';
        assert!(FrameReader::new(&bad[..]).hello().is_err());
        let mut bad = s.clone();
        bad[16 + 21] = 1;
        let mut r = FrameReader::new(&bad[..]);
        r.hello().unwrap();
        assert!(r.frame().unwrap_err().to_string().contains("reserved"));
        let mut bad = s.clone();
        bad[13] = 1;
        assert!(FrameReader::new(&bad[..]).hello().is_err());
        let mut bad = s.clone();
        bad[12] = HELLO_AUTH as u8;
        assert_eq!(FrameReader::new(&bad[..]).hello().unwrap(), HELLO_AUTH);
        let mut bad = s.clone();
        bad[16] = 99;
        let mut r = FrameReader::new(&bad[..]);
        r.hello().unwrap();
        assert!(r
            .frame()
            .unwrap_err()
            .to_string()
            .contains("unknown frame kind 99"));
        let mut bad = s.clone();
        bad[16 + 8..16 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
        let mut r = FrameReader::new(&bad[..]);
        r.hello().unwrap();
        assert!(r.frame().unwrap_err().to_string().contains("over the"));
        let mut r = FrameReader::new(&s[..s.len() - 2]);
        r.hello().unwrap();
        assert!(matches!(r.frame(), Err(WireError::Truncated { .. })));
    }

    #[test]
    fn a_frame_over_the_limit_is_refused() {
        let s = stream(&[(Kind::Error, vec![b'x'; 5000])]);
        let mut r = FrameReader::new(&s[..]);
        r.hello().unwrap();
        r.set_limit(4096);
        assert!(r
            .frame()
            .unwrap_err()
            .to_string()
            .contains("4096-byte limit"));
    }
}
