//! `hover bench migrate --peer qemu`: live migration under Hover beside
//! QEMU, on the same guest image, working set and link.
//!
//! Each sample migrates a one-vCPU `kvstore` guest (random verified writes
//! over a working set at a fixed rate) between two processes on this
//! machine over TCP loopback, 2 s after it started: `hover run` to
//! `hover receive`, and QEMU microvm to QEMU microvm `-incoming` (driven
//! through QMP), each with the dirty bitmap and with 4096-entry dirty
//! rings (QEMU's `dirty-ring-size`). Both are given the same downtime
//! target (Hover's default, 100 ms; QEMU's own default is 300 ms) and no
//! bandwidth cap (QEMU's default caps it). Per sample: total time and
//! downtime as each VMM reports them, the time from the request to the
//! end as this bench saw it (same clock for both), rounds (QEMU's dirty
//! syncs), bytes on the wire, and the guest's operations per second during
//! the migration as a share of the second before it (its own timeline, in
//! host TSC under both VMMs). The guest's data is checked after the move
//! (kvstore.errors must be 0) under both.
//!
//! VMMs and trackers are interleaved within each round; every cell is
//! median (min-max) over rounds, and ratios are per round.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

// The same warm-up as Hover's samples: both guests are migrated at 2 s.
use crate::hover_process::{guest, rdtsc};
use crate::migration_run::{
    migrate_once, ops_during_pct, report, work_lost_ms, work_spread, WARM_UP,
};
use crate::peer::{self, Boot, Machine, PeerError};
use crate::qmp::Qmp;
use crate::stats::{ratios, spread};
use crate::{table, BenchError};

/// The scenario's knobs.
#[derive(Clone, Debug)]
pub struct PeerMigrateBench {
    /// Guest memory sizes.
    pub memories: Vec<String>,
    /// kvstore's working sets.
    pub wss: Vec<String>,
    /// kvstore's operations per second.
    pub rate: u64,
    /// Rounds.
    pub runs: u32,
}

impl PeerMigrateBench {
    /// Its flags checked (sizes whole pages).
    pub fn check(&self) -> Result<(), BenchError> {
        crate::flags::memories("--memories", &self.memories)?;
        crate::flags::fits(("--wss", &self.wss), ("--memories", &self.memories))?;
        crate::flags::guest_param("--rate", "kvstore", "rate", &self.rate.to_string())?;
        crate::flags::runs(self.runs)
    }
}

/// Entries per vCPU dirty ring, both VMMs.
const RING_ENTRIES: u32 = 4096;
/// The downtime target given to both (Hover's default).
const DOWNTIME_MS: u64 = 100;
/// kvstore's run time: long enough to cover warm-up and migration.
const GUEST_SECONDS: u32 = 6;

/// The trackers compared: Hover's name, and what it is called in QEMU.
const TRACKERS: [(&str, &str); 2] = [("bitmap", "dirty bitmap"), ("ring", "dirty ring")];

/// One migration.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// `hover` or `QEMU microvm`.
    pub vmm: String,
    /// `bitmap` or `ring`.
    pub tracker: String,
    /// Guest memory.
    pub memory: String,
    /// kvstore's working set.
    pub wss: String,
    /// Round.
    pub round: u32,
    /// Total time as the VMM reports it, ms.
    pub total_ms: f64,
    /// Downtime as the VMM reports it, ms.
    pub downtime_ms: f64,
    /// Request to completion as this bench saw it, ms.
    pub wall_ms: f64,
    /// Rounds (QEMU: dirty-bitmap syncs).
    pub rounds: f64,
    /// Bytes on the wire, MiB.
    pub sent_mib: f64,
    /// Guest ops/s during the migration, % of the second before.
    pub ops_during_pct: f64,
    /// Guest work lost, ms of full-speed work (`migration_run::work_lost_ms`).
    pub work_lost_ms: f64,
}

fn mib(size: &str) -> Result<u32, BenchError> {
    hover_abi::workload::parse_size(size)
        .map(|b| (b >> 20) as u32)
        .ok_or_else(|| guest(&format!("'{size}' is not a size (e.g. 256M)")))
}

