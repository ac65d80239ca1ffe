//! The governor thread: every [`PERIOD`] it reads the vCPUs' KVM histograms
//! (and, when the guest polls, its areas), rebuilds the wake-up
//! distribution ([`super::model`]) and sets the VM's window.

use crate::sync::Locked;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;

use kvm_ioctls::VmFd;
use serde::Serialize;
use vm_memory::GuestMemoryMmap;

use super::model::{add_period, choose_window, WakeHist};
use super::{set_window, HISTORY, MAX_WINDOW_NS, PERIOD};
use crate::sched::guest_poll;
use crate::stats::KvmStats;

/// What the governor did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GovernorReport {
    /// Budget, percent of a CPU per vCPU.
    pub budget_pct: f64,
    /// The starting window and every change after it: (milliseconds
    /// since start, window in ns).
    pub changes: Vec<(u64, u64)>,
    /// The window at the end.
    pub final_window_ns: u64,
    /// Periods whose history held wake-ups, each one a decision (the
    /// window set again, changed or not).
    pub decisions: u64,
    /// The guest's own poll windows, per vCPU, at the last look (empty: the
    /// guest does not poll).
    pub guest_window_ns: Vec<u64>,
    /// What the guest's failed polls cost over the last second, percent
    /// of a CPU per vCPU: taken out of the budget before KVM's window is
    /// sized.
    pub guest_poll_cost_pct: f64,
}

/// The running governor.
pub struct Governor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    report: Arc<Mutex<GovernorReport>>,
}

/// The last reading of one vCPU's histograms.
#[derive(Clone, Default)]
struct Seen {
    success: Vec<u64>,
    wait: Vec<u64>,
    fail: Option<Vec<u64>>,
}

fn delta(now: &[u64], then: &[u64]) -> Vec<u64> {
    now.iter()
        .zip(then)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect()
}

/// One period's wake-up histogram of all vCPUs, from their KVM statistics
/// (`seen` holds the previous readings).
fn read_period(stats: &[KvmStats], seen: &mut [Option<Seen>], window: u64) -> WakeHist {
    let mut hist = [0f64; 64];
    for (s, last) in stats.iter().zip(seen.iter_mut()) {
        let Ok(snap) = s.read() else { continue };
        let (Some(success), Some(wait)) = (
            snap.histogram("halt_poll_success_hist"),
            snap.histogram("halt_wait_hist"),
        ) else {
            continue;
        };
        let fail = snap.histogram("halt_poll_fail_hist");
        if let Some(prev) = last.as_ref() {
            let fail_delta = match (fail, &prev.fail) {
                (Some(f), Some(pf)) => Some(delta(f, pf)),
                _ => None,
            };
            add_period(
                &mut hist,
                &delta(success, &prev.success),
                &delta(wait, &prev.wait),
                fail_delta.as_deref(),
                window,
            );
        }
        *last = Some(Seen {
            success: success.to_vec(),
            wait: wait.to_vec(),
            fail: fail.map(<[u64]>::to_vec),
        });
    }
    hist
}

/// Wake-ups the history must hold before the window may grow: a choice
/// made on a handful (the first period of a run, the guest's boot, can
/// hold that few) swings with each late one, and a larger window costs CPU
/// at every later halt until the history outweighs it.
const EVIDENCE: f64 = 32.0;

/// The next window from the history's wake-ups, and whether they were
/// judged at all. None (vCPUs running, or each in one long halt): nothing
/// to judge a window by, keep it. Few: the window may shrink (an idle
/// guest's rare long wake-ups close it) but not grow.
fn decide(total: &WakeHist, budget_ns: f64, window: u64) -> (u64, bool) {
    let n: f64 = total.iter().sum();
    if n == 0.0 {
        return (window, false);
    }
    let chosen = choose_window(total, budget_ns, MAX_WINDOW_NS);
    if n < EVIDENCE {
        (chosen.min(window), true)
    } else {
        (chosen, true)
    }
}

/// Nanoseconds the guest spent in polls that found nothing since `prev`:
/// each failed poll ran its vCPU's whole window.
fn guest_failed_ns(now: &guest_poll::GuestPoll, prev: &guest_poll::GuestPoll) -> f64 {
    now.vcpus
        .iter()
        .zip(&prev.vcpus)
        .map(|(n, p)| {
            let fails = n
                .polls
                .saturating_sub(p.polls)
                .saturating_sub(n.hits.saturating_sub(p.hits));
            fails as f64 * n.window_ns as f64
        })
        .sum()
}

