//! The migration stream's messages: one [`Message`] variant per frame kind
//! ([`Kind`]), each payload's encoding and decoding beside it, as Cloud
//! Hypervisor's `vm-migration/src/protocol.rs` keeps its requests. `wire`
//! frames bytes (header, CRC, MAC); this says what the bytes of each frame
//! mean. A frame whose payload is not its kind's is refused here, with its
//! kind and offset, before any side acts on it.
//!
//! Payloads whose check needs the receiver's guest memory size (a page
//! set, a request's addresses) are decoded to their own types here and
//! checked against that size where it is known ([`PageSet::pages`],
//! [`Request::pages`]).

use hover_abi::layout::PAGE_SIZE;

use super::page_lists::{
    decode_addrs, decode_page_set, encode_addrs, pages_header, split_pages, PageListError,
};
use std::borrow::Cow;
use std::io::{self, Read, Write};

use super::wire::{Frame, FrameReader, FrameWriter, Kind, WireError};
use crate::state::{SavedMachine, VmState};

/// [`Kind::Mode`]'s first byte: every page arrives before the guest runs
/// at the destination.
const MODE_PRECOPY: u8 = 0;
/// [`Kind::Mode`]'s first byte: the guest may run at the destination
/// before all its pages arrive.
const MODE_POSTCOPY: u8 = 1;

/// One frame of the stream, decoded.
#[derive(Debug)]
pub enum Message {
    /// Source: what to build.
    Conf(Box<SavedMachine>),
    /// Source: how memory will move.
    Mode(Mode),
    /// Source: a batch of pages.
    Pages(Pages),
    /// Source: the VM's state (vCPUs, irqchip, clock, devices).
    State(Box<VmState>),
    /// Source: what guest memory digests to (with `--verify`).
    Digest(Digest),
    /// Source: nothing more (post-copy: every page has been sent).
    End,
    /// Source: run the guest now; the pages still at the source.
    Postcopy(PageSet),
    /// Source: the first frame of a connection resuming a broken post-copy.
    Recover,
    /// Either side, on an authenticated link: a nonce or a proof (auth.rs).
    Auth(Vec<u8>),
    /// Source, before it pauses: answer [`Message::Synced`] once every
    /// frame before this one is applied.
    Sync,
    /// Destination: the VM is built, send memory.
    Ready,
    /// Destination: the guest runs here now.
    Running(RunningFrame),
    /// Either side: why it gives up (the connection closes after it).
    Error(String),
    /// Destination, post-copy: the guest needs these pages.
    Request(Request),
    /// Destination, post-copy: every page has arrived.
    Done,
    /// Destination, on recovery: the pages still missing here.
    Missing(PageSet),
    /// Destination: every frame before the [`Message::Sync`] is applied.
    Synced,
}

/// [`Message::Mode`]: how memory moves, and whether the source sends a
/// digest to check it by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mode {
    /// The guest may run at the destination before all pages arrive.
    pub postcopy: bool,
    /// A [`Message::Digest`] comes before [`Message::End`].
    pub verify: bool,
}

/// [`Message::Digest`]: pre-copy's CRC32 of every page that holds
/// something (`state::memory::digest`), or post-copy's sum of the page
/// hashes of what was sent after the guest moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digest {
    /// Pre-copy: 4 bytes.
    Memory(u32),
    /// Post-copy: 8 bytes.
    Postcopy(u64),
}

/// [`Message::Pages`]: page addresses and their contents, kept in the
/// frame's own buffer (a batch is up to 16 MiB: never copied).
#[derive(Debug)]
pub struct Pages {
    gpas: Vec<u64>,
    payload: Vec<u8>,
    data_at: usize,
}

impl Pages {
    /// The pages' guest addresses (page-aligned), in the frame's order.
    pub fn gpas(&self) -> &[u64] {
        &self.gpas
    }

    /// The pages' contents, one `PAGE_SIZE` chunk per address.
    pub fn data(&self) -> &[u8] {
        &self.payload[self.data_at..]
    }

    /// Each page with its address.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.gpas
            .iter()
            .copied()
            .zip(self.data().chunks_exact(PAGE_SIZE as usize))
    }
}

/// A set of pages (`page_lists::encode_page_set`): as it came, checked
/// against the receiver's guest memory by [`PageSet::pages`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageSet(Vec<u8>);

impl PageSet {
    /// The set of `gpas` in guest memory ending at `end`.
    pub fn of(gpas: impl IntoIterator<Item = u64>, end: u64) -> PageSet {
        PageSet(super::page_lists::encode_page_set(gpas, end))
    }

