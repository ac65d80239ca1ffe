//! Files Hover writes for its user (logs, metrics, the guest console):
//! created 0600, never through a symbolic link, and only regular files or
//! named pipes, never a device, a socket or a file of procfs or sysfs; and
//! files it reads as input, bounded and through the descriptor it checked.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// What happens to what a regular file already holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Lines are added at its end (logs, metrics).
    Append,
    /// It is emptied first (the console of a new run).
    Truncate,
}

/// `statfs` magic numbers of the pseudo file systems refused.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;
const SYSFS_MAGIC: i64 = 0x6265_6572;
const DEBUGFS_MAGIC: i64 = 0x6462_6720;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Open `path` for Hover's output, created 0600 if missing (whatever the
/// umask), as Firecracker opens its log: read-write and non-blocking, so a
/// named pipe nobody reads yet neither blocks the open nor, once full, the
/// writer (a write that does not fit fails, and the caller drops it).
/// Refused, with a message naming what was found: a symbolic link
/// (`O_NOFOLLOW`: a link planted where Hover writes must not redirect it),
/// anything but a regular file or a named pipe, and files of procfs, sysfs,
/// debugfs or cgroupfs. The checks are made on the opened descriptor, so
/// nothing can be swapped in between.
pub fn open_output(path: &Path, existing: Existing) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC);
    let file = o.open(path).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => io::Error::new(
            io::ErrorKind::InvalidInput,
            "is a symbolic link: give the file itself (Hover does not follow links for files it writes)",
        ),
        _ => e,
    })?;
    let kind = file.metadata()?.file_type();
    let what = if kind.is_file() || kind.is_fifo() {
        None
    } else if kind.is_dir() {
        Some("a directory")
    } else if kind.is_char_device() {
        Some("a character device")
    } else if kind.is_block_device() {
        Some("a block device")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    };
    if let Some(what) = what {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is {what}: give a regular file or a named pipe"),
        ));
    }
    if let Some(fs) = pseudo_fs(&file) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("is a file of {fs}: give a regular file or a named pipe"),
        ));
    }
    if existing == Existing::Truncate && kind.is_file() {
        file.set_len(0)?;
    }
    if existing == Existing::Append && kind.is_file() {
        use std::io::Seek;
        (&file).seek(io::SeekFrom::End(0))?;
    }
    Ok(file)
}

/// The pseudo file system `file` is on (procfs, sysfs, debugfs,
/// cgroupfs), if it is on one: its files are not Hover's inputs or outputs.
pub fn pseudo_fs(file: &File) -> Option<&'static str> {
    // SAFETY: a zeroed statfs filled by fstatfs on our own descriptor.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the result is checked.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return None;
    }
    match fs.f_type as i64 {
        PROC_SUPER_MAGIC => Some("procfs"),
        SYSFS_MAGIC => Some("sysfs"),
        DEBUGFS_MAGIC => Some("debugfs"),
        CGROUP2_SUPER_MAGIC => Some("cgroupfs"),
        _ => None,
    }
}

/// Open a file Hover takes as input, and check it through the descriptor
/// opened: without blocking (a named pipe swapped in cannot hang the
/// open), a regular file, not one of procfs or sysfs. Its metadata comes
/// with it, so its size is known before a byte is read.
pub fn open_input(path: &Path) -> io::Result<(File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file: give the file itself",
        ));
    }
    if let Some(fs) = pseudo_fs(&file) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a file of {fs}, not an input Hover takes"),
        ));
    }
    Ok((file, meta))
}

/// Read a file Hover takes as input (a kernel, an initrd, a guest image, a
/// configuration file) once, through the descriptor it checked
/// ([`open_input`]): a regular file of at most `max` bytes (what the
/// format allows: a kernel within guest memory), so `/dev/zero`, a FIFO or
/// a sparse file of a terabyte is refused at once without reading it.
pub fn read_input(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let (file, meta) = open_input(path)?;
    if meta.len() > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} bytes, larger than the {max} bytes it must fit in",
                meta.len()
            ),
        ));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // Bounded even if the file grows meanwhile.
    file.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("hover-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_new_file_is_0600_under_umask_000() {
        let d = dir("mode");
        let p = d.join("log");
        // SAFETY: umask only changes this process's creation mask.
        let old = unsafe { libc::umask(0) };
        let f = open_output(&p, Existing::Append);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        f.unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn append_keeps_and_truncate_empties_what_was_there() {
        let d = dir("existing");
        let p = d.join("f");
        std::fs::write(&p, b"before\n").unwrap();
        let mut f = open_output(&p, Existing::Append).unwrap();
        f.write_all(b"after\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"before\nafter\n");
        let mut f = open_output(&p, Existing::Truncate).unwrap();
        f.write_all(b"new\n").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_is_refused_and_its_target_untouched() {
        let d = dir("link");
        let target = d.join("secret");
        std::fs::write(&target, b"keep").unwrap();
        let link = d.join("log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = open_output(&link, Existing::Append).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devices_directories_and_pseudo_files_are_refused() {
        for (p, want) in [
            ("/dev/full", "character device"),
            ("/dev/null", "character device"),
            ("/tmp", "directory"),
            ("/proc/self/comm", "procfs"),
        ] {
            match open_output(Path::new(p), Existing::Append) {
                Ok(_) => panic!("{p} was accepted"),
                Err(e) => assert!(
                    e.to_string().contains(want) || e.raw_os_error() == Some(libc::EISDIR),
                    "{p}: {e}"
                ),
            }
        }
    }

    #[test]
    fn inputs_are_regular_files_within_their_bound() {
        let d = dir("input");
        let p = d.join("k");
        std::fs::write(&p, [1u8; 100]).unwrap();
        assert_eq!(read_input(&p, 100).unwrap().len(), 100);
        let e = read_input(&p, 99).unwrap_err();
        assert!(e.to_string().contains("larger than"), "{e}");
        for dev in ["/dev/zero", "/tmp"] {
            let e = read_input(Path::new(dev), 1 << 30).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{dev}: {e}");
        }
        let fifo = d.join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_input(&fifo, 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_named_pipe_nobody_reads_opens_without_blocking() {
        let d = dir("fifo");
        let p = d.join("pipe");
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut f = open_output(&p, Existing::Truncate).unwrap();
        f.write_all(b"line\n").unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
