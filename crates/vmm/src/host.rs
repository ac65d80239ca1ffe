//! What this host offers and reports: whether KVM can be used, random bytes,
//! a thread's CPU time; and, for test binaries, a watchdog.

use std::io;
use std::path::Path;

pub mod files;
pub mod log_budget;
pub mod socket;
pub mod watchdog;

/// Block SIGXFSZ in the calling thread (and so in every thread it starts
/// from now on): a write past a file-size limit (page store, I/O device
/// file, snapshot) then fails with EFBIG, which is reported, instead of
/// killing the process. Only the thread's mask changes: the process's
/// signal dispositions are the embedding program's business. SIGXFSZ is
/// sent to the thread that wrote, so blocking it there is enough.
pub fn block_file_size_signal() {
    // SAFETY: the set is initialised by sigemptyset before use, and
    // pthread_sigmask only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGXFSZ);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// The KVM device.
pub const KVM_DEVICE: &str = "/dev/kvm";

/// Why `/dev/kvm` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KvmUnusable {
    /// No such device (no KVM module, or a container without it).
    #[error("{KVM_DEVICE} does not exist")]
    Missing,
    /// It is there but this user cannot open it read-write.
    #[error("{KVM_DEVICE} cannot be opened: {0}")]
    Open(std::io::Error),
}

/// Whether `/dev/kvm` exists and can be opened read-write.
pub fn kvm_usable() -> Result<(), KvmUnusable> {
    if !Path::new(KVM_DEVICE).exists() {
        return Err(KvmUnusable::Missing);
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(KVM_DEVICE)
        .map(|_| ())
        .map_err(KvmUnusable::Open)
}

/// For tests that boot a VM: `true` to go ahead. Without usable KVM the test
/// is skipped with a printed reason, unless `CI` is set, where it fails:
/// CI must never pass by skipping. Arms the test binary's [`watchdog`].
pub fn kvm_for_test(test: &str) -> bool {
    watchdog::arm();
    match kvm_usable() {
        Ok(()) => true,
        Err(why) if std::env::var_os("CI").is_some() => panic!("{test}: CI is set but {why}"),
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

/// Fill `buf` from the kernel's random source.
pub fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most the rest of `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            done += n as usize;
        }
    }
    Ok(())
}

/// CPU time (user + system) the calling thread has used, microseconds
/// (0 if the kernel will not say).
pub fn thread_cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct it is given; the result is checked.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}
