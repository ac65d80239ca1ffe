//! `hover bench migrate`: live migration between two `hover` processes on
//! this machine, seeds 3 and 4 side by side.
//!
//! Part 1, the dirty trackers (seed 4): for each guest memory size, each
//! working set and each tracker (`ring` on a VM started with 4096-entry rings), a `kvstore` guest (random verified writes over a working set at
//! a fixed rate) is migrated while it runs. Per sample: total time,
//! downtime (the source's pause and the gap the guest saw), rounds, pages
//! sent, the guest's operations per second during the migration as a share
//! of the second before it (from its own per-100 ms counts: the guest keeps
//! its timeline across the move), and the guest's page faults during the
//! migration (KVM's `pf_taken`, write faults of dirty logging included).
//!
//! Part 2, batching (seed 3): a guest with a fixed, idle 64 MiB working set
//! (`bm` with no tasks: the array prefaulted, then the guest idles, so the
//! vCPUs leave the host's CPUs to the two monitors) migrated
//! with batches of 1, 16, 256, 1024 pages: pages per second and the
//! sending thread's CPU cycles per page.
//!
//! The same guest sent by a separate sender process (seed 3's setting, on
//! the memfd backend) that reads guest memory per page by mmap, by
//! `process_vm_readv` per batch, or through one persistent mapping, beside
//! the VMM's own thread: total time and sender CPU cycles per page (both
//! processes).
//!
//! (The sender-process rows and part 3 live in `mapping.rs`.)
//!
//! Part 3, the mapping micro-benchmark: a 64 MiB memfd guest RAM made here,
//! read whole by a sender process in each mapping mode and batch size,
//! sending nothing: the helper's CPU cycles per page, and per round the
//! per-page mode's cost over this one's.
//!
//! Trackers, sizes, batch sizes and modes are interleaved within each
//! round; every cell is median (min-max) over the rounds.

use std::path::Path;

use serde::Serialize;
use serde_json::Value;

pub mod mapping;
mod plot;

pub use self::plot::plot;

use crate::hover_process::sum_stat;
use crate::migration_run::{
    migrate_once, ops_during_pct, slow_baseline, work_lost_ms, work_spread,
};
use crate::stats::summarize;
use crate::{table, BenchError};
use mapping::{map_samples, map_table, sender_sample, sender_table, SENDERS};

/// The scenario's knobs.
#[derive(Clone, Debug)]
pub struct MigrateBench {
    /// Dirty trackers to compare.
    pub trackers: Vec<String>,
    /// Guest memory sizes.
    pub memories: Vec<String>,
    /// kvstore's working sets.
    pub wss: Vec<String>,
    /// kvstore's operations per second.
    pub rate: u64,
    /// Batch sizes for part 2.
    pub batches: Vec<usize>,
    /// Rounds.
    pub runs: u32,
    /// `unix` or `tcp` (loopback).
    pub transport: String,
}

impl MigrateBench {
    /// Its flags checked (trackers known, sizes whole pages).
    pub fn check(&self) -> Result<(), BenchError> {
        crate::flags::each("--trackers", &self.trackers, |t| {
            t.parse::<hover_vmm::migration::Tracker>().map(drop)
        })?;
        crate::flags::memories("--memories", &self.memories)?;
        crate::flags::fits(("--wss", &self.wss), ("--memories", &self.memories))?;
        crate::flags::guest_param("--rate", "kvstore", "rate", &self.rate.to_string())?;
        let max = hover_vmm::migration::wire::MAX_BATCH;
        if let Some(b) = self.batches.iter().find(|&&b| b == 0 || b > max) {
            return Err(BenchError::Input(format!(
                "--batches: {b} pages is out of range: give 1 to {max}"
            )));
        }
        crate::flags::runs(self.runs)
    }
}

impl Default for MigrateBench {
    fn default() -> Self {
        MigrateBench {
            trackers: vec![
                "bitmap".into(),
                "manual".into(),
                "hybrid".into(),
                "ring".into(),
            ],
            memories: vec!["256M".into(), "1G".into(), "4G".into()],
            wss: vec!["16M".into(), "64M".into()],
            rate: 100_000,
            batches: vec![1, 16, 256, 1024],
            runs: 2,
            transport: "unix".into(),
        }
    }
}

