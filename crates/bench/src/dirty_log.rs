//! `hover bench dirty-log`: seed 4's experiment, what each dirty tracker
//! costs the guest with no page sent.
//!
//! A `kvstore` guest writes over its working set, as fast as it can by
//! default (`--rate 0`): a write fault on a write-protected page costs the
//! guest time, which only shows as fewer operations when the guest has no
//! time to spare (at a rate it can keep up, every tracker reads the same
//! ops/s and the cost hides in idle time). Through `PUT /vm/dirty-log`
//! each tracker is turned on and harvested every `period_ms` for `seconds`,
//! as a migration's rounds would, and `none` is the same time with no
//! tracking. Each round boots a guest and runs every tracker in it, in an
//! order rotated by round (its timeline holds 20 s); rings only exist in a
//! VM created with them, so `ring` and its own `none` run in a second guest
//! of the same round. Per window: the guest's operations per second (its
//! own 100 ms timeline), KVM's page faults per second (`pf_taken`, where a
//! write to a write-protected page shows), the harvest's time and the pages
//! it found; per round, each tracker's ops/s over bitmap's.

use hover_vmm::api::Endpoint;
use std::path::Path;
use std::time::Duration;

use hover_vmm::api::ApiClient;
use serde::Serialize;
use serde_json::{json, Value};

use crate::hover_process::sum_stat;
use crate::hover_process::{guest, rdtsc, spawn_with_api, tsc_khz, wait_json};
use crate::migration_run::{report, timeline_sum};
use crate::plot;
use crate::stats::{ratios, spread};
use crate::{table, BenchError};

/// The scenario's knobs.
#[derive(Clone, Debug)]
pub struct DirtyLogBench {
    /// Trackers to compare (`none`, `bitmap`, `manual`, `hybrid`, `ring`).
    pub trackers: Vec<String>,
    /// Guest memory.
    pub memory: String,
    /// kvstore's working set.
    pub wss: String,
    /// kvstore's operations per second (0: as fast as it can).
    pub rate: u64,
    /// Time between harvests, ms.
    pub period_ms: u64,
    /// Each window, seconds.
    pub seconds: f64,
    /// Entries of each vCPU's dirty ring in the `ring` tracker's VM.
    pub ring_entries: u32,
    /// Rounds.
    pub runs: u32,
}

impl DirtyLogBench {
    /// Its flags checked (trackers known, a window of (0, 60] s, sizes).
    pub fn check(&self) -> Result<(), BenchError> {
        const KNOWN: [&str; 5] = ["none", "bitmap", "manual", "hybrid", "ring"];
        crate::flags::each("--trackers", &self.trackers, |t| match KNOWN.contains(&t) {
            true => Ok(()),
            false => Err(format!(
                "unknown tracker '{t}': use none, bitmap, manual, hybrid or ring"
            )),
        })?;
        if !(self.seconds > 0.0 && self.seconds <= 60.0) {
            return Err(BenchError::Input("--seconds must be in (0, 60]".into()));
        }
        crate::flags::memories("--memory", std::slice::from_ref(&self.memory))?;
        crate::flags::fits(
            ("--wss", std::slice::from_ref(&self.wss)),
            ("--memory", std::slice::from_ref(&self.memory)),
        )?;
        if self.rate != 0 {
            crate::flags::guest_param("--rate", "kvstore", "rate", &self.rate.to_string())?;
        }
        if !self.trackers.iter().any(|t| t != "none") {
            return Err(BenchError::Input(
                "--trackers: give at least one tracker besides none (none is the baseline they are compared with)".into(),
            ));
        }
        if self.period_ms as f64 >= self.seconds * 1000.0 {
            return Err(BenchError::Input(format!(
                "--period-ms {} is not shorter than --seconds {}: no harvest would fall inside a window",
                self.period_ms, self.seconds
            )));
        }
        if !(1..=10_000).contains(&self.period_ms) {
            return Err(BenchError::Input(format!(
                "--period-ms {}: give 1 to 10000 (a harvest every 1 ms to 10 s)",
                self.period_ms
            )));
        }
        use hover_vmm::migration::dirty::ring::{MAX_ENTRIES, MIN_ENTRIES};
        let n = self.ring_entries;
        if !n.is_power_of_two() || !(MIN_ENTRIES..=MAX_ENTRIES).contains(&n) {
            return Err(BenchError::Input(format!(
                "--ring-entries {n}: give a power of two from {MIN_ENTRIES} to {MAX_ENTRIES}"
            )));
        }
        crate::flags::runs(self.runs)
    }
}

