//! A bounded HTTP/1.1 server on a Unix socket: what the control API needs
//! and nothing an abusive client can grow.
//!
//! Every resource a client can claim has a bound checked before it is
//! taken: at most [`Limits::connections`] connections are served at once
//! (one thread each). When all are taken, a new client is not turned away
//! while one of them is only waiting for or reading a request: the one
//! open longest of those is closed to make room (so clients that hold
//! connections, idle or trickling requests, cannot keep others out); only
//! when every connection is having a request answered is the newcomer
//! answered 503 and closed (the VM never notices); a request's head is read into a
//! buffer of at most [`Limits::header`] bytes (431 past it); a body is
//! read only when its `Content-Length` is within [`Limits::body`] (413
//! otherwise, and the connection is closed without reading or draining
//! a byte of it); a request must arrive whole within
//! [`Limits::request_time`] and an idle connection is closed after
//! [`Limits::idle`]. Running out of descriptors (EMFILE) pauses accepting
//! for a moment instead of failing: the server answers again once the
//! load is gone. Parsing is httparse's.

use crate::sync::{wait_timeout, Locked};
use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

mod connection;

use connection::{head, Connection};

/// What a client may claim of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Largest request head (request line and headers), bytes.
    pub header: usize,
    /// Largest request body, bytes.
    pub body: usize,
    /// Longest a request may take to arrive, from its first byte.
    pub request_time: Duration,
    /// Longest a connection may sit idle between requests.
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 16,
            header: 16 << 10,
            body: 64 << 10,
            request_time: Duration::from_secs(10),
            idle: Duration::from_secs(10),
        }
    }
}

/// One request, read whole.
#[derive(Debug)]
pub struct Request {
    /// The method (`GET`, `PUT`, ...).
    pub method: String,
    /// The target, e.g. `/vm/stats?x=1`.
    pub target: String,
    /// The body.
    pub body: Vec<u8>,
}

