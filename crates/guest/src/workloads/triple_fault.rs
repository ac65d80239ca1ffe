//! `triple-fault`: a test that the monitor stops a VM whose vCPU shuts down,
//! with an error and a register dump rather than a hang.

use super::Context;
use crate::kernel::api::{println, triple_fault};

pub fn run(_: &Context) -> u32 {
    println!("triple-fault: vCPU 0 loads an empty IDT and raises #UD");
    triple_fault()
}
