//! The monitor thread: reads every registered boost area each poll period
//! (and wakes early for an announced real-time wake-up), boosts the vCPUs
//! that ask, revokes boosts that ran past the CPU-time limit, and ends the
//! host-side boosts of vCPUs without an area (`host.rs`) as they halt.
//!
//! It runs one step above the boosted vCPUs (`BoostPolicy::for_monitor`):
//! a monitor that waited behind the host load it works against would boost
//! late.

use crate::sync::{wait_timeout, Locked};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::decide::{schedstat_wait_ns, stat_state, Contention};
use super::tuning::host_tsc;
use super::{policy, BoostWhen, Booster, Source, TIMER_LEAD};

/// A running monitor thread.
pub(super) struct Monitor {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: JoinHandle<()>,
}

/// Wakes the monitor to read the areas now (a guest's new `wake_at` may be
/// due before the monitor's next poll).
#[derive(Clone)]
pub(super) struct Nudge(Arc<(Mutex<bool>, Condvar)>);

impl Nudge {
    pub(super) fn nudge(&self) {
        self.0 .1.notify_all();
    }
}

impl Monitor {
    pub(super) fn start(booster: Arc<Booster>) -> std::io::Result<Monitor> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let thread = crate::seccomp::spawn(
            crate::seccomp::Kind::Boost,
            "boost-monitor".into(),
            move || run(&booster, &flag),
        )?;
        Ok(Monitor { stop, thread })
    }

    pub(super) fn nudge(&self) -> Nudge {
        Nudge(self.stop.clone())
    }

    pub(super) fn stop(self) {
        *self.stop.0.locked() = true;
        self.stop.1.notify_all();
        let _ = self.thread.join();
    }
}

/// What the monitor learned of one vCPU's announced wake-ups.
#[derive(Clone, Copy, Default)]
struct Track {
    /// The last non-zero `wake_at` seen.
    seen: u64,
    /// Ticks between the last two distinct ones (0: unknown).
    period: u64,
}

impl Track {
    /// Longest period taken as periodic: one second at up to 10 GHz.
    const MAX_PERIOD: u64 = 10_000_000_000;

    fn saw(&mut self, wake_at: u64) {
        if wake_at == 0 || wake_at == self.seen {
            return;
        }
        self.period = match wake_at.checked_sub(self.seen) {
            Some(p) if self.seen != 0 && p < Self::MAX_PERIOD => p,
            _ => 0,
        };
        self.seen = wake_at;
    }

    /// The wake-up after the last one seen, if the task looks periodic.
    fn expected(&self) -> Option<u64> {
        (self.period != 0).then(|| self.seen + self.period)
    }
}

fn run(b: &Booster, stop: &(Mutex<bool>, Condvar)) {
    let me = policy::gettid();
    let config = b.config();
    let mine = config.policy.for_monitor();
    if let Err(e) = policy::apply(me, mine) {
        tracing::warn!(
            "the boost monitor runs at normal priority ({e}): boosts may come late under load"
        );
    }
    // Timer slack delays a normal thread's wake-ups by 50 us; a wake-up
    // 100 us before a deadline needs better.
    // SAFETY: prctl(PR_SET_TIMERSLACK) only changes this thread's slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0, 0, 0) };
    let poll = Duration::from_micros(config.poll_us);
    let max_cpu_ns = config.max_ms * 1_000_000;
    let mut tracks = vec![Track::default(); b.slots.len()];
    let mut waits: Vec<Wait> = (0..b.slots.len()).map(|_| Wait::default()).collect();
    let mut stats: Vec<ThreadFile> = (0..b.slots.len())
        .map(|_| ThreadFile::new("stat"))
        .collect();
    let mut warned = false;
    let mut guard = stop.0.locked();
    while !*guard {
        // Read each pass: an arriving VM's rate is set once its state is in.
        let lead_ticks = TIMER_LEAD.as_micros() as u64 * b.tsc_khz() / 1000;
        let now = Instant::now();
        let mut next = now + poll;
        let tuning = b.tuning();
        let contended_only = tuning.when == BoostWhen::Contended;
        for (v, track) in tracks.iter_mut().enumerate() {
            if contended_only {
                b.set_contended(v, waits[v].contended(b, v, &mut warned));
            }
            let Some(gpa) = b.area(v) else {
                // No area: the host's own boosts, which it ends.
                if b.is_boosted(v) {
                    check_host_boost(b, v, &mut stats[v]);
                }
                continue;
            };
            let wake_at = b.read_wake_at(gpa);
            let tsc = host_tsc();
            track.saw(wake_at);
            // An unboost the guest made without a call.
            b.quiet_unboost(v, gpa);
            if b.is_boosted(v) {
                check_held(b, v, max_cpu_ns);
                b.expire_kept(v, gpa, tsc);
            } else if b.requested(v, gpa) != 0 {
                b.boost(v, Source::Request);
            } else if wake_at != 0 && wake_at <= tsc + lead_ticks {
                b.boost(v, Source::Timer);
                if wake_at < tsc {
                    b.lock(v).stats.late_timer_boosts += 1;
                }
            }
            let until =
                |t: u64| now + Duration::from_micros(t.saturating_sub(tsc) * 1000 / b.tsc_khz());
            if wake_at > tsc + lead_ticks {
                next = next.min(until(wake_at - lead_ticks));
            }
            // The guest announces its next wake-up as its real-time task
            // goes back to sleep, which the monitor does not see unless it
            // then makes the unboost call. A periodic task's next wake-up
            // is predictable: look again just before it.
            if let Some(expected) = track.expected() {
                if expected > tsc + lead_ticks {
                    next = next.min(until(expected - lead_ticks));
                }
            }
            // A quiet unboost nudges no one, and its boost runs on until
            // the monitor decides: look within a quarter of the CPU-time
            // limit, so a boost the decision will not keep has used at most
            // that much more (a kept one still ends well before the throttle).
            // Whether or not one is boosted now: boosts granted between
            // passes (interrupts, exits) do not wake the monitor.
            if tuning.keep_us != 0 {
                next = next.min(now + Duration::from_nanos(max_cpu_ns / 4));
            }
        }
        let wait = next.saturating_duration_since(Instant::now());
        guard = wait_timeout(&stop.1, guard, wait).0;
    }
}

