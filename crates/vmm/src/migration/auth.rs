//! Authenticated migration links (docs/MIGRATION.md, "Who may migrate"):
//! both ends prove they hold the same pre-shared key before any state is
//! read, and from then on every frame carries a MAC under a key of its own
//! direction and connection, so a frame altered, replayed, reordered or
//! reflected is refused.
//!
//! ```text
//! source -> destination: HELLO (flag AUTH), AUTH(nonce_s)
//! destination -> source: AUTH(nonce_d, proof_d)
//! source -> destination: AUTH(proof_s)
//! then every frame: header, payload, MAC (32 bytes)
//! ```
//! `proof_x = BLAKE3-keyed(K, label_x || nonce_s || nonce_d)`; each
//! direction's frame key is `BLAKE3-derive(K || nonces || direction)`; a
//! frame's MAC covers its sequence number in that direction, its header and
//! its payload. The link is not encrypted: guest memory crosses it in the
//! clear, so a network others can read needs a tunnel of its own.

use std::io::{self, Read, Write};
use std::sync::Arc;

pub use super::mac::{FrameMac, MAC_BYTES};
use super::message::Message;
use super::transport::Addr;
use super::wire::{FrameReader, FrameWriter, HELLO_AUTH};
use super::MigrationError;
pub use crate::config::MigrationKey;
use crate::host::random_bytes;

const NONCE: usize = 32;
const FRAME_KEY_CONTEXT: &str = "hover 2026-11-25 migration frame key";
const SOURCE_PROOF: &[u8] = b"hover migration source proof";
const DESTINATION_PROOF: &[u8] = b"hover migration destination proof";

/// What one end of a migration asks of its links: a key to prove, or
/// none, and whether TCP without one is allowed.
#[derive(Clone, Debug, Default)]
pub struct LinkAuth {
    /// The pre-shared key: links that have one authenticate, whatever the
    /// transport; a peer without it is refused.
    pub key: Option<Arc<MigrationKey>>,
    /// Allow TCP without a key (`--insecure`): anyone who reaches the port
    /// may send or receive a VM.
    pub insecure: bool,
}

impl LinkAuth {
    /// Whether a link at `addr` may be used: TCP needs a key or `insecure`
    /// (a Unix socket relies on its file's 0600 mode). `how` says how to
    /// give each, for the message.
    pub fn check(&self, addr: &Addr, how: &str) -> Result<(), Unauthenticated> {
        match addr {
            Addr::Tcp(_) if self.key.is_none() && !self.insecure => Err(Unauthenticated {
                how: how.to_string(),
            }),
            _ => Ok(()),
        }
    }
}

/// A TCP link without a key, and not asked for as `insecure`.
#[derive(Debug, thiserror::Error)]
#[error("a migration over TCP must be authenticated: {how} (`hover migration-key FILE` makes a key; copy it to both hosts)")]
pub struct Unauthenticated {
    /// How to give a key or ask for no authentication, where it was refused.
    pub how: String,
}

/// The frame MAC for `direction` (0: source to destination, 1: back) of
/// the connection whose nonces are `ns` and `nd`.
fn frame_mac(key: &MigrationKey, ns: &[u8; NONCE], nd: &[u8; NONCE], direction: u8) -> FrameMac {
    let mut material = Vec::with_capacity(32 + 2 * NONCE + 1);
    material.extend_from_slice(key.secret());
    material.extend_from_slice(ns);
    material.extend_from_slice(nd);
    material.push(direction);
    FrameMac::from_key_bytes(blake3::derive_key(FRAME_KEY_CONTEXT, &material))
}

fn proof(key: &MigrationKey, label: &[u8], ns: &[u8; NONCE], nd: &[u8; NONCE]) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key.secret());
    h.update(label);
    h.update(ns);
    h.update(nd);
    h.finalize()
}

fn auth_error(what: impl Into<String>) -> MigrationError {
    MigrationError::Auth(what.into())
}

