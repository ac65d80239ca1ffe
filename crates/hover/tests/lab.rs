//! The built-in guest on hardware-style KVM, in the KVM lab
//! (`scripts/kvm-lab.sh`, docs/LAB.md): one L1 under QEMU's TCG runs
//! `scripts/lab/builtin.sh`, which marks each check `ok NAME` or
//! `FAIL NAME` on the L1's console; each test here asserts one of them.
//! The lab's parts come from `scripts/kvm-lab.sh prepare` (`.ci/run` runs
//! it); without them a test fails when `CI` is set and is skipped with a
//! printed reason otherwise.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// What one scenario's L1 run marked, and where its console is.
struct LabRun {
    marks: Vec<String>,
    summary: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Run `scenario` once per test binary (its L1 boots once; every test
/// reads the same marks). None: the lab is not prepared here (skipped).
fn lab(scenario: &'static str, test: &str) -> Option<&'static LabRun> {
    static BUILTIN: OnceLock<Result<LabRun, String>> = OnceLock::new();
    let cell = match scenario {
        "builtin" => &BUILTIN,
        other => panic!("no cell for scenario {other}"),
    };
    let root = root();
    let lab_dir = std::env::var_os("LAB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/lab"));
    if !lab_dir.join("READY").exists() {
        let why = format!(
            "the KVM lab is not prepared in {} (scripts/kvm-lab.sh prepare)",
            lab_dir.display()
        );
        if std::env::var_os("CI").is_some() {
            panic!("{test}: {why}; .ci/run prepares it");
        }
        eprintln!("skipping {test}: {why}");
        return None;
    }
    let run = cell.get_or_init(|| {
        let out_dir = lab_dir
            .join("runs")
            .join(format!("test-{scenario}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = Command::new(root.join("scripts/kvm-lab.sh"))
            .args(["run", scenario])
            .env("HOVER", env!("CARGO_BIN_EXE_hover"))
            .env("LAB_OUT", &out_dir)
            .env("LAB_TIMEOUT", "900")
            .output()
            .map_err(|e| format!("scripts/kvm-lab.sh: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        // 124: the deadline; 125: the lab itself failed (no result at all).
        if matches!(out.status.code(), Some(124) | Some(125) | None) {
            return Err(format!(
                "the lab run failed ({}):\n{stdout}{stderr}",
                out.status
            ));
        }
        Ok(LabRun {
            marks: stdout
                .lines()
                .filter_map(|l| l.strip_prefix("LAB: "))
                .map(str::to_string)
                .collect(),
            summary: format!("{stdout}{stderr}"),
        })
    });
    match run {
        Ok(r) => Some(r),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// Assert the scenario marked `check` as passed.
fn assert_ok(scenario: &'static str, test: &str, check: &str) {
    let Some(run) = lab(scenario, test) else {
        return;
    };
    let ok = format!("ok {check}");
    assert!(
        run.marks.contains(&ok),
        "{test}: the lab did not mark `{ok}`:\n{}",
        run.summary
    );
}

#[test]
fn the_builtin_guest_says_hello_on_hardware_kvm() {
    assert_ok("builtin", "hello", "hello");
}

#[test]
fn spin_runs_on_two_vcpus_on_hardware_kvm() {
    assert_ok("builtin", "spin", "spin-2-vcpus");
}

#[test]
fn memtouch_under_a_budget_parks_tasks_on_async_page_faults_on_hardware_kvm() {
    assert_ok("builtin", "memtouch", "memtouch-budget-apf");
}

#[test]
fn a_paused_vm_resumes_and_its_guest_ends_well_on_hardware_kvm() {
    assert_ok("builtin", "pause", "pause-resume");
    assert_ok("builtin", "pause", "pause-resume-guest-ends");
}

#[test]
fn a_snapshot_restores_eagerly_on_hardware_kvm() {
    assert_ok("builtin", "restore eager", "restore-eager");
}

#[test]
fn a_snapshot_restores_lazily_on_hardware_kvm() {
    assert_ok("builtin", "restore lazy", "restore-lazy");
}

#[test]
fn a_snapshot_restores_by_prefetch_on_hardware_kvm() {
    assert_ok("builtin", "restore prefetch", "restore-prefetch");
}

#[test]
fn a_precopy_migration_moves_the_guest_on_hardware_kvm() {
    assert_ok("builtin", "precopy", "migrate-precopy");
    assert_ok("builtin", "precopy", "migrate-precopy-guest-ends");
}

#[test]
fn a_postcopy_migration_moves_the_guest_on_hardware_kvm() {
    assert_ok("builtin", "postcopy", "migrate-postcopy");
    assert_ok("builtin", "postcopy", "migrate-postcopy-guest-ends");
}
