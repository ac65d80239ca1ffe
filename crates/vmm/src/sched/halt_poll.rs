//! Halt polling (seed 5): per-VM control through `KVM_CAP_HALT_POLL`, and a
//! governor that picks the poll window from measured wake-ups.
//!
//! When a vCPU halts, KVM can spin ("poll") for a while before putting the
//! vCPU thread to sleep; a wake-up that arrives within the window is caught
//! cheaply, one that arrives later costs a sleep and a wake-up of the host
//! thread, and the polling was wasted CPU. `KVM_CAP_HALT_POLL` sets the
//! VM's maximum window; KVM's own per-vCPU algorithm grows the window
//! (doubling) after a wake-up just missed and shrinks it after long waits,
//! within that maximum, knowing nothing of how wake-ups are distributed or
//! what polling costs.
//!
//! The governor instead reads every vCPU's KVM histograms each period
//! (`halt_poll_success_hist`: wake-ups caught while polling, by time;
//! `halt_wait_hist`: waits after polling, by length; `halt_poll_fail_hist`),
//! rebuilds the distribution of wake-up times over the last second, and sets
//! the window that catches the most wake-ups while the time spent in polls
//! that fail stays within a CPU budget per vCPU (default 2.5%, the host load
//! the seed measured per idle vCPU). Among windows that catch equally many,
//! it takes the smallest.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use kvm_bindings::{
    kvm_enable_cap, KVM_CAP_HALT_POLL, KVM_CAP_X86_DISABLE_EXITS, KVM_X86_DISABLE_EXITS_HLT,
};
use kvm_ioctls::VmFd;
use serde::Serialize;

use crate::stats::KvmStats;

/// Largest window accepted: 10 ms (KVM's own default maximum is 200 us).
pub const MAX_WINDOW_NS: u64 = 10_000_000;
/// The governor's CPU budget for failed polls, percent of one CPU per vCPU.
pub const DEFAULT_BUDGET_PCT: f64 = 2.5;
/// How often the governor looks.
pub const PERIOD: Duration = Duration::from_millis(100);
/// How much history the governor weighs (periods).
const HISTORY: usize = 10;
/// Windows the governor chooses from: 0 and 1 us .. 8 ms in powers of two.
const CANDIDATES: [u64; 15] = [
    0,
    1 << 10,
    1 << 11,
    1 << 12,
    1 << 13,
    1 << 14,
    1 << 15,
    1 << 16,
    1 << 17,
    1 << 18,
    1 << 19,
    1 << 20,
    1 << 21,
    1 << 22,
    1 << 23,
];

/// How halt polling is set for a VM.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HaltPoll {
    /// Leave KVM's default (its module parameter) alone.
    KvmDefault,
    /// A fixed maximum window, nanoseconds (0 = no polling).
    Fixed {
        /// The window.
        window_ns: u64,
    },
    /// The governor, with a CPU budget in percent of one CPU per vCPU.
    Auto {
        /// Budget for failed polls, in (0, 100].
        budget_pct: f64,
    },
}

impl HaltPoll {
    /// The setting in the API's request form: `{"mode": "fixed",
    /// "window_ns": N}`, `{"mode": "auto", "budget_pct": P}` or
    /// `{"mode": "kvm_default"}`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            HaltPoll::KvmDefault => serde_json::json!({ "mode": "kvm_default" }),
            HaltPoll::Fixed { window_ns } => {
                serde_json::json!({ "mode": "fixed", "window_ns": window_ns })
            }
            HaltPoll::Auto { budget_pct } => {
                serde_json::json!({ "mode": "auto", "budget_pct": budget_pct })
            }
        }
    }
}

/// Whether this KVM lets a VM set its own halt-poll window.
pub fn supported(vm: &VmFd) -> bool {
    vm.check_extension_raw(KVM_CAP_HALT_POLL as libc::c_ulong) > 0
}

/// KVM's module-wide default window (`halt_poll_ns`), what a VM polls for
/// when it sets no window of its own.
pub fn kvm_default_window() -> std::io::Result<u64> {
    let s = std::fs::read_to_string("/sys/module/kvm/parameters/halt_poll_ns")?;
    s.trim()
        .parse()
        .map_err(|e| std::io::Error::other(format!("halt_poll_ns {s:?}: {e}")))
}

/// Set the VM's maximum halt-poll window.
pub fn set_window(vm: &VmFd, ns: u64) -> Result<(), kvm_ioctls::Error> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_HALT_POLL,
        ..Default::default()
    };
    cap.args[0] = ns;
    vm.enable_cap(&cap)
}

