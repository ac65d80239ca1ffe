//! The page store: where evicted guest pages live, one 4 KiB slot per guest
//! page at offset `page_index * 4096` of a (sparse) file. Opened with
//! O_DIRECT where the file system allows it, so that a read costs what the
//! device costs rather than a page-cache hit.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hover_abi::layout::PAGE_SIZE;

use super::aio::Aio;

/// A page-aligned page buffer, as O_DIRECT requires.
#[repr(C, align(4096))]
pub struct PageBuf(pub [u8; PAGE_SIZE as usize]);

// `PageBufs` reads a `Vec<PageBuf>` as bytes: no padding between pages.
const _: () = assert!(std::mem::size_of::<PageBuf>() == PAGE_SIZE as usize);

impl PageBuf {
    /// A zeroed buffer on the heap.
    pub fn new() -> Box<PageBuf> {
        Box::new(PageBuf([0; PAGE_SIZE as usize]))
    }
}

/// Whole pages in one page-aligned buffer, for copies of many pages at a
/// time. Alignment is about speed as much as O_DIRECT: on the hosts we
/// measured, the kernel copies a file's pages into a buffer 16 bytes off a
/// page boundary (where a plain `Vec<u8>` starts) about 6x slower than
/// into an aligned one (64 MiB: 38 ms against 6 ms).
pub struct PageBufs(Vec<PageBuf>);

impl PageBufs {
    /// `pages` zeroed pages.
    pub fn new(pages: usize) -> Self {
        PageBufs(
            (0..pages)
                .map(|_| PageBuf([0; PAGE_SIZE as usize]))
                .collect(),
        )
    }

    /// The pages' bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `PageBuf` is a `repr(C)` byte array whose size equals its
        // alignment, so a `Vec` of them is one contiguous run of bytes.
        unsafe {
            std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * PAGE_SIZE as usize)
        }
    }

    /// The pages' bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.0.as_mut_ptr().cast(),
                self.0.len() * PAGE_SIZE as usize,
            )
        }
    }
}

/// Why the page store could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Creating or writing the file failed.
    #[error("page store {}: cannot create or write it: {source}", .path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The path names something that exists and is not a directory.
    #[error("page store {}: already exists; give a new file name or a directory to create the store in", .path.display())]
    Exists {
        /// The path.
        path: PathBuf,
    },
    /// Not enough free space for every page that can be evicted.
    #[error("page store {}: {} MiB free on its file system, but up to {} MiB of guest memory may be evicted there", .path.display(), .free >> 20, .needed >> 20)]
    Full {
        /// The file.
        path: PathBuf,
        /// Free bytes.
        free: u64,
        /// Bytes that may be needed.
        needed: u64,
    },
}

/// An open page store. The store always creates its file itself (it never
/// opens an existing one, so it cannot clobber or delete anything it did not
/// make) and unlinks it as soon as it is open: it lives on through its
/// descriptor only, and goes with the process however that ends.
pub struct PageStore {
    file: File,
    path: PathBuf,
    direct: bool,
}

/// Where a temporary store goes by default: /var/tmp (a disk, usually) rather
/// than /tmp (often tmpfs, where O_DIRECT is refused and reads cost nothing).
pub fn default_dir() -> PathBuf {
    let var_tmp = Path::new("/var/tmp");
    if var_tmp.is_dir() {
        var_tmp.into()
    } else {
        std::env::temp_dir()
    }
}