/// One tracker sample.
#[derive(Clone, Debug, Serialize)]
pub struct TrackerSample {
    /// Guest memory.
    pub memory: String,
    /// kvstore's working set.
    pub wss: String,
    /// Tracker.
    pub tracker: String,
    /// Round.
    pub round: u32,
    /// The migration's own report.
    pub report: Value,
    /// Guest operations per second during the migration, percent of the
    /// second before it.
    pub ops_during_pct: f64,
    /// Guest work lost, ms of full-speed work (`migration_run::work_lost_ms`).
    pub work_lost_ms: f64,
    /// Guest page faults (`pf_taken`, all vCPUs) during the migration.
    pub faults_during: u64,
}

/// One batching sample.
#[derive(Clone, Debug, Serialize)]
pub struct BatchSample {
    /// Pages per batch.
    pub batch_pages: usize,
    /// Round.
    pub round: u32,
    /// Pages sent per second.
    pub pages_per_s: f64,
    /// The sending thread's CPU cycles per page sent.
    pub cycles_per_page: f64,
    /// Total migration time, ms.
    pub total_ms: f64,
}

fn tracker_sample(
    exe: &Path,
    b: &MigrateBench,
    memory: &str,
    wss: &str,
    tracker: &str,
    round: u32,
) -> Result<TrackerSample, BenchError> {
    let cmdline = format!("workload=kvstore wss={wss} rate={} seconds=6", b.rate);
    let id = format!("{}-{memory}-{wss}-{tracker}-{round}", std::process::id());
    let body = serde_json::json!({ "dirty_tracking": tracker });
    let m = migrate_once(exe, &b.transport, &[], (memory, &cmdline), body, &id)?;
    let rep = m.report;
    let ops_during_pct = ops_during_pct(
        &m.dest,
        m.requested_tsc,
        rep["total_ms"].as_f64().unwrap_or(0.0),
    )?;
    let work_lost_ms = work_lost_ms(
        &m.dest,
        m.requested_tsc,
        rep["total_ms"].as_f64().unwrap_or(0.0),
    )?;
    let faults = sum_stat(&m.src["vcpu_stats"], "pf_taken").saturating_sub(m.faults_before);
    Ok(TrackerSample {
        memory: memory.into(),
        wss: wss.into(),
        tracker: tracker.into(),
        round,
        report: rep,
        ops_during_pct,
        work_lost_ms,
        faults_during: faults,
    })
}

fn batch_sample(
    exe: &Path,
    b: &MigrateBench,
    batch: usize,
    round: u32,
) -> Result<BatchSample, BenchError> {
    let cmdline = "workload=bm faulting=0 working=0 memory=64M seconds=8";
    let id = format!("{}-batch{batch}-{round}", std::process::id());
    let body = serde_json::json!({ "batch_pages": batch });
    let rep = migrate_once(exe, &b.transport, &[], ("1G", cmdline), body, &id)?.report;
    let num = |k: &str| rep[k].as_f64().unwrap_or(0.0);
    let pages = num("pages_sent").max(1.0);
    let tsc_khz = crate::hover_process::tsc_khz()? as f64;
    Ok(BatchSample {
        batch_pages: batch,
        round,
        pages_per_s: pages / (num("total_ms") / 1000.0),
        cycles_per_page: num("sender_cpu_us") * tsc_khz / 1000.0 / pages,
        total_ms: num("total_ms"),
    })
}

