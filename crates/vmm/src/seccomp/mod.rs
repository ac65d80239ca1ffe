//! seccomp filters per thread kind (`--seccomp off|log|on`, default on).
//!
//! Each thread the VMM starts ([`spawn`]) installs, before running its
//! work, a filter that allows the system calls its kind makes and nothing
//! else ([`filters`]): a vCPU thread may issue KVM ioctls but not open a
//! file; the API thread may accept and read but not map executable memory.
//! The thread that builds and runs the VM (the caller's) is confined too
//! once the VM runs (`hover receive`: once it listens, before it reads a
//! byte of the stream), by the `control` filter: it may open the files and
//! sockets the user names (snapshots, migration peers), but never start a
//! program or map executable memory; an unfiltered [`broker`] thread,
//! started just before, does that for it (the sender process, host-name
//! lookups).
//!
//! Kinds that never open a file get ENOENT from `openat` instead of a
//! trap (see `filters::failing`): the C library's own lookups (glibc's
//! malloc reads /proc/sys/vm/overcommit_memory from whichever thread first
//! shrinks an arena) must not stop a VM, and the file still stays shut.
//!
//! Modes: `on` traps a forbidden call: a one-line message on stderr names
//! the thread, its kind and the call, and the process exits with status 1
//! (a thread that vanished would leave the VM waiting on it forever, and a
//! VMM thread making a call it never makes means a bug or a compromise).
//! `log` lets the call through and has the kernel log it (audit log or
//! dmesg, `type=SECCOMP`): for finding what a new code path needs. `off`
//! installs nothing.
//!
//! The mode a thread applies is the one of the thread that started it:
//! [`set_mode`] sets it for the thread that builds or runs a VM, and
//! [`spawn`] passes it on. Threads a filtered thread starts inherit its
//! filter as well (filters stack), so every kind's threads are started
//! by the VM's own thread, except the API's per-request threads, which
//! are of the API's kind.

pub mod broker;
pub mod filters;
mod trap;

use crate::sync::Locked;
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use seccompiler::BpfProgram;

pub use crate::config::host::SeccompMode as Mode;

/// The kinds of VMM thread, each with its own filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Runs one vCPU (`KVM_RUN`) and its exits.
    Vcpu,
    /// The userfaultfd pager's fault reader and workers.
    Pager,
    /// The paravirtual I/O device's thread.
    Io,
    /// The virtio devices' I/O thread (Linux guests).
    Virtio,
    /// The API server and its request threads.
    Api,
    /// Feeds standard input to the serial console (`--console stdio`).
    Console,
    /// The halt-polling governor.
    Governor,
    /// The boost monitor.
    Boost,
    /// Delivers the guest's delayed MSIs.
    Timer,
    /// Live migration's helpers: the dirty-rate throttle, post-copy's
    /// request server (source) and page receiver (destination).
    Migration,
    /// The migration's sender process, once set up.
    Sender,
    /// The thread that builds and runs the VM (the caller's), once the VM
    /// runs (in `hover receive`: once it listens, before it reads the
    /// stream); with the `hover` binary only ([`confine_control_threads`]).
    Control,
}

impl Kind {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Vcpu => "vcpu",
            Kind::Pager => "pager",
            Kind::Io => "io",
            Kind::Virtio => "virtio",
            Kind::Api => "api",
            Kind::Console => "console",
            Kind::Governor => "governor",
            Kind::Boost => "boost",
            Kind::Timer => "timer",
            Kind::Migration => "migration",
            Kind::Sender => "sender",
            Kind::Control => "control",
        }
    }
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::On) };
    /// The kind whose filter this thread installed ([`apply`]) or
    /// inherited from the thread that started it ([`spawn_member`]).
    static FILTERED_AS: Cell<Option<(Kind, Mode)>> = const { Cell::new(None) };
    static CONFINED: Cell<bool> = const { Cell::new(false) };
}

/// Whether [`confine_control`] confines (set by the `hover` binary).
static CONFINE_CONTROL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Have the thread that builds and runs a VM confined by the `control`
/// filter once the VM runs ([`confine_control`]). The `hover` binary asks
/// for it; a library user whose thread goes on to other work after a VM
/// does not (the filter cannot be lifted).
pub fn confine_control_threads() {
    CONFINE_CONTROL.store(true, std::sync::atomic::Ordering::Release);
}

