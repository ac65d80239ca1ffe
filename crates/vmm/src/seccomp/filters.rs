//! The allow-lists, one per thread kind. Each list is what that kind was
//! seen to make over the whole test suite and the benches (under
//! `strace -f`, attributed by thread name), grouped by purpose; arguments
//! are checked where a call's purpose fixes them: ioctls by their type
//! byte (KVM 0xAE, userfaultfd 0xAA), memory mappings never executable,
//! files opened by the API and the pager read-only.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule,
};

use super::{Kind, Mode};

/// The tun request that sets what a tap may hand out (virtio-net makes it
/// on a vCPU thread, whose filter allows it and no other tun request).
pub const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;

/// Every kind, for checking that all filters compile.
pub const KINDS: [Kind; 12] = [
    Kind::Vcpu,
    Kind::Pager,
    Kind::Io,
    Kind::Virtio,
    Kind::Api,
    Kind::Console,
    Kind::Governor,
    Kind::Boost,
    Kind::Timer,
    Kind::Migration,
    Kind::Sender,
    Kind::Control,
];

/// A call and the rules of which any one must match (none: any arguments).
type Allow = (i64, Vec<SeccompRule>);

fn cond(arg: u8, op: Op, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, Len::Dword, op, value).expect("argument index below 6")
}

fn rule(c: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(c).expect("a rule has conditions")
}

fn any(calls: &[i64]) -> Vec<Allow> {
    calls.iter().map(|&c| (c, Vec::new())).collect()
}

/// `ioctl` with a request of one of these types (the request's second byte).
fn ioctl_types(types: &[u64]) -> Allow {
    (
        libc::SYS_ioctl,
        types
            .iter()
            .map(|t| rule(vec![cond(1, Op::MaskedEq(0xff00), t << 8)]))
            .collect(),
    )
}

/// `openat` for reading only.
fn open_read_only() -> Allow {
    let writes = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u64;
    (
        libc::SYS_openat,
        vec![rule(vec![cond(2, Op::MaskedEq(writes), 0)])],
    )
}

/// `prctl` with one of these options.
fn prctl(options: &[i32]) -> Allow {
    (
        libc::SYS_prctl,
        options
            .iter()
            .map(|&o| rule(vec![cond(0, Op::Eq, o as u64)]))
            .collect(),
    )
}

const KVM: u64 = 0xae;
const UFFD: u64 = 0xaa;
/// Terminal and socket ioctls (`TCGETS` of isatty, `FIONBIO`).
const TTY: u64 = 0x54;

/// What every thread does: the Rust runtime (allocation, locks, thread
/// start and exit), logging to stderr, time, and the SIGSYS handler's
/// own calls (`write`, `exit_group`).
fn base() -> Vec<Allow> {
    let no_exec = || vec![rule(vec![cond(2, Op::MaskedEq(libc::PROT_EXEC as u64), 0)])];
    let mut v = vec![
        (libc::SYS_mmap, no_exec()),
        (libc::SYS_mprotect, no_exec()),
        // Closing a descriptor checks first that it is open (std, debug builds).
        (
            libc::SYS_fcntl,
            vec![rule(vec![cond(1, Op::Eq, libc::F_GETFD as u64)])],
        ),
    ];
    v.extend(any(&[
        libc::SYS_futex,
        libc::SYS_munmap,
        libc::SYS_madvise,
        libc::SYS_mremap,
        libc::SYS_brk,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_gettid,
        libc::SYS_getpid,
        libc::SYS_sched_getaffinity,
        libc::SYS_sched_yield,
        libc::SYS_clock_gettime,
        libc::SYS_clock_nanosleep,
        libc::SYS_nanosleep,
        libc::SYS_restart_syscall,
        libc::SYS_getrandom,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_getrusage,
        libc::SYS_close,
        libc::SYS_exit,
        libc::SYS_exit_group,
        // What a new thread does before it can take a signal (glibc
        // starts it with every signal blocked, so a trap there would kill
        // the process without a word).
        libc::SYS_rseq,
        libc::SYS_set_robust_list,
    ]));
    v
}

/// Raising an interrupt with KVM_IRQ_LINE (and reading the IOAPIC's
/// route) and boosting the vCPU it reaches, as the serial port's, the
/// virtio and the MSI timer threads do.
fn interrupts_and_boosts() -> Vec<Allow> {
    let mut v = vec![ioctl_types(&[KVM]), (libc::SYS_tgkill, Vec::new())];
    v.extend(priorities());
    v
}

/// Raising and lowering threads' priorities (boosting; the pager's nice).
fn priorities() -> Vec<Allow> {
    any(&[
        libc::SYS_sched_setscheduler,
        libc::SYS_sched_getscheduler,
        libc::SYS_sched_getparam,
        libc::SYS_setpriority,
        libc::SYS_getpriority,
    ])
}

