//! `hover bench halt-poll`: the halt-polling seed's experiment, side by side.
//!
//! The seed measured a latency-bound guest (synchronous writes to a fast
//! disk) with and without KVM halt polling, and the host CPU an idle guest
//! burns. Here: the built-in guest's `iolat` (queue-depth-1 O_DSYNC writes
//! through the paravirtual I/O device, 4 KiB) on 2 vCPUs under each way of
//! waiting, and an idle guest (a timer task waking every 100 ms) under the
//! same setting, measuring the host CPU time of its vCPU threads:
//! - off: `--halt-poll-ns 0`;
//! - KVM's default (module parameter);
//! - fixed windows: 50 us, 200 us, 1 ms;
//! - the governor: `--halt-poll auto` (2.5% budget);
//! - guest `idle=poll` and `--disable-hlt-exits`: the upper bounds.
//!
//! The device's file is on a real disk (`--io-dir`, default /var/tmp): on
//! tmpfs a write completes in about the time the guest needs to reach HLT
//! (its privileged paths are emulated here), so the vCPU rarely halts.
//! Each row is the median of `runs` interleaved runs.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::plot::{self, Series};
use crate::runner::run_hover;
use crate::stats::summarize;
use crate::{table, BenchError};

/// Knobs of the scenario.
pub struct HaltPollBench {
    /// Seconds per run.
    pub seconds: u32,
    /// Runs per mode.
    pub runs: u32,
    /// Directory for the device's file.
    pub io_dir: PathBuf,
}

struct Mode {
    name: &'static str,
    args: &'static [&'static str],
    cmdline_extra: &'static str,
    upper_bound: bool,
}

const MODES: &[Mode] = &[
    Mode {
        name: "polling off",
        args: &["--halt-poll-ns", "0"],
        cmdline_extra: "",
        upper_bound: false,
    },
    Mode {
        name: "KVM default",
        args: &[],
        cmdline_extra: "",
        upper_bound: false,
    },
    Mode {
        name: "fixed 50 us",
        args: &["--halt-poll-ns", "50000"],
        cmdline_extra: "",
        upper_bound: false,
    },
    Mode {
        name: "fixed 200 us",
        args: &["--halt-poll-ns", "200000"],
        cmdline_extra: "",
        upper_bound: false,
    },
    Mode {
        name: "fixed 1 ms",
        args: &["--halt-poll-ns", "1000000"],
        cmdline_extra: "",
        upper_bound: false,
    },
    Mode {
        name: "governor",
        args: &["--halt-poll", "auto"],
        cmdline_extra: "",
        upper_bound: false,
    },
    Mode {
        name: "guest idle=poll",
        args: &[],
        cmdline_extra: " idle=poll",
        upper_bound: true,
    },
    Mode {
        name: "HLT exits disabled",
        args: &["--disable-hlt-exits"],
        cmdline_extra: "",
        upper_bound: true,
    },
];

#[derive(Serialize, Clone)]
struct Run {
    iops: f64,
    avg_us: f64,
    p50_us: f64,
    p99_us: f64,
    successful_polls: u64,
    attempted_polls: u64,
    governor_window_ns: Option<u64>,
    idle_cpu_pct: f64,
}

#[derive(Serialize)]
struct Row {
    mode: &'static str,
    command: String,
    median: Run,
    runs: Vec<Run>,
}

fn sum_stat(r: &crate::runner::Run, stat: &str) -> u64 {
    r.outcome["vcpu_stats"]
        .as_array()
        .map_or(0, |a| a.iter().map(|s| s[stat].as_u64().unwrap_or(0)).sum())
}

fn run_mode(exe: &Path, b: &HaltPollBench, m: &Mode, round: u32) -> Result<Run, BenchError> {
    let file = b
        .io_dir
        .join(format!("hover-bench-io-{}-{round}", std::process::id()));
    let cmdline = format!(
        "workload=iolat size=4K seconds={}{}",
        b.seconds, m.cmdline_extra
    );
    let mut args: Vec<&str> = m.args.to_vec();
    let file_s = file.display().to_string();
    args.extend(["--vcpus", "2", "--io-file", &file_s, "--cmdline", &cmdline]);
    let r = run_hover(exe, &args);
    let _ = std::fs::remove_file(&file);
    let r = r?;
    let idle_cmd = format!(
        "workload=timer interval_us=100000 seconds={}{}",
        b.seconds, m.cmdline_extra
    );
    let mut idle_args: Vec<&str> = m.args.to_vec();
    idle_args.extend(["--vcpus", "2", "--cmdline", &idle_cmd]);
    let idle = run_hover(exe, &idle_args)?;
    let wall_us = idle.number(&["timings", "exit_us"])? - idle.number(&["timings", "setup_us"])?;
    let cpu: Vec<f64> = idle.outcome["vcpu_cpu_us"]
        .as_array()
        .map_or(vec![], |a| a.iter().filter_map(|v| v.as_f64()).collect());
    let idle_cpu_pct = 100.0 * cpu.iter().sum::<f64>() / cpu.len().max(1) as f64 / wall_us.max(1.0);
    Ok(Run {
        iops: r.report("iolat.iops")?,
        avg_us: r.report("iolat.avg_ns")? / 1000.0,
        p50_us: r.report("iolat.p50_ns")? / 1000.0,
        p99_us: r.report("iolat.p99_ns")? / 1000.0,
        successful_polls: sum_stat(&r, "halt_successful_poll"),
        attempted_polls: sum_stat(&r, "halt_attempted_poll"),
        governor_window_ns: r.outcome["halt_poll"]["final_window_ns"].as_u64(),
        idle_cpu_pct,
    })
}

