//! A transport's state saved and loaded (a snapshot, a migration): its
//! registers and each queue, checked again when loaded, beside the
//! transport as Firecracker keeps `persist.rs` beside each device.

use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_DRIVER_OK, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};

use virtio_queue::{Queue, QueueT};

use super::MmioTransport;
use crate::devices::state_error::StateError;

/// One queue as saved: what `virtio_queue::QueueState` holds (the crate's
/// type has no serde), checked again when loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSave {
    /// The queue's size as the driver set it.
    pub size: u16,
    /// Whether the driver made it ready.
    pub ready: bool,
    /// The descriptor table's guest address.
    pub desc_table: u64,
    /// The available ring's guest address.
    pub avail_ring: u64,
    /// The used ring's guest address.
    pub used_ring: u64,
    /// The next available entry the device takes.
    pub next_avail: u16,
    /// The next used entry the device writes.
    pub next_used: u16,
    /// Whether VIRTIO_F_RING_EVENT_IDX was negotiated.
    pub event_idx: bool,
}

/// A device's transport as saved: its registers and queues. Requests are
/// served whole under the transport's lock, so none is half done when the
/// state is taken; requests the driver queued and the device had not
/// taken yet are in guest memory (past `next_avail`), served once the VM
/// runs again.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmioState {
    /// The device's id (a check: the same device at the same place).
    pub device_id: u32,
    /// Device status.
    pub status: u32,
    /// Features the driver accepted.
    pub driver_features: u64,
    /// The feature-word selectors and the queue selector.
    pub device_features_sel: u32,
    /// Driver feature-word selector.
    pub driver_features_sel: u32,
    /// Queue selector.
    pub queue_sel: u32,
    /// Interrupt status not yet acknowledged.
    pub interrupt_status: u32,
    /// Each queue.
    pub queues: Vec<QueueSave>,
    /// The device's own state (`VirtioDevice::save_state`; empty for most).
    pub device: Vec<u8>,
}

impl MmioTransport {
    /// The transport's state now.
    pub fn state(&self) -> MmioState {
        MmioState {
            device_id: self.device.device_id(),
            status: self.status,
            driver_features: self.driver_features,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            queue_sel: self.queue_sel,
            interrupt_status: self.interrupt_status,
            queues: self
                .queues
                .iter()
                .map(|q| QueueSave {
                    size: q.size(),
                    ready: q.ready(),
                    desc_table: q.desc_table(),
                    avail_ring: q.avail_ring(),
                    used_ring: q.used_ring(),
                    next_avail: q.next_avail(),
                    next_used: q.next_used(),
                    event_idx: q.event_idx_enabled(),
                })
                .collect(),
            device: self.device.save_state(),
        }
    }

    /// Take up the saved state `s` (the device is the one saved: same id,
    /// same queues; its features among those offered); the device is told
    /// its features again (a tap's offloads). A state that does not fit
    /// changes nothing.
    pub fn restore(&mut self, s: &MmioState) -> Result<(), StateError> {
        let name = self.device.name();
        let device = format!("virtio {name}");
        if s.device_id != self.device.device_id() {
            return Err(StateError::unfit(
                device,
                format!(
                    "the saved device is of type {}, this one of type {}",
                    s.device_id,
                    self.device.device_id()
                ),
            ));
        }
        if s.queues.len() != self.queues.len() {
            return Err(StateError::unfit(
                device,
                format!(
                    "{} saved queues for a device of {}",
                    s.queues.len(),
                    self.queues.len()
                ),
            ));
        }
        if s.driver_features & !self.device.features() != 0 {
            return Err(StateError::unfit(
                device,
                format!(
                    "the saved features {:#x} are not all offered here ({:#x})",
                    s.driver_features,
                    self.device.features()
                ),
            ));
        }
        let mut queues = Vec::with_capacity(s.queues.len());
        for (i, (q, max)) in s
            .queues
            .iter()
            .zip(self.device.queue_max_sizes())
            .enumerate()
        {
            let state = virtio_queue::QueueState {
                max_size: *max,
                next_avail: q.next_avail,
                next_used: q.next_used,
                event_idx_enabled: q.event_idx,
                size: q.size,
                ready: q.ready,
                desc_table: q.desc_table,
                avail_ring: q.avail_ring,
                used_ring: q.used_ring,
            };
            let queue = Queue::try_from(state)
                .map_err(|e| StateError::unfit(&device, format!("saved queue {i}: {e:?}")))?;
            if q.ready && !queue.is_valid(&self.mem) {
                return Err(StateError::unfit(
                    device,
                    format!("saved queue {i}'s rings are not in guest memory"),
                ));
            }
            queues.push(queue);
        }
        self.device.load_state(&s.device)?;
        self.queues = queues;
        self.status = s.status;
        self.driver_features = s.driver_features;
        self.device_features_sel = s.device_features_sel;
        self.driver_features_sel = s.driver_features_sel;
        self.queue_sel = s.queue_sel;
        self.interrupt_status = s.interrupt_status;
        if s.status & VIRTIO_CONFIG_S_FEATURES_OK != 0 {
            self.device.ack_features(s.driver_features);
        }
        Ok(())
    }

    /// The queues a running device has ready (to be served once after a
    /// restore: requests queued before the snapshot whose notification
    /// went with the old VMM).
    pub fn ready_queues(&self) -> Vec<usize> {
        let running = self.status & VIRTIO_CONFIG_S_DRIVER_OK != 0
            && self.status & VIRTIO_CONFIG_S_NEEDS_RESET == 0;
        match running {
            true => (0..self.queues.len())
                .filter(|&i| self.queues[i].ready())
                .collect(),
            false => Vec::new(),
        }
    }
}
