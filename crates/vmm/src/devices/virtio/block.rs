//! virtio-blk on a raw image file or a block device: read, write, flush
//! (`fdatasync`: a write the guest flushed is on the disk), get-id. A
//! read-only disk is opened read-only and answers writes with IOERR. Each
//! request is checked against the disk's end and served in bounded pieces,
//! so a driver's request (however long its buffers claim to be) can touch
//! only its own buffers and the disk's own bytes.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::desc::split::Descriptor;
use virtio_queue::{DescriptorChain, Queue, QueueT, Reader, Writer};
use vm_memory::bitmap::BitmapSlice;
use vm_memory::{ByteValued, Bytes, GuestAddress};

use crate::devices::host_file::HostFileError;
use crate::memory::host_writes::TrackedMemory;

use super::{read_config_bytes, VirtioDevice, F_VERSION_1};

/// Bytes per sector, as virtio-blk counts.
pub const SECTOR: u64 = 512;
/// The queue's size.
const QUEUE_SIZE: u16 = 256;
/// The most data buffers a request may have (VIRTIO_BLK_F_SEG_MAX): a
/// chain of the queue's size less the header and the status. Without it
/// Linux sends one buffer per request, so an O_DIRECT read of 128 KiB in
/// user pages becomes 32 requests of 4 KiB.
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// The most bytes copied at once (a request is served in such pieces).
const CHUNK: usize = 64 << 10;
/// A get-id answer's length.
const ID_BYTES: usize = 20;

pub use crate::config::DiskConfig;

/// The request header every request starts with.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
struct RequestHeader {
    kind: u32,
    _reserved: u32,
    sector: u64,
}

// SAFETY: plain integers, no padding (4 + 4 + 8 bytes).
unsafe impl ByteValued for RequestHeader {}

/// Open a raw disk image (or block device) for a virtio disk: its file
/// and size in bytes.
pub fn open_disk(path: &Path, readonly: bool) -> Result<(File, u64), HostFileError> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
    let meta = std::fs::metadata(path)?;
    let kind = meta.file_type();
    if !kind.is_file() && !kind.is_block_device() {
        return Err(HostFileError::NotADiskImage);
    }
    if !readonly && kind.is_file() && meta.permissions().mode() & 0o222 == 0 {
        return Err(HostFileError::ReadOnlyFile);
    }
    // Non-blocking, and the type checked again on the descriptor: a named
    // pipe swapped in after the check above neither hangs the open nor
    // becomes a disk.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(!readonly)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let opened = file.metadata()?.file_type();
    if !opened.is_file() && !opened.is_block_device() {
        return Err(HostFileError::NotADiskImage);
    }
    let size = std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0))?;
    if size < SECTOR {
        return Err(HostFileError::TooSmall(size));
    }
    Ok((file, size))
}

/// A virtio block device on an open disk.
pub struct Block {
    config: DiskConfig,
    path: PathBuf,
    file: File,
    /// Whole sectors the disk holds.
    sectors: u64,
    buf: Vec<u8>,
    complained: bool,
}

impl Block {
    /// The device for `file` (`size` bytes, opened as `config` says).
    pub fn new(config: DiskConfig, path: PathBuf, file: File, size: u64) -> Block {
        Block {
            config,
            path,
            file,
            sectors: size / SECTOR,
            buf: vec![0; CHUNK],
            complained: false,
        }
    }

    fn complain(&mut self, why: &str) {
        if !self.complained {
            tracing::warn!("virtio block {}: {why}", self.config.id);
            self.complained = true;
        }
    }

