//! One connection of the control API's server: requests read within the
//! server's limits, each parsed (httparse), handed to the handler and
//! answered; how a request that breaks a limit is refused.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;

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

pub(super) fn head(status: u16, content_type: &str, len: usize, close: bool) -> String {
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

pub(super) struct Connection {
    pub(super) stream: UnixStream,
    pub(super) limits: Limits,
    pub(super) handler: Handler,
    /// [`IDLE`], [`BUSY`] while the handler runs, or [`EVICTED`].
    pub(super) state: Arc<std::sync::atomic::AtomicU8>,
}

impl Connection {
    pub(super) fn serve(mut self) {
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
