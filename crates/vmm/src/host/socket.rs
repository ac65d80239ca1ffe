//! Unix sockets Hover listens on: private from the moment they exist.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Bind and listen on a Unix socket at `p`, its file mode 0600 from the
/// moment it appears, whatever the umask: the mode is set on the socket
/// before `bind` creates the file (Linux takes a socket file's mode from
/// its inode, less the umask), so no other user can connect in between, as
/// they could between a `bind` and a later `chmod`. Err: `p` does not fit a
/// socket address (107 bytes), or a system call failed (`p` exists: EADDRINUSE).
pub fn bind_private(p: &Path) -> io::Result<UnixListener> {
    let bytes = p.as_os_str().as_bytes();
    // SAFETY: a plain zeroed C struct.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: too long for a Unix socket (at most 107 bytes)",
                p.display()
            ),
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let os = |rc: libc::c_int| {
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    };
    // SAFETY: creating a socket; the descriptor is owned at once.
    let fd = os(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: calls on our own descriptor with a valid address of its length.
    unsafe {
        os(libc::fchmod(fd, 0o600))?;
        os(libc::bind(
            fd,
            (&addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ))?;
        os(libc::listen(fd, 128))?;
    }
    Ok(UnixListener::from(sock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_socket_is_0600_under_any_umask() {
        let dir = std::env::temp_dir().join(format!("hover-bind-private-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for umask in [0o000, 0o002, 0o077] {
            let p = dir.join(format!("s{umask:o}"));
            // SAFETY: umask only changes this process's file creation mask.
            let old = unsafe { libc::umask(umask) };
            let l = bind_private(&p);
            // SAFETY: as above.
            unsafe { libc::umask(old) };
            let _l = l.unwrap();
            let mode = std::fs::symlink_metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "umask {umask:o}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_path_too_long_or_taken_is_refused() {
        let long = std::path::PathBuf::from(format!("/tmp/{}", "x".repeat(120)));
        let e = bind_private(&long).unwrap_err();
        assert!(e.to_string().contains("too long"), "{e}");
        let dir = std::env::temp_dir().join(format!("hover-bind-taken-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("taken");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(
            bind_private(&p).unwrap_err().raw_os_error(),
            Some(libc::EADDRINUSE)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