/// Confine the calling thread, the one that runs a VM, with the `control`
/// filter in `mode` (once; only after [`confine_control_threads`]): first
/// the [`broker`] is started, which keeps what the filter forbids
/// (starting a program, resolving a host name) for it.
pub fn confine_control(mode: Mode) -> Result<(), Error> {
    if mode == Mode::Off
        || !CONFINE_CONTROL.load(std::sync::atomic::Ordering::Acquire)
        || CONFINED.with(|c| c.get())
    {
        return Ok(());
    }
    broker::start().map_err(|e| Error::Install("control", format!("the broker thread: {e}")))?;
    apply(Kind::Control, mode)?;
    CONFINED.with(|c| c.set(true));
    Ok(())
}

/// Set the mode for the threads this thread starts from now on.
pub fn set_mode(mode: Mode) {
    MODE.with(|m| m.set(mode));
}

/// The mode this thread passes on.
pub fn mode() -> Mode {
    MODE.with(|m| m.get())
}

/// Why seccomp cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The filter did not compile (a bug in [`filters`]).
    #[error("the {0} seccomp filter does not compile: {1}")]
    Build(&'static str, filters::CompileError),
    /// The kernel refused it.
    #[error("cannot install the {0} seccomp filter: {1} (--seccomp off runs without filters)")]
    Install(&'static str, String),
}

fn program(kind: Kind, mode: Mode) -> Result<BpfProgram, Error> {
    type Cache = Mutex<HashMap<(Kind, Mode), BpfProgram>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.locked();
    if let Some(p) = c.get(&(kind, mode)) {
        return Ok(p.clone());
    }
    let p = filters::compile(kind, mode).map_err(|e| Error::Build(kind.name(), e))?;
    c.insert((kind, mode), p.clone());
    Ok(p)
}

/// Check that every kind's filter compiles and that this kernel takes
/// filters, before a VM starts (so a thread never fails to install one).
pub fn check(mode: Mode) -> Result<(), Error> {
    if mode == Mode::Off {
        return Ok(());
    }
    for kind in filters::KINDS {
        program(kind, mode)?;
    }
    // SAFETY: PR_GET_SECCOMP only reads this thread's seccomp mode.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP) } < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::Install(
            "any",
            format!("this kernel has no seccomp: {e}"),
        ));
    }
    trap::install().map_err(|e| Error::Install("any", format!("SIGSYS handler: {e}")))
}

/// Install `kind`'s filter on the calling thread, in `mode`.
pub fn apply(kind: Kind, mode: Mode) -> Result<(), Error> {
    if mode == Mode::Off {
        return Ok(());
    }
    let prog = program(kind, mode)?;
    trap::install().map_err(|e| Error::Install(kind.name(), format!("SIGSYS handler: {e}")))?;
    trap::name_this_thread(kind);
    seccompiler::apply_filter(&prog).map_err(|e| Error::Install(kind.name(), e.to_string()))?;
    FILTERED_AS.with(|k| k.set(Some((kind, mode))));
    Ok(())
}

/// Start a thread of `kind` named `name`: it takes this thread's mode and
/// installs its filter before `f` runs. A filter that cannot be installed
/// (which [`check`] rules out) stops the process rather than run the thread
/// unfiltered.
pub fn spawn<F, T>(kind: Kind, name: String, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let mode = mode();
    std::thread::Builder::new().name(name).spawn(move || {
        set_mode(mode);
        if let Err(e) = apply(kind, mode) {
            eprintln!("hover: error: {e}");
            std::process::exit(1);
        }
        f()
    })
}

