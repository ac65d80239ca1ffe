//! Host-side load and a host-side latency probe, started by a scenario
//! itself so that "busy host" means the same thing on every machine:
//! - [`Hogs`]: spinning threads at normal priority, one pinned per CPU in
//!   turn, stopped by the scenario and at the latest after a deadline;
//! - [`Probe`]: a cyclictest-like thread at normal priority sleeping to
//!   absolute deadlines and recording how late it wakes, so that what a
//!   configuration costs the host's own work is measured, not assumed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

/// CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity only touch it and this thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Spinning threads.
pub struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Hogs {
    /// `n` threads, thread `i` pinned to CPU `i % cpus()`, each spinning
    /// until [`Hogs::stop`] or for at most `limit`.
    pub fn start(n: usize, limit: Duration) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let stop = stop.clone();
                std::thread::Builder::new()
                    .name(format!("hog{i}"))
                    .spawn(move || {
                        pin_to(i % cpus());
                        let end = Instant::now() + limit;
                        let mut x = 0u64;
                        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                            for _ in 0..10_000 {
                                x = std::hint::black_box(x.wrapping_add(1));
                            }
                        }
                    })
                    .expect("a hog thread starts")
            })
            .collect();
        Hogs { stop, threads }
    }

    /// Stop and join them.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// What the probe measured.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct ProbeResult {
    /// Wake-ups.
    pub samples: u64,
    /// Mean lateness, microseconds.
    pub avg_us: f64,
    /// Worst lateness, microseconds.
    pub max_us: f64,
}

/// A thread waking every `interval` at normal priority.
pub struct Probe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<ProbeResult>,
}

/// Sleep until the monotonic clock reads `t` ns (an absolute deadline, so
/// time spent before the call does not push the wake-up later).
pub fn sleep_until_ns(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: an absolute sleep on the monotonic clock; no remainder asked.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

/// The monotonic clock, nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Probe {
    /// Start waking every `interval`.
    pub fn start(interval: Duration) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("host-probe".into())
            .spawn(move || {
                let step = interval.as_nanos() as u64;
                let (mut n, mut sum, mut max) = (0u64, 0u64, 0u64);
                let mut next = now_ns() + step;
                // At least one wake-up, however soon it is stopped.
                loop {
                    sleep_until_ns(next);
                    let late = now_ns().saturating_sub(next);
                    n += 1;
                    sum += late;
                    max = max.max(late);
                    next += step;
                    // Like cyclictest: after an overrun, the next period.
                    let now = now_ns();
                    if next < now {
                        next = now + step;
                    }
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                }
                ProbeResult {
                    samples: n,
                    avg_us: if n == 0 {
                        0.0
                    } else {
                        sum as f64 / n as f64 / 1000.0
                    },
                    max_us: max as f64 / 1000.0,
                }
            })
            .expect("the probe thread starts");
        Probe { stop, thread }
    }

    /// Stop it: what it measured.
    pub fn stop(self) -> ProbeResult {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_counts_its_wake_ups_and_hogs_stop() {
        let hogs = Hogs::start(1, Duration::from_secs(5));
        let p = Probe::start(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(50));
        let r = p.stop();
        hogs.stop();
        assert!(r.samples >= 1, "{r:?}");
        assert!(r.max_us >= r.avg_us);
    }
}
