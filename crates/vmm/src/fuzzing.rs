//! Entry points for the fuzz targets (`fuzz/`, `scripts/fuzz.sh`): each
//! takes arbitrary bytes and hands them to one parser of outside input,
//! exactly as the VMM does, with no KVM needed. A parser may refuse its
//! input; it must never panic, hang or touch memory it should not. The
//! normal suite replays every committed corpus input through them
//! (`tests/fuzz_corpus.rs`), so a finding added to a corpus stays a
//! regression test.

use std::io::Write;
use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::boot::{self, ImageBytes};
use crate::config::DiskConfig;
use crate::config::{BoostConfig, BoostMode};
use crate::devices::control::ControlDevice;
use crate::devices::virtio::block::Block;
use crate::devices::virtio::mmio::MmioTransport;
use crate::memory::host_writes::{GuestWriter, HostWrites, TrackedMemory};
use crate::migration::message::Message;
use crate::migration::wire::{self, Frame, FrameReader, Kind};
use crate::sched::boost::Booster;

/// The ELF loader's checks on a guest image (`--guest PATH`).
pub fn elf(data: &[u8]) {
    let img = ImageBytes {
        name: "fuzz".into(),
        bytes: data.to_vec().into(),
    };
    if let Ok(layout) = boot::inspect(&img) {
        let _ = boot::check_fits(&img, &layout, 256 << 20);
    }
}

/// The guest command line's check against the workload table (`--cmdline`).
pub fn cmdline(data: &[u8]) {
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = crate::config::check_builtin_cmdline(s);
    }
}

/// A control API request body; the first byte picks the endpoint.
pub fn api_body(data: &[u8]) {
    if let Some((&which, body)) = data.split_first() {
        crate::api::fuzz_body(which, body);
    }
}

/// A snapshot file: opened and checked, then every stored page read.
pub fn snapshot(data: &[u8]) {
    // A memfd stands for the file, so nothing touches the disk.
    let Ok(mut f) = crate::memory::memfd(0) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&f));
    let Ok(snap) = crate::state::file::Snapshot::open(std::path::Path::new(&path)) else {
        return;
    };
    let mut page = vec![0u8; 4096];
    for (_, slot) in snap.stored_pages().take(4096) {
        let _ = snap.read_stored(slot, &mut page);
    }
}

/// A migration stream as a destination reads it: the hello, then frames,
/// each payload decoded as its kind says.
///
/// Every frame carries a CRC, which random bytes rarely match; so an input
/// whose first byte has its top bit set is one payload instead, decoded as
/// the kind in the low bits: the decoders behind the CRC are fuzzed too.
pub fn migration_stream(data: &[u8]) {
    match data.split_first() {
        Some((&k, payload)) if k & 0x80 != 0 => {
            if let Some(kind) = Kind::from(u32::from(k & 0x7f)) {
                decode(Frame {
                    kind,
                    offset: 0,
                    payload: payload.to_vec(),
                });
            }
        }
        _ => {
            let mut r = FrameReader::new(data);
            match r.hello() {
                // The MAC trailer's reading is fuzzed too (a fixed key:
                // random tags never match, but every length does pass).
                Ok(flags) if flags & wire::HELLO_AUTH != 0 => {
                    r.set_mac(crate::migration::mac::FrameMac::from_key_bytes([0; 32]))
                }
                Ok(_) => {}
                Err(_) => return,
            }
            while let Ok(f) = r.frame() {
                decode(f);
            }
        }
    }
}

/// A frame's message decoded, and what needs the guest's size checked
/// against a 1 GiB guest.
fn decode(frame: Frame) {
    const END: u64 = 1 << 30;
    match Message::decode(frame) {
        Ok(Message::Postcopy(set) | Message::Missing(set)) => {
            let _ = set.pages(END);
        }
        Ok(Message::Request(req)) => {
            let _ = req.pages(END);
        }
        _ => {}
    }
}

/// Guest-written records: `data` becomes guest memory (64 KiB),
/// then control requests at addresses taken from its first bytes are
/// handled (reports, logs, MSI and I/O setup requests), boost areas
/// registered and read, and the halt-polling areas (at 0x4000) read as the
/// governor and the I/O thread read them.
pub fn guest_records(data: &[u8]) {
    const RAM: usize = 64 << 10;
    let Ok(mem) = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]) else {
        return;
    };
    let n = data.len().min(RAM);
    if mem.write_slice(&data[..n], GuestAddress(0)).is_err() {
        return;
    }
    let guest = GuestWriter::new(mem.clone(), Arc::new(HostWrites::new(RAM as u64)));
    let booster = Booster::new(
        BoostConfig {
            mode: BoostMode::Off,
            ..Default::default()
        },
        Default::default(),
        guest.clone(),
        2,
        1_000_000,
    );
    let _ = crate::sched::guest_poll::read(&mem, 2, &std::sync::atomic::AtomicBool::new(false));
    let _ = crate::sched::guest_poll::completion_seen_by_poll(&guest, 1);
    let dev = ControlDevice::new(guest, None, 2).with_booster(booster.clone());
    for (i, c) in data.chunks_exact(8).take(16).enumerate() {
        let at = u64::from_le_bytes(c.try_into().expect("8 bytes")) % RAM as u64;
        let _ = dev.handle(i % 2, at & !7);
        booster.on_exit(i % 2);
    }
    let _ = dev.reports();
}

