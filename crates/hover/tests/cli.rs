//! The `hover` command line: what a user types, what comes back, which exit status.

use std::process::Command;

use hover_vmm::host::kvm_for_test;

mod common;
use common::{hover, text};

#[test]
fn run_boots_the_builtin_guest_with_defaults() {
    if !kvm_for_test("run_boots_the_builtin_guest_with_defaults") {
        return;
    }
    let out = hover(&["run"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("hello from vCPU 0 of 2"), "{stdout}");
    assert!(stdout.contains("hello from vCPU 1 of 2"), "{stdout}");
    assert!(stdout.contains("vcpus_seen = 2"), "{stdout}");
    assert!(stdout.contains("first instruction"), "{stdout}");
}

#[test]
fn run_json_is_machine_readable() {
    if !kvm_for_test("run_json_is_machine_readable") {
        return;
    }
    let out = hover(&["run", "--vcpus", "1", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("stdout is one JSON document");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["reports"][0]["key"], "vcpus_seen");
    assert_eq!(v["reports"][0]["value"], 1);
    assert!(v["timings"]["exit_us"].as_u64().unwrap() > 0);
    // With --json the console moves to stderr.
    assert!(text(&out.stderr).contains("hello from vCPU 0 of 1"));
}

#[test]
fn console_to_a_file() {
    if !kvm_for_test("console_to_a_file") {
        return;
    }
    let path = std::env::temp_dir().join(format!("hover-console-{}.txt", std::process::id()));
    let arg = format!("file:{}", path.display());
    let out = hover(&["run", "--console", &arg]);
    assert_eq!(out.status.code(), Some(0));
    let console = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(console.contains("hello from vCPU 1 of 2"), "{console}");
    assert!(
        !text(&out.stdout).contains("hello from"),
        "console went to stdout too"
    );
}

#[test]
fn triple_fault_exits_3_with_a_register_dump() {
    if !kvm_for_test("triple_fault_exits_3_with_a_register_dump") {
        return;
    }
    let out = hover(&["run", "--cmdline", "workload=triple-fault"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("triple fault") && stderr.contains("rip") && stderr.contains("efer"),
        "{stderr}"
    );
}

/// Every bad input: exit status 2, one line naming the problem, no panic.
/// These are refused before KVM is touched, so they need no /dev/kvm.
#[test]
fn bad_input_is_one_line_and_exit_2() {
    let guest_dir = std::env::temp_dir();
    let not_elf = guest_dir.join(format!("hover-not-elf-{}", std::process::id()));
    std::fs::write(&not_elf, b"#!/bin/sh\necho hi\n").unwrap();
    let not_elf = not_elf.display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "--vcpus", "0"], "1 to 32 vCPUs"),
        (&["run", "--boost-policy", "rr"], "unknown boost policy"),
        (&["run", "--boost-policy", "fifo:0"], "OS accepts 1 to 99"),
        (
            &["run", "--boost-policy", "nice:-21"],
            "OS accepts -20 to 19",
        ),
        (
            &["run", "--boost", "on", "--vcpu-rt"],
            "cannot be used with",
        ),
        (
            &["run", "--boost-max-ms", "0"],
            "--boost-max-ms 0 is out of range",
        ),
        (
            &["run", "--boost-poll-us", "10"],
            "--boost-poll-us 10 is out of range",
        ),
        (&["run", "--vcpus", "33"], "1 to 32 vCPUs"),
        (
            &["run", "--guest-io-max", "32G"],
            "--guest-io-max must be between 4K and 16G",
        ),
        (
            &["run", "--guest-msi-max-pending", "0"],
            "--guest-msi-max-pending must be",
        ),
        (
            &["restore", "/nonexistent", "--guest-log-max", "2G"],
            "--guest-log-max must be at most 1G",
        ),
        (&["run", "--vcpus=-1"], "--vcpus"),
        (&["run", "--memory", "1000"], "not a multiple of 4 KiB"),
        (&["run", "--memory", "2M"], "needs at least"),
        (&["run", "--memory", "100T"], "too large"),
        (&["run", "--memory", "lots"], "not a size"),
        (
            &["run", "--guest", "/nonexistent/guest"],
            "cannot read guest image",
        ),
        (&["run", "--guest", &not_elf], "not a bootable x86_64 ELF"),
        (
            &["run", "--cmdline", "workload=nope"],
            "unknown workload 'nope'",
        ),
        (
            &["run", "--cmdline", "workload=hello bogus=1"],
            "takes no parameter 'bogus'",
        ),
        (&["run", "--cmdline", "bogus"], "not a key=value token"),
        (
            &["run", "--cmdline", "hz=0"],
            "hz takes a number from 1 to 10000",
        ),
        (
            &["run", "--cmdline", "idle=sleep"],
            "idle takes one of halt, poll",
        ),
        (
            &["run", "--cmdline", "workload=spin tasks=100"],
            "tasks takes a number from 1 to 60",
        ),
        (
            &["run", "--cmdline", "workload=memtouch size=1T"],
            "size takes a size",
        ),
        (&["run", "--console", "stdot"], "unknown console"),
        (
            &["run", "--memory-backend", "hugepages"],
            "--memory-backend",
        ),
        (
            &["run", "--memory", "64M", "--memory-budget", "128M"],
            "larger than --memory",
        ),
        (
            &["run", "--memory", "64M", "--memory-budget", "8M"],
            "below the working minimum",
        ),
        (
            &["run", "--memory-budget", "32M", "--memory-backend", "memfd"],
            "needs anonymous memory",
        ),
        (
            &[
                "run",
                "--memory-budget",
                "32M",
                "--page-store-latency",
                "fast",
            ],
            "not a duration",
        ),
        (&["run", "--page-store", "/var/tmp"], "--memory-budget"),
        (&["run", "--async-pf", "maybe"], "--async-pf"),
        (&["run", "--halt-poll-ns", "99999999999"], "too large"),
        (&["run", "--halt-poll-ns=-5"], "--halt-poll-ns"),
        (
            &["run", "--halt-poll", "auto", "--halt-poll-budget", "0"],
            "out of range",
        ),
        (
            &["run", "--halt-poll", "auto", "--halt-poll-budget", "150"],
            "out of range",
        ),
        (&["run", "--halt-poll-budget", "5"], "--halt-poll"),
        (
            &["run", "--halt-poll", "auto", "--halt-poll-ns", "1000"],
            "cannot be used with",
        ),
        (&["run", "--halt-poll", "sometimes"], "--halt-poll"),
        (
            &["run", "--guest-halt-poll-max", "11ms"],
            "--guest-halt-poll-max 11ms is out of range: give 0 (no guest polling) up to 10ms",
        ),
        (
            &["run", "--guest-halt-poll-max", "soon"],
            "--guest-halt-poll-max",
        ),
        // The guest's writes must land in storage, never in the monitor's
        // own memory or a kernel knob.
        (&["run", "--io-file", "/proc/self/mem"], "procfs or sysfs"),
        (
            &["run", "--io-file", "/proc/sys/vm/overcommit_memory"],
            "procfs or sysfs",
        ),
        (&["run", "--io-file", "/dev/null"], "not a regular file"),
        (&["run", "--io-file", "/tmp"], "not a regular file"),
        (
            &["run", "--console", "file:/nonexistent/hover/console"],
            "cannot open the console target",
        ),
        (
            &["run", "--cmdline", "workload=kvstore wss=16X"],
            "wss=16X is not a size: wss takes a size from 64K to 64G",
        ),
    ];
    for (args, needle) in cases {
        let out = hover(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: expected '{needle}' in:\n{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?} panicked:\n{stderr}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
    std::fs::remove_file(&not_elf).unwrap();
}

/// `hover guest-image --out PATH` writes the built-in guest, which then
/// boots from the file like any other image; an existing path is refused
/// and left as it was.
#[test]
fn guest_image_writes_the_builtin_guest_and_refuses_an_existing_path() {
    if !kvm_for_test("guest_image_writes_the_builtin_guest_and_refuses_an_existing_path") {
        return;
    }
    let path = std::env::temp_dir().join(format!("hover-guest-image-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let out = hover(&["guest-image", "--out", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    let run = hover(&["run", "--guest", path.to_str().unwrap()]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("vcpus_seen"),
        "{}",
        text(&run.stdout)
    );
    let again = hover(&["guest-image", "--out", path.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(2));
    assert!(
        text(&again.stderr).contains("already exists"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the existing file is untouched"
    );
    std::fs::remove_file(&path).unwrap();
}

/// `hover stats` reads a running VM's live figures through its API socket,
/// which disappears when the VM stops; a missing or existing path is bad input.
#[test]
fn live_stats_through_the_api_socket() {
    if !kvm_for_test("live_stats_through_the_api_socket") {
        return;
    }
    let sock = std::env::temp_dir().join(format!("hover-api-test-{}.sock", std::process::id()));
    let mut vm = Command::new(env!("CARGO_BIN_EXE_hover"))
        .args(["run", "--api-socket"])
        .arg(&sock)
        .args([
            "--console",
            "off",
            "--cmdline",
            "workload=spin tasks=2 seconds=600",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let sock_s = sock.display().to_string();
    let out = hover(&["stats", "--api-socket", &sock_s, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vcpu_stats"].as_array().map(|a| a.len()), Some(2), "{v}");
    assert!(v["vcpu_stats"][0]["exits"].as_u64().unwrap() > 0);
    let summary = text(&hover(&["stats", "--api-socket", &sock_s]).stdout);
    assert!(
        summary.contains("uptime") && summary.contains("halt_exits"),
        "{summary}"
    );
    // A second VM cannot take the same path.
    let taken = hover(&["run", "--api-socket", &sock_s]);
    assert_eq!(taken.status.code(), Some(2));
    assert!(text(&taken.stderr).contains("already exists"));
    // The guest outlasts the test (a slow host never has it end first).
    let end = hover(&["ctl", "--api-socket", &sock_s, "shutdown"]);
    assert_eq!(end.status.code(), Some(0), "{}", text(&end.stderr));
    assert_eq!(vm.wait().unwrap().code(), Some(0));
    assert!(!sock.exists(), "the socket is removed at exit");
    let gone = hover(&["stats", "--api-socket", &sock_s]);
    assert_eq!(gone.status.code(), Some(2));
    assert!(
        text(&gone.stderr).contains("cannot reach a VM"),
        "{}",
        text(&gone.stderr)
    );
}

/// A closed stdout (`hover run | head -1`) neither stops the guest nor
/// makes hover panic: the VM finishes and exits with the guest's code.
#[test]
fn closed_stdout_is_not_a_panic() {
    if !kvm_for_test("closed_stdout_is_not_a_panic") {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_hover"))
        .args(["run", "--cmdline", "workload=hello"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `hover bench boot` runs `hover run --json` as fresh processes, prints its
/// table and writes its JSON (a smoke test of the scenario plumbing).
#[test]
fn bench_boot_writes_its_table_and_json() {
    if !kvm_for_test("bench_boot_writes_its_table_and_json") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hover-bench-test-{}", std::process::id()));
    let dir_s = dir.display().to_string();
    let out = hover(&["bench", "boot", "--runs", "2", "--out", &dir_s]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("| VM creation -> first guest instruction | ms |"),
        "{stdout}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("boot.json")).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(v["samples"].as_array().map(|s| s.len()), Some(2));
    assert!(v["rows"][3]["summary"]["p50"].as_f64().unwrap() > 0.0);
}

/// A minimal bzImage header: boot protocol `version`, `xloadflags`.
fn bzimage(version: u16, xloadflags: u16) -> Vec<u8> {
    let mut b = vec![0u8; 5 * 512 + 4096];
    b[0x1f1] = 4;
    b[0x202..0x206].copy_from_slice(b"HdrS");
    b[0x206..0x208].copy_from_slice(&version.to_le_bytes());
    b[0x211] = 1;
    b[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
    b[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
    b[0x260..0x264].copy_from_slice(&(1u32 << 20).to_le_bytes());
    b
}

#[test]
fn linux_boot_refusals_are_one_line_and_exit_2_before_anything_starts() {
    let dir = std::env::temp_dir().join(format!("hover-cli-linux-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    };
    let text_file = file("notes.txt", &b"not a kernel\n".repeat(100));
    let old = file("old.bz", &bzimage(0x0206, 1));
    let b32 = file("32bit.bz", &bzimage(0x020f, 0));
    let good = file("good.bz", &bzimage(0x020f, 1));
    let disk = file("disk.img", &[0u8; 4096]);
    let ro = file("ro.img", &[0u8; 4096]);
    std::fs::set_permissions(&ro, std::os::unix::fs::PermissionsExt::from_mode(0o444)).unwrap();
    let d = dir.to_str().unwrap().to_string();
    let (disk_a, disk_fast) = (format!("{disk},id=a"), format!("{disk},fast"));
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--kernel", &text_file], "neither a bzImage"),
        (vec!["--kernel", &old], "2.12 or later"),
        (vec!["--kernel", &b32], "32-bit-only"),
        (vec!["--kernel", "/nonexistent/vmlinuz"], "No such file"),
        (vec!["--kernel", &d], "not a regular file"),
        (vec!["--kernel", "/dev/zero"], "not a regular file"),
        (vec!["--kernel", &good, "--memory", "1M"], "too small"),
        (vec!["--kernel", &good, "--initrd", "/dev/zero"], "--initrd"),
        (vec!["--kernel", &good, "--disk", &d], "--disk"),
        (
            vec!["--kernel", &good, "--disk", "/nonexistent.img"],
            "No such file",
        ),
        (vec!["--kernel", &good, "--disk", &ro], ",readonly"),
        (
            vec!["--kernel", &good, "--disk", &disk_a, "--disk", &disk_a],
            "given twice",
        ),
        (
            vec!["--kernel", &good, "--disk", &disk_fast],
            "readonly and id=ID",
        ),
        (
            vec!["--kernel", &good, "--net", "tap=hvnosuchtap9"],
            "no such network device",
        ),
        (vec!["--disk", &disk], "--kernel"),
        (vec!["--initrd", &disk], "--kernel"),
        (
            vec!["--kernel", &good, "--guest", "builtin"],
            "cannot be used with",
        ),
    ];
    for (args, want) in cases {
        let mut a = vec!["run", "--console", "off"];
        a.extend(args.iter().copied());
        let out = hover(&a);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{a:?}: {err}");
        assert!(err.contains(want), "{a:?}: wanted {want:?} in {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
