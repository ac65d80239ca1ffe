//! `hover bench halt-poll`: the halt-polling seed's experiment, side by side.
//!
//! The seed measured a latency-bound guest (synchronous writes to a fast,
//! battery-backed disk) with and without halt polling, and the host CPU an
//! idle guest burns. Here: the built-in guest's `iolat` (queue-depth-1
//! O_DSYNC writes through the paravirtual I/O device, 4 KiB) on 2 vCPUs
//! under each way of waiting, and an idle guest (a timer task waking every
//! 100 ms) under the same setting, measuring the host CPU time of its vCPU
//! threads:
//! - off: `--halt-poll-ns 0`;
//! - KVM's default (module parameter);
//! - fixed windows: 50 us, 200 us, 1 ms;
//! - the governor: `--halt-poll auto` (2.5% budget);
//! - guest haltpoll: `idle=haltpoll` (the guest polls before HLT; host
//!   polling off), and guest haltpoll + governor;
//! - guest `idle=poll` and `--disable-hlt-exits`: the upper bounds.
//!
//! Two devices: fast (the file on tmpfs, /dev/shm: the seed's
//! battery-backed disk) and slow (a real disk, /var/tmp). Rounds are
//! interleaved (every mode once per round, devices in turn); a row shows the
//! run with the median IOPS, every figure of it from that same run (the
//! idle-CPU run is made right after it), and the spread of the per-round
//! ratio to polling off.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::halt_poll_peer::PeerIolat;
use crate::hover_process::run_hover;
use crate::plot;
use crate::{table, BenchError};

/// Knobs of the scenario.
pub struct HaltPollBench {
    /// Seconds per run.
    pub seconds: u32,
    /// Runs per mode.
    pub runs: u32,
    /// The devices: (name, directory for the device's file).
    pub devices: Vec<(String, PathBuf)>,
    /// Also run `iolat` under QEMU microvm each round (`--peer qemu`).
    pub peer: bool,
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
        name: "guest haltpoll",
        args: &["--halt-poll-ns", "0"],
        cmdline_extra: " idle=haltpoll",
        upper_bound: false,
    },
    Mode {
        name: "guest haltpoll + governor",
        args: &["--halt-poll", "auto"],
        cmdline_extra: " idle=haltpoll",
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
    /// Guest polls that found work / started (idle=haltpoll).
    guest_poll_hits: u64,
    guest_polls: u64,
    /// Completion interrupts skipped because the guest polled.
    irqs_skipped: u64,
    idle_cpu_pct: f64,
}

#[derive(Serialize)]
struct Row {
    device: String,
    mode: &'static str,
    command: String,
    /// The run with the median IOPS.
    median: Run,
    /// Per round, IOPS / IOPS with polling off in the same round.
    ratio_to_off: Vec<f64>,
    runs: Vec<Run>,
}

fn run_mode(
    exe: &Path,
    b: &HaltPollBench,
    dir: &Path,
    m: &Mode,
    round: u32,
) -> Result<Run, BenchError> {
    let io_file = crate::hover_process::TempPath::new(
        dir.join(format!("hover-bench-io-{}-{round}", std::process::id())),
    );
    let file = io_file.path();
    let cmdline = format!(
        "workload=iolat size=4K seconds={}{}",
        b.seconds, m.cmdline_extra
    );
    let mut args: Vec<&str> = m.args.to_vec();
    let file_s = file.display().to_string();
    args.extend(["--vcpus", "2", "--io-file", &file_s, "--cmdline", &cmdline]);
    let r = run_hover(exe, &args);
    drop(io_file);
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
        successful_polls: r.vcpu_stat("halt_successful_poll"),
        attempted_polls: r.vcpu_stat("halt_attempted_poll"),
        governor_window_ns: r.outcome["halt_poll"]["final_window_ns"].as_u64(),
        guest_poll_hits: r.report("haltpoll.hits").unwrap_or(0.0) as u64,
        guest_polls: r.report("haltpoll.polls").unwrap_or(0.0) as u64,
        irqs_skipped: r.outcome["io"]["irqs_skipped"].as_u64().unwrap_or(0),
        idle_cpu_pct,
    })
}