fn allow_list(kind: Kind) -> Vec<Allow> {
    let mut v = base();
    let own = match kind {
        Kind::Vcpu => vcpu(),
        Kind::Pager => pager(),
        Kind::Io => io(),
        Kind::Api => api(),
        Kind::Governor => governor(),
        Kind::Boost => boost(),
        Kind::Virtio => virtio(),
        Kind::Console => console(),
        Kind::Timer => timer(),
        Kind::Migration => migration(),
        Kind::Control => control(),
        Kind::Sender => sender(),
    };
    v.extend(own);
    v
}

/// What vCPU threads may call, beyond [`base`].
fn vcpu() -> Vec<Allow> {
    let mut v = Vec::new();
    v.push(ioctl_types(&[KVM]));
    // A virtio-net driver's FEATURES_OK sets its tap's offloads
    // (an MMIO register write, served on the vCPU's thread): that
    // one tun request and no other.
    v.push((
        libc::SYS_ioctl,
        vec![rule(vec![cond(1, Op::Eq, TUNSETOFFLOAD)])],
    ));
    v.extend(priorities());
    v.push((libc::SYS_tgkill, Vec::new()));
    v
}

/// What the pager and its fetch workers may call, beyond [`base`].
fn pager() -> Vec<Allow> {
    let mut v = Vec::new();
    v.push(ioctl_types(&[UFFD]));
    v.push(open_read_only());
    v.push(prctl(&[libc::PR_SET_TIMERSLACK, libc::PR_SET_NAME]));
    v.extend(priorities());
    // The fault thread starts the fetch workers, which inherit its
    // filter (one filter prepared for the 17 threads, not 17;
    // `super::spawn_member`): threads only (CLONE_THREAD), so no
    // process and no namespace; `clone3`, whose flags a filter
    // cannot read, fails with ENOSYS and glibc falls back to this.
    v.push((
        libc::SYS_clone,
        vec![rule(vec![cond(
            0,
            Op::MaskedEq(libc::CLONE_THREAD as u64),
            libc::CLONE_THREAD as u64,
        )])],
    ));
    v.extend(any(&[
        libc::SYS_read,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_poll,
        libc::SYS_ppoll,
        libc::SYS_fdatasync,
        // A page that keeps faulting though placed: what the
        // kernel holds there goes into the failure message.
        libc::SYS_mincore,
        // Batched store writes (memory/aio.rs).
        libc::SYS_io_setup,
        libc::SYS_io_submit,
        libc::SYS_io_getevents,
        libc::SYS_io_destroy,
    ]));
    v
}

/// What the paravirtual I/O device may call, beyond [`base`].
fn io() -> Vec<Allow> {
    let mut v = Vec::new();
    v.extend(priorities());
    v.extend(any(&[
        libc::SYS_openat,
        libc::SYS_fstat,
        libc::SYS_statx,
        libc::SYS_fstatfs,
        libc::SYS_fcntl,
        libc::SYS_unlink,
        libc::SYS_read,
        libc::SYS_pwrite64,
        libc::SYS_tgkill,
    ]));
    v
}

/// What the API's threads may call, beyond [`base`].
fn api() -> Vec<Allow> {
    let mut v = Vec::new();
    v.push(open_read_only());
    // Naming its request threads.
    v.push(prctl(&[libc::PR_SET_NAME]));
    v.extend(any(&[
        libc::SYS_clone3,
        libc::SYS_clone,
        libc::SYS_accept4,
        libc::SYS_accept,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        libc::SYS_read,
        libc::SYS_recvfrom,
        libc::SYS_sendto,
        libc::SYS_writev,
        libc::SYS_shutdown,
        libc::SYS_poll,
        libc::SYS_ppoll,
        // The server's stop signal.
        libc::SYS_eventfd2,
        libc::SYS_pread64,
        libc::SYS_fcntl,
        libc::SYS_statx,
        libc::SYS_fstat,
        libc::SYS_lseek,
    ]));
    v
}

/// What the halt-poll governor may call, beyond [`base`].
fn governor() -> Vec<Allow> {
    let mut v = Vec::new();
    v.push(ioctl_types(&[KVM]));
    v.extend(any(&[libc::SYS_pread64, libc::SYS_read]));
    v
}

/// What the boost monitor may call, beyond [`base`].
fn boost() -> Vec<Allow> {
    let mut v = Vec::new();
    v.push(prctl(&[libc::PR_SET_TIMERSLACK]));
    v.extend(priorities());
    v.push((libc::SYS_tgkill, Vec::new()));
    // Each vCPU thread's schedstat (`--boost-when contended`):
    // opened once, read again at offset 0 each poll.
    v.push(open_read_only());
    v.push((libc::SYS_pread64, Vec::new()));
    v
}