    /// Its page addresses, ascending, each below `end`; why not.
    pub fn pages(&self, end: u64) -> Result<Vec<u64>, PageListError> {
        decode_page_set(&self.0, end)
    }
}

/// [`Message::Request`]'s addresses: as they came, checked against the
/// source's guest memory by [`Request::pages`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request(Vec<u8>);

impl Request {
    /// A request for `gpas`.
    pub fn of(gpas: &[u64]) -> Request {
        Request(encode_addrs(gpas))
    }

    /// Its addresses, each page-aligned and below `end`; why not.
    pub fn pages(&self, end: u64) -> Result<Vec<u64>, PageListError> {
        decode_addrs(&self.0, end)
    }
}

/// The payload of [`Kind::Running`]: the destination's TSC when its guest
/// was about to run, and how long it took from the stream's end to there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunningFrame {
    /// The destination's TSC.
    pub tsc: u64,
    /// Microseconds from reading the last frame to sending `RUNNING`.
    pub load_us: u64,
}

impl RunningFrame {
    /// Its 16 bytes.
    pub fn encode(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.tsc.to_le_bytes());
        b[8..].copy_from_slice(&self.load_us.to_le_bytes());
        b
    }

    /// Read a payload; `None` unless it is 16 bytes.
    pub fn decode(b: &[u8]) -> Option<RunningFrame> {
        let b: &[u8; 16] = b.try_into().ok()?;
        Some(RunningFrame {
            tsc: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            load_us: u64::from_le_bytes(b[8..].try_into().expect("8 bytes")),
        })
    }
}

impl Message {
    /// Its frame kind.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Conf(_) => Kind::Conf,
            Message::Mode(_) => Kind::Mode,
            Message::Pages(_) => Kind::Pages,
            Message::State(_) => Kind::State,
            Message::Digest(_) => Kind::Digest,
            Message::End => Kind::End,
            Message::Postcopy(_) => Kind::Postcopy,
            Message::Recover => Kind::Recover,
            Message::Auth(_) => Kind::Auth,
            Message::Sync => Kind::Sync,
            Message::Ready => Kind::Ready,
            Message::Running(_) => Kind::Running,
            Message::Error(_) => Kind::Error,
            Message::Request(_) => Kind::Request,
            Message::Done => Kind::Done,
            Message::Missing(_) => Kind::Missing,
            Message::Synced => Kind::Synced,
        }
    }

    /// Its payload's bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.payload().into_owned()
    }

    /// Its payload, borrowed where the message holds it as sent (a page
    /// set is written inside the downtime: not copied first).
    fn payload(&self) -> Cow<'_, [u8]> {
        let owned = Cow::Owned;
        match self {
            Message::Conf(c) => owned(document(c.as_ref())),
            Message::State(s) => owned(document(s.as_ref())),
            Message::Mode(m) => owned(vec![
                if m.postcopy {
                    MODE_POSTCOPY
                } else {
                    MODE_PRECOPY
                },
                m.verify as u8,
            ]),
            Message::Pages(p) => owned([pages_header(&p.gpas), p.data().to_vec()].concat()),
            Message::Digest(Digest::Memory(d)) => owned(d.to_le_bytes().to_vec()),
            Message::Digest(Digest::Postcopy(d)) => owned(d.to_le_bytes().to_vec()),
            Message::Postcopy(s) | Message::Missing(s) => Cow::Borrowed(&s.0),
            Message::Request(r) => Cow::Borrowed(&r.0),
            Message::Auth(b) => Cow::Borrowed(b),
            Message::Running(r) => owned(r.encode().to_vec()),
            Message::Error(why) => Cow::Borrowed(why.as_bytes()),
            Message::End
            | Message::Recover
            | Message::Sync
            | Message::Ready
            | Message::Done
            | Message::Synced => Cow::Borrowed(&[]),
        }
    }

    /// The message a frame carries; a payload that is not its kind's is
    /// refused with the frame's kind and offset.
    pub fn decode(f: Frame) -> Result<Message, WireError> {
        let unfit = |reason: String| WireError::Unfit {
            kind: f.kind,
            offset: f.offset,
            reason,
        };
        let empty = |m: Message| {
            if f.payload.is_empty() {
                Ok(m)
            } else {
                Err(unfit(format!(
                    "{} bytes where none belong",
                    f.payload.len()
                )))
            }
        };
        let state =
            |what| move |e: postcard::Error| unfit(format!("{what} cannot be decoded: {e}"));
        Ok(match f.kind {
            Kind::Conf => Message::Conf(Box::new(
                postcard::from_bytes(&f.payload).map_err(state("the configuration"))?,
            )),
            Kind::State => Message::State(Box::new(
                postcard::from_bytes(&f.payload).map_err(state("the VM's state"))?,
            )),
            Kind::Mode => match f.payload[..] {
                [m @ (MODE_PRECOPY | MODE_POSTCOPY), v @ (0 | 1)] => Message::Mode(Mode {
                    postcopy: m == MODE_POSTCOPY,
                    verify: v == 1,
                }),
                ref other => {
                    return Err(unfit(format!(
                        "{other:?} is not a migration mode and verify flag"
                    )))
                }
            },
            Kind::Pages => {
                let (gpas, data) = split_pages(&f.payload).map_err(|e| unfit(e.to_string()))?;
                let data_at = f.payload.len() - data.len();
                Message::Pages(Pages {
                    gpas,
                    payload: f.payload,
                    data_at,
                })
            }
            Kind::Digest => match f.payload.len() {
                4 => Message::Digest(Digest::Memory(u32::from_le_bytes(
                    f.payload[..].try_into().expect("4 bytes"),
                ))),
                8 => Message::Digest(Digest::Postcopy(u64::from_le_bytes(
                    f.payload[..].try_into().expect("8 bytes"),
                ))),
                n => return Err(unfit(format!("a digest of {n} bytes (4 or 8)"))),
            },
            // RUNNING is the commit (the guest runs there now); its
            // figures only fill the source's report, so a payload that is
            // not 16 bytes reads as none rather than failing a move that
            // happened (the source would resume its guest beside it).
            Kind::Running => Message::Running(RunningFrame::decode(&f.payload).unwrap_or_default()),
            Kind::Postcopy => Message::Postcopy(PageSet(f.payload)),
            Kind::Missing => Message::Missing(PageSet(f.payload)),
            Kind::Request => Message::Request(Request(f.payload)),
            Kind::Auth => Message::Auth(f.payload),
            Kind::Error => Message::Error(peer_text(&f.payload)),
            Kind::End => empty(Message::End)?,
            Kind::Recover => empty(Message::Recover)?,
            Kind::Sync => empty(Message::Sync)?,
            Kind::Ready => empty(Message::Ready)?,
            Kind::Done => empty(Message::Done)?,
            Kind::Synced => empty(Message::Synced)?,
        })
    }
}