/// One of a vCPU thread's `/proc/self/task/TID/` files, opened once per
/// thread id and read again at offset 0 each time.
struct ThreadFile {
    name: &'static str,
    /// The thread id and its file (`None`: it could not be read; not
    /// tried again for that thread).
    file: Option<(i32, Option<File>)>,
}

impl ThreadFile {
    fn new(name: &'static str) -> Self {
        ThreadFile { name, file: None }
    }

    /// The file's text for thread `tid` (`None`: unreadable); whether the
    /// thread is a new one is the second value.
    fn read(&mut self, tid: i32) -> (Option<String>, bool) {
        let fresh = self.file.as_ref().is_none_or(|(t, _)| *t != tid);
        if fresh {
            let f = File::open(format!("/proc/self/task/{tid}/{}", self.name));
            self.file = Some((tid, f.ok()));
        }
        let text = match &self.file {
            Some((_, Some(f))) => {
                let mut buf = [0u8; 256];
                f.read_at(&mut buf, 0)
                    .ok()
                    .and_then(|n| std::str::from_utf8(&buf[..n]).ok().map(str::to_owned))
            }
            _ => None,
        };
        if text.is_none() {
            if let Some((_, f)) = self.file.as_mut() {
                *f = None;
            }
        }
        (text, fresh)
    }
}

/// One vCPU thread's run-queue wait, read each pass.
struct Wait {
    schedstat: ThreadFile,
    contention: Contention,
}

impl Default for Wait {
    fn default() -> Self {
        Wait {
            schedstat: ThreadFile::new("schedstat"),
            contention: Contention::default(),
        }
    }
}

impl Wait {
    /// Whether vCPU `v`'s thread lately waited for a CPU (false while it
    /// cannot be read: then no boost is granted under `contended`, and the
    /// first such thread is logged).
    fn contended(&mut self, b: &Booster, v: usize, warned: &mut bool) -> bool {
        let Some(tid) = b.tid(v) else {
            return false;
        };
        let (text, fresh) = self.schedstat.read(tid);
        if fresh {
            self.contention = Contention::default();
        }
        match text.as_deref().and_then(schedstat_wait_ns) {
            Some(w) => self.contention.saw(Instant::now(), w, b.boosted_since(v)),
            None => {
                if !std::mem::replace(warned, true) {
                    tracing::warn!(
                        vcpu = v,
                        "--boost-when contended: no run-queue wait can be read for the vCPU thread (schedstat); no boost is granted to it"
                    );
                }
                false
            }
        }
    }
}

/// End vCPU `v`'s host-side boost if its thread sleeps (it halted) or ran
/// its CPU budget (`stat`: the thread's `/proc` stat file).
fn check_host_boost(b: &Booster, v: usize, stat: &mut ThreadFile) {
    let Some(tid) = b.tid(v) else { return };
    let state = stat.read(tid).0.as_deref().and_then(stat_state);
    b.settle_host_boost(v, state);
}

/// Revoke vCPU `v`'s boost if its thread has run `max_cpu_ns` since it began.
fn check_held(b: &Booster, v: usize, max_cpu_ns: u64) {
    let (tid, cpu0) = {
        let s = b.lock(v);
        match (s.tid, s.since) {
            (Some(t), Some((_, c))) => (t, c),
            _ => return,
        }
    };
    if let Ok(cpu) = policy::thread_cpu_ns(tid) {
        if cpu.saturating_sub(cpu0) > max_cpu_ns {
            let why = format!(
                "its thread ran {:.1} ms of CPU time boosted, past --boost-max-ms",
                cpu.saturating_sub(cpu0) as f64 / 1e6
            );
            b.throttle(v, &why);
        }
    }
}
