//! The KVM lab (`scripts/kvm-lab.sh`, docs/LAB.md) for the integration
//! tests: one L1 under QEMU's TCG per scenario and test binary runs
//! `scripts/lab/SCENARIO.sh`, which marks each check `ok NAME` or
//! `FAIL NAME` on the L1's console; each test asserts one of them. The
//! lab's parts come from `scripts/kvm-lab.sh prepare` (`.ci/run` runs it);
//! without them a test fails when `CI` is set and is skipped with a
//! printed reason otherwise.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// What one scenario's L1 run marked, and where its console is.
pub struct LabRun {
    marks: Vec<String>,
    summary: String,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scenario's run, made once per test binary.
pub type Cell = OnceLock<Result<LabRun, String>>;

/// Run `scenario` once per test binary, in `cell` (its L1 boots once;
/// every test reads the same marks). None: the lab is not prepared here
/// (skipped).
fn lab(cell: &'static Cell, scenario: &str, test: &str) -> Option<&'static LabRun> {
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
pub fn assert_ok(cell: &'static Cell, scenario: &str, test: &str, check: &str) {
    let Some(run) = lab(cell, scenario, test) else {
        return;
    };
    let ok = format!("ok {check}");
    assert!(
        run.marks.contains(&ok),
        "{test}: the lab did not mark `{ok}`:\n{}",
        run.summary
    );
}
