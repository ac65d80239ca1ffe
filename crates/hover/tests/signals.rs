//! SIGTERM and SIGINT end a VM cleanly, as tools that stop VMMs expect (the
//! Firecracker Go SDK's `StopVMM` sends SIGTERM): the outcome is printed
//! with `ended: signal`, the API socket is gone, and the exit status is
//! 128 + the signal, whether the VM runs, is paused, or has not come yet.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{hover_cmd, text, Scratch, Vm};
use hover_vmm::host::kvm_for_test;

fn send(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a child's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// Wait until the VM's API says `state`.
fn wait_for_state(vm: &Vm, state: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = vm.api().json("GET", "/vm", None).unwrap();
        if info["state"] == state {
            return;
        }
        assert!(Instant::now() < deadline, "never {state}: {info}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `hover <args>` under an API socket, ended by `sig` once it is in
/// `state` (after `PUT path` when one is given).
fn ended_by(name: &str, args: &[&str], put: Option<&str>, state: &str, sig: i32) {
    let dir = Scratch::new(name);
    let socket = dir.path("api.sock");
    let vm = Vm::spawn(args, &socket);
    if let Some(path) = put {
        vm.api().json("PUT", path, None).unwrap();
    }
    wait_for_state(&vm, state);
    send(vm.pid(), sig);
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(code, Some(128 + sig), "{stderr}");
    assert_eq!(outcome["ended"], "signal", "{outcome}");
    assert_eq!(outcome["exit_code"], 128 + sig, "{outcome}");
    assert!(!socket.exists(), "the API socket outlived the VM");
}

#[test]
fn sigterm_ends_a_running_vm_with_its_outcome_and_no_socket_left() {
    if !kvm_for_test("sigterm_ends_a_running_vm_with_its_outcome_and_no_socket_left") {
        return;
    }
    let args = ["run", "--cmdline", "workload=spin tasks=2 seconds=120"];
    ended_by("sigterm-running", &args, None, "running", libc::SIGTERM);
}

#[test]
fn sigint_ends_a_paused_vm_with_status_130() {
    if !kvm_for_test("sigint_ends_a_paused_vm_with_status_130") {
        return;
    }
    let args = ["run", "--cmdline", "workload=spin tasks=2 seconds=120"];
    ended_by(
        "sigint-paused",
        &args,
        Some("/vm/pause"),
        "paused",
        libc::SIGINT,
    );
}

/// `hover receive` on the Unix socket `listen`, its output piped, once it
/// listens.
fn receiver_listening_at(listen: &std::path::Path) -> std::process::Child {
    let child = hover_cmd()
        .args(["receive", "--listen"])
        .arg(format!("unix:{}", listen.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !listen.exists() {
        assert!(Instant::now() < deadline, "the receiver never listened");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

#[test]
fn sigterm_ends_a_receiver_still_waiting_and_removes_its_socket() {
    let dir = Scratch::new("sigterm-receiver");
    let listen = dir.path("in.sock");
    let child = receiver_listening_at(&listen);
    send(child.id(), libc::SIGTERM);
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(stderr.contains("SIGTERM"), "{stderr}");
    assert!(
        !listen.exists(),
        "the listening socket outlived the receiver"
    );
}

#[test]
fn sigterm_ends_a_restored_vm_as_it_ends_a_booted_one() {
    if !kvm_for_test("sigterm_ends_a_restored_vm_as_it_ends_a_booted_one") {
        return;
    }
    let dir = Scratch::new("sigterm-restored");
    let vm = Vm::spawn(
        &["run", "--cmdline", "workload=spin tasks=2 seconds=120"],
        &dir.path("src.sock"),
    );
    wait_for_state(&vm, "running");
    let snap = dir.path("vm.snap");
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    vm.api().json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    let (code, _, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let args = [
        "restore",
        snap.to_str().unwrap(),
        "--memory-restore",
        "lazy",
    ];
    ended_by(
        "sigterm-restored-run",
        &args,
        None,
        "running",
        libc::SIGTERM,
    );
}

#[test]
fn sigterm_ends_a_receiver_whose_output_nobody_reads() {
    // A parent that stopped reading (it failed, it was killed) leaves the
    // receiver writing into closed pipes: SIGTERM must still end it, and
    // remove its socket.
    let dir = Scratch::new("sigterm-unread");
    let listen = dir.path("in.sock");
    let mut child = receiver_listening_at(&listen);
    drop(child.stdout.take());
    drop(child.stderr.take());
    send(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("SIGTERM did not end a receiver whose stderr is closed (30 s)");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(143));
    assert!(
        !listen.exists(),
        "the listening socket outlived the receiver"
    );
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // pid (comm) state ppid ...: comm may hold spaces, so after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn sigterm_to_a_bench_ends_the_vms_it_started() {
    if !kvm_for_test("sigterm_to_a_bench_ends_the_vms_it_started") {
        return;
    }
    let dir = Scratch::new("sigterm-bench");
    // One long apf run: its `hover run` is the bench's child for seconds.
    let mut bench = hover_cmd()
        .args([
            "bench",
            "apf",
            "--runs",
            "1",
            "--seconds",
            "60",
            "--latencies",
            "0",
        ])
        .arg("--out")
        .arg(dir.path("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let vm = loop {
        if let Some(&vm) = children_of(bench.id()).first() {
            break vm;
        }
        assert!(Instant::now() < deadline, "the bench started no VM");
        std::thread::sleep(Duration::from_millis(20));
    };
    send(bench.id(), libc::SIGTERM);
    let status = bench.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !gone(vm) {
        if Instant::now() > deadline {
            // SAFETY: the bench's own child, left behind.
            unsafe { libc::kill(vm as i32, libc::SIGKILL) };
            panic!("the VM {vm} the bench started outlived it by 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
