//! The virtio-mmio transport (virtio 1.x, "version 2" registers): the
//! registers a driver reads and writes in a device's MMIO window, the
//! feature negotiation, the device status, and each queue's
//! configuration. The driver's mistakes (a status written out of order,
//! a queue size that is not a power of two, rings outside guest memory, a
//! notification for a queue never set up) fail the device (it reports
//! DEVICE_NEEDS_RESET, with one log line) and touch nothing else.

use crate::memory::host_writes::TrackedMemory;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};

use super::{VirtioDevice, F_VERSION_1};

mod persist;

pub use persist::{MmioState, QueueSave};

/// "virt", the first register's value.
const MAGIC: u32 = 0x7472_6976;
/// The register layout of virtio 1.x.
const VERSION: u32 = 2;
/// Any vendor id: "HOVR".
const VENDOR: u32 = 0x5256_4f48;

/// One device behind its MMIO window.
pub struct MmioTransport {
    device: Box<dyn VirtioDevice>,
    mem: TrackedMemory,
    queues: Vec<Queue>,
    queue_sel: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    status: u32,
    interrupt_status: u32,
    /// Whether a driver mistake was logged (one line per device).
    complained: bool,
    /// DRIVER_OK was just set: the ready queues are to be served once.
    started: bool,
}

