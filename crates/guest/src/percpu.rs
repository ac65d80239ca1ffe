//! Per-CPU state: one [`PerCpu`] per vCPU, reached through the GS base so that
//! the nub (which cannot know which CPU it runs on otherwise) finds it too.

use core::arch::asm;
use core::cell::UnsafeCell;

use hover_abi::layout::{GDT_ENTRIES, MAX_VCPUS};

/// Size of each CPU's CPL3 boot stack (the workloads run on it).
pub const MAIN_STACK_SIZE: usize = 64 * 1024;
/// Size of each CPU's CPL0 stack (TSS.RSP0: interrupts and nub calls).
pub const NUB_STACK_SIZE: usize = 16 * 1024;
/// Size of each CPU's CPL3 stack for reporting an unexpected exception.
pub const EXCEPTION_STACK_SIZE: usize = 16 * 1024;
/// I/O ports the TSS bitmap covers (ports above are always denied).
pub const IO_BITMAP_PORTS: usize = 0x800;

/// A CPU exception as the nub recorded it.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CrashFrame {
    /// Exception vector.
    pub vector: u64,
    /// Error code (0 for vectors without one).
    pub error: u64,
    /// Faulting instruction.
    pub rip: u64,
    /// Code segment at the fault (low two bits: privilege level).
    pub cs: u64,
    /// Stack pointer at the fault.
    pub rsp: u64,
    /// CR2 (the faulting address for a page fault).
    pub cr2: u64,
}

/// A 64-bit TSS followed by its I/O permission bitmap (and the 0xff terminator).
#[repr(C, packed)]
pub struct TaskState {
    pub reserved0: u32,
    pub rsp: [u64; 3],
    pub reserved1: u64,
    pub ist: [u64; 7],
    pub reserved2: u64,
    pub reserved3: u16,
    pub iomap_base: u16,
    pub io_bitmap: [u8; IO_BITMAP_PORTS / 8 + 1],
}

/// Operand of `lgdt`/`lidt`.
#[repr(C, packed)]
#[derive(Clone, Copy, Default)]
pub struct DescPtr {
    pub limit: u16,
    pub base: u64,
}

/// One CPU's state. The nub reads the fields up to `crash` at fixed offsets.
#[repr(C, align(4096))]
pub struct PerCpu {
    /// Address of this structure (non-zero once the CPU has set it up).
    pub self_ptr: u64,
    /// vCPU index.
    pub cpu: u64,
    /// Set by the nub while an unexpected exception is being reported.
    pub in_exception: u64,
    /// Top of the CPL3 stack `exception_entry` runs on.
    pub exception_stack_top: u64,
    /// The last unexpected exception.
    pub crash: CrashFrame,
    pub gdt: [u64; GDT_ENTRIES],
    pub gdtr: DescPtr,
    pub tss: TaskState,
}

/// Storage for all CPUs; each CPU touches only its own slot.
pub struct PerCpuArray(UnsafeCell<[PerCpu; MAX_VCPUS]>);
// SAFETY: slot i is only ever accessed by vCPU i (see `this_cpu`).
unsafe impl Sync for PerCpuArray {}

const EMPTY: PerCpu = PerCpu {
    self_ptr: 0,
    cpu: 0,
    in_exception: 0,
    exception_stack_top: 0,
    crash: CrashFrame {
        vector: 0,
        error: 0,
        rip: 0,
        cs: 0,
        rsp: 0,
        cr2: 0,
    },
    gdt: [0; GDT_ENTRIES],
    gdtr: DescPtr { limit: 0, base: 0 },
    tss: TaskState {
        reserved0: 0,
        rsp: [0; 3],
        reserved1: 0,
        ist: [0; 7],
        reserved2: 0,
        reserved3: 0,
        iomap_base: 0,
        io_bitmap: [0xff; IO_BITMAP_PORTS / 8 + 1],
    },
};

static PERCPU: PerCpuArray = PerCpuArray(UnsafeCell::new([EMPTY; MAX_VCPUS]));

/// Stacks, 16-byte aligned.
#[repr(C, align(16))]
pub struct Stacks<const N: usize>(pub [[u8; N]; MAX_VCPUS]);

/// CPL3 boot stacks; `_start` in nub.S switches to slot `cpu`.
pub static mut MAIN_STACKS: Stacks<MAIN_STACK_SIZE> = Stacks([[0; MAIN_STACK_SIZE]; MAX_VCPUS]);
static mut NUB_STACKS: Stacks<NUB_STACK_SIZE> = Stacks([[0; NUB_STACK_SIZE]; MAX_VCPUS]);
static mut EXCEPTION_STACKS: Stacks<EXCEPTION_STACK_SIZE> =
    Stacks([[0; EXCEPTION_STACK_SIZE]; MAX_VCPUS]);

/// Claim slot `cpu`, fill in its addresses and point GS at it.
///
/// # Safety
/// Called once per CPU, by that CPU, with `cpu < MAX_VCPUS`.
pub unsafe fn init(cpu: usize) -> &'static mut PerCpu {
    // SAFETY: per the contract, nobody else touches slot `cpu`.
    let pc = unsafe { &mut (*PERCPU.0.get())[cpu] };
    pc.self_ptr = pc as *mut PerCpu as u64;
    pc.cpu = cpu as u64;
    let nub_top = unsafe { (&raw mut NUB_STACKS.0[cpu]) as u64 } + NUB_STACK_SIZE as u64;
    let exc_top =
        unsafe { (&raw mut EXCEPTION_STACKS.0[cpu]) as u64 } + EXCEPTION_STACK_SIZE as u64;
    pc.tss.rsp[0] = nub_top;
    pc.exception_stack_top = exc_top - 8;
    // SAFETY: CR4.FSGSBASE is set by the monitor (docs/ABI.md); wrgsbase is
    // native at CPL3 here and only this runtime uses GS.
    unsafe { asm!("wrgsbase {}", in(reg) pc.self_ptr, options(nostack, preserves_flags)) };
    pc
}

/// This CPU's state (after [`init`]).
pub fn this_cpu() -> &'static mut PerCpu {
    let p: u64;
    // SAFETY: rdgsbase is native at CPL3; GS holds this CPU's slot after init.
    unsafe { asm!("rdgsbase {}", out(reg) p, options(nostack, nomem, preserves_flags)) };
    // SAFETY: p is this CPU's slot (or 0 before init, which callers never see:
    // init runs first on every CPU).
    unsafe { &mut *(p as *mut PerCpu) }
}

/// This CPU's index, or `None` before [`init`].
pub fn cpu_index() -> Option<usize> {
    let p: u64;
    // SAFETY: as in `this_cpu`.
    unsafe { asm!("rdgsbase {}", out(reg) p, options(nostack, nomem, preserves_flags)) };
    if p == 0 {
        None
    } else {
        // SAFETY: non-zero GS base is always this CPU's slot.
        Some(unsafe { (*(p as *const PerCpu)).cpu as usize })
    }
}
