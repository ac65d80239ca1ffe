//! `hover firecracker` in a child process and raw requests to its API,
//! for the Firecracker tests.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::{hover, hover_cmd, text, Scratch};

/// One request: (status, body).
pub fn req(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out[9..12].parse().unwrap();
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// A request that must be refused: its `fault_message`, checked to hold `needle`.
pub fn refused(sock: &Path, method: &str, path: &str, body: &str, needle: &str) {
    let (status, answer) = req(sock, method, path, body);
    assert_eq!(status, 400, "{method} {path} {body}: {answer}");
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let msg = v["fault_message"].as_str().unwrap_or_default();
    assert!(
        msg.contains(needle),
        "{method} {path}: {msg:?} lacks {needle:?}"
    );
}

/// A change that must succeed: 204 and no body.
pub fn done(sock: &Path, method: &str, path: &str, body: &str) {
    let (status, answer) = req(sock, method, path, body);
    assert_eq!(
        (status, answer.as_str()),
        (204, ""),
        "{method} {path} {body}"
    );
}

pub struct Fc {
    pub child: Option<Child>,
    pub sock: PathBuf,
}

impl Fc {
    pub fn spawn(dir: &Scratch, extra: &[&str]) -> Fc {
        let sock = dir.path("fc.sock");
        let child = hover_cmd()
            .args(["firecracker", "--api-sock", sock.to_str().unwrap()])
            .args(extra)
            .args(["--console", "off"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !sock.exists() {
            assert!(Instant::now() < deadline, "no API socket");
            std::thread::sleep(Duration::from_millis(5));
        }
        Fc {
            child: Some(child),
            sock,
        }
    }

    pub fn wait(mut self) -> (Option<i32>, String, String) {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }
}

impl Drop for Fc {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn guest(dir: &Scratch) -> PathBuf {
    let p = dir.path("guest.elf");
    let out = hover(&["guest-image", "--out", p.to_str().unwrap()]);
    assert!(out.status.success());
    p
}

/// Configure 2 vCPUs and 64 MiB, boot `image` with `boot_args`, and start
/// it: each step must succeed.
pub fn start_guest(sock: &Path, image: &Path, boot_args: &str) {
    done(
        sock,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    let boot = serde_json::json!({
        "kernel_image_path": image,
        "boot_args": boot_args,
    });
    done(sock, "PUT", "/boot-source", &boot.to_string());
    done(
        sock,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
    );
}