    /// Serve one request; the bytes written into the driver's buffers.
    fn serve(&mut self, chain: DescriptorChain<&TrackedMemory>, mem: &TrackedMemory) -> u32 {
        let (Ok(mut reader), Ok(mut writer)) = (
            Reader::new(mem, chain.clone()),
            Writer::new(mem, chain.clone()),
        ) else {
            self.complain("a request whose buffers are outside guest memory or loop");
            return fail_in_last_byte(chain, mem);
        };
        let header: RequestHeader = match reader.read_obj() {
            Ok(h) => h,
            Err(_) => {
                self.complain("a request shorter than its header");
                return fail_in_last_byte(chain, mem);
            }
        };
        // The status byte is the last writable byte; what is before it is data.
        let Some(data_len) = writer.available_bytes().checked_sub(1) else {
            self.complain("a request with no room for its status");
            return 0;
        };
        let Ok(mut status) = writer.split_at(data_len) else {
            return 0;
        };
        let (code, written) = match header.kind {
            VIRTIO_BLK_T_IN => {
                let segments = data_segments(&chain, data_len);
                self.read(header.sector, &segments, mem)
            }
            VIRTIO_BLK_T_OUT => self.write(header.sector, &mut reader),
            VIRTIO_BLK_T_FLUSH => match self.file.sync_data() {
                Ok(()) => (VIRTIO_BLK_S_OK, 0),
                Err(e) => {
                    self.complain(&format!("flush of {}: {e}", self.path.display()));
                    (VIRTIO_BLK_S_IOERR, 0)
                }
            },
            VIRTIO_BLK_T_GET_ID => {
                let mut id = [0u8; ID_BYTES];
                let n = self.config.id.len().min(ID_BYTES);
                id[..n].copy_from_slice(&self.config.id.as_bytes()[..n]);
                let n = writer.available_bytes().min(ID_BYTES);
                match writer.write_all(&id[..n]) {
                    Ok(()) => (VIRTIO_BLK_S_OK, n),
                    Err(_) => (VIRTIO_BLK_S_IOERR, 0),
                }
            }
            _ => (VIRTIO_BLK_S_UNSUPP, 0),
        };
        match status.write_all(&[code as u8]) {
            Ok(()) => (written + 1) as u32,
            Err(_) => written as u32,
        }
    }

    /// The byte range of `len` bytes from `sector`, if all of it is on the disk.
    fn range(&self, sector: u64, len: usize) -> Option<u64> {
        let start = sector.checked_mul(SECTOR)?;
        let end = start.checked_add(len as u64)?;
        (end <= self.sectors * SECTOR).then_some(start)
    }

    /// Read from `sector` straight into the request's data buffers in
    /// guest memory (`segments`, as [`data_segments`] found them): one
    /// copy, the kernel's, where a bounce buffer would add a second.
    fn read(
        &mut self,
        sector: u64,
        segments: &[(GuestAddress, usize)],
        mem: &TrackedMemory,
    ) -> (u32, usize) {
        use std::io::{Seek, SeekFrom};
        let len: usize = segments.iter().map(|&(_, n)| n).sum();
        let Some(mut at) = self.range(sector, len) else {
            self.complain(&format!(
                "a read of {len} bytes at sector {sector}, past the disk's end"
            ));
            return (VIRTIO_BLK_S_IOERR, 0);
        };
        let mut done = 0;
        for &(addr, n) in segments {
            let read = self.file.seek(SeekFrom::Start(at)).and_then(|_| {
                mem.read_exact_volatile_from(addr, &mut self.file, n)
                    .map_err(std::io::Error::other)
            });
            if read.is_err() {
                return (VIRTIO_BLK_S_IOERR, done);
            }
            done += n;
            at += n as u64;
        }
        (VIRTIO_BLK_S_OK, done)
    }

    fn write<B: BitmapSlice>(&mut self, sector: u64, from: &mut Reader<'_, B>) -> (u32, usize) {
        if self.config.readonly {
            return (VIRTIO_BLK_S_IOERR, 0);
        }
        let len = from.available_bytes();
        let Some(mut at) = self.range(sector, len) else {
            self.complain(&format!(
                "a write of {len} bytes at sector {sector}, past the disk's end"
            ));
            return (VIRTIO_BLK_S_IOERR, 0);
        };
        let mut done = 0;
        while done < len {
            let n = (len - done).min(CHUNK);
            if from.read_exact(&mut self.buf[..n]).is_err()
                || self.file.write_all_at(&self.buf[..n], at).is_err()
            {
                return (VIRTIO_BLK_S_IOERR, 0);
            }
            done += n;
            at += n as u64;
        }
        (VIRTIO_BLK_S_OK, 0)
    }
}