impl PageStore {
    /// Create the store at `path` (a new file to create, or an existing
    /// directory to create a file in; `None`: a temporary file in
    /// [`default_dir`]), with room for `capacity` bytes of evicted pages. An
    /// existing file, device or other non-directory is refused.
    pub fn create(path: Option<&Path>, capacity: u64) -> Result<Self, StoreError> {
        let (dir, path) = match path {
            Some(p) if p.is_dir() => (p.to_path_buf(), unique_in(p)),
            Some(p) => {
                if p.symlink_metadata().is_ok() {
                    return Err(StoreError::Exists { path: p.into() });
                }
                let parent = match p.parent() {
                    Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                    _ => PathBuf::from("."),
                };
                (parent, p.to_path_buf())
            }
            None => {
                let d = default_dir();
                (d.clone(), unique_in(&d))
            }
        };
        let unwritable = |source| StoreError::Unwritable {
            path: path.clone(),
            source,
        };
        // A file without a name in the store's directory (O_TMPFILE): there
        // is no moment at which a killed VMM could leave it behind. Where
        // the file system has no such files, a named one, unlinked at once.
        let (file, direct) = match unnamed_in(&dir) {
            Ok(opened) => opened,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::EISDIR)
                ) =>
            {
                named_then_unlinked(&path)?
            }
            Err(e) => return Err(unwritable(e)),
        };
        let store = PageStore {
            file,
            path: path.clone(),
            direct,
        };
        // Prove the file takes writes now rather than at the first eviction.
        store.write(0, &PageBuf::new()).map_err(unwritable)?;
        let free = free_bytes(&store.file).map_err(unwritable)?;
        if free < capacity {
            return Err(StoreError::Full {
                path,
                free,
                needed: capacity,
            });
        }
        Ok(store)
    }

    /// The name the file had (unlinked once the store is set up: it lives
    /// on through its descriptor only).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether reads and writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Read slot `index` into `buf`.
    pub fn read(&self, index: u64, buf: &mut PageBuf) -> io::Result<()> {
        self.file.read_exact_at(&mut buf.0, index * PAGE_SIZE)
    }

    /// Write `buf` to slot `index`.
    pub fn write(&self, index: u64, buf: &PageBuf) -> io::Result<()> {
        // SAFETY: a PageBuf is a readable, page-aligned page.
        unsafe { self.write_raw(index, buf.0.as_ptr()) }
    }

    /// Write the page at `src` to slot `index`.
    ///
    /// # Safety
    /// `src` must point to a readable, page-aligned 4 KiB page.
    pub unsafe fn write_raw(&self, index: u64, src: *const u8) -> io::Result<()> {
        // SAFETY: guaranteed by the caller.
        let page = unsafe { std::slice::from_raw_parts(src, PAGE_SIZE as usize) };
        self.file.write_all_at(page, index * PAGE_SIZE)
    }

    /// Free slot `index` (its page was dropped): the file's block goes
    /// back to the file system. Best effort: a file system without hole
    /// punching keeps the block, which is never read again.
    pub fn forget(&self, index: u64) {
        // SAFETY: fallocate on our own file; no memory is passed.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (index * PAGE_SIZE) as libc::off_t,
                PAGE_SIZE as libc::off_t,
            )
        };
        if rc != 0 {
            tracing::debug!(
                "page store: slot {index} kept: {}",
                io::Error::last_os_error()
            );
        }
    }

    /// Write a batch of pages, each `(slot, page)`: through `aio` when
    /// given (the batch submitted at once), else one `pwrite` each. One
    /// result per page, in order.
    ///
    /// # Safety
    /// Each page must point to a readable, page-aligned 4 KiB page that
    /// stays valid and unchanged until this returns.
    pub unsafe fn write_batch(
        &self,
        aio: Option<&Aio>,
        pages: &[(u64, *const u8)],
    ) -> Vec<io::Result<()>> {
        match aio {
            Some(aio) => {
                let at: Vec<(u64, *const u8)> = pages
                    .iter()
                    .map(|&(slot, src)| (slot * PAGE_SIZE, src))
                    .collect();
                // SAFETY: guaranteed by the caller.
                unsafe { aio.write_pages(self.file.as_raw_fd(), &at) }
            }
            // SAFETY: guaranteed by the caller.
            None => pages
                .iter()
                .map(|&(slot, src)| unsafe { self.write_raw(slot, src) })
                .collect(),
        }
    }
}

