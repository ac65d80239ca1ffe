//! `exception`: a test that an unexpected CPU exception in the runtime is
//! reported on the console (vector, RIP, error code) and ends the VM with
//! `exit_code::EXCEPTION`.

use super::Context;
use crate::kernel::api::println;

pub fn run(_: &Context) -> u32 {
    println!("exception: vCPU 0 executes ud2");
    // SAFETY: raises #UD on purpose; the exception path never returns here.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}
