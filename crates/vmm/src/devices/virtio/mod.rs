//! Virtio devices for Linux guests, over virtio-mmio (virtio 1.x): the
//! transport once ([`mmio`], its saved state in `mmio/persist.rs`), each
//! device in a file of its own with its state beside it ([`block`],
//! [`net`], [`rng`], [`balloon`] with what the API sets of it), and the
//! I/O thread that serves their queues ([`io_thread`]): queue
//! notifications reach it through ioeventfds (no exit to user space),
//! interrupts leave through irqfds (or by `KVM_IRQ_LINE` from the I/O
//! thread while boosting is on: `devices/irq_line.rs`).
//! Rings are walked by the `virtio-queue` crate (its descriptor chains stop
//! at loops and at addresses outside guest memory).

pub mod balloon;
pub mod block;
pub mod io_thread;
pub mod mmio;
pub mod net;
pub mod rng;

use crate::devices::state_error::StateError;
use crate::memory::host_writes::TrackedMemory;
use crate::sync::Locked;
use virtio_queue::Queue;

/// Where the first device's MMIO window is (in the MMIO hole below the
/// IOAPIC), and each window's size.
pub const MMIO_BASE: u64 = 0xd000_0000;
/// One device's window.
pub const MMIO_WINDOW: u64 = 0x1000;
/// The first device's IOAPIC pin (0-4 are the PIT, keyboard, cascade and
/// COM1/COM2 of the PC), one pin per device after it.
pub const FIRST_GSI: u32 = 5;
/// The IOAPIC's pins.
const IOAPIC_PINS: u32 = 24;
/// How many devices the interrupt lines allow (the configuration's limit).
pub const MAX_DEVICES: usize = crate::config::MAX_VIRTIO_DEVICES;
const _: () = assert!(MAX_DEVICES == (IOAPIC_PINS - FIRST_GSI) as usize);

/// Device `index`'s MMIO window.
pub fn window(index: usize) -> u64 {
    MMIO_BASE + index as u64 * MMIO_WINDOW
}

/// Device `index`'s interrupt line.
pub fn gsi(index: usize) -> u32 {
    FIRST_GSI + index as u32
}

/// How many virtio devices a machine has: its disks, its network cards,
/// the entropy device, then the balloon (Linux guests only), in that order
/// on the bus.
pub fn device_count(m: &crate::config::MachineConfig) -> usize {
    m.virtio_device_count()
}

/// `VIRTIO_F_VERSION_1`: every Hover device is a modern (1.x) one.
pub const F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// A device on the MMIO bus: its window and transport, and the eventfds
/// its queue notifications go to when they arrive as an exit (KVM's
/// ioeventfds take them otherwise).
pub struct VirtioSlot {
    /// The window's first address.
    pub base: u64,
    /// The transport.
    pub transport: std::sync::Arc<std::sync::Mutex<mmio::MmioTransport>>,
    /// One eventfd per queue (the I/O thread waits on them).
    pub notify: Vec<vmm_sys_util::eventfd::EventFd>,
}

impl VirtioSlot {
    /// Notify each of the device's ready queues, as its driver would.
    pub fn kick_ready(&self) {
        let ready = self.transport.locked().ready_queues();
        for q in ready {
            if let Some(e) = self.notify.get(q) {
                let _ = e.write(1);
            }
        }
    }

    /// Whether `addr` is in this device's window.
    pub fn claims(&self, addr: u64) -> bool {
        (self.base..self.base + MMIO_WINDOW).contains(&addr)
    }

    /// A read in its window.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        self.transport.locked().read(addr - self.base, data);
    }

    /// A write in its window; a queue notification is passed to the I/O thread.
    pub fn write(&self, addr: u64, data: &[u8]) {
        let (notified, started) = {
            let mut t = self.transport.locked();
            let n = t.write(addr - self.base, data);
            (n, t.take_started())
        };
        if let Some(q) = notified.and_then(|q| self.notify.get(q as usize)) {
            let _ = q.write(1);
        }
        if started {
            self.kick_ready();
        }
    }
}

/// What a virtio device is to its transport.
pub trait VirtioDevice: Send {
    /// The virtio device id (2: block, 4: entropy, ...).
    fn device_id(&self) -> u32;
    /// A name for log lines ("block vda").
    fn name(&self) -> String;
    /// The features it offers ([`F_VERSION_1`] among them).
    fn features(&self) -> u64;
    /// The most entries each of its queues takes (one entry per queue).
    fn queue_max_sizes(&self) -> &[u16];
    /// Read its configuration space at `offset` (what lies past its end
    /// reads as zeros).
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// A write of the driver's to its configuration space (the balloon's
    /// `actual`); other devices have no writable field: ignored.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Serve every request available on queue `index` of `mem`; whether
    /// any buffer was returned to the driver (then it may be interrupted).
    fn process(&mut self, index: usize, queue: &mut Queue, mem: &TrackedMemory) -> bool;
    /// The driver accepted `features` (FEATURES_OK; a reset says 0): a
    /// device whose backend depends on them (a tap's offloads) sets it now.
    fn ack_features(&mut self, _features: u64) {}
    /// Tell the network where the guest now is (a restored or arrived
    /// VM): a network card announces its MAC; other devices do nothing.
    fn announce(&mut self) {}
    /// A host descriptor whose readiness the device serves (a tap), if any:
    /// the I/O thread waits on it (edge-triggered) beside the queues.
    fn backend_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Its backend became ready, or its [`Self::deadline`] passed:
    /// whether any buffer was returned.
    fn backend_ready(&mut self, _queues: &mut [Queue], _mem: &TrackedMemory) -> bool {
        false
    }
    /// When the device next wants [`Self::backend_ready`] called without
    /// its backend waking it (the balloon's statistics poll).
    fn deadline(&self) -> Option<std::time::Instant> {
        None
    }
    /// Whether its configuration changed since last asked (the driver then
    /// gets a configuration interrupt).
    fn take_config_change(&mut self) -> bool {
        false
    }
    /// Its own state beyond the transport's, for a snapshot (none: empty).
    fn save_state(&self) -> Vec<u8> {
        Vec::new()
    }
    /// Take up [`Self::save_state`]'s bytes.
    fn load_state(&mut self, _state: &[u8]) -> Result<(), StateError> {
        Ok(())
    }
}

/// Copy `config[offset..]` into `data`, zeros past its end.
pub fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let start = (offset as usize).min(config.len());
    let end = (start + data.len()).min(config.len());
    data[..end - start].copy_from_slice(&config[start..end]);
}
