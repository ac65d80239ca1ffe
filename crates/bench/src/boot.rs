//! `hover bench boot`: how fast `hover run` boots and what the monitor costs.
//!
//! Starts `hover run --json` (the built-in guest, `workload=hello`) `runs`
//! times as a fresh process, as a user would, and reports:
//! - from process start: the guest's first console byte and the process exit;
//! - from the start of VM construction (inside the process): VM setup done
//!   and the guest's first instruction (its own TSC reading at `_start`,
//!   placed on the host clock);
//! - the process's resident memory beyond the guest RAM that is resident
//!   (the monitor's own overhead).
//!
//! Targets (foundation issue): VM creation to first guest instruction under
//! 10 ms; overhead under 5 MiB (Firecracker's published bound).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::stats::{summarize, Summary};
use crate::BenchError;

/// One boot, as measured.
#[derive(Clone, Debug, Default, Serialize)]
struct Sample {
    to_first_console_byte_ms: f64,
    to_exit_ms: f64,
    vm_setup_ms: f64,
    vm_create_to_first_instruction_ms: f64,
    guest_resident_mib: f64,
    vmm_overhead_mib: f64,
}

/// One row of the table.
#[derive(Serialize)]
struct Row {
    metric: &'static str,
    unit: &'static str,
    summary: Summary,
}

fn boot_once(exe: &Path, vcpus: u32) -> Result<Sample, BenchError> {
    let guest_err = |m: String| BenchError::Guest(m);
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args([
            "run",
            "--json",
            "--console",
            "stderr",
            "--vcpus",
            &vcpus.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| guest_err(format!("cannot start {}: {e}", exe.display())))?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    let console = thread::spawn(move || {
        let mut first = [0u8; 1];
        let at = stderr.read_exact(&mut first).ok().map(|_| Instant::now());
        let mut rest = Vec::new();
        let _ = stderr.read_to_end(&mut rest);
        at
    });
    let mut stdout = String::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut stdout)
        .ok();
    let status = child
        .wait()
        .map_err(|e| guest_err(format!("waiting for hover run: {e}")))?;
    let exited = Instant::now();
    let first_byte = console.join().ok().flatten();
    if !status.success() {
        return Err(guest_err(format!("hover run exited with {status}")));
    }
    let v: Value =
        serde_json::from_str(&stdout).map_err(|e| guest_err(format!("hover run --json: {e}")))?;
    let field = |path: &[&str]| -> Result<f64, BenchError> {
        path.iter()
            .fold(&v, |v, k| &v[*k])
            .as_f64()
            .ok_or_else(|| guest_err(format!("hover run --json lacks {}", path.join("."))))
    };
    let ms = |t: Instant| t.duration_since(start).as_secs_f64() * 1000.0;
    Ok(Sample {
        to_first_console_byte_ms: first_byte
            .map(ms)
            .ok_or_else(|| guest_err("no console output".into()))?,
        to_exit_ms: ms(exited),
        vm_setup_ms: field(&["timings", "setup_us"])? / 1000.0,
        vm_create_to_first_instruction_ms: field(&["timings", "first_instruction_us"])? / 1000.0,
        guest_resident_mib: field(&["memory", "guest_resident"])? / (1 << 20) as f64,
        vmm_overhead_mib: field(&["memory", "vmm_overhead"])? / (1 << 20) as f64,
    })
}

/// Run the scenario with the `hover` binary at `exe`; print the table and
/// write `boot.json` into `out`.
pub fn run(exe: &Path, runs: u32, vcpus: u32, out: &Path) -> Result<(), BenchError> {
    let samples = (0..runs.max(1))
        .map(|_| boot_once(exe, vcpus))
        .collect::<Result<Vec<_>, _>>()?;
    let col = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
    let metrics: [(&str, &str, Vec<f64>); 6] = [
        (
            "hover run start -> first console byte",
            "ms",
            col(|s| s.to_first_console_byte_ms),
        ),
        (
            "hover run start -> process exit",
            "ms",
            col(|s| s.to_exit_ms),
        ),
        (
            "VM creation -> setup done (memory, irqchip, vCPUs, image)",
            "ms",
            col(|s| s.vm_setup_ms),
        ),
        (
            "VM creation -> first guest instruction",
            "ms",
            col(|s| s.vm_create_to_first_instruction_ms),
        ),
        (
            "guest RAM resident at exit",
            "MiB",
            col(|s| s.guest_resident_mib),
        ),
        (
            "VMM overhead (process RSS - resident guest RAM)",
            "MiB",
            col(|s| s.vmm_overhead_mib),
        ),
    ];
    println!(
        "hover bench boot: {} runs of `hover run --json --vcpus {vcpus}` (built-in guest, 256 MiB, workload=hello)",
        samples.len()
    );
    println!("| metric | unit | min | p50 | mean | p90 | max |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (metric, unit, values) in metrics {
        let s = summarize(&values).expect("at least one run");
        println!(
            "| {metric} | {unit} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            s.min, s.p50, s.mean, s.p90, s.max
        );
        rows.push(Row {
            metric,
            unit,
            summary: s,
        });
    }
    std::fs::create_dir_all(out).map_err(|source| BenchError::Write {
        path: out.display().to_string(),
        source,
    })?;
    let path = out.join("boot.json");
    let doc =
        serde_json::json!({ "scenario": "boot", "vcpus": vcpus, "rows": rows, "samples": samples });
    let json = serde_json::to_string_pretty(&doc).expect("plain data serializes");
    std::fs::write(&path, json).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })?;
    println!("wrote {}", path.display());
    Ok(())
}
