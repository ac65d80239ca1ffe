#![no_main]
//! See hover_vmm::fuzzing::virtio_mmio.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hover_vmm::fuzzing::virtio_mmio(data));
