//! KVM binary statistics (`KVM_GET_STATS_FD`, Linux 5.14+): the one place
//! that reads them, for the VM and for each vCPU.
//!
//! A stats fd holds a header, descriptors (name, type, unit, size, offset)
//! and a data block of u64 values; the data is re-read with `pread` at any
//! time, from any thread, without stopping the vCPU.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use kvm_bindings::{
    kvm_stats_header, KVM_STATS_TYPE_CUMULATIVE, KVM_STATS_TYPE_INSTANT,
    KVM_STATS_TYPE_LINEAR_HIST, KVM_STATS_TYPE_LOG_HIST, KVM_STATS_TYPE_MASK, KVM_STATS_TYPE_PEAK,
};
use vmm_sys_util::ioctl::ioctl;

const KVMIO: u32 = 0xAE;

mod ioctls {
    #![allow(missing_docs)]
    use super::KVMIO;
    use vmm_sys_util::ioctl_io_nr;
    // Not wrapped by kvm-ioctls (0.25).
    ioctl_io_nr!(KVM_GET_STATS_FD, KVMIO, 0xce);
}
use ioctls::KVM_GET_STATS_FD;

/// What a statistic measures over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum StatKind {
    /// Only grows.
    Cumulative,
    /// A current value.
    Instant,
    /// The largest value seen.
    Peak,
    /// A histogram with equal-width buckets.
    LinearHistogram,
    /// A histogram with power-of-two buckets.
    LogHistogram,
}

/// One statistic's descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatDesc {
    /// Name, e.g. `halt_exits`.
    pub name: String,
    /// Kind.
    pub kind: StatKind,
    /// Number of u64 values (1, or the number of histogram buckets).
    pub size: usize,
    /// Index of the first value in the data block, in u64 units.
    pub index: usize,
    /// Bucket width for linear histograms.
    pub bucket_size: u32,
}

/// A stats fd and its descriptors.
pub struct KvmStats {
    file: File,
    data_offset: u64,
    data_len: usize,
    descs: Arc<[StatDesc]>,
}

/// The values of a stats fd at one moment.
#[derive(Clone, Debug)]
pub struct StatsSnapshot {
    values: Vec<u64>,
    descs: Arc<[StatDesc]>,
}

fn read_struct_header(b: &[u8]) -> kvm_stats_header {
    let u = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    kvm_stats_header {
        flags: u(0),
        name_size: u(4),
        num_desc: u(8),
        id_offset: u(12),
        desc_offset: u(16),
        data_offset: u(20),
    }
}

/// Parse `num_desc` descriptors of `16 + name_size` bytes each.
pub fn parse_descriptors(b: &[u8], num_desc: usize, name_size: usize) -> io::Result<Vec<StatDesc>> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let stride = 16 + name_size;
    if b.len() < num_desc * stride {
        return Err(bad("stats descriptors are truncated"));
    }
    let mut out = Vec::with_capacity(num_desc);
    for d in b.chunks_exact(stride).take(num_desc) {
        let flags = u32::from_le_bytes(d[0..4].try_into().expect("4 bytes"));
        let size = u16::from_le_bytes([d[6], d[7]]) as usize;
        let offset = u32::from_le_bytes(d[8..12].try_into().expect("4 bytes")) as usize;
        let bucket_size = u32::from_le_bytes(d[12..16].try_into().expect("4 bytes"));
        let raw = &d[16..];
        let name =
            String::from_utf8_lossy(&raw[..raw.iter().position(|&c| c == 0).unwrap_or(raw.len())])
                .into_owned();
        let kind = match flags & KVM_STATS_TYPE_MASK {
            KVM_STATS_TYPE_CUMULATIVE => StatKind::Cumulative,
            KVM_STATS_TYPE_INSTANT => StatKind::Instant,
            KVM_STATS_TYPE_PEAK => StatKind::Peak,
            KVM_STATS_TYPE_LINEAR_HIST => StatKind::LinearHistogram,
            KVM_STATS_TYPE_LOG_HIST => StatKind::LogHistogram,
            // A kind newer than this code: skip it rather than misread it.
            _ => continue,
        };
        if !offset.is_multiple_of(8) {
            return Err(bad("a stats value is not 8-byte aligned"));
        }
        out.push(StatDesc {
            name,
            kind,
            size,
            index: offset / 8,
            bucket_size,
        });
    }
    Ok(out)
}

impl KvmStats {
    /// Open the stats of the KVM object (VM or vCPU) behind `fd`.
    pub fn open(fd: &impl AsRawFd) -> io::Result<Self> {
        // SAFETY: KVM_GET_STATS_FD takes no argument and returns a new fd or -1.
        let raw = unsafe { ioctl(fd, KVM_GET_STATS_FD()) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: raw is a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(raw) };
        let mut hb = [0u8; 24];
        file.read_exact_at(&mut hb, 0)?;
        let h = read_struct_header(&hb);
        let stride = 16 + h.name_size as usize;
        let mut db = vec![0u8; h.num_desc as usize * stride];
        file.read_exact_at(&mut db, h.desc_offset as u64)?;
        let descs = parse_descriptors(&db, h.num_desc as usize, h.name_size as usize)?;
        let data_len = descs.iter().map(|d| d.index + d.size).max().unwrap_or(0);
        Ok(KvmStats {
            file,
            data_offset: h.data_offset as u64,
            data_len,
            descs: descs.into(),
        })
    }

