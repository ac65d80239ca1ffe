//! `hover bench boost`: the vCPU priority boosting seed's tables, side by
//! side in one invocation.
//!
//! The seed ran cyclictest in the guest and on the host, host idle and host
//! busy, at intervals of 500 and 1000 us, for a vanilla VM, dynamic boosting
//! and every vCPU statically RT; and counted audio glitches at 2, 4 and 10
//! ms buffers. Here, on 2 vCPUs:
//! - guest: `timer rt=1 interval_us=I background=B` (a real-time task waking
//!   every I us; B spinning tasks stand for the rest of the guest's work)
//!   and `audio buffer_ms=N work_us=W background=B`; and the serial line,
//!   `uart count=C target=1` (vCPU 0 sends, a task on vCPU 1 takes each
//!   byte's interrupt); and a rogue guest, `critical` holding its
//!   boost request for the whole run or flipping it as fast as it can,
//!   whose cost to the host the probe shows;
//! - host busy: [`Hogs`](crate::hostload::Hogs) pinned one per CPU (normal priority) for the run;
//! - host probe: a cyclictest-like thread at normal priority waking every
//!   I us (1 ms for audio), whose lateness shows what each mode costs the
//!   host's own work;
//! - modes: vanilla (`--boost off`), dynamic (`--boost on`), static
//!   (`--vcpu-rt`), interleaved within each round.
//!
//! Each row gives the median over rounds with min-max, and the per-round
//! ratio of vanilla to the mode (spread min/median/max).

mod one_run;

use std::path::Path;

use serde::Serialize;

use crate::plot;
use crate::stats::{ratios, spread};
use crate::{table, BenchError};
use one_run::{run_one, Sample, Test};

/// Knobs of the scenario.
pub struct BoostBench {
    /// Seconds per run.
    pub seconds: u32,
    /// Rounds.
    pub runs: u32,
    /// Timer intervals, microseconds.
    pub intervals: Vec<u64>,
    /// Audio buffers, milliseconds.
    pub buffers: Vec<u64>,
    /// Audio work per buffer, microseconds.
    pub work_us: u64,
    /// Spinning guest tasks beside the real-time one.
    pub background: u32,
    /// Host hog threads when busy (0: one per CPU).
    pub hogs: usize,
    /// Bytes the serial-line test sends per run (0: no serial test).
    pub uart_count: u64,
    /// Dynamic boosting with other host tuning too: `no-keep`
    /// (`--boost-keep-us 0`), `keep` (`--boost-keep-us`), `contended`
    /// (`--boost-when contended`), `keep-contended` (both).
    pub variants: Vec<String>,
    /// The `keep` variant's `--boost-keep-us`.
    pub keep_us: u64,
    /// The hosts to run on, in order.
    pub hosts: Vec<Host>,
    /// The tests to run, in order (each still shaped by `intervals`,
    /// `buffers` and `uart_count`).
    pub tests: Vec<TestKind>,
}

/// The host's load during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// Nothing else running.
    Idle,
    /// Hog threads pinned one per CPU (or `hogs` of them).
    Busy,
}

/// A kind of test of the scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestKind {
    /// The real-time timer task, at each of `intervals`.
    Timer,
    /// The audio task, at each of `buffers`.
    Audio,
    /// The serial line (skipped when `uart_count` is 0).
    Uart,
    /// The rogue guests (one holding its request, one flipping it).
    Rogue,
}

const MODES: [(&str, &[&str]); 3] = [
    ("vanilla", &["--boost", "off"]),
    ("dynamic", &["--boost", "on"]),
    ("static", &["--vcpu-rt"]),
];