fn cmdline(b: &PeerMigrateBench, wss: &str) -> String {
    format!(
        "workload=kvstore wss={wss} rate={} seconds={GUEST_SECONDS}",
        b.rate
    )
}

fn hover_sample(
    exe: &Path,
    b: &PeerMigrateBench,
    memory: &str,
    wss: &str,
    tracker: &str,
    round: u32,
) -> Result<Sample, BenchError> {
    let id = format!(
        "{}-peer-{memory}-{wss}-{tracker}-{round}",
        std::process::id()
    );
    let body = json!({ "dirty_tracking": tracker, "downtime_ms": DOWNTIME_MS });
    let m = migrate_once(
        exe,
        "tcp",
        &["--vcpus", "1"],
        (memory, &cmdline(b, wss)),
        body,
        &id,
    )?;
    let (rep, t) = (&m.report, m.requested_tsc);
    let wall_ms = ticks_to_ms(m.returned_tsc.saturating_sub(t))?;
    let num = |k: &str| rep[k].as_f64().unwrap_or(0.0);
    Ok(Sample {
        vmm: "hover".into(),
        tracker: tracker.into(),
        memory: memory.into(),
        wss: wss.into(),
        round,
        total_ms: num("total_ms"),
        downtime_ms: num("downtime_ms"),
        wall_ms,
        rounds: num("rounds"),
        sent_mib: num("bytes_sent") / (1 << 20) as f64,
        ops_during_pct: ops_during_pct(&m.dest, t, num("total_ms"))?,
        work_lost_ms: work_lost_ms(&m.dest, t, num("total_ms"))?,
    })
}

/// QEMU processes killed when dropped, so a failed sample leaves none.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn ticks_to_ms(ticks: u64) -> Result<f64, BenchError> {
    Ok(ticks as f64 / crate::hover_process::tsc_khz()? as f64)
}

fn free_port() -> Result<u16, BenchError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| guest(&format!("no free TCP port on loopback: {e}")))
}

fn qemu_err(e: PeerError) -> BenchError {
    guest(&format!("QEMU migration: {e}"))
}

/// Temporary files of one QEMU sample, removed when dropped.
/// The run's sockets and serial files, removed when dropped or if a
/// signal ends the bench.
struct Files(Vec<crate::hover_process::TempPath>);

impl Files {
    fn path(&self, k: usize) -> &Path {
        self.0[k].path()
    }
}

