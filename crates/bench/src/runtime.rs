//! `hover bench runtime`: what the guest runtime's basic operations cost on
//! this host, each measured by a built-in workload in its own `hover run`:
//! - a voluntary task switch (`ctxsw mode=yield`, 1 vCPU);
//! - a preemptive task switch at 1000 Hz (`ctxsw mode=preempt`, 1 vCPU):
//!   interrupt delivery, the emulated handler, the native switch;
//! - one trip through the privileged nub (`nubcall`);
//! - timer wake-up latency at a 1000 us interval (`timer`, 1 and 2 vCPUs);
//! - MSI delivery to a waiting task (`irq`, 100 us delay);
//! - a cross-vCPU event round trip (`pingpong`), with idle vCPUs halting
//!   and with `idle=poll`.
//!
//! Each measurement is the median over `runs` runs. With the QEMU peer
//! (`--peer qemu`), each case also runs, interleaved, under QEMU microvm on
//! the same image with as many vCPUs (its PVH entry; the boot vCPU starts
//! the others with INIT/SIPI): the guest's own paths on the same KVM, with
//! QEMU's device model and vCPU loop instead of Hover's. The MSI cases have
//! no QEMU column: they ask Hover's control device for the interrupt.

use std::path::Path;

use serde::Serialize;

use crate::hover_process::run_hover;
use crate::stats::summarize;
use crate::{table, BenchError};

#[derive(Serialize)]
struct Row {
    metric: &'static str,
    command: String,
    unit: &'static str,
    /// Median over the runs.
    value: f64,
    /// Every run's value.
    values: Vec<f64>,
    /// The same under QEMU microvm (with `--peer qemu`; none for the MSI cases).
    qemu_values: Vec<f64>,
}

/// One `hover run` and the reports it yields: (metric, report key, unit, scale).
struct Case {
    vcpus: u32,
    cmdline: &'static str,
    metrics: &'static [(&'static str, &'static str, &'static str, f64)],
}

const US: f64 = 1e-3;

const CASES: &[Case] = &[
    Case {
        vcpus: 1,
        cmdline: "workload=ctxsw mode=yield seconds=1",
        metrics: &[("voluntary switch (yield)", "ctxsw.ns_per_switch", "ns", 1.0)],
    },
    Case {
        vcpus: 1,
        cmdline: "workload=ctxsw mode=preempt seconds=2 hz=1000",
        metrics: &[(
            "preemptive switch (1000 Hz tick)",
            "ctxsw.ns_per_switch",
            "us",
            US,
        )],
    },
    Case {
        vcpus: 1,
        cmdline: "workload=nubcall count=20000",
        metrics: &[(
            "nub trip (int3 -> CPL0 rdmsr -> iretq)",
            "nubcall.ns_per_trip",
            "us",
            US,
        )],
    },
    Case {
        vcpus: 1,
        cmdline: "workload=timer interval_us=1000 seconds=3",
        metrics: &[
            (
                "timer wake-up latency at 1000 us, 1 vCPU, mean",
                "timer.avg_ns",
                "us",
                US,
            ),
            (
                "timer wake-up latency at 1000 us, 1 vCPU, max",
                "timer.max_ns",
                "us",
                US,
            ),
        ],
    },
    Case {
        vcpus: 2,
        cmdline: "workload=timer interval_us=1000 seconds=3",
        metrics: &[
            (
                "timer wake-up latency at 1000 us, min",
                "timer.min_ns",
                "us",
                US,
            ),
            (
                "timer wake-up latency at 1000 us, mean",
                "timer.avg_ns",
                "us",
                US,
            ),
            (
                "timer wake-up latency at 1000 us, max",
                "timer.max_ns",
                "us",
                US,
            ),
        ],
    },
    Case {
        vcpus: 2,
        cmdline: "workload=irq count=2000 delay_us=0",
        metrics: &[(
            "MSI injected at once -> waiting task runs, mean",
            "irq.avg_ns",
            "us",
            US,
        )],
    },
    Case {
        vcpus: 2,
        cmdline: "workload=irq count=2000 delay_us=200",
        metrics: &[(
            "MSI to a halted vCPU -> task runs, less 200 us delay",
            "irq.avg_ns",
            "us",
            US,
        )],
    },
    Case {
        vcpus: 2,
        cmdline: "workload=pingpong rounds=5000",
        metrics: &[(
            "cross-vCPU event round trip, idle=halt",
            "pingpong.ns_per_round",
            "us",
            US,
        )],
    },
    Case {
        vcpus: 2,
        cmdline: "workload=pingpong rounds=5000 idle=poll",
        metrics: &[(
            "cross-vCPU event round trip, idle=poll",
            "pingpong.ns_per_round",
            "us",
            US,
        )],
    },
];

