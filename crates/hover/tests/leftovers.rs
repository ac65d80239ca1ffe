//! Nothing the VMM makes for itself outlives it, however it ends: a
//! `hover run` killed with SIGKILL at moments spread over its run (its pager
//! evicting to the page store, its I/O device writing its default file, or
//! still starting) leaves no file behind.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;

use common::{hover_cmd, Scratch};
use hover_vmm::host::kvm_for_test;

#[test]
fn a_killed_vm_leaves_no_page_store_behind() {
    if !kvm_for_test("a_killed_vm_leaves_no_page_store_behind") {
        return;
    }
    let dir = Scratch::new("leftovers");
    // Moments spread from start-up to well into the eviction (no RNG
    // crate: a fixed spread is as good and repeatable).
    for ms in [0u64, 5, 40, 150, 400, 900] {
        let mut child = hover_cmd()
            .args(["run", "--memory", "128M", "--memory-budget", "16M"])
            .arg("--page-store")
            .arg(&dir.0)
            .args([
                "--console",
                "off",
                "--cmdline",
                "workload=memtouch size=64M",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(ms));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "killed after {ms} ms ({:?}): left {left:?}",
            status.signal()
        );
    }
}

#[test]
fn a_killed_vm_leaves_no_io_file_behind() {
    if !kvm_for_test("a_killed_vm_leaves_no_io_file_behind") {
        return;
    }
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        println!("skipped: no /dev/shm here (the I/O file then goes to the temp dir)");
        return;
    }
    for ms in [0u64, 5, 40, 150, 400] {
        let mut child = hover_cmd()
            .args(["run", "--console", "off"])
            .args(["--cmdline", "workload=iolat size=64K seconds=2"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let prefix = format!("hover-io-{}-", child.id());
        std::thread::sleep(Duration::from_millis(ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let left: Vec<_> = std::fs::read_dir(shm)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "killed after {ms} ms: left {left:?}");
    }
}

#[test]
fn a_killed_vms_api_socket_is_taken_over_by_the_next_start() {
    if !kvm_for_test("a_killed_vms_api_socket_is_taken_over_by_the_next_start") {
        return;
    }
    let dir = Scratch::new("leftover-socket");
    let sock = dir.path("vm.sock");
    let start = |seconds: u32| {
        let c = hover_cmd()
            .args(["run", "--console", "off", "--api-socket"])
            .arg(&sock)
            .args([
                "--cmdline",
                &format!("workload=spin tasks=1 seconds={seconds}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while !sock.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "no socket");
            std::thread::sleep(Duration::from_millis(5));
        }
        c
    };
    let mut killed = start(30);
    killed.kill().unwrap();
    killed.wait().unwrap();
    assert!(sock.exists(), "SIGKILL leaves the socket file");
    // A kill between binding and linking leaves a staging name: the next
    // start removes those of dead processes (and only those).
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let stale = dir.path(&format!(".hover-api-{dead_pid}-0"));
    let live = dir.path(&format!(".hover-api-{}-0", std::process::id()));
    std::fs::write(&stale, b"").unwrap();
    std::fs::write(&live, b"").unwrap();
    // The next VM finds nobody listening there and takes the path.
    let next = start(1);
    let out = next.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stale socket"),
        "it says so"
    );
    assert!(!sock.exists(), "and removes it at its exit");
    assert!(!stale.exists(), "a dead VMM's staging name is removed");
    assert!(live.exists(), "a live process's is not");
    std::fs::remove_file(&live).unwrap();
    // A regular file there is never touched.
    std::fs::write(&sock, b"keep").unwrap();
    let out = hover_cmd()
        .args(["run", "--console", "off", "--api-socket"])
        .arg(&sock)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(std::fs::read(&sock).unwrap(), b"keep");
}