/// Let guest HLT run without exiting to KVM (the vCPU thread never sleeps:
/// the upper bound on wake-up latency, at the cost of a host CPU per vCPU).
pub fn disable_hlt_exits(vm: &VmFd) -> Result<(), kvm_ioctls::Error> {
    let mut cap = kvm_enable_cap {
        cap: KVM_CAP_X86_DISABLE_EXITS,
        ..Default::default()
    };
    cap.args[0] = KVM_X86_DISABLE_EXITS_HLT as u64;
    vm.enable_cap(&cap)
}

/// Wake-up times as a log2 histogram: bucket 0 is 0 ns, bucket i is
/// [2^(i-1), 2^i) ns (KVM's layout).
pub type WakeHist = [u64; 64];

/// Add one period's histogram deltas to `hist`: polls that succeeded give the
/// wake-up time directly; waits after a poll of up to `window` give
/// `window + wait`.
pub fn add_period(hist: &mut WakeHist, poll_success: &[u64], wait: &[u64], window: u64) {
    for (i, &n) in poll_success.iter().enumerate().take(64) {
        hist[i] += n;
    }
    for (i, &n) in wait.iter().enumerate() {
        if n == 0 {
            continue;
        }
        let mid = if i == 0 {
            0
        } else {
            (1u64 << (i - 1)) + (1u64 << (i - 1)) / 2
        };
        hist[bucket(window.saturating_add(mid))] += n;
    }
}

fn bucket(ns: u64) -> usize {
    (64 - ns.leading_zeros() as usize).min(63)
}

/// Share of the wake-ups the best affordable window catches that the chosen
/// window must catch: the last few percent (a long tail of late wake-ups)
/// are not worth a window many times longer.
const CATCH_SHARE: f64 = 0.98;

/// Pick the window: among windows whose failed-poll time over the history
/// stays within `budget_ns`, the smallest that catches at least 98% of what
/// the best of them catches.
pub fn choose_window(hist: &WakeHist, budget_ns: f64, max: u64) -> u64 {
    let outcome = |w: u64| {
        // A bucket counts as caught only if all of it lies within the window.
        let (mut caught, mut waste) = (0u64, 0f64);
        for (i, &n) in hist.iter().enumerate() {
            let upper = if i == 0 { 0 } else { 1u64 << i.min(63) };
            if upper <= w {
                caught += n;
            } else {
                waste += n as f64 * w as f64;
            }
        }
        (caught, waste)
    };
    let affordable: Vec<(u64, u64)> = CANDIDATES
        .iter()
        .filter(|&&w| w <= max)
        .map(|&w| (w, outcome(w)))
        .filter(|(_, (_, waste))| *waste <= budget_ns)
        .map(|(w, (caught, _))| (w, caught))
        .collect();
    let best = affordable.iter().map(|a| a.1).max().unwrap_or(0);
    if best == 0 {
        return 0;
    }
    affordable
        .iter()
        .find(|a| a.1 as f64 >= CATCH_SHARE * best as f64)
        .map_or(0, |a| a.0)
}

/// What the governor did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GovernorReport {
    /// Budget, percent of a CPU per vCPU.
    pub budget_pct: f64,
    /// Every change: (milliseconds since start, new window in ns).
    pub changes: Vec<(u64, u64)>,
    /// The window at the end.
    pub final_window_ns: u64,
}

/// The running governor.
pub struct Governor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    report: Arc<Mutex<GovernorReport>>,
}

