//! CPL3 side of the privileged nub (`nub.S`): the calls the runtime makes into
//! CPL0 and the symbols the IDT points at.
//!
//! A nub call is `int3` with the operation in RAX: `int n` raises #UD on this
//! platform and `syscall` grants no privilege, but `int3` is delivered through
//! any gate, so vector 3 is the nub's entry (a DPL3 interrupt gate).

use core::arch::{asm, global_asm};
use core::mem::offset_of;

use hover_abi::layout::{USER_CS, USER_DS};
use hover_abi::vectors;

use crate::arch::percpu::{PerCpu, MAIN_STACKS, MAIN_STACK_SIZE};
use crate::arch::tables::IDT;

/// Nub operations, indices into `nub_table` in `nub.S`.
#[repr(u64)]
#[derive(Clone, Copy)]
enum Op {
    LoadTables = 0,
    Rdmsr = 1,
    Wrmsr = 2,
    Halt = 3,
    TripleFault = 4,
    SetDeadline = 5,
}
const NUB_OPS: u64 = 6;

global_asm!(
    include_str!("nub.S"),
    main_stack_size = const MAIN_STACK_SIZE,
    main_stacks = sym MAIN_STACKS,
    user_ds = const USER_DS,
    user_cs = const USER_CS,
    rust_start = sym crate::rust_start,
    nub_ops = const NUB_OPS,
    off_self = const offset_of!(PerCpu, self_ptr),
    off_in_exception = const offset_of!(PerCpu, in_exception),
    off_crash = const offset_of!(PerCpu, crash),
    off_exception_stack = const offset_of!(PerCpu, exception_stack_top),
    off_need_resched = const offset_of!(PerCpu, need_resched),
    off_preempt_count = const offset_of!(PerCpu, preempt_count),
    off_tick_period = const offset_of!(PerCpu, tick_period),
    off_armed_deadline = const offset_of!(PerCpu, armed_deadline),
    off_ticks = const offset_of!(PerCpu, ticks),
    off_pending_irqs = const offset_of!(PerCpu, pending_irqs),
    off_apf_flags = const offset_of!(PerCpu, apf_area),
    off_apf_token = const offset_of!(PerCpu, apf_area) + 4,
    off_apf_park_token = const offset_of!(PerCpu, apf_park_token),
    off_apf_ready_ring = const offset_of!(PerCpu, apf_ready_ring),
    off_apf_ready_head = const offset_of!(PerCpu, apf_ready_head),
    off_apf_not_present = const offset_of!(PerCpu, apf_not_present),
    off_irq_rax = const offset_of!(PerCpu, irq_saved),
    off_irq_rcx = const offset_of!(PerCpu, irq_saved) + 8,
    off_irq_rdx = const offset_of!(PerCpu, irq_saved) + 16,
    off_irq_rip = const offset_of!(PerCpu, irq_saved) + 24,
    off_apf_ready_one = const offset_of!(PerCpu, apf_ready_one),
    off_apf_sync = const offset_of!(PerCpu, apf_sync),
    msr_apf_ack = const hover_abi::pv::MSR_KVM_ASYNC_PF_ACK,
    device_base = const vectors::DEVICE_BASE,
    device_count = const vectors::DEVICE_COUNT,
    exception_entry = sym crate::arch::exception::exception_entry,
    idt = sym IDT,
    options(att_syntax)
);

extern "C" {
    /// Entry of nub calls (IDT vector 3).
    pub fn hover_nub_call();
    /// Handler for the spurious-interrupt vector.
    pub fn hover_spurious();
    /// 32 exception stubs, 16 bytes apart, for vectors 0-31.
    pub fn hover_exception_stubs();
    /// LAPIC timer handler.
    pub fn hover_timer_irq();
    /// Reschedule-IPI handler.
    pub fn hover_resched_irq();
    /// Device-vector stubs, 16 bytes apart, from `vectors::DEVICE_BASE`.
    pub fn hover_device_stubs();
    /// #PF handler (async "page not present" or a real fault).
    pub fn hover_page_fault();
    /// Async PF "page ready" handler.
    pub fn hover_apf_ready();
}

#[inline(always)]
fn call(op: Op, a: u64, b: u64) -> u64 {
    let ret: u64;
    // SAFETY: int3 enters the nub through the vector-3 gate; the nub clobbers
    // only rax (result), rcx and rdx, and returns to the next instruction.
    unsafe {
        asm!("int3", inlateout("rax") op as u64 => ret, in("rdi") a, in("rsi") b,
             out("rcx") _, out("rdx") _);
    }
    ret
}

/// Load this CPU's GDT (from the 10-byte descriptor at `gdtr`) and task register.
pub fn load_tables(gdtr: u64, tss_selector: u16) {
    call(Op::LoadTables, gdtr, tss_selector as u64);
}

/// Read a model-specific register.
pub fn rdmsr(msr: u32) -> u64 {
    call(Op::Rdmsr, msr as u64, 0)
}

/// Write a model-specific register.
pub fn wrmsr(msr: u32, value: u64) {
    call(Op::Wrmsr, msr as u64, value);
}

/// Halt until the next interrupt has been handled, unless a reschedule is
/// already due. Only with preemption off: the nub's interrupt handlers do
/// not test the privilege of the frame they redirect, and `hlt` is the one CPL0
/// instruction interrupts can reach (`nub.S`, "interrupts").
pub fn halt() {
    debug_assert!(
        crate::arch::percpu::cpu_index().is_none()
            || crate::arch::percpu::this_cpu()
                .preempt_count
                .load(core::sync::atomic::Ordering::Relaxed)
                != 0,
        "halting with preemption on"
    );
    call(Op::Halt, 0, 0);
}

/// Arm the LAPIC timer for TSC `deadline` (0 disarms) and record it in
/// `PerCpu::armed_deadline`, both with interrupts off.
pub fn set_deadline(deadline: u64) {
    call(Op::SetDeadline, deadline, 0);
}

/// Load an empty IDT and raise an exception: the CPU shuts down (triple fault).
pub fn triple_fault() -> ! {
    call(Op::TripleFault, 0, 0);
    unreachable!("a triple fault does not return")
}