/// A new file without a name in `dir` (O_TMPFILE, mode 0600), with
/// O_DIRECT where the file system allows; whether it is direct.
fn unnamed_in(dir: &Path) -> io::Result<(File, bool)> {
    let open = |direct: bool| {
        let flags = libc::O_TMPFILE | if direct { libc::O_DIRECT } else { 0 };
        OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(flags)
            .open(dir)
    };
    match open(true) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::warn!(
                "page store in {}: O_DIRECT refused (tmpfs?), using buffered I/O",
                dir.display()
            );
            open(false).map(|f| (f, false))
        }
        Err(e) => Err(e),
    }
}

/// The file at `path`, created new (an existing one is refused) and its
/// name removed at once: for a file system without O_TMPFILE.
fn named_then_unlinked(path: &Path) -> Result<(File, bool), StoreError> {
    let unwritable = |source| StoreError::Unwritable {
        path: path.to_path_buf(),
        source,
    };
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.read(true).write(true).create_new(true).mode(0o600);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(path)
    };
    let (file, direct) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            // Does the failed O_DIRECT open leave the file behind? Open
            // it without O_CREAT if so, so the file is created only once.
            let f = match open(false) {
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    OpenOptions::new().read(true).write(true).open(path)
                }
                other => other,
            };
            (f.map_err(unwritable)?, false)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(StoreError::Exists { path: path.into() });
        }
        Err(e) => return Err(unwritable(e)),
    };
    // Only the descriptor is used from here: with the name gone at once,
    // the file goes with the process however it ends.
    std::fs::remove_file(path).map_err(unwritable)?;
    Ok((file, direct))
}

fn unique_in(dir: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    dir.join(format!(
        "hover-pages-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

fn free_bytes(file: &File) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    // SAFETY: statvfs is plain data, filled by the kernel; the result is checked.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(s.f_bavail as u64 * s.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_bufs_are_aligned_contiguous_pages() {
        let mut b = PageBufs::new(3);
        assert_eq!(b.bytes().len(), 3 * PAGE_SIZE as usize);
        assert_eq!(b.bytes().as_ptr() as u64 % PAGE_SIZE, 0);
        b.bytes_mut()[PAGE_SIZE as usize * 2 + 7] = 9;
        assert_eq!(b.bytes().iter().map(|&x| x as u32).sum::<u32>(), 9);
    }

    #[test]
    fn pages_round_trip_and_the_file_goes_away() {
        let store = PageStore::create(None, 1 << 20).unwrap();
        let path = store.path().to_path_buf();
        assert!(!path.exists(), "unlinked as soon as it is set up");
        let mut page = PageBuf::new();
        page.0[7] = 42;
        store.write(3, &page).unwrap();
        let mut back = PageBuf::new();
        store.read(3, &mut back).unwrap();
        assert_eq!(back.0[7], 42);
        drop(store);
        assert!(!path.exists());
    }

    #[test]
    fn bad_stores_are_refused_and_nothing_is_touched() {
        let e = PageStore::create(Some(Path::new("/proc/hover-no-such-store")), 0)
            .err()
            .unwrap();
        assert!(e.to_string().contains("cannot create or write"), "{e}");
        let e = PageStore::create(None, u64::MAX).err().unwrap();
        assert!(e.to_string().contains("may be evicted there"), "{e}");
        // An existing file (or device) is neither used nor removed.
        let existing = default_dir().join(format!("hover-store-test-{}", std::process::id()));
        std::fs::write(&existing, b"keep me").unwrap();
        let e = PageStore::create(Some(&existing), 0).err().unwrap();
        assert!(e.to_string().contains("already exists"), "{e}");
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");
        std::fs::remove_file(&existing).unwrap();
        let e = PageStore::create(Some(Path::new("/dev/null")), 0)
            .err()
            .unwrap();
        assert!(e.to_string().contains("already exists"), "{e}");
        assert!(Path::new("/dev/null").exists());
    }
}