impl Governor {
    /// Start governing `vm`, whose vCPUs' statistics are `stats`.
    pub fn start(
        vm: Arc<VmFd>,
        stats: Vec<KvmStats>,
        budget_pct: f64,
    ) -> std::io::Result<Governor> {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(GovernorReport {
            budget_pct,
            ..Default::default()
        }));
        let (stop2, report2) = (stop.clone(), report.clone());
        let thread = crate::seccomp::spawn(
            crate::seccomp::Kind::Governor,
            "halt-poll".into(),
            move || {
                let started = Instant::now();
                let mut window = 0u64;
                if let Err(e) = set_window(&vm, window) {
                    tracing::warn!("halt-poll governor cannot set the window: {e}");
                    return;
                }
                report2
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .changes
                    .push((0, window));
                let mut last: Vec<Option<(Vec<u64>, Vec<u64>)>> = vec![None; stats.len()];
                let mut periods: VecDeque<WakeHist> = VecDeque::new();
                while !stop2.load(Ordering::Acquire) {
                    thread::sleep(PERIOD);
                    let mut hist = [0u64; 64];
                    for (i, s) in stats.iter().enumerate() {
                        let Ok(snap) = s.read() else { continue };
                        let (Some(succ), Some(wait)) = (
                            snap.histogram("halt_poll_success_hist"),
                            snap.histogram("halt_wait_hist"),
                        ) else {
                            continue;
                        };
                        if let Some((ps, pw)) = &last[i] {
                            let d = |now: &[u64], then: &[u64]| {
                                now.iter()
                                    .zip(then)
                                    .map(|(a, b)| a.saturating_sub(*b))
                                    .collect::<Vec<_>>()
                            };
                            add_period(&mut hist, &d(succ, ps), &d(wait, pw), window);
                        }
                        last[i] = Some((succ.to_vec(), wait.to_vec()));
                    }
                    periods.push_back(hist);
                    if periods.len() > HISTORY {
                        periods.pop_front();
                    }
                    let mut total = [0u64; 64];
                    for p in &periods {
                        for (t, v) in total.iter_mut().zip(p) {
                            *t += v;
                        }
                    }
                    let span_ns = (PERIOD * periods.len() as u32).as_nanos() as f64;
                    let budget_ns = budget_pct / 100.0 * span_ns * stats.len() as f64;
                    let next = choose_window(&total, budget_ns, MAX_WINDOW_NS);
                    tracing::trace!(
                        window,
                        next,
                        budget_ns,
                        hist = ?total.iter().enumerate().filter(|(_, &n)| n > 0).map(|(i, &n)| (1u64 << i.saturating_sub(1), n)).collect::<Vec<_>>(),
                        "halt-poll governor"
                    );
                    if next != window {
                        if let Err(e) = set_window(&vm, next) {
                            tracing::warn!("halt-poll governor cannot set the window: {e}");
                            continue;
                        }
                        tracing::debug!(window = next, "halt-poll window");
                        window = next;
                        let t = started.elapsed().as_millis() as u64;
                        report2
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .changes
                            .push((t, window));
                    }
                    report2
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .final_window_ns = window;
                }
            },
        )?;
        Ok(Governor {
            stop,
            thread: Some(thread),
            report,
        })
    }

    /// What the governor has done so far.
    pub fn report(&self) -> GovernorReport {
        self.report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A way to read [`Governor::report`] from another thread.
    pub fn report_source(&self) -> impl Fn() -> GovernorReport + Send + Sync + 'static {
        let report = self.report.clone();
        move || report.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Stop the governor.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Governor {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wakeups_shift_by_the_window_polled() {
        let mut h = [0u64; 64];
        // 3 waits of ~[64, 128) us after polling 0: bucket of ~96 us.
        let mut wait = vec![0u64; 32];
        wait[17] = 3;
        add_period(&mut h, &[0; 32], &wait, 0);
        assert_eq!(h[bucket(96 << 10)], 3);
        // After polling 1 ms, the same waits mean wake-ups ~1.1 ms after halting.
        let mut h2 = [0u64; 64];
        add_period(&mut h2, &[0; 32], &wait, 1 << 20);
        assert_eq!(h2[bucket((1 << 20) + (96 << 10))], 3);
    }

    #[test]
    fn the_window_catches_what_the_budget_allows() {
        let mut h = [0u64; 64];
        h[bucket(50_000)] = 1000; // 1000 wake-ups at ~50 us
        h[bucket(50_000_000)] = 10; // 10 at ~50 ms (idle ticks)
                                    // A window of 64 us catches the 1000; the 10 waste 10 x 64 us = 0.64 ms.
        assert_eq!(choose_window(&h, 1e6, MAX_WINDOW_NS), 1 << 16);
        // With a budget below that, no polling at all.
        assert_eq!(choose_window(&h, 1e5, MAX_WINDOW_NS), 0);
        // An idle vCPU (only long sleeps): nothing to catch, no polling.
        let mut idle = [0u64; 64];
        idle[bucket(1_000_000_000)] = 5;
        assert_eq!(choose_window(&idle, 1e9, MAX_WINDOW_NS), 0);
        // The maximum is respected.
        assert!(choose_window(&h, 1e9, 1 << 14) <= 1 << 14);
        // A thin tail (1%) of later wake-ups does not stretch the window...
        let mut tail = h;
        tail[bucket(3_000_000)] = 10;
        assert_eq!(choose_window(&tail, 1e9, MAX_WINDOW_NS), 1 << 16);
        // ...but a larger share (5%) is worth catching if the budget allows.
        tail[bucket(3_000_000)] = 50;
        assert_eq!(choose_window(&tail, 1e9, MAX_WINDOW_NS), 1 << 22);
    }
}
