//! `hover bench snapshot`: what pausing, snapshotting and restoring cost,
//! and how soon a restored guest works at full speed: eager, lazy and
//! prefetch.
//!
//! For each guest memory size (default 256M, 1G, 4G) with a fixed working
//! set (`bm` with 2 faulting tasks writing random pages of a 64 MiB array
//! and 2 working tasks counting, reporting work per 50 ms bucket), one
//! sample is: boot `hover run`; after the array is prefaulted, pause and
//! resume through the API (pause latency); snapshot with stop (time paused,
//! file size); then `hover restore` in a new process, eager or lazy. From
//! the host TSC (which the guest shares here) it takes the time from
//! starting `hover restore` to the vCPUs running, and the guest's work in
//! the first second after starting it, as a share of its work in the
//! second before the snapshot (so host speed cancels out); the guest's speed
//! in each 100 ms of that second; and the time from starting `hover
//! restore` until the guest first works at 90% of its speed before the
//! snapshot over 100 ms. Sizes and modes are interleaved within each round.

use hover_vmm::api::Endpoint;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hover_vmm::api::ApiClient;
use hover_vmm::state::file::Snapshot;
use serde::Serialize;
use serde_json::Value;

use crate::hover_process::{guest, rdtsc, spawn_owned, spawn_with_api, wait_json, TempPath};
use crate::stats::{summarize, Summary};
use crate::{plot, table, BenchError};

/// The scenario's knobs.
#[derive(Clone, Debug)]
pub struct SnapshotBench {
    /// Guest memory sizes (`256M`, `1G`, ...).
    pub memories: Vec<String>,
    /// The working set: bm's array.
    pub working_set: String,
    /// Rounds.
    pub runs: u32,
    /// Hot-set windows, ms: a prefetch row for each (the snapshot taken
    /// with that `hot_window_ms`).
    pub hot_windows_ms: Vec<u64>,
    /// Where snapshot files are written (a real disk by default).
    pub dir: PathBuf,
}

impl SnapshotBench {
    /// Its flags checked (memories whole pages, the working set fits
    /// each, the snapshot directory writable).
    pub fn check(&self) -> Result<(), BenchError> {
        crate::flags::memories("--memories", &self.memories)?;
        crate::flags::fits(
            ("--working-set", std::slice::from_ref(&self.working_set)),
            ("--memories", &self.memories),
        )?;
        crate::flags::writable_dir("--dir", &self.dir)?;
        crate::flags::runs(self.runs)
    }
}

impl Default for SnapshotBench {
    fn default() -> Self {
        SnapshotBench {
            memories: vec!["256M".into(), "1G".into(), "4G".into()],
            working_set: "64M".into(),
            runs: 3,
            hot_windows_ms: vec![100],
            dir: PathBuf::from("/var/tmp"),
        }
    }
}

/// How long the guest runs before its snapshot (the array is prefaulted by then).
const BEFORE_SNAPSHOT: Duration = Duration::from_millis(1500);
/// bm's run: long enough for the second after the restore.
const BM_SECONDS: u32 = 4;
const BUCKET_MS: u64 = 50;

/// One sample.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Guest memory.
    pub memory: String,
    /// `eager`, `lazy` or `prefetch` (with its hot-set window when several
    /// are compared: `prefetch, hot 0 ms`).
    pub mode: String,
    /// The snapshot's hot-set window, ms (`None`: the API's default).
    pub hot_window_ms: Option<u64>,
    /// Round.
    pub round: u32,
    /// Pause: request to every vCPU stopped, microseconds.
    pub pause_us: f64,
    /// Time the VM was paused for the snapshot, milliseconds.
    pub snapshot_ms: f64,
    /// Snapshot file size, MiB.
    pub snapshot_mib: f64,
    /// Guest pages in the snapshot.
    pub snapshot_pages: u64,
    /// `hover restore` started to vCPUs running, milliseconds.
    pub restore_to_running_ms: f64,
    /// Inside the process: restore began to vCPUs running, milliseconds.
    pub restore_in_process_ms: f64,
    /// Guest work in the first second after `hover restore` started, as a
    /// percentage of its work in the second before the snapshot.
    pub first_second_work_pct: f64,
    /// Pages the restored pager read from the snapshot on demand.
    pub pages_on_demand: u64,
    /// `hover restore` started to the guest first working at 90% of its
    /// speed before the snapshot over 100 ms, milliseconds (`None`: not
    /// within the first second).
    pub ms_to_90_pct: Option<f64>,
    /// The guest's speed in each 100 ms of the first second after `hover
    /// restore` started, % of its speed before the snapshot.
    pub speed_pct: Vec<f64>,
}

