//! `hover bench migrate --mode postcopy`: post-copy through the pager with
//! async page faults (seeds 1 + 3 + 4). A guest running the async-PF seed's
//! `bm` (faulting tasks writing random pages of an array, which dirties
//! memory far faster than the link moves it, and working tasks counting)
//! is migrated over a link with latency and a rate limit (a network
//! namespace, veth and `tc netem`, set up here when the bench may; else a
//! Unix socket through a relay in this process that delays every chunk
//! each way, with the migration's own bandwidth limit):
//! - pre-copy (auto-converge off, a short timeout): does it converge?
//! - post-copy with async PF on and off (the guest's `--async-pf`);
//! - hybrid: pre-copy rounds, then post-copy when they stop converging.
//!
//! Per sample: downtime; time until all memory arrived at the destination;
//! the working tasks' progress during the post-copy phase as a share of the
//! second before the migration (the guest keeps its timeline across the
//! move: `bm.t.K` buckets of TSC time); remote fault latency p50/p99; tasks
//! parked. Modes are interleaved within each round; every cell is median
//! (min-max) over the rounds, and the ops share async PF on over off is
//! given per round.

use hover_vmm::api::Endpoint;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hover_vmm::api::ApiClient;
use serde::Serialize;
use serde_json::Value;

use crate::hover_process::{
    guest, rdtsc, spawn_owned, spawn_with_api, tsc_khz, wait_json, OwnedChild,
};
use crate::migration_run::{listening_at, lost_ms, report, timeline_sum};
use crate::netem::{Link, Relay, PEER_ADDR};
use crate::plot;
use crate::stats::summarize;
use crate::{table, BenchError};

/// The scenario's knobs.
#[derive(Clone, Debug)]
pub struct PostcopyBench {
    /// Guest memory.
    pub memory: String,
    /// bm's array (the working set the faulting tasks write).
    pub array: String,
    /// Link rate, Mbit/s.
    pub link_mbit: u64,
    /// One-way link latency, ms.
    pub delay_ms: f64,
    /// Rounds (modes interleaved within each).
    pub runs: u32,
    /// How long bm runs (warm-up and migration included), seconds.
    pub seconds: u32,
}

impl PostcopyBench {
    /// Its flags checked (the guest's memory whole pages, the array fits
    /// it, a link that moves something, a run long enough to hold the
    /// warm-up and the move).
    pub fn check(&self) -> Result<(), BenchError> {
        crate::flags::memories("--postcopy-memory", std::slice::from_ref(&self.memory))?;
        crate::flags::fits(
            ("--postcopy-array", std::slice::from_ref(&self.array)),
            ("--postcopy-memory", std::slice::from_ref(&self.memory)),
        )?;
        if !(1..=100_000).contains(&self.link_mbit) {
            return Err(BenchError::Input(format!(
                "--link-mbit {}: give 1 to 100000 Mbit/s",
                self.link_mbit
            )));
        }
        if !(0.0..=1000.0).contains(&self.delay_ms) {
            return Err(BenchError::Input(format!(
                "--link-delay-ms {}: give 0 to 1000 ms",
                self.delay_ms
            )));
        }
        let least = MIN_SECONDS;
        if !(least..=3600).contains(&self.seconds) {
            return Err(BenchError::Input(format!(
                "--postcopy-seconds {}: give {least} to 3600 (the guest warms up for {} s before it moves)",
                self.seconds,
                WARM_UP.as_secs()
            )));
        }
        crate::flags::runs(self.runs)
    }
}

/// (name, migration mode, guest async PF).
const MODES: [(&str, &str, &str); 4] = [
    ("pre-copy", "precopy", "on"),
    ("post-copy, async PF on", "postcopy", "on"),
    ("post-copy, async PF off", "postcopy", "off"),
    ("hybrid, async PF on", "hybrid", "on"),
];

/// How long the guest runs bm before the migration (its array prefaulted).
const WARM_UP: Duration = Duration::from_secs(5);
/// Pre-copy's time before it gives up.
const PRECOPY_TIMEOUT_S: u64 = 8;
/// The shortest bm run that holds the warm-up, a pre-copy that runs to
/// its timeout, and a second after.
const MIN_SECONDS: u32 = WARM_UP.as_secs() as u32 + PRECOPY_TIMEOUT_S as u32 + 1;

