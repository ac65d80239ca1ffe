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

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hover_vmm::api::ApiClient;
use serde::Serialize;
use serde_json::Value;

use crate::mapping::{map_samples, map_table, sender_sample, sender_table, SENDERS};
use crate::runner::{guest, rdtsc, spawn_with_api, wait_json};
use crate::stats::{summarize, Summary};
use crate::{plot, table, BenchError};

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

/// How long the guest runs before it is migrated.
const WARM_UP: Duration = Duration::from_millis(2000);

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

/// `hover receive` listening on a fresh address: the child and the address.
fn receiver(exe: &Path, transport: &str, id: &str) -> Result<(Child, String), BenchError> {
    let listen = match transport {
        "tcp" => "tcp:127.0.0.1:0".to_string(),
        _ => format!(
            "unix:{}",
            std::env::temp_dir()
                .join(format!("hover-bench-recv-{id}.sock"))
                .display()
        ),
    };
    let mut child = Command::new(exe)
        .args(["receive", "--listen", &listen, "--json", "--console", "off"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| guest(&format!("cannot start hover receive: {e}")))?;
    let at = listening_at(&mut child)?;
    Ok((child, at))
}

/// The address a `hover receive` started with its stderr piped listens at
/// (the last word of its first line).
pub(crate) fn listening_at(child: &mut Child) -> Result<String, BenchError> {
    let mut line = String::new();
    let stderr = child.stderr.as_mut().expect("piped");
    BufReader::new(stderr)
        .read_line(&mut line)
        .map_err(|e| guest(&format!("hover receive: {e}")))?;
    Ok(line
        .trim()
        .rsplit(' ')
        .next()
        .filter(|a| a.starts_with("tcp:") || a.starts_with("unix:"))
        .ok_or_else(|| guest(&format!("hover receive said {line:?}")))?
        .to_string())
}

fn sum_stat(stats: &Value, name: &str) -> u64 {
    stats
        .as_array()
        .map(|v| v.iter().filter_map(|s| s[name].as_u64()).sum())
        .unwrap_or(0)
}

pub(crate) fn report(outcome: &Value, key: &str) -> Option<u64> {
    outcome["reports"]
        .as_array()?
        .iter()
        .find(|r| r["key"] == key)?["value"]
        .as_u64()
}

/// A guest timeline's count over `[from, to)` (host TSC): the timeline is
/// reports `PREFIXk`, bucket `k` covering `start + k * bucket_ticks` for
/// `bucket_ticks`; a bucket the window cuts counts in proportion to the
/// part inside (its events taken as even over it). Counting whole buckets
/// would make a window shorter than a few buckets read 0% or 200%.
pub(crate) fn timeline_sum(
    outcome: &Value,
    prefix: &str,
    start: u64,
    bucket_ticks: u64,
    (from, to): (u64, u64),
) -> f64 {
    outcome["reports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let k: u64 = r["key"].as_str()?.strip_prefix(prefix)?.parse().ok()?;
            let at = start + k * bucket_ticks;
            let inside = (at + bucket_ticks).min(to).saturating_sub(at.max(from));
            (inside > 0 && bucket_ticks > 0)
                .then(|| r["value"].as_f64())
                .flatten()
                .map(|v| v * inside as f64 / bucket_ticks as f64)
        })
        .sum()
}

/// What [`migrate_once`] gives.
pub(crate) struct Migrated {
    /// The migration's report.
    pub report: Value,
    /// The destination's outcome.
    pub dest: Value,
    /// The source's outcome.
    pub src: Value,
    /// The TSC at the request.
    pub requested_tsc: u64,
    /// The TSC when the request returned (the destination confirmed).
    pub returned_tsc: u64,
    /// The source's guest page faults before the request.
    pub faults_before: u64,
}

/// Migrate a guest running `cmdline` on `memory`, with `run_args` added
/// to the source's `hover run`.
pub(crate) fn migrate_once(
    exe: &Path,
    transport: &str,
    run_args: &[&str],
    (memory, cmdline): (&str, &str),
    body: Value,
    id: &str,
) -> Result<Migrated, BenchError> {
    let (dest, at) = receiver(exe, transport, id)?;
    let sock = std::env::temp_dir().join(format!("hover-bench-src-{id}.sock"));
    let mut args = vec!["run", "--memory", memory, "--cmdline", cmdline];
    args.extend(run_args);
    // A sender process that maps guest memory needs it in a memfd; the
    // VMM-thread baseline of that comparison uses the same backend.
    if body.get("sender_process").is_some() {
        args.extend(["--memory-backend", "memfd"]);
    }
    // Rings exist only if the VM is created with them.
    if body["dirty_tracking"] == "ring" {
        args.extend(["--dirty-ring", "4096"]);
    }
    let src = spawn_with_api(exe, &args, &sock)?;
    std::thread::sleep(WARM_UP);
    let api = ApiClient::new(&sock, Duration::from_secs(600));
    let api_err = |e: hover_vmm::api::ApiError| guest(&e.to_string());
    let before = api.json("GET", "/vm/stats", None).map_err(api_err)?;
    let faults0 = sum_stat(&before["vcpu_stats"], "pf_taken");
    let mut body = body;
    body["to"] = at.into();
    let t = rdtsc();
    let rep = api.json("PUT", "/vm/migrate", Some(&body.to_string()));
    let returned = rdtsc();
    let src_out = wait_json(src, "hover run (source)")?;
    let rep = rep.map_err(api_err)?;
    let dest_out = wait_json(dest, "hover receive")?;
    if report(&dest_out, "kvstore.errors").unwrap_or(0) != 0 {
        return Err(guest("the migrated kvstore found wrong data"));
    }
    Ok(Migrated {
        report: rep,
        dest: dest_out,
        src: src_out,
        requested_tsc: t,
        returned_tsc: returned,
        faults_before: faults0,
    })
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
    let faults = sum_stat(&m.src["vcpu_stats"], "pf_taken").saturating_sub(m.faults_before);
    Ok(TrackerSample {
        memory: memory.into(),
        wss: wss.into(),
        tracker: tracker.into(),
        round,
        report: rep,
        ops_during_pct,
        faults_during: faults,
    })
}

