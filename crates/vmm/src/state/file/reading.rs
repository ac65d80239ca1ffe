//! Opening a snapshot file: the file itself, its header, then each section
//! in file order, every check refusing with the offset of what it read
//! (fuzzed through [`super::Snapshot::open`], which puts them together).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hover_abi::layout::PAGE_SIZE;
use serde::de::DeserializeOwned;

use super::{
    crc, read_at, MemoryIndex, SnapshotError, DATA_OFFSET, FORMAT_VERSION, HEADER_LEN, MAGIC,
    MAX_SECTION, SECTIONS, SECTION_HEADER_LEN,
};

/// Open `path` for reading, refusing what is not a regular file (a FIFO
/// is opened without waiting for a writer); the file and its length.
pub(super) fn open_regular(path: &Path) -> Result<(File, u64), SnapshotError> {
    let io = |what, source| SnapshotError::Io {
        path: path.into(),
        what,
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io("cannot open it", e))?;
    let meta = file.metadata().map_err(|e| io("cannot read it", e))?;
    if !meta.is_file() {
        return Err(io(
            "cannot read it",
            io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
        ));
    }
    Ok((file, meta.len()))
}

/// What the header says: where the pages and the sections start, and
/// where the file's content ends.
pub(super) struct Header {
    /// The first page's offset.
    pub data_at: u64,
    /// The first section's offset.
    pub sections_at: u64,
    /// The end of the last section.
    pub size: u64,
}

/// The file of `len` bytes read as sections, in order.
pub(super) struct Sections<'a> {
    path: &'a Path,
    file: &'a File,
    len: u64,
    at: u64,
}