/// A request that cannot be served: IOERR in its status byte (the last
/// byte of its last descriptor, if the device may write it and it is in
/// guest memory), so the driver does not read success in whatever the
/// byte held; the bytes written (1 or 0).
fn fail_in_last_byte(chain: DescriptorChain<&TrackedMemory>, mem: &TrackedMemory) -> u32 {
    use vm_memory::{Bytes, GuestAddress};
    let Some(last) = chain.last() else {
        return 0;
    };
    if !last.is_write_only() || last.len() == 0 {
        return 0;
    }
    let at = last.addr().0.checked_add(u64::from(last.len()) - 1);
    match at.map(|a| mem.write_obj(VIRTIO_BLK_S_IOERR as u8, GuestAddress(a))) {
        Some(Ok(())) => 1,
        _ => 0,
    }
}

/// The guest buffers a request's data goes to: its device-writable
/// descriptors, in order, up to `len` bytes (the status byte after them
/// excluded). The chain was already checked (a `Writer` was made over it).
fn data_segments(
    chain: &DescriptorChain<&TrackedMemory>,
    len: usize,
) -> Vec<(GuestAddress, usize)> {
    let mut left = len;
    let mut segments = Vec::new();
    for d in chain.clone().writable() {
        if left == 0 {
            break;
        }
        let n = (d.len() as usize).min(left);
        segments.push((d.addr(), n));
        left -= n;
    }
    segments
}

impl VirtioDevice for Block {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn name(&self) -> String {
        format!("block {}", self.config.id)
    }

    fn features(&self) -> u64 {
        let ro = if self.config.readonly {
            1 << VIRTIO_BLK_F_RO
        } else {
            0
        };
        F_VERSION_1 | (1 << VIRTIO_BLK_F_FLUSH) | (1 << VIRTIO_BLK_F_SEG_MAX) | ro
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // struct virtio_blk_config: the capacity in sectors, size_max
        // (not offered), then seg_max.
        let mut config = [0u8; 16];
        config[..8].copy_from_slice(&self.sectors.to_le_bytes());
        config[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
        read_config_bytes(&config, offset, data)
    }

    fn process(&mut self, _: usize, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let len = self.serve(chain, mem);
            if queue.add_used(mem, head, len).is_err() {
                self.complain("its used ring could not be written");
                return used;
            }
            used = true;
        }
        used
    }
}