/// Run the scenario with the `hover` binary at `exe`.
pub fn run(exe: &Path, b: &HaltPollBench, out: &Path) -> Result<(), BenchError> {
    println!(
        "hover bench halt-poll: iolat (QD1 4 KiB O_DSYNC writes to {}) on 2 vCPUs, {} s per run, median of {} runs; idle guest CPU from a 100 ms timer task",
        b.io_dir.display(),
        b.seconds,
        b.runs
    );
    let mut all: Vec<Vec<Run>> = vec![Vec::new(); MODES.len()];
    for round in 0..b.runs.max(1) {
        for (i, m) in MODES.iter().enumerate() {
            let r = run_mode(exe, b, m, round)?;
            eprintln!(
                "  run {} {:<20} {:>8.0} IOPS, idle CPU {:.2}%",
                round + 1,
                m.name,
                r.iops,
                r.idle_cpu_pct
            );
            all[i].push(r);
        }
    }
    let rows: Vec<Row> = MODES
        .iter()
        .zip(all)
        .map(|(m, mut runs)| {
            runs.sort_by(|a, b| a.iops.total_cmp(&b.iops));
            let median = runs[(runs.len() - 1) / 2].clone();
            let mut med_idle = median.clone();
            med_idle.idle_cpu_pct =
                summarize(&runs.iter().map(|r| r.idle_cpu_pct).collect::<Vec<_>>())
                    .map_or(0.0, |s| s.p50);
            Row {
                mode: m.name,
                command: format!(
                    "hover run {} --io-file FILE --cmdline \"workload=iolat size=4K seconds={}{}\"",
                    m.args.join(" "),
                    b.seconds,
                    m.cmdline_extra
                ),
                median: med_idle,
                runs,
            }
        })
        .collect();
    let best = rows
        .iter()
        .zip(MODES)
        .filter(|(_, m)| m.upper_bound)
        .map(|(r, _)| r.median.iops)
        .fold(0.0, f64::max);
    let off = rows[0].median.iops;
    let table_rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let m = &r.median;
            vec![
                r.mode.to_string(),
                format!("{:.0}", m.iops),
                format!("{:.0}", m.avg_us),
                format!("{:.0}", m.p50_us),
                format!("{:.0}", m.p99_us),
                format!("{:.0}%", 100.0 * m.iops / best),
                format!("{:.2}x", m.iops / off),
                format!("{}/{}", m.successful_polls, m.attempted_polls),
                m.governor_window_ns
                    .map(|w| format!("{} us", w / 1000))
                    .unwrap_or_default(),
                format!("{:.2}%", m.idle_cpu_pct),
            ]
        })
        .collect();
    table::print(
        &[
            "mode",
            "IOPS",
            "avg us",
            "p50 us",
            "p99 us",
            "of best bound",
            "vs off",
            "polls ok/attempted",
            "governor window",
            "idle CPU per vCPU",
        ],
        &table_rows,
    );
    table::write_json(
        out,
        "halt_poll.json",
        &serde_json::json!({ "scenario": "halt-poll", "seconds": b.seconds, "rows": rows }),
    )?;
    let labels: Vec<String> = rows.iter().map(|r| r.mode.replace("fixed ", "")).collect();
    plot::lines(
        &out.join("halt_poll.svg"),
        "iolat: QD1 synchronous 4 KiB writes by way of waiting",
        "how an idle vCPU waits",
        "IOPS",
        &labels,
        &[Series {
            label: "IOPS (median)".into(),
            points: rows
                .iter()
                .enumerate()
                .map(|(i, r)| (i as f64, r.median.iops))
                .collect(),
        }],
    )
}
