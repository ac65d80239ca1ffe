//! A virtio block device on virtio-mmio (virtio 1.x, MMIO version 2), for
//! `iolat` under a VMM without Hover's I/O device (QEMU microvm:
//! `-device virtio-blk-device` with `-global virtio-mmio.force-legacy=false`).
//! QEMU names the transport on the command line
//! (`virtio_mmio.device=SIZE@BASE:GSI`); its interrupt line goes through
//! the IOAPIC (edge-triggered here, to a device vector that wakes the
//! waiting task). One queue of up to 16 entries, one request in flight.

use core::cell::UnsafeCell;
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
use core::sync::atomic::{fence, AtomicU32, Ordering};

use hover_abi::vectors::{DEVICE_BASE, DEVICE_COUNT};

use crate::arch::percpu;
use crate::kernel::timer::sleep_until;
use crate::kernel::{clock, irq};

/// The device vector its interrupt arrives on.
const VECTOR: u8 = DEVICE_BASE + DEVICE_COUNT - 1;
const QUEUE: usize = 16;

const MAGIC: usize = 0x000;
const VERSION: usize = 0x004;
const DEVICE_ID: usize = 0x008;
const DEVICE_FEATURES: usize = 0x010;
const DEVICE_FEATURES_SEL: usize = 0x014;
const DRIVER_FEATURES: usize = 0x020;
const DRIVER_FEATURES_SEL: usize = 0x024;
const QUEUE_SEL: usize = 0x030;
const QUEUE_NUM_MAX: usize = 0x034;
const QUEUE_NUM: usize = 0x038;
const QUEUE_READY: usize = 0x044;
const QUEUE_NOTIFY: usize = 0x050;
const INTERRUPT_STATUS: usize = 0x060;
const INTERRUPT_ACK: usize = 0x064;
const STATUS: usize = 0x070;
const QUEUE_DESC: usize = 0x080;
const QUEUE_DRIVER: usize = 0x090;
const QUEUE_DEVICE: usize = 0x0a0;
const CONFIG_CAPACITY: usize = 0x100;

const ACKNOWLEDGE: u32 = 1;
const DRIVER: u32 = 2;
const DRIVER_OK: u32 = 4;
const FEATURES_OK: u32 = 8;
/// VIRTIO_F_VERSION_1, bit 32: bit 0 of feature word 1.
const VERSION_1: u32 = 1;
const BLOCK_DEVICE: u32 = 2;
const T_OUT: u32 = 1;

const DESC_NEXT: u16 = 1;
const DESC_WRITE: u16 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

#[repr(C)]
struct Header {
    kind: u32,
    reserved: u32,
    sector: u64,
}

#[repr(C, align(4096))]
struct Queue {
    desc: [Desc; QUEUE],
    avail_flags: u16,
    avail_idx: u16,
    avail_ring: [u16; QUEUE],
    used_event: u16,
    _pad: [u16; 1],
    used_flags: u16,
    used_idx: u16,
    used_ring: [[u32; 2]; QUEUE],
    avail_event: u16,
    header: Header,
    status: u8,
}

struct Device(UnsafeCell<Queue>);
// SAFETY: one task drives the device (iolat's); the device's writes are
// read volatile.
unsafe impl Sync for Device {}

static DEV: Device = Device(UnsafeCell::new(Queue {
    desc: [Desc {
        addr: 0,
        len: 0,
        flags: 0,
        next: 0,
    }; QUEUE],
    avail_flags: 0,
    avail_idx: 0,
    avail_ring: [0; QUEUE],
    used_event: 0,
    _pad: [0],
    used_flags: 0,
    used_idx: 0,
    used_ring: [[0; 2]; QUEUE],
    avail_event: 0,
    header: Header {
        kind: 0,
        reserved: 0,
        sector: 0,
    },
    status: 0,
}));

/// A set-up device: its registers, queue size, GSI and the vCPU its
/// interrupt is routed to.
pub struct VirtioBlk {
    base: usize,
    size: u16,
    gsi: u32,
    routed_to: AtomicU32,
}

fn reg(base: usize, off: usize) -> *mut u32 {
    (base + off) as *mut u32
}

fn read(base: usize, off: usize) -> u32 {
    // SAFETY: an MMIO register of the device (identity-mapped).
    unsafe { read_volatile(reg(base, off)) }
}

fn write(base: usize, off: usize, v: u32) {
    // SAFETY: an MMIO register of the device (identity-mapped).
    unsafe { write_volatile(reg(base, off), v) }
}