/// Which end reads an AUTH frame: how the other end's ERROR is told.
#[derive(Clone, Copy)]
enum Reading {
    /// The source: the destination's ERROR is its refusal.
    Source,
    /// The destination: the source's ERROR says why it gave up.
    Destination,
}

/// Read the peer's next AUTH frame of `len` bytes.
fn expect_auth(
    r: &mut FrameReader<impl Read>,
    len: usize,
    me: Reading,
) -> Result<Vec<u8>, MigrationError> {
    match (r.message()?.message, me) {
        (Message::Auth(payload), _) if payload.len() == len => Ok(payload),
        (Message::Auth(payload), _) => Err(auth_error(format!(
            "an AUTH frame of {} bytes where {len} belong",
            payload.len()
        ))),
        (Message::Error(why), Reading::Source) => Err(MigrationError::Refused(why)),
        (Message::Error(why), Reading::Destination) => {
            Err(auth_error(format!("the source gave up: {why}")))
        }
        (other, _) => Err(auth_error(format!(
            "the peer sent {} where its AUTH frame belongs",
            other.kind().name()
        ))),
    }
}

/// The source's side, right after its hello (sent with [`HELLO_AUTH`]):
/// prove the key, check the destination's proof, and turn on both
/// directions' MACs.
pub fn client(
    key: &MigrationKey,
    r: &mut FrameReader<impl Read>,
    w: &mut FrameWriter<impl Write>,
) -> Result<(), MigrationError> {
    let link = |e: io::Error| MigrationError::Link(format!("authenticating: {e}"));
    let mut ns = [0u8; NONCE];
    random_bytes(&mut ns).map_err(|e| MigrationError::Host(format!("a random nonce: {e}")))?;
    // A destination that refuses at once (no key, another key policy)
    // closes before reading this: its ERROR is the answer, not the pipe.
    let sent = w.send(&Message::Auth(ns.to_vec()));
    let answer = expect_auth(r, 2 * NONCE, Reading::Source);
    let answer = match (sent, answer) {
        (_, Ok(a)) => a,
        (Err(e), Err(MigrationError::Wire(_))) => return Err(link(e)),
        (_, Err(e)) => return Err(e),
    };
    let nd: [u8; NONCE] = answer[..NONCE].try_into().expect("checked length");
    let theirs: [u8; 32] = answer[NONCE..].try_into().expect("checked length");
    if blake3::Hash::from(theirs) != proof(key, DESTINATION_PROOF, &ns, &nd) {
        let why = "the destination does not hold this migration key (its proof does not match)";
        // Tell the destination, so that its log says why too.
        let _ = w.send(&Message::Error(why.into()));
        return Err(auth_error(why));
    }
    let mine = proof(key, SOURCE_PROOF, &ns, &nd);
    w.send(&Message::Auth(mine.as_bytes().to_vec()))
        .map_err(link)?;
    w.set_mac(frame_mac(key, &ns, &nd, 0));
    r.set_mac(frame_mac(key, &ns, &nd, 1));
    Ok(())
}

