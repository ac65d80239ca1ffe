//! The SIGSYS handler for `--seccomp on`: says which thread made which
//! forbidden call, then ends the process. It runs under the offending
//! thread's filter, so it makes only calls every filter allows (`write`,
//! `exit_group`) and allocates nothing.

use std::cell::Cell;
use std::sync::Once;

use super::Kind;

const NAME_LEN: usize = 16;

thread_local! {
    /// This thread's name and kind, for the handler (which cannot ask).
    static WHO: Cell<([u8; NAME_LEN], usize, &'static str)> =
        const { Cell::new(([0; NAME_LEN], 0, "")) };
}

/// Remember the calling thread's name and kind for the message.
pub(super) fn name_this_thread(kind: Kind) {
    let t = std::thread::current();
    let name = t.name().unwrap_or("?").as_bytes();
    let mut buf = [0u8; NAME_LEN];
    let n = name.len().min(NAME_LEN);
    buf[..n].copy_from_slice(&name[..n]);
    WHO.with(|w| w.set((buf, n, kind.name())));
}

/// Install the handler (once per process).
pub(super) fn install() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        // SAFETY: a zeroed sigaction with a handler, SA_SIGINFO and an
        // empty mask is valid; the handler is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigsys as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(libc::SIGSYS, &sa, std::ptr::null_mut()) != 0 {
                result = Err(std::io::Error::last_os_error());
            }
        }
    });
    result
}

/// A fixed buffer to format the message in, without allocating.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }

    fn number(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

/// The message for a forbidden call `nr` by thread `name` of kind `kind`.
fn message(nr: i64, name: &[u8], kind: &str) -> Line {
    let mut l = Line {
        buf: [0; 256],
        len: 0,
    };
    l.push(b"hover: error: seccomp: thread '");
    l.push(name);
    l.push(b"' (");
    l.push(kind.as_bytes());
    l.push(b" filter) made the forbidden system call ");
    l.push(syscall_name(nr).as_bytes());
    l.push(b" (");
    l.number(nr as u64);
    l.push(b"); stopping the VMM (--seccomp log lets it through and has the kernel log it)\n");
    l
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // siginfo_t for SIGSYS on x86_64: si_call_addr at byte 16, si_syscall
    // (an int) at byte 24 (the libc crate has no accessor for it).
    // SAFETY: the kernel passes a valid siginfo_t with SA_SIGINFO.
    let nr = unsafe { (info as *const u8).add(24).cast::<i32>().read_unaligned() } as i64;
    let (buf, n, kind) = WHO.with(|w| w.get());
    let l = message(nr, &buf[..n], kind);
    // SAFETY: write and _exit are async-signal-safe, and every filter
    // allows them.
    unsafe {
        libc::write(2, l.buf.as_ptr().cast(), l.len);
        libc::_exit(1);
    }
}

macro_rules! names {
    ($($s:ident),* $(,)?) => {
        &[$((libc::$s, stringify!($s)),)*]
    };
}

/// Names of the calls a VMM thread might make by mistake (the rest are
/// shown as numbers).
const NAMES: &[(i64, &str)] = names![
    SYS_read,
    SYS_write,
    SYS_open,
    SYS_close,
    SYS_stat,
    SYS_fstat,
    SYS_lstat,
    SYS_poll,
    SYS_lseek,
    SYS_mmap,
    SYS_mprotect,
    SYS_munmap,
    SYS_brk,
    SYS_ioctl,
    SYS_pread64,
    SYS_pwrite64,
    SYS_readv,
    SYS_writev,
    SYS_access,
    SYS_pipe,
    SYS_select,
    SYS_madvise,
    SYS_dup,
    SYS_dup2,
    SYS_nanosleep,
    SYS_getpid,
    SYS_sendfile,
    SYS_socket,
    SYS_connect,
    SYS_accept,
    SYS_sendto,
    SYS_recvfrom,
    SYS_sendmsg,
    SYS_recvmsg,
    SYS_shutdown,
    SYS_bind,
    SYS_listen,
    SYS_clone,
    SYS_fork,
    SYS_vfork,
    SYS_execve,
    SYS_exit,
    SYS_wait4,
    SYS_kill,
    SYS_uname,
    SYS_fcntl,
    SYS_fsync,
    SYS_fdatasync,
    SYS_truncate,
    SYS_ftruncate,
    SYS_getdents64,
    SYS_getcwd,
    SYS_chdir,
    SYS_rename,
    SYS_mkdir,
    SYS_rmdir,
    SYS_link,
    SYS_unlink,
    SYS_symlink,
    SYS_readlink,
    SYS_chmod,
    SYS_chown,
    SYS_umask,
    SYS_ptrace,
    SYS_getuid,
    SYS_setuid,
    SYS_setgid,
    SYS_prctl,
    SYS_mount,
    SYS_umount2,
    SYS_reboot,
    SYS_gettid,
    SYS_tkill,
    SYS_futex,
    SYS_sched_setaffinity,
    SYS_sched_getaffinity,
    SYS_openat,
    SYS_unlinkat,
    SYS_renameat,
    SYS_ppoll,
    SYS_splice,
    SYS_tee,
    SYS_process_vm_readv,
    SYS_process_vm_writev,
    SYS_tgkill,
    SYS_bpf,
    SYS_memfd_create,
    SYS_userfaultfd,
    SYS_clone3,
    SYS_statx,
    SYS_getrandom,
    SYS_pidfd_open,
    SYS_io_uring_setup,
    SYS_init_module,
    SYS_finit_module,
    SYS_keyctl,
    SYS_perf_event_open,
    SYS_seccomp,
    SYS_setpriority,
    SYS_sched_setscheduler,
    SYS_accept4,
    SYS_epoll_wait,
    SYS_eventfd2,
    SYS_getsockname,
    SYS_getpeername,
    SYS_setsockopt,
    SYS_getsockopt,
    SYS_recvmmsg,
    SYS_sendmmsg,
    SYS_newfstatat,
    SYS_fstatfs,
    SYS_statfs,
    SYS_sysinfo,
    SYS_times,
    SYS_getrusage,
];

fn syscall_name(nr: i64) -> &'static str {
    NAMES
        .iter()
        .find(|(n, _)| *n == nr)
        .map_or("?", |(_, name)| name.trim_start_matches("SYS_"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_thread_its_kind_and_the_call() {
        let l = message(libc::SYS_socket, b"vcpu0", "vcpu");
        let s = std::str::from_utf8(&l.buf[..l.len]).unwrap();
        assert_eq!(
            s,
            "hover: error: seccomp: thread 'vcpu0' (vcpu filter) made the forbidden system call socket (41); stopping the VMM (--seccomp log lets it through and has the kernel log it)\n"
        );
        let l = message(9999, b"x", "api");
        assert!(std::str::from_utf8(&l.buf[..l.len])
            .unwrap()
            .contains("call ? (9999)"));
    }
}
