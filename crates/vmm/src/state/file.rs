//! The snapshot file: a header page, guest memory, then the state sections.
//!
//! ```text
//! 0       header (64 bytes, own CRC), padded to 4096
//! 4096    guest pages, 4096 bytes each, in the order of the memory index
//! S       sections: each a 24-byte header (tag, version, length, CRC32)
//!         and a postcard-encoded payload: CONF, VCPU, MACH, DEVS, MEMI
//! ```
//! Only pages that hold something are written (sparse). Page data comes
//! first so it stays page-aligned for reading on demand (lazy restore); the
//! sections come last because the memory index is known only once every
//! page is written. Every page has its own CRC32 in the index, checked when
//! it is read: up front for an eager restore, at first touch for a lazy one.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hover_abi::layout::PAGE_SIZE;
use serde::Serialize;

pub use super::error::SnapshotError;
pub use super::index::MemoryIndex;
use super::{DevicesState, MachineState, SavedMachine, VmState};
use crate::memory::paged::{BulkSource, PageSource};
use crate::memory::store::PageBuf;
use crate::vcpu::state::VcpuState;

/// The file's magic.
pub const MAGIC: [u8; 8] = *b"HOVERSNP";
pub use super::version::FORMAT_VERSION;
const HEADER_LEN: usize = 64;
const SECTION_HEADER_LEN: usize = 24;
/// Sections in a file: CONF, VCPU, MACH, DEVS, MEMI, HOTS.
const SECTIONS: u32 = 6;
/// Where page data starts.
const DATA_OFFSET: u64 = PAGE_SIZE;
/// Largest section accepted (a corrupt length must not make us allocate).
const MAX_SECTION: u64 = 256 << 20;

fn crc(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

/// Writes a snapshot: memory first, then [`SnapshotWriter::finish`] with the state.
pub struct SnapshotWriter {
    path: PathBuf,
    out: BufWriter<File>,
    index: MemoryIndex,
    offset: u64,
    hot: Vec<u64>,
}

impl SnapshotWriter {
    /// Create the file (never an existing one).
    pub fn create(path: &Path) -> Result<SnapshotWriter, SnapshotError> {
        // All of guest memory: for the owner only, whatever the umask.
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::AlreadyExists => SnapshotError::Exists(path.into()),
                _ => SnapshotError::Io {
                    path: path.into(),
                    what: "cannot create it",
                    source,
                },
            })?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        let r = out.write_all(&[0u8; DATA_OFFSET as usize]);
        let mut w = SnapshotWriter {
            path: path.into(),
            out,
            index: MemoryIndex::default(),
            offset: DATA_OFFSET,
            hot: Vec::new(),
        };
        r.map_err(|e| w.io("cannot write it", e))?;
        Ok(w)
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&mut self, what: &'static str, source: io::Error) -> SnapshotError {
        SnapshotError::Io {
            path: self.path.clone(),
            what,
            source,
        }
    }

    /// Record the hot set: the pages a restore should bring in first, in
    /// order (section `HOTS`).
    pub fn hot_set(&mut self, gpas: Vec<u64>) {
        self.hot = gpas;
    }

    /// Add the page at `gpa` (ascending order).
    pub fn page(&mut self, gpa: u64, data: &[u8]) -> Result<(), SnapshotError> {
        debug_assert_eq!(data.len(), PAGE_SIZE as usize);
        self.index.push(gpa, crc(data));
        let r = self.out.write_all(data);
        r.map_err(|e| self.io("cannot write guest memory", e))?;
        self.offset += PAGE_SIZE;
        Ok(())
    }

    /// Write the sections and the header, and make the file durable.
    /// Returns the file's size.
    pub fn finish(mut self, state: &VmState) -> Result<u64, SnapshotError> {
        let sections_at = self.offset;
        let index = std::mem::take(&mut self.index);
        let mut count = 0u32;
        let mut section = |w: &mut Self, tag: &[u8; 4], payload: Vec<u8>| {
            let mut h = Vec::with_capacity(SECTION_HEADER_LEN);
            h.extend_from_slice(tag);
            h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
            h.extend_from_slice(&(payload.len() as u64).to_le_bytes());
            h.extend_from_slice(&crc(&payload).to_le_bytes());
            h.extend_from_slice(&0u32.to_le_bytes());
            count += 1;
            w.offset += (h.len() + payload.len()) as u64;
            let r = w.out.write_all(&h).and_then(|_| w.out.write_all(&payload));
            r.map_err(|e| w.io("cannot write the state", e))
        };
        section(&mut self, b"CONF", encode(&state.config))?;
        section(&mut self, b"VCPU", encode(&state.vcpus))?;
        section(&mut self, b"MACH", encode(&state.machine))?;
        section(&mut self, b"DEVS", encode(&state.devices))?;
        section(&mut self, b"MEMI", encode(&index))?;
        let hot = std::mem::take(&mut self.hot);
        section(&mut self, b"HOTS", encode(&hot))?;
        let size = self.offset;
        let mut h = Vec::with_capacity(HEADER_LEN);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        h.extend_from_slice(&count.to_le_bytes());
        h.extend_from_slice(&DATA_OFFSET.to_le_bytes());
        h.extend_from_slice(&sections_at.to_le_bytes());
        h.extend_from_slice(&size.to_le_bytes());
        h.resize(HEADER_LEN - 4, 0);
        let c = crc(&h);
        h.extend_from_slice(&c.to_le_bytes());
        let r = self.out.flush();
        r.map_err(|e| self.io("cannot write the state", e))?;
        let file = self.out.get_ref();
        let r = file.write_all_at(&h, 0).and_then(|_| file.sync_all());
        r.map_err(|e| self.io("cannot write the header", e))?;
        Ok(size)
    }
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_allocvec(v).expect("state types always encode")
}

