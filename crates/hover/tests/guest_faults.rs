//! A running VM's failures that come from outside the guest's control or
//! past its limits: a page store that cannot be used or fails during the
//! run, a disk file whose writes fail, guest I/O and interrupt delays past
//! the user's limits. Each is refused or reported, and the VM either stops
//! cleanly or runs on.

use std::process::Command;

use hover_vmm::host::kvm_for_test;

mod common;
use common::{hover, text};

/// A page store that cannot be created, already exists, or lacks room for
/// every page that may be evicted: exit 2 before the guest runs, and nothing
/// that existed is touched.
#[test]
fn unusable_page_store_is_refused() {
    if !kvm_for_test("unusable_page_store_is_refused") {
        return;
    }
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "--memory",
                "128M",
                "--page-store",
                "/proc/no-such-dir/store",
            ],
            "cannot create or write",
        ),
        (
            &["--memory", "128M", "--page-store", "/dev/full"],
            "already exists",
        ),
        // /dev/shm (tmpfs) holds far less than 60 GiB.
        (
            &["--memory", "60G", "--page-store", "/dev/shm"],
            "may be evicted there",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec!["run", "--memory-budget", "32M"];
        all.extend_from_slice(args);
        let out = hover(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(
            !text(&out.stdout).contains("hello from"),
            "{args:?}: the guest ran"
        );
    }
    assert!(
        std::path::Path::new("/dev/full").exists(),
        "an existing path must never be removed"
    );
}

/// A page-store write that fails during the run (here: past a file-size
/// limit) stops the VM with an error naming the guest page; no guest data is
/// lost or replaced (the page stays where it was).
#[test]
fn page_store_error_during_the_run_stops_the_vm() {
    if !kvm_for_test("page_store_error_during_the_run_stops_the_vm") {
        return;
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hover"));
    cmd.args([
        "run",
        "--memory",
        "128M",
        "--memory-budget",
        "16M",
        "--cmdline",
        "workload=memtouch size=64M",
    ]);
    limit_file_size(&mut cmd, 1 << 20);
    let out = cmd.output().unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("page store write of guest page 0x"),
        "{stderr}"
    );
    assert!(
        !text(&out.stdout).contains("memtouch:"),
        "the guest must not finish on lost data"
    );
}

/// An I/O error on the device's file (here: writes past a file-size limit)
/// completes the request with an error the guest reports; the monitor keeps
/// running and the guest decides how to end (exit 20: its check failed).
#[test]
fn io_errors_reach_the_guest_and_the_vm_keeps_running() {
    if !kvm_for_test("io_errors_reach_the_guest_and_the_vm_keeps_running") {
        return;
    }
    let file = std::env::temp_dir().join(format!("hover-io-err-{}", std::process::id()));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hover"));
    cmd.args(["run", "--io-file"])
        .arg(&file)
        .args(["--cmdline", "workload=iolat size=64K seconds=1"]);
    limit_file_size(&mut cmd, 1 << 20);
    let out = cmd.output().unwrap();
    let _ = std::fs::remove_file(&file);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(20),
        "stdout:\n{stdout}\nstderr:\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("errno 27"), "{stdout}");
    assert!(
        stdout.contains("iolat.errors"),
        "the guest reported its errors: {stdout}"
    );
}

/// `--guest-io-max` bounds how far into the file the guest may write: 32
/// slots of 4 KiB fit in 128K, the other 32 are refused with BAD_REQUEST
/// (status 2), logged once with the flag to raise, and nothing is written
/// past the limit.
#[test]
fn guest_io_past_the_user_limit_is_refused() {
    if !kvm_for_test("guest_io_past_the_user_limit_is_refused") {
        return;
    }
    let file = std::env::temp_dir().join(format!("hover-io-limit-{}", std::process::id()));
    let out = hover(&[
        "run",
        "--io-file",
        file.to_str().unwrap(),
        "--guest-io-max",
        "128K",
        "--cmdline",
        "workload=iolat size=4K seconds=1",
    ]);
    let len = std::fs::metadata(&file).map(|m| m.len());
    let _ = std::fs::remove_file(&file);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(20), "{stdout}\n{stderr}");
    assert!(stdout.contains("status 2"), "{stdout}");
    assert!(stderr.contains("--guest-io-max"), "{stderr}");
    assert_eq!(len.unwrap(), 128 << 10, "the file stops at the limit");
    // At the limit exactly, every write fits.
    let out = hover(&[
        "run",
        "--guest-io-max",
        "256K",
        "--cmdline",
        "workload=iolat size=4K seconds=1",
    ]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

/// `--guest-msi-max-delay` refuses a guest's MSI timer longer than it.
#[test]
fn guest_msi_delay_past_the_user_limit_is_refused() {
    if !kvm_for_test("guest_msi_delay_past_the_user_limit_is_refused") {
        return;
    }
    let run = |limit: &str| {
        hover(&[
            "run",
            "--guest-msi-max-delay",
            limit,
            "--cmdline",
            "workload=irq count=3 delay_us=2000",
        ])
    };
    let out = run("1ms");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(20), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("refused the MSI request (status 3)"),
        "{stdout}"
    );
    assert!(stderr.contains("--guest-msi-max-delay"), "{stderr}");
    assert!(run("3ms").status.success());
}

/// Make files the child writes stop growing at `bytes` (writes past it fail
/// with EFBIG), to provoke write errors.
fn limit_file_size(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe and affects only the child.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
