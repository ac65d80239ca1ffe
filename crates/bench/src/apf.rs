//! `hover bench apf`: the async page fault seed's experiment, side by side.
//!
//! The seed ran bm (4 faulting and 4 working threads) in a guest whose memory
//! was larger than its host container, with and without async page faults:
//! with them, a thread that touches a swapped-out page sleeps while the vCPU
//! runs another, and total work doubled. Here: the built-in guest's `bm`
//! workload on 2 vCPUs, guest memory 4x the memory budget (the pager evicts
//! to the page store), for each page-store latency:
//! - ideal: working tasks only (same memory state, no faulting tasks);
//! - off: async PF off (a vCPU waits for every page its task touches);
//! - on: async PF on (the task is parked, the vCPU runs others);
//! - adaptive: async PF on while the guest's faults wait at least
//!   `adaptive_min_us` on average, else off (the guest's `apf_min_us=`).
//!
//! Prints the seed-style table (per-worker counts, total, on/off, share of
//! ideal, and what each async PF costs the guest in emulated instructions
//! and exits by KVM's statistics), writes apf.json and apf.svg (total work
//! against latency).
//!
//! The host here is itself a 2-core VM whose CPU time varies from run to
//! run, so each configuration runs `runs` times, interleaved (every
//! configuration once, then again), and the run with the median total is
//! reported; all runs are in the JSON.

use std::path::Path;

use serde::Serialize;

use crate::hover_process::run_hover;
use crate::plot;
use crate::{table, BenchError};

/// Knobs of the scenario.
pub struct ApfBench {
    /// Page-store latencies to sweep, as `--page-store-latency` values.
    pub latencies: Vec<String>,
    /// Seconds each bm run measures.
    pub seconds: u32,
    /// Runs per configuration (interleaved; the median run is reported).
    pub runs: u32,
    /// Guest memory, MiB.
    pub memory_mib: u64,
    /// Memory budget, MiB.
    pub budget_mib: u64,
    /// The adaptive rows' `apf_min_us=`.
    pub adaptive_min_us: u64,
}

impl Default for ApfBench {
    fn default() -> Self {
        ApfBench {
            latencies: ["0", "100us", "500us", "2ms", "5ms"]
                .map(String::from)
                .to_vec(),
            seconds: 5,
            runs: 3,
            memory_mib: 256,
            budget_mib: 64,
            adaptive_min_us: 1200,
        }
    }
}

#[derive(Serialize)]
struct Row {
    latency: String,
    mode: &'static str,
    workers: Vec<u64>,
    total: u64,
    /// Totals of every run of this configuration.
    totals: Vec<u64>,
    fault_writes: u64,
    store_reads: u64,
    parked: Option<u64>,
    parked_avg_us: Option<u64>,
    /// "Page not present" notifications the guest took (async PF on).
    not_present: Option<u64>,
    /// KVM statistics over the run, all vCPUs: CPL0 instructions emulated
    /// and VM exits.
    insn_emulation: u64,
    exits: u64,
    /// Async PF on: the run's emulated instructions and exits beyond the
    /// same round's run with async PF off, per "page not present" (each
    /// followed by its "page ready"): what the guest pays per async PF.
    insns_per_apf: Option<f64>,
    exits_per_apf: Option<f64>,
    /// Adaptive: the milliseconds the guest's policy kept async PF off.
    adaptive_off_ms: Option<u64>,
    /// Why this row's figure is not a result (work above the ideal run's:
    /// the host gave the runs different CPU), flagged rather than shown
    /// as a gain.
    #[serde(skip_serializing_if = "Option::is_none")]
    suspect: Option<String>,
    command: String,
}

/// How far above the ideal run's work a run may go before its figure is
/// flagged: the ideal run has no faulting tasks, so more work than it did
/// means the host gave the runs different CPU, not a gain.
const ABOVE_IDEAL: f64 = 1.10;

/// Why a run of `total` work beside an ideal run of `ideal` is no result.
fn suspect(total: u64, ideal: f64) -> Option<String> {
    let share = total as f64 / ideal;
    (ideal > 0.0 && share > ABOVE_IDEAL).then(|| {
        format!(
            "work {:.0}% of the ideal run's: the host's CPU changed between the runs; run longer or again",
            100.0 * share
        )
    })
}

const MODES: [&str; 4] = ["ideal", "off", "on", "adaptive"];

