//! A small wrapper over userfaultfd(2): the calls the pager needs, including
//! `UFFDIO_MOVE` (Linux 6.8+) and `UFFDIO_WRITEPROTECT` (5.7+ on anonymous
//! memory), which the `userfaultfd` crate lacks.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use vmm_sys_util::ioctl::ioctl_with_mut_ref;

const UFFD_API: u64 = 0xAA;
const UFFDIO: u32 = 0xAA;
/// Feature bit: `UFFDIO_MOVE`.
pub const FEATURE_MOVE: u64 = 1 << 16;
/// Feature bit: write-protect faults are reported as such
/// (`UFFD_FEATURE_PAGEFAULT_FLAG_WP`; with it, `REGISTER_MODE_WP` works on
/// anonymous memory).
pub const FEATURE_WP: u64 = 1 << 0;
const REGISTER_MODE_MISSING: u64 = 1;
const REGISTER_MODE_WP: u64 = 2;
const WRITEPROTECT_MODE_WP: u64 = 1;
const EVENT_PAGEFAULT: u8 = 0x12;
const MSG_SIZE: usize = 32;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
#[derive(Default)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

mod ioctls {
    #![allow(missing_docs)]
    use super::*;
    use vmm_sys_util::{ioctl_ior_nr, ioctl_iowr_nr};
    ioctl_iowr_nr!(UFFDIO_API, UFFDIO, 0x3f, UffdioApi);
    ioctl_iowr_nr!(UFFDIO_REGISTER, UFFDIO, 0x00, UffdioRegister);
    ioctl_ior_nr!(UFFDIO_UNREGISTER, UFFDIO, 0x01, UffdioRange);
    ioctl_ior_nr!(UFFDIO_WAKE, UFFDIO, 0x02, UffdioRange);
    ioctl_iowr_nr!(UFFDIO_COPY, UFFDIO, 0x03, UffdioCopy);
    ioctl_iowr_nr!(UFFDIO_MOVE, UFFDIO, 0x05, UffdioMove);
    ioctl_iowr_nr!(UFFDIO_WRITEPROTECT, UFFDIO, 0x06, UffdioWriteprotect);
}
use ioctls::*;

/// A userfaultfd.
pub struct Uffd(OwnedFd);

pub use crate::config::EvictMode;

/// A userfaultfd for the pager and the way it evicts: `want`, or (None)
/// `UFFDIO_MOVE` where the kernel has it, else write-protection.
pub fn open_for_pager(want: Option<EvictMode>) -> io::Result<(Uffd, EvictMode)> {
    let open = |m: EvictMode| {
        let features = match m {
            EvictMode::Move => FEATURE_MOVE,
            EvictMode::WriteProtect => FEATURE_WP,
        };
        Uffd::new(features).map(|u| (u, m))
    };
    match want {
        Some(m) => open(m),
        None => open(EvictMode::Move).or_else(|moving| {
            open(EvictMode::WriteProtect).map_err(|wp| {
                io::Error::new(
                    wp.kind(),
                    format!("no UFFDIO_MOVE ({moving}) and no write-protection ({wp})"),
                )
            })
        }),
    }
}

/// Whether this process may run a pager: a userfaultfd opens with
/// UFFDIO_MOVE (Linux 6.8+) or write-protection (5.7+), given
/// `vm.unprivileged_userfaultfd=1` or CAP_SYS_PTRACE (a seccomp profile
/// may refuse the call).
pub fn pager_usable() -> io::Result<()> {
    open_for_pager(None).map(drop)
}

