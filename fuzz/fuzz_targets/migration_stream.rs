#![no_main]
//! See hover_vmm::fuzzing::migration_stream.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hover_vmm::fuzzing::migration_stream(data));
