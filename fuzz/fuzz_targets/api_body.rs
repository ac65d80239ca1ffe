#![no_main]
//! See hover_vmm::fuzzing::api_body.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hover_vmm::fuzzing::api_body(data));
