//! Tasks and the per-vCPU round-robin scheduler.
//!
//! Every vCPU has a run queue and an idle context (its boot stack). A task
//! has a home vCPU, chosen when it is spawned (pinned, or the least loaded),
//! and runs only there; waking a task queues it at home and, if that vCPU is
//! halted, sends it a reschedule IPI. Switches happen in [`schedule`], always
//! with `preempt_count == 1`: voluntarily (yield, sleep, wait, exit) or from
//! an interrupt through `hover_irq_entry` (or a #PF through
//! `hover_fault_entry`, `arch/switch.S`), which the nub redirects a
//! preemptible task to.

use core::arch::global_asm;
use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use hover_abi::layout::MAX_VCPUS;
use hover_abi::vectors;

use crate::arch::nub;
use crate::arch::percpu::{self, this_cpu, PerCpu};
use crate::kernel::event::Event;
use crate::kernel::sync::{preempt_disable, preempt_enable, SpinLock};
use crate::kernel::{apf, boost, irq, timer};

/// Most tasks a run can create (slots are not reused).
pub const MAX_TASKS: usize = 64;
/// Stack of each task.
pub const TASK_STACK_SIZE: usize = 64 * 1024;
/// Task slots: the tasks, then one idle context per vCPU.
const SLOTS: usize = MAX_TASKS + MAX_VCPUS;

const RUNNABLE: u32 = 1;
const RUNNING: u32 = 2;
const BLOCKED: u32 = 3;
const DEAD: u32 = 4;

global_asm!(
    include_str!("../arch/switch.S"),
    task_start = sym task_start,
    preempt_irq = sym preempt_irq,
    off_irq_rax = const core::mem::offset_of!(crate::arch::percpu::PerCpu, irq_saved),
    off_irq_rcx = const core::mem::offset_of!(crate::arch::percpu::PerCpu, irq_saved) + 8,
    off_irq_rdx = const core::mem::offset_of!(crate::arch::percpu::PerCpu, irq_saved) + 16,
    off_irq_rip = const core::mem::offset_of!(crate::arch::percpu::PerCpu, irq_saved) + 24,
    options(att_syntax)
);

extern "C" {
    fn hover_context_switch(prev_rsp: *mut u64, next_rsp: u64);
    fn hover_task_trampoline();
}

/// One task (or a vCPU's idle context).
pub struct Task {
    saved_rsp: UnsafeCell<u64>,
    state: AtomicU32,
    home: AtomicUsize,
    entry: AtomicUsize,
    arg: AtomicUsize,
    exited: Event,
    /// Times the task was switched in.
    runs: AtomicU64,
    /// Real-time: its vCPU asks the monitor for a boost while it runs.
    rt: AtomicBool,
}

struct TaskTable([Task; SLOTS]);
// SAFETY: `saved_rsp` is written only by the task's own vCPU inside
// schedule() while the task is not running; everything else is atomic.
unsafe impl Sync for TaskTable {}

static TASKS: TaskTable = TaskTable(
    [const {
        Task {
            saved_rsp: UnsafeCell::new(0),
            state: AtomicU32::new(0),
            home: AtomicUsize::new(0),
            entry: AtomicUsize::new(0),
            arg: AtomicUsize::new(0),
            exited: Event::new(),
            runs: AtomicU64::new(0),
            rt: AtomicBool::new(false),
        }
    }; SLOTS],
);
static NEXT_TASK: AtomicUsize = AtomicUsize::new(0);
static LOAD: [AtomicUsize; MAX_VCPUS] = [const { AtomicUsize::new(0) }; MAX_VCPUS];
static VCPUS: AtomicUsize = AtomicUsize::new(1);

#[repr(C, align(16))]
struct TaskStacks([[u8; TASK_STACK_SIZE]; MAX_TASKS]);
static mut TASK_STACKS: TaskStacks = TaskStacks([[0; TASK_STACK_SIZE]; MAX_TASKS]);

/// A FIFO of runnable task indices.
struct RunQueue {
    ring: [u8; MAX_TASKS],
    head: usize,
    len: usize,
}

impl RunQueue {
    const EMPTY: RunQueue = RunQueue {
        ring: [0; MAX_TASKS],
        head: 0,
        len: 0,
    };

    fn push(&mut self, id: usize) {
        // At most MAX_TASKS tasks exist and each is queued at most once
        // (wake() moves it out of BLOCKED first), so the ring cannot overflow.
        assert!(self.len < MAX_TASKS, "run queue overflow");
        self.ring[(self.head + self.len) % MAX_TASKS] = id as u8;
        self.len += 1;
    }

    /// Queue a task that has just woken ahead of those that used up a slice.
    fn push_front(&mut self, id: usize) {
        assert!(self.len < MAX_TASKS, "run queue overflow");
        self.head = (self.head + MAX_TASKS - 1) % MAX_TASKS;
        self.ring[self.head] = id as u8;
        self.len += 1;
    }