impl<'a> Sections<'a> {
    /// Read and check the header of `file` (`len` bytes): magic, version,
    /// CRC, and fields that fit the file; the sections, from where it says.
    pub(super) fn open(
        path: &'a Path,
        file: &'a File,
        len: u64,
    ) -> Result<(Header, Sections<'a>), SnapshotError> {
        let mut h = [0u8; HEADER_LEN];
        if len < HEADER_LEN as u64 {
            if len >= 8 && read_at(file, 0, 8).is_ok_and(|m| m != MAGIC) {
                return Err(SnapshotError::NotSnapshot(path.into()));
            }
            return Err(truncated(
                path,
                len,
                "the header".into(),
                0,
                HEADER_LEN as u64,
            ));
        }
        file.read_exact_at(&mut h, 0)
            .map_err(|source| SnapshotError::Io {
                path: path.into(),
                what: "cannot read it",
                source,
            })?;
        if h[..8] != MAGIC {
            return Err(SnapshotError::NotSnapshot(path.into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes(h[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        if version != FORMAT_VERSION {
            return Err(SnapshotError::Version {
                path: path.into(),
                found: version,
            });
        }
        let corrupt = || SnapshotError::Corrupt {
            path: path.into(),
            what: "the header".into(),
            offset: 0,
        };
        if crc(&h[..HEADER_LEN - 4]) != u32_at(HEADER_LEN - 4) {
            return Err(corrupt());
        }
        let (count, data_at, sections_at, size) = (u32_at(12), u64_at(16), u64_at(24), u64_at(32));
        if size > len {
            return Err(truncated(path, len, "the file".into(), 0, size));
        }
        // The words after the fields are reserved: zero, as written.
        let reserved_clear = h[40..HEADER_LEN - 4].iter().all(|&b| b == 0);
        if data_at != DATA_OFFSET || sections_at < data_at || count != SECTIONS || !reserved_clear {
            return Err(corrupt());
        }
        let header = Header {
            data_at,
            sections_at,
            size,
        };
        let sections = Sections {
            path,
            file,
            len,
            at: sections_at,
        };
        Ok((header, sections))
    }

    /// The next section, which must be `tag`: where it starts and its
    /// payload, its header and CRC checked.
    pub(super) fn next(&mut self, tag: &'static str) -> Result<(u64, Vec<u8>), SnapshotError> {
        let (path, at, len) = (self.path, self.at, self.len);
        let sh = read_at(self.file, at, SECTION_HEADER_LEN).map_err(|_| {
            truncated(
                path,
                len,
                format!("section {tag}"),
                at,
                SECTION_HEADER_LEN as u64,
            )
        })?;
        let bad = |reason: String| bad_section(path, tag, at, reason);
        if &sh[..4] != tag.as_bytes() {
            return Err(bad(format!(
                "found tag {:?} where {tag} belongs",
                String::from_utf8_lossy(&sh[..4])
            )));
        }
        let version = u32::from_le_bytes(sh[4..8].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION {
            return Err(bad(format!(
                "section version {version}; this Hover reads {FORMAT_VERSION}"
            )));
        }
        let plen = u64::from_le_bytes(sh[8..16].try_into().expect("8 bytes"));
        let want = u32::from_le_bytes(sh[16..20].try_into().expect("4 bytes"));
        if sh[20..24] != [0; 4] {
            return Err(bad("its reserved word is not zero".into()));
        }
        let body = at + SECTION_HEADER_LEN as u64;
        if plen > MAX_SECTION || body.saturating_add(plen) > len {
            return Err(truncated(
                path,
                len,
                format!("section {tag}"),
                at,
                SECTION_HEADER_LEN as u64 + plen,
            ));
        }
        let payload =
            read_at(self.file, body, plen as usize).map_err(|source| SnapshotError::Io {
                path: path.into(),
                what: "cannot read it",
                source,
            })?;
        if crc(&payload) != want {
            return Err(SnapshotError::Corrupt {
                path: path.into(),
                what: format!("section {tag}"),
                offset: at,
            });
        }
        self.at = body + plen;
        Ok((at, payload))
    }

    /// The next section, `tag`, decoded: where it starts and its value.
    pub(super) fn decode<T: DeserializeOwned>(
        &mut self,
        tag: &'static str,
    ) -> Result<(u64, T), SnapshotError> {
        let (at, b) = self.next(tag)?;
        let v = postcard::from_bytes(&b)
            .map_err(|e| bad_section(self.path, tag, at, format!("cannot be decoded: {e}")))?;
        Ok((at, v))
    }

    /// Where the sections read so far end.
    pub(super) fn end(&self) -> u64 {
        self.at
    }
}

/// `tag` (at `offset`) does not hold what it must.
pub(super) fn bad_section(path: &Path, tag: &str, offset: u64, reason: String) -> SnapshotError {
    SnapshotError::BadSection {
        path: PathBuf::from(path),
        section: tag.into(),
        offset,
        reason,
    }
}

fn truncated(path: &Path, len: u64, what: String, offset: u64, need: u64) -> SnapshotError {
    SnapshotError::Truncated {
        path: path.into(),
        what,
        offset,
        need,
        len,
    }
}

/// The memory index (section `MEMI` at `offset`) checked against guest
/// memory `ranges` and the room before the sections: its slots.
pub(super) fn check_index(
    path: &Path,
    index: &MemoryIndex,
    offset: u64,
    ranges: &[(u64, u64)],
    header: &Header,
) -> Result<Vec<u64>, SnapshotError> {
    let slots = index
        .check(|gpa, l| {
            ranges
                .iter()
                .any(|&(b, s)| gpa >= b && gpa.checked_add(l).is_some_and(|e| e <= b + s))
        })
        .map_err(|reason| bad_section(path, "MEMI", offset, reason.to_string()))?;
    if header.data_at + index.pages() * PAGE_SIZE > header.sections_at {
        return Err(bad_section(
            path,
            "MEMI",
            offset,
            format!(
                "{} pages do not fit before the sections at offset {}",
                index.pages(),
                header.sections_at
            ),
        ));
    }
    Ok(slots)
}

/// The hot set (section `HOTS` at `offset`): each entry a page of guest
/// memory `ranges` (`memory` bytes in all), no more entries than pages.
pub(super) fn check_hot(
    path: &Path,
    hot: &[u64],
    offset: u64,
    ranges: &[(u64, u64)],
    memory: u64,
) -> Result<(), SnapshotError> {
    let in_ram = |gpa: u64| {
        gpa.is_multiple_of(PAGE_SIZE)
            && ranges
                .iter()
                .any(|&(b, s)| gpa >= b && gpa.saturating_add(PAGE_SIZE) <= b + s)
    };
    if let Some((i, gpa)) = hot.iter().enumerate().find(|(_, &g)| !in_ram(g)) {
        return Err(bad_section(
            path,
            "HOTS",
            offset,
            format!("entry {i}, page {gpa:#x}, is not a page of guest memory"),
        ));
    }
    if hot.len() as u64 > memory / PAGE_SIZE {
        return Err(bad_section(
            path,
            "HOTS",
            offset,
            format!(
                "{} entries for a guest of {} pages",
                hot.len(),
                memory / PAGE_SIZE
            ),
        ));
    }
    Ok(())
}