/// A peer's text (an ERROR frame's reason) as this end quotes it: at most
/// 200 characters, so a peer cannot fill logs or answers with its own.
fn peer_text(payload: &[u8]) -> String {
    const MAX: usize = 200;
    let s = String::from_utf8_lossy(payload);
    match s.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}... ({} bytes)", &s[..cut], payload.len()),
        None => s.into_owned(),
    }
}

impl<R: Read> FrameReader<R> {
    /// Read the next frame and decode its message.
    pub fn message(&mut self) -> Result<Received, WireError> {
        let f = self.frame()?;
        let offset = f.offset;
        Ok(Received {
            offset,
            message: Message::decode(f)?,
        })
    }
}

impl<W: Write> FrameWriter<W> {
    /// One message in its frame.
    pub fn send(&mut self, m: &Message) -> io::Result<()> {
        debug_assert!(
            !matches!(m, Message::Pages(_)),
            "pages go out through send_pages, from the sender's buffers"
        );
        self.frame(m.kind(), &[&m.payload()])
    }

    /// A PAGES message from the sender's own buffers: `data` holds one
    /// page per address of `gpas`, written as they are (no copy).
    pub fn send_pages(&mut self, gpas: &[u64], data: &[u8]) -> io::Result<()> {
        debug_assert_eq!(data.len(), gpas.len() * PAGE_SIZE as usize);
        self.frame(Kind::Pages, &[&pages_header(gpas), data])
    }
}

/// A message read, with where its frame started (for errors).
#[derive(Debug)]
pub struct Received {
    /// The stream offset of its frame's header.
    pub offset: u64,
    /// The message.
    pub message: Message,
}

