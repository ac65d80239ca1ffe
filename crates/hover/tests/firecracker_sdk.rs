//! `hover firecracker` driven by the real Firecracker Go SDK (v1.0.0): the
//! Go module in compat/firecracker-sdk, run with `go test` against this
//! build's binary, and its Linux test compiled and run in the KVM lab
//! (`scripts/lab/sdk.sh`). Needs Go (`scripts/install-go.sh`, which
//! `.ci/run` calls) and KVM; without Go the tests fail under `CI` and are
//! skipped with a printed reason otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::lab::{assert_ok, Cell};
use hover_vmm::host::kvm_for_test;

static LAB: Cell = Cell::new();

/// Go, or None (and a printed reason) where a test may be skipped.
fn go_or_skip(test: &str) -> Option<PathBuf> {
    let go = go();
    if go.is_none() {
        let why = "no `go` command (scripts/install-go.sh installs one)";
        assert!(std::env::var_os("CI").is_none(), "{test}: {why}");
        eprintln!("skipped {test}: {why}");
    }
    go
}

/// The `go` command: on PATH, or where the machine image keeps it.
fn go() -> Option<PathBuf> {
    let on_path = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if on_path {
        return Some("go".into());
    }
    let image = Path::new("/usr/local/go/bin/go");
    image.exists().then(|| image.into())
}

#[test]
fn the_go_sdk_starts_snapshots_resumes_loads_and_stops_hover() {
    if !kvm_for_test("the_go_sdk_starts_snapshots_resumes_loads_and_stops_hover") {
        return;
    }
    let Some(go) = go_or_skip("the_go_sdk_starts_snapshots_resumes_loads_and_stops_hover") else {
        return;
    };
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../compat/firecracker-sdk");
    let out = Command::new(go)
        .args(["test", "-count=1", "-v", "./..."])
        .current_dir(&module)
        .env("HOVER_BIN", env!("CARGO_BIN_EXE_hover"))
        // The pinned versions in go.mod and go.sum, never others.
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .expect("go runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go test failed:\n{text}");
    for name in [
        "TestStartSnapshotResumeAndLoad",
        "TestADriveOnHoversOwnGuestIsRefused",
        "TestStopVMMEndsARunningVM",
    ] {
        assert!(
            text.contains(&format!("--- PASS: {name}")),
            "{name} did not pass:\n{text}"
        );
    }
}

#[test]
fn the_go_sdk_boots_linux_with_a_root_drive_in_the_lab() {
    if go_or_skip("the_go_sdk_boots_linux_with_a_root_drive_in_the_lab").is_none() {
        return;
    }
    assert_ok(
        &LAB,
        "sdk",
        "the_go_sdk_boots_linux_with_a_root_drive_in_the_lab",
        "sdk-boots-linux-with-a-root-drive",
    );
}

#[test]
fn the_go_sdk_inflates_and_deflates_a_linux_guests_balloon_in_the_lab() {
    let test = "the_go_sdk_inflates_and_deflates_a_linux_guests_balloon_in_the_lab";
    if go_or_skip(test).is_none() {
        return;
    }
    assert_ok(&LAB, "sdk", test, "sdk-balloon-inflates-and-deflates");
}
