//! One run of `hover bench boost`: a test's guest command line, the VM
//! run beside the host probe (and the hogs on a busy host), and what it
//! measured.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::BoostBench;
use crate::hostload::{Hogs, Probe, ProbeResult};
use crate::hover_process::run_hover;
use crate::BenchError;

/// What one run measured.
#[derive(Serialize, Clone, Copy)]
pub(super) struct Sample {
    /// The guest's average latency (timer, audio wake-up, serial line), us.
    pub guest_avg_us: f64,
    /// Its worst (the audio task's worst finish), us.
    pub guest_max_us: f64,
    /// Audio buffers missed, or serial sends that took 1 ms or more.
    pub glitches: u64,
    /// Timer samples, audio periods, bytes back or critical sections.
    pub periods: u64,
    /// The host probe's lateness.
    pub probe: ProbeResult,
    /// Boosts (interrupt boosts for the serial line).
    pub boosts: u64,
    /// Time boosted, ms.
    pub boosted_ms: f64,
    /// Boosts the CPU-time limit ended.
    pub throttles: u64,
}

/// One test of the scenario, with its parameter.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Test {
    /// The real-time timer task at this interval, us.
    Timer(u64),
    /// The audio task with this buffer, ms.
    Audio(u64),
    /// The serial line, this many bytes.
    Uart(u64),
    /// A guest asking for a boost all the time (`true`: one critical
    /// section held for the run; `false`: sections flipped back to back).
    Rogue(bool),
}

impl Test {
    /// The guest's command line for this test.
    pub(super) fn cmdline(&self, b: &BoostBench) -> String {
        match *self {
            Test::Timer(i) => format!(
                "workload=timer rt=1 interval_us={i} seconds={} background={}",
                b.seconds, b.background
            ),
            Test::Audio(ms) => format!(
                "workload=audio buffer_ms={ms} work_us={} seconds={} background={}",
                b.work_us, b.seconds, b.background
            ),
            Test::Uart(n) => format!("workload=uart count={n} target=1"),
            Test::Rogue(true) => format!(
                "workload=critical count=1 hold_us=60000000 gap_us=0 seconds={}",
                b.seconds
            ),
            Test::Rogue(false) => format!(
                "workload=critical count=100000000 hold_us=0 gap_us=0 seconds={}",
                b.seconds
            ),
        }
    }

    /// How often the host probe wakes during this test.
    fn probe_interval(&self) -> Duration {
        match *self {
            Test::Timer(i) => Duration::from_micros(i),
            Test::Audio(_) | Test::Uart(_) | Test::Rogue(_) => Duration::from_millis(1),
        }
    }
}

/// Run the test once in `mode` (its `hover run` flags), the host busy
/// or not, with the host probe beside it.
pub(super) fn run_one(
    exe: &Path,
    b: &BoostBench,
    t: Test,
    mode: &[&str],
    busy: bool,
) -> Result<Sample, BenchError> {
    let cmdline = t.cmdline(b);
    let mut args: Vec<&str> = vec!["--vcpus", "2"];
    args.extend(mode);
    args.extend(["--cmdline", &cmdline]);
    let limit = Duration::from_secs(b.seconds as u64 + 30);
    let hogs = busy.then(|| {
        let n = if b.hogs == 0 {
            crate::hostload::cpus()
        } else {
            b.hogs
        };
        Hogs::start(n, limit)
    });
    let probe = Probe::start(t.probe_interval());
    let r = run_hover(exe, &args);
    let probe = probe.stop();
    if let Some(h) = hogs {
        h.stop();
    }
    let r = r?;
    let boost = &r.outcome["boost"]["vcpus"];
    let sum = |k: &str| {
        boost.as_array().map_or(0, |a| {
            a.iter().map(|v| v[k].as_u64().unwrap_or(0)).sum::<u64>()
        })
    };
    // What each test reports of the guest: average and worst latency (us),
    // misses, periods, and which boosts count.
    let (guest_avg_us, guest_max_us, glitches, periods, boosts) = match t {
        Test::Timer(_) => (
            r.report("timer.avg_ns")? / 1000.0,
            r.report("timer.max_ns")? / 1000.0,
            0.0,
            r.report("timer.samples")?,
            "boosts",
        ),
        Test::Audio(_) => (
            r.report("audio.wake.avg_ns")? / 1000.0,
            r.report("audio.finish.max_ns")? / 1000.0,
            r.report("audio.glitches")?,
            r.report("audio.periods")?,
            "boosts",
        ),
        Test::Uart(_) => {
            // Sends that took 1 ms or more: the histogram's buckets from
            // [1024, 2048) us up.
            let mut late = 0.0;
            for k in [
                "lt_2048us",
                "lt_4096us",
                "lt_8192us",
                "lt_16384us",
                "ge_16384us",
            ] {
                late += r.report(&format!("uart.hist.{k}"))?;
            }
            (
                r.report("uart.avg_ns")? / 1000.0,
                r.report("uart.max_ns")? / 1000.0,
                late,
                r.report("uart.received")?,
                "boosts_interrupt",
            )
        }
        Test::Rogue(_) => (0.0, 0.0, 0.0, r.report("critical.sections")?, "boosts"),
    };
    Ok(Sample {
        guest_avg_us,
        guest_max_us,
        glitches: glitches as u64,
        periods: periods as u64,
        probe,
        boosts: sum(boosts),
        boosted_ms: sum("boosted_us") as f64 / 1000.0,
        throttles: sum("throttles"),
    })
}