/// One migration.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Mode name.
    pub mode: String,
    /// Round.
    pub round: u32,
    /// Whether the guest moved; else why not.
    pub error: Option<String>,
    /// The source's pause (until the destination's RUNNING arrived), ms.
    pub downtime_ms: f64,
    /// The gap the guest saw: its TSC at the pause to the destination's
    /// RUNNING stamp, ms.
    pub guest_downtime_ms: f64,
    /// From the request to the destination having every page, ms.
    pub total_ms: f64,
    /// Working tasks' progress per second in the post-copy phase over the
    /// second before the migration, percent.
    pub ops_pct: f64,
    /// Guest work lost, ms of full-speed work: from the request to one
    /// second after the guest runs at the destination, what its working
    /// tasks would have done at their rate of the second before, less what
    /// they did (`migration_run::lost_ms`).
    pub work_lost_ms: f64,
    /// Why this sample's work figures (`ops_pct`, `work_lost_ms`) are no
    /// result: a post-copy phase too short to give a rate, or more work
    /// than the second before predicted. Left out of the summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suspect: Option<String>,
    /// Remote fault latency, us.
    pub fault_p50_us: f64,
    /// See `fault_p50_us`.
    pub fault_p99_us: f64,
    /// Guest touches of a remote page.
    pub demand_pages: f64,
    /// Tasks parked by async PF at the destination.
    pub parked: f64,
    /// The migration report.
    pub report: Value,
}

/// bm's working progress in `[from, to)` host TSC ticks.
fn work_in(outcome: &Value, from: u64, to: u64, khz: u64) -> f64 {
    let (Some(start), Some(bucket_us)) = (
        report(outcome, "bm.timeline.start_tsc"),
        report(outcome, "bm.timeline.bucket_us"),
    ) else {
        return 0.0;
    };
    timeline_sum(outcome, "bm.t.", start, bucket_us * khz / 1000, (from, to))
}

