//! A minimal QMP client (QEMU's JSON monitor protocol) for the peer runs
//! that steer QEMU while it runs: one JSON object per line; the server
//! greets, the client negotiates with `qmp_capabilities`, then every
//! command gets one `return` or `error` reply, with asynchronous `event`
//! lines interleaved anywhere.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::peer::PeerError;

/// A negotiated QMP connection.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

fn failed(detail: String) -> PeerError {
    PeerError::Failed {
        status: "QMP".into(),
        detail,
    }
}

/// What one line from the server is.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// The greeting (`{"QMP": ...}`).
    Greeting,
    /// An asynchronous event, by name.
    Event(String),
    /// A command's result.
    Return(Value),
    /// A command's failure: `class: desc`.
    Error(String),
}

/// Classify one line of the server's output.
pub fn parse_line(line: &str) -> Result<Line, String> {
    let v: Value =
        serde_json::from_str(line).map_err(|e| format!("not JSON ({e}): {}", line.trim()))?;
    if v.get("QMP").is_some() {
        Ok(Line::Greeting)
    } else if let Some(e) = v.get("event") {
        Ok(Line::Event(e.as_str().unwrap_or("?").to_string()))
    } else if let Some(r) = v.get("return") {
        Ok(Line::Return(r.clone()))
    } else if let Some(e) = v.get("error") {
        Ok(Line::Error(format!(
            "{}: {}",
            e["class"].as_str().unwrap_or("?"),
            e["desc"].as_str().unwrap_or("?")
        )))
    } else {
        Err(format!("unexpected QMP line: {}", line.trim()))
    }
}

impl Qmp {
    /// Connect to the monitor socket at `path` (waiting up to `wait` for
    /// QEMU to create it) and negotiate.
    pub fn connect(path: &Path, wait: Duration) -> Result<Qmp, PeerError> {
        let started = Instant::now();
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if started.elapsed() > wait => {
                    return Err(failed(format!(
                        "no QMP monitor at {} after {wait:?}: {e}",
                        path.display()
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| failed(e.to_string()))?;
        let writer = stream.try_clone().map_err(|e| failed(e.to_string()))?;
        let mut q = Qmp {
            reader: BufReader::new(stream),
            writer,
        };
        match q.next_line()? {
            Line::Greeting => {}
            other => return Err(failed(format!("expected QMP's greeting, got {other:?}"))),
        }
        q.execute("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn next_line(&mut self) -> Result<Line, PeerError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| failed(format!("reading the monitor: {e}")))?;
        if n == 0 {
            return Err(failed("QEMU closed its monitor".into()));
        }
        parse_line(&line).map_err(failed)
    }

    /// Run `command` with `arguments`; its `return` value, events skipped.
    pub fn execute(&mut self, command: &str, arguments: Value) -> Result<Value, PeerError> {
        let mut msg = json!({ "execute": command });
        if arguments.as_object().is_some_and(|o| !o.is_empty()) {
            msg["arguments"] = arguments;
        }
        writeln!(self.writer, "{msg}")
            .map_err(|e| failed(format!("writing to the monitor: {e}")))?;
        loop {
            match self.next_line()? {
                Line::Return(v) => return Ok(v),
                Line::Error(e) => return Err(failed(format!("{command}: {e}"))),
                Line::Event(_) | Line::Greeting => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn lines_are_classified() {
        assert_eq!(
            parse_line(r#"{"QMP": {"version": {}, "capabilities": []}}"#),
            Ok(Line::Greeting)
        );
        assert_eq!(
            parse_line(r#"{"timestamp": {"seconds": 1}, "event": "STOP"}"#),
            Ok(Line::Event("STOP".into()))
        );
        assert_eq!(
            parse_line(r#"{"return": {"status": "active"}}"#),
            Ok(Line::Return(json!({"status": "active"})))
        );
        assert_eq!(
            parse_line(r#"{"error": {"class": "GenericError", "desc": "no"}}"#),
            Ok(Line::Error("GenericError: no".into()))
        );
        assert!(parse_line("garbage").unwrap_err().contains("not JSON"));
        assert!(parse_line("{}").unwrap_err().contains("unexpected"));
    }

    /// A server speaking QMP as QEMU 7.2 does, from a script of replies.
    fn server(path: &Path, replies: Vec<&'static str>) -> std::thread::JoinHandle<Vec<String>> {
        let listener = UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            writeln!(
                w,
                r#"{{"QMP": {{"version": {{}}, "capabilities": ["oob"]}}}}"#
            )
            .unwrap();
            let mut got = Vec::new();
            for reply in replies {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                got.push(line.trim().to_string());
                writeln!(w, "{reply}").unwrap();
            }
            got
        })
    }

    #[test]
    fn commands_skip_events_and_errors_name_the_command() {
        let path = std::env::temp_dir().join(format!("hover-qmp-test-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let srv = server(
            &path,
            vec![
                r#"{"return": {}}"#,
                "{\"event\": \"STOP\", \"timestamp\": {}}\n{\"return\": {\"status\": \"completed\"}}",
                r#"{"error": {"class": "GenericError", "desc": "State blocked by non-migratable CPU device (invtsc flag)"}}"#,
            ],
        );
        let mut q = Qmp::connect(&path, Duration::from_secs(5)).unwrap();
        let r = q.execute("query-migrate", json!({})).unwrap();
        assert_eq!(r["status"], "completed");
        let e = q
            .execute("migrate", json!({"uri": "tcp:127.0.0.1:1"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("migrate: GenericError: State blocked"), "{e}");
        let sent = srv.join().unwrap();
        assert_eq!(sent[0], r#"{"execute":"qmp_capabilities"}"#);
        assert_eq!(sent[1], r#"{"execute":"query-migrate"}"#);
        assert!(sent[2].contains(r#""arguments":{"uri":"tcp:127.0.0.1:1"}"#));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_monitor_that_never_appears_is_a_clear_error() {
        let e = Qmp::connect(
            Path::new("/nonexistent/qmp.sock"),
            Duration::from_millis(20),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("no QMP monitor at /nonexistent/qmp.sock"), "{e}");
    }
}