/// Descriptors of one request, for tests (here and the fuzz target).
#[doc(hidden)]
pub fn request_descriptors(
    header_at: u64,
    data_at: u64,
    data_len: u32,
    data_writable: bool,
    status_at: u64,
) -> Vec<Descriptor> {
    use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    let (next, write) = (VRING_DESC_F_NEXT as u16, VRING_DESC_F_WRITE as u16);
    vec![
        Descriptor::new(header_at, 16, next, 1),
        Descriptor::new(
            data_at,
            data_len,
            next | if data_writable { write } else { 0 },
            2,
        ),
        Descriptor::new(status_at, 1, write, 0),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    fn mem() -> TrackedMemory {
        TrackedMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn disk(name: &str, sectors: u64, readonly: bool) -> (Block, PathBuf) {
        let p = std::env::temp_dir().join(format!("hover-blk-{name}-{}", std::process::id()));
        let bytes: Vec<u8> = (0..sectors * SECTOR).map(|i| (i / SECTOR) as u8).collect();
        std::fs::write(&p, bytes).unwrap();
        let (f, size) = open_disk(&p, readonly).unwrap();
        let cfg = DiskConfig {
            id: "disk0".into(),
            readonly,
            size: 0,
        };
        (Block::new(cfg, p.clone(), f, size), p)
    }

    /// Run one request (header at 0x10000, data at 0x20000, status at
    /// 0x30000) through a queue at 0x1000: (status, used length).
    fn run(
        b: &mut Block,
        m: &TrackedMemory,
        kind: u32,
        sector: u64,
        len: u32,
        data_writable: bool,
    ) -> (u8, u32) {
        let vq = MockSplitQueue::new(m, 16);
        let hdr = RequestHeader {
            kind,
            _reserved: 0,
            sector,
        };
        m.write_obj(hdr, GuestAddress(0x10000)).unwrap();
        m.write_obj(0xffu8, GuestAddress(0x30000)).unwrap();
        let descs = request_descriptors(0x10000, 0x20000, len, data_writable, 0x30000);
        let raw: Vec<virtio_queue::desc::RawDescriptor> =
            descs.into_iter().map(Into::into).collect();
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        assert!(b.process(0, &mut q, m));
        let used_len: u32 = m.read_obj(GuestAddress(vq.used_addr().0 + 8)).unwrap();
        (m.read_obj(GuestAddress(0x30000)).unwrap(), used_len)
    }

    #[test]
    fn reads_writes_flushes_and_get_id_do_what_the_spec_says() {
        let m = mem();
        let (mut b, p) = disk("rw", 8, false);
        assert_eq!(run(&mut b, &m, VIRTIO_BLK_T_IN, 3, 1024, true), (0, 1025));
        let mut got = [0u8; 1024];
        m.read_slice(&mut got, GuestAddress(0x20000)).unwrap();
        assert!(got[..512].iter().all(|&x| x == 3) && got[512..].iter().all(|&x| x == 4));
        m.write_slice(&[0xab; 512], GuestAddress(0x20000)).unwrap();
        assert_eq!(run(&mut b, &m, VIRTIO_BLK_T_OUT, 7, 512, false), (0, 1));
        assert_eq!(run(&mut b, &m, VIRTIO_BLK_T_FLUSH, 0, 0, false).0, 0);
        let on_disk = std::fs::read(&p).unwrap();
        assert!(on_disk[7 * 512..].iter().all(|&x| x == 0xab));
        assert!(
            on_disk[6 * 512..7 * 512].iter().all(|&x| x == 6),
            "nothing else changed"
        );
        assert_eq!(run(&mut b, &m, VIRTIO_BLK_T_GET_ID, 0, 20, true), (0, 21));
        let mut id = [0u8; 5];
        m.read_slice(&mut id, GuestAddress(0x20000)).unwrap();
        assert_eq!(&id, b"disk0");
        assert_eq!(
            run(&mut b, &m, 99, 0, 16, true).0,
            VIRTIO_BLK_S_UNSUPP as u8
        );
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn requests_past_the_end_and_writes_to_a_readonly_disk_fail_and_touch_nothing() {
        let m = mem();
        let (mut b, p) = disk("end", 4, false);
        m.write_slice(&[0x5a; 1024], GuestAddress(0x20000)).unwrap();
        assert_eq!(
            run(&mut b, &m, VIRTIO_BLK_T_IN, 3, 1024, true).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(
            run(&mut b, &m, VIRTIO_BLK_T_OUT, 3, 1024, false).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert_eq!(
            run(&mut b, &m, VIRTIO_BLK_T_IN, u64::MAX / 256, 512, true).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        let on_disk = std::fs::read(&p).unwrap();
        assert!(
            on_disk[3 * 512..].iter().all(|&x| x == 3),
            "the last sector is unchanged"
        );
        std::fs::remove_file(p).unwrap();
        let (mut ro, p) = disk("ro", 4, true);
        assert_ne!(ro.features() & (1 << VIRTIO_BLK_F_RO), 0);
        assert_eq!(
            run(&mut ro, &m, VIRTIO_BLK_T_OUT, 0, 512, false).0,
            VIRTIO_BLK_S_IOERR as u8
        );
        assert!(std::fs::read(&p).unwrap()[..512].iter().all(|&x| x == 0));
        std::fs::remove_file(p).unwrap();
    }

    /// Run the chain `raw` (a read of sector 0 whose header is at 0x10000)
    /// and return guest RAM before and after, and where the used ring is.
    fn run_raw(
        b: &mut Block,
        raw: &[virtio_queue::desc::RawDescriptor],
    ) -> (Vec<u8>, Vec<u8>, u64) {
        let m = mem();
        let vq = MockSplitQueue::new(&m, 16);
        let hdr = RequestHeader {
            kind: VIRTIO_BLK_T_IN,
            _reserved: 0,
            sector: 0,
        };
        m.write_obj(hdr, GuestAddress(0x10000)).unwrap();
        vq.build_desc_chain(raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        let mut before = vec![0u8; 1 << 20];
        m.read_slice(&mut before, GuestAddress(0)).unwrap();
        b.process(0, &mut q, &m);
        let mut after = vec![0u8; 1 << 20];
        m.read_slice(&mut after, GuestAddress(0)).unwrap();
        (before, after, vq.used_addr().0)
    }

    /// The bytes of `before` and `after` that differ outside the used
    /// ring at `used` and the ranges `allowed`.
    fn changed_outside(before: &[u8], after: &[u8], used: u64, allowed: &[(u64, u64)]) -> usize {
        let used = (used, used + 4 + 8 * 16);
        (0..before.len())
            .filter(|&i| before[i] != after[i])
            .filter(|&i| {
                let a = i as u64;
                !std::iter::once(&used)
                    .chain(allowed)
                    .any(|&(s, e)| a >= s && a < e)
            })
            .count()
    }

    #[test]
    fn descriptor_loops_and_buffers_outside_ram_fail_and_touch_nothing_else() {
        use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
        let (next, write) = (VRING_DESC_F_NEXT as u16, VRING_DESC_F_WRITE as u16);
        let (mut b, p) = disk("bad", 4, false);
        // A loop: header -> data -> header -> ...; no status descriptor.
        let looped: Vec<virtio_queue::desc::RawDescriptor> = vec![
            Descriptor::new(0x10000, 16, next, 1).into(),
            Descriptor::new(0x20000, 512, next | write, 0).into(),
        ];
        let (before, after, used) = run_raw(&mut b, &looped);
        assert_eq!(
            changed_outside(&before, &after, used, &[(0x20000, 0x20200)]),
            0
        );
        // A data buffer past the end of guest RAM (1 MiB): the request
        // fails with IOERR in its status byte, and nothing else changes.
        let outside: Vec<virtio_queue::desc::RawDescriptor> =
            request_descriptors(0x10000, 2 << 20, 512, true, 0x30000)
                .into_iter()
                .map(Into::into)
                .collect();
        let (before, after, used) = run_raw(&mut b, &outside);
        assert_eq!(after[0x30000], VIRTIO_BLK_S_IOERR as u8);
        assert_eq!(
            changed_outside(&before, &after, used, &[(0x30000, 0x30001)]),
            0
        );
        // A read whose buffer is longer than the disk holds past its
        // sector: IOERR, and the buffer is left as it was.
        let long: Vec<virtio_queue::desc::RawDescriptor> =
            request_descriptors(0x10000, 0x20000, 8 * 512, true, 0x30000)
                .into_iter()
                .map(Into::into)
                .collect();
        let (before, after, used) = run_raw(&mut b, &long);
        assert_eq!(after[0x30000], VIRTIO_BLK_S_IOERR as u8);
        assert_eq!(
            changed_outside(&before, &after, used, &[(0x30000, 0x30001)]),
            0
        );
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn disks_that_cannot_be_used_are_refused_with_the_reason() {
        assert!(open_disk(Path::new("/tmp"), false)
            .unwrap_err()
            .to_string()
            .contains("regular file"));
        assert!(open_disk(Path::new("/nonexistent"), false)
            .unwrap_err()
            .to_string()
            .contains("No such"));
        let p = std::env::temp_dir().join(format!("hover-blk-ro-{}", std::process::id()));
        std::fs::write(&p, [0u8; 512]).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
        assert!(open_disk(&p, false)
            .unwrap_err()
            .to_string()
            .contains(",readonly"));
        assert!(open_disk(&p, true).is_ok());
        std::fs::write(std::env::temp_dir().join("hover-blk-empty"), b"").unwrap();
        assert!(
            open_disk(&std::env::temp_dir().join("hover-blk-empty"), true)
                .unwrap_err()
                .to_string()
                .contains("at least one")
        );
        std::fs::remove_file(p).unwrap();
    }
}