/// A way to restore: a row of the table.
#[derive(Clone, Debug)]
struct Way {
    /// The row's name.
    label: String,
    /// `hover restore --memory-restore`.
    restore: &'static str,
    /// The snapshot's `hot_window_ms` (`None`: the API's default).
    hot_window_ms: Option<u64>,
}

/// The ways compared: eager, lazy, and prefetch for each hot-set window.
fn ways(b: &SnapshotBench) -> Vec<Way> {
    let plain = |m: &'static str| Way {
        label: m.into(),
        restore: m,
        hot_window_ms: None,
    };
    let mut w = vec![plain("eager"), plain("lazy")];
    for &ms in &b.hot_windows_ms {
        w.push(Way {
            label: if b.hot_windows_ms.len() == 1 {
                "prefetch".into()
            } else {
                format!("prefetch, hot {ms} ms")
            },
            restore: "prefetch",
            hot_window_ms: Some(ms),
        });
    }
    w
}
/// Windows of the speed series after a restore, ms.
const WINDOW_MS: u64 = 100;

/// The guest's work over time: start TSC, TSC ticks per bucket, and the
/// work done in each non-empty bucket (index, count).
type Timeline = (u64, u64, Vec<(u64, f64)>);

/// The timeline in an outcome's `bm.t.K` reports.
fn timeline(outcome: &Value, tsc_khz: u64) -> Result<Timeline, BenchError> {
    let reports = outcome["reports"]
        .as_array()
        .ok_or_else(|| guest("no reports"))?;
    let get = |k: &str| {
        reports
            .iter()
            .find(|r| r["key"] == k)
            .and_then(|r| r["value"].as_u64())
            .ok_or_else(|| guest(&format!("the guest did not report {k}")))
    };
    let start = get("bm.timeline.start_tsc")?;
    let ticks = get("bm.timeline.bucket_us")? * tsc_khz / 1000;
    let buckets = reports
        .iter()
        .filter_map(|r| {
            let k = r["key"].as_str()?.strip_prefix("bm.t.")?.parse().ok()?;
            Some((k, r["value"].as_f64()?))
        })
        .collect();
    Ok((start, ticks, buckets))
}

/// Work done in buckets that start within [from, to) (TSC).
fn work_between(t: &Timeline, from: u64, to: u64) -> f64 {
    let (start, ticks, buckets) = t;
    buckets
        .iter()
        .filter(|(k, _)| {
            let at = start + k * ticks;
            at >= from && at < to
        })
        .map(|(_, v)| v)
        .sum()
}

