//! Reporting an unexpected CPU exception. The nub records the frame and
//! returns here, at CPL3 on the CPU's exception stack.

use hover_abi::exit_code;

use crate::arch::percpu;
use crate::drivers::control;
use crate::println;

const NAMES: [&str; 32] = [
    "#DE divide error",
    "#DB debug",
    "NMI",
    "#BP breakpoint",
    "#OF overflow",
    "#BR bound range",
    "#UD invalid opcode",
    "#NM device not available",
    "#DF double fault",
    "coprocessor overrun",
    "#TS invalid TSS",
    "#NP segment not present",
    "#SS stack fault",
    "#GP general protection",
    "#PF page fault",
    "reserved 15",
    "#MF x87 error",
    "#AC alignment check",
    "#MC machine check",
    "#XM SIMD error",
    "#VE virtualization",
    "#CP control protection",
    "reserved 22",
    "reserved 23",
    "reserved 24",
    "reserved 25",
    "reserved 26",
    "reserved 27",
    "#HV hypervisor injection",
    "#VC VMM communication",
    "#SX security",
    "reserved 31",
];

/// Print the recorded exception and exit with [`exit_code::EXCEPTION`].
pub extern "C" fn exception_entry() -> ! {
    let pc = percpu::this_cpu();
    // SAFETY: the nub wrote the frame on this CPU before returning here.
    let f = unsafe { core::ptr::read_volatile(pc.crash.get()) };
    let name = NAMES.get(f.vector as usize).copied().unwrap_or("unknown");
    println!(
        "guest: unhandled exception {} (vector {}) on vCPU {} at rip {:#x}, error code {:#x}, cr2 {:#x}, rsp {:#x}, cpl {}",
        name, f.vector, pc.index(), f.rip, f.error, f.cr2, f.rsp, f.cs & 3
    );
    control::exit(exit_code::EXCEPTION)
}