    /// Another handle on the same statistics (reads use positioned I/O, so
    /// handles can be read from different threads).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(KvmStats {
            file: self.file.try_clone()?,
            data_offset: self.data_offset,
            data_len: self.data_len,
            descs: self.descs.clone(),
        })
    }

    /// The descriptors.
    pub fn descriptors(&self) -> &[StatDesc] {
        &self.descs
    }

    /// Read every value now.
    pub fn read(&self) -> io::Result<StatsSnapshot> {
        let mut raw = vec![0u8; self.data_len * 8];
        self.file.read_exact_at(&mut raw, self.data_offset)?;
        let values = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Ok(StatsSnapshot {
            values,
            descs: self.descs.clone(),
        })
    }
}

/// Single-valued statistics by name.
pub type Scalars = BTreeMap<String, u64>;
/// Histograms (bucket counts) by name.
pub type Histograms = BTreeMap<String, Vec<u64>>;

/// KVM's single-valued statistics and histograms of each vCPU, read now
/// (a vCPU whose stats cannot be read is left out).
pub fn read_vcpus(stats: &[KvmStats]) -> (Vec<Scalars>, Vec<Histograms>) {
    let snaps: Vec<StatsSnapshot> = stats.iter().filter_map(|s| s.read().ok()).collect();
    (
        snaps.iter().map(|s| s.scalars()).collect(),
        snaps.iter().map(|s| s.histograms()).collect(),
    )
}

/// KVM's single-valued statistics of the VM, read now (empty if none).
pub fn read_vm(stats: Option<&KvmStats>) -> Scalars {
    stats
        .and_then(|s| s.read().ok())
        .map(|s| s.scalars())
        .unwrap_or_default()
}

impl StatsSnapshot {
    /// The descriptors of the values.
    pub fn descriptors(&self) -> &[StatDesc] {
        &self.descs
    }

    fn desc(&self, name: &str) -> Option<&StatDesc> {
        self.descs.iter().find(|d| d.name == name)
    }

    /// The value of a single-valued statistic.
    pub fn get(&self, name: &str) -> Option<u64> {
        self.desc(name)
            .filter(|d| d.size == 1)
            .map(|d| self.values[d.index])
    }

    /// The buckets of a histogram.
    pub fn histogram(&self, name: &str) -> Option<&[u64]> {
        self.desc(name)
            .filter(|d| matches!(d.kind, StatKind::LinearHistogram | StatKind::LogHistogram))
            .map(|d| &self.values[d.index..d.index + d.size])
    }

    /// Every histogram by name.
    pub fn histograms(&self) -> BTreeMap<String, Vec<u64>> {
        self.descs
            .iter()
            .filter(|d| matches!(d.kind, StatKind::LinearHistogram | StatKind::LogHistogram))
            .map(|d| {
                (
                    d.name.clone(),
                    self.values[d.index..d.index + d.size].to_vec(),
                )
            })
            .collect()
    }

    /// Every single-valued statistic by name.
    pub fn scalars(&self) -> BTreeMap<String, u64> {
        self.descs
            .iter()
            .filter(|d| d.size == 1)
            .map(|d| (d.name.clone(), self.values[d.index]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(flags: u32, size: u16, offset: u32, name: &str, name_size: usize) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(flags.to_le_bytes());
        b.extend(0i16.to_le_bytes());
        b.extend(size.to_le_bytes());
        b.extend(offset.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        let mut n = name.as_bytes().to_vec();
        n.resize(name_size, 0);
        b.extend(n);
        b
    }

    #[test]
    fn descriptors_parse_and_values_map() {
        let mut b = desc(KVM_STATS_TYPE_CUMULATIVE, 1, 0, "halt_exits", 48);
        b.extend(desc(
            KVM_STATS_TYPE_LOG_HIST,
            4,
            8,
            "halt_poll_success_hist",
            48,
        ));
        b.extend(desc(15, 1, 40, "from_the_future", 48));
        let d = parse_descriptors(&b, 3, 48).unwrap();
        assert_eq!(d.len(), 2, "unknown kinds are skipped");
        assert_eq!((d[0].name.as_str(), d[0].index), ("halt_exits", 0));
        assert_eq!(
            (d[1].kind, d[1].size, d[1].index),
            (StatKind::LogHistogram, 4, 1)
        );
        let snap = StatsSnapshot {
            values: vec![7, 1, 2, 3, 4],
            descs: d.into(),
        };
        assert_eq!(snap.get("halt_exits"), Some(7));
        assert_eq!(
            snap.histogram("halt_poll_success_hist"),
            Some(&[1, 2, 3, 4][..])
        );
        assert_eq!(snap.get("halt_poll_success_hist"), None);
        assert_eq!(snap.scalars().len(), 1);
        assert!(parse_descriptors(&b[..10], 1, 48).is_err());
    }
}
