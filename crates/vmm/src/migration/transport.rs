//! Where a migration goes: `tcp:HOST:PORT` or `unix:PATH`, and the
//! connections between source and destination.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

/// A migration address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    /// `tcp:HOST:PORT`.
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Addr::Tcp(a) => write!(f, "tcp:{a}"),
            Addr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl std::str::FromStr for Addr {
    type Err = String;

    fn from_str(s: &str) -> Result<Addr, String> {
        let bad = || format!("'{s}' is not a migration address: use tcp:HOST:PORT or unix:PATH");
        if let Some(a) = s.strip_prefix("tcp:") {
            let (host, port) = a.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            Ok(Addr::Tcp(a.to_string()))
        } else if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(bad());
            }
            Ok(Addr::Unix(p.into()))
        } else {
            Err(bad())
        }
    }
}

/// A connected stream, TCP or Unix.
pub enum Conn {
    /// TCP.
    Tcp(TcpStream),
    /// Unix.
    Unix(UnixStream),
}

impl Conn {
    /// Connect to `addr`, giving up after `timeout`.
    pub fn connect(addr: &Addr, timeout: Duration) -> io::Result<Conn> {
        let c = match addr {
            Addr::Tcp(a) => {
                let mut last = io::Error::other(format!("{a} resolves to no address"));
                let mut conn = None;
                // Through the broker: a name lookup may load a library.
                for sa in crate::seccomp::broker::resolve(a)? {
                    match TcpStream::connect_timeout(&sa, timeout) {
                        Ok(s) => {
                            conn = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = conn.ok_or(last)?;
                s.set_nodelay(true)?;
                Conn::Tcp(s)
            }
            Addr::Unix(p) => Conn::Unix(UnixStream::connect(p)?),
        };
        c.set_timeout(Some(timeout))?;
        Ok(c)
    }

    /// Read and write timeouts (a stalled peer ends the migration).
    pub fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Conn::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }

    /// Another handle on the same connection (one reads, one writes).
    pub fn try_clone(&self) -> io::Result<Conn> {
        Ok(match self {
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
            Conn::Unix(s) => Conn::Unix(s.try_clone()?),
        })
    }

    /// Stop reading: a thread waiting for the next frame wakes with the
    /// end of the stream, and what is still to be written can be.
    pub fn shutdown_read(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Read),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Read),
        };
    }

    /// Close both directions (the peer sees the end at once).
    pub fn shutdown(&self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl std::os::fd::AsRawFd for Conn {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Conn::Tcp(s) => s.as_raw_fd(),
            Conn::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write_vectored(b),
            Conn::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection read under one deadline for all its reads (a peer that
/// trickles bytes cannot stretch it), not a timeout per read.
pub struct Timed {
    conn: Conn,
    until: std::time::Instant,
}

impl Timed {
    /// Read `conn` until `until`.
    pub fn new(conn: Conn, until: std::time::Instant) -> Timed {
        Timed { conn, until }
    }

    /// The connection, deadline dropped (its read timeout is left as the
    /// last read set it: set it again).
    pub fn into_inner(self) -> Conn {
        self.conn
    }
}

impl Read for Timed {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        let left = self
            .until
            .saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "timed out (the deadline for the whole opening passed)",
            ));
        }
        match &self.conn {
            Conn::Tcp(s) => s.set_read_timeout(Some(left))?,
            Conn::Unix(s) => s.set_read_timeout(Some(left))?,
        }
        self.conn.read(b)
    }
}

/// A listening socket for `hover receive`.
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix (the socket file is removed when dropped, or when a signal
    /// ends the process first).
    Unix(UnixListener, PathBuf, crate::signals::RemoveOnSignal),
}

impl Listener {
    /// Listen at `addr` (a Unix path must not exist yet); a Unix socket's
    /// file is 0600.
    pub fn bind(addr: &Addr) -> io::Result<Listener> {
        Ok(match addr {
            Addr::Tcp(a) => Listener::Tcp(TcpListener::bind(a.as_str())?),
            Addr::Unix(p) => {
                if p.symlink_metadata().is_ok() {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} already exists", p.display()),
                    ));
                }
                {
                    let (l, guard) = crate::signals::create_removed_on_signal(p.clone(), || {
                        crate::host::socket::bind_private(p)
                    })?;
                    Listener::Unix(l, p.clone(), guard)
                }
            }
        })
    }

    /// Wait at most `wait` for one connection: `None` if none came.
    pub fn accept_within(&self, wait: Duration) -> io::Result<Option<Conn>> {
        use std::os::fd::AsRawFd;
        let fd = match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l, ..) => l.as_raw_fd(),
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut p, 1, ms) } {
            n if n > 0 => self.accept().map(Some),
            0 => Ok(None),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Wait for one connection.
    pub fn accept(&self) -> io::Result<Conn> {
        Ok(match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Conn::Tcp(s)
            }
            Listener::Unix(l, ..) => Conn::Unix(l.accept()?.0),
        })
    }

    /// The local address (a TCP port chosen by the system shows here).
    pub fn local(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map(|a| format!("tcp:{a}"))
                .unwrap_or_default(),
            Listener::Unix(_, p, _) => format!("unix:{}", p.display()),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p, _) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_holds_over_all_reads() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut t = Timed::new(
            Conn::Unix(a),
            std::time::Instant::now() + Duration::from_millis(300),
        );
        let t0 = std::time::Instant::now();
        // A byte every 100 ms: each read is quick, the sum is not.
        let trickle = std::thread::spawn(move || {
            for _ in 0..20 {
                if b.write_all(b"x").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let mut buf = [0u8; 16];
        let e = t.read_exact(&mut buf).unwrap_err();
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ),
            "{e}"
        );
        // The error is the proof (the trickle would fill the buffer in
        // 1.5 s); this bound only catches a read that never gave up.
        assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
        drop(t);
        trickle.join().unwrap();
    }

    #[test]
    fn addresses_parse() {
        assert_eq!(
            "tcp:127.0.0.1:4444".parse::<Addr>().unwrap(),
            Addr::Tcp("127.0.0.1:4444".into())
        );
        assert_eq!(
            "unix:/tmp/m.sock".parse::<Addr>().unwrap(),
            Addr::Unix("/tmp/m.sock".into())
        );
        for bad in [
            "",
            "tcp:",
            "tcp:host",
            "tcp:host:99999",
            "unix:",
            "udp:1:2",
            "/tmp/x",
        ] {
            assert!(bad.parse::<Addr>().is_err(), "{bad}");
        }
    }
}
