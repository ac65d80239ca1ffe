//! `--console stdio`: standard input reaches the guest's serial port and
//! its escape ends the VM. (A Linux guest's shell typed to through it:
//! tests/linux.rs, in the lab; raw mode on a terminal: the unit tests of
//! `devices::console_in`.)

mod common;

use std::io::Write;
use std::process::Stdio;

use common::{hover, hover_cmd, text};
use hover_vmm::host::kvm_for_test;

#[test]
fn ctrl_a_x_on_the_console_ends_the_vm_as_a_shutdown() {
    if !kvm_for_test("ctrl_a_x_on_the_console_ends_the_vm_as_a_shutdown") {
        return;
    }
    // A guest that would spin for ten minutes: only the escape ends it
    // (the test's own timeout is far shorter).
    let mut child = hover_cmd()
        .args([
            "run",
            "--vcpus",
            "1",
            "--cmdline",
            "workload=spin seconds=600",
            "--console",
            "stdio",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("hover starts");
    // Typed before the VM reads its input: the pipe holds it until then.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"typed before\r\x01x").unwrap();
    let out = child.wait_with_output().expect("hover ends");
    drop(stdin);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("the VM was shut down"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn console_stdio_ends_with_input_left_open_only_by_its_escape_or_the_guest() {
    if !kvm_for_test("console_stdio_ends_with_input_left_open_only_by_its_escape_or_the_guest") {
        return;
    }
    // Standard input at its end (nothing typed) does not end the VM: the
    // guest runs to its own power-off.
    let out = hover_cmd()
        .args(["run", "--vcpus", "1", "--console", "stdio"])
        .stdin(Stdio::null())
        .output()
        .expect("hover runs");
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(stdout.contains("hello from vCPU 0 of 1"), "{stdout}");
    assert!(!stdout.contains("shut down"), "{stdout}");
}

#[test]
fn console_stdio_with_json_is_refused() {
    let out = hover(&["run", "--console", "stdio", "--json"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--console stdio") && stderr.contains("--json"),
        "{stderr}"
    );
}