impl MmioTransport {
    /// `device` in guest memory `mem`, reset.
    pub fn new(device: Box<dyn VirtioDevice>, mem: TrackedMemory) -> MmioTransport {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| Queue::new(max).expect("a device's queue size is a power of two"))
            .collect();
        MmioTransport {
            device,
            mem,
            queues,
            queue_sel: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            driver_features: 0,
            status: 0,
            interrupt_status: 0,
            complained: false,
            started: false,
        }
    }

    /// The device's name, for log lines.
    pub fn name(&self) -> String {
        self.device.name()
    }

    /// How many queues the device has.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// The device status register.
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Fail the device for a driver mistake: DEVICE_NEEDS_RESET, one line.
    fn fail(&mut self, why: &str) {
        if !self.complained {
            tracing::warn!(
                "virtio {}: {why}; the device needs a reset (the VM runs on)",
                self.device.name()
            );
            self.complained = true;
        }
        self.status |= VIRTIO_CONFIG_S_NEEDS_RESET;
    }

    fn reset(&mut self) {
        for q in &mut self.queues {
            q.reset();
        }
        self.queue_sel = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.driver_features = 0;
        self.status = 0;
        self.interrupt_status = 0;
        self.device.ack_features(0);
    }

    fn selected(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// A read of `data.len()` bytes at `offset` in the window.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            self.device
                .read_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        data.fill(0);
        if data.len() != 4 || !offset.is_multiple_of(4) {
            return;
        }
        let v = match offset as u32 {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC,
            VIRTIO_MMIO_VERSION => VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device.device_id(),
            VIRTIO_MMIO_VENDOR_ID => VENDOR,
            VIRTIO_MMIO_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.device.features() as u32,
                1 => (self.device.features() >> 32) as u32,
                _ => 0,
            },
            VIRTIO_MMIO_QUEUE_NUM_MAX => self
                .queues
                .get(self.queue_sel as usize)
                .map_or(0, |q| q.max_size().into()),
            VIRTIO_MMIO_QUEUE_READY => self
                .queues
                .get(self.queue_sel as usize)
                .map_or(0, |q| q.ready().into()),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt_status,
            VIRTIO_MMIO_STATUS => self.status,
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            _ => 0,
        };
        data.copy_from_slice(&v.to_le_bytes());
    }

    /// A write of `data` at `offset` in the window: the queue the driver
    /// notified, if it did.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Option<u16> {
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            if self.running() || self.status & VIRTIO_CONFIG_S_DRIVER != 0 {
                self.device
                    .write_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            }
            return None;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            self.fail(&format!(
                "a {}-byte write to register {offset:#x}",
                data.len()
            ));
            return None;
        };
        if !offset.is_multiple_of(4) {
            self.fail(&format!("a misaligned write to {offset:#x}"));
            return None;
        }
        let v = u32::from_le_bytes(bytes);
        // Queue set-up is for the time between FEATURES_OK and DRIVER_OK,
        // on a queue not yet ready.
        let configuring = self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0
            && self.status & VIRTIO_CONFIG_S_DRIVER_OK == 0;
        match offset as u32 {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = v,
            VIRTIO_MMIO_DRIVER_FEATURES => {
                if self.status & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
                    self.fail("features written after FEATURES_OK");
                } else if self.driver_features_sel < 2 {
                    let shift = 32 * self.driver_features_sel;
                    self.driver_features = (self.driver_features & !(0xffff_ffffu64 << shift))
                        | (u64::from(v) << shift);
                }
            }
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = v,
            VIRTIO_MMIO_QUEUE_NUM
            | VIRTIO_MMIO_QUEUE_DESC_LOW
            | VIRTIO_MMIO_QUEUE_DESC_HIGH
            | VIRTIO_MMIO_QUEUE_AVAIL_LOW
            | VIRTIO_MMIO_QUEUE_AVAIL_HIGH
            | VIRTIO_MMIO_QUEUE_USED_LOW
            | VIRTIO_MMIO_QUEUE_USED_HIGH
            | VIRTIO_MMIO_QUEUE_READY => self.write_queue(offset as u32, v, configuring),
            VIRTIO_MMIO_QUEUE_NOTIFY => {
                if (v as usize) < self.queues.len() {
                    return Some(v as u16);
                }
                self.fail(&format!(
                    "a notification for queue {v}, which does not exist"
                ));
            }
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt_status &= !v,
            VIRTIO_MMIO_STATUS => self.set_status(v),
            other => self.fail(&format!(
                "a write to register {other:#x}, which is not writable"
            )),
        }
        None
    }

    fn write_queue(&mut self, reg: u32, v: u32, configuring: bool) {
        let sel = self.queue_sel;
        let Some(q) = self.queues.get(sel as usize) else {
            return self.fail(&format!("queue {sel} configured, which does not exist"));
        };
        if !configuring || q.ready() && reg != VIRTIO_MMIO_QUEUE_READY {
            return self.fail(&format!(
                "queue {sel} configured outside FEATURES_OK..DRIVER_OK or while ready"
            ));
        }
        match reg {
            VIRTIO_MMIO_QUEUE_NUM => {
                let max = q.max_size();
                if v == 0 || !v.is_power_of_two() || v > u32::from(max) {
                    return self.fail(&format!(
                        "queue {sel} size {v}: a power of two up to {max} is needed"
                    ));
                }
                if let Some(q) = self.selected() {
                    q.set_size(v as u16);
                }
            }
            VIRTIO_MMIO_QUEUE_READY => {
                let mem = self.mem.clone();
                let Some(q) = self.selected() else { return };
                // virtio-queue checks the rings of a ready queue only.
                q.set_ready(v == 1);
                if v == 1 && !q.is_valid(&mem) {
                    q.set_ready(false);
                    self.fail(&format!(
                        "queue {sel} made ready with rings outside guest memory or misaligned"
                    ));
                }
            }
            _ => {
                if let Some(q) = self.selected() {
                    match reg {
                        VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(Some(v), None),
                        VIRTIO_MMIO_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(v)),
                        VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(v), None),
                        VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(v)),
                        VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(Some(v), None),
                        _ => q.set_used_ring_address(None, Some(v)),
                    }
                }
            }
        }
    }

    fn set_status(&mut self, v: u32) {
        if v == 0 {
            return self.reset();
        }
        let old = self.status & !VIRTIO_CONFIG_S_NEEDS_RESET;
        if v & old != old {
            return self.fail(&format!(
                "status {v:#x} clears bits of {old:#x} without a reset"
            ));
        }
        let new = v & !old;
        let has = |bit: u32| v & bit != 0;
        if new & VIRTIO_CONFIG_S_FAILED != 0 {
            self.status |= VIRTIO_CONFIG_S_FAILED;
            return;
        }
        if new & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            if !has(VIRTIO_CONFIG_S_ACKNOWLEDGE) || !has(VIRTIO_CONFIG_S_DRIVER) {
                return self.fail("FEATURES_OK before ACKNOWLEDGE and DRIVER");
            }
            let offered = self.device.features();
            if self.driver_features & !offered != 0 || self.driver_features & F_VERSION_1 == 0 {
                // The spec's answer: FEATURES_OK stays clear, the driver
                // reads it back and gives up.
                tracing::warn!(
                    "virtio {}: the driver asked for features {:#x} of {:#x} offered (VERSION_1 needed); FEATURES_OK refused",
                    self.device.name(),
                    self.driver_features,
                    offered
                );
                self.status = v & !VIRTIO_CONFIG_S_FEATURES_OK & !VIRTIO_CONFIG_S_DRIVER_OK;
                return;
            }
            self.device.ack_features(self.driver_features);
        }
        if new & VIRTIO_CONFIG_S_DRIVER_OK != 0 && !has(VIRTIO_CONFIG_S_FEATURES_OK) {
            return self.fail("DRIVER_OK before FEATURES_OK");
        }
        if new & VIRTIO_CONFIG_S_DRIVER != 0 && !has(VIRTIO_CONFIG_S_ACKNOWLEDGE) {
            return self.fail("DRIVER before ACKNOWLEDGE");
        }
        self.status = v | (self.status & VIRTIO_CONFIG_S_NEEDS_RESET);
        // Linux queues buffers and notifies some queues before DRIVER_OK
        // (the balloon's first statistics): those notifications found the
        // device not running, so each ready queue is served once now.
        self.started |= new & VIRTIO_CONFIG_S_DRIVER_OK != 0;
    }

    /// Whether the driver just made the device run (asked once): its
    /// ready queues are then to be served.
    pub fn take_started(&mut self) -> bool {
        std::mem::take(&mut self.started)
    }

    /// The device's backend descriptor, if it has one.
    pub fn backend_fd(&self) -> Option<std::os::fd::RawFd> {
        self.device.backend_fd()
    }

    /// Whether the driver set the device up and it is working.
    fn running(&self) -> bool {
        self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0
            && self.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0
    }

    /// Have a running device tell the network where the guest is.
    pub fn announce(&mut self) {
        if self.running() {
            self.device.announce();
        }
    }

    /// The device's backend became ready: whether the driver must be
    /// interrupted.
    pub fn backend_event(&mut self) -> bool {
        if !self.running() {
            return false;
        }
        let used = self.device.backend_ready(&mut self.queues, &self.mem);
        if used {
            self.interrupt_status |= VIRTIO_MMIO_INT_VRING;
        }
        let config = self.device.take_config_change();
        if config {
            self.interrupt_status |= VIRTIO_MMIO_INT_CONFIG;
        }
        used || config
    }

    /// When a running device next wants [`Self::backend_event`] called
    /// without its backend waking it.
    pub fn deadline(&self) -> Option<std::time::Instant> {
        self.running().then(|| self.device.deadline()).flatten()
    }

    /// Serve queue `index` (its notification arrived): whether the driver
    /// must be interrupted. Nothing is done for a device that is not
    /// running or a queue that is not ready (that is logged once).
    pub fn process(&mut self, index: usize) -> bool {
        if !self.running() {
            return false;
        }
        let Some(q) = self.queues.get_mut(index) else {
            return false;
        };
        if !q.ready() {
            self.fail(&format!("queue {index} notified before it was set up"));
            return false;
        }
        let used = self.device.process(index, q, &self.mem);
        let notify = used && q.needs_notification(&self.mem).unwrap_or(true);
        if notify {
            self.interrupt_status |= VIRTIO_MMIO_INT_VRING;
        }
        notify
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    /// A device with one queue of 8 that returns every chain with length 0.
    pub(crate) struct Echo;

    impl VirtioDevice for Echo {
        fn device_id(&self) -> u32 {
            42
        }
        fn name(&self) -> String {
            "echo".into()
        }
        fn features(&self) -> u64 {
            F_VERSION_1 | 1
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[8]
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            super::super::read_config_bytes(&[1, 2, 3, 4], offset, data)
        }
        fn process(&mut self, _: usize, q: &mut Queue, mem: &TrackedMemory) -> bool {
            let mut used = false;
            while let Some(c) = q.pop_descriptor_chain(mem) {
                q.add_used(mem, c.head_index(), 0).unwrap();
                used = true;
            }
            used
        }
    }

    pub(crate) fn mem() -> TrackedMemory {
        TrackedMemory::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    fn r(t: &MmioTransport, reg: u32) -> u32 {
        let mut b = [0u8; 4];
        t.read(reg.into(), &mut b);
        u32::from_le_bytes(b)
    }

    fn w(t: &mut MmioTransport, reg: u32, v: u32) -> Option<u16> {
        t.write(reg.into(), &v.to_le_bytes())
    }

    const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
    const DRV: u32 = VIRTIO_CONFIG_S_DRIVER;
    const FOK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
    const DOK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;

    /// Negotiate VERSION_1 and set up queue 0 of 8 at 0x1000/0x2000/0x3000.
    pub(crate) fn ready(t: &mut MmioTransport) {
        w(t, VIRTIO_MMIO_STATUS, ACK);
        w(t, VIRTIO_MMIO_STATUS, ACK | DRV);
        w(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w(t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
        w(t, VIRTIO_MMIO_STATUS, ACK | DRV | FOK);
        assert_eq!(r(t, VIRTIO_MMIO_STATUS) & FOK, FOK);
        w(t, VIRTIO_MMIO_QUEUE_SEL, 0);
        w(t, VIRTIO_MMIO_QUEUE_NUM, 8);
        w(t, VIRTIO_MMIO_QUEUE_DESC_LOW, 0x1000);
        w(t, VIRTIO_MMIO_QUEUE_AVAIL_LOW, 0x2000);
        w(t, VIRTIO_MMIO_QUEUE_USED_LOW, 0x3000);
        w(t, VIRTIO_MMIO_QUEUE_READY, 1);
        w(t, VIRTIO_MMIO_STATUS, ACK | DRV | FOK | DOK);
    }

    fn needs_reset(t: &MmioTransport) -> bool {
        r(t, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET != 0
    }

    #[test]
    fn the_identity_registers_and_config_space_read_as_the_spec_says() {
        let t = MmioTransport::new(Box::new(Echo), mem());
        assert_eq!(r(&t, VIRTIO_MMIO_MAGIC_VALUE), MAGIC);
        assert_eq!(r(&t, VIRTIO_MMIO_VERSION), 2);
        assert_eq!(r(&t, VIRTIO_MMIO_DEVICE_ID), 42);
        assert_eq!(r(&t, VIRTIO_MMIO_QUEUE_NUM_MAX), 8);
        let mut b = [0u8; 8];
        t.read(0x100 + 2, &mut b);
        assert_eq!(b, [3, 4, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn a_driver_that_follows_the_spec_gets_a_running_device_and_notifications() {
        let mut t = MmioTransport::new(Box::new(Echo), mem());
        ready(&mut t);
        assert_eq!(r(&t, VIRTIO_MMIO_STATUS), ACK | DRV | FOK | DOK);
        assert!(
            t.take_started(),
            "DRIVER_OK: the ready queues are served once"
        );
        assert!(!t.take_started());
        assert_eq!(w(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0), Some(0));
        assert!(!needs_reset(&t));
        // Reset clears everything.
        w(&mut t, VIRTIO_MMIO_STATUS, 0);
        assert_eq!(r(&t, VIRTIO_MMIO_STATUS), 0);
        assert_eq!(r(&t, VIRTIO_MMIO_QUEUE_READY), 0);
    }

    #[test]
    fn features_not_offered_or_without_version_1_leave_features_ok_clear() {
        for (sel, bits) in [(0, 1u32 << 7), (1, 0)] {
            let mut t = MmioTransport::new(Box::new(Echo), mem());
            w(&mut t, VIRTIO_MMIO_STATUS, ACK | DRV);
            w(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, sel);
            w(&mut t, VIRTIO_MMIO_DRIVER_FEATURES, bits);
            w(&mut t, VIRTIO_MMIO_STATUS, ACK | DRV | FOK);
            assert_eq!(
                r(&t, VIRTIO_MMIO_STATUS) & FOK,
                0,
                "sel {sel} bits {bits:#x}"
            );
        }
    }

    #[test]
    fn driver_mistakes_need_a_reset_and_change_nothing_else() {
        // Each: a fresh device, one mistake, then NEEDS_RESET and no queue ready.
        type Mistake = fn(&mut MmioTransport);
        let cases: [(&str, Mistake); 6] = [
            ("status out of order", |t| {
                w(t, VIRTIO_MMIO_STATUS, ACK | DRV | DOK);
            }),
            ("status bits cleared", |t| {
                w(t, VIRTIO_MMIO_STATUS, ACK | DRV);
                w(t, VIRTIO_MMIO_STATUS, ACK);
            }),
            ("queue size not a power of two", |t| {
                w(t, VIRTIO_MMIO_STATUS, ACK | DRV);
                w(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
                w(t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
                w(t, VIRTIO_MMIO_STATUS, ACK | DRV | FOK);
                w(t, VIRTIO_MMIO_QUEUE_NUM, 6);
            }),
            ("rings outside guest memory", |t| {
                w(t, VIRTIO_MMIO_STATUS, ACK | DRV);
                w(t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
                w(t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
                w(t, VIRTIO_MMIO_STATUS, ACK | DRV | FOK);
                w(t, VIRTIO_MMIO_QUEUE_NUM, 8);
                w(t, VIRTIO_MMIO_QUEUE_DESC_HIGH, 1);
                w(t, VIRTIO_MMIO_QUEUE_READY, 1);
            }),
            ("a queue that does not exist notified", |t| {
                ready(t);
                assert_eq!(w(t, VIRTIO_MMIO_QUEUE_NOTIFY, 5), None);
            }),
            ("a queue set up before FEATURES_OK", |t| {
                w(t, VIRTIO_MMIO_QUEUE_NUM, 8);
            }),
        ];
        for (name, mistake) in cases {
            let mut t = MmioTransport::new(Box::new(Echo), mem());
            mistake(&mut t);
            assert!(needs_reset(&t), "{name}");
            assert!(!t.process(0), "{name}: a failed device serves nothing");
        }
    }

    #[test]
    fn a_transports_state_comes_back_whole_and_one_that_does_not_fit_changes_nothing() {
        let mut t = MmioTransport::new(Box::new(Echo), mem());
        ready(&mut t);
        let s = t.state();
        assert!(s.queues[0].ready && s.queues[0].size == 8, "{s:?}");
        let mut back = MmioTransport::new(Box::new(Echo), mem());
        back.restore(&s).unwrap();
        assert_eq!(back.state(), s);
        assert_eq!(r(&back, VIRTIO_MMIO_STATUS), s.status);
        let fresh = MmioTransport::new(Box::new(Echo), mem()).state();
        let refused = |edit: &dyn Fn(&mut MmioState), want: &str| {
            let mut bad = s.clone();
            edit(&mut bad);
            let mut t = MmioTransport::new(Box::new(Echo), mem());
            let e = t.restore(&bad).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
            assert_eq!(t.state(), fresh, "a refused state changes nothing");
        };
        refused(&|b| b.device_id = 2, "of type");
        refused(&|b| b.queues.push(QueueSave::default()), "saved queues");
        refused(&|b| b.queues[0].desc_table = 1 << 40, "not in guest memory");
        refused(&|b| b.queues[0].size = 3, "saved queue 0");
        refused(&|b| b.driver_features |= 1 << 50, "not all offered");
    }

    #[test]
    fn a_queue_notified_before_it_is_ready_is_not_served() {
        let mut t = MmioTransport::new(Box::new(Echo), mem());
        w(&mut t, VIRTIO_MMIO_STATUS, ACK | DRV);
        w(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        w(&mut t, VIRTIO_MMIO_DRIVER_FEATURES, 1);
        w(&mut t, VIRTIO_MMIO_STATUS, ACK | DRV | FOK | DOK);
        assert!(!t.process(0));
        assert!(needs_reset(&t));
    }
}
