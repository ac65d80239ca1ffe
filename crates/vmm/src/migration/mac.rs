//! The MAC state of one direction of an authenticated migration link:
//! BLAKE3 keyed by that direction's frame key (migration/auth.rs derives
//! it), over each frame's sequence number, header and payload.

/// Bytes of a MAC on each frame of an authenticated link.
pub const MAC_BYTES: usize = 32;

/// The MAC state of one direction of a link.
#[derive(Clone)]
pub struct FrameMac {
    key: [u8; 32],
    seq: u64,
}

impl std::fmt::Debug for FrameMac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FrameMac {{ seq: {} }}", self.seq)
    }
}

impl FrameMac {
    /// The MAC of the next frame (`header` and its payload in `parts`);
    /// the sequence number moves on.
    pub fn tag(&mut self, header: &[u8], parts: &[&[u8]]) -> [u8; MAC_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&self.seq.to_le_bytes());
        h.update(header);
        for p in parts {
            h.update(p);
        }
        self.seq += 1;
        *h.finalize().as_bytes()
    }

    /// Whether `tag` is the next frame's MAC (compared in constant time);
    /// the sequence number moves on either way.
    pub fn verify(&mut self, header: &[u8], payload: &[u8], tag: &[u8; MAC_BYTES]) -> bool {
        blake3::Hash::from(self.tag(header, &[payload])) == blake3::Hash::from(*tag)
    }

    /// Frames this direction has carried.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Carry on from frame `seq` (a sender process wrote the ones between).
    pub fn set_seq(&mut self, seq: u64) {
        self.seq = seq;
    }

    /// The key, to hand a sender process that writes frames of this direction.
    pub fn key_bytes(&self) -> [u8; 32] {
        self.key
    }

    /// A MAC state from a key handed over by [`FrameMac::key_bytes`].
    pub fn from_key_bytes(key: [u8; 32]) -> FrameMac {
        FrameMac { key, seq: 0 }
    }
}