/// Mean time of one harvest of dirty pages in a migration report, ms.
fn harvest_ms(report: &Value) -> f64 {
    let h: Vec<f64> = report["harvest_us"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    h.iter().sum::<f64>() / h.len().max(1) as f64 / 1000.0
}

/// Run the scenario: tables on stdout, `OUT/migrate.json`, `OUT/migrate_*.svg`.
pub fn run(exe: &Path, b: &MigrateBench, out: &Path) -> Result<(), BenchError> {
    let mut trackers = Vec::new();
    let mut batches = Vec::new();
    let mut senders = Vec::new();
    let mut maps = Vec::new();
    for round in 0..b.runs {
        for (k, memory) in b.memories.iter().enumerate() {
            for wss in &b.wss {
                for j in 0..b.trackers.len() {
                    let tracker = &b.trackers[(j + k + round as usize) % b.trackers.len()];
                    let s = tracker_sample(exe, b, memory, wss, tracker, round)?;
                    eprintln!(
                        "round {round} {memory} wss {wss} {tracker}: total {:.0} ms, downtime {:.1} ms, {} rounds, {} pages, ops during {:.0}% of before, work lost {:.0} ms{}, {} faults, harvest {:.2} ms",
                        s.report["total_ms"].as_f64().unwrap_or(0.0),
                        s.report["downtime_ms"].as_f64().unwrap_or(0.0),
                        s.report["rounds"],
                        s.report["pages_sent"],
                        s.ops_during_pct,
                        s.work_lost_ms,
                        if slow_baseline(s.work_lost_ms) { " (!) the second before was slow" } else { "" },
                        s.faults_during,
                        harvest_ms(&s.report)
                    );
                    trackers.push(s);
                }
            }
        }
        for j in 0..b.batches.len() {
            let batch = b.batches[(j + round as usize) % b.batches.len()];
            let s = batch_sample(exe, b, batch, round)?;
            eprintln!(
                "round {round} batch {batch}: {:.0} pages/s, {:.0} cycles/page, {:.0} ms",
                s.pages_per_s, s.cycles_per_page, s.total_ms
            );
            batches.push(s);
        }
        for j in 0..SENDERS.len() {
            let sender = SENDERS[(j + round as usize) % SENDERS.len()];
            let s = sender_sample(exe, b, sender, round)?;
            eprintln!(
                "round {round} sender {sender}: {:.0} ms, {:.0} cycles/page",
                s.total_ms, s.cycles_per_page
            );
            senders.push(s);
        }
        for s in map_samples(b, round)? {
            eprintln!(
                "round {round} mapping {} x {}: {:.0} cycles/page",
                s.mode, s.batch_pages, s.cycles_per_page
            );
            maps.push(s);
        }
    }
    let num = |s: &TrackerSample, k: &str| s.report[k].as_f64().unwrap_or(0.0);
    let mut rows = Vec::new();
    let mut json_rows = Vec::new();
    for (memory, wss) in b
        .memories
        .iter()
        .flat_map(|m| b.wss.iter().map(move |w| (m, w)))
    {
        for tracker in &b.trackers {
            let of: Vec<&TrackerSample> = trackers
                .iter()
                .filter(|s| &s.memory == memory && &s.wss == wss && &s.tracker == tracker)
                .collect();
            let sum = |f: &dyn Fn(&TrackerSample) -> f64| {
                summarize(&of.iter().map(|s| f(s)).collect::<Vec<_>>()).expect("runs >= 1")
            };
            let total = sum(&|s| num(s, "total_ms"));
            let down = sum(&|s| num(s, "downtime_ms"));
            let gdown = sum(&|s| num(s, "guest_downtime_ms"));
            let rounds = sum(&|s| num(s, "rounds"));
            let pages = sum(&|s| num(s, "pages_sent"));
            // Work figures over the samples with a sound baseline only.
            let sound: Vec<&&TrackerSample> = of
                .iter()
                .filter(|s| !slow_baseline(s.work_lost_ms))
                .collect();
            let work = |f: &dyn Fn(&TrackerSample) -> f64| {
                summarize(&sound.iter().map(|s| f(s)).collect::<Vec<_>>())
            };
            let (ops, lost) = (work(&|s| s.ops_during_pct), work(&|s| s.work_lost_ms));
            let pairs = |f: &dyn Fn(&TrackerSample) -> f64| -> Vec<(f64, f64)> {
                of.iter().map(|s| (f(s), s.work_lost_ms)).collect()
            };
            let faults = sum(&|s| s.faults_during as f64);
            let harvest = sum(&|s| harvest_ms(&s.report));
            rows.push(vec![
                memory.clone(),
                wss.clone(),
                tracker.clone(),
                total.text(0),
                down.text(1),
                gdown.text(1),
                rounds.text(0),
                pages.text(0),
                work_spread(&pairs(&|s| s.ops_during_pct), 0),
                work_spread(&pairs(&|s| s.work_lost_ms), 0),
                faults.text(0),
                harvest.text(2),
            ]);
            json_rows.push(serde_json::json!({
                "memory": memory, "wss": wss, "tracker": tracker, "total_ms": total, "downtime_ms": down,
                "guest_downtime_ms": gdown, "rounds": rounds, "pages_sent": pages,
                "ops_during_pct": ops, "work_lost_ms": lost, "faults_during": faults, "harvest_ms": harvest,
            }));
        }
    }
    println!(
        "live migration over {} of a kvstore ({} ops/s) guest, {} rounds (median (min-max))",
        b.transport, b.rate, b.runs
    );
    table::print(
        &[
            "guest memory",
            "working set",
            "tracker",
            "total ms",
            "downtime ms",
            "guest saw ms",
            "rounds",
            "pages sent",
            "guest ops/s during, % of before",
            "guest work lost ms",
            "guest page faults during",
            "harvest ms (mean per round)",
        ],
        &rows,
    );
    if rows.iter().flatten().any(|c| c.contains("(!)")) {
        println!("{}", crate::migration_run::SLOW_BASELINE_NOTE);
    }
    let mut brows = Vec::new();
    let mut bjson = Vec::new();
    let base: Vec<&BatchSample> = batches.iter().filter(|s| s.batch_pages == 1).collect();
    for &batch in &b.batches {
        let of: Vec<&BatchSample> = batches.iter().filter(|s| s.batch_pages == batch).collect();
        let sum = |f: &dyn Fn(&BatchSample) -> f64| {
            summarize(&of.iter().map(|s| f(s)).collect::<Vec<_>>()).expect("runs >= 1")
        };
        // Per round, against the one-page baseline of the same round.
        let vs = |f: &dyn Fn(&BatchSample) -> f64| {
            summarize(
                &of.iter()
                    .filter_map(|s| {
                        let b1 = base.iter().find(|x| x.round == s.round)?;
                        Some(f(b1) / f(s).max(1e-9))
                    })
                    .collect::<Vec<_>>(),
            )
        };
        let pps = sum(&|s| s.pages_per_s);
        let cpp = sum(&|s| s.cycles_per_page);
        let total = sum(&|s| s.total_ms);
        let cycles_x = vs(&|s| s.cycles_per_page);
        let time_x = vs(&|s| s.total_ms);
        brows.push(vec![
            batch.to_string(),
            pps.text(0),
            cpp.text(0),
            total.text(0),
            cycles_x.map(|s| s.text(2)).unwrap_or_default(),
            time_x.map(|s| s.text(2)).unwrap_or_default(),
        ]);
        bjson.push(serde_json::json!({
            "batch_pages": batch, "pages_per_s": pps, "cycles_per_page": cpp, "total_ms": total,
            "cycles_vs_one_page": cycles_x, "time_vs_one_page": time_x,
        }));
    }
    println!(
        "\nbatched transfer: an idle 64 MiB working set in a 1 GiB guest, {} rounds",
        b.runs
    );
    table::print(
        &[
            "pages per batch",
            "pages/s",
            "sender CPU cycles/page",
            "total ms",
            "cycles: 1-page / this, per round",
            "time: 1-page / this, per round",
        ],
        &brows,
    );
    let (srows, sjson) = sender_table(&senders);
    println!(
        "\nsender process (memfd backend, batches of 256 pages): the same guest, {} rounds",
        b.runs
    );
    table::print(
        &[
            "sender",
            "total ms",
            "sender CPU cycles/page (VMM + process)",
            "time: thread / this, per round",
        ],
        &srows,
    );
    let (mrows, mjson) = map_table(b, &maps);
    println!(
        "\nmapping micro-benchmark: a sender process reads 64 MiB of a memfd guest, x3, {} rounds",
        b.runs
    );
    table::print(
        &[
            "mode",
            "pages per batch",
            "sender process CPU cycles/page",
            "per-page mmap / this, per round",
        ],
        &mrows,
    );
    let doc = serde_json::json!({
        "scenario": "migrate",
        "command": format!(
            "hover bench migrate --trackers {} --memories {} --wss {} --rate {} --batches {} --runs {} --transport {}",
            b.trackers.join(","),
            b.memories.join(","),
            b.wss.join(","),
            b.rate,
            b.batches.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
            b.runs,
            b.transport
        ),
        "date": crate::plot::today(),
        "trackers": json_rows, "batches": bjson, "senders": sjson, "mapping": mjson,
        "tracker_samples": trackers, "batch_samples": batches,
        "sender_samples": senders, "mapping_samples": maps,
    });
    table::write_json(out, "migrate.json", &doc)?;
    plot(&doc, out)
}