/// Migrate the kvstore guest (`image`) from one QEMU microvm to another
/// over TCP loopback, with `tracker` (`bitmap` or `ring`), 2 s after it
/// started; fails unless the guest ends well on the destination with its
/// data intact.
#[allow(clippy::too_many_arguments)]
pub fn qemu_sample(
    qemu: &Path,
    image: &Path,
    b: &PeerMigrateBench,
    memory: &str,
    wss: &str,
    tracker: &str,
    round: u32,
    tsc_khz: u64,
) -> Result<Sample, BenchError> {
    let dir = std::env::temp_dir();
    let id = format!("{}-{memory}-{wss}-{tracker}-{round}", std::process::id());
    let file = |what: &str| {
        let path = dir.join(format!("hover-bench-qemu-{id}-{what}"));
        let _ = std::fs::remove_file(&path);
        crate::hover_process::TempPath::new(path)
    };
    let files = Files(vec![
        file("src.sock"),
        file("dst.sock"),
        file("src.out"),
        file("dst.out"),
    ]);
    let cmdline = cmdline(b, wss);
    let boot = Boot {
        dirty_ring: (tracker == "ring").then_some(RING_ENTRIES),
        tsc_khz: Some(tsc_khz),
        ..Boot::new(Machine::Microvm, image, 1, mib(memory)?, &cmdline)
    };
    let spawn = |sock: &Path, serial: &Path, extra: &[String]| {
        peer::command(qemu, &boot)
            .arg("-serial")
            .arg(format!("file:{}", serial.display()))
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", sock.display()))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| guest(&format!("cannot run {}: {e}", qemu.display())))
    };
    let uri = format!("tcp:127.0.0.1:{}", free_port()?);
    let mut procs = Procs(Vec::new());
    procs.0.push(spawn(
        files.path(1),
        files.path(3),
        &["-incoming".into(), uri.clone()],
    )?);
    procs.0.push(spawn(files.path(0), files.path(2), &[])?);
    let wait = Duration::from_secs(10);
    let mut src = Qmp::connect(files.path(0), wait).map_err(qemu_err)?;
    // The destination must be listening before the source connects.
    Qmp::connect(files.path(1), wait).map_err(qemu_err)?;
    src.execute(
        "migrate-set-parameters",
        json!({ "downtime-limit": DOWNTIME_MS, "max-bandwidth": 1u64 << 40 }),
    )
    .map_err(qemu_err)?;
    std::thread::sleep(WARM_UP);
    let t = rdtsc();
    src.execute("migrate", json!({ "uri": uri }))
        .map_err(qemu_err)?;
    let limit = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let q = src.execute("query-migrate", json!({})).map_err(qemu_err)?;
        match q["status"].as_str() {
            Some("completed") => break q,
            Some("failed") | Some("cancelled") => {
                return Err(guest(&format!(
                    "QEMU migration {}: {}",
                    q["status"],
                    q["error-desc"].as_str().unwrap_or("no reason given")
                )))
            }
            _ if Instant::now() > limit => {
                return Err(guest("QEMU migration did not complete within 120 s"))
            }
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    let wall_ms = ticks_to_ms(rdtsc().saturating_sub(t))?;
    let _ = src.execute("quit", json!({}));
    let mut dest = procs.0.remove(0);
    let deadline = Instant::now() + Duration::from_secs(GUEST_SECONDS as u64 + 30);
    let status = loop {
        match dest.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = dest.kill();
                let _ = dest.wait();
                return Err(guest("the QEMU destination's guest did not finish"));
            }
        }
    };
    let console = std::fs::read_to_string(files.path(3)).unwrap_or_default();
    if peer::guest_exit(status.code(), &console) != Some(0) {
        return Err(guest(&format!(
            "the guest migrated by QEMU did not end well ({status}); its console ended: {}",
            peer::last_lines(&console, 3)
        )));
    }
    let reports = Value::Array(
        peer::parse_reports(&console)
            .into_iter()
            .map(|r| {
                let value = match r.value.parse::<u64>() {
                    Ok(n) => json!(n),
                    Err(_) => json!(r.value.parse::<f64>().ok()),
                };
                json!({ "key": r.key, "value": value })
            })
            .collect(),
    );
    let dest = json!({ "reports": reports });
    if report(&dest, "kvstore.errors").unwrap_or(1) != 0 {
        return Err(guest(
            "the kvstore migrated by QEMU found wrong data (or did not say)",
        ));
    }
    let num = |k: &str| done[k].as_f64().unwrap_or(0.0);
    let total_ms = num("total-time");
    Ok(Sample {
        vmm: Machine::Microvm.name().into(),
        tracker: tracker.into(),
        memory: memory.into(),
        wss: wss.into(),
        round,
        total_ms,
        downtime_ms: num("downtime"),
        wall_ms,
        rounds: done["ram"]["dirty-sync-count"].as_f64().unwrap_or(0.0),
        sent_mib: done["ram"]["transferred"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        ops_during_pct: ops_during_pct(&dest, t, total_ms)?,
        work_lost_ms: work_lost_ms(&dest, t, total_ms)?,
    })
}