/// Run the scenario with the `hover` binary at `exe`.
pub fn run(exe: &Path, b: &HaltPollBench, out: &Path) -> Result<(), BenchError> {
    let devices: Vec<String> = b
        .devices
        .iter()
        .map(|(n, d)| format!("{n} = {}", d.display()))
        .collect();
    println!(
        "hover bench halt-poll: iolat (QD1 4 KiB O_DSYNC writes; devices {}) on 2 vCPUs, {} s per run, {} interleaved rounds; idle guest CPU from a 100 ms timer task run right after each",
        devices.join(", "),
        b.seconds,
        b.runs
    );
    let qemu = match b.peer.then(crate::peer::find) {
        Some(Ok(q)) => Some(q),
        Some(Err(e)) => {
            println!("--peer qemu: skipped: {e}");
            None
        }
        None => None,
    };
    let image = match qemu {
        Some(_) => Some(crate::peer::GuestImageFile::write(exe)?),
        None => None,
    };
    // all[device][mode] = runs in round order; peer_runs[device] likewise.
    let mut all: Vec<Vec<Vec<Run>>> = vec![vec![Vec::new(); MODES.len()]; b.devices.len()];
    let mut peer_runs: Vec<Vec<PeerIolat>> = vec![Vec::new(); b.devices.len()];
    for round in 0..b.runs.max(1) {
        for (d, (dname, dir)) in b.devices.iter().enumerate() {
            if let (Some(q), Some(img)) = (&qemu, &image) {
                let r = crate::halt_poll_peer::run(q, img.path(), dir, b.seconds, round)?;
                eprintln!(
                    "  round {} {:<5} {:<26} {:>8.0} IOPS",
                    round + 1,
                    dname,
                    "QEMU microvm",
                    r.iops
                );
                peer_runs[d].push(r);
            }
            for (i, m) in MODES.iter().enumerate() {
                let r = run_mode(exe, b, dir, m, round)?;
                eprintln!(
                    "  round {} {:<5} {:<26} {:>8.0} IOPS, idle CPU {:.2}%",
                    round + 1,
                    dname,
                    m.name,
                    r.iops,
                    r.idle_cpu_pct
                );
                all[d][i].push(r);
            }
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    for ((dname, _), per_mode) in b.devices.iter().zip(all) {
        let off: Vec<f64> = per_mode[0].iter().map(|r| r.iops).collect();
        for (m, runs) in MODES.iter().zip(per_mode) {
            let mut by_iops = runs.clone();
            by_iops.sort_by(|a, b| a.iops.total_cmp(&b.iops));
            let median = by_iops[(by_iops.len() - 1) / 2].clone();
            rows.push(Row {
                device: dname.clone(),
                mode: m.name,
                command: format!(
                    "hover run {} --vcpus 2 --io-file FILE --cmdline \"workload=iolat size=4K seconds={}{}\"",
                    m.args.join(" "),
                    b.seconds,
                    m.cmdline_extra
                ),
                median,
                ratio_to_off: off
                    .iter()
                    .zip(&runs)
                    .filter(|(o, _)| **o > 0.0)
                    .map(|(o, r)| r.iops / o)
                    .collect(),
                runs,
            });
        }
    }
    let mut table_rows: Vec<Vec<String>> = Vec::new();
    for (dname, _) in &b.devices {
        let dev: Vec<&Row> = rows.iter().filter(|r| &r.device == dname).collect();
        let best = dev
            .iter()
            .zip(MODES)
            .filter(|(_, m)| m.upper_bound)
            .map(|(r, _)| r.median.iops)
            .fold(0.0, f64::max);
        // The fixed window with the best median IOPS on this device: the
        // bar the governor is held to, round by round.
        let best_fixed = dev
            .iter()
            .filter(|r| r.mode.starts_with("fixed "))
            .max_by(|a, b| a.median.iops.total_cmp(&b.median.iops));
        let best_fixed_iops: Vec<f64> = best_fixed
            .map(|r| r.runs.iter().map(|x| x.iops).collect())
            .unwrap_or_default();
        if let Some(f) = best_fixed {
            println!(
                "{dname}: the best fixed window is {} (median {:.0} IOPS)",
                f.mode, f.median.iops
            );
        }
        let idle_poll: Vec<f64> = dev
            .iter()
            .find(|r| r.mode == "guest idle=poll")
            .map(|r| r.runs.iter().map(|x| x.iops).collect())
            .unwrap_or_default();
        for r in dev {
            let m = &r.median;
            let iops: Vec<f64> = r.runs.iter().map(|x| x.iops).collect();
            let to_off = crate::stats::summarize(&r.ratio_to_off).map_or("-".into(), |s| {
                format!("{:.2}/{:.2}/{:.2}x", s.min, s.p50, s.max)
            });
            table_rows.push(vec![
                r.device.clone(),
                r.mode.to_string(),
                format!("{:.0}", m.iops),
                format!("{:.0}", m.avg_us),
                format!("{:.0}", m.p99_us),
                to_off,
                crate::stats::ratios(&iops, &idle_poll),
                crate::stats::ratios(&iops, &best_fixed_iops),
                format!("{:.0}%", 100.0 * m.iops / best.max(1.0)),
                format!("{}/{}", m.successful_polls, m.attempted_polls),
                if m.guest_polls > 0 {
                    format!(
                        "{}/{}, {} irqs skipped",
                        m.guest_poll_hits, m.guest_polls, m.irqs_skipped
                    )
                } else {
                    String::new()
                },
                m.governor_window_ns
                    .map(|w| format!("{} us", w / 1000))
                    .unwrap_or_default(),
                format!("{:.2}%", m.idle_cpu_pct),
            ]);
        }
    }
    table::print(
        &[
            "device",
            "mode",
            "IOPS",
            "avg us",
            "p99 us",
            "vs off min/med/max",
            "vs idle=poll",
            "vs best fixed window",
            "of best bound",
            "KVM polls ok/attempted",
            "guest polls ok/started",
            "governor window",
            "idle CPU per vCPU",
        ],
        &table_rows,
    );
    if qemu.is_some() {
        peer_table(b, &rows, &peer_runs);
    }
    let doc = serde_json::json!({
        "scenario": "halt-poll",
        "command": format!(
            "hover bench halt-poll --seconds {} --runs {} --devices {}{}",
            b.seconds,
            b.runs,
            b.devices.iter().map(|(d, _)| d.as_str()).collect::<Vec<_>>().join(","),
            if b.peer { " --peer qemu" } else { "" }
        ),
        "date": plot::today(),
        "seconds": b.seconds,
        "rounds": b.runs,
        "rows": rows,
        "qemu_microvm": peer_runs,
    });
    table::write_json(out, "halt_poll.json", &doc)?;
    plot(&doc, out)
}

/// `halt_poll.svg` from `halt_poll.json`'s document: per way of waiting,
/// each device's IOPS (median of rounds, min-max whisker).
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let rows = doc["rows"].as_array().cloned().unwrap_or_default();
    let modes = plot::distinct_field(&rows, "mode");
    let devices = plot::distinct_field(&rows, "device");
    let series: Vec<plot::Bars> = devices
        .iter()
        .map(|d| plot::Bars {
            label: format!("{d} device"),
            rounds: modes
                .iter()
                .map(|m| {
                    rows.iter()
                        .find(|r| r["device"] == d.as_str() && r["mode"] == m.as_str())
                        .and_then(|r| r["runs"].as_array())
                        .map(|runs| runs.iter().filter_map(|x| x["iops"].as_f64()).collect())
                        .unwrap_or_default()
                })
                .collect(),
        })
        .collect();
    let groups: Vec<String> = modes.iter().map(|m| m.replace("fixed ", "")).collect();
    plot::bars(
        &out.join("halt_poll.svg"),
        &plot::Figure {
            title: "Seed 5, halt polling: iolat's QD1 synchronous 4 KiB writes by way of waiting"
                .into(),
            caption: plot::caption_of(doc, "hover bench halt-poll"),
            x_desc: "how an idle vCPU waits for the completion".into(),
            y_desc: "IOPS".into(),
        },
        &groups,
        &series,
    )
}

/// Hover's rows that matter beside QEMU, and QEMU's: each the run with the
/// median IOPS, and per round Hover's IOPS over QEMU's.
fn peer_table(b: &HaltPollBench, rows: &[Row], peer: &[Vec<PeerIolat>]) {
    const SHOWN: [&str; 3] = ["KVM default", "polling off", "guest haltpoll + governor"];
    println!(
        "beside QEMU microvm (virtio-blk on the same directory, iothread, aio=io_uring, cache=writethrough; KVM's default halt polling), same rounds:"
    );
    let mut t = Vec::new();
    for ((dname, _), q) in b.devices.iter().zip(peer) {
        let q_iops: Vec<f64> = q.iter().map(|r| r.iops).collect();
        for r in rows
            .iter()
            .filter(|r| &r.device == dname && SHOWN.contains(&r.mode))
        {
            let iops: Vec<f64> = r.runs.iter().map(|x| x.iops).collect();
            t.push(vec![
                dname.clone(),
                format!("hover, {}", r.mode),
                format!("{:.0}", r.median.iops),
                format!("{:.0}", r.median.avg_us),
                format!("{:.0}", r.median.p99_us),
                crate::stats::ratios(&iops, &q_iops),
            ]);
        }
        let mut by_iops = q.to_vec();
        by_iops.sort_by(|a, b| a.iops.total_cmp(&b.iops));
        if let Some(m) = by_iops.get(by_iops.len().saturating_sub(1) / 2) {
            t.push(vec![
                dname.clone(),
                "QEMU microvm, KVM default".into(),
                format!("{:.0}", m.iops),
                format!("{:.0}", m.avg_us),
                format!("{:.0}", m.p99_us),
                "1.00/1.00/1.00x".into(),
            ]);
        }
    }
    table::print(
        &[
            "device",
            "VMM, mode",
            "IOPS",
            "avg us",
            "p99 us",
            "IOPS vs QEMU per round (min/med/max)",
        ],
        &t,
    );
}