/// What the virtio I/O thread may call, beyond [`base`].
fn virtio() -> Vec<Allow> {
    let mut v = Vec::new();
    // Its eventfds (epoll, read), disks (positional reads and
    // writes, fdatasync; a seek and a read straight into guest
    // memory for a request's data); entropy comes from getrandom
    // (base). The balloon drops pages (madvise, base) and frees
    // their page-store slots (fallocate, punching holes). While
    // boosting is on it raises interrupts itself (KVM_IRQ_LINE,
    // the IOAPIC's route read back) and boosts their vCPUs, as the
    // serial port's threads do.
    v.extend(interrupts_and_boosts());
    v.extend(any(&[
        libc::SYS_fallocate,
        libc::SYS_lseek,
        libc::SYS_epoll_wait,
        libc::SYS_epoll_pwait,
        libc::SYS_read,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_fdatasync,
    ]));
    v
}

/// What the console input thread may call, beyond [`base`].
fn console() -> Vec<Allow> {
    let mut v = Vec::new();
    // Standard input and its stop eventfd (poll, read); the UART's
    // interrupt (KVM_IRQ_LINE) and the boost it gives, as the
    // timer's.
    v.extend(interrupts_and_boosts());
    v.extend(any(&[libc::SYS_poll, libc::SYS_ppoll, libc::SYS_read]));
    v
}

/// What the MSI timer thread may call, beyond [`base`].
fn timer() -> Vec<Allow> {
    interrupts_and_boosts()
}

/// What a migration's threads may call, beyond [`base`].
fn migration() -> Vec<Allow> {
    let mut v = Vec::new();
    v.push(ioctl_types(&[KVM, UFFD]));
    // Naming the recovery's opening threads.
    v.push(prctl(&[libc::PR_SET_NAME]));
    v.extend(any(&[
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_writev,
        libc::SYS_recvfrom,
        libc::SYS_sendto,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_poll,
        libc::SYS_ppoll,
        libc::SYS_shutdown,
        libc::SYS_tgkill,
        libc::SYS_fcntl,
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        // Post-copy recovery: the destination listens again (on a
        // socket made 0600 before it is bound) and checks each
        // connection's opening on a thread of its own.
        libc::SYS_clone3,
        libc::SYS_clone,
        libc::SYS_fchmod,
        libc::SYS_socket,
        libc::SYS_bind,
        libc::SYS_listen,
        libc::SYS_accept4,
        libc::SYS_getsockname,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_unlink,
    ]));
    v
}

/// What the control thread (a superset of every kind it starts) may call, beyond [`base`].
fn control() -> Vec<Allow> {
    let mut v = Vec::new();
    // Threads the control thread starts after it is confined (all
    // of them, in `hover receive`) carry its filter under their
    // own: it must allow whatever theirs do.
    for kind in KINDS {
        if !matches!(kind, Kind::Control | Kind::Sender) {
            v.extend(allow_list(kind));
        }
    }
    v.push(ioctl_types(&[KVM, UFFD, TTY]));
    // A destination (`hover receive`) opens its VM's taps once
    // confined, and a tap's existence is checked by its index
    // (`if_nametoindex`): that socket request and no other.
    v.push((
        libc::SYS_ioctl,
        vec![rule(vec![cond(1, Op::Eq, libc::SIOCGIFINDEX)])],
    ));
    v.push(prctl(&[
        libc::PR_GET_SECCOMP,
        // Letting the sender process read guest memory (Yama).
        libc::PR_SET_PTRACER,
        // Threads started later install their own filters.
        libc::PR_SET_NO_NEW_PRIVS,
        libc::PR_SET_SECCOMP,
    ]));
    v.extend(any(&[
        libc::SYS_seccomp,
        libc::SYS_rt_sigaction,
        // Files the user names: snapshots, page stores, sockets.
        libc::SYS_openat,
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_pread64,
        libc::SYS_preadv,
        libc::SYS_pwrite64,
        libc::SYS_lseek,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        libc::SYS_ftruncate,
        libc::SYS_fallocate,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_fstatfs,
        libc::SYS_getdents64,
        libc::SYS_readlink,
        // Whether --io-file is writable (restore, receive).
        libc::SYS_access,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_unlink,
        libc::SYS_linkat,
        libc::SYS_chmod,
        libc::SYS_fchmod,
        libc::SYS_fcntl,
        libc::SYS_mincore,
        libc::SYS_memfd_create,
        libc::SYS_userfaultfd,
        libc::SYS_eventfd2,
        libc::SYS_pipe2,
        // A destination's virtio I/O thread is set up here once
        // confined (its epoll and the queues' descriptors in it).
        libc::SYS_epoll_create1,
        libc::SYS_epoll_ctl,
        // Migration peers and the API socket.
        libc::SYS_socket,
        libc::SYS_socketpair,
        libc::SYS_connect,
        libc::SYS_bind,
        libc::SYS_listen,
        libc::SYS_accept4,
        libc::SYS_accept,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        libc::SYS_shutdown,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
        libc::SYS_poll,
        libc::SYS_ppoll,
        // Threads; reaping (and killing) the sender process the
        // broker started (never starting a program: no execve).
        libc::SYS_clone,
        libc::SYS_clone3,
        libc::SYS_wait4,
        libc::SYS_kill,
        libc::SYS_tgkill,
        libc::SYS_geteuid,
        libc::SYS_getuid,
        libc::SYS_prlimit64,
    ]));
    v
}