fn run_one(
    exe: &Path,
    b: &ApfBench,
    array_mib: u64,
    lat: &str,
    mode: &'static str,
) -> Result<Row, BenchError> {
    let faulting = if mode == "ideal" { 0 } else { 4 };
    let mut cmdline = format!(
        "workload=bm faulting={faulting} working=4 memory={array_mib}M seconds={}",
        b.seconds
    );
    if mode == "adaptive" {
        cmdline += &format!(" apf_min_us={}", b.adaptive_min_us);
    }
    let memory = format!("{}M", b.memory_mib);
    let budget = format!("{}M", b.budget_mib);
    let apf = if mode == "off" { "off" } else { "on" };
    let args = [
        "--vcpus",
        "2",
        "--memory",
        &memory,
        "--memory-budget",
        &budget,
        "--page-store-latency",
        lat,
        "--async-pf",
        apf,
        "--cmdline",
        &cmdline,
    ];
    let r = run_hover(exe, &args)?;
    let workers = (0..4)
        .map(|i| r.report(&format!("bm.worker.{i}")).map(|v| v as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let opt = |k: &str| r.report(k).ok().map(|v| v as u64);
    let total = r.report("bm.work_total")? as u64;
    Ok(Row {
        latency: lat.to_string(),
        mode,
        total,
        totals: vec![total],
        fault_writes: r.report("bm.fault_writes")? as u64,
        store_reads: r.number(&["pager", "store_reads"])? as u64,
        parked: opt("apf.parked"),
        parked_avg_us: opt("apf.parked_avg_us"),
        not_present: opt("apf.not_present"),
        insn_emulation: r.vcpu_stat("insn_emulation"),
        exits: r.vcpu_stat("exits"),
        insns_per_apf: None,
        exits_per_apf: None,
        adaptive_off_ms: opt("apf.off_ms"),
        suspect: None,
        workers,
        command: format!(
            "hover run {}",
            args.map(|a| if a.contains(' ') {
                format!("\"{a}\"")
            } else {
                a.to_string()
            })
            .join(" ")
        ),
    })
}

/// Run the scenario with the `hover` binary at `exe`.
pub fn run(exe: &Path, b: &ApfBench, out: &Path) -> Result<(), BenchError> {
    let array_mib = b.memory_mib * 3 / 4;
    println!(
        "hover bench apf: bm with 4 faulting + 4 working tasks on 2 vCPUs, guest memory {} MiB, budget {} MiB, array {} MiB, {} s per run, median of {} runs",
        b.memory_mib, b.budget_mib, array_mib, b.seconds, b.runs
    );
    let mut runs: Vec<Row> = Vec::new();
    for round in 0..b.runs.max(1) {
        for lat in &b.latencies {
            let first = runs.len();
            for mode in MODES {
                let row = run_one(exe, b, array_mib, lat, mode)?;
                eprintln!(
                    "  run {} latency {lat:>6} {mode:>5}: total {}",
                    round + 1,
                    row.total
                );
                runs.push(row);
            }
            per_apf_costs(&mut runs[first..]);
        }
    }
    // Per configuration, the run with the median total.
    let mut rows = Vec::new();
    for lat in &b.latencies {
        for mode in MODES {
            let mut these: Vec<Row> = Vec::new();
            let mut i = 0;
            while i < runs.len() {
                if runs[i].latency == *lat && runs[i].mode == mode {
                    these.push(runs.remove(i));
                } else {
                    i += 1;
                }
            }
            these.sort_by_key(|r| r.total);
            let totals: Vec<u64> = these.iter().map(|r| r.total).collect();
            let mut median = these.swap_remove((these.len() - 1) / 2);
            median.totals = totals;
            rows.push(median);
        }
    }
    let mut table_rows = Vec::new();
    let total = |rows: &[Row], lat: &str, mode: &str| {
        rows.iter()
            .find(|r| r.latency == lat && r.mode == mode)
            .map(|r| r.total as f64)
    };
    let ideals: Vec<f64> = rows
        .iter()
        .map(|r| total(&rows, &r.latency, "ideal").unwrap_or(f64::NAN))
        .collect();
    for (r, ideal) in rows.iter_mut().zip(&ideals) {
        if r.mode != "ideal" {
            r.suspect = suspect(r.total, *ideal);
        }
    }
    let total = |lat: &str, mode: &str| total(&rows, lat, mode);
    for r in &rows {
        let ideal = total(&r.latency, "ideal").unwrap_or(f64::NAN);
        let off = total(&r.latency, "off").unwrap_or(f64::NAN);
        let on_off = if matches!(r.mode, "on" | "adaptive") {
            format!("{:.2}x", r.total as f64 / off)
        } else {
            String::new()
        };
        table_rows.push(vec![
            r.latency.clone(),
            r.mode.to_string(),
            r.workers
                .iter()
                .map(|w| format!("{:.2}", *w as f64 / 1e9))
                .collect::<Vec<_>>()
                .join(" "),
            format!("{:.2}", r.total as f64 / 1e9),
            on_off,
            format!(
                "{:.0}%{}",
                100.0 * r.total as f64 / ideal,
                if r.suspect.is_some() { " (!)" } else { "" }
            ),
            r.fault_writes.to_string(),
            r.store_reads.to_string(),
            r.parked_avg_us
                .filter(|_| r.mode != "off")
                .map(|v| v.to_string())
                .unwrap_or_default(),
            r.insns_per_apf
                .map(|v| format!("{v:.1}"))
                .unwrap_or_default(),
            r.exits_per_apf
                .map(|v| format!("{v:.1}"))
                .unwrap_or_default(),
            r.adaptive_off_ms.map(|v| v.to_string()).unwrap_or_default(),
        ]);
    }
    table::print(
        &[
            "store latency",
            "async PF",
            "workers (1e9 iterations)",
            "total (1e9)",
            "on/off",
            "of ideal",
            "faulting writes",
            "pages read from store",
            "guest parked (us)",
            "emulated insns per async PF",
            "exits per async PF",
            "adaptive: off (ms)",
        ],
        &table_rows,
    );
    for r in rows.iter().filter(|r| r.suspect.is_some()) {
        println!(
            "(!) {} {}: {}",
            r.latency,
            r.mode,
            r.suspect.as_deref().unwrap_or("")
        );
    }
    let doc = serde_json::json!({
        "scenario": "apf",
        "command": format!(
            "hover bench apf --latencies {} --seconds {} --runs {} --adaptive-min-us {}",
            b.latencies.join(","),
            b.seconds,
            b.runs,
            b.adaptive_min_us
        ),
        "date": plot::today(),
        "rows": rows,
    });
    table::write_json(out, "apf.json", &doc)?;
    plot(&doc, out)
}

/// In one round's runs at one latency: the "on" run's emulated
/// instructions and exits beyond the "off" run's, per not-present. Both
/// runs have the same tasks, ticks and length; what "on" adds is the
/// guest's handling of each not-present + ready pair, and the halts of a
/// vCPU whose tasks are all parked.
fn per_apf_costs(round: &mut [Row]) {
    let Some(off) = round.iter().find(|r| r.mode == "off") else {
        return;
    };
    let (insns, exits) = (off.insn_emulation as f64, off.exits as f64);
    for r in round.iter_mut().filter(|r| r.mode == "on") {
        if let Some(n) = r.not_present.filter(|&n| n > 0) {
            r.insns_per_apf = Some((r.insn_emulation as f64 - insns) / n as f64);
            r.exits_per_apf = Some((r.exits as f64 - exits) / n as f64);
        }
    }
}

/// `apf.svg` from `apf.json`'s document: per store latency, each mode's
/// total work (median of rounds, min-max whisker).
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let rows = doc["rows"].as_array().cloned().unwrap_or_default();
    let latencies = plot::distinct_field(&rows, "latency");
    // Results written before the adaptive mode have no such rows.
    let series: Vec<plot::Bars> = MODES
        .iter()
        .filter(|&&m| rows.iter().any(|r| r["mode"] == m))
        .map(|&m| plot::Bars {
            label: match m {
                "ideal" => "ideal (working tasks only)".into(),
                "off" => "async PF off".into(),
                "on" => "async PF on".into(),
                _ => "async PF adaptive".into(),
            },
            rounds: latencies
                .iter()
                .map(|l| {
                    rows.iter()
                        .find(|r| r["latency"] == l.as_str() && r["mode"] == m)
                        .and_then(|r| r["totals"].as_array())
                        .map(|t| {
                            t.iter()
                                .filter_map(|v| v.as_f64())
                                .map(|v| v / 1e9)
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect(),
        })
        .collect();
    plot::bars(
        &out.join("apf.svg"),
        &plot::Figure {
            title: "Seed 1, async page faults: 4 working tasks' work while 4 others fault".into(),
            caption: plot::caption_of(doc, "hover bench apf"),
            x_desc: "extra page-store latency per fetched page".into(),
            y_desc: "work of the working tasks (1e9 iterations)".into(),
        },
        &latencies,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &'static str, insns: u64, exits: u64, not_present: Option<u64>) -> Row {
        Row {
            latency: "2ms".into(),
            mode,
            workers: vec![],
            total: 0,
            totals: vec![],
            fault_writes: 0,
            store_reads: 0,
            parked: None,
            parked_avg_us: None,
            not_present,
            insn_emulation: insns,
            exits,
            insns_per_apf: None,
            exits_per_apf: None,
            adaptive_off_ms: None,
            suspect: None,
            command: String::new(),
        }
    }

    #[test]
    fn work_above_the_ideal_runs_is_flagged_not_shown_as_a_gain() {
        assert!(suspect(3_740, 1_000.0).unwrap().contains("374%"));
        assert_eq!(suspect(1_050, 1_000.0), None, "inside the tolerance");
        assert_eq!(suspect(500, 1_000.0), None);
        assert_eq!(suspect(500, f64::NAN), None, "no ideal run");
    }

    #[test]
    fn an_async_pf_costs_what_on_adds_over_off_per_not_present() {
        let mut round = [
            row("ideal", 1_000, 100, None),
            row("off", 5_000, 900, None),
            row("on", 45_000, 5_900, Some(1_000)),
        ];
        per_apf_costs(&mut round);
        assert_eq!(round[2].insns_per_apf, Some(40.0));
        assert_eq!(round[2].exits_per_apf, Some(5.0));
        assert_eq!(round[0].insns_per_apf, None);
        assert_eq!(round[1].insns_per_apf, None);
        // No not-present (nothing faulted asynchronously): no figure.
        let mut quiet = [row("off", 5_000, 900, None), row("on", 5_100, 910, Some(0))];
        per_apf_costs(&mut quiet);
        assert_eq!(quiet[1].insns_per_apf, None);
    }
}
