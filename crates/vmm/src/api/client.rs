//! A client of the control API: one HTTP/1.1 request per connection over
//! the Unix socket (`hover ctl`, `hover stats`, tests). Responses are
//! parsed with `httparse`.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::ApiError;

/// Longest answer read (metrics of a large VM fit many times over).
const MAX_RESPONSE: u64 = 64 << 20;

/// Talks to the VM whose API socket is at a path.
pub struct ApiClient {
    path: PathBuf,
    timeout: Duration,
}

/// An answer: HTTP status and body.
#[derive(Debug)]
pub struct ApiResponse {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: String,
}

impl ApiClient {
    /// A client for the socket at `path`; each call waits at most `timeout`.
    pub fn new(path: &Path, timeout: Duration) -> ApiClient {
        ApiClient {
            path: path.into(),
            timeout,
        }
    }

    fn bad(&self, reason: String) -> ApiError {
        ApiError::BadReply {
            path: self.path.clone(),
            reason,
        }
    }

    /// Send `method path` with `body` (JSON) and return the raw answer.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<ApiResponse, ApiError> {
        let mut s = UnixStream::connect(&self.path).map_err(|source| ApiError::Connect {
            path: self.path.clone(),
            source,
        })?;
        let _ = s.set_read_timeout(Some(self.timeout));
        let _ = s.set_write_timeout(Some(self.timeout));
        let body = body.unwrap_or("");
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes())
            .map_err(|e| self.bad(format!("cannot send the request: {e}")))?;
        let mut raw = Vec::new();
        // A server that refuses a request closes without reading all of it,
        // which this end may see as a reset after the whole answer: an
        // answer that arrived complete counts.
        let read = (&s).take(MAX_RESPONSE).read_to_end(&mut raw);
        let failed = |what: String| match &read {
            Err(e) => self.bad(format!("cannot read the answer: {e}")),
            Ok(_) => self.bad(what),
        };
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        let head = match resp.parse(&raw) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return Err(failed("the answer ended inside its headers".into()))
            }
            Err(e) => return Err(failed(format!("the answer is not HTTP: {e}"))),
        };
        let status = resp.code.unwrap_or(0);
        let len = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| {
                std::str::from_utf8(h.value)
                    .ok()?
                    .trim()
                    .parse::<usize>()
                    .ok()
            });
        let mut rest = &raw[head..];
        match len {
            Some(n) if rest.len() < n => {
                return Err(failed(format!(
                    "the answer was cut short ({} of {n} bytes)",
                    rest.len()
                )))
            }
            Some(n) => rest = &rest[..n],
            // Without a length only the end of the stream ends the body.
            None if read.is_err() => return Err(failed(String::new())),
            None => {}
        }
        Ok(ApiResponse {
            status,
            body: String::from_utf8_lossy(rest).into_owned(),
        })
    }

    /// Send a request whose answer is JSON; an error status becomes
    /// [`ApiError::Refused`] with the VM's message.
    pub fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<serde_json::Value, ApiError> {
        let r = self.call(method, path, body)?;
        let v: serde_json::Value = serde_json::from_str(&r.body)
            .map_err(|e| self.bad(format!("the answer is not JSON ({e}): {:?}", r.body)))?;
        if !(200..300).contains(&r.status) {
            let message = v["error"].as_str().unwrap_or(&r.body).to_string();
            return Err(ApiError::Refused {
                path: self.path.clone(),
                status: r.status,
                message,
                field: v["field"].as_str().map(str::to_string),
            });
        }
        Ok(v)
    }

    /// Send `endpoint` with `body` (JSON); its answer as [`ApiClient::json`].
    pub fn send(
        &self,
        endpoint: super::Endpoint,
        body: Option<&str>,
    ) -> Result<serde_json::Value, ApiError> {
        self.json(endpoint.method(), endpoint.path(), body)
    }
}

/// Ask the VM at `path` for its live figures (the JSON of `GET /vm/stats`).
pub fn query(path: &Path) -> Result<serde_json::Value, ApiError> {
    ApiClient::new(path, Duration::from_secs(5)).send(super::Endpoint::Stats, None)
}