/// Guest RAM of the virtio targets, and the disk under their block device.
const VIRTIO_RAM: usize = 64 << 10;
const VIRTIO_DISK: u64 = 64 << 10;

/// A virtio-blk device (read-only if asked) on a 64 KiB memfd disk, its
/// transport over 64 KiB of guest RAM holding `data`.
fn block_transport(data: &[u8], readonly: bool) -> Option<MmioTransport> {
    let mem = TrackedMemory::from_ranges(&[(GuestAddress(0), VIRTIO_RAM)]).ok()?;
    let n = data.len().min(VIRTIO_RAM);
    mem.write_slice(&data[..n], GuestAddress(0)).ok()?;
    let disk = crate::memory::memfd(VIRTIO_DISK).ok()?;
    let config = DiskConfig {
        id: "fuzz".into(),
        readonly,
        size: 0,
    };
    let block = Block::new(config, "fuzz.img".into(), disk, VIRTIO_DISK);
    Some(MmioTransport::new(Box::new(block), mem))
}

fn mmio_write(t: &mut MmioTransport, reg: u32, v: u32) {
    t.write(reg.into(), &v.to_le_bytes());
}

/// The virtio-blk request path: a driver that sets the device up by the
/// book (queue 0 of 16: descriptors at 0x1000, available ring at 0x2000,
/// used ring at 0x3000) in guest memory that is `data` (the rings, the
/// descriptors, the requests and their buffers are all fuzzed), then
/// notifies the queue a few times. The first byte's low bit makes the disk
/// read-only.
pub fn virtio_block(data: &[u8]) {
    use virtio_bindings::virtio_config::*;
    use virtio_bindings::virtio_mmio::*;
    let readonly = data.first().is_some_and(|b| b & 1 == 1);
    let Some(mut t) = block_transport(data, readonly) else {
        return;
    };
    let (ack, drv, fok, dok) = (
        VIRTIO_CONFIG_S_ACKNOWLEDGE,
        VIRTIO_CONFIG_S_DRIVER,
        VIRTIO_CONFIG_S_FEATURES_OK,
        VIRTIO_CONFIG_S_DRIVER_OK,
    );
    mmio_write(&mut t, VIRTIO_MMIO_STATUS, ack);
    mmio_write(&mut t, VIRTIO_MMIO_STATUS, ack | drv);
    mmio_write(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    mmio_write(&mut t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
    mmio_write(&mut t, VIRTIO_MMIO_STATUS, ack | drv | fok);
    mmio_write(&mut t, VIRTIO_MMIO_QUEUE_SEL, 0);
    mmio_write(&mut t, VIRTIO_MMIO_QUEUE_NUM, 16);
    mmio_write(&mut t, VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1000);
    mmio_write(&mut t, VIRTIO_MMIO_QUEUE_AVAIL_LOW, 0x2000);
    mmio_write(&mut t, VIRTIO_MMIO_QUEUE_USED_LOW, 0x3000);
    mmio_write(&mut t, VIRTIO_MMIO_QUEUE_READY, 1);
    mmio_write(&mut t, VIRTIO_MMIO_STATUS, ack | drv | fok | dok);
    for _ in 0..3 {
        t.process(0);
    }
}

/// The virtio-mmio transport's registers in any order: `data` is guest
/// memory (64 KiB) and, read 6 bytes at a time, a sequence of accesses to a
/// virtio-blk device's window: a kind byte (write 4 bytes, read 4 bytes,
/// write 1 or 2 bytes, or serve queue 0), a register byte (times 4: the
/// registers and the config space) and a 32-bit value.
pub fn virtio_mmio(data: &[u8]) {
    let Some(mut t) = block_transport(data, false) else {
        return;
    };
    for op in data.chunks_exact(6).take(256) {
        let offset = u64::from(op[1]) * 4 % 0x200;
        let v = [op[2], op[3], op[4], op[5]];
        match op[0] % 5 {
            0 => {
                t.write(offset, &v);
            }
            1 => {
                let mut b = [0u8; 4];
                t.read(offset, &mut b);
            }
            2 => {
                t.write(offset, &v[..1]);
            }
            3 => {
                t.write(offset, &v[..2]);
            }
            _ => {
                t.process(usize::from(op[2] & 1));
                let _ = t.status();
            }
        }
    }
}