fn receiver(exe: &Path, link: Option<&Link>, id: &str) -> Result<(OwnedChild, String), BenchError> {
    let mut cmd = match link {
        Some(l) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &l.ns]).arg(exe);
            c.args([
                "receive",
                "--listen",
                &format!("tcp:{PEER_ADDR}:0"),
                "--insecure",
            ]);
            c
        }
        None => {
            let mut c = Command::new(exe);
            let p = std::env::temp_dir().join(format!("hover-bench-pc-{id}.sock"));
            c.args(["receive", "--listen", &format!("unix:{}", p.display())]);
            c
        }
    };
    let mut child = spawn_owned(
        cmd.args(["--json", "--console", "off"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "hover receive",
    )?;
    let at = listening_at(&mut child)?;
    Ok((child, at))
}

fn sample(
    exe: &Path,
    b: &PostcopyBench,
    link: Option<&Link>,
    (name, mode, apf): (&str, &str, &str),
    round: u32,
) -> Result<Sample, BenchError> {
    let id = format!("{}-{mode}-{apf}-{round}", std::process::id());
    let (dest, at) = receiver(exe, link, &id)?;
    let sock = std::env::temp_dir().join(format!("hover-bench-pcsrc-{id}.sock"));
    let cmdline = format!(
        "workload=bm faulting=2 working=2 memory={} seconds={} timeline_ms=100",
        b.array, b.seconds
    );
    let args = [
        "run",
        "--memory",
        &b.memory,
        "--async-pf",
        apf,
        "--cmdline",
        &cmdline,
    ];
    let src = spawn_with_api(exe, &args, &sock)?;
    std::thread::sleep(WARM_UP);
    // Without netem, the latency comes from a relay in this process.
    let (at, _relay) = match (link, at.strip_prefix("unix:")) {
        (None, Some(path)) if b.delay_ms > 0.0 => {
            let relay_path = std::env::temp_dir().join(format!("hover-bench-pcrelay-{id}.sock"));
            let relay = Relay::start(
                &relay_path,
                path.into(),
                Duration::from_secs_f64(b.delay_ms / 1000.0),
            )
            .map_err(|e| guest(&format!("cannot start the latency relay: {e}")))?;
            (format!("unix:{}", relay_path.display()), Some(relay))
        }
        _ => (at, None),
    };
    let mut body = serde_json::json!({ "to": at, "mode": mode, "verify": true, "insecure": true });
    if mode != "postcopy" {
        body["auto_converge"] = false.into();
        body["timeout_s"] = PRECOPY_TIMEOUT_S.into();
    }
    if link.is_none() {
        body["bandwidth"] = (b.link_mbit * 1_000_000 / 8).into();
    }
    let api = ApiClient::new(&sock, Duration::from_secs(600));
    let t = rdtsc();
    let answer = api.send(Endpoint::Migrate, Some(&body.to_string()));
    let rep = match answer {
        Ok(r) => r,
        Err(e) => {
            // Pre-copy that does not converge: the guest runs on here.
            let _ = api.call(Endpoint::Shutdown.method(), Endpoint::Shutdown.path(), None);
            let _ = wait_json(src, "hover run (source)");
            let mut dest = dest;
            let _ = dest.kill();
            let _ = dest.wait();
            return Ok(Sample {
                mode: name.into(),
                round,
                error: Some(e.to_string()),
                downtime_ms: 0.0,
                guest_downtime_ms: 0.0,
                total_ms: 0.0,
                ops_pct: 0.0,
                work_lost_ms: 0.0,
                suspect: None,
                fault_p50_us: 0.0,
                fault_p99_us: 0.0,
                demand_pages: 0.0,
                parked: 0.0,
                report: Value::Null,
            });
        }
    };
    wait_json(src, "hover run (source)")?;
    // Stop the guest at the destination once its memory is all there.
    let out = wait_destination(dest)?;
    let khz = tsc_khz()?;
    let num = |v: &Value, k: &str| v[k].as_f64().unwrap_or(0.0);
    let pc = &out["postcopy"];
    let downtime = num(&rep, "downtime_ms");
    let pre_ms = num(&rep, "total_ms") - num(pc, "all_arrived_ms");
    let switch = t + ((pre_ms.max(0.0) + downtime) * khz as f64) as u64;
    let end = t + (num(&rep, "total_ms") * khz as f64) as u64;
    let before = work_in(&out, t.saturating_sub(khz * 1000), t, khz);
    let during_s = (end - switch.min(end)) as f64 / khz as f64 / 1000.0;
    let during = work_in(&out, switch, end, khz) / during_s.max(0.1);
    let work_lost_ms = lost_ms(
        |from, to| work_in(&out, from, to, khz),
        khz,
        t,
        pre_ms.max(0.0) + downtime,
    );
    Ok(Sample {
        suspect: suspect(during_s, work_lost_ms),
        mode: name.into(),
        round,
        error: None,
        downtime_ms: downtime,
        guest_downtime_ms: num(&rep, "guest_downtime_ms"),
        total_ms: num(&rep, "total_ms"),
        ops_pct: if before > 0.0 {
            100.0 * during / before
        } else {
            0.0
        },
        work_lost_ms,
        fault_p50_us: num(pc, "fault_p50_us"),
        fault_p99_us: num(pc, "fault_p99_us"),
        demand_pages: num(pc, "demand_pages"),
        parked: report(&out, "apf.parked").unwrap_or(0) as f64,
        report: rep,
    })
}

/// The shortest post-copy phase whose work rate is a result.
const MIN_PHASE_S: f64 = 0.5;

/// Why a sample's work figures are no result: a post-copy phase of
/// `phase_s` seconds (too short to give a rate), or `lost_ms` below zero
/// (more work than the second before predicted: that second was slow).
fn suspect(phase_s: f64, lost_ms: f64) -> Option<String> {
    if phase_s < MIN_PHASE_S {
        return Some(format!(
            "the post-copy phase lasted {:.0} ms: too short for a rate (give --postcopy-seconds more, or a slower --link-mbit)",
            phase_s * 1000.0
        ));
    }
    crate::migration_run::slow_baseline(lost_ms).then(|| {
        format!(
            "{:.0} ms more work than the second before predicted: that second was slow (host noise)",
            -lost_ms
        )
    })
}

/// The destination's outcome; bm runs for long, so it is shut down through
/// a signal-free path: the guest's own end (bm's `seconds`).
fn wait_destination(dest: OwnedChild) -> Result<Value, BenchError> {
    wait_json(dest, "hover receive")
}

/// Run the scenario: tables on stdout, `OUT/migrate_postcopy.json`.
pub fn run(exe: &Path, b: &PostcopyBench, out: &Path) -> Result<(), BenchError> {
    let link = match Link::new(b.delay_ms, b.link_mbit) {
        Ok(l) => Some(l),
        Err(e) => {
            println!(
                "(no netem link: {e}; instead a Unix socket through a relay in this process that delays each chunk {} ms each way, and the migration's own {} Mbit/s bandwidth limit)",
                b.delay_ms, b.link_mbit
            );
            None
        }
    };
    let what = link.as_ref().map_or_else(
        || {
            format!(
                "Unix socket + relay {} ms each way, --bandwidth {} Mbit/s",
                b.delay_ms, b.link_mbit
            )
        },
        Link::describe,
    );
    println!(
        "hover bench migrate --mode postcopy: bm (2 faulting + 2 working tasks, {} array) in a {} guest; link: {what}; {} rounds, modes interleaved",
        b.array, b.memory, b.runs
    );
    let mut samples = Vec::new();
    for round in 0..b.runs {
        for m in MODES {
            let s = sample(exe, b, link.as_ref(), m, round)?;
            eprintln!(
                "round {round} {}: {}",
                s.mode,
                s.error.as_deref().map_or_else(
                    || format!(
                        "downtime {:.1} ms, total {:.0} ms, ops {:.0}%",
                        s.downtime_ms, s.total_ms, s.ops_pct
                    ),
                    |e| e.to_string()
                )
            );
            samples.push(s);
        }
    }
    let mut rows = Vec::new();
    for (name, _, _) in MODES {
        let of: Vec<&Sample> = samples.iter().filter(|s| s.mode == name).collect();
        let ok: Vec<&&Sample> = of.iter().filter(|s| s.error.is_none()).collect();
        let cell = |f: &dyn Fn(&Sample) -> f64, p: usize| {
            summarize(&ok.iter().map(|s| f(s)).collect::<Vec<_>>())
                .map_or("-".into(), |s| s.text(p))
        };
        // The work figures of flagged samples are left out, and said.
        let sound: Vec<&&&Sample> = ok.iter().filter(|s| s.suspect.is_none()).collect();
        let work = |f: &dyn Fn(&Sample) -> f64, p: usize| {
            let flagged = ok.len() - sound.len();
            let text = summarize(&sound.iter().map(|s| f(s)).collect::<Vec<_>>())
                .map_or("-".into(), |s| s.text(p));
            match flagged {
                0 => text,
                n => format!("{text} ({n} flagged)"),
            }
        };
        rows.push(vec![
            name.to_string(),
            format!("{}/{}", ok.len(), of.len()),
            cell(&|s| s.downtime_ms, 1),
            cell(&|s| s.guest_downtime_ms, 1),
            cell(&|s| s.total_ms / 1000.0, 1),
            work(&|s| s.ops_pct, 0),
            work(&|s| s.work_lost_ms, 0),
            cell(&|s| s.fault_p50_us / 1000.0, 1),
            cell(&|s| s.fault_p99_us / 1000.0, 1),
            cell(&|s| s.parked, 0),
        ]);
    }
    table::print(
        &[
            "mode",
            "moved",
            "downtime ms",
            "guest saw ms",
            "total s",
            "ops during post-copy, % of before",
            "guest work lost ms",
            "remote fault p50 ms",
            "p99 ms",
            "tasks parked",
        ],
        &rows,
    );
    let ratio: Vec<String> = (0..b.runs)
        .filter_map(|r| {
            let pct = |name: &str| {
                samples
                    .iter()
                    .find(|s| {
                        s.round == r && s.mode == name && s.error.is_none() && s.suspect.is_none()
                    })
                    .map(|s| s.ops_pct)
            };
            let (on, off) = (pct(MODES[1].0)?, pct(MODES[2].0)?);
            Some(format!("{:.2}", on / off.max(0.1)))
        })
        .collect();
    println!(
        "\nops during post-copy, async PF on / off, per round: {}",
        ratio.join(", ")
    );
    for s in samples.iter().filter(|s| s.suspect.is_some()) {
        println!(
            "(!) round {} {}: {}",
            s.round,
            s.mode,
            s.suspect.as_deref().unwrap_or("")
        );
    }
    for s in samples.iter().filter(|s| s.error.is_some()) {
        println!(
            "round {} {}: {}",
            s.round,
            s.mode,
            s.error.as_deref().unwrap_or("")
        );
    }
    let doc = serde_json::json!({
        "scenario": "migrate-postcopy",
        "command": format!(
            "hover bench migrate --mode postcopy --postcopy-memory {} --postcopy-array {} --link-mbit {} --link-delay-ms {} --runs {} --postcopy-seconds {}",
            b.memory, b.array, b.link_mbit, b.delay_ms, b.runs, b.seconds
        ),
        "date": plot::today(),
        "link": what,
        "samples": samples,
    });
    table::write_json(out, "migrate_postcopy.json", &doc)?;
    plot(&doc, out)
}

/// `migrate_postcopy.svg` from `migrate_postcopy.json`'s document: per
/// mode, the guest's operations while its memory moves, % of its rate
/// before (median of rounds, min-max whisker; failed rounds left out).
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let samples = doc["samples"].as_array().cloned().unwrap_or_default();
    let modes = plot::distinct_field(&samples, "mode");
    // Each mode's finished rounds' `field`.
    let rounds = |field: &str| -> Vec<Vec<f64>> {
        modes
            .iter()
            .map(|m| {
                samples
                    .iter()
                    .filter(|s| s["error"].is_null() && s["mode"] == m.as_str())
                    .filter_map(|s| s[field].as_f64())
                    .collect()
            })
            .collect()
    };
    let work = [plot::Bars {
        label: "guest operations while its memory moves".into(),
        rounds: rounds("ops_pct"),
    }];
    let pause = [plot::Bars {
        label: "the pause the guest saw".into(),
        rounds: rounds("guest_downtime_ms"),
    }];
    // A mode none of whose rounds finished has no bar: its label says so.
    let groups: Vec<String> = modes
        .iter()
        .zip(&work[0].rounds)
        .map(|(m, r)| match r.is_empty() {
            true => format!("{m} (no round finished)"),
            false => m.clone(),
        })
        .collect();
    let x_desc = format!(
        "how the guest moves ({})",
        doc["link"].as_str().unwrap_or("a limited link")
    );
    let caption = plot::caption_of(doc, "hover bench migrate --mode postcopy");
    plot::bars(
        &out.join("migrate_postcopy.svg"),
        &plot::Figure {
            title: "Seeds 1+3+4, post-copy: how much the guest does while its memory moves".into(),
            caption: caption.clone(),
            x_desc: x_desc.clone(),
            y_desc: "operations during the move, % of the rate before".into(),
        },
        &groups,
        &work,
    )?;
    plot::bars(
        &out.join("migrate_postcopy_pause.svg"),
        &plot::Figure {
            title: "Seeds 1+3+4, post-copy: the pause the guest saw".into(),
            caption,
            x_desc,
            y_desc: "its TSC from the pause to running at the destination, ms".into(),
        },
        &groups,
        &pause,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_phases_and_negative_losses_are_flagged_not_shown() {
        assert!(suspect(0.2, 10.0).unwrap().contains("200 ms"));
        assert!(suspect(2.0, -4800.0).unwrap().contains("4800 ms more work"));
        assert_eq!(suspect(2.0, 120.0), None);
    }
}
