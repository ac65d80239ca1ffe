//! Descriptor tables: the shared IDT and each CPU's GDT and TSS.
//!
//! The monitor enters every vCPU with placeholder tables; vCPU 0 fills the IDT
//! (whose address `_start` already loaded), then each CPU builds its own GDT
//! and TSS here at CPL3 and asks the nub to load them.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, Ordering};

use hover_abi::control::CONTROL_PORT;
use hover_abi::layout::{tss_descriptor, FLAT_GDT, GDT_ENTRIES, KERNEL_CS, TSS_SEL};
use hover_abi::vectors;

use crate::arch::nub;
use crate::arch::percpu::{PerCpu, TaskState, IO_BITMAP_PORTS};

/// Vector the nub call uses (`int3`).
pub const NUB_VECTOR: usize = 3;
/// Page fault.
const PAGE_FAULT_VECTOR: usize = 14;

/// One 16-byte IDT gate.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Gate([u64; 2]);

impl Gate {
    const ABSENT: Gate = Gate([0, 0]);

    /// An interrupt gate (IF cleared on entry) to `handler` at CPL0,
    /// callable with `int` from privilege level `dpl`.
    fn interrupt(handler: u64, dpl: u64) -> Gate {
        let lo = (handler & 0xffff)
            | ((KERNEL_CS as u64) << 16)
            | ((0x8e | (dpl << 5)) << 40)
            | (((handler >> 16) & 0xffff) << 48);
        Gate([lo, handler >> 32])
    }
}

/// The IDT, shared by all CPUs.
#[repr(C, align(16))]
pub struct Idt(UnsafeCell<[Gate; 256]>);
// SAFETY: written only by vCPU 0 before IDT_READY is published, then read-only.
unsafe impl Sync for Idt {}

/// The IDT; `idt_ptr` in nub.S points here.
pub static IDT: Idt = Idt(UnsafeCell::new([Gate::ABSENT; 256]));
static IDT_READY: AtomicBool = AtomicBool::new(false);

/// Fill the IDT (vCPU 0 only, once).
pub fn init_idt() {
    // SAFETY: only vCPU 0 calls this, before publishing IDT_READY; no other CPU
    // takes an interrupt or exception before then.
    let idt = unsafe { &mut *IDT.0.get() };
    let stubs = nub::hover_exception_stubs as *const () as u64;
    for (v, gate) in idt.iter_mut().enumerate().take(32) {
        *gate = Gate::interrupt(stubs + 16 * v as u64, 0);
    }
    idt[NUB_VECTOR] = Gate::interrupt(nub::hover_nub_call as *const () as u64, 3);
    idt[PAGE_FAULT_VECTOR] = Gate::interrupt(nub::hover_page_fault as *const () as u64, 0);
    idt[vectors::ASYNC_PF_READY as usize] =
        Gate::interrupt(nub::hover_apf_ready as *const () as u64, 0);
    idt[vectors::TIMER as usize] = Gate::interrupt(nub::hover_timer_irq as *const () as u64, 0);
    idt[vectors::RESCHED as usize] = Gate::interrupt(nub::hover_resched_irq as *const () as u64, 0);
    let devices = nub::hover_device_stubs as *const () as u64;
    for i in 0..vectors::DEVICE_COUNT as usize {
        idt[vectors::DEVICE_BASE as usize + i] = Gate::interrupt(devices + 16 * i as u64, 0);
    }
    idt[vectors::SPURIOUS as usize] = Gate::interrupt(nub::hover_spurious as *const () as u64, 0);
    IDT_READY.store(true, Ordering::Release);
}

/// Wait until vCPU 0 has filled the IDT.
pub fn wait_for_idt() {
    while !IDT_READY.load(Ordering::Acquire) {
        core::hint::spin_loop();
    }
}

/// Ports CPL3 code may use: the serial console, the control port, the
/// I/O device's doorbell and QEMU's isa-debug-exit (used only without the
/// control port).
const ALLOWED_PORTS: [(u16, u16); 4] = [
    (0x3f8, 8),
    (CONTROL_PORT, 4),
    (hover_abi::pvio::DOORBELL_PORT, 4),
    (crate::drivers::control::DEBUG_EXIT_PORT, 4),
];

/// Build this CPU's GDT and TSS and load them through the nub.
pub fn load_cpu_tables(pc: &PerCpu) {
    // SAFETY: only this CPU touches its tables, and it has not loaded them yet.
    let t = unsafe { &mut *pc.tables.get() };
    let tss_base = &raw const t.tss as u64;
    let tss_limit = (core::mem::size_of::<TaskState>() - 1) as u32;
    t.tss.iomap_base = core::mem::offset_of!(TaskState, io_bitmap) as u16;
    for (first, count) in ALLOWED_PORTS {
        for port in first..first + count {
            let port = port as usize;
            assert!(
                port < IO_BITMAP_PORTS,
                "port {port:#x} outside the I/O bitmap"
            );
            t.tss.io_bitmap[port / 8] &= !(1 << (port % 8));
        }
    }
    let mut gdt = [0u64; GDT_ENTRIES];
    gdt[..FLAT_GDT.len()].copy_from_slice(&FLAT_GDT);
    let [lo, hi] = tss_descriptor(tss_base, tss_limit);
    gdt[(TSS_SEL >> 3) as usize] = lo;
    gdt[(TSS_SEL >> 3) as usize + 1] = hi;
    t.gdt = gdt;
    t.gdtr.limit = (GDT_ENTRIES * 8 - 1) as u16;
    t.gdtr.base = &raw const t.gdt as u64;
    nub::load_tables(&raw const t.gdtr as u64, TSS_SEL);
}