    fn pop(&mut self) -> Option<usize> {
        (self.len > 0).then(|| {
            let id = self.ring[self.head] as usize;
            self.head = (self.head + 1) % MAX_TASKS;
            self.len -= 1;
            id
        })
    }
}

static RUNQUEUES: [SpinLock<RunQueue>; MAX_VCPUS] =
    [const { SpinLock::new(RunQueue::EMPTY) }; MAX_VCPUS];

/// Where a new task runs.
#[derive(Clone, Copy, Debug)]
pub enum Placement {
    /// On this vCPU.
    Pinned(usize),
    /// On the vCPU with the fewest tasks.
    Any,
}

/// Why a task could not be created.
#[derive(Clone, Copy, Debug)]
pub enum SpawnError {
    /// All [`MAX_TASKS`] slots are used.
    TooManyTasks,
    /// Pinned to a vCPU the VM does not have.
    NoSuchCpu(usize),
}

impl core::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SpawnError::TooManyTasks => write!(f, "all {MAX_TASKS} task slots are used"),
            SpawnError::NoSuchCpu(c) => write!(f, "there is no vCPU {c}"),
        }
    }
}

fn task(id: usize) -> &'static Task {
    &TASKS.0[id]
}

fn idle_of(cpu: usize) -> usize {
    MAX_TASKS + cpu
}

/// Record the VM's vCPU count (vCPU 0, before spawning anything).
pub fn init(vcpus: usize) {
    VCPUS.store(vcpus.clamp(1, MAX_VCPUS), Ordering::Relaxed);
}

/// Make the boot context this vCPU's idle context; it runs with preemption
/// off for good (it switches away voluntarily when there is work).
pub fn init_cpu(pc: &PerCpu) {
    let idle = idle_of(pc.index());
    task(idle).state.store(RUNNING, Ordering::Relaxed);
    task(idle).home.store(pc.index(), Ordering::Relaxed);
    pc.current.store(idle, Ordering::Relaxed);
    pc.preempt_count.store(1, Ordering::Relaxed);
}

/// The running task's index.
pub fn current() -> usize {
    this_cpu().current.load(Ordering::Relaxed)
}

/// Mark `id` as about to block (before publishing it as a waiter).
pub fn mark_blocked(id: usize) {
    task(id).state.store(BLOCKED, Ordering::SeqCst);
}

/// Undo [`mark_blocked`] when the wait turned out unnecessary.
pub fn mark_running(id: usize) {
    task(id).state.store(RUNNING, Ordering::SeqCst);
}

/// Switch away from the current task, which has marked itself blocked.
/// Called with preemption disabled once (`preempt_count == 1`).
pub fn block() {
    schedule(Reason::Block);
}

/// Make a blocked task runnable on its home vCPU, ahead of the tasks that
/// were preempted (it has not used its slice: a task woken from a page-in or
/// an event runs promptly, as a sleeper would on Linux). Waking a task that
/// is not blocked does nothing (its event or deadline is then seen without
/// waiting).
pub fn wake(id: usize) {
    make_runnable(id, true);
}

