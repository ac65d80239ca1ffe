//! virtio-rng: entropy for the guest from the host's `getrandom`.

use std::io::Write;

use crate::memory::host_writes::TrackedMemory;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_queue::{Queue, QueueT, Writer};

use super::{VirtioDevice, F_VERSION_1};

/// The queue's size.
const QUEUE_SIZE: u16 = 64;
/// The most bytes given for one request.
const MAX_BYTES: usize = 64 << 10;

/// The entropy device.
#[derive(Default)]
pub struct Rng {
    complained: bool,
}

impl VirtioDevice for Rng {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn name(&self) -> String {
        "rng".into()
    }

    fn features(&self) -> u64 {
        F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, _: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn process(&mut self, _: usize, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let written = match Writer::new(mem, chain) {
                Ok(mut w) => {
                    let n = w.available_bytes().min(MAX_BYTES);
                    let mut bytes = vec![0u8; n];
                    match crate::host::random_bytes(&mut bytes).and_then(|()| w.write_all(&bytes)) {
                        Ok(()) => n as u32,
                        Err(_) => 0,
                    }
                }
                Err(_) => {
                    if !self.complained {
                        tracing::warn!(
                            "virtio rng: a request whose buffers are outside guest memory or loop"
                        );
                        self.complained = true;
                    }
                    0
                }
            };
            if queue.add_used(mem, head, written).is_err() {
                return used;
            }
            used = true;
        }
        used
    }
}
