//! Reading guest memory from another process: seed 3's setting, where the
//! migration sender is not the process that owns guest RAM and must map
//! the pages it sends. Three ways, as the seed compares them:
//!
//! - `per-page`: `mmap` one page of the guest's memfd, copy it, `munmap`
//!   (what Xen's toolstack did before batching: a mapping per page);
//! - `readv`: one `process_vm_readv` per batch, every page an iovec (the
//!   kernel walks the owner's page tables; no mapping in the sender);
//! - `persistent`: map the whole memfd once and copy from it (the cheapest
//!   per page, at the price of the whole guest mapped in the sender).
//!
//! `per-page` and `persistent` need the memfd backend (`--memory-backend
//! memfd`); `readv` needs permission to read the owner (same user, or
//! `CAP_SYS_PTRACE`; the owner allows its helper with `PR_SET_PTRACER`).

use std::io;
use std::os::fd::RawFd;

use hover_abi::layout::PAGE_SIZE;
use serde::{Deserialize, Serialize};

/// How a separate process reads guest memory (in JSON by the names
/// `--sender-process` takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MapMode {
    /// `mmap` + copy + `munmap` per page.
    PerPage,
    /// `process_vm_readv` per batch.
    Readv,
    /// One mapping of all guest memory, made once.
    Persistent,
}

impl MapMode {
    /// Every mode, in the order the benchmark shows them.
    pub const ALL: [MapMode; 3] = [MapMode::PerPage, MapMode::Readv, MapMode::Persistent];

    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MapMode::PerPage => "per-page",
            MapMode::Readv => "readv",
            MapMode::Persistent => "persistent",
        }
    }

    /// Whether the mode maps the memfd (and so needs the memfd backend).
    pub fn needs_memfd(self) -> bool {
        self != MapMode::Readv
    }
}

impl std::str::FromStr for MapMode {
    type Err = String;
    fn from_str(s: &str) -> Result<MapMode, String> {
        MapMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown mapping '{s}': use per-page, readv or persistent"))
    }
}

/// One RAM region of the owner, as the reader sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Guest-physical start.
    pub gpa: u64,
    /// Length, bytes.
    pub len: u64,
    /// Its address in the owner's address space.
    pub addr: u64,
    /// The memfd holding it, in the reader's process (-1: none).
    pub fd: RawFd,
    /// Where the region starts in the memfd.
    pub offset: u64,
}

impl Region {
    /// `gpa:len:addr:fd:offset`, for a command line.
    pub fn to_arg(&self) -> String {
        format!(
            "{:#x}:{:#x}:{:#x}:{}:{:#x}",
            self.gpa, self.len, self.addr, self.fd, self.offset
        )
    }

    /// The inverse of [`Self::to_arg`].
    pub fn parse(s: &str) -> Result<Region, RegionArgError> {
        let p: Vec<&str> = s.split(':').collect();
        let [gpa, len, addr, fd, offset] = p[..] else {
            return Err(RegionArgError::Fields(s.to_string()));
        };
        let number = |source| RegionArgError::Number {
            arg: s.to_string(),
            source,
        };
        let n = |v: &str| {
            let v = v.trim_start_matches("0x");
            u64::from_str_radix(v, 16).map_err(number)
        };
        Ok(Region {
            gpa: n(gpa)?,
            len: n(len)?,
            addr: n(addr)?,
            fd: fd.parse().map_err(number)?,
            offset: n(offset)?,
        })
    }

    fn holds(&self, gpa: u64) -> bool {
        gpa >= self.gpa && gpa + PAGE_SIZE <= self.gpa + self.len
    }
}

/// A `--region` argument that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum RegionArgError {
    /// Not five fields.
    #[error("region '{0}': expected gpa:len:addr:fd:offset")]
    Fields(String),
    /// A field that is not a number.
    #[error("region '{arg}': {source}")]
    Number {
        /// The argument.
        arg: String,
        /// The field's parse error.
        source: std::num::ParseIntError,
    },
}