fn make_runnable(id: usize, front: bool) {
    let t = task(id);
    if t.state
        .compare_exchange(BLOCKED, RUNNABLE, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let home = t.home.load(Ordering::Relaxed);
    {
        let mut rq = RUNQUEUES[home].lock();
        if front {
            rq.push_front(id);
        } else {
            rq.push(id);
        }
    }
    // A woken task should run promptly, and a remote vCPU may be halted. A
    // new task queued behind the running one here waits for its turn: a kick
    // would make every spawn preempt the spawner, and spawning n tasks would
    // take n rounds of time slices.
    if front || percpu::cpu_index() != Some(home) {
        kick(home);
    }
}

/// Per vCPU: inside schedule(), handing out wake-ups it will itself act on.
static SCHEDULING: [AtomicBool; MAX_VCPUS] = [const { AtomicBool::new(false) }; MAX_VCPUS];

/// Tell `cpu` it has work; interrupt it if it is halted.
fn kick(cpu: usize) {
    let here = percpu::cpu_index() == Some(cpu);
    if here && SCHEDULING[cpu].load(Ordering::Relaxed) {
        // The scheduler is about to pick from this run queue anyway; a
        // reschedule request now would make it switch once more, away from
        // the task it just woke.
        return;
    }
    let target = percpu::of(cpu);
    target.need_resched.store(1, Ordering::SeqCst);
    // Pairs with the idle loop's store of `halted` before its last look at
    // `need_resched` (inside the nub): one of the two sides sees the other.
    if percpu::cpu_index() != Some(cpu) && target.halted.load(Ordering::SeqCst) != 0 {
        irq::send_ipi(cpu, vectors::RESCHED);
    }
}

/// Create a task running `entry(arg)`.
pub fn spawn(entry: fn(usize), arg: usize, placement: Placement) -> Result<usize, SpawnError> {
    let vcpus = VCPUS.load(Ordering::Relaxed);
    let home = match placement {
        Placement::Pinned(cpu) if cpu < vcpus => cpu,
        Placement::Pinned(cpu) => return Err(SpawnError::NoSuchCpu(cpu)),
        Placement::Any => (0..vcpus)
            .min_by_key(|&c| LOAD[c].load(Ordering::Relaxed))
            .unwrap_or(0),
    };
    let id = NEXT_TASK.fetch_add(1, Ordering::Relaxed);
    if id >= MAX_TASKS {
        return Err(SpawnError::TooManyTasks);
    }
    let t = task(id);
    // The first switch into the task pops six callee-saved registers (r12 =
    // its index) and returns into the trampoline with rsp % 16 == 8, as
    // after a call.
    let top = unsafe { (&raw mut TASK_STACKS.0[id]) as u64 } + TASK_STACK_SIZE as u64;
    let frame = (top - 56) as *mut u64;
    // SAFETY: the slot is fresh (ids are never reused) and its stack unused.
    unsafe {
        for i in 0..6 {
            frame.add(i).write(0);
        }
        frame.add(3).write(id as u64); // r12
        frame
            .add(6)
            .write(hover_task_trampoline as *const () as u64);
        *t.saved_rsp.get() = frame as u64;
    }
    t.entry.store(entry as usize, Ordering::Relaxed);
    t.arg.store(arg, Ordering::Relaxed);
    t.home.store(home, Ordering::Relaxed);
    LOAD[home].fetch_add(1, Ordering::Relaxed);
    t.state.store(BLOCKED, Ordering::SeqCst);
    make_runnable(id, false);
    Ok(id)
}

/// Wait until task `id` has finished (one joiner per task).
pub fn join(id: usize) {
    task(id).exited.wait();
}

/// Times task `id` has been switched in.
pub fn runs(id: usize) -> u64 {
    task(id).runs.load(Ordering::Relaxed)
}

/// Mark the running task real-time (or not): while it runs, its vCPU asks
/// the monitor for a boost, and its timed sleeps are announced (`boost`).
pub fn set_realtime(on: bool) {
    task(current()).rt.store(on, Ordering::Relaxed);
    crate::kernel::boost::sched_bits(false, on, false);
}

/// Whether task `id` is real-time.
pub fn is_realtime(id: usize) -> bool {
    task(id).rt.load(Ordering::Relaxed)
}

/// Let other runnable tasks on this vCPU run.
pub fn yield_now() {
    preempt_disable();
    schedule(Reason::Yield);
    preempt_enable();
}

/// From [`preempt_enable`] or the preemption path, with `preempt_count == 1`:
/// switch while a reschedule is due, then allow preemption.
pub fn reschedule() {
    while this_cpu().need_resched.load(Ordering::Relaxed) != 0 {
        schedule(Reason::Yield);
    }
    this_cpu().preempt_count.store(0, Ordering::Relaxed);
}

/// End the current task.
pub fn exit_current() -> ! {
    preempt_disable();
    let me = current();
    let t = task(me);
    t.state.store(DEAD, Ordering::SeqCst);
    LOAD[t.home.load(Ordering::Relaxed)].fetch_sub(1, Ordering::Relaxed);
    t.exited.signal();
    schedule(Reason::Exit);
    unreachable!("a dead task was scheduled again")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Reason {
    Yield,
    Block,
    Exit,
    Idle,
}

fn schedule(reason: Reason) {
    let pc = this_cpu();
    debug_assert_eq!(pc.preempt_count.load(Ordering::Relaxed), 1);
    let cpu = pc.index();
    pc.need_resched.store(0, Ordering::Relaxed);
    SCHEDULING[cpu].store(true, Ordering::Relaxed);
    let irq = irq::process_pending(pc);
    apf::process_ready(pc);
    apf::policy(pc);
    timer::expire(cpu);
    SCHEDULING[cpu].store(false, Ordering::Relaxed);
    let prev = pc.current.load(Ordering::Relaxed);
    let idle = idle_of(cpu);
    let next = {
        let mut rq = RUNQUEUES[cpu].lock();
        if reason == Reason::Yield && prev != idle {
            task(prev).state.store(RUNNABLE, Ordering::SeqCst);
            rq.push(prev);
        }
        rq.pop().unwrap_or(idle)
    };
    let halts = next == idle && IDLE_HALTS.load(Ordering::Relaxed);
    boost::sched_bits(irq, task(next).rt.load(Ordering::Relaxed), halts);
    if next == prev {
        task(prev).state.store(RUNNING, Ordering::SeqCst);
        return;
    }
    task(next).state.store(RUNNING, Ordering::SeqCst);
    task(next).runs.fetch_add(1, Ordering::Relaxed);
    pc.current.store(next, Ordering::Relaxed);
    if next != idle {
        timer::ensure_tick(pc);
        // Another task's code may run for a while: completions must
        // interrupt again.
        crate::kernel::haltpoll::stop_polling(pc);
    }
    // SAFETY: prev is the running context (its saved_rsp is ours to write),
    // next is runnable and not running anywhere (tasks run only at home).
    unsafe { hover_context_switch(task(prev).saved_rsp.get(), *task(next).saved_rsp.get()) };
}

/// First code of every task, with `preempt_count == 1` from the switch.
extern "C" fn task_start(id: usize) -> ! {
    preempt_enable();
    let t = task(id);
    // SAFETY: `entry` was stored from a `fn(usize)` by spawn().
    let entry: fn(usize) = unsafe { core::mem::transmute(t.entry.load(Ordering::Relaxed)) };
    entry(t.arg.load(Ordering::Relaxed));
    exit_current()
}

/// Called by `hover_irq_entry` after a tick or interrupt (a reschedule is
/// due; `preempt_count == 1`) or by `hover_fault_entry` after a #PF in
/// preemptible code (`preempt_count == 2`, the faulting address or async
/// token in `apf_park_token`).
extern "C" fn preempt_irq() {
    let pc = this_cpu();
    let from_fault = pc.preempt_count.swap(1, Ordering::Relaxed) == 2;
    if from_fault {
        let token = pc.apf_park_token.swap(0, Ordering::Relaxed);
        // The area's flags are 1 only while KVM delivers a "page not
        // present" (the nub leaves them for us to clear at native speed).
        if pc.apf_area.flags.swap(0, Ordering::Relaxed) == 0 {
            // A real page fault: back to the access with preemption off,
            // where it faults again and the nub reports it with its frame.
            return;
        }
        if token != 0 {
            apf::park_faulted(pc, token as u32);
            // The nub may have handed over readies meanwhile (at the fault
            // entry, in `apf_ready_one`, or at the next entry, in the ring)
            // without asking for a reschedule; `park` does not switch when
            // the page was already in. Take them now, in `schedule`, so
            // `apf_ready_one` is empty before preemption is on again.
            if apf::ready_pending(pc) {
                pc.need_resched.store(1, Ordering::Relaxed);
            }
            reschedule();
            return;
        }
        // Token 0: a KVM older than 5.17 (docs/ABI.md); the access waits
        // for the page when it faults again.
    }
    pc.need_resched.store(1, Ordering::Relaxed);
    reschedule();
}

/// What an idle vCPU does (`idle=` on the command line).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// HLT through the nub.
    Halt,
    /// Spin in the guest until there is work.
    Poll,
    /// Poll for an adaptive window of at most `max_us`, then HLT.
    HaltPoll {
        /// The guest's own bound on the window (`poll_us=`).
        max_us: u64,
    },
}

/// Halt this vCPU until an interrupt (the nub checks `need_resched` last).
fn halt(pc: &PerCpu) {
    pc.halted.store(1, Ordering::SeqCst);
    nub::halt();
    pc.halted.store(0, Ordering::SeqCst);
}

/// The idle mode halts at once (`Idle::Halt`): an idle vCPU then holds no
/// host CPU, so it may leave its boost to the monitor (`boost`).
static IDLE_HALTS: AtomicBool = AtomicBool::new(false);

/// This vCPU's idle loop: run whatever is runnable, otherwise halt, spin or
/// poll and then halt (see [`Idle`]) until there is work.
pub fn idle_loop(mode: Idle) -> ! {
    IDLE_HALTS.store(mode == Idle::Halt, Ordering::Relaxed);
    let me = idle_of(this_cpu().index());
    let mut switched_in = runs(me);
    loop {
        schedule(Reason::Idle);
        let pc = this_cpu();
        if pc.need_resched.load(Ordering::SeqCst) != 0 {
            continue;
        }
        // A task ran since the last pass exactly when the idle context was
        // switched back in (its run count moved).
        let now_in = runs(me);
        let after_task = now_in != switched_in;
        switched_in = now_in;
        timer::program_idle(pc, after_task);
        match mode {
            Idle::Poll => {
                while pc.need_resched.load(Ordering::Relaxed) == 0 {
                    core::hint::spin_loop();
                }
            }
            Idle::Halt => halt(pc),
            Idle::HaltPoll { max_us } => crate::kernel::haltpoll::idle(pc, max_us, || halt(pc)),
        }
    }
}
