//! Per-CPU state: one [`PerCpu`] per vCPU, reached through the GS base so that
//! the nub (which cannot know which CPU it runs on otherwise) finds it too.
//!
//! Scalar fields are atomics: the nub's interrupt handlers change some of
//! them asynchronously (like a signal handler would), and other vCPUs set
//! `need_resched` and read `halted` when they wake a task here. CPU-local
//! accesses use `Relaxed`, which compiles to plain moves.

use core::arch::asm;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use hover_abi::layout::{GDT_ENTRIES, MAX_VCPUS};

/// Size of each CPU's CPL0 stack (TSS.RSP0: interrupts and nub calls).
pub const NUB_STACK_SIZE: usize = 16 * 1024;
/// Size of each CPU's CPL3 boot stack, on which its idle loop runs.
pub const MAIN_STACK_SIZE: usize = 64 * 1024;
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

/// Entries in the ring of "page ready" tokens: one per value of its byte
/// indices, so the nub's index wraps by itself (`incb`, no mask). The
/// runtime empties it at every `schedule()`; what could fill it in between
/// is a "page ready" per fault taken synchronously (KVM sends those too)
/// while preemption is off: 256 of them inside one non-preemptible
/// stretch would lose tokens (no such stretch in the built-in guest
/// touches more than a few pages).
pub const APF_RING: usize = 256;
const _: () = assert!(APF_RING == u8::MAX as usize + 1, "indices are bytes");

/// The async page fault area KVM writes (`MSR_KVM_ASYNC_PF_EN`), 64-byte aligned.
#[repr(C, align(64))]
pub struct ApfArea {
    /// "Page not present" reason (1) for the #PF being delivered; 0 otherwise.
    pub flags: AtomicU32,
    /// The token of the "page ready" interrupt being delivered.
    pub token: AtomicU32,
    pad: [u32; 14],
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

/// This CPU's descriptor tables, written once by the CPU itself at boot.
#[repr(C)]
pub struct CpuTables {
    pub gdt: [u64; GDT_ENTRIES],
    pub gdtr: DescPtr,
    pub tss: TaskState,
}

/// One CPU's state. The nub reads and writes fields by offset (nub.rs passes
/// `offset_of!` values to the assembly).
#[repr(C, align(4096))]
pub struct PerCpu {
    /// Address of this structure (non-zero once the CPU has set it up).
    pub self_ptr: AtomicU64,
    /// vCPU index.
    pub cpu: AtomicU64,
    /// Set by the nub while an unexpected exception is being reported.
    pub in_exception: AtomicU64,
    /// Top of the CPL3 stack `exception_entry` runs on.
    pub exception_stack_top: AtomicU64,
    /// Non-zero: the running code must not be switched away from; the nub
    /// then only sets `need_resched`.
    pub preempt_count: AtomicU64,
    /// A reschedule is due (tick, interrupt for a waiting task, remote wake-up).
    pub need_resched: AtomicU64,
    /// TSC ticks between scheduler ticks; the timer handler rearms with it.
    pub tick_period: AtomicU64,
    /// TSC deadline the LAPIC timer is armed with (0 = disarmed).
    pub armed_deadline: AtomicU64,
    /// Timer interrupts taken.
    pub ticks: AtomicU64,
    /// Nub calls that armed, moved or disarmed the timer.
    pub deadline_writes: AtomicU64,
    /// Non-zero while the idle loop is about to halt or halted.
    pub halted: AtomicU64,
    /// RAX, RCX, RDX and RIP of the code the nub redirected into one of the
    /// entries of `arch/switch.S` (which of them each entry takes there is
    /// said in switch.S), as it left them: written only on a redirect
    /// (`preempt_count` 0 -> 1 or 2, or a "page ready" at
    /// `hover_fault_entry`), taken back by the entry before preemption is on
    /// again.
    pub irq_saved: [AtomicU64; 4],