/// One window.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// The tracker (`none`: no tracking).
    pub tracker: String,
    /// Round.
    pub round: u32,
    /// Guest operations per second.
    pub ops_per_s: f64,
    /// KVM page faults per second over all vCPUs.
    pub faults_per_s: f64,
    /// Mean harvest time, microseconds.
    pub harvest_us: f64,
    /// Mean pages a harvest found.
    pub pages_per_harvest: f64,
    /// Pages held back at the end (hybrid).
    pub held_pages: f64,
}

/// A window's edges, with what the tracker said.
struct Window {
    tracker: String,
    round: u32,
    from: u64,
    to: u64,
    faults: u64,
    report: Value,
}

/// One guest: boot it with `extra` flags, run each round's windows of
/// `trackers` (order rotated by round), then wait for it to finish.
fn one_guest(
    exe: &Path,
    b: &DirtyLogBench,
    (trackers, round): (&[&str], u32),
    extra: &[&str],
    id: &str,
) -> Result<(Vec<Window>, Value), BenchError> {
    let windows_s = trackers.len() as f64 * (b.seconds + 0.3);
    let seconds = (windows_s + 3.0).ceil() as u64;
    let cmdline = format!(
        "workload=kvstore wss={} rate={} seconds={seconds}",
        b.wss, b.rate
    );
    let sock = std::env::temp_dir().join(format!("hover-bench-dirtylog-{id}.sock"));
    let mut args = vec!["run", "--memory", &b.memory, "--vcpus", "1"];
    args.extend(extra);
    args.extend(["--cmdline", &cmdline]);
    let child = spawn_with_api(exe, &args, &sock)?;
    // The working set is written once before the windows.
    std::thread::sleep(Duration::from_millis(1500));
    let api = ApiClient::new(&sock, Duration::from_secs(120));
    let api_err = |e: hover_vmm::api::ApiError| guest(&e.to_string());
    let faults = |api: &ApiClient| -> Result<u64, BenchError> {
        let s = api.send(Endpoint::Stats, None).map_err(api_err)?;
        Ok(sum_stat(&s["vcpu_stats"], "pf_taken"))
    };
    let mut windows = Vec::new();
    {
        for j in 0..trackers.len() {
            let tracker = trackers[(j + round as usize) % trackers.len()];
            let f0 = faults(&api)?;
            let from = rdtsc();
            let report = if tracker == "none" {
                std::thread::sleep(Duration::from_secs_f64(b.seconds));
                Value::Null
            } else {
                let body = json!({
                    "dirty_tracking": tracker, "period_ms": b.period_ms, "seconds": b.seconds,
                });
                api.send(Endpoint::DirtyLog, Some(&body.to_string()))
                    .map_err(api_err)?
            };
            let to = rdtsc();
            let f1 = faults(&api)?;
            eprintln!("round {round} {tracker}: {report}");
            windows.push(Window {
                tracker: tracker.into(),
                round,
                from,
                to,
                faults: f1.saturating_sub(f0),
                report,
            });
        }
    }
    let outcome = wait_json(child, "hover run")?;
    if report(&outcome, "kvstore.errors").unwrap_or(1) != 0 {
        return Err(guest("kvstore found wrong data (or did not say)"));
    }
    Ok((windows, outcome))
}

fn samples(windows: Vec<Window>, outcome: &Value, khz: u64) -> Result<Vec<Sample>, BenchError> {
    let start =
        report(outcome, "kvstore.start_tsc").ok_or_else(|| guest("no kvstore.start_tsc"))?;
    Ok(windows
        .into_iter()
        .map(|w| {
            let secs = w.to.saturating_sub(w.from) as f64 / (khz as f64 * 1000.0);
            let ops = timeline_sum(outcome, "kvstore.ops.", start, khz * 100, (w.from, w.to));
            let num = |k: &str| w.report[k].as_f64().unwrap_or(0.0);
            Sample {
                tracker: w.tracker,
                round: w.round,
                ops_per_s: ops / secs.max(1e-9),
                faults_per_s: w.faults as f64 / secs.max(1e-9),
                harvest_us: num("harvest_us_mean"),
                pages_per_harvest: num("pages_per_harvest"),
                held_pages: num("held_pages"),
            }
        })
        .collect())
}