/// What a migration's sender process may call, beyond [`base`].
fn sender() -> Vec<Allow> {
    let mut v = Vec::new();
    v.extend(any(&[
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_writev,
        libc::SYS_pread64,
        libc::SYS_preadv,
        libc::SYS_process_vm_readv,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_poll,
    ]));
    v
}

/// Why a filter was not compiled.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// `--seccomp off` has no filter.
    #[error("no program for --seccomp off")]
    Off,
    /// seccompiler refused the rules (a bug in the lists here).
    #[error("{0}")]
    Backend(#[from] seccompiler::BackendError),
}

/// The BPF program for `kind` in `mode` (not [`Mode::Off`]).
pub fn compile(kind: Kind, mode: Mode) -> Result<BpfProgram, CompileError> {
    // `None`: any arguments (a call allowed so anywhere stays so).
    let mut merged: BTreeMap<i64, Option<Vec<SeccompRule>>> = BTreeMap::new();
    for (call, r) in allow_list(kind) {
        match (
            merged.entry(call).or_insert_with(|| Some(Vec::new())),
            r.is_empty(),
        ) {
            (e, true) => *e = None,
            (Some(rs), false) => rs.extend(r),
            (None, false) => {}
        }
    }
    let rules = merged
        .into_iter()
        .map(|(call, r)| (call, r.unwrap_or_default()))
        .collect();
    let mismatch = match mode {
        Mode::On => SeccompAction::Trap,
        Mode::Log => SeccompAction::Log,
        Mode::Off => return Err(CompileError::Off),
    };
    let filter = SeccompFilter::new(
        rules,
        mismatch,
        SeccompAction::Allow,
        std::env::consts::ARCH.try_into()?,
    )?;
    let prog: BpfProgram = filter.try_into()?;
    let mut prefix = Vec::new();
    if !allows(kind, libc::SYS_openat) {
        prefix.extend(failing(libc::SYS_openat, libc::ENOENT));
    }
    if allows(kind, libc::SYS_clone) && !allows(kind, libc::SYS_clone3) {
        prefix.extend(failing(libc::SYS_clone3, libc::ENOSYS));
    }
    Ok(prefix.into_iter().chain(prog).collect())
}

/// Whether `kind`'s list names `call` (with any arguments or some).
fn allows(kind: Kind, call: i64) -> bool {
    allow_list(kind).iter().any(|(c, _)| *c == call)
}

/// Instructions that make `call` fail with `errno`, ahead of a kind's
/// allow-list. `openat` with ENOENT, for the kinds that never open a file:
/// the C library opens files behind the program's back, from whichever
/// thread happens to get there first (glibc's malloc reads
/// /proc/sys/vm/overcommit_memory the first time any thread's arena
/// shrinks: seen from a vCPU thread in a migration, which stopped the VMM),
/// and takes a failed open as "no"; failing the call keeps the guarantee
/// (no file is opened) without stopping a VM over a library's lookup.
/// `clone3` with ENOSYS, for the kinds that may start threads only: the C
/// library then starts them with `clone`, whose flags the filter checks.
fn failing(call: i64, errno: i32) -> [seccompiler::sock_filter; 5] {
    // Classic BPF opcodes (linux/filter.h): BPF_LD|BPF_W|BPF_ABS,
    // BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K.
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const ARCH_OFFSET: u32 = 4;
    const NR_OFFSET: u32 = 0;
    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    let op = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    [
        // Another architecture's call numbers mean other calls: leave
        // them to the allow-list, which refuses other architectures.
        op(LD_W_ABS, 0, 0, ARCH_OFFSET),
        op(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        op(LD_W_ABS, 0, 0, NR_OFFSET),
        op(JEQ_K, 0, 1, call as u32),
        op(RET_K, 0, 0, libc::SECCOMP_RET_ERRNO | errno as u32),
    ]
}