/// A state document's bytes: the snapshot file's encoding (postcard).
fn document(v: &impl serde::Serialize) -> Vec<u8> {
    postcard::to_allocvec(v).expect("state types always encode")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: &Message) -> Result<Message, WireError> {
        let mut w = FrameWriter::new(Vec::new());
        w.hello(0).unwrap();
        w.send(m).unwrap();
        let bytes = w.into_inner();
        let mut r = FrameReader::new(&bytes[..]);
        r.hello().unwrap();
        r.message().map(|got| got.message)
    }

    /// Every kind's message comes back as it went, its bytes those the
    /// stream carried before messages were typed (the stream's version
    /// did not change with them).
    #[test]
    fn each_message_comes_back_as_sent_in_the_same_bytes() {
        let page = vec![9u8; PAGE_SIZE as usize];
        let batch = [pages_header(&[0x3000]), page.clone()].concat();
        let running = RunningFrame { tsc: 7, load_us: 9 };
        let cases: Vec<(Message, Vec<u8>)> = vec![
            (
                Message::Mode(Mode {
                    postcopy: true,
                    verify: false,
                }),
                vec![1, 0],
            ),
            (
                Message::Mode(Mode {
                    postcopy: false,
                    verify: true,
                }),
                vec![0, 1],
            ),
            (
                Message::Digest(Digest::Memory(0xabcd)),
                0xabcdu32.to_le_bytes().to_vec(),
            ),
            (
                Message::Digest(Digest::Postcopy(5)),
                5u64.to_le_bytes().to_vec(),
            ),
            (Message::Running(running), running.encode().to_vec()),
            (Message::Error("no room".into()), b"no room".to_vec()),
            (
                Message::Request(Request::of(&[0x1000])),
                encode_addrs(&[0x1000]),
            ),
            (Message::Auth(vec![1, 2, 3]), vec![1, 2, 3]),
            (Message::End, vec![]),
            (Message::Synced, vec![]),
        ];
        for (m, bytes) in cases {
            assert_eq!(m.encode(), bytes, "{m:?}");
            let back = round_trip(&m).unwrap();
            assert_eq!(back.kind(), m.kind());
            assert_eq!(back.encode(), bytes, "{m:?}");
        }
        let mut w = FrameWriter::new(Vec::new());
        w.hello(0).unwrap();
        w.send_pages(&[0x3000], &page).unwrap();
        let bytes = w.into_inner();
        let mut r = FrameReader::new(&bytes[..]);
        r.hello().unwrap();
        let Message::Pages(p) = r.message().unwrap().message else {
            panic!("not pages")
        };
        assert_eq!(p.gpas(), &[0x3000]);
        assert_eq!(p.data(), &page[..]);
        assert_eq!(Message::Pages(p).encode(), batch);
        let set = PageSet::of([0x1000, 0x2000], 1 << 20);
        let Message::Missing(back) = round_trip(&Message::Missing(set.clone())).unwrap() else {
            panic!("not a page set")
        };
        assert_eq!(back.pages(1 << 20).unwrap(), vec![0x1000, 0x2000]);
    }

    /// A peer's ERROR text is cut at 200 characters.
    #[test]
    fn a_peers_text_is_cut() {
        assert_eq!(peer_text(b"no room"), "no room");
        let long = peer_text(&[b'x'; 100_000]);
        assert!(
            long.len() < 250 && long.ends_with("(100000 bytes)"),
            "{long}"
        );
    }

    /// A RUNNING whose payload is not 16 bytes still commits the move: its
    /// figures read as none.
    #[test]
    fn a_short_running_still_commits() {
        let f = Frame {
            kind: Kind::Running,
            offset: 40,
            payload: vec![0; 15],
        };
        match Message::decode(f) {
            Ok(Message::Running(r)) => assert_eq!(r, RunningFrame::default()),
            other => panic!("{other:?}"),
        }
    }

    /// A payload that is not its kind's is refused naming the kind, the
    /// frame's offset and what is wrong.
    #[test]
    fn a_payload_unfit_for_its_kind_is_refused_with_kind_and_offset() {
        let frame = |kind, payload: &[u8]| Frame {
            kind,
            offset: 40,
            payload: payload.to_vec(),
        };
        for (f, says) in [
            (frame(Kind::Mode, &[2, 0]), "not a migration mode"),
            (frame(Kind::Mode, &[0, 2]), "not a migration mode"),
            (frame(Kind::Mode, &[0]), "not a migration mode"),
            (frame(Kind::Digest, &[1, 2, 3]), "a digest of 3 bytes"),
            (frame(Kind::End, &[1]), "1 bytes where none belong"),
            (frame(Kind::Pages, &[0; 4]), "without its count"),
            (
                frame(Kind::Conf, &[0xff; 3]),
                "the configuration cannot be decoded",
            ),
            (frame(Kind::State, &[]), "the VM's state cannot be decoded"),
        ] {
            let e = Message::decode(f).unwrap_err().to_string();
            assert!(e.contains("at offset 40") && e.contains(says), "{e}");
        }
    }
}
