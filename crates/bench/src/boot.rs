//! `hover bench boot`: how fast a VM boots and what the monitor itself costs.
//!
//! Boots the built-in guest (`workload=hello`) `runs` times and reports, from
//! the start of VM construction: the guest's first instruction (its own TSC
//! reading, placed on the host clock), its first console byte, its power-off;
//! and the process's resident memory beyond the guest RAM that is resident
//! (the monitor's overhead). Targets from the foundation issue: first
//! instruction under 10 ms, overhead under 5 MiB.

use std::path::Path;

use hover_vmm::{ConsoleTarget, RunOutcome, Vm, VmConfig};
use serde::Serialize;

use crate::stats::{summarize, Summary};
use crate::BenchError;

/// One row of the table.
#[derive(Serialize)]
struct Row {
    metric: &'static str,
    unit: &'static str,
    summary: Summary,
}

/// Run the scenario, print the table, write `boot.json` into `out`.
pub fn run(runs: u32, vcpus: u32, out: &Path) -> Result<(), BenchError> {
    let mut outcomes: Vec<RunOutcome> = Vec::new();
    for _ in 0..runs.max(1) {
        let config = VmConfig {
            vcpus,
            console: ConsoleTarget::Off,
            ..VmConfig::default()
        };
        let o = Vm::new(&config)?.run()?;
        if o.exit_code != 0 {
            return Err(BenchError::Guest(format!(
                "the hello workload exited with code {}",
                o.exit_code
            )));
        }
        outcomes.push(o);
    }
    let col = |f: &dyn Fn(&RunOutcome) -> Option<f64>| -> Vec<f64> {
        outcomes.iter().filter_map(f).collect()
    };
    let ms = |us: u64| us as f64 / 1000.0;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let metrics: [(&str, &str, Vec<f64>); 6] = [
        (
            "VM setup (new: memory, irqchip, vCPUs, image)",
            "ms",
            col(&|o| Some(ms(o.timings.setup_us))),
        ),
        (
            "first guest instruction",
            "ms",
            col(&|o| o.timings.first_instruction_us.map(ms)),
        ),
        (
            "first console byte",
            "ms",
            col(&|o| o.timings.first_console_byte_us.map(ms)),
        ),
        ("guest exit", "ms", col(&|o| Some(ms(o.timings.exit_us)))),
        (
            "guest RAM resident",
            "MiB",
            col(&|o| Some(mib(o.memory.guest_resident))),
        ),
        (
            "VMM overhead (process RSS - resident guest RAM)",
            "MiB",
            col(&|o| Some(mib(o.memory.vmm_overhead))),
        ),
    ];
    println!(
        "hover bench boot: {} boots of the built-in guest, {vcpus} vCPUs, 256 MiB, workload=hello",
        outcomes.len()
    );
    println!("| metric | unit | min | p50 | mean | p90 | max |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (metric, unit, values) in metrics {
        if let Some(s) = summarize(&values) {
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
    }
    std::fs::create_dir_all(out).map_err(|source| BenchError::Write {
        path: out.display().to_string(),
        source,
    })?;
    let path = out.join("boot.json");
    let json = serde_json::to_string_pretty(&serde_json::json!({ "scenario": "boot", "runs": outcomes.len(), "vcpus": vcpus, "rows": rows }))
        .expect("rows serialize");
    std::fs::write(&path, json).map_err(|source| BenchError::Write {
        path: path.display().to_string(),
        source,
    })?;
    println!("wrote {}", path.display());
    Ok(())
}
