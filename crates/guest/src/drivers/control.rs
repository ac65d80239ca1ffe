//! The control port (docs/ABI.md): exit, reports and log messages.
//!
//! Under another VMM (booted through the PVH entry) there is no control
//! port: reading it does not return Hover's ABI revision. The guest then
//! prints its reports on the serial console in `hover run`'s form
//! (`  vcpu N   key = value`), exits through QEMU's `isa-debug-exit` port,
//! and answers every other request UNAVAILABLE itself.

use core::arch::asm;
use core::ptr;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::println;

use hover_abi::control::{
    op, status, value_kind, ControlRequest, Report, CONTROL_ABI_REVISION, CONTROL_PORT,
};

/// QEMU's `isa-debug-exit` device (`-device isa-debug-exit,iobase=0xf4`):
/// writing `v` ends QEMU with exit status `(v << 1) | 1`.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;

/// 0: not looked yet, 1: Hover's control port answers, 2: it does not.
static PRESENT: AtomicU8 = AtomicU8::new(0);

/// Whether Hover's control port is there (read once: the port answers
/// reads with the ABI revision).
pub fn present() -> bool {
    match PRESENT.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let v: u32;
            // SAFETY: the TSS I/O bitmap grants this port; a read has no
            // effect on Hover's device and none on an absent one.
            unsafe {
                asm!("in eax, dx", in("dx") CONTROL_PORT, out("eax") v, options(nostack, preserves_flags, nomem))
            };
            let here = v == CONTROL_ABI_REVISION;
            PRESENT.store(if here { 1 } else { 2 }, Ordering::Relaxed);
            here
        }
    }
}

/// Print one report as `hover run` does.
fn print_report(vcpu: usize, r: &Report) {
    let len = r.key.iter().position(|&b| b == 0).unwrap_or(r.key.len());
    let key = core::str::from_utf8(&r.key[..len]).unwrap_or("?");
    match r.kind {
        value_kind::I64 => println!("  vcpu {}   {} = {}", vcpu, key, r.value as i64),
        value_kind::F64 => println!("  vcpu {}   {} = {}", vcpu, key, f64::from_bits(r.value)),
        _ => println!("  vcpu {}   {} = {}", vcpu, key, r.value),
    }
}

/// Carry out `req` without a monitor: reports and log messages go to the
/// console, EXIT to `isa-debug-exit`; anything else is unavailable.
fn local(req: &mut ControlRequest) -> u32 {
    match req.op {
        op::REPORT => {
            let vcpu = crate::arch::percpu::cpu_index().unwrap_or(0);
            let n = (req.arg1 as usize).min(hover_abi::control::MAX_REPORTS_PER_REQUEST as usize);
            // SAFETY: the caller's batch of `arg1` records at `arg0`.
            let batch = unsafe { core::slice::from_raw_parts(req.arg0 as *const Report, n) };
            for r in batch {
                print_report(vcpu, r);
            }
            status::OK
        }
        op::LOG => {
            let n = (req.arg1 as usize).min(hover_abi::control::MAX_LOG_LEN as usize);
            // SAFETY: the caller's message of `arg1` bytes at `arg0`.
            let bytes = unsafe { core::slice::from_raw_parts(req.arg0 as *const u8, n) };
            println!(
                "{}",
                core::str::from_utf8(bytes).unwrap_or("(log message not UTF-8)")
            );
            status::OK
        }
        op::EXIT => {
            println!("guest: exit code {}", req.arg0);
            // SAFETY: the TSS I/O bitmap grants this port; without the
            // device the write does nothing and the caller halts.
            unsafe {
                asm!("out dx, eax", in("dx") DEBUG_EXIT_PORT, in("eax") req.arg0 as u32, options(nostack, preserves_flags, nomem))
            };
            status::OK
        }
        _ => status::UNAVAILABLE,
    }
}

/// Send `req` (anywhere in guest memory below 4 GiB) to the monitor and
/// return its status.
pub fn send(req: &mut ControlRequest) -> u32 {
    if !present() {
        req.status = local(req);
        return req.status;
    }
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
    // The monitor stops every vCPU on EXIT; if it does not, do not run on
    // (halting needs preemption off; before the per-CPU area exists there
    // is no preemption).
    if crate::arch::percpu::cpu_index().is_some() {
        crate::kernel::sync::preempt_disable();
    }
    loop {
        crate::arch::nub::halt();
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