fn one(
    exe: &Path,
    b: &SnapshotBench,
    memory: &str,
    way: &Way,
    round: u32,
) -> Result<Sample, BenchError> {
    let mode = way.restore;
    let id = format!(
        "{}-{memory}-{mode}-{}-{round}",
        std::process::id(),
        way.hot_window_ms.map_or(-1, |w| w as i64)
    );
    let sock = std::env::temp_dir().join(format!("hover-bench-{id}.sock"));
    // Removed however the sample ends (an error, a signal to the bench).
    let snap_file = TempPath::new(b.dir.join(format!("hover-bench-{id}.snap")));
    let snap = snap_file.path();
    let _ = std::fs::remove_file(&sock);
    let cmdline = format!(
        "workload=bm faulting=2 working=2 memory={} seconds={BM_SECONDS} timeline_ms={BUCKET_MS}",
        b.working_set
    );
    let child = spawn_with_api(
        exe,
        &["run", "--memory", memory, "--cmdline", &cmdline],
        &sock,
    )?;
    std::thread::sleep(BEFORE_SNAPSHOT);
    let api = ApiClient::new(&sock, Duration::from_secs(600));
    let api_err = |e: hover_vmm::api::ApiError| guest(&e.to_string());
    let paused = api.send(Endpoint::Pause, None).map_err(api_err)?;
    api.send(Endpoint::Resume, None).map_err(api_err)?;
    let snapshot_tsc = rdtsc();
    let mut body = serde_json::json!({ "path": snap, "stop": true });
    if let Some(w) = way.hot_window_ms {
        body["hot_window_ms"] = w.into();
    }
    let body = body.to_string();
    let info = api.send(Endpoint::Snapshot, Some(&body)).map_err(api_err)?;
    wait_json(child, "hover run")?;
    let tsc_khz = Snapshot::open(snap)
        .map_err(|e| guest(&e.to_string()))?
        .state
        .vcpus[0]
        .tsc_khz as u64;
    let t0 = rdtsc();
    let restore = spawn_owned(
        Command::new(exe)
            .arg("restore")
            .arg(snap)
            .args(["--memory-restore", mode, "--json", "--console", "off"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "hover restore",
    );
    let outcome = restore.and_then(|r| wait_json(r, "hover restore"));
    drop(snap_file);
    let outcome = outcome?;
    let t = timeline(&outcome, tsc_khz)?;
    let second = tsc_khz * 1000;
    let before = work_between(&t, snapshot_tsc.saturating_sub(second), snapshot_tsc);
    let after = work_between(&t, t0, t0 + second);
    if before <= 0.0 {
        return Err(guest(
            "the guest did no work in the second before the snapshot",
        ));
    }
    let window = tsc_khz * WINDOW_MS;
    let speed_pct: Vec<f64> = (0..1000 / WINDOW_MS)
        .map(|k| {
            let from = t0 + k * window;
            100.0 * work_between(&t, from, from + window) * (1000 / WINDOW_MS) as f64 / before
        })
        .collect();
    let ms_to_90_pct = ms_to_speed(&t, t0, before / second as f64, 0.9, window)
        .map(|ticks| ticks as f64 / tsc_khz as f64);
    let num = |v: &Value| v.as_f64().unwrap_or(0.0);
    let r = &outcome["restore"];
    Ok(Sample {
        memory: memory.into(),
        mode: way.label.clone(),
        hot_window_ms: way.hot_window_ms,
        round,
        pause_us: num(&paused["pause_us"]),
        snapshot_ms: num(&info["paused_us"]) / 1000.0,
        snapshot_mib: num(&info["bytes"]) / (1 << 20) as f64,
        snapshot_pages: info["pages"].as_u64().unwrap_or(0),
        restore_to_running_ms: (r["running_tsc"].as_u64().unwrap_or(t0).saturating_sub(t0)) as f64
            / tsc_khz as f64,
        restore_in_process_ms: num(&r["to_running_us"]) / 1000.0,
        first_second_work_pct: 100.0 * after / before,
        pages_on_demand: outcome["pager"]["source_reads"].as_u64().unwrap_or(0),
        ms_to_90_pct,
        speed_pct,
    })
}

/// Ticks from `t0` to the start of the first bucket from which a window of
/// `window` ticks holds at least `share` of `rate` (work per tick), within a
/// second's worth of buckets after `t0`.
fn ms_to_speed(t: &Timeline, t0: u64, rate: f64, share: f64, window: u64) -> Option<u64> {
    let (start, ticks, _) = t;
    if *ticks == 0 {
        return None;
    }
    let first = t0.saturating_sub(*start).div_ceil(*ticks);
    // A window is WINDOW_MS long: a second holds this many buckets.
    let last = first + (window * (1000 / WINDOW_MS)).div_ceil(*ticks);
    (first..last).find_map(|k| {
        let at = start + k * ticks;
        (work_between(t, at, at + window) >= share * rate * window as f64).then(|| at - t0)
    })
}

/// The summaries of one memory size and mode.
#[derive(Serialize)]
struct Row {
    memory: String,
    mode: String,
    pause_us: Summary,
    snapshot_ms: Summary,
    snapshot_mib: Summary,
    restore_to_running_ms: Summary,
    first_second_work_pct: Summary,
    /// Restore start to 90% of the speed before, ms (rounds that reached it).
    ms_to_90_pct: Option<Summary>,
    /// Rounds that reached 90% within the first second.
    reached_90_pct: usize,
    /// Median speed in each 100 ms of the first second, %.
    speed_pct: Vec<f64>,
    /// Per round: eager's restore-to-running time over this mode's.
    eager_over_this_restore: Option<Summary>,
}

/// Run the scenario: table on stdout, `OUT/snapshot.json`, `OUT/snapshot.svg`.
pub fn run(exe: &Path, b: &SnapshotBench, out: &Path) -> Result<(), BenchError> {
    let _ = exe.metadata().map_err(|e| guest(&e.to_string()))?;
    let ways = ways(b);
    let mut samples = Vec::new();
    for round in 0..b.runs {
        for k in 0..b.memories.len() {
            // Rotate the order of sizes and modes from round to round.
            let memory = &b.memories[(k + round as usize) % b.memories.len()];
            for j in 0..ways.len() {
                let way = &ways[(j + round as usize) % ways.len()];
                let mode = &way.label;
                let s = one(exe, b, memory, way, round)?;
                eprintln!(
                    "round {round} {memory} {mode}: pause {:.0} us, snapshot {:.1} ms {:.1} MiB, running {:.2} ms after start, first second {:.0}%",
                    s.pause_us, s.snapshot_ms, s.snapshot_mib, s.restore_to_running_ms, s.first_second_work_pct
                );
                samples.push(s);
            }
        }
    }
    let mut rows = Vec::new();
    let mut table_rows = Vec::new();
    for memory in &b.memories {
        for way in &ways {
            let mode = way.label.as_str();
            let of: Vec<&Sample> = samples
                .iter()
                .filter(|s| &s.memory == memory && s.mode == mode)
                .collect();
            let sum = |f: fn(&Sample) -> f64| {
                summarize(&of.iter().map(|s| f(s)).collect::<Vec<_>>()).expect("runs >= 1")
            };
            let ratios: Vec<f64> = (0..b.runs)
                .filter_map(|r| {
                    let at = |m: &str| {
                        samples
                            .iter()
                            .find(|s| &s.memory == memory && s.mode == m && s.round == r)
                            .map(|s| s.restore_to_running_ms)
                    };
                    Some(at("eager")? / at(mode)?.max(1e-3))
                })
                .collect();
            // Rounds in which this mode's guest was at 90% of its speed no
            // later than the eager round beside it had its vCPUs running.
            let sooner = (0..b.runs)
                .filter(|&r| {
                    let at = |m: &str| {
                        samples
                            .iter()
                            .find(|s| &s.memory == memory && s.mode == m && s.round == r)
                    };
                    match (at(mode), at("eager")) {
                        (Some(this), Some(eager)) => this
                            .ms_to_90_pct
                            .is_some_and(|ms| ms <= eager.restore_to_running_ms),
                        _ => false,
                    }
                })
                .count();
            let reached: Vec<f64> = of.iter().filter_map(|s| s.ms_to_90_pct).collect();
            let speed_pct = (0..(1000 / WINDOW_MS) as usize)
                .map(|k| {
                    let v: Vec<f64> = of
                        .iter()
                        .filter_map(|s| s.speed_pct.get(k).copied())
                        .collect();
                    summarize(&v).map_or(0.0, |s| s.p50)
                })
                .collect();
            let row = Row {
                memory: memory.clone(),
                mode: mode.to_string(),
                pause_us: sum(|s| s.pause_us),
                snapshot_ms: sum(|s| s.snapshot_ms),
                snapshot_mib: sum(|s| s.snapshot_mib),
                restore_to_running_ms: sum(|s| s.restore_to_running_ms),
                first_second_work_pct: sum(|s| s.first_second_work_pct),
                ms_to_90_pct: summarize(&reached),
                reached_90_pct: reached.len(),
                speed_pct,
                eager_over_this_restore: summarize(&ratios),
            };
            let spread =
                |s: &Summary, p: usize| format!("{:.p$} ({:.p$}-{:.p$})", s.p50, s.min, s.max);
            table_rows.push(vec![
                memory.clone(),
                mode.to_string(),
                spread(&row.pause_us, 0),
                spread(&row.snapshot_ms, 1),
                format!("{:.1}", row.snapshot_mib.p50),
                spread(&row.restore_to_running_ms, 2),
                spread(&row.first_second_work_pct, 0),
                match &row.ms_to_90_pct {
                    Some(m) if row.reached_90_pct == of.len() => spread(m, 0),
                    Some(m) => format!(
                        "{} ({} of {} rounds)",
                        spread(m, 0),
                        row.reached_90_pct,
                        of.len()
                    ),
                    None => "not within 1 s".into(),
                },
                match (mode, &row.eager_over_this_restore) {
                    ("eager", _) | (_, None) => String::new(),
                    (_, Some(r)) => spread(r, 2),
                },
                match mode {
                    "eager" => String::new(),
                    _ => format!("{sooner} of {}", of.len()),
                },
            ]);
            rows.push(row);
        }
    }
    println!(
        "snapshot and restore, bm on {} of {} working set, {} rounds (median (min-max))",
        b.memories.join("/"),
        b.working_set,
        b.runs
    );
    table::print(
        &[
            "guest memory",
            "restore",
            "pause us",
            "snapshot ms (paused)",
            "snapshot MiB",
            "hover restore -> vCPUs running, ms",
            "work in 1st s, % of before",
            "ms to 90% of the speed before",
            "eager/this restore time, per round",
            "rounds at 90% by eager's vCPUs running",
        ],
        &table_rows,
    );
    let doc = serde_json::json!({
        "scenario": "snapshot",
        "command": format!(
            "hover bench snapshot --memories {} --working-set {} --runs {} --hot-windows-ms {}",
            b.memories.join(","),
            b.working_set,
            b.runs,
            b.hot_windows_ms.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
        ),
        "date": plot::today(),
        "rows": rows,
        "samples": samples,
    });
    table::write_json(out, "snapshot.json", &doc)?;
    plot(&doc, out)
}

/// `snapshot.svg` from `snapshot.json`'s document: for the last guest size
/// measured (the largest, with the default `--memories`),
/// each restore's speed per 100 ms after `hover restore` started (median
/// of rounds, min-max whisker).
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let samples = doc["samples"].as_array().cloned().unwrap_or_default();
    let memories = plot::distinct_field(&samples, "memory");
    let modes = plot::distinct_field(&samples, "mode");
    let memory = memories.last().cloned().unwrap_or_default();
    let series: Vec<plot::Line> = modes
        .iter()
        .map(|mode| {
            let curves: Vec<Vec<f64>> = samples
                .iter()
                .filter(|s| s["memory"] == memory.as_str() && s["mode"] == mode.as_str())
                .filter_map(|s| s["speed_pct"].as_array())
                .map(|v| v.iter().filter_map(|x| x.as_f64()).collect())
                .collect();
            let buckets = curves.iter().map(Vec::len).max().unwrap_or(0);
            plot::Line {
                label: format!("{mode} restore"),
                points: (0..buckets)
                    .map(|k| {
                        let x = (k as u64 * WINDOW_MS + WINDOW_MS / 2) as f64;
                        (x, curves.iter().filter_map(|c| c.get(k).copied()).collect())
                    })
                    .collect(),
            }
        })
        .collect();
    plot::lines(
        &out.join("snapshot.svg"),
        &plot::Figure {
            title: format!(
                "Restoring a {memory} guest: its speed in each 100 ms after hover restore started"
            ),
            caption: plot::caption_of(doc, "hover bench snapshot"),
            x_desc: "ms after hover restore started (the middle of each 100 ms)".into(),
            y_desc: "% of its speed before the snapshot".into(),
        },
        &series,
        &|x| format!("{x:.0}"),
    )?;
    // When the vCPUs run: one bar per mode at each guest size.
    let running: Vec<plot::Bars> = modes
        .iter()
        .map(|mode| plot::Bars {
            label: format!("{mode} restore"),
            rounds: memories
                .iter()
                .map(|m| {
                    samples
                        .iter()
                        .filter(|s| s["memory"] == m.as_str() && s["mode"] == mode.as_str())
                        .filter_map(|s| s["restore_to_running_ms"].as_f64())
                        .collect()
                })
                .collect(),
        })
        .collect();
    plot::bars(
        &out.join("snapshot_to_running.svg"),
        &plot::Figure {
            title: "Restore: from hover restore starting to the vCPUs running".into(),
            caption: plot::caption_of(doc, "hover bench snapshot"),
            x_desc: "guest memory (a 64 MiB working set)".into(),
            y_desc: "ms".into(),
        },
        &memories,
        &running,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_is_counted_by_bucket_start() {
        let t = (1000, 100, vec![(0, 1.0), (1, 2.0), (5, 4.0), (9, 8.0)]);
        assert_eq!(work_between(&t, 1000, 1200), 3.0);
        assert_eq!(work_between(&t, 1100, 1600), 6.0);
        assert_eq!(work_between(&t, 0, u64::MAX), 15.0);
    }

    #[test]
    fn the_time_to_speed_is_the_first_window_at_that_speed() {
        // Buckets of 100 ticks from 1000; work 1 per tick before; after the
        // restore at 1000: 0.1, 0.5, then full speed from bucket 2.
        let t = (
            1000,
            100,
            vec![(0, 10.0), (1, 50.0), (2, 100.0), (3, 100.0), (4, 100.0)],
        );
        assert_eq!(ms_to_speed(&t, 1000, 1.0, 0.9, 200), Some(200));
        assert_eq!(ms_to_speed(&t, 1000, 1.0, 0.5, 100), Some(100));
        assert_eq!(ms_to_speed(&t, 1000, 10.0, 0.9, 100), None);
    }

    #[test]
    fn timelines_are_read_from_reports() {
        let o = serde_json::json!({"reports": [
            {"key": "bm.timeline.start_tsc", "value": 5000},
            {"key": "bm.timeline.bucket_us", "value": 50000},
            {"key": "bm.t.3", "value": 7},
            {"key": "bm.work_total", "value": 9},
        ]});
        let (start, ticks, b) = timeline(&o, 2000).unwrap();
        assert_eq!((start, ticks, b), (5000, 100_000, vec![(3, 7.0)]));
        assert!(timeline(&serde_json::json!({"reports": []}), 1).is_err());
    }
}