/// Run the scenario with the `hover` binary at `exe` (and, with `peer`,
/// QEMU beside it); print the table and write `runtime.json` into `out`.
pub fn run(exe: &Path, runs: u32, peer: bool, out: &Path) -> Result<(), BenchError> {
    println!("hover bench runtime: median of {runs} run(s) per row");
    let qemu = if peer {
        match crate::peer::find() {
            Ok(q) => Some(q),
            Err(e) => {
                println!("--peer qemu: skipped: {e}");
                None
            }
        }
    } else {
        None
    };
    let image = match qemu {
        Some(_) => Some(crate::peer::GuestImageFile::write(exe)?),
        None => None,
    };
    let rows = cases(exe, runs, qemu.as_deref(), image.as_ref().map(|i| i.path()))?;
    let mut table_rows = Vec::new();
    for r in &rows {
        let mut row = vec![r.metric.to_string(), format!("{:.2}", r.value)];
        if qemu.is_some() {
            match summarize(&r.qemu_values) {
                Some(q) => {
                    row.push(format!("{:.2}", q.p50));
                    row.push(crate::stats::ratios(&r.qemu_values, &r.values));
                }
                None => row.extend(["-".to_string(), "-".to_string()]),
            }
        }
        row.push(r.unit.to_string());
        row.push(format!("`{}`", r.command));
        table_rows.push(row);
    }
    if qemu.is_some() {
        table::print(
            &[
                "metric",
                "hover",
                "QEMU microvm",
                "QEMU/hover per run",
                "unit",
                "command",
            ],
            &table_rows,
        );
    } else {
        table::print(&["metric", "value", "unit", "command"], &table_rows);
    }
    table::write_json(
        out,
        "runtime.json",
        &serde_json::json!({ "scenario": "runtime", "runs": runs, "rows": rows }),
    )
}

/// Every case, `runs` times, interleaved with its QEMU run when there is one.
fn cases(
    exe: &Path,
    runs: u32,
    qemu: Option<&Path>,
    image: Option<&Path>,
) -> Result<Vec<Row>, BenchError> {
    let mut rows = Vec::new();
    for c in CASES {
        let vcpus = c.vcpus.to_string();
        let peer = qemu
            .zip(image)
            .filter(|_| !c.cmdline.contains("workload=irq"));
        let mut values = vec![Vec::new(); c.metrics.len()];
        let mut qemu_values = vec![Vec::new(); c.metrics.len()];
        for _ in 0..runs.max(1) {
            let r = run_hover(exe, &["--vcpus", &vcpus, "--cmdline", c.cmdline])?;
            for (m, &(_, key, _, scale)) in c.metrics.iter().enumerate() {
                values[m].push(r.report(key)? * scale);
            }
            if let Some((q, image)) = peer {
                let boot = crate::peer::Boot::new(
                    crate::peer::Machine::Microvm,
                    image,
                    c.vcpus,
                    256,
                    c.cmdline,
                );
                let p = crate::peer::run(q, &boot, std::time::Duration::from_secs(120))
                    .map_err(|e| BenchError::Guest(format!("QEMU, {}: {e}", c.cmdline)))?;
                for (m, &(_, key, _, scale)) in c.metrics.iter().enumerate() {
                    let v = p.number(key).ok_or_else(|| {
                        BenchError::Guest(format!("QEMU, {}: no report {key}", c.cmdline))
                    })?;
                    qemu_values[m].push(v * scale);
                }
            }
        }
        let command = format!("hover run --vcpus {} --cmdline \"{}\"", c.vcpus, c.cmdline);
        for ((&(metric, _, unit, _), values), qemu_values) in
            c.metrics.iter().zip(values).zip(qemu_values)
        {
            rows.push(Row {
                metric,
                command: command.clone(),
                unit,
                value: summarize(&values).expect("at least one run").p50,
                values,
                qemu_values,
            });
        }
    }
    Ok(rows)
}