/// The modes a run compares: vanilla, dynamic (the defaults) and static,
/// then each of `b.variants` (dynamic boosting with other host tuning:
/// `no-keep` for `--boost-keep-us 0`, `keep` for `--boost-keep-us`,
/// `contended` for `--boost-when contended`, `keep-contended` for both).
fn modes(b: &BoostBench) -> Vec<(String, Vec<String>)> {
    let mut m: Vec<(String, Vec<String>)> = MODES
        .iter()
        .map(|(n, f)| (n.to_string(), f.iter().map(|s| s.to_string()).collect()))
        .collect();
    let dynamic = |extra: &[&str]| {
        ["--boost", "on"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect::<Vec<String>>()
    };
    for v in &b.variants {
        match v.as_str() {
            "no-keep" => m.push(("dynamic, keep 0".into(), dynamic(&["--boost-keep-us", "0"]))),
            "keep" => m.push((
                format!("dynamic, keep {} us", b.keep_us),
                dynamic(&["--boost-keep-us", &b.keep_us.to_string()]),
            )),
            "contended" => m.push((
                "dynamic, contended".into(),
                dynamic(&["--boost-when", "contended"]),
            )),
            "keep-contended" => m.push((
                format!("dynamic, keep {} us, contended", b.keep_us),
                dynamic(&[
                    "--boost-keep-us",
                    &b.keep_us.to_string(),
                    "--boost-when",
                    "contended",
                ]),
            )),
            _ => {}
        }
    }
    m
}

/// The runs of each kind `b.tests` names, in its order.
fn tests(b: &BoostBench) -> Vec<Test> {
    let mut tests = Vec::new();
    for kind in &b.tests {
        match kind {
            TestKind::Timer => tests.extend(b.intervals.iter().map(|&i| Test::Timer(i))),
            TestKind::Audio => tests.extend(b.buffers.iter().map(|&m| Test::Audio(m))),
            TestKind::Uart => tests.extend((b.uart_count > 0).then_some(Test::Uart(b.uart_count))),
            TestKind::Rogue => tests.extend([Test::Rogue(true), Test::Rogue(false)]),
        }
    }
    tests
}

#[derive(Serialize)]
struct Row {
    host: &'static str,
    test: String,
    mode: String,
    command: String,
    runs: Vec<Sample>,
}

/// Run the scenario with the `hover` binary at `exe`.
pub fn run(exe: &Path, b: &BoostBench, out: &Path) -> Result<(), BenchError> {
    println!(
        "hover bench boost: 2 vCPUs, {} s per run, {} rounds, {} background guest task(s); busy host = {} hog thread(s), pinned to the CPUs in turn",
        b.seconds,
        b.runs,
        b.background,
        if b.hogs == 0 { crate::hostload::cpus() } else { b.hogs }
    );
    let tests = tests(b);
    let modes = modes(b);
    let mut rows = Vec::new();
    for (host, busy) in b.hosts.iter().map(|h| match h {
        Host::Idle => ("idle", false),
        Host::Busy => ("busy", true),
    }) {
        for &t in &tests {
            let mut runs: Vec<Vec<Sample>> = vec![Vec::new(); modes.len()];
            for round in 0..b.runs.max(1) {
                for (k, (name, mode)) in modes.iter().enumerate() {
                    let flags: Vec<&str> = mode.iter().map(String::as_str).collect();
                    let s = run_one(exe, b, t, &flags, busy)?;
                    let guest = match t {
                        Test::Timer(_) | Test::Audio(_) => format!(
                            "guest max {:.0} us, glitches {}",
                            s.guest_max_us, s.glitches
                        ),
                        Test::Uart(_) => format!(
                            "guest max {:.0} us, sends >= 1 ms {}",
                            s.guest_max_us, s.glitches
                        ),
                        Test::Rogue(_) => {
                            format!("{} boosts, {} throttles", s.boosts, s.throttles)
                        }
                    };
                    eprintln!(
                        "  {host} {} round {} {name:<8} {guest}, host probe max {:.0} us",
                        t.cmdline(b),
                        round + 1,
                        s.probe.max_us
                    );
                    runs[k].push(s);
                }
            }
            for ((name, mode), runs) in modes.iter().zip(runs) {
                rows.push(Row {
                    host,
                    test: t.cmdline(b),
                    mode: name.clone(),
                    command: format!(
                        "hover run --vcpus 2 {} --cmdline \"{}\"",
                        mode.join(" "),
                        t.cmdline(b)
                    ),
                    runs,
                });
            }
        }
    }
    let col = |r: &Row, f: fn(&Sample) -> f64| r.runs.iter().map(f).collect::<Vec<f64>>();
    let vanilla_of = |i: usize| &rows[i - i % modes.len()];
    // Static RT's row of the same host and test: the most any boosting
    // policy can give the guest, so each mode's gain is also shown as a
    // share of static's, round by round.
    let static_of = |i: usize| &rows[i - i % modes.len() + 2];
    let mut timer_rows = Vec::new();
    let mut audio_rows = Vec::new();
    let mut uart_rows = Vec::new();
    let mut rogue_rows = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let v = vanilla_of(i);
        if r.test.starts_with("workload=critical") {
            let held = r.test.contains("count=1 ");
            rogue_rows.push(vec![
                r.host.to_string(),
                if held {
                    "holds its request"
                } else {
                    "flips its request"
                }
                .to_string(),
                r.mode.to_string(),
                spread(&col(r, |s| s.probe.avg_us), 0),
                spread(&col(r, |s| s.probe.max_us), 0),
                ratios(&col(v, |s| s.probe.max_us), &col(r, |s| s.probe.max_us)),
                spread(&col(r, |s| s.boosts as f64), 0),
                spread(&col(r, |s| s.boosted_ms), 0),
                spread(&col(r, |s| s.throttles as f64), 0),
            ]);
        } else if r.test.starts_with("workload=uart") {
            uart_rows.push(vec![
                r.host.to_string(),
                r.mode.to_string(),
                spread(&col(r, |s| s.guest_avg_us), 0),
                ratios(&col(v, |s| s.guest_avg_us), &col(r, |s| s.guest_avg_us)),
                spread(&col(r, |s| s.guest_max_us), 0),
                spread(&col(r, |s| s.glitches as f64), 0),
                spread(&col(r, |s| s.periods as f64), 0),
                spread(&col(r, |s| s.probe.max_us), 0),
                spread(&col(r, |s| s.boosts as f64), 0),
            ]);
        } else if r.test.starts_with("workload=timer") {
            timer_rows.push(vec![
                r.host.to_string(),
                r.test.split_whitespace().nth(2).unwrap_or("").to_string(),
                r.mode.to_string(),
                spread(&col(r, |s| s.guest_avg_us), 0),
                spread(&col(r, |s| s.guest_max_us), 0),
                ratios(&col(v, |s| s.guest_max_us), &col(r, |s| s.guest_max_us)),
                ratios(
                    &col(static_of(i), |s| s.guest_max_us),
                    &col(r, |s| s.guest_max_us),
                ),
                spread(&col(r, |s| s.probe.avg_us), 0),
                spread(&col(r, |s| s.probe.max_us), 0),
                ratios(&col(v, |s| s.probe.max_us), &col(r, |s| s.probe.max_us)),
                spread(&col(r, |s| s.boosts as f64), 0),
            ]);
        } else {
            audio_rows.push(vec![
                r.host.to_string(),
                r.test.split_whitespace().nth(1).unwrap_or("").to_string(),
                r.mode.to_string(),
                spread(&col(r, |s| s.glitches as f64), 0),
                spread(&col(r, |s| s.periods as f64), 0),
                // Counts can be 0: the ratio of (glitches + 1).
                ratios(
                    &col(v, |s| s.glitches as f64 + 1.0),
                    &col(r, |s| s.glitches as f64 + 1.0),
                ),
                spread(&col(r, |s| s.guest_max_us), 0),
                spread(&col(r, |s| s.probe.max_us), 0),
                spread(&col(r, |s| s.boosted_ms), 0),
            ]);
        }
    }
    if !timer_rows.is_empty() {
        println!("\nTimer latency (guest: timer rt=1; host: probe at the same interval), median (min-max) over rounds; ratios vanilla/mode per round (min/median/max); a mode's gain over vanilla as a share of static RT's in the same round (static max / mode max):");
        table::print(
            &[
                "host",
                "interval",
                "mode",
                "guest avg us",
                "guest max us",
                "guest max: vanilla/mode",
                "gain / static's gain",
                "host probe avg us",
                "host probe max us",
                "host max: vanilla/mode",
                "boosts",
            ],
            &timer_rows,
        );
    }
    if !audio_rows.is_empty() {
        println!("\nAudio glitches (missed buffers), median (min-max) over rounds; ratio vanilla/mode per round:");
        table::print(
            &[
                "host",
                "buffer",
                "mode",
                "glitches",
                "buffers",
                "(glitches+1): vanilla/mode",
                "worst finish us",
                "host probe max us",
                "boosted ms",
            ],
            &audio_rows,
        );
    }
    if !uart_rows.is_empty() {
        println!("\nSerial line (guest: uart, vCPU 0 sends, a task on vCPU 1 takes each byte's interrupt; latency from the send to that task running), median (min-max) over rounds; ratio vanilla/mode per round:");
        table::print(
            &[
                "host",
                "mode",
                "avg us",
                "avg: vanilla/mode",
                "max us",
                "sends >= 1 ms",
                "bytes back",
                "host probe max us",
                "interrupt boosts",
            ],
            &uart_rows,
        );
    }
    if !rogue_rows.is_empty() {
        println!("\nA rogue guest (critical: one section held for the whole run, or sections back to back) and the host probe (every 1 ms), median (min-max) over rounds; ratio vanilla/mode per round:");
        table::print(
            &[
                "host",
                "guest",
                "mode",
                "host probe avg us",
                "host probe max us",
                "host max: vanilla/mode",
                "boosts",
                "boosted ms",
                "throttles",
            ],
            &rogue_rows,
        );
    }
    let doc = serde_json::json!({
        "scenario": "boost",
        "command": format!(
            "hover bench boost --seconds {} --runs {} --hosts {} --tests {} --intervals {} --buffers {} --work-us {} --background {} --hogs {} --uart-count {}{}",
            b.seconds,
            b.runs,
            b.hosts.iter().map(|h| format!("{h:?}").to_lowercase()).collect::<Vec<_>>().join(","),
            b.tests.iter().map(|t| format!("{t:?}").to_lowercase()).collect::<Vec<_>>().join(","),
            b.intervals.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            b.buffers.iter().map(u64::to_string).collect::<Vec<_>>().join(","),
            b.work_us,
            b.background,
            b.hogs,
            b.uart_count,
            match b.variants.is_empty() {
                true => String::new(),
                false => format!(" --variants {} --keep-us {}", b.variants.join(","), b.keep_us),
            }
        ),
        "date": plot::today(),
        "seconds": b.seconds,
        "background": b.background,
        "work_us": b.work_us,
        "uart_count": b.uart_count,
        "rows": rows,
    });
    table::write_json(out, "boost.json", &doc)?;
    plot(&doc, out)
}

