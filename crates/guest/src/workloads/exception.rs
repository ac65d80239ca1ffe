//! `exception`: a test that an unexpected CPU exception in the runtime is
//! reported on the console (vector, RIP, error code, CR2) and ends the VM
//! with `exit_code::EXCEPTION`. `kind=pf` takes the page-fault path that
//! async "page not present" shares (preemptible code: the nub hands the
//! fault to the runtime first, which must send it back to be reported).

use hover_abi::layout::MAX_MAPPED_GIB;

use super::Context;
use crate::kernel::api::println;

/// An address beyond every mapping of the boot page tables.
pub const UNMAPPED: u64 = (MAX_MAPPED_GIB + 1) << 30;

pub fn run(ctx: &Context) -> u32 {
    if ctx.choice("kind") == "pf" {
        println!("exception: vCPU 0 reads {UNMAPPED:#x}");
        // SAFETY: faults on purpose; the exception path never returns here.
        let v = unsafe { (UNMAPPED as *const u64).read_volatile() };
        println!("exception: read {v:#x} from an unmapped address");
        return 1;
    }
    println!("exception: vCPU 0 executes ud2");
    // SAFETY: raises #UD on purpose; the exception path never returns here.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}