/// Run the scenario: a table on stdout and `OUT/migrate_peer.json`; without
/// QEMU, a message and nothing else.
pub fn run(exe: &Path, b: &PeerMigrateBench, out: &Path) -> Result<(), BenchError> {
    let qemu = match peer::find() {
        Ok(q) => q,
        Err(e) => {
            println!("hover bench migrate --peer qemu: skipped: {e}");
            return Ok(());
        }
    };
    let image = peer::GuestImageFile::write(exe)?;
    let tsc_khz = crate::hover_process::tsc_khz()?;
    let mut samples = Vec::new();
    for round in 0..b.runs {
        for memory in &b.memories {
            for wss in &b.wss {
                // Interleaved: VMM and tracker order rotates each round.
                for j in 0..4 {
                    let k = (j + round as usize) % 4;
                    let tracker = TRACKERS[k % 2].0;
                    let s = if k < 2 {
                        hover_sample(exe, b, memory, wss, tracker, round)?
                    } else {
                        qemu_sample(&qemu, image.path(), b, memory, wss, tracker, round, tsc_khz)?
                    };
                    eprintln!(
                        "round {round} {memory} wss {wss} {} {tracker}: total {:.0} ms, downtime {:.0} ms, seen {:.0} ms, {:.0} rounds, {:.1} MiB, ops during {:.0}%, work lost {:.0} ms{}",
                        s.vmm, s.total_ms, s.downtime_ms, s.wall_ms, s.rounds, s.sent_mib, s.ops_during_pct, s.work_lost_ms,
                        if crate::migration_run::slow_baseline(s.work_lost_ms) { " (!) the second before was slow" } else { "" }
                    );
                    samples.push(s);
                }
            }
        }
    }
    println!(
        "hover bench migrate --peer qemu: {} rounds; a 1-vCPU kvstore guest ({} ops/s) migrated over TCP loopback 2 s after start, downtime target {DOWNTIME_MS} ms for both, no bandwidth cap; {} -M microvm (QMP migrate) beside hover; median (min-max), ratios QEMU/hover per round",
        b.runs,
        b.rate,
        qemu.display()
    );
    let rows = rows(b, &samples);
    table::print(&HEADERS, &rows);
    if rows.iter().flatten().any(|c| c.contains("(!)")) {
        println!("{}", crate::migration_run::SLOW_BASELINE_NOTE);
    }
    let doc = json!({
        "scenario": SCENARIO,
        "command": format!(
            "hover bench migrate --peer qemu --memories {} --wss {} --rate {} --runs {}",
            b.memories.join(","),
            b.wss.join(","),
            b.rate,
            b.runs
        ),
        "date": crate::plot::today(),
        "samples": samples,
    });
    table::write_json(out, "migrate_peer.json", &doc)?;
    plot(&doc, out)
}

/// The `scenario` of `migrate_peer.json`, which `hover bench plot` reads.
pub const SCENARIO: &str = "migrate --peer qemu";

/// `migrate_peer.svg` from `migrate_peer.json`'s document: per guest
/// memory and working set, the downtime each VMM reported with each
/// tracker (median of rounds, min-max whisker).
pub fn plot(doc: &Value, out: &Path) -> Result<(), BenchError> {
    use crate::plot::{bars, caption_of, distinct, Bars, Figure};
    let samples = doc["samples"].as_array().cloned().unwrap_or_default();
    let text = |s: &Value, k: &str| s[k].as_str().unwrap_or("").to_string();
    let groups = distinct(samples.iter().map(|s| (text(s, "memory"), text(s, "wss"))));
    let series: Vec<Bars> = distinct(samples.iter().map(|s| (text(s, "vmm"), text(s, "tracker"))))
        .into_iter()
        .map(|(vmm, tracker)| Bars {
            rounds: groups
                .iter()
                .map(|(m, w)| {
                    samples
                        .iter()
                        .filter(|s| text(s, "memory") == *m && text(s, "wss") == *w)
                        .filter(|s| text(s, "vmm") == vmm && text(s, "tracker") == tracker)
                        .filter_map(|s| s["downtime_ms"].as_f64())
                        .collect()
                })
                .collect(),
            label: format!("{vmm}, {tracker}"),
        })
        .collect();
    let labels: Vec<String> = groups
        .iter()
        .map(|(m, w)| format!("{m} guest, {w} written"))
        .collect();
    bars(
        &out.join("migrate_peer.svg"),
        &Figure {
            title: "Pre-copy live migration beside QEMU: downtime each VMM reported".into(),
            caption: caption_of(doc, "hover bench migrate --peer qemu"),
            x_desc: "guest memory and kvstore's working set (1 vCPU, TCP loopback)".into(),
            y_desc: "downtime, ms".into(),
        },
        &labels,
        &series,
    )
}