/// An open snapshot: its state, and its memory to read.
pub struct Snapshot {
    path: PathBuf,
    file: File,
    /// The saved state.
    pub state: VmState,
    index: MemoryIndex,
    slots: Vec<u64>,
    /// The file's size.
    pub size: u64,
    /// The hot set: pages the guest touched first, in that order (section
    /// `HOTS`; empty when none was recorded).
    pub hot: Vec<u64>,
}

impl Snapshot {
    /// Open and check `path`: header, every section's CRC and decoding,
    /// and the memory index against the saved memory size (`reading.rs`).
    pub fn open(path: &Path) -> Result<Snapshot, SnapshotError> {
        let (file, len) = reading::open_regular(path)?;
        let (header, mut sections) = reading::Sections::open(path, &file, len)?;
        let (_, config): (u64, SavedMachine) = sections.decode("CONF")?;
        let (vcpus_at, vcpus): (u64, Vec<VcpuState>) = sections.decode("VCPU")?;
        let (_, machine): (u64, MachineState) = sections.decode("MACH")?;
        let (_, devices): (u64, DevicesState) = sections.decode("DEVS")?;
        let (index_at, index): (u64, MemoryIndex) = sections.decode("MEMI")?;
        let ranges = crate::memory::ram_ranges(config.config.memory);
        let slots = reading::check_index(path, &index, index_at, &ranges, &header)?;
        let (hot_at, hot): (u64, Vec<u64>) = sections.decode("HOTS")?;
        // The header's size is where the last section ends.
        let end = sections.end();
        if end != header.size {
            return Err(SnapshotError::Corrupt {
                path: path.into(),
                what: format!(
                    "the header (its size {} is not the sections' end {end})",
                    header.size
                ),
                offset: 0,
            });
        }
        reading::check_hot(path, &hot, hot_at, &ranges, config.config.memory)?;
        if vcpus.len() != config.config.vcpus as usize {
            return Err(reading::bad_section(
                path,
                "VCPU",
                vcpus_at,
                format!(
                    "{} vCPU states for {} vCPUs",
                    vcpus.len(),
                    config.config.vcpus
                ),
            ));
        }
        Ok(Snapshot {
            path: path.into(),
            file,
            state: VmState {
                config,
                vcpus,
                machine,
                devices,
            },
            index,
            slots,
            size: header.size,
            hot,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Pages the file holds.
    pub fn pages(&self) -> u64 {
        self.index.pages()
    }

    /// Whether the file holds the page at `gpa` (pages it does not hold
    /// were zeros).
    pub fn holds(&self, gpa: u64) -> bool {
        self.slot(gpa).is_some()
    }

    /// The storage slot of the page at `gpa`, if the file holds it.
    fn slot(&self, gpa: u64) -> Option<u64> {
        let i = self.index.runs.partition_point(|&(start, _)| start <= gpa);
        let (start, n) = *self.index.runs.get(i.checked_sub(1)?)?;
        let k = (gpa - start) / PAGE_SIZE;
        (k < n as u64).then(|| self.slots[i - 1] + k)
    }

    fn read_slot(&self, slot: u64, buf: &mut [u8]) -> io::Result<()> {
        let offset = DATA_OFFSET + slot * PAGE_SIZE;
        self.file.read_exact_at(buf, offset)?;
        if crc(buf) != self.index.crcs[slot as usize] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "snapshot {}: the page at offset {offset} is corrupted (CRC mismatch)",
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }

    /// Every stored page, in order: (guest-physical address, storage slot).
    pub fn stored_pages(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.index
            .runs
            .iter()
            .zip(&self.slots)
            .flat_map(|(&(gpa, n), &slot)| {
                (0..n as u64).map(move |k| (gpa + k * PAGE_SIZE, slot + k))
            })
    }

    /// Read the stored pages at `gpas` into `out` (a page each, in order),
    /// checking their CRCs: one read for pages stored next to each other.
    /// Pages the file does not hold are zeros.
    pub fn read_pages(&self, gpas: &[u64], out: &mut [u8]) -> Result<(), SnapshotError> {
        let ps = PAGE_SIZE as usize;
        let mut i = 0;
        while i < gpas.len() {
            let Some(first) = self.slot(gpas[i]) else {
                out[i * ps..(i + 1) * ps].fill(0);
                i += 1;
                continue;
            };
            let mut n = 1;
            while i + n < gpas.len() && self.slot(gpas[i + n]) == Some(first + n as u64) {
                n += 1;
            }
            let chunk = &mut out[i * ps..(i + n) * ps];
            self.file
                .read_exact_at(chunk, DATA_OFFSET + first * PAGE_SIZE)
                .map_err(|source| SnapshotError::Io {
                    path: self.path.clone(),
                    what: "cannot read guest memory",
                    source,
                })?;
            for (k, page) in chunk.chunks_exact(ps).enumerate() {
                let slot = first + k as u64;
                if crc(page) != self.index.crcs[slot as usize] {
                    return Err(SnapshotError::Corrupt {
                        path: self.path.clone(),
                        what: format!("guest page {:#x}", gpas[i + k]),
                        offset: DATA_OFFSET + slot * PAGE_SIZE,
                    });
                }
            }
            i += n;
        }
        Ok(())
    }

    /// Read the page in storage slot `slot` into `buf`, checking its CRC.
    pub fn read_stored(&self, slot: u64, buf: &mut [u8]) -> Result<(), SnapshotError> {
        self.read_slot(slot, buf)
            .map_err(|source| match source.kind() {
                io::ErrorKind::InvalidData => SnapshotError::Corrupt {
                    path: self.path.clone(),
                    what: format!("guest page in slot {slot}"),
                    offset: DATA_OFFSET + slot * PAGE_SIZE,
                },
                _ => SnapshotError::Io {
                    path: self.path.clone(),
                    what: "cannot read guest memory",
                    source,
                },
            })
    }
}

impl BulkSource for Snapshot {
    fn read_pages(&self, gpas: &[u64], out: &mut [u8]) -> io::Result<()> {
        Snapshot::read_pages(self, gpas, out).map_err(|e| match e {
            SnapshotError::Io { source, .. } => source,
            e => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        })
    }
}

impl PageSource for Snapshot {
    fn read(&self, gpa: u64, buf: &mut PageBuf) -> io::Result<bool> {
        match self.slot(gpa) {
            Some(slot) => self.read_slot(slot, &mut buf.0).map(|_| true),
            None => Ok(false),
        }
    }
}

fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    file.read_exact_at(&mut b, offset)?;
    Ok(b)
}

mod reading;
#[cfg(test)]
mod tests;
