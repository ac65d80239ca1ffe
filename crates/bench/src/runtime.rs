//! `hover bench runtime`: what the guest runtime's basic operations cost on
//! this host, each measured by a built-in workload in its own `hover run`:
//! - a voluntary task switch (`ctxsw mode=yield`, 1 vCPU);
//! - a preemptive task switch at 1000 Hz (`ctxsw mode=preempt`, 1 vCPU):
//!   interrupt delivery, the emulated handler, the native switch;
//! - one trip through the privileged nub (`nubcall`);
//! - timer wake-up latency at a 1000 us interval (`timer`, 2 vCPUs);
//! - MSI delivery to a waiting task (`irq`, 100 us delay);
//! - a cross-vCPU event round trip (`pingpong`), with idle vCPUs halting
//!   and with `idle=poll`.
//!
//! Each measurement is the median over `runs` runs.

use std::path::Path;

use serde::Serialize;

use crate::runner::run_hover;
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

/// Run the scenario with the `hover` binary at `exe`; print the table and
/// write `runtime.json` into `out`.
pub fn run(exe: &Path, runs: u32, out: &Path) -> Result<(), BenchError> {
    println!("hover bench runtime: median of {runs} run(s) per row");
    let mut rows = Vec::new();
    let mut table_rows = Vec::new();
    for c in CASES {
        let vcpus = c.vcpus.to_string();
        let mut values = vec![Vec::new(); c.metrics.len()];
        for _ in 0..runs.max(1) {
            let r = run_hover(exe, &["--vcpus", &vcpus, "--cmdline", c.cmdline])?;
            for (m, &(_, key, _, scale)) in c.metrics.iter().enumerate() {
                values[m].push(r.report(key)? * scale);
            }
        }
        let command = format!("hover run --vcpus {} --cmdline \"{}\"", c.vcpus, c.cmdline);
        for (&(metric, _, unit, _), values) in c.metrics.iter().zip(values) {
            let value = summarize(&values).expect("at least one run").p50;
            table_rows.push(vec![
                metric.to_string(),
                format!("{value:.2}"),
                unit.to_string(),
                format!("`{command}`"),
            ]);
            rows.push(Row {
                metric,
                command: command.clone(),
                unit,
                value,
                values,
            });
        }
    }
    table::print(&["metric", "value", "unit", "command"], &table_rows);
    table::write_json(
        out,
        "runtime.json",
        &serde_json::json!({ "scenario": "runtime", "runs": runs, "rows": rows }),
    )
}