fn write64(base: usize, off: usize, v: u64) {
    write(base, off, v as u32);
    write(base, off + 4, (v >> 32) as u32);
}

/// `SIZE@BASE:GSI` as QEMU writes it (`512@0xfeb00e00:12`).
pub fn parse_location(v: &str) -> Option<(u64, u32)> {
    let (_, rest) = v.split_once('@')?;
    let (base, gsi) = rest.split_once(':')?;
    let base = u64::from_str_radix(base.strip_prefix("0x")?, 16).ok()?;
    Some((base, gsi.parse().ok()?))
}

/// QEMU microvm's transports when the command line does not name them
/// (QEMU adds `virtio_mmio.device=` only for Linux kernels): 0x200 bytes
/// each from 0xFEB0_0000, 24 on GSIs 24-47 when its second IOAPIC is
/// there, else 8 on GSIs 5-12. The first block device among them.
fn probe_microvm() -> Option<(u64, u32)> {
    const FIRST: u64 = 0xFEB0_0000;
    let (count, first_gsi) = if crate::arch::ioapic::present(1) {
        (24, 24)
    } else {
        (8, 5)
    };
    (0..count).find_map(|i| {
        let b = (FIRST + 0x200 * i as u64) as usize;
        (read(b, MAGIC) == 0x7472_6976 && read(b, DEVICE_ID) == BLOCK_DEVICE)
            .then_some((b as u64, first_gsi + i))
    })
}

impl VirtioBlk {
    /// Find and set up the device the command line names; `Err` says why
    /// it cannot be used.
    pub fn open(cmdline: &str) -> Result<VirtioBlk, &'static str> {
        let (base, gsi) = match hover_abi::cmdline::get(cmdline, "virtio_mmio.device") {
            Some(loc) => parse_location(loc).ok_or("virtio_mmio.device is not SIZE@0xBASE:GSI")?,
            None => probe_microvm().ok_or("no virtio block device found")?,
        };
        // The MMIO hole under 4 GiB, where QEMU puts its transports.
        if !(0xC000_0000..0xFFFF_F000).contains(&base) || base % 4 != 0 {
            return Err("virtio_mmio.device's base is not in the MMIO hole");
        }
        crate::arch::ioapic::check_gsi(gsi)?;
        let b = base as usize;
        if read(b, MAGIC) != 0x7472_6976 {
            return Err("no virtio-mmio device at that address");
        }
        if read(b, VERSION) != 2 {
            return Err(
                "a legacy virtio-mmio device (QEMU: -global virtio-mmio.force-legacy=false)",
            );
        }
        if read(b, DEVICE_ID) != BLOCK_DEVICE {
            return Err("the virtio-mmio device is not a block device");
        }
        write(b, STATUS, 0);
        write(b, STATUS, ACKNOWLEDGE);
        write(b, STATUS, ACKNOWLEDGE | DRIVER);
        write(b, DEVICE_FEATURES_SEL, 1);
        if read(b, DEVICE_FEATURES) & VERSION_1 == 0 {
            return Err("the device does not offer VIRTIO_F_VERSION_1");
        }
        write(b, DRIVER_FEATURES_SEL, 0);
        write(b, DRIVER_FEATURES, 0);
        write(b, DRIVER_FEATURES_SEL, 1);
        write(b, DRIVER_FEATURES, VERSION_1);
        write(b, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
        if read(b, STATUS) & FEATURES_OK == 0 {
            return Err("the device refused the features");
        }
        write(b, QUEUE_SEL, 0);
        let max = read(b, QUEUE_NUM_MAX);
        if max == 0 {
            return Err("the device has no queue 0");
        }
        let size = (max as usize).min(QUEUE) as u16;
        write(b, QUEUE_NUM, size as u32);
        let q = DEV.0.get();
        // SAFETY: the queue's memory is ours; the device reads it only
        // after QueueReady.
        unsafe {
            write64(b, QUEUE_DESC, addr_of!((*q).desc) as u64);
            write64(b, QUEUE_DRIVER, addr_of!((*q).avail_flags) as u64);
            write64(b, QUEUE_DEVICE, addr_of!((*q).used_flags) as u64);
        }
        write(b, QUEUE_READY, 1);
        write(b, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        let dev = VirtioBlk {
            base: b,
            size,
            gsi,
            routed_to: AtomicU32::new(u32::MAX),
        };
        dev.self_test()?;
        Ok(dev)
    }

    /// The disk's size in bytes (its configuration's capacity, in sectors).
    pub fn capacity_bytes(&self) -> u64 {
        let lo = read(self.base, CONFIG_CAPACITY) as u64;
        let hi = read(self.base, CONFIG_CAPACITY + 4) as u64;
        ((hi << 32) | lo).saturating_mul(512)
    }

    /// Write `len` bytes at guest address `buf` to the disk at byte
    /// `offset` (a multiple of 512) and sleep until the device completes
    /// it: the virtio status (0 = OK).
    pub fn write_sync(&self, buf: u64, len: u32, offset: u64) -> u8 {
        let before = self.submit(buf, len, offset);
        while self.used() == before {
            irq::wait(VECTOR);
        }
        self.finish()
    }

    /// One write of zeros to sector 0, waited for by sleeping, not by the
    /// interrupt: then whether the interrupt came. A line the guest routed
    /// wrong would otherwise leave every `write_sync` asleep forever.
    fn self_test(&self) -> Result<(), &'static str> {
        static ZEROS: [u8; 512] = [0; 512];
        let cpu = percpu::this_cpu().index();
        let irqs = irq::count(cpu, VECTOR);
        let before = self.submit(ZEROS.as_ptr() as u64, 512, 0);
        let until = clock::deadline_after_us(2_000_000);
        while self.used() == before {
            if clock::now() > until {
                return Err("the device did not complete a test write within 2 s");
            }
            sleep_until(clock::deadline_after_us(1000));
        }
        while irq::count(cpu, VECTOR) == irqs {
            if clock::now() > until {
                return Err("the device completed a write but its interrupt never came (is its GSI routed as QEMU microvm's default layout has it?)");
            }
            sleep_until(clock::deadline_after_us(1000));
        }
        match self.finish() {
            0 => Ok(()),
            _ => Err("the device failed a test write"),
        }
    }

