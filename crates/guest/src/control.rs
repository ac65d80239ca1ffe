//! The control port (docs/ABI.md): exit, reports and log messages.

use core::arch::asm;
use core::ptr;

use hover_abi::control::{op, status, ControlRequest, Report, CONTROL_PORT};

/// Send `req` (anywhere in guest memory below 4 GiB) to the monitor and
/// return its status.
pub fn send(req: &mut ControlRequest) -> u32 {
    req.status = status::PENDING;
    // Identity mapping: the request's address is its guest-physical address,
    // and the image lives below 4 GiB, so 32 bits carry it.
    let gpa = req as *mut ControlRequest as u64;
    debug_assert!(gpa < 1 << 32);
    // SAFETY: the TSS I/O bitmap grants this port; the monitor reads and
    // writes the request during the exit, which the asm block (not `nomem`)
    // tells the compiler about.
    unsafe {
        asm!("out dx, eax", in("dx") CONTROL_PORT, in("eax") gpa as u32, options(nostack, preserves_flags))
    };
    // SAFETY: req is a valid reference; volatile because the monitor wrote it.
    unsafe { ptr::read_volatile(&req.status) }
}

/// Power the VM off with `code`.
pub fn exit(code: u32) -> ! {
    let mut req = ControlRequest {
        op: op::EXIT,
        status: 0,
        arg0: code as u64,
        arg1: 0,
    };
    send(&mut req);
    // The monitor stops every vCPU on EXIT; if it does not, do not run on.
    loop {
        crate::nub::halt();
    }
}

/// Ask the monitor to inject device `vector` into vCPU `cpu` after `delay_ns`.
pub fn inject_msi(vector: u8, cpu: usize, delay_ns: u64) -> u32 {
    let mut req = ControlRequest {
        op: op::INJECT_MSI,
        status: 0,
        arg0: vector as u64 | (cpu as u64) << 8,
        arg1: delay_ns,
    };
    send(&mut req)
}

/// Record `reports` with the monitor; returns the status code.
pub fn report(reports: &[Report]) -> u32 {
    let mut req = ControlRequest {
        op: op::REPORT,
        status: 0,
        arg0: reports.as_ptr() as u64,
        arg1: reports.len() as u64,
    };
    send(&mut req)
}
