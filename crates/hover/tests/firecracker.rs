//! `hover firecracker` answers Firecracker's API as docs/FIRECRACKER.md
//! says: every endpoint of its tables against the live server, every
//! refused and out-of-order request with a 400 and a `fault_message` that
//! names the problem (and the server still configuring or the VM still
//! running after it), the command line's refusals, and the binary invoked
//! as `firecracker`.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{hover, hover_cmd, text, Scratch};
use hover_vmm::firecracker::{DEVICES, ENDPOINTS};
use hover_vmm::host::kvm_for_test;

/// One request: (status, body).
fn req(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
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
fn refused(sock: &Path, method: &str, path: &str, body: &str, needle: &str) {
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
fn done(sock: &Path, method: &str, path: &str, body: &str) {
    let (status, answer) = req(sock, method, path, body);
    assert_eq!(
        (status, answer.as_str()),
        (204, ""),
        "{method} {path} {body}"
    );
}

struct Fc {
    child: Option<Child>,
    sock: PathBuf,
}

impl Fc {
    fn spawn(dir: &Scratch, extra: &[&str]) -> Fc {
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

    fn wait(mut self) -> (Option<i32>, String, String) {
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

fn guest(dir: &Scratch) -> PathBuf {
    let p = dir.path("guest.elf");
    let out = hover(&["guest-image", "--out", p.to_str().unwrap()]);
    assert!(out.status.success());
    p
}

/// The `| \`METHOD /path\` |` rows of a table in docs/FIRECRACKER.md
/// under `heading`.
fn doc_rows(heading: &str) -> Vec<String> {
    let doc = include_str!("../../../docs/FIRECRACKER.md");
    let section = doc.split(heading).nth(1).expect("heading");
    let table = section.split("\n\n").find(|p| p.starts_with('|')).unwrap();
    table
        .lines()
        .skip(2)
        .filter_map(|l| l.split('`').nth(1).map(String::from))
        .collect()
}

#[test]
fn the_docs_list_exactly_the_endpoints_the_server_answers() {
    let documented: Vec<String> = doc_rows("## Endpoints");
    let served: Vec<String> = ENDPOINTS.iter().map(|(m, p)| format!("{m} {p}")).collect();
    for e in &served {
        assert!(
            documented.contains(e),
            "{e} is answered but not in docs/FIRECRACKER.md"
        );
    }
    for e in &documented {
        assert!(served.contains(e), "{e} is documented but not answered");
    }
    let refused = doc_rows("### Refused");
    for (path, _) in DEVICES {
        assert!(
            refused.iter().any(|r| r.starts_with(path)),
            "{path} is refused but not documented"
        );
    }
}

#[test]
fn every_documented_endpoint_answers_on_the_live_server() {
    if !kvm_for_test("every_documented_endpoint_answers_on_the_live_server") {
        return;
    }
    let dir = Scratch::new("fc-walk");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    // Before the start: queries answer 200, and each device is refused.
    for (m, p) in ENDPOINTS.iter().filter(|(m, _)| *m == "GET") {
        let (status, body) = req(s, m, p, "");
        assert_eq!(status, 200, "{m} {p}: {body}");
    }
    for (path, _) in DEVICES {
        for method in ["GET", "PUT", "PATCH"] {
            refused(s, method, &format!("{path}/x"), "{}", "Hover has no");
            refused(s, method, path, "{}", "Hover has no");
        }
    }
    refused(s, "GET", "/vm", "", "once the microVM runs");
    done(
        s,
        "PUT",
        "/logger",
        &format!(
            r#"{{"log_path": "{}", "level": "Info"}}"#,
            dir.path("log").display()
        ),
    );
    done(
        s,
        "PUT",
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, dir.path("metrics").display()),
    );
    done(s, "PATCH", "/machine-config", r#"{"mem_size_mib": 64}"#);
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=spin tasks=2 seconds=120"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    // Running: the rest, and Hover's own endpoints on the same socket.
    let (status, info) = req(s, "GET", "/", "");
    assert_eq!(status, 200);
    assert!(info.contains(r#""state":"Running""#), "{info}");
    let (status, vm) = req(s, "GET", "/vm", "");
    assert_eq!(status, 200, "{vm}");
    done(s, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    let snap = dir.path("vm.snap");
    let mem = dir.path("vm.mem");
    let create = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "snapshot_type": "Full"}}"#,
        snap.display(),
        mem.display()
    );
    done(s, "PUT", "/snapshot/create", &create);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&snap).unwrap().ino(),
        std::fs::metadata(&mem).unwrap().ino(),
        "the memory file is the snapshot's second name"
    );
    done(s, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    done(s, "PUT", "/actions", r#"{"action_type": "FlushMetrics"}"#);
    let (status, config) = req(s, "GET", "/vm/config", "");
    assert_eq!(status, 200);
    assert!(config.contains("spin"), "{config}");
    done(s, "PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#);
    let (code, stdout, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("shut down"), "{stdout}");
    let metrics = std::fs::read_to_string(dir.path("metrics")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "one on FlushMetrics, one at the end: {metrics}"
    );
    assert_eq!(lines[0]["state"], "running", "{metrics}");
    assert_eq!(
        lines[1]["state"], "exited",
        "the last line is the ended VM's: {metrics}"
    );
    for l in &lines {
        assert!(l["utc_timestamp_ms"].as_u64().unwrap() > 0);
        assert!(l["vcpu"]["exits"].as_u64().unwrap() > 0, "{l}");
        assert!(l["hover"]["uptime_ms"].is_u64(), "{l}");
    }
    assert!(!dir.path("fc.sock").exists());
}

#[test]
fn out_of_order_and_malformed_requests_get_a_reason_and_change_nothing() {
    if !kvm_for_test("out_of_order_and_malformed_requests_get_a_reason_and_change_nothing") {
        return;
    }
    let dir = Scratch::new("fc-order");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    refused(
        s,
        "PATCH",
        "/vm",
        r#"{"state": "Paused"}"#,
        "before starting",
    );
    refused(
        s,
        "PUT",
        "/snapshot/create",
        r#"{"snapshot_path": "a", "mem_file_path": "b"}"#,
        "before starting",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "SendCtrlAltDel"}"#,
        "before starting",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        "without kernel configuration",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "FlushMetrics"}"#,
        "not initialized",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "Reboot"}"#,
        "unknown action_type",
    );
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "bogus": 1}"#,
        "unknown field",
    );
    refused(s, "PUT", "/machine-config", "{not json", "deserializing");
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 0, "mem_size_mib": 64}"#,
        "vcpu_count",
    );
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "smt": true}"#,
        "SMT",
    );
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "cpu_template": "T2"}"#,
        "CPU templates",
    );
    refused(
        s,
        "PUT",
        "/boot-source",
        r#"{"kernel_image_path": "/nonexistent/vmlinux"}"#,
        "/nonexistent/vmlinux",
    );
    let notes = dir.path("notes.txt");
    std::fs::write(&notes, "hello").unwrap();
    refused(
        s,
        "PUT",
        "/boot-source",
        &format!(r#"{{"kernel_image_path": "{}"}}"#, notes.display()),
        "not an ELF",
    );
    let bz = dir.path("bzImage");
    let mut b = vec![0u8; 1024];
    b[0x202..0x206].copy_from_slice(b"HdrS");
    std::fs::write(&bz, b).unwrap();
    refused(
        s,
        "PUT",
        "/boot-source",
        &format!(r#"{{"kernel_image_path": "{}"}}"#, bz.display()),
        "bzImage",
    );
    let with_initrd = format!(
        r#"{{"kernel_image_path": "{}", "initrd_path": "{}"}}"#,
        image.display(),
        notes.display()
    );
    refused(s, "PUT", "/boot-source", &with_initrd, "initrd");
    let bad_args = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=nosuch"}}"#,
        image.display()
    );
    refused(s, "PUT", "/boot-source", &bad_args, "boot_args");
    refused(
        s,
        "PUT",
        "/logger",
        r#"{"log_path": "/tmp/x", "level": "Loud"}"#,
        "level",
    );
    // A named pipe nobody reads: the metrics open without waiting.
    let fifo = dir.path("log.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let metrics = format!(r#"{{"metrics_path": "{}"}}"#, fifo.display());
    done(s, "PUT", "/metrics", &metrics);
    refused(s, "PUT", "/metrics", &metrics, "Reinitialization");
    let boot_fifo = format!(r#"{{"kernel_image_path": "{}"}}"#, fifo.display());
    refused(s, "PUT", "/boot-source", &boot_fifo, "not a regular file");
    // Nothing of the refused requests stuck.
    let (_, mc) = req(s, "GET", "/machine-config", "");
    assert!(
        mc.contains(r#""vcpu_count":1"#) && mc.contains(r#""mem_size_mib":128"#),
        "{mc}"
    );
    let (_, config) = req(s, "GET", "/vm/config", "");
    assert!(!config.contains("boot-source"), "{config}");
    // A snapshot load after configuring the machine.
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "a", "mem_file_path": "a"}"#,
        "after configuring",
    );
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=spin tasks=2 seconds=120"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    // After the start.
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        "already running",
    );
    refused(s, "PUT", "/boot-source", &boot, "after starting");
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
        "after starting",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "a", "mem_file_path": "a"}"#,
        "after starting",
    );
    refused(
        s,
        "PUT",
        "/logger",
        r#"{"log_path": "/tmp/x"}"#,
        "after starting",
    );
    refused(
        s,
        "PATCH",
        "/vm",
        r#"{"state": "Frozen"}"#,
        "Paused or Resumed",
    );
    refused(
        s,
        "PATCH",
        "/vm",
        r#"{"state": "Paused", "extra": 1}"#,
        "unknown field",
    );
    let create = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        dir.path("s").display(),
        dir.path("m").display()
    );
    refused(s, "PUT", "/snapshot/create", &create, "pause it first");
    done(s, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    let diff = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "snapshot_type": "Diff"}}"#,
        dir.path("s").display(),
        dir.path("m").display()
    );
    refused(s, "PUT", "/snapshot/create", &diff, "full snapshots only");
    let with = |extra: &str, mem: &str| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{mem}"{extra}}}"#,
            dir.path("s").display()
        )
    };
    let m = dir.path("m").display().to_string();
    let half = with(r#", "snapshot_type": "Half""#, &m);
    refused(s, "PUT", "/snapshot/create", &half, "unknown snapshot_type");
    let old = with(r#", "version": "0.25.0""#, &m);
    refused(
        s,
        "PUT",
        "/snapshot/create",
        &old,
        "its own snapshot format",
    );
    // /dev/shm is another filesystem than the scratch directory.
    let shm = format!("/dev/shm/hover-fc-mem-{}", std::process::id());
    refused(
        s,
        "PUT",
        "/snapshot/create",
        &with("", &shm),
        "one filesystem",
    );
    assert!(!Path::new(&shm).exists() && !dir.path("s").exists());
    refused(
        s,
        "PUT",
        "/metrics",
        r#"{"metrics_path": "/tmp/m"}"#,
        "after starting",
    );
    let existing = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        dir.path("s").display(),
        notes.display()
    );
    refused(s, "PUT", "/snapshot/create", &existing, "already exists");
    assert!(!dir.path("s").exists(), "a refused snapshot left its file");
    // The VM still runs after all of it.
    done(s, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    let (_, info) = req(s, "GET", "/", "");
    assert!(info.contains(r#""state":"Running""#), "{info}");
    done(s, "PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#);
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_snapshot_load_of_files_that_are_not_hovers_is_refused() {
    if !kvm_for_test("a_snapshot_load_of_files_that_are_not_hovers_is_refused") {
        return;
    }
    let dir = Scratch::new("fc-load");
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    let junk = dir.path("junk");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    let load = |snap: &Path, mem: &Path| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            snap.display(),
            mem.display()
        )
    };
    refused(
        s,
        "PUT",
        "/snapshot/load",
        &load(&junk, &junk),
        "not a Hover snapshot",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        &load(&junk, &dir.path("missing")),
        "mem_file_path",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "x", "mem_backend": {"backend_type": "Uffd", "backend_path": "y"}}"#,
        "Uffd",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "x", "mem_file_path": "x", "enable_diff_snapshots": true}"#,
        "full snapshots only",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "x"}"#,
        "mem_file_path",
    );
    let both = r#"{"snapshot_path": "x", "mem_file_path": "x", "mem_backend": {"backend_type": "File", "backend_path": "x"}}"#;
    refused(s, "PUT", "/snapshot/load", both, "not both");
    let tape =
        r#"{"snapshot_path": "x", "mem_backend": {"backend_type": "Tape", "backend_path": "x"}}"#;
    refused(s, "PUT", "/snapshot/load", tape, "unknown backend_type");
    let (_, info) = req(s, "GET", "/", "");
    assert!(info.contains("Not started"), "{info}");
    // A real snapshot, with another file as its memory, then with a copy.
    let src = Scratch::new("fc-load-src");
    let snap = snapshot_of_a_running_vm(&src);
    refused(
        s,
        "PUT",
        "/snapshot/load",
        &load(&snap, &junk),
        "not the memory of snapshot",
    );
    let copy = dir.path("copy.mem");
    std::fs::copy(&snap, &copy).unwrap();
    done(s, "PUT", "/snapshot/load", &load(&snap, &copy));
    let (_, info) = req(s, "GET", "/", "");
    assert!(
        info.contains(r#""state":"Paused""#),
        "loaded without resume_vm: {info}"
    );
    let (_, mc) = req(s, "GET", "/machine-config", "");
    assert!(
        mc.contains(r#""vcpu_count":2"#) && mc.contains(r#""mem_size_mib":64"#),
        "the snapshot's machine: {mc}"
    );
    done(s, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    let (code, stdout, stderr) = fc.wait();
    assert_eq!(
        code,
        Some(0),
        "the restored guest runs to its end: {stderr}"
    );
    assert!(stdout.contains("restored from"), "{stdout}");
}

/// A snapshot (both names one file) of a VM `hover firecracker` runs.
fn snapshot_of_a_running_vm(dir: &Scratch) -> PathBuf {
    let image = guest(dir);
    let fc = Fc::spawn(dir, &[]);
    let s = &fc.sock;
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=kvstore wss=4M rate=1000 seconds=2"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    done(s, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    let snap = dir.path("vm.snap");
    let create = format!(
        r#"{{"snapshot_path": "{0}", "mem_file_path": "{0}"}}"#,
        snap.display()
    );
    done(s, "PUT", "/snapshot/create", &create);
    done(s, "PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#);
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
    snap
}

#[test]
fn sigterm_before_a_start_removes_the_socket() {
    let dir = Scratch::new("fc-sigterm");
    let fc = Fc::spawn(&dir, &[]);
    // SAFETY: kill(2) with a child's pid.
    unsafe { libc::kill(fc.child.as_ref().unwrap().id() as i32, libc::SIGTERM) };
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(143), "{stderr}");
    assert!(!dir.path("fc.sock").exists());
}

#[test]
fn a_guest_that_ends_at_once_still_gets_its_start_answered() {
    if !kvm_for_test("a_guest_that_ends_at_once_still_gets_its_start_answered") {
        return;
    }
    let dir = Scratch::new("fc-short");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=hello"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    // The guest may power off before the answer goes out: it ran, so 204.
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn the_command_line_is_firecrackers_and_never_claims_to_be_it() {
    let dir = Scratch::new("fc-cli");
    let link = dir.path("firecracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hover"), &link).unwrap();
    let out = std::process::Command::new(&link)
        .arg("--version")
        .output()
        .unwrap();
    let v = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        v.starts_with("Hover ") && v.contains("not Firecracker"),
        "{v}"
    );
    let out = hover(&[
        "firecracker",
        "--seccomp-filter",
        "/x.bpf",
        "--api-sock",
        "/tmp/none",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--no-seccomp"));
    let out = hover(&["firecracker", "--no-api"]);
    assert_eq!(out.status.code(), Some(2), "--no-api needs --config-file");
    let cfg = dir.path("vm.json");
    std::fs::write(
        &cfg,
        r#"{"boot-source": {"kernel_image_path": "x"}, "drives": [{"drive_id": "rootfs"}]}"#,
    )
    .unwrap();
    let out = hover(&[
        "firecracker",
        "--no-api",
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("drives"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_config_file_boots_the_guest_without_an_api() {
    if !kvm_for_test("a_config_file_boots_the_guest_without_an_api") {
        return;
    }
    let dir = Scratch::new("fc-config");
    let image = guest(&dir);
    let cfg = dir.path("vm.json");
    let json = format!(
        r#"{{"boot-source": {{"kernel_image_path": "{}", "boot_args": "workload=memtouch size=8M tasks=2"}},
            "machine-config": {{"vcpu_count": 2, "mem_size_mib": 64}}}}"#,
        image.display()
    );
    std::fs::write(&cfg, json).unwrap();
    let out = hover(&[
        "firecracker",
        "--no-api",
        "--config-file",
        cfg.to_str().unwrap(),
        "--console",
        "off",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["ended"], "power_off");
}

#[test]
fn a_vm_a_firecracker_client_started_migrates_with_hover_ctl() {
    if !kvm_for_test("a_vm_a_firecracker_client_started_migrates_with_hover_ctl") {
        return;
    }
    let dir = Scratch::new("fc-migrate");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &["--json"]);
    let s = &fc.sock;
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=kvstore wss=4M rate=1000 seconds=3"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    let listen = format!("unix:{}", dir.path("in.sock").display());
    let (rx, at) = common::migrate::receiver(&listen);
    let out = hover(&[
        "ctl",
        "--api-socket",
        s.to_str().unwrap(),
        "migrate",
        "--to",
        &at,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, stdout, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let o: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(o["ended"], "migrated", "{o}");
    let (code, o, stderr) = common::migrate::finish(rx);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        o["ended"], "power_off",
        "the guest ran on to its verified end: {o}"
    );
}