    /// Queue a write and notify the device; the used index before it.
    fn submit(&self, buf: u64, len: u32, offset: u64) -> u16 {
        let cpu = percpu::this_cpu().index() as u32;
        if self.routed_to.swap(cpu, Ordering::Relaxed) != cpu {
            crate::arch::ioapic::route(self.gsi, VECTOR, cpu);
        }
        let q = DEV.0.get();
        // SAFETY: one request in flight; the device reads the chain only
        // after the notify.
        unsafe {
            write_volatile(
                addr_of_mut!((*q).header),
                Header {
                    kind: T_OUT,
                    reserved: 0,
                    sector: offset / 512,
                },
            );
            write_volatile(addr_of_mut!((*q).status), 0xff);
            let d = addr_of_mut!((*q).desc);
            (*d)[0] = Desc {
                addr: addr_of!((*q).header) as u64,
                len: core::mem::size_of::<Header>() as u32,
                flags: DESC_NEXT,
                next: 1,
            };
            (*d)[1] = Desc {
                addr: buf,
                len,
                flags: DESC_NEXT,
                next: 2,
            };
            (*d)[2] = Desc {
                addr: addr_of!((*q).status) as u64,
                len: 1,
                flags: DESC_WRITE,
                next: 0,
            };
            let used = read_volatile(addr_of!((*q).used_idx));
            let idx = read_volatile(addr_of!((*q).avail_idx));
            write_volatile(
                addr_of_mut!((*q).avail_ring[idx as usize % self.size as usize]),
                0,
            );
            fence(Ordering::SeqCst);
            write_volatile(addr_of_mut!((*q).avail_idx), idx.wrapping_add(1));
            fence(Ordering::SeqCst);
            write(self.base, QUEUE_NOTIFY, 0);
            used
        }
    }

    /// The device's used index.
    fn used(&self) -> u16 {
        // SAFETY: the device writes it; read volatile.
        unsafe { read_volatile(addr_of!((*DEV.0.get()).used_idx)) }
    }

    /// After a completion: lower the line, so the next completion is a new
    /// edge (the IOAPIC pin is edge-triggered; no other request is
    /// pending), and return the request's status.
    fn finish(&self) -> u8 {
        fence(Ordering::Acquire);
        let isr = read(self.base, INTERRUPT_STATUS);
        if isr != 0 {
            write(self.base, INTERRUPT_ACK, isr);
        }
        // SAFETY: the device wrote it before advancing the used index.
        unsafe { read_volatile(addr_of!((*DEV.0.get()).status)) }
    }
}
