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
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

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

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

fn head(status: u16, content_type: &str, len: usize, close: bool) -> String {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {len}\r\n{}\r\n",
        reason(status),
        if close { "Connection: close\r\n" } else { "" }
    )
}

/// Why reading a request stopped.
enum ReadFailure {
    /// The client closed the connection, or was idle too long between requests.
    Gone,
    /// An answer to give before closing (malformed or over a limit).
    Refuse(u16, String),
}

struct Connection {
    stream: UnixStream,
    limits: Limits,
    handler: Handler,
    /// [`IDLE`], [`BUSY`] while the handler runs, or [`EVICTED`].
    state: Arc<std::sync::atomic::AtomicU8>,
}

impl Connection {
    fn serve(mut self) {
        let _ = self
            .stream
            .set_write_timeout(Some(self.limits.request_time));
        // Bytes read past the end of the previous request (pipelining).
        let mut buf = Vec::new();
        loop {
            let (request, close) = match self.read_request(&mut buf) {
                Ok(r) => r,
                Err(ReadFailure::Gone) => return,
                Err(ReadFailure::Refuse(status, message)) => {
                    let body = serde_json::json!({ "error": message }).to_string();
                    self.send((status, "application/json", body), true);
                    close_gently(&self.stream, Duration::from_millis(100));
                    return;
                }
            };
            // Closed to make room while the request was read: it is not
            // carried out (the client sees the connection closed, and may
            // send it again).
            if self
                .state
                .compare_exchange(IDLE, BUSY, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return;
            }
            let answer = (self.handler)(&request);
            // Answered: evictable again while the answer is written (a
            // client that does not read cannot hold the slot).
            let _ = self
                .state
                .compare_exchange(BUSY, IDLE, Ordering::AcqRel, Ordering::Acquire);
            if !self.send(answer, close) || close {
                return;
            }
        }
    }

    fn send(&mut self, (status, content_type, body): Answer, close: bool) -> bool {
        let h = head(status, content_type, body.len(), close);
        self.stream.write_all(h.as_bytes()).is_ok()
            && self.stream.write_all(body.as_bytes()).is_ok()
    }

    /// Read into `buf` until `deadline` (None: wait for the idle limit, as
    /// between requests); whether anything arrived.
    fn fill(
        &mut self,
        buf: &mut Vec<u8>,
        deadline: Instant,
        cap: usize,
    ) -> Result<(), ReadFailure> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadFailure::Refuse(
                408,
                "the request did not arrive in time".into(),
            ));
        }
        let _ = self.stream.set_read_timeout(Some(left));
        let mut chunk = [0u8; 4096];
        let want = chunk.len().min(cap.saturating_sub(buf.len()).max(1));
        match self.stream.read(&mut chunk[..want]) {
            Ok(0) => Err(ReadFailure::Gone),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(
                ReadFailure::Refuse(408, "the request did not arrive in time".into()),
            ),
            Err(_) => Err(ReadFailure::Gone),
        }
    }

    /// Read one request; also whether the connection closes after it.
    fn read_request(&mut self, buf: &mut Vec<u8>) -> Result<(Request, bool), ReadFailure> {
        // Wait for the first byte as long as a connection may idle; once a
        // request has begun, all of it must come within the request time.
        if buf.is_empty() {
            match self.fill(
                buf,
                Instant::now() + self.limits.idle,
                self.limits.header + 1,
            ) {
                Err(ReadFailure::Refuse(408, _)) => return Err(ReadFailure::Gone),
                r => r?,
            }
        }
        let deadline = Instant::now() + self.limits.request_time;
        let header = self.limits.header;
        let too_large =
            || ReadFailure::Refuse(431, format!("the request's head is over {header} bytes"));
        let (head_len, method, target, length, close, expect) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut req = httparse::Request::new(&mut headers);
            let scanned = &buf[..buf.len().min(self.limits.header)];
            match req.parse(scanned) {
                Ok(httparse::Status::Complete(n)) => {
                    let parsed = parse_head(&req)?;
                    break (n, parsed.0, parsed.1, parsed.2, parsed.3, parsed.4);
                }
                Ok(httparse::Status::Partial) if buf.len() >= self.limits.header => {
                    return Err(too_large())
                }
                Ok(httparse::Status::Partial) => {}
                Err(httparse::Error::TooManyHeaders) => return Err(too_large()),
                Err(e) => {
                    return Err(ReadFailure::Refuse(
                        400,
                        format!("the request is not HTTP/1.1: {e}"),
                    ))
                }
            }
            self.fill(buf, deadline, self.limits.header + 1)?;
        };
        if length > self.limits.body as u64 {
            return Err(ReadFailure::Refuse(
                413,
                format!("the request body is over {} bytes", self.limits.body),
            ));
        }
        let length = length as usize;
        if expect && buf.len() < head_len + length {
            let _ = self.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        while buf.len() < head_len + length {
            self.fill(buf, deadline, head_len + length)?;
        }
        let body = buf[head_len..head_len + length].to_vec();
        buf.drain(..head_len + length);
        Ok((
            Request {
                method,
                target,
                body,
            },
            close,
        ))
    }
}

/// Method, target, body length, whether to close after, whether the client
/// waits for `100 Continue`.
type Head = (String, String, u64, bool, bool);

fn parse_head(req: &httparse::Request<'_, '_>) -> Result<Head, ReadFailure> {
    let bad = |m: &str| ReadFailure::Refuse(400, m.into());
    let method = req.method.ok_or_else(|| bad("no method"))?.to_string();
    let target = req.path.ok_or_else(|| bad("no target"))?.to_string();
    let mut length = 0u64;
    let mut close = req.version == Some(0);
    let mut expect = false;
    let mut lengths = 0;
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            lengths += 1;
            length = value
                .parse()
                .map_err(|_| bad("Content-Length is not a number"))?;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(ReadFailure::Refuse(
                501,
                "chunked or encoded bodies are not accepted: send Content-Length".into(),
            ));
        } else if h.name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        } else if h.name.eq_ignore_ascii_case("expect") {
            expect = value.eq_ignore_ascii_case("100-continue");
        }
    }
    if lengths > 1 {
        return Err(bad("more than one Content-Length"));
    }
    Ok((method, target, length, close, expect))
}

#[cfg(test)]
mod tests;
