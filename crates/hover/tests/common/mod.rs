//! Running `hover` as a user would, for the integration tests: VMs in child
//! processes with an API socket in a scratch directory of their own.

#![allow(dead_code)] // not every test file uses every helper

pub mod firecracker;
pub mod lab;
pub mod migrate;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use hover_vmm::api::ApiClient;

/// The hover binary under test (and the test binary's watchdog armed: a
/// hover that never ends fails the test with its threads printed).
pub fn hover_cmd() -> Command {
    hover_vmm::host::watchdog::arm();
    Command::new(env!("CARGO_BIN_EXE_hover"))
}

/// [`hover_cmd`] with the file-creation mask 000 in the child: what a
/// careless parent hands down, under which Hover's files and sockets must
/// still be the owner's only.
pub fn hover_cmd_umask0() -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = hover_cmd();
    // SAFETY: umask is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    cmd
}

/// Run hover to completion.
pub fn hover(args: &[&str]) -> Output {
    hover_cmd().args(args).output().expect("hover runs")
}

/// Bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A scratch directory, removed when dropped.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new empty directory named after the test.
    pub fn new(test: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("hover-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    /// A path inside it.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `hover run` or `hover restore` in a child process, with its API socket.
pub struct Vm {
    child: Option<Child>,
    pub socket: PathBuf,
}

/// A test that fails midway must not leave its VM running (a post-copy
/// source that lost its link waits for a recovery for ever).
impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Vm {
    /// Start `hover <args> --api-socket SOCKET --json --console off` and wait
    /// for its socket to appear.
    pub fn spawn(args: &[&str], socket: &Path) -> Vm {
        let child = hover_cmd()
            .args(args)
            .args([
                "--api-socket",
                socket.to_str().unwrap(),
                "--json",
                "--console",
                "off",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("hover starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !socket.exists() {
            assert!(Instant::now() < deadline, "{socket:?} never appeared");
            std::thread::sleep(Duration::from_millis(5));
        }
        Vm {
            child: Some(child),
            socket: socket.into(),
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("not waited for").id()
    }

    /// A client of its API.
    pub fn api(&self) -> ApiClient {
        ApiClient::new(&self.socket, Duration::from_secs(120))
    }

    /// End it through the API (`PUT /vm/shutdown`) and wait: its JSON
    /// outcome, checked to say the API ended a run that was still going.
    /// Tests that steer a VM run a workload that outlasts them and end it
    /// here, so a slow host never has the guest finish first.
    pub fn shut_down(self) -> serde_json::Value {
        self.api()
            .json("PUT", "/vm/shutdown", None)
            .unwrap_or_else(|e| panic!("shutdown refused (did the guest end first?): {e}"));
        let (code, outcome, stderr) = self.wait();
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(outcome["ended"], "shutdown", "{outcome}");
        outcome
    }

    /// Wait for the process: its exit status, its JSON outcome (or Null) and stderr.
    pub fn wait(mut self) -> (Option<i32>, serde_json::Value, String) {
        let out = self
            .child
            .take()
            .expect("waited once")
            .wait_with_output()
            .unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        (out.status.code(), v, text(&out.stderr))
    }
}

/// The unsigned report `key` of a JSON outcome.
pub fn report(outcome: &serde_json::Value, key: &str) -> u64 {
    outcome["reports"]
        .as_array()
        .and_then(|r| r.iter().find(|e| e["key"] == key))
        .and_then(|e| e["value"].as_u64())
        .unwrap_or_else(|| panic!("no report {key} in {outcome}"))
}

/// The sorted report keys of a JSON outcome.
pub fn report_keys(outcome: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = outcome["reports"]
        .as_array()
        .map(|r| {
            r.iter()
                .map(|e| e["key"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default();
    k.sort();
    k
}

/// The threads of process `pid` now: (name, thread id) each (empty once
/// it has ended).
pub fn threads(pid: u32) -> Vec<(String, u32)> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_string_lossy().parse().ok()?;
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            Some((comm.trim().to_string(), tid))
        })
        .collect()
}
