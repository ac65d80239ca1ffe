//! The README's ten-line tour works as pasted: its commands (after the
//! build line, with this build's `hover` first on PATH and its /tmp paths
//! in a scratch directory) run under `bash -e`, and each step says what the
//! README says it does.

mod common;

use std::process::Command;

use common::{text, Scratch};
use hover_vmm::host::kvm_for_test;

/// The tour's shell block from README.md.
fn tour() -> String {
    let readme = include_str!("../../../README.md");
    let section = readme.split("## A ten-line tour").nth(1).expect("the tour");
    let block = section.split("```sh\n").nth(1).expect("its shell block");
    block.split("```").next().unwrap().to_string()
}

#[test]
fn the_readme_tour_runs_as_pasted() {
    if !kvm_for_test("the_readme_tour_runs_as_pasted") {
        return;
    }
    let dir = Scratch::new("tour");
    let tour = tour();
    let lines: Vec<&str> = tour.lines().collect();
    assert!(
        lines[0].starts_with("cargo build --release -p hover"),
        "{lines:?}"
    );
    assert!(lines.len() <= 11, "ten lines and the build: {lines:?}");
    // The build is this test's own binary; the rest as written.
    let script = lines[1..]
        .join("\n")
        .replace("/tmp/", &format!("{}/", dir.0.display()));
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_hover"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-e", "-c", &script])
        .env("PATH", path)
        .output()
        .expect("bash runs");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for said in ["state: running", "the VM migrated", "restored from"] {
        assert!(
            stdout.contains(said),
            "{said:?} missing:\n{stdout}\n{stderr}"
        );
    }
    // The receiver's guest and the restored one both ended cleanly.
    assert_eq!(
        stdout.matches("guest exited with code 0").count(),
        2,
        "{stdout}"
    );
}
