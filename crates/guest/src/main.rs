//! Hover's built-in guest.
//!
//! A user-mode runtime: on this platform every CPL0 instruction is emulated by
//! KVM, so everything except the privileged nub (`arch/nub.S`) runs at CPL3,
//! where it is native. Boot sequence per vCPU:
//! 1. `_start` (nub, CPL0): record the TSC, load the IDT address, `iretq` to
//!    [`rust_start`] at CPL3 on this CPU's stack.
//! 2. [`rust_start`]: claim the per-CPU area (GS base), vCPU 0 checks the
//!    boot-info page and fills the IDT; each CPU builds and loads its own
//!    GDT/TSS, enables its x2APIC and its timer and becomes an idle loop.
//! 3. vCPU 0 spawns the workload's main task; the scheduler
//!    (`kernel/sched.rs`) runs tasks on every vCPU until the workload exits
//!    the VM.
//!
//! The source is grouped by layer: [`arch`] (x86-64 and the nub), [`kernel`]
//! (the runtime), [`drivers`] (devices) and [`workloads`], which use the
//! kernel's API module ([`kernel::api`]) and nothing else of the guest.
#![no_std]
#![no_main]

mod arch;
mod drivers;
mod kernel;
mod workloads;

use core::panic::PanicInfo;

use hover_abi::boot::BootInfo;
use hover_abi::exit_code;
use hover_abi::layout::MAX_VCPUS;
use hover_abi::workload;

use arch::{apic, nub, percpu, pvh, tables};
use drivers::control;
use kernel::{apf, boost, clock, frames, haltpoll, sched, timer};

/// First Rust code on every vCPU (CPL3), entered from `_start` in `arch/nub.S`.
pub extern "C" fn rust_start(boot_info: u64, cpu: u64, tsc_hi: u64, tsc_lo: u64) -> ! {
    let cpu = cpu as usize;
    if cpu >= MAX_VCPUS {
        // No per-CPU slot to run on: stop here rather than corrupt another's.
        nub::triple_fault();
    }
    // SAFETY: called once on this CPU, cpu < MAX_VCPUS.
    let pc = unsafe { percpu::init(cpu) };
    // The monitor passes the boot-info page's address (or, through the PVH
    // entry, the start-info page's), identity-mapped; the contents are
    // checked before use below.
    let boot: &'static BootInfo = pvh::boot_info(boot_info);
    if cpu == 0 {
        tables::init_idt();
    } else {
        tables::wait_for_idt();
    }
    tables::load_cpu_tables(pc);
    pvh::checked_in();
    sched::init_cpu(pc);
    if !boot.is_valid() {
        if cpu == 0 {
            println!("guest: boot-info page has bad magic or version");
            control::exit(exit_code::BAD_BOOT_INFO);
        }
        sched::idle_loop(sched::Idle::Halt);
    }
    clock::init(boot.tsc_khz);
    apic::enable();
    apf::enable(pc, boot);
    boost::init_cpu(pc);
    let cmdline = boot.cmdline().unwrap_or("");
    // Values are range-checked in workloads::start (and by the monitor);
    // until then the defaults apply.
    let valid = workload::resolve(cmdline).is_ok();
    let hz = if valid {
        workload::global("hz").number(cmdline)
    } else {
        100
    };
    let idle = match (valid, workload::global("idle").choice(cmdline)) {
        (true, "poll") => sched::Idle::Poll,
        (true, "haltpoll") => sched::Idle::HaltPoll {
            max_us: workload::global("poll_us").number(cmdline),
        },
        _ => sched::Idle::Halt,
    };
    if matches!(idle, sched::Idle::HaltPoll { .. }) {
        haltpoll::enable();
    }
    timer::init_cpu(pc, hz);
    if cpu == 0 {
        pvh::start_other_vcpus(boot);
        if boot.cmdline().is_none() {
            println!("guest: command line is not UTF-8");
            control::exit(exit_code::BAD_CMDLINE);
        }
        frames::init(boot);
        sched::init(boot.vcpu_count as usize);
        if valid {
            apf::set_min_us(workload::global("apf_min_us").number(cmdline));
        }
        workloads::start(boot, cmdline, (tsc_hi << 32) | (tsc_lo & 0xffff_ffff));
    }
    sched::idle_loop(idle)
}

#[panic_handler]
fn panic(info: &PanicInfo) -> ! {
    match percpu::cpu_index() {
        Some(cpu) => println!("guest: panic on vCPU {}: {}", cpu, info),
        None => println!("guest: panic before per-CPU setup: {}", info),
    }
    control::exit(exit_code::PANIC)
}