fn check(rc: i32) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Open a userfaultfd (non-blocking) with `features`, which must all be offered.
    pub fn new(features: u64) -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let fd =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let uffd = Uffd(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a uffdio_api, which `api` is.
        check(unsafe { ioctl_with_mut_ref(&uffd.0, UFFDIO_API(), &mut api) })?;
        if api.features & features != features {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("userfaultfd lacks features {:#x}", features & !api.features),
            ));
        }
        Ok(uffd)
    }

    /// Report missing-page faults in `[addr, addr + len)` to this fd.
    pub fn register_missing(&self, addr: u64, len: u64) -> io::Result<()> {
        self.register(addr, len, false)
    }

    /// Report missing-page faults in `[addr, addr + len)`, and with `wp`
    /// writes to pages write-protected by [`Self::write_protect`].
    pub fn register(&self, addr: u64, len: u64, wp: bool) -> io::Result<()> {
        let mut r = UffdioRegister {
            range: UffdioRange { start: addr, len },
            mode: REGISTER_MODE_MISSING | if wp { REGISTER_MODE_WP } else { 0 },
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a uffdio_register.
        check(unsafe { ioctl_with_mut_ref(&self.0, UFFDIO_REGISTER(), &mut r) })
    }

    /// Stop reporting faults in `[addr, addr + len)`. Threads waiting on a
    /// fault there are woken, and take it again as ordinary faults the
    /// kernel serves (a missing anonymous page becomes a zeroed one).
    pub fn unregister(&self, addr: u64, len: u64) -> io::Result<()> {
        let mut r = UffdioRange { start: addr, len };
        // SAFETY: UFFDIO_UNREGISTER reads a uffdio_range.
        check(unsafe { ioctl_with_mut_ref(&self.0, UFFDIO_UNREGISTER(), &mut r) })
    }

    /// Fill the missing page(s) at `dst` with a copy of `src` and wake the
    /// threads waiting on them. `Ok(false)`: a page was already there (it
    /// is kept; the pages after it in the run are copied all the same).
    pub fn copy(&self, dst: u64, src: *const u8, len: u64) -> io::Result<bool> {
        const PAGE: u64 = hover_abi::layout::PAGE_SIZE;
        let (mut dst, mut src, mut len) = (dst, src as u64, len);
        let mut all_new = true;
        loop {
            let mut c = UffdioCopy {
                dst,
                src,
                len,
                mode: 0,
                copy: 0,
            };
            // SAFETY: UFFDIO_COPY reads `len` bytes at src (the caller's
            // buffer) and writes only into the registered range.
            let rc = unsafe { ioctl_with_mut_ref(&self.0, UFFDIO_COPY(), &mut c) };
            if rc == 0 {
                return Ok(all_new);
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EEXIST) => {
                    // The first page is there already: wake whoever waits
                    // on it and carry on after it.
                    self.wake(dst, PAGE.min(len))?;
                    all_new = false;
                    if len <= PAGE {
                        return Ok(false);
                    }
                    (dst, src, len) = (dst + PAGE, src + PAGE, len - PAGE);
                }
                // The address space changed under the copy: go on from
                // where it stopped (a run of pages may be partly copied).
                Some(libc::EAGAIN) => {
                    if c.copy > 0 {
                        let done = (c.copy as u64).min(len);
                        (dst, src, len) = (dst + done, src + done, len - done);
                        if len == 0 {
                            return Ok(all_new);
                        }
                    }
                }
                _ => return Err(err),
            }
        }
    }

    /// Wake threads waiting on `[addr, addr + len)`.
    pub fn wake(&self, addr: u64, len: u64) -> io::Result<()> {
        let mut r = UffdioRange { start: addr, len };
        // SAFETY: UFFDIO_WAKE reads a uffdio_range.
        check(unsafe { ioctl_with_mut_ref(&self.0, UFFDIO_WAKE(), &mut r) })
    }

    /// Write-protect `[addr, addr + len)` (`on`), or lift the protection
    /// and wake the writers waiting on it. The range must be registered
    /// with `wp`.
    pub fn write_protect(&self, addr: u64, len: u64, on: bool) -> io::Result<()> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange { start: addr, len },
            mode: if on { WRITEPROTECT_MODE_WP } else { 0 },
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads a uffdio_writeprotect.
        check(unsafe { ioctl_with_mut_ref(&self.0, UFFDIO_WRITEPROTECT(), &mut w) })
    }

    /// Atomically move the page(s) at `src` to the (registered, empty) `dst`:
    /// afterwards `src` is missing, so any access to it faults to this fd.
    pub fn move_pages(&self, dst: u64, src: u64, len: u64) -> io::Result<()> {
        let mut m = UffdioMove {
            dst,
            src,
            len,
            mode: 0,
            moved: 0,
        };
        // SAFETY: UFFDIO_MOVE reads and writes a uffdio_move; both ranges are
        // anonymous mappings of this process.
        check(unsafe { ioctl_with_mut_ref(&self.0, UFFDIO_MOVE(), &mut m) })
    }

    /// Read pending page-fault addresses (non-blocking; empty when none).
    pub fn read_faults(&self, out: &mut Vec<u64>) -> io::Result<()> {
        let mut buf = [0u8; MSG_SIZE * 64];
        loop {
            // SAFETY: reading into a buffer we own.
            let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(()),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            for msg in buf[..n as usize].chunks_exact(MSG_SIZE) {
                if msg[0] == EVENT_PAGEFAULT {
                    out.push(u64::from_le_bytes(msg[16..24].try_into().expect("8 bytes")));
                }
            }
            if (n as usize) < buf.len() {
                return Ok(());
            }
        }
    }
}

impl AsRawFd for Uffd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Map, register, fault from another thread, copy, then move a page out
    /// and back: the kernel calls behave as the pager relies on.
    #[test]
    fn copy_and_move_round_trip() {
        let uffd = match Uffd::new(FEATURE_MOVE) {
            Ok(u) => u,
            Err(e) if std::env::var_os("CI").is_some() => {
                panic!("CI is set but userfaultfd with UFFDIO_MOVE is unavailable: {e}")
            }
            Err(e) => {
                eprintln!("skipping: userfaultfd with UFFDIO_MOVE unavailable: {e}");
                return;
            }
        };
        let len = 2 * 4096usize;
        // SAFETY: a fresh anonymous mapping; checked below.
        let area = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(area, libc::MAP_FAILED);
        let (page, staging) = (area as u64, area as u64 + 4096);
        uffd.register_missing(page, len as u64).unwrap();
        let reader =
            std::thread::spawn(move || unsafe { std::ptr::read_volatile(page as *const u64) });
        let mut faults = Vec::new();
        while faults.is_empty() {
            uffd.read_faults(&mut faults).unwrap();
            std::thread::yield_now();
        }
        assert_eq!(faults[0] & !4095, page);
        let src = Box::new([0x5au8; 4096]);
        assert!(uffd.copy(page, src.as_ptr(), 4096).unwrap());
        assert_eq!(reader.join().unwrap(), 0x5a5a_5a5a_5a5a_5a5a);
        uffd.move_pages(staging, page, 4096).unwrap();
        // SAFETY: staging now holds the moved page.
        assert_eq!(
            unsafe { std::ptr::read_volatile(staging as *const u8) },
            0x5a
        );
        uffd.move_pages(page, staging, 4096).unwrap();
        // SAFETY: the page is back.
        assert_eq!(unsafe { std::ptr::read_volatile(page as *const u8) }, 0x5a);
        // Unregistered, the missing page is the kernel's again: a touch
        // reads zeros, nothing is reported here, nobody waits.
        uffd.move_pages(staging, page, 4096).unwrap();
        uffd.unregister(page, len as u64).unwrap();
        // SAFETY: the page is missing and no longer registered.
        assert_eq!(unsafe { std::ptr::read_volatile(page as *const u64) }, 0);
        // SAFETY: unmapping what we mapped.
        unsafe { libc::munmap(area, len) };
    }
}