    /// Index of the running task (see `sched`).
    pub current: AtomicUsize,
    /// Device vectors the nub has seen but the runtime not yet handled, one bit per vector.
    pub pending_irqs: [AtomicU64; 4],
    /// A "page not present" token (KVM never issues 0) from the nub's #PF
    /// handler for the preemption path to park the task on; 0: none.
    pub apf_park_token: AtomicU64,
    /// A "page ready" token the nub handed over with a redirect (the vCPU
    /// was in preemptible code, or at the first instruction of
    /// `hover_fault_entry`; 0: none), taken by the scheduler before
    /// preemption is on again.
    pub apf_ready_one: AtomicU32,
    /// "Page ready" tokens written by the nub, consumed by the runtime.
    pub apf_ready_ring: [AtomicU32; APF_RING],
    /// Index of the next token the nub writes (wraps at 256).
    pub apf_ready_head: AtomicU8,
    /// Index of the next token the runtime takes (wraps at 256).
    pub apf_ready_tail: AtomicU8,
    /// "Page not present" notifications received (counted by the runtime
    /// when it parks a task, by the nub when it leaves the fault to KVM).
    pub apf_not_present: AtomicU64,
    /// "Page ready" tokens taken from the ring (counted by the runtime).
    pub apf_ready: AtomicU64,
    /// "Page not present" in a non-preemptible context: left to KVM, which
    /// halts the vCPU until the page is there.
    pub apf_sync: AtomicU64,
    /// The area KVM writes async page fault reasons and tokens into.
    pub apf_area: ApfArea,
    /// The last unexpected exception (written by the nub).
    pub crash: UnsafeCell<CrashFrame>,
    /// Descriptor tables.
    pub tables: UnsafeCell<CpuTables>,
}

/// Storage for all CPUs.
pub struct PerCpuArray([PerCpu; MAX_VCPUS]);
// SAFETY: scalar fields are atomics; `crash` is written only by this CPU's
// nub and read by this CPU; `tables` is written once by its own CPU in `init`.
unsafe impl Sync for PerCpuArray {}

#[allow(clippy::declare_interior_mutable_const)] // a template for the array below
const EMPTY: PerCpu = PerCpu {
    self_ptr: AtomicU64::new(0),
    cpu: AtomicU64::new(0),
    in_exception: AtomicU64::new(0),
    exception_stack_top: AtomicU64::new(0),
    preempt_count: AtomicU64::new(0),
    need_resched: AtomicU64::new(0),
    tick_period: AtomicU64::new(0),
    armed_deadline: AtomicU64::new(0),
    ticks: AtomicU64::new(0),
    deadline_writes: AtomicU64::new(0),
    halted: AtomicU64::new(0),
    irq_saved: [const { AtomicU64::new(0) }; 4],
    current: AtomicUsize::new(0),
    pending_irqs: [const { AtomicU64::new(0) }; 4],
    apf_park_token: AtomicU64::new(0),
    apf_ready_one: AtomicU32::new(0),
    apf_ready_ring: [const { AtomicU32::new(0) }; APF_RING],
    apf_ready_head: AtomicU8::new(0),
    apf_ready_tail: AtomicU8::new(0),
    apf_not_present: AtomicU64::new(0),
    apf_ready: AtomicU64::new(0),
    apf_sync: AtomicU64::new(0),
    apf_area: ApfArea {
        flags: AtomicU32::new(0),
        token: AtomicU32::new(0),
        pad: [0; 14],
    },
    crash: UnsafeCell::new(CrashFrame {
        vector: 0,
        error: 0,
        rip: 0,
        cs: 0,
        rsp: 0,
        cr2: 0,
    }),
    tables: UnsafeCell::new(CpuTables {
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
    }),
};

static PERCPU: PerCpuArray = PerCpuArray([EMPTY; MAX_VCPUS]);

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
pub unsafe fn init(cpu: usize) -> &'static PerCpu {
    let pc = &PERCPU.0[cpu];
    let nub_top = (&raw const NUB_STACKS.0[cpu]) as u64 + NUB_STACK_SIZE as u64;
    let exc_top = (&raw const EXCEPTION_STACKS.0[cpu]) as u64 + EXCEPTION_STACK_SIZE as u64;
    // SAFETY: only this CPU touches its tables, and nothing has loaded them yet.
    unsafe { (*pc.tables.get()).tss.rsp[0] = nub_top };
    pc.exception_stack_top.store(exc_top - 8, Ordering::Relaxed);
    pc.cpu.store(cpu as u64, Ordering::Relaxed);
    let addr = pc as *const PerCpu as u64;
    pc.self_ptr.store(addr, Ordering::Release);
    // SAFETY: CR4.FSGSBASE is set by the monitor (docs/ABI.md); wrgsbase is
    // native at CPL3 here and only this runtime uses GS.
    unsafe { asm!("wrgsbase {}", in(reg) addr, options(nostack, preserves_flags)) };
    pc
}

fn gs_base() -> u64 {
    let p: u64;
    // SAFETY: rdgsbase is native at CPL3 and has no side effects.
    unsafe { asm!("rdgsbase {}", out(reg) p, options(nostack, nomem, preserves_flags)) };
    p
}

/// This CPU's state (after [`init`]).
#[inline]
pub fn this_cpu() -> &'static PerCpu {
    // SAFETY: after init, GS holds the address of this CPU's slot in PERCPU,
    // a static; init runs before any other runtime code on every CPU.
    unsafe { &*(gs_base() as *const PerCpu) }
}

/// This CPU's index, or `None` before [`init`].
pub fn cpu_index() -> Option<usize> {
    let p = gs_base();
    // SAFETY: a non-zero GS base is always this CPU's slot.
    (p != 0).then(|| unsafe { (*(p as *const PerCpu)).cpu.load(Ordering::Relaxed) as usize })
}

/// CPU `cpu`'s state, for waking tasks there.
pub fn of(cpu: usize) -> &'static PerCpu {
    &PERCPU.0[cpu]
}

impl PerCpu {
    /// This CPU's index.
    #[inline]
    pub fn index(&self) -> usize {
        self.cpu.load(Ordering::Relaxed) as usize
    }
}
