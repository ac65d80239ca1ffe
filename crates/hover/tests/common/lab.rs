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
        // Two troubles of the lab itself, not Hover's (docs/LAB.md): the L1
        // resets now and then under TCG (a triple fault in QEMU's log, no
        // message from its kernel), and its emulated SVM now and then
        // triple-faults a vCPU of the guest, anywhere in a run. A run that
        // ended either way (the L1 without a result; a failed run whose
        // Hover reported a vCPU's triple fault, `TRIPLE-FAULT` from
        // scripts/lab/l1-init) is made again, up to three times in all,
        // each one said (on stderr, and in runs/RETRIES, which outlives a
        // passing test's captured output); the third is the result.
        for attempt in 1..=3 {
            let why = match run_once(&root, &lab_dir, scenario, attempt)? {
                None => "the lab's L1 ended without a result".to_string(),
                Some(r) if attempt < 3 && r.lost_to_a_triple_fault() => {
                    format!("a vCPU triple-faulted in the lab:\n{}", r.summary)
                }
                Some(r) => return Ok(r),
            };
            let line = format!("{test}: {scenario}: attempt {attempt} of 3: {why}\n");
            eprint!("{line}");
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(lab_dir.join("runs/RETRIES"))
                .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        }
        Err(format!(
            "no run of {scenario} gave a result in three attempts (each said above)"
        ))
    });
    match run {
        Ok(r) => Some(r),
        Err(e) => panic!("{test}: {e}"),
    }
}

/// One L1 run of `scenario`: its marks, or None when the L1 ended without
/// a result (exit 125); Err when the deadline passed or the lab could not run.
fn run_once(
    root: &std::path::Path,
    lab_dir: &std::path::Path,
    scenario: &str,
    attempt: u32,
) -> Result<Option<LabRun>, String> {
    // `SCENARIO@KERNEL`: the scenario on that L1 kernel (LAB_L1).
    let (name, l1) = scenario.split_once('@').unwrap_or((scenario, "6.12"));
    let out_dir = lab_dir
        .join("runs")
        .join(format!("test-{name}-{l1}-{}-{attempt}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    // The attempt is on the L1's command line (`lab.attempt=N`), for the
    // scenario that checks this retry itself (lab-retry.sh).
    let append = format!(
        "{} lab.attempt={attempt}",
        std::env::var("LAB_APPEND").unwrap_or_default()
    );
    let out = Command::new(root.join("scripts/kvm-lab.sh"))
        .args(["run", name])
        .env("LAB_APPEND", append.trim())
        .env("LAB_L1", l1)
        .env("HOVER", env!("CARGO_BIN_EXE_hover"))
        .env("LAB_OUT", &out_dir)
        .env("LAB_TIMEOUT", "900")
        .output()
        .map_err(|e| format!("scripts/kvm-lab.sh: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    match out.status.code() {
        Some(125) => {
            eprintln!("{stdout}{stderr}");
            Ok(None)
        }
        Some(124) | None => Err(format!(
            "the lab run failed ({}):\n{stdout}{stderr}",
            out.status
        )),
        _ => Ok(Some(LabRun {
            marks: stdout
                .lines()
                .filter_map(|l| l.strip_prefix("LAB: "))
                .map(str::to_string)
                .collect(),
            summary: format!("{stdout}{stderr}"),
        })),
    }
}

impl LabRun {
    /// The run failed and a vCPU's triple fault was reported in it: the
    /// lab's emulated SVM, worth another run.
    fn lost_to_a_triple_fault(&self) -> bool {
        self.marks.iter().any(|m| m.starts_with("TRIPLE-FAULT"))
            && self.marks.iter().any(|m| m.starts_with("FAIL"))
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