/// Reads pages of another process's guest memory.
pub struct RemoteMemory {
    mode: MapMode,
    pid: libc::pid_t,
    regions: Vec<Region>,
    /// With `persistent`: each region's mapping here.
    maps: Vec<*mut u8>,
    local: Vec<libc::iovec>,
    remote: Vec<libc::iovec>,
}

// SAFETY: the raw pointers are mappings owned by this value, used only
// through `&mut self`.
unsafe impl Send for RemoteMemory {}

impl RemoteMemory {
    /// A reader of `pid`'s `regions` by `mode` (maps them now with
    /// `persistent`).
    pub fn new(mode: MapMode, pid: libc::pid_t, regions: Vec<Region>) -> io::Result<Self> {
        let mut maps = Vec::new();
        if mode.needs_memfd() {
            if let Some(r) = regions.iter().find(|r| r.fd < 0) {
                return Err(io::Error::other(format!(
                    "mapping '{}' needs guest RAM in a memfd (--memory-backend memfd); the region at {:#x} has none",
                    mode.name(),
                    r.gpa
                )));
            }
        }
        if mode == MapMode::Persistent {
            for r in &regions {
                maps.push(map(r.fd, r.offset, r.len as usize)?);
            }
        }
        Ok(RemoteMemory {
            mode,
            pid,
            regions,
            maps,
            local: Vec::new(),
            remote: Vec::new(),
        })
    }

    fn region(&self, gpa: u64) -> io::Result<usize> {
        self.regions
            .iter()
            .position(|r| r.holds(gpa))
            .ok_or_else(|| io::Error::other(format!("page {gpa:#x} is outside guest memory")))
    }

