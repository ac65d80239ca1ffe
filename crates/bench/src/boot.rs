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

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::runner::run_hover;
use crate::stats::{summarize, Summary};
use crate::table;
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
    let run = run_hover(exe, &["--vcpus", &vcpus.to_string()])?;
    let ms = |t: Instant| t.duration_since(run.started).as_secs_f64() * 1000.0;
    let first = run
        .first_console_byte
        .ok_or_else(|| BenchError::Guest("no console output".into()))?;
    Ok(Sample {
        to_first_console_byte_ms: ms(first),
        to_exit_ms: ms(run.exited),
        vm_setup_ms: run.number(&["timings", "setup_us"])? / 1000.0,
        vm_create_to_first_instruction_ms: run.number(&["timings", "first_instruction_us"])?
            / 1000.0,
        guest_resident_mib: run.number(&["memory", "guest_resident"])? / (1 << 20) as f64,
        vmm_overhead_mib: run.number(&["memory", "vmm_overhead"])? / (1 << 20) as f64,
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
    let mut rows = Vec::new();
    let mut table = Vec::new();
    for (metric, unit, values) in metrics {
        let s = summarize(&values).expect("at least one run");
        let f = |v: f64| format!("{v:.2}");
        table.push(vec![
            metric.to_string(),
            unit.to_string(),
            f(s.min),
            f(s.p50),
            f(s.mean),
            f(s.p90),
            f(s.max),
        ]);
        rows.push(Row {
            metric,
            unit,
            summary: s,
        });
    }
    table::print(
        &["metric", "unit", "min", "p50", "mean", "p90", "max"],
        &table,
    );
    let doc =
        serde_json::json!({ "scenario": "boot", "vcpus": vcpus, "rows": rows, "samples": samples });
    table::write_json(out, "boot.json", &doc)?;
    Ok(())
}