impl Governor {
    /// Start governing `vm`, whose vCPUs' statistics are `stats`; with
    /// `guest`, the VM's memory, whose halt-poll areas it reads. The window
    /// is `first_ns` until the first period with wake-ups is in: KVM's
    /// default window is what the VM would have polled for without a
    /// governor, so starting there costs nothing against it (started with
    /// polling off, a VM waited 100-200 ms, until the first decision, with
    /// no polling at all).
    pub fn start(
        vm: Arc<VmFd>,
        stats: Vec<KvmStats>,
        budget_pct: f64,
        first_ns: u64,
        guest: Option<GuestMemoryMmap>,
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
                let lock = || report2.locked();
                let started = Instant::now();
                let mut window = first_ns.min(MAX_WINDOW_NS);
                if let Err(e) = set_window(&vm, window) {
                    tracing::warn!("halt-poll governor cannot set the window: {e}");
                    return;
                }
                {
                    let mut r = lock();
                    r.changes.push((0, window));
                    r.final_window_ns = window;
                }
                let vcpus = stats.len() as u32;
                let warned = AtomicBool::new(false);
                let mut guest_prev = guest.as_ref().map(|m| guest_poll::read(m, vcpus, &warned));
                let mut seen: Vec<Option<Seen>> = vec![None; stats.len()];
                // The first readings are the baseline the first period is
                // measured from (without it, that period would be empty).
                read_period(&stats, &mut seen, window);
                let mut periods: VecDeque<(WakeHist, f64)> = VecDeque::new();
                while !stop2.load(Ordering::Acquire) {
                    thread::sleep(PERIOD);
                    let hist = read_period(&stats, &mut seen, window);
                    let mut guest_windows = Vec::new();
                    let mut guest_ns = 0.0;
                    if let (Some(m), Some(prev)) = (guest.as_ref(), guest_prev.as_mut()) {
                        let now = guest_poll::read(m, vcpus, &warned);
                        guest_ns = guest_failed_ns(&now, prev);
                        if now.max_ns > 0 {
                            guest_windows = now.vcpus.iter().map(|v| v.window_ns).collect();
                        }
                        *prev = now;
                    }
                    periods.push_back((hist, guest_ns));
                    if periods.len() > HISTORY {
                        periods.pop_front();
                    }
                    let mut total = [0f64; 64];
                    let mut guest_total = 0.0;
                    for (p, g) in &periods {
                        for (t, v) in total.iter_mut().zip(p) {
                            *t += v;
                        }
                        guest_total += g;
                    }
                    let span_ns =
                        (PERIOD * periods.len() as u32).as_nanos() as f64 * stats.len() as f64;
                    let budget_ns = budget_pct / 100.0 * span_ns;
                    // KVM's window gets what the guest's polling left.
                    let kvm_budget = (budget_ns - guest_total).max(0.0);
                    let (next, judged) = decide(&total, kvm_budget, window);
                    tracing::trace!(window, next, budget_ns, kvm_budget, "halt-poll governor");
                    if next != window {
                        if let Err(e) = set_window(&vm, next) {
                            tracing::warn!("halt-poll governor cannot set the window: {e}");
                            continue;
                        }
                        tracing::debug!(window = next, "halt-poll window");
                        window = next;
                        let t = started.elapsed().as_millis() as u64;
                        lock().changes.push((t, window));
                    }
                    let mut r = lock();
                    r.decisions += u64::from(judged);
                    r.final_window_ns = window;
                    r.guest_window_ns = guest_windows;
                    r.guest_poll_cost_pct = if span_ns > 0.0 {
                        100.0 * guest_total / span_ns
                    } else {
                        0.0
                    };
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
        self.report.locked().clone()
    }

    /// A way to read [`Governor::report`] from another thread.
    pub fn report_source(&self) -> impl Fn() -> GovernorReport + Send + Sync + 'static {
        let report = self.report.clone();
        move || report.locked().clone()
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
    use guest_poll::{GuestPoll, GuestPollVcpu};

    #[test]
    fn only_failed_guest_polls_count_against_the_budget() {
        let v = |polls, hits, window_ns| GuestPollVcpu {
            window_ns,
            polls,
            hits,
            irqs_skipped: 0,
        };
        let prev = GuestPoll {
            max_ns: 200_000,
            vcpus: vec![v(10, 10, 0), v(5, 0, 0)],
        };
        // vCPU 0: 100 polls, all hits; vCPU 1: 4 polls of 50 us, none hit.
        let now = GuestPoll {
            max_ns: 200_000,
            vcpus: vec![v(110, 110, 200_000), v(9, 0, 50_000)],
        };
        assert_eq!(guest_failed_ns(&now, &prev), 4.0 * 50_000.0);
    }

    #[test]
    fn few_wakeups_may_close_the_window_but_not_grow_it() {
        let budget = 1e9;
        // Nothing halted and woke: the window stays, and nothing is judged.
        assert_eq!(decide(&[0.0; 64], budget, 200_000), (200_000, false));
        // A handful of wake-ups at ~1 ms: not evidence enough to grow.
        let mut few = [0f64; 64];
        few[super::super::model::bucket(1_000_000)] = 5.0;
        assert_eq!(decide(&few, budget, 200_000), (200_000, true));
        // The same share over many wake-ups grows it.
        let mut many = few;
        many[super::super::model::bucket(1_000_000)] = 500.0;
        assert_eq!(decide(&many, budget, 200_000), (1 << 20, true));
        // A handful of long sleeps (an idle guest's timer) closes it.
        let mut idle = [0f64; 64];
        idle[super::super::model::bucket(200_000_000)] = 5.0;
        assert_eq!(decide(&idle, budget, 200_000), (0, true));
    }
}