/// `boost.svg` from `boost.json`'s document: on the busy host, per timer
/// interval, each mode's worst guest timer latency (median of rounds,
/// min-max whisker).
pub fn plot(doc: &serde_json::Value, out: &Path) -> Result<(), BenchError> {
    let rows = doc["rows"].as_array().cloned().unwrap_or_default();
    let timer: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["host"] == "busy")
        .filter(|r| {
            r["test"]
                .as_str()
                .is_some_and(|t| t.starts_with("workload=timer"))
        })
        .collect();
    if timer.is_empty() {
        // Nothing to draw (no busy host or no timer test in this run).
        return Ok(());
    }
    let interval = |r: &serde_json::Value| -> String {
        let t = r["test"].as_str().unwrap_or("");
        hover_abi::cmdline::get(t, "interval_us")
            .unwrap_or("")
            .to_string()
    };
    let intervals = plot::distinct(timer.iter().map(|r| interval(r)));
    let names = plot::distinct(
        timer
            .iter()
            .map(|r| r["mode"].as_str().unwrap_or("").to_string()),
    );
    let series: Vec<plot::Bars> = names
        .iter()
        .map(|name| plot::Bars {
            label: name.clone(),
            rounds: intervals
                .iter()
                .map(|i| {
                    timer
                        .iter()
                        .find(|r| r["mode"] == name.as_str() && &interval(r) == i)
                        .and_then(|r| r["runs"].as_array())
                        .map(|runs| {
                            runs.iter()
                                .filter_map(|x| x["guest_max_us"].as_f64())
                                .collect()
                        })
                        .unwrap_or_default()
                })
                .collect(),
        })
        .collect();
    let groups: Vec<String> = intervals
        .iter()
        .map(|i| format!("timer every {i} us"))
        .collect();
    plot::bars(
        &out.join("boost.svg"),
        &plot::Figure {
            title: "Seed 2, vCPU boosting on a busy host: the guest's worst timer wake-up".into(),
            caption: plot::caption_of(doc, "hover bench boost"),
            x_desc: "a real-time guest task's timer period".into(),
            y_desc: "worst wake-up latency in the guest, us".into(),
        },
        &groups,
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(tests: Vec<TestKind>, uart_count: u64) -> BoostBench {
        BoostBench {
            seconds: 1,
            runs: 1,
            intervals: vec![500, 1000],
            buffers: vec![2],
            work_us: 500,
            background: 1,
            hogs: 0,
            uart_count,
            variants: vec![],
            keep_us: 2000,
            hosts: vec![Host::Busy],
            tests,
        }
    }

    #[test]
    fn only_the_chosen_tests_run_in_the_order_given() {
        let t = super::tests(&bench(vec![TestKind::Rogue, TestKind::Timer], 10));
        assert!(
            t == [
                Test::Rogue(true),
                Test::Rogue(false),
                Test::Timer(500),
                Test::Timer(1000)
            ]
        );
    }

    #[test]
    fn each_variant_is_dynamic_boosting_with_its_own_tuning() {
        let mut b = bench(vec![TestKind::Timer], 0);
        b.variants = vec!["no-keep".into(), "keep".into()];
        b.keep_us = 700;
        let m = modes(&b);
        let names: Vec<&str> = m.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "vanilla",
                "dynamic",
                "static",
                "dynamic, keep 0",
                "dynamic, keep 700 us"
            ]
        );
        assert_eq!(m[3].1, ["--boost", "on", "--boost-keep-us", "0"]);
        assert_eq!(m[4].1, ["--boost", "on", "--boost-keep-us", "700"]);
    }

    #[test]
    fn the_serial_test_needs_bytes_to_send() {
        assert!(super::tests(&bench(vec![TestKind::Uart], 0)).is_empty());
        assert!(super::tests(&bench(vec![TestKind::Uart], 5)) == [Test::Uart(5)]);
    }
}
