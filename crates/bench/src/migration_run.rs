//! One live migration between two `hover` processes on this machine, as
//! the migration benches run it (`hover run` with an API socket to
//! `hover receive`), and what the guest's own timeline says about it.

use hover_vmm::api::Endpoint;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hover_vmm::api::ApiClient;
use serde_json::Value;

use crate::hover_process::{
    guest, rdtsc, spawn_owned, spawn_with_api, sum_stat, wait_json, OwnedChild,
};
use crate::BenchError;

/// How long the guest runs before it is migrated.
pub(crate) const WARM_UP: Duration = Duration::from_millis(2000);

/// `hover receive` listening on a fresh address: the child and the address.
pub(crate) fn receiver(
    exe: &Path,
    transport: &str,
    id: &str,
) -> Result<(OwnedChild, String), BenchError> {
    let listen = match transport {
        "tcp" => "tcp:127.0.0.1:0".to_string(),
        _ => format!(
            "unix:{}",
            std::env::temp_dir()
                .join(format!("hover-bench-recv-{id}.sock"))
                .display()
        ),
    };
    // Unauthenticated, as the QEMU runs it is compared with (no TLS).
    let mut child = spawn_owned(
        Command::new(exe)
            .args(["receive", "--listen", &listen, "--insecure", "--json"])
            .args(["--console", "off"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        "hover receive",
    )?;
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
    let before = api.send(Endpoint::Stats, None).map_err(api_err)?;
    let faults0 = sum_stat(&before["vcpu_stats"], "pf_taken");
    let mut body = body;
    body["to"] = at.into();
    body["insecure"] = true.into();
    let t = rdtsc();
    let rep = api.send(Endpoint::Migrate, Some(&body.to_string()));
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

/// A kvstore guest's operations per second during a migration requested
/// at TSC `t` that took `total_ms`, as a percentage of its rate in the
/// second before, from its timeline (ops per 100 ms bucket from its start
/// TSC) in `dest`'s reports. The guest's TSC is the host's on this KVM
/// (docs/ARCHITECTURE.md), under Hover and QEMU alike.
pub(crate) fn ops_during_pct(dest: &Value, t: u64, total_ms: f64) -> Result<f64, BenchError> {
    let start = report(dest, "kvstore.start_tsc").ok_or_else(|| guest("no kvstore.start_tsc"))?;
    let tsc_khz = crate::hover_process::tsc_khz()?;
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

/// Guest work lost to a migration requested at TSC `t` that took
/// `total_ms`: over the window from the request to one second after the
/// guest runs at the destination, the sum over its 100 ms buckets of what
/// the guest would have done at its rate of the second before the request
/// less what it did, in milliseconds of that full-speed work. It weighs a
/// short, sharp migration against a long, gentle one: both a long pause
/// and a long slow-down add to it.
pub(crate) fn work_lost_ms(dest: &Value, t: u64, total_ms: f64) -> Result<f64, BenchError> {
    let start = report(dest, "kvstore.start_tsc").ok_or_else(|| guest("no kvstore.start_tsc"))?;
    let tsc_khz = crate::hover_process::tsc_khz()?;
    Ok(lost_ms(
        |from, to| timeline_sum(dest, "kvstore.ops.", start, tsc_khz * 100, (from, to)),
        tsc_khz,
        t,
        total_ms,
    ))
}

/// A sample whose guest did more work during the move than the second
/// before it predicted (work lost below zero): that second was slow (host
/// noise), so the sample's work figures (ops during, work lost) compare
/// with a wrong baseline; they are flagged and left out of summaries.
pub(crate) fn slow_baseline(lost_ms: f64) -> bool {
    lost_ms < 0.0
}

/// The spread of `values` (each with its sample's work lost) over the
/// samples whose baseline is sound: " (!)" marks a spread that left some
/// out, "(!)" alone one that had none to give.
pub(crate) fn work_spread(values: &[(f64, f64)], digits: usize) -> String {
    let sound: Vec<f64> = values
        .iter()
        .filter(|(_, lost)| !slow_baseline(*lost))
        .map(|(v, _)| *v)
        .collect();
    match (sound.len(), values.len() - sound.len()) {
        (0, _) => "(!)".into(),
        (_, 0) => crate::stats::spread(&sound, digits),
        _ => format!("{} (!)", crate::stats::spread(&sound, digits)),
    }
}

/// The note under a table with [`work_spread`] columns.
pub(crate) const SLOW_BASELINE_NOTE: &str = "(!): samples whose guest did more work during the move than the second before predicted (work lost below zero: that second was slow, host noise) are left out of the work columns";

/// [`work_lost_ms`] over a counter `ops_in(from, to)` of TSC ranges;
/// `total_ms`: from the request to the guest running at the destination.
pub(crate) fn lost_ms(
    ops_in: impl Fn(u64, u64) -> f64,
    tsc_khz: u64,
    t: u64,
    total_ms: f64,
) -> f64 {
    let rate_per_ms = ops_in(t.saturating_sub(tsc_khz * 1000), t) / 1000.0;
    if rate_per_ms <= 0.0 {
        return 0.0;
    }
    let window_ms = total_ms + 1000.0;
    let done = ops_in(t, t + (window_ms * tsc_khz as f64) as u64);
    window_ms - done / rate_per_ms
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples_with_a_slow_baseline_are_left_out_and_flagged() {
        use super::work_spread;
        assert_eq!(
            work_spread(&[(90.0, 10.0), (80.0, 20.0), (70.0, 5.0)], 0),
            "80 (70-90)"
        );
        assert_eq!(work_spread(&[(90.0, 10.0), (102.0, -2.0)], 0), "90 (!)");
        assert_eq!(work_spread(&[(-2.0, -2.0)], 0), "(!)");
    }

    #[test]
    fn work_lost_counts_the_pause_and_the_slow_down() {
        // 1 op per tick-ms before; a 100 ms window during which nothing is
        // done, at full speed after: 100 ms lost.
        let khz = 1000;
        let t = 5_000_000;
        let ops = |from: u64, to: u64| {
            let dead = (t, t + 100_000);
            let len = to.saturating_sub(from) as f64;
            let overlap = to.min(dead.1).saturating_sub(from.max(dead.0)) as f64;
            (len - overlap) / khz as f64
        };
        let lost = super::lost_ms(ops, khz, t, 50.0);
        assert!((lost - 100.0).abs() < 1e-6, "{lost}");
        // Nothing lost: full speed throughout.
        let full = |from: u64, to: u64| to.saturating_sub(from) as f64 / khz as f64;
        assert!(super::lost_ms(full, khz, t, 50.0).abs() < 1e-6);
    }

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