    /// Read the pages at `gpas` into `out` (one page each, in order).
    pub fn read(&mut self, gpas: &[u64], out: &mut [u8]) -> io::Result<()> {
        let ps = PAGE_SIZE as usize;
        assert!(out.len() >= gpas.len() * ps, "room for every page");
        match self.mode {
            MapMode::PerPage => {
                for (&gpa, page) in gpas.iter().zip(out.chunks_exact_mut(ps)) {
                    let r = self.regions[self.region(gpa)?];
                    let p = map(r.fd, r.offset + (gpa - r.gpa), ps)?;
                    // SAFETY: `p` maps one readable page; `page` is a page.
                    unsafe {
                        std::ptr::copy_nonoverlapping(p, page.as_mut_ptr(), ps);
                        libc::munmap(p.cast(), ps);
                    }
                }
            }
            MapMode::Persistent => {
                for (&gpa, page) in gpas.iter().zip(out.chunks_exact_mut(ps)) {
                    let i = self.region(gpa)?;
                    let off = (gpa - self.regions[i].gpa) as usize;
                    // SAFETY: the page lies in region i's mapping (checked
                    // by `region`), which lives as long as `self`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(self.maps[i].add(off), page.as_mut_ptr(), ps)
                    };
                }
            }
            MapMode::Readv => self.readv(gpas, out)?,
        }
        Ok(())
    }

    fn readv(&mut self, gpas: &[u64], out: &mut [u8]) -> io::Result<()> {
        let ps = PAGE_SIZE as usize;
        // The kernel takes at most IOV_MAX iovecs per side and call.
        const IOV_MAX: usize = 1024;
        for (chunk, buf) in gpas.chunks(IOV_MAX).zip(out.chunks_mut(IOV_MAX * ps)) {
            self.local.clear();
            self.remote.clear();
            for (&gpa, page) in chunk.iter().zip(buf.chunks_exact_mut(ps)) {
                let r = self.regions[self.region(gpa)?];
                self.local.push(libc::iovec {
                    iov_base: page.as_mut_ptr().cast(),
                    iov_len: ps,
                });
                self.remote.push(libc::iovec {
                    iov_base: (r.addr + (gpa - r.gpa)) as *mut libc::c_void,
                    iov_len: ps,
                });
            }
            let want = chunk.len() * ps;
            // SAFETY: every local iovec is a page of `out`; remote ones are
            // only read by the kernel, in the other process.
            let n = unsafe {
                libc::process_vm_readv(
                    self.pid,
                    self.local.as_ptr(),
                    self.local.len() as libc::c_ulong,
                    self.remote.as_ptr(),
                    self.remote.len() as libc::c_ulong,
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            if n as usize != want {
                return Err(io::Error::other(format!(
                    "process_vm_readv read {n} of {want} bytes"
                )));
            }
        }
        Ok(())
    }
}

impl Drop for RemoteMemory {
    fn drop(&mut self) {
        for (p, r) in self.maps.iter().zip(&self.regions) {
            // SAFETY: our own mappings, made in `new` with these lengths.
            unsafe { libc::munmap(p.cast(), r.len as usize) };
        }
    }
}

fn map(fd: RawFd, offset: u64, len: usize) -> io::Result<*mut u8> {
    // SAFETY: a new shared read-only mapping of a file we were given; the
    // kernel checks the descriptor and the range.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p.cast())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A memfd of `pages` pages, page i filled with byte i+1, mapped here.
    fn guest(pages: usize) -> (std::fs::File, *mut u8) {
        // SAFETY: creating an anonymous file.
        let fd = unsafe { libc::memfd_create(c"test".as_ptr(), 0) };
        assert!(fd >= 0);
        // SAFETY: we own fd.
        let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        f.set_len((pages * 4096) as u64).unwrap();
        // SAFETY: a fresh shared mapping of our memfd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pages * 4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } as *mut u8;
        for i in 0..pages {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::write_bytes(p.add(i * 4096), i as u8 + 1, 4096) };
        }
        (f, p)
    }

    #[test]
    fn every_mode_reads_the_same_pages() {
        let (f, p) = guest(8);
        // Two regions: pages 0-3 at gpa 0, pages 4-7 at gpa 1 MiB.
        let regions = vec![
            Region {
                gpa: 0,
                len: 4 * 4096,
                addr: p as u64,
                fd: f.as_raw_fd(),
                offset: 0,
            },
            Region {
                gpa: 1 << 20,
                len: 4 * 4096,
                addr: p as u64 + 4 * 4096,
                fd: f.as_raw_fd(),
                offset: 4 * 4096,
            },
        ];
        let gpas = [3 * 4096, (1 << 20) + 4096, 0];
        for mode in MapMode::ALL {
            let mut m =
                RemoteMemory::new(mode, std::process::id() as i32, regions.clone()).unwrap();
            let mut out = vec![0u8; 3 * 4096];
            m.read(&gpas, &mut out).unwrap();
            for (page, want) in out.chunks(4096).zip([4u8, 6, 1]) {
                assert!(page.iter().all(|&b| b == want), "{mode:?}");
            }
            let e = m.read(&[2 << 20], &mut out).unwrap_err();
            assert!(e.to_string().contains("outside"), "{mode:?}: {e}");
        }
        // SAFETY: our mapping.
        unsafe { libc::munmap(p.cast(), 8 * 4096) };
    }

    #[test]
    fn mapping_modes_need_a_memfd() {
        let r = Region {
            gpa: 0,
            len: 4096,
            addr: 0,
            fd: -1,
            offset: 0,
        };
        let e = RemoteMemory::new(MapMode::PerPage, 1, vec![r])
            .err()
            .unwrap();
        assert!(e.to_string().contains("memfd"), "{e}");
        assert!(RemoteMemory::new(MapMode::Readv, 1, vec![r]).is_ok());
    }

    #[test]
    fn regions_round_trip_through_arguments() {
        let r = Region {
            gpa: 0x1_0000_0000,
            len: 0x4000_0000,
            addr: 0x7f00_0000_0000,
            fd: 7,
            offset: 0xc000_0000,
        };
        assert_eq!(Region::parse(&r.to_arg()).unwrap(), r);
        assert!(Region::parse("1:2:3").is_err());
        assert_eq!("readv".parse::<MapMode>().unwrap(), MapMode::Readv);
        assert!("mmap".parse::<MapMode>().is_err());
    }
}