/// Run the scenario: a table on stdout and `OUT/dirty_log.json`.
pub fn run(exe: &Path, b: &DirtyLogBench, out: &Path) -> Result<(), BenchError> {
    let khz = tsc_khz()?;
    let want = |t: &str| b.trackers.iter().any(|x| x == t);
    let plain: Vec<&str> = ["none", "bitmap", "manual", "hybrid"]
        .into_iter()
        .filter(|t| want(t))
        .collect();
    let id = std::process::id();
    let mut all = Vec::new();
    for round in 0..b.runs {
        if plain.len() > 1 || (plain.len() == 1 && plain[0] != "none") {
            let (w, o) = one_guest(exe, b, (&plain, round), &[], &format!("{id}-plain-{round}"))?;
            all.extend(samples(w, &o, khz)?);
        }
        if want("ring") {
            let (w, o) = one_guest(
                exe,
                b,
                (&["none", "ring"], round),
                &["--dirty-ring", &b.ring_entries.to_string()],
                &format!("{id}-ring-{round}"),
            )?;
            all.extend(samples(w, &o, khz)?.into_iter().map(|mut s| {
                if s.tracker == "none" {
                    s.tracker = "none (ring VM)".into();
                }
                s
            }));
        }
    }
    let names: Vec<String> = plot::distinct(all.iter().map(|s| s.tracker.clone()));
    let col = |t: &str, f: fn(&Sample) -> f64| -> Vec<f64> {
        all.iter().filter(|s| s.tracker == t).map(f).collect()
    };
    let bitmap = col("bitmap", |s| s.ops_per_s);
    let rows: Vec<Vec<String>> = names
        .iter()
        .map(|t| {
            let ops = col(t, |s| s.ops_per_s);
            vec![
                t.clone(),
                spread(&ops, 0),
                if bitmap.len() == ops.len() && t != "bitmap" && !t.contains("ring") {
                    ratios(&ops, &bitmap)
                } else {
                    String::new()
                },
                spread(&col(t, |s| s.faults_per_s), 0),
                spread(&col(t, |s| s.harvest_us), 0),
                spread(&col(t, |s| s.pages_per_harvest), 0),
                spread(&col(t, |s| s.held_pages), 0),
            ]
        })
        .collect();
    println!(
        "hover bench dirty-log: a 1-vCPU kvstore guest ({} over {} in {}), each tracker on for {} s and harvested every {} ms, rings of {} entries, nothing sent; {} rounds, trackers rotated; median (min-max), ratio to bitmap per round (min/median/max)",
        match b.rate {
            0 => "writing as fast as it can".to_string(),
            r => format!("{r} writes/s"),
        },
        b.wss, b.memory, b.seconds, b.period_ms, b.ring_entries, b.runs
    );
    table::print(
        &[
            "tracker",
            "guest ops/s",
            "ops/s vs bitmap, per round",
            "KVM page faults/s",
            "harvest us (mean)",
            "pages per harvest",
            "pages held (hybrid)",
        ],
        &rows,
    );
    let doc = serde_json::json!({
        "scenario": "dirty-log",
        "command": format!(
            "hover bench dirty-log --trackers {} --memory {} --wss {} --rate {} --period-ms {} --seconds {} --ring-entries {} --runs {}",
            b.trackers.join(","),
            b.memory,
            b.wss,
            b.rate,
            b.period_ms,
            b.seconds,
            b.ring_entries,
            b.runs
        ),
        "date": plot::today(),
        "samples": all,
    });
    table::write_json(out, "dirty_log.json", &doc)?;
    plot(&doc, out)
}

/// `dirty_log.svg` from `dirty_log.json`'s document: per tracker, the
/// guest's operations per second while it tracks (median of rounds,
/// min-max whisker).
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let samples = doc["samples"].as_array().cloned().unwrap_or_default();
    let trackers = plot::distinct_field(&samples, "tracker");
    let series = [plot::Bars {
        label: "guest operations while tracked".into(),
        rounds: trackers
            .iter()
            .map(|t| {
                samples
                    .iter()
                    .filter(|s| s["tracker"] == t.as_str())
                    .filter_map(|s| s["ops_per_s"].as_f64())
                    .map(|v| v / 1e6)
                    .collect()
            })
            .collect(),
    }];
    let groups: Vec<String> = trackers
        .iter()
        .map(|t| match t.as_str() {
            "none" => "none (no tracking)".to_string(),
            other => other.to_string(),
        })
        .collect();
    plot::bars(
        &out.join("dirty_log.svg"),
        &plot::Figure {
            title: "Seed 4, dirty logging: what each tracker costs a writing guest".into(),
            caption: plot::caption_of(doc, "hover bench dirty-log"),
            x_desc: "dirty tracker, on and harvested every period, nothing sent".into(),
            y_desc: "kvstore operations per second (millions)".into(),
        },
        &groups,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(ring_entries: u32) -> DirtyLogBench {
        DirtyLogBench {
            trackers: vec!["bitmap".into(), "ring".into()],
            memory: "1G".into(),
            wss: "64M".into(),
            rate: 0,
            period_ms: 100,
            seconds: 2.0,
            ring_entries,
            runs: 3,
        }
    }

    #[test]
    fn ring_entries_are_a_power_of_two_kvm_takes() {
        assert!(bench(4096).check().is_ok());
        assert!(bench(65536).check().is_ok());
        for bad in [0, 128, 1000, 131072] {
            let e = bench(bad).check().unwrap_err().to_string();
            assert!(e.contains("--ring-entries"), "{bad}: {e}");
        }
    }
}