/// A kvstore guest's operations per second during a migration requested
/// at TSC `t` that took `total_ms`, as a percentage of its rate in the
/// second before, from its timeline (ops per 100 ms bucket from its start
/// TSC) in `dest`'s reports. The guest's TSC is the host's on this KVM
/// (docs/ARCHITECTURE.md), under Hover and QEMU alike.
pub(crate) fn ops_during_pct(dest: &Value, t: u64, total_ms: f64) -> Result<f64, BenchError> {
    let start = report(dest, "kvstore.start_tsc").ok_or_else(|| guest("no kvstore.start_tsc"))?;
    let tsc_khz = crate::runner::tsc_khz()?;
    let bucket = tsc_khz * 100;
    let ops_in = |from: u64, to: u64| timeline_sum(dest, "kvstore.ops.", start, bucket, (from, to));
    let total_ms = total_ms.max(100.0);
    let during_ticks = (total_ms * tsc_khz as f64) as u64;
    let before = ops_in(t.saturating_sub(tsc_khz * 1000), t);
    let during = ops_in(t, t + during_ticks) / (total_ms / 1000.0);
    Ok(if before > 0.0 {
        100.0 * during / before
    } else {
        0.0
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
    let tsc_khz = crate::runner::tsc_khz()? as f64;
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

pub(crate) fn spread(s: &Summary, p: usize) -> String {
    format!("{:.p$} ({:.p$}-{:.p$})", s.p50, s.min, s.max)
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
                        "round {round} {memory} wss {wss} {tracker}: total {:.0} ms, downtime {:.1} ms, {} rounds, {} pages, ops during {:.0}% of before, {} faults, harvest {:.2} ms",
                        s.report["total_ms"].as_f64().unwrap_or(0.0),
                        s.report["downtime_ms"].as_f64().unwrap_or(0.0),
                        s.report["rounds"],
                        s.report["pages_sent"],
                        s.ops_during_pct,
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
            let ops = sum(&|s| s.ops_during_pct);
            let faults = sum(&|s| s.faults_during as f64);
            let harvest = sum(&|s| harvest_ms(&s.report));
            rows.push(vec![
                memory.clone(),
                wss.clone(),
                tracker.clone(),
                spread(&total, 0),
                spread(&down, 1),
                spread(&gdown, 1),
                spread(&rounds, 0),
                spread(&pages, 0),
                spread(&ops, 0),
                spread(&faults, 0),
                spread(&harvest, 2),
            ]);
            json_rows.push(serde_json::json!({
                "memory": memory, "wss": wss, "tracker": tracker, "total_ms": total, "downtime_ms": down,
                "guest_downtime_ms": gdown, "rounds": rounds, "pages_sent": pages,
                "ops_during_pct": ops, "faults_during": faults, "harvest_ms": harvest,
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
            "guest page faults during",
            "harvest ms (mean per round)",
        ],
        &rows,
    );
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
            spread(&pps, 0),
            spread(&cpp, 0),
            spread(&total, 0),
            cycles_x.map(|s| spread(&s, 2)).unwrap_or_default(),
            time_x.map(|s| spread(&s, 2)).unwrap_or_default(),
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
    table::write_json(
        out,
        "migrate.json",
        &serde_json::json!({
            "trackers": json_rows, "batches": bjson, "senders": sjson, "mapping": mjson,
            "tracker_samples": trackers, "batch_samples": batches,
            "sender_samples": senders, "mapping_samples": maps,
        }),
    )?;
    let series = b
        .trackers
        .iter()
        .flat_map(|t| b.wss.iter().map(move |w| (t, w)))
        .map(|(t, w)| plot::Series {
            label: format!("{t}, wss {w}: downtime"),
            points: b
                .memories
                .iter()
                .enumerate()
                .filter_map(|(i, m)| {
                    let v: Vec<f64> = trackers
                        .iter()
                        .filter(|s| &s.memory == m && &s.wss == w && &s.tracker == t)
                        .map(|s| num(s, "downtime_ms"))
                        .collect();
                    summarize(&v).map(|s| (i as f64, s.p50))
                })
                .collect(),
        })
        .collect::<Vec<_>>();
    plot::lines(
        &out.join("migrate_downtime.svg"),
        "live migration downtime by tracker (median)",
        "guest memory",
        "ms",
        &b.memories,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_window_counts_the_part_of_each_bucket_inside_it() {
        let outcome = serde_json::json!({ "reports": [
            { "key": "w.0", "value": 10 }, { "key": "w.1", "value": 20 },
            { "key": "w.2", "value": 40 }, { "key": "other", "value": 1000 },
        ]});
        // Buckets of 100 ticks from 1000: [1000,1100) [1100,1200) [1200,1300).
        let sum = |from, to| timeline_sum(&outcome, "w.", 1000, 100, (from, to));
        assert_eq!(sum(1050, 1250), 5.0 + 20.0 + 20.0);
        assert_eq!(sum(1100, 1200), 20.0);
        assert_eq!(sum(0, 5000), 70.0);
        assert_eq!(sum(1300, 1400), 0.0);
        assert_eq!(sum(1210, 1220), 4.0);
    }
}