const HEADERS: [&str; 12] = [
    "guest memory",
    "working set",
    "VMM",
    "tracker",
    "total ms",
    "downtime ms",
    "seen by the bench ms",
    "seen: QEMU/hover",
    "rounds",
    "MiB sent",
    "guest ops during (% of before)",
    "guest work lost ms",
];

/// The table's rows: per memory, working set and tracker, hover then QEMU.
fn rows(b: &PeerMigrateBench, samples: &[Sample]) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for memory in &b.memories {
        for wss in &b.wss {
            for (tracker, qemu_name) in TRACKERS {
                let col = |vmm: &str, f: fn(&Sample) -> f64| -> Vec<f64> {
                    samples
                        .iter()
                        .filter(|s| {
                            &s.memory == memory
                                && &s.wss == wss
                                && s.tracker == tracker
                                && s.vmm == vmm
                        })
                        .map(f)
                        .collect()
                };
                let col2 = |vmm: &str, f: fn(&Sample) -> f64| -> Vec<(f64, f64)> {
                    let values = col(vmm, f);
                    values
                        .into_iter()
                        .zip(col(vmm, |s| s.work_lost_ms))
                        .collect()
                };
                let hover_wall = col("hover", |s| s.wall_ms);
                for (vmm, name) in [
                    ("hover", tracker.to_string()),
                    (Machine::Microvm.name(), qemu_name.to_string()),
                ] {
                    rows.push(vec![
                        memory.clone(),
                        wss.clone(),
                        vmm.to_string(),
                        name,
                        spread(&col(vmm, |s| s.total_ms), 0),
                        spread(&col(vmm, |s| s.downtime_ms), 0),
                        spread(&col(vmm, |s| s.wall_ms), 0),
                        ratios(&col(vmm, |s| s.wall_ms), &hover_wall),
                        spread(&col(vmm, |s| s.rounds), 0),
                        spread(&col(vmm, |s| s.sent_mib), 1),
                        work_spread(&col2(vmm, |s| s.ops_during_pct), 0),
                        work_spread(&col2(vmm, |s| s.work_lost_ms), 0),
                    ]);
                }
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(vmm: &str, tracker: &str, round: u32, wall_ms: f64) -> Sample {
        Sample {
            vmm: vmm.into(),
            tracker: tracker.into(),
            memory: "256M".into(),
            wss: "16M".into(),
            round,
            total_ms: wall_ms,
            downtime_ms: 10.0,
            wall_ms,
            rounds: 3.0,
            sent_mib: 20.0,
            ops_during_pct: 90.0,
            work_lost_ms: 20.0,
        }
    }

    #[test]
    fn rows_pair_each_tracker_with_qemus_and_ratios_are_per_round() {
        let b = PeerMigrateBench {
            memories: vec!["256M".into()],
            wss: vec!["16M".into()],
            rate: 1000,
            runs: 2,
        };
        let q = Machine::Microvm.name();
        let samples = vec![
            sample("hover", "bitmap", 0, 100.0),
            sample(q, "bitmap", 0, 300.0),
            sample("hover", "bitmap", 1, 200.0),
            sample(q, "bitmap", 1, 200.0),
            sample("hover", "ring", 0, 100.0),
            sample(q, "ring", 0, 150.0),
        ];
        let r = rows(&b, &samples);
        assert_eq!(r.len(), 4);
        assert_eq!((r[0][2].as_str(), r[0][3].as_str()), ("hover", "bitmap"));
        assert_eq!((r[1][2].as_str(), r[1][3].as_str()), (q, "dirty bitmap"));
        assert_eq!(r[0][7], "1.00/1.00/1.00x");
        // Round 0: 300/100, round 1: 200/200 (the median of two is the lower).
        assert_eq!(r[1][7], "1.00/1.00/3.00x");
        assert_eq!(r[3][3], "dirty ring");
        assert_eq!(r[3][7], "1.50/1.50/1.50x");
        assert_eq!(r.iter().map(Vec::len).max(), Some(HEADERS.len()));
    }

    #[test]
    fn sizes_are_given_to_qemu_in_mib() {
        assert_eq!(mib("256M").unwrap(), 256);
        assert_eq!(mib("1G").unwrap(), 1024);
        assert!(mib("lots").is_err());
    }
}
