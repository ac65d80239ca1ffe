//! The thread that runs the VM is under the `control` seccomp filter once
//! the VM runs, and `hover receive`'s before it reads a byte of a stream
//! (docs/RELIABILITY.md); `--seccomp off` leaves it unfiltered. What it may
//! not do (start a program) is the seccomp unit tests' business; here, that
//! the binary installs it where it says.

mod common;

use common::migrate::{finish, receiver_with};
use common::{Scratch, Vm};
use hover_vmm::host::kvm_for_test;

/// The seccomp mode of thread `tid` of process `pid` (0 none, 2 filter).
fn seccomp_of(pid: u32, tid: u32) -> u32 {
    status_field(pid, tid, "Seccomp:")
}

/// A line of `/proc/PID/task/TID/status`, as a number.
fn status_field(pid: u32, tid: u32, field: &str) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_else(|| panic!("no {field} line: {status}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn the_main_thread_is_filtered_once_the_vm_runs() {
    if !kvm_for_test("the_main_thread_is_filtered_once_the_vm_runs") {
        return;
    }
    let dir = Scratch::new("confined");
    for (seccomp, want) in [("on", 2), ("off", 0)] {
        let vm = Vm::spawn(
            &[
                "run",
                "--seccomp",
                seccomp,
                "--cmdline",
                "workload=spin seconds=30",
            ],
            &dir.path(&format!("{seccomp}.sock")),
        );
        // The API answers once the control loop serves it.
        vm.api().json("GET", "/vm", None).unwrap();
        assert_eq!(seccomp_of(vm.pid(), vm.pid()), want, "--seccomp {seccomp}");
        vm.api().call("PUT", "/vm/shutdown", None).unwrap();
        let (code, _, stderr) = vm.wait();
        assert_eq!(code, Some(0), "{stderr}");
    }
}

/// Taking a VM in runs confined from the first byte: building the VM,
/// checking its own `--io-file`, loading the state, running it.
#[test]
fn a_confined_receiver_takes_a_vm_in_with_its_own_io_file() {
    if !kvm_for_test("a_confined_receiver_takes_a_vm_in_with_its_own_io_file") {
        return;
    }
    let dir = Scratch::new("confined-io");
    let io = dir.path("io.bin");
    let listen = format!("unix:{}", dir.path("in.sock").display());
    let (rx, at) = receiver_with(&listen, &["--io-file", io.to_str().unwrap()]);
    let src = Vm::spawn(
        &[
            "run",
            "--cmdline",
            "workload=kvstore wss=16M rate=1000 seconds=10",
        ],
        &dir.path("src.sock"),
    );
    let body = serde_json::json!({ "to": at, "verify": true }).to_string();
    src.api().json("PUT", "/vm/migrate", Some(&body)).unwrap();
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(rx);
    assert_eq!(code, Some(0), "{stderr}");
    // It ran to the guest's end: checking the I/O file's path (access(2))
    // under the filter did not stop it.
    assert_eq!(o["ended"], "power_off", "{o}");
}

#[test]
fn a_receiver_is_filtered_before_it_reads_a_stream() {
    let dir = Scratch::new("confined-receive");
    let (mut rx, _) = receiver_with(&format!("unix:{}", dir.path("in.sock").display()), &[]);
    // It said where it listens: it is waiting, confined.
    assert_eq!(seccomp_of(rx.id(), rx.id()), 2);
    rx.kill().unwrap();
    rx.wait().unwrap();
}

/// The pager's fetch workers are started by its fault thread and inherit
/// its filter (the seccomp unit tests show they install none): every one
/// of them is filtered, with as many filters as the fault thread.
#[test]
fn every_pager_thread_is_filtered() {
    if !kvm_for_test("every_pager_thread_is_filtered") {
        return;
    }
    let dir = Scratch::new("confined-pager");
    let vm = Vm::spawn(
        &[
            "run",
            "--memory",
            "128M",
            "--memory-budget",
            "32M",
            "--cmdline",
            "workload=spin seconds=30",
        ],
        &dir.path("api.sock"),
    );
    vm.api().json("GET", "/vm", None).unwrap();
    let pid = vm.pid();
    // The fault thread starts the workers once it runs: wait for them.
    let pager_threads = || {
        let mut named = common::threads(pid);
        named.retain(|(n, _)| n.starts_with("pager-"));
        named
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // A new thread carries its starter's name until it sets its own: wait
    // until the 16 workers' names are all there.
    let workers_named = |named: &[(String, u32)]| {
        let mut n: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
        n.retain(|n| *n != "pager-faults");
        n.sort_unstable();
        n.dedup();
        n.len() == 16
    };
    let mut named = pager_threads();
    while !workers_named(&named) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        named = pager_threads();
    }
    let faults = named
        .iter()
        .find(|(n, _)| n == "pager-faults")
        .unwrap_or_else(|| panic!("no pager-faults thread among {named:?}"))
        .1;
    let filters = status_field(pid, faults, "Seccomp_filters:");
    assert!(filters >= 1, "the fault thread is filtered");
    let workers: Vec<_> = named.iter().filter(|(n, _)| n != "pager-faults").collect();
    assert_eq!(workers.len(), 16, "{named:?}");
    for (name, tid) in workers {
        assert_eq!(seccomp_of(pid, *tid), 2, "{name}");
        assert_eq!(
            status_field(pid, *tid, "Seccomp_filters:"),
            filters,
            "{name}"
        );
    }
    vm.api().call("PUT", "/vm/shutdown", None).unwrap();
    let (code, _, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
}