/// An answer: status, content type, body.
pub type Answer = (u16, &'static str, String);

/// Answers requests; called on the connection's thread.
pub type Handler = Arc<dyn Fn(&Request) -> Answer + Send + Sync>;

/// A connection's state, shared by its thread and the acceptor: waiting
/// for or reading a request, having one answered, or closed to make room.
/// Changed by compare-and-swap only, so a connection is never both
/// answering and evicted.
const IDLE: u8 = 0;
const BUSY: u8 = 1;
const EVICTED: u8 = 2;

/// One live connection, as the acceptor and `stop` see it.
struct Open {
    stream: UnixStream,
    since: Instant,
    /// [`IDLE`], [`BUSY`] or [`EVICTED`].
    state: Arc<std::sync::atomic::AtomicU8>,
}

impl Open {
    fn evicted(&self) -> bool {
        self.state.load(Ordering::Acquire) == EVICTED
    }
}

/// The live connections, so that stopping can close them, and their
/// threads, so that stopping can join them.
#[derive(Default)]
struct Connections {
    open: Mutex<HashMap<u64, Open>>,
    gone: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Connections {
    /// Connections counted against the bound (not those closed to make room).
    fn count(&self) -> usize {
        let open = self.open.locked();
        open.values().filter(|o| !o.evicted()).count()
    }

    /// Close the connection open longest of those not having a request
    /// answered; whether there was one.
    fn evict_one(&self) -> bool {
        let open = self.open.locked();
        let mut idle: Vec<&Open> = open
            .values()
            .filter(|o| o.state.load(Ordering::Acquire) == IDLE)
            .collect();
        idle.sort_by_key(|o| o.since);
        // The oldest that is still idle as it is taken (one that has just
        // begun answering a request is left alone).
        for o in idle {
            if o.state
                .compare_exchange(IDLE, EVICTED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // Its thread's read or write ends; it leaves the table as
                // it returns.
                let _ = o.stream.shutdown(std::net::Shutdown::Both);
                return true;
            }
        }
        false
    }
}

/// A running server: its accepting thread and the connections it serves.
pub struct HttpServer {
    stop: Arc<EventFd>,
    stopping: Arc<AtomicBool>,
    connections: Arc<Connections>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Serve `listener` with `handler` on threads started from the calling
    /// thread (they inherit its name and seccomp filter).
    pub fn start(
        listener: UnixListener,
        limits: Limits,
        handler: Handler,
    ) -> std::io::Result<HttpServer> {
        set_nonblocking(&listener)?;
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let stopping = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Connections::default());
        let accept = Acceptor {
            listener,
            limits,
            handler,
            stop: stop.clone(),
            stopping: stopping.clone(),
            connections: connections.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("api-accept".into())
            .spawn(move || accept.run())?;
        Ok(HttpServer {
            stop,
            stopping,
            connections,
            thread: Some(thread),
        })
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.connections.count()
    }

    /// Stop accepting, close every connection, and wait (at most `grace`)
    /// for their threads to end; a request being answered finishes first.
    pub fn stop(&mut self, grace: Duration) {
        let Some(t) = self.thread.take() else { return };
        self.stopping.store(true, Ordering::Release);
        let _ = self.stop.write(1);
        let _ = t.join();
        let mut open = self.connections.open.locked();
        for o in open.values() {
            // Ends a read in progress; an answer being written goes out first
            // (the write side stays open until its thread closes it).
            let _ = o.stream.shutdown(std::net::Shutdown::Read);
        }
        let until = Instant::now() + grace;
        while !open.is_empty() {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            open = wait_timeout(&self.connections.gone, open, left).0;
        }
        let all_done = open.is_empty();
        drop(open);
        let threads = std::mem::take(&mut *self.connections.threads.locked());
        // Each has left the table and is returning: joined, so that none
        // outlives the server. (Past the grace, one still writing to a slow
        // client is left to its write timeout.)
        if all_done {
            for t in threads {
                let _ = t.join();
            }
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}

struct Acceptor {
    listener: UnixListener,
    limits: Limits,
    handler: Handler,
    stop: Arc<EventFd>,
    stopping: Arc<AtomicBool>,
    connections: Arc<Connections>,
}

impl Acceptor {
    fn run(self) {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut warned_full = false;
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: self.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds for the length given.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if self.stopping.load(Ordering::Acquire) {
                return;
            }
            if n < 0 {
                continue; // EINTR
            }
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE, ENFILE, ENOMEM: the connection stays queued;
                    // try again once something has been closed.
                    if !warned_full {
                        tracing::warn!("API: cannot accept a connection: {e}; retrying");
                        warned_full = true;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            };
            warned_full = false;
            if self.connections.count() >= self.limits.connections && !self.connections.evict_one()
            {
                refuse_busy(stream);
                continue;
            }
            let id = NEXT.fetch_add(1, Ordering::Relaxed);
            let Ok(kept) = stream.try_clone() else {
                refuse_busy(stream);
                continue;
            };
            let state = Arc::new(std::sync::atomic::AtomicU8::new(IDLE));
            self.connections.open.locked().insert(
                id,
                Open {
                    stream: kept,
                    since: Instant::now(),
                    state: state.clone(),
                },
            );
            let conn = Connection {
                stream,
                limits: self.limits,
                handler: self.handler.clone(),
                state,
            };
            let connections = self.connections.clone();
            let spawned = std::thread::Builder::new()
                .name("api-conn".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    conn.serve();
                    let mut open = connections.open.locked();
                    open.remove(&id);
                    connections.gone.notify_all();
                });
            let spawned = spawned.map(|t| {
                let mut threads = self.connections.threads.locked();
                threads.retain(|t| !t.is_finished());
                threads.push(t);
            });
            if let Err(e) = spawned {
                tracing::warn!("API: cannot start a connection thread: {e}");
                if let Some(s) = self.connections.open.locked().remove(&id) {
                    refuse_busy(s.stream);
                }
            }
        }
    }
}

/// Make `fd` non-blocking with fcntl (std's `set_nonblocking` is an ioctl,
/// which the API's seccomp filter does not allow).
fn set_nonblocking(fd: &impl AsRawFd) -> std::io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Close a connection whose request was not read whole without resetting
/// it: a Unix socket closed with unread data makes the peer's next read
/// fail (ECONNRESET) after the answer, and clients that read to the end
/// report that instead of the answer. So: no more writes, then read and
/// drop what the client sends, for at most `wait` and 1 MiB.
fn close_gently(stream: &UnixStream, wait: Duration) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let until = Instant::now() + wait;
    let mut buf = [0u8; 4096];
    let mut left = 1usize << 20;
    while left > 0 {
        let now = Instant::now();
        if now >= until || stream.set_read_timeout(Some(until - now)).is_err() {
            return;
        }
        match (&*stream).read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Drop what has arrived on `stream` without waiting (at most 64 KiB).
fn drain_now(stream: &UnixStream) {
    let mut buf = [0u8; 4096];
    for _ in 0..16 {
        // SAFETY: receives into a live buffer of the length given.
        let n = unsafe {
            libc::recv(
                stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return;
        }
    }
}

/// Answer 503 without waiting for the client, and close.
fn refuse_busy(stream: UnixStream) {
    let body = r#"{"error":"the API is serving its maximum of connections; retry shortly"}"#;
    let answer = format!("{}{body}", head(503, "application/json", body.len(), true));
    // SAFETY: sends from a live buffer of the length given; MSG_DONTWAIT so
    // that a client that reads nothing cannot hold the accepting thread.
    unsafe {
        libc::send(
            stream.as_raw_fd(),
            answer.as_ptr().cast(),
            answer.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    drain_now(&stream);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests;
