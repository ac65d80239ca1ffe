//! `triple-fault`: a test that the monitor stops a VM whose vCPU shuts down,
//! with an error and a register dump rather than a hang.

use super::{idle, Context};
use crate::{nub, println};

pub fn run(ctx: Context) -> ! {
    if ctx.cpu != 0 {
        idle();
    }
    println!("triple-fault: vCPU 0 loads an empty IDT and raises #UD");
    nub::triple_fault()
}
