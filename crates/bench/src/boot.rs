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

use crate::hover_process::run_hover;
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
    vmm_pss_mib: f64,
    vmm_private_mib: f64,
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
        vmm_pss_mib: run.number(&["memory", "vmm_pss"])? / (1 << 20) as f64,
        vmm_private_mib: run.number(&["memory", "vmm_private"])? / (1 << 20) as f64,
    })
}

/// Run the scenario with the `hover` binary at `exe`; print the table and
/// write `boot.json` into `out`.
pub fn run(exe: &Path, runs: u32, vcpus: u32, out: &Path) -> Result<(), BenchError> {
    let samples = (0..runs.max(1))
        .map(|_| boot_once(exe, vcpus))
        .collect::<Result<Vec<_>, _>>()?;
    let col = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
    let metrics: [(&str, &str, Vec<f64>); 8] = [
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
        (
            "VMM proportional set size (PSS - resident guest RAM)",
            "MiB",
            col(|s| s.vmm_pss_mib),
        ),
        (
            "VMM private memory (private - resident guest RAM)",
            "MiB",
            col(|s| s.vmm_private_mib),
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
    let doc = serde_json::json!({
        "scenario": "boot",
        "command": format!("hover bench boot --runs {runs} --vcpus {vcpus}"),
        "date": crate::plot::today(),
        "vcpus": vcpus,
        "rows": rows,
        "samples": samples,
    });
    table::write_json(out, "boot.json", &doc)?;
    plot(&doc, out)
}

/// `boot.svg` from `boot.json`'s document: the monitor's own memory per
/// boot (resident, proportional, private, each less the guest RAM
/// resident), median of the boots with a min-max whisker.
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    use crate::plot::{bars, caption_of, Bars, Figure};
    let samples = doc["samples"].as_array().cloned().unwrap_or_default();
    let col = |k: &str| -> Vec<f64> { samples.iter().filter_map(|s| s[k].as_f64()).collect() };
    let series = [Bars {
        label: "the monitor's own memory".into(),
        rounds: vec![
            col("vmm_overhead_mib"),
            col("vmm_pss_mib"),
            col("vmm_private_mib"),
        ],
    }];
    bars(
        &out.join("boot.svg"),
        &Figure {
            title: "Boot: what the monitor itself takes (process less resident guest RAM)".into(),
            caption: caption_of(doc, "hover bench boot"),
            x_desc: format!(
                "{} boots of the built-in guest (workload=hello, {} vCPUs, 256 MiB)",
                samples.len(),
                doc["vcpus"].as_u64().unwrap_or(2)
            ),
            y_desc: "MiB".into(),
        },
        &[
            "resident (RSS)".to_string(),
            "proportional (PSS)".to_string(),
            "private".to_string(),
        ],
        &series,
    )
}

/// One round of the peer comparison: whole-process times, ms.
#[derive(Clone, Debug, Default, Serialize)]
struct PeerSample {
    hover_exit_ms: f64,
    hover_first_byte_ms: f64,
    microvm_exit_ms: f64,
    microvm_first_byte_ms: f64,
    pc_exit_ms: f64,
    pc_first_byte_ms: f64,
}

/// `hover bench boot --peer qemu`: the same image (the built-in guest,
/// written out with `hover guest-image`), the same workload (`hello`, 1
/// vCPU, 256 MiB) as a whole process: `hover run` against QEMU `microvm`
/// (booting the image's PVH entry) and QEMU `pc`, interleaved per round.
pub fn run_peer(exe: &Path, runs: u32, out: &Path) -> Result<(), BenchError> {
    let qemu = match crate::peer::find() {
        Ok(q) => q,
        Err(e) => {
            println!("hover bench boot --peer qemu: skipped: {e}");
            return Ok(());
        }
    };
    let image = crate::peer::GuestImageFile::write(exe)?;
    let samples = peer_rounds(exe, &qemu, image.path(), runs)?;
    println!(
        "hover bench boot --peer qemu: {} interleaved rounds; the built-in guest (workload=hello, 1 vCPU, 256 MiB) as a whole process: `hover run` vs {} -M microvm / -M pc booting the same image's PVH entry",
        samples.len(),
        qemu.display()
    );
    let col = |f: fn(&PeerSample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
    let spread = |v: &[f64]| crate::stats::spread(v, 1);
    let hover_exit = col(|s| s.hover_exit_ms);
    let rows = vec![
        vec![
            "hover run".to_string(),
            spread(&col(|s| s.hover_first_byte_ms)),
            spread(&hover_exit),
            "1.00/1.00/1.00x".into(),
        ],
        vec![
            "QEMU microvm".to_string(),
            spread(&col(|s| s.microvm_first_byte_ms)),
            spread(&col(|s| s.microvm_exit_ms)),
            crate::stats::ratios(&col(|s| s.microvm_exit_ms), &hover_exit),
        ],
        vec![
            "QEMU pc".to_string(),
            spread(&col(|s| s.pc_first_byte_ms)),
            spread(&col(|s| s.pc_exit_ms)),
            crate::stats::ratios(&col(|s| s.pc_exit_ms), &hover_exit),
        ],
    ];
    table::print(
        &[
            "VMM",
            "start -> first console byte ms",
            "start -> exit ms",
            "exit time vs hover run (min/median/max)",
        ],
        &rows,
    );
    let doc = serde_json::json!({
        "scenario": PEER_SCENARIO,
        "command": format!("hover bench boot --peer qemu --runs {runs}"),
        "date": crate::plot::today(),
        "samples": samples,
    });
    table::write_json(out, "boot_peer.json", &doc)?;
    plot_peer(&doc, out)
}

/// The `scenario` of `boot_peer.json`, which `hover bench plot` reads.
pub const PEER_SCENARIO: &str = "boot --peer qemu";

/// `boot_peer.svg` from `boot_peer.json`'s document: the time to the first
/// console byte and to the exit, `hover run` beside QEMU microvm (median of
/// rounds, min-max whisker). QEMU `pc`, seconds where these are
/// milliseconds, stays in the table: on the same axis it would flatten the
/// two compared here.
pub fn plot_peer(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    use crate::plot::{bars, caption_of, Bars, Figure};
    let samples = doc["samples"].as_array().cloned().unwrap_or_default();
    let col = |k: &str| -> Vec<f64> { samples.iter().filter_map(|s| s[k].as_f64()).collect() };
    let series = [("hover run", "hover"), ("QEMU microvm", "microvm")].map(|(label, key)| Bars {
        label: label.into(),
        rounds: vec![
            col(&format!("{key}_first_byte_ms")),
            col(&format!("{key}_exit_ms")),
        ],
    });
    bars(
        &out.join("boot_peer.svg"),
        &Figure {
            title: "Boot beside QEMU: the built-in guest as a whole process".into(),
            caption: caption_of(doc, "hover bench boot --peer qemu"),
            x_desc: "from the process's start (workload=hello, 1 vCPU, 256 MiB, same image)".into(),
            y_desc: "ms".into(),
        },
        &["first console byte".to_string(), "exit".to_string()],
        &series,
    )
}

fn peer_rounds(
    exe: &Path,
    qemu: &Path,
    image: &Path,
    runs: u32,
) -> Result<Vec<PeerSample>, BenchError> {
    use crate::peer::{run as qemu_run, Boot, Machine};
    let cmdline = "workload=hello";
    let timeout = std::time::Duration::from_secs(60);
    let mut samples = Vec::new();
    for _ in 0..runs.max(1) {
        let h = run_hover(exe, &["--vcpus", "1", "--cmdline", cmdline])?;
        let ms = |t: Instant| t.duration_since(h.started).as_secs_f64() * 1000.0;
        let first = h
            .first_console_byte
            .ok_or_else(|| BenchError::Guest("no console output".into()))?;
        let mut s = PeerSample {
            hover_exit_ms: ms(h.exited),
            hover_first_byte_ms: ms(first),
            ..Default::default()
        };
        for m in [Machine::Microvm, Machine::Pc] {
            let r = qemu_run(qemu, &Boot::new(m, image, 1, 256, cmdline), timeout)
                .map_err(|e| BenchError::Guest(format!("{}: {e}", m.name())))?;
            if r.exit_code != 0 || r.number("vcpus_seen") != Some(1.0) {
                return Err(BenchError::Guest(format!(
                    "{}: the guest exited with {} (console: {})",
                    m.name(),
                    r.exit_code,
                    r.console
                )));
            }
            let wall = r.wall.as_secs_f64() * 1000.0;
            let first = r
                .first_console_byte
                .map_or(wall, |d| d.as_secs_f64() * 1000.0);
            match m {
                Machine::Microvm => (s.microvm_exit_ms, s.microvm_first_byte_ms) = (wall, first),
                Machine::Pc => (s.pc_exit_ms, s.pc_first_byte_ms) = (wall, first),
            }
        }
        samples.push(s);
    }
    Ok(samples)
}