/// The destination's side, after reading a hello with `flags`: whether
/// the source authenticates must match whether this end has a key (a
/// mismatch is refused with a reason); with a key, check the source's
/// proof before anything else is read and turn on both directions' MACs.
pub fn server(
    key: Option<&MigrationKey>,
    flags: u32,
    r: &mut FrameReader<impl Read>,
    w: &mut FrameWriter<impl Write>,
) -> Result<(), MigrationError> {
    let key = match (key, flags & HELLO_AUTH != 0) {
        (None, false) => return Ok(()),
        (Some(k), true) => k,
        (Some(_), false) => {
            return Err(auth_error(
                "this receiver requires an authenticated migration: give the source's VMM the same --migration-key",
            ))
        }
        (None, true) => {
            return Err(auth_error(
                "the source authenticates but this receiver has no key: start it with the same --migration-key",
            ))
        }
    };
    let link = |e: io::Error| MigrationError::Link(format!("authenticating: {e}"));
    let theirs = expect_auth(r, NONCE, Reading::Destination)?;
    let ns: [u8; NONCE] = theirs[..].try_into().expect("checked length");
    let mut nd = [0u8; NONCE];
    random_bytes(&mut nd).map_err(|e| MigrationError::Host(format!("a random nonce: {e}")))?;
    let mine = proof(key, DESTINATION_PROOF, &ns, &nd);
    w.send(&Message::Auth([&nd[..], mine.as_bytes()].concat()))
        .map_err(link)?;
    let proved: [u8; 32] = expect_auth(r, 32, Reading::Destination)?[..]
        .try_into()
        .expect("checked length");
    if blake3::Hash::from(proved) != proof(key, SOURCE_PROOF, &ns, &nd) {
        return Err(auth_error(
            "the source does not hold this migration key (its proof does not match)",
        ));
    }
    w.set_mac(frame_mac(key, &ns, &nd, 1));
    r.set_mac(frame_mac(key, &ns, &nd, 0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::transport::Conn;
    use crate::migration::wire::Kind;
    use std::os::unix::net::UnixStream;

    /// A key from `s` and a fixed mix of characters (enough kinds of
    /// byte to pass the key's entropy check).
    fn key(s: &str) -> MigrationKey {
        MigrationKey::from_secret(format!("{}0123456789abcdef", s.repeat(32)).as_bytes()).unwrap()
    }

    /// Run the source's and the destination's handshakes against each
    /// other over a socket pair: each side's result and its reader and
    /// writer.
    #[allow(clippy::type_complexity)]
    fn pair(
        source_key: Option<MigrationKey>,
        destination_key: Option<MigrationKey>,
    ) -> (
        Result<(FrameReader<Conn>, FrameWriter<Conn>), MigrationError>,
        Result<(FrameReader<Conn>, FrameWriter<Conn>), MigrationError>,
    ) {
        let (a, b) = UnixStream::pair().unwrap();
        let ends = |s: UnixStream| {
            let c = Conn::Unix(s);
            (
                FrameReader::new(c.try_clone().unwrap()),
                FrameWriter::new(c),
            )
        };
        let (mut dr, mut dw) = ends(b);
        let dst = std::thread::spawn(move || {
            let flags = dr.hello()?;
            match server(destination_key.as_ref(), flags, &mut dr, &mut dw) {
                Ok(()) => Ok((dr, dw)),
                Err(e) => {
                    let _ = dw.send(&Message::Error(e.to_string()));
                    Err(e)
                }
            }
        });
        let (mut sr, mut sw) = ends(a);
        let src = (|| {
            sw.hello(if source_key.is_some() { HELLO_AUTH } else { 0 })
                .map_err(|e| MigrationError::Host(e.to_string()))?;
            if let Some(k) = &source_key {
                client(k, &mut sr, &mut sw)?;
            }
            Ok((sr, sw))
        })();
        let dst = dst.join().unwrap().map_err(|e: MigrationError| e);
        (src, dst)
    }

    #[test]
    fn the_same_key_authenticates_and_frames_carry_macs() {
        let (src, dst) = pair(Some(key("a")), Some(key("a")));
        let (mut sr, mut sw) = src.unwrap();
        let (mut dr, mut dw) = dst.unwrap();
        sw.frame(Kind::Conf, &[b"conf", b"iguration"]).unwrap();
        let f = dr.frame().unwrap();
        assert_eq!(
            (f.kind, &f.payload[..]),
            (Kind::Conf, &b"configuration"[..])
        );
        dw.frame(Kind::Ready, &[]).unwrap();
        assert_eq!(sr.frame().unwrap().kind, Kind::Ready);
    }

    #[test]
    fn a_wrong_key_or_none_is_refused_before_any_frame_is_read() {
        // Different keys: each side finds the other's proof wrong.
        let (src, dst) = pair(Some(key("a")), Some(key("b")));
        assert!(
            matches!(&src, Err(MigrationError::Auth(m)) if m.contains("destination does not hold")),
            "{:?}",
            src.err()
        );
        assert!(dst.is_err());
        // A receiver with a key refuses a source without one, and says why.
        let (src, dst) = pair(None, Some(key("a")));
        assert!(src.is_ok(), "the source learns it on its next read");
        assert!(
            matches!(&dst, Err(MigrationError::Auth(m)) if m.contains("requires an authenticated")),
            "{:?}",
            dst.err()
        );
        // A source with a key refuses a receiver without one.
        let (src, dst) = pair(Some(key("a")), None);
        assert!(
            matches!(&src, Err(MigrationError::Refused(m)) if m.contains("has no key")),
            "{:?}",
            src.err()
        );
        assert!(dst.is_err());
    }

    #[test]
    fn an_altered_replayed_reordered_or_reflected_frame_is_refused() {
        let (ns, nd) = ([1u8; NONCE], [2u8; NONCE]);
        let k = key("a");
        let forth = || frame_mac(&k, &ns, &nd, 0);
        let frames = |macs: FrameMac, payloads: &[&[u8]]| {
            let mut w = FrameWriter::new(Vec::new());
            w.set_mac(macs);
            for p in payloads {
                w.frame(Kind::Conf, &[p]).unwrap();
            }
            w.into_inner()
        };
        let read_all = |bytes: &[u8], mac: FrameMac| {
            let mut r = FrameReader::new(bytes);
            r.set_mac(mac);
            let mut n = 0;
            loop {
                match r.frame() {
                    Ok(_) => n += 1,
                    Err(e) => return (n, e.to_string()),
                }
            }
        };
        let two = frames(forth(), &[b"first", b"second"]);
        let (n, end) = read_all(&two, forth());
        assert_eq!(n, 2, "{end}");
        // One payload byte flipped, its CRC fixed as an attacker would.
        let mut bad = two.clone();
        bad[24] ^= 1;
        let crc = crc32fast::hash(&bad[24..29]);
        bad[16..20].copy_from_slice(&crc.to_le_bytes());
        let (n, e) = read_all(&bad, forth());
        assert!(n == 0 && e.contains("MAC"), "{e}");
        // The first frame replayed in the second's place.
        let one = frames(forth(), &[b"first"]);
        let (n, e) = read_all(&[&one[..], &one[..]].concat(), forth());
        assert!(n == 1 && e.contains("MAC"), "{e}");
        // The second frame first.
        let second = &two[one.len()..];
        let (n, e) = read_all(second, forth());
        assert!(n == 0 && e.contains("MAC"), "{e}");
        // The other direction's key, or another connection's nonces.
        let (n, e) = read_all(&two, frame_mac(&k, &ns, &nd, 1));
        assert!(n == 0 && e.contains("MAC"), "{e}");
        let (n, e) = read_all(&two, frame_mac(&k, &nd, &ns, 0));
        assert!(n == 0 && e.contains("MAC"), "{e}");
        // A frame without its MAC is cut short.
        let (n, _) = read_all(&two[..one.len() - MAC_BYTES], forth());
        assert_eq!(n, 0);
    }

    #[test]
    fn tcp_needs_a_key_or_insecure() {
        let tcp: Addr = "tcp:127.0.0.1:1".parse().unwrap();
        let unix: Addr = "unix:/tmp/x".parse().unwrap();
        let none = LinkAuth::default();
        assert!(none
            .check(&tcp, "give --migration-key")
            .unwrap_err()
            .to_string()
            .contains("--migration-key"));
        assert!(none.check(&unix, "").is_ok());
        let insecure = LinkAuth {
            key: None,
            insecure: true,
        };
        assert!(insecure.check(&tcp, "").is_ok());
        let keyed = LinkAuth {
            key: Some(Arc::new(key("k"))),
            insecure: false,
        };
        assert!(keyed.check(&tcp, "").is_ok());
    }
}