/// Start a thread of `kind` from a thread of that kind (its group's
/// leader, started by [`spawn`]): it runs under the filter it inherits at
/// its start (filters pass to the threads a filtered thread starts) and
/// installs none. The kernel prepares a filter when it is installed, about
/// 0.25 ms here for each: the pager's 17 threads each installing their own
/// were ~4 ms of CPU in every lazy restore's start. Called from any other
/// thread, it is [`spawn`]: a thread never runs unfiltered. The kind's
/// filter must allow starting threads.
pub fn spawn_member<F, T>(kind: Kind, name: String, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let mode = mode();
    if mode != Mode::Off && FILTERED_AS.with(|k| k.get()) != Some((kind, mode)) {
        return spawn(kind, name, f);
    }
    std::thread::Builder::new().name(name).spawn(move || {
        set_mode(mode);
        if mode != Mode::Off {
            trap::name_this_thread(kind);
            FILTERED_AS.with(|k| k.set(Some((kind, mode))));
        }
        f()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run this test binary again as a child running only `test`, with
    /// `HOVER_SECCOMP_CHILD` set: what a filter does to a process is seen
    /// from outside it.
    fn child(test: &str, mode: Mode) -> std::process::Output {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([test, "--exact", "--nocapture", "--test-threads", "1"])
            .env("HOVER_SECCOMP_CHILD", mode.name())
            .output()
            .unwrap()
    }

    fn child_mode() -> Option<Mode> {
        std::env::var("HOVER_SECCOMP_CHILD").ok()?.parse().ok()
    }

    /// In the child: a vCPU thread makes allowed calls, then opens a
    /// socket, which no vCPU thread does.
    fn misbehave(mode: Mode) {
        set_mode(mode);
        check(mode).unwrap();
        let t = spawn(Kind::Vcpu, "vcpu-test".into(), || {
            // SAFETY: plain calls with valid arguments.
            unsafe {
                libc::gettid();
                let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                libc::close(fd);
                fd
            }
        })
        .unwrap();
        let fd = t.join().unwrap();
        println!("the thread went on (socket: {fd})");
    }

    #[test]
    fn a_forbidden_call_stops_the_process_with_a_line_naming_thread_and_call() {
        if let Some(mode) = child_mode() {
            return misbehave(mode);
        }
        let out = child(
            "seccomp::tests::a_forbidden_call_stops_the_process_with_a_line_naming_thread_and_call",
            Mode::On,
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(
            stderr.contains(
                "seccomp: thread 'vcpu-test' (vcpu filter) made the forbidden system call socket (41)"
            ),
            "{stderr}"
        );
        assert!(!stdout.contains("went on"), "{stdout}");
    }

    /// This thread's count of installed filters (inherited ones included).
    fn filters_here() -> u32 {
        use std::io::Read;
        // One read into a buffer: read_to_string would statx first, which
        // the pager's filter does not allow.
        let mut buf = [0u8; 4096];
        let n = std::fs::File::open("/proc/thread-self/status")
            .unwrap()
            .read(&mut buf)
            .unwrap();
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp_filters:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// In the child: a pager thread starts a member (it inherits the
    /// leader's one filter and installs none); an unfiltered thread's
    /// member installs its own.
    fn members(mode: Mode) {
        set_mode(mode);
        check(mode).unwrap();
        let leader = spawn(Kind::Pager, "pager-lead".into(), || {
            let member = spawn_member(Kind::Pager, "pager-m".into(), filters_here).unwrap();
            (filters_here(), member.join().unwrap())
        })
        .unwrap();
        let (lead, member) = leader.join().unwrap();
        let orphan = spawn_member(Kind::Pager, "pager-o".into(), filters_here)
            .unwrap()
            .join()
            .unwrap();
        println!("filters: leader {lead} member {member} orphan {orphan}");
    }

    #[test]
    fn a_member_inherits_its_leaders_filter_and_an_orphan_installs_its_own() {
        if let Some(mode) = child_mode() {
            return members(mode);
        }
        let out = child(
            "seccomp::tests::a_member_inherits_its_leaders_filter_and_an_orphan_installs_its_own",
            Mode::On,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("filters: leader 1 member 1 orphan 1"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// In the child: a pager thread starts a thread (allowed), then a
    /// process (never).
    fn pager_forks(mode: Mode) {
        set_mode(mode);
        check(mode).unwrap();
        let t = spawn(Kind::Pager, "pager-fork".into(), || {
            let member = spawn_member(Kind::Pager, "pager-m".into(), || 7).unwrap();
            println!("a thread: {}", member.join().unwrap());
            // SAFETY: the child, if any, exits at once.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                // SAFETY: ending the forked child without running anything.
                unsafe { libc::_exit(0) };
            }
            pid
        })
        .unwrap();
        println!("forked: {}", t.join().unwrap());
    }

    #[test]
    fn a_pager_thread_may_start_threads_but_no_process() {
        if let Some(mode) = child_mode() {
            return pager_forks(mode);
        }
        let out = child(
            "seccomp::tests::a_pager_thread_may_start_threads_but_no_process",
            Mode::On,
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(stdout.contains("a thread: 7"), "{stdout}\n{stderr}");
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("'pager-fork' (pager filter) made the forbidden system call clone"),
            "{stderr}"
        );
        assert!(!stdout.contains("forked"), "{stdout}");
    }

    /// In the child: the control thread, confined, starts a program
    /// through the broker, then tries to start one itself.
    fn control_execs(mode: Mode) {
        set_mode(mode);
        check(mode).unwrap();
        confine_control_threads();
        confine_control(mode).unwrap();
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.arg("__no_such_test").stdout(std::process::Stdio::null());
        let ok = broker::spawn(c).unwrap().wait().unwrap().success();
        println!("through the broker: {ok}");
        std::thread::Builder::new()
            .name("control-test".into())
            .spawn(|| ())
            .unwrap()
            .join()
            .unwrap();
        let path = c"/bin/true";
        let argv = [path.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null()];
        // SAFETY: valid NUL-terminated arrays; on success the process is replaced.
        unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        println!("execve went on");
    }

    #[test]
    fn the_confined_control_thread_starts_programs_only_through_the_broker() {
        if let Some(mode) = child_mode() {
            return control_execs(mode);
        }
        let out = child(
            "seccomp::tests::the_confined_control_thread_starts_programs_only_through_the_broker",
            Mode::On,
        );
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(
            stdout.contains("through the broker: true"),
            "{stdout}\n{stderr}"
        );
        assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
        assert!(
            stderr.contains("(control filter) made the forbidden system call execve (59)"),
            "{stderr}"
        );
        assert!(!stdout.contains("execve went on"), "{stdout}");
    }

    #[test]
    fn log_mode_lets_a_forbidden_call_through() {
        if let Some(mode) = child_mode() {
            return misbehave(mode);
        }
        for mode in [Mode::Log, Mode::Off] {
            let out = child(
                "seccomp::tests::log_mode_lets_a_forbidden_call_through",
                mode,
            );
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{mode:?}: {stdout}");
            assert!(stdout.contains("the thread went on (socket: "), "{stdout}");
            assert!(
                !stdout.contains("socket: -1"),
                "{mode:?}: the call ran: {stdout}"
            );
        }
    }

    /// In the child: a vCPU thread opens the file glibc's malloc reads,
    /// then makes an allowed call.
    fn library_open(mode: Mode) {
        set_mode(mode);
        check(mode).unwrap();
        let t = spawn(Kind::Vcpu, "vcpu-test".into(), || {
            let path = c"/proc/sys/vm/overcommit_memory";
            // SAFETY: a valid NUL-terminated path; the fd, if any, is closed.
            unsafe {
                let fd = libc::openat(libc::AT_FDCWD, path.as_ptr(), libc::O_RDONLY);
                let errno = std::io::Error::last_os_error().raw_os_error();
                if fd >= 0 {
                    libc::close(fd);
                }
                libc::gettid();
                (fd, errno)
            }
        })
        .unwrap();
        let (fd, errno) = t.join().unwrap();
        println!("open: fd {fd}, errno {errno:?}");
    }

    #[test]
    fn an_open_in_a_thread_that_never_opens_files_fails_without_stopping_the_vmm() {
        if let Some(mode) = child_mode() {
            return library_open(mode);
        }
        let out = child(
            "seccomp::tests::an_open_in_a_thread_that_never_opens_files_fails_without_stopping_the_vmm",
            Mode::On,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("open: fd -1, errno Some({})", libc::ENOENT)),
            "{stdout}"
        );
        // The kinds that open files still can.
        for kind in filters::KINDS {
            let prog = filters::compile(kind, Mode::On).unwrap();
            let fails_open =
                prog[4].code == 0x06 && prog[4].k == libc::SECCOMP_RET_ERRNO | libc::ENOENT as u32;
            // The boost monitor reads each vCPU thread's schedstat
            // (`--boost-when contended`).
            let opens = matches!(
                kind,
                Kind::Pager | Kind::Io | Kind::Api | Kind::Control | Kind::Boost
            );
            assert_eq!(fails_open, !opens, "{kind:?}");
        }
    }

    #[test]
    fn every_kind_compiles_in_both_modes() {
        for kind in filters::KINDS {
            for mode in [Mode::On, Mode::Log] {
                filters::compile(kind, mode).unwrap();
            }
        }
        assert!(filters::compile(Kind::Vcpu, Mode::Off).is_err());
    }

    #[test]
    fn modes_parse_from_their_flag_spelling() {
        for m in [Mode::Off, Mode::Log, Mode::On] {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
        }
        assert!("strict"
            .parse::<Mode>()
            .unwrap_err()
            .contains("off, log or on"));
    }
}
