//! A host-only experiment for #10 (no KVM, no guest): how late a periodic
//! thread (1 ms period, 3000 periods) wakes with two CPU hogs pinned one per
//! CPU, when it is: a normal thread; SCHED_FIFO all the time ("static");
//! raised to SCHED_FIFO by another thread 100 us before each wake-up and
//! lowered by itself after ("boosted-while-asleep", what Hover's boost
//! monitor does for an announced wake-up); or raising itself before each
//! sleep and lowering itself after ("self-boost-before-sleep"). For each,
//! the periods more than 1 ms late are split into "already past the
//! deadline before sleeping" (the thread, back at normal priority after
//! its unboost, lost the CPU to a hog and was not raised again in time)
//! and "late waking". The next wake-up is announced before the thread
//! lowers itself, as Hover's guest announces it before its unboost call.
//!
//! Run: `cargo run --release -p hover-bench --example wakeup_after_boost`
//! (as root: it sets SCHED_FIFO). Findings: docs/BENCHMARKS.md, boosting.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hover_bench::hostload::{now_ns, sleep_until_ns, Hogs};

static MISSED_AWAKE: AtomicU64 = AtomicU64::new(0);
static LATE_WAKE: AtomicU64 = AtomicU64::new(0);
fn set_fifo(tid: i32, on: bool) {
    let p = libc::sched_param {
        sched_priority: if on { 10 } else { 0 },
    };
    let pol = if on {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_OTHER
    };
    unsafe { libc::sched_setscheduler(tid, pol, &p) };
}
// mode 0: normal; 1: static FIFO; 2: boosted by another thread 100 us before each wake-up (while asleep); 3: boosts itself before each sleep
fn run(mode: u32, periods: u32) -> (u64, u64) {
    let tid = Arc::new(AtomicI32::new(0));
    let next = Arc::new(AtomicU64::new(0));
    let t2 = tid.clone();
    let n2 = next.clone();
    let h = std::thread::spawn(move || {
        t2.store(unsafe { libc::gettid() }, Ordering::SeqCst);
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0, 0, 0) };
        if mode == 1 {
            set_fifo(0, true);
        }
        let (mut sum, mut max) = (0u64, 0u64);
        let mut t = now_ns() + 1_000_000;
        n2.store(t, Ordering::SeqCst);
        for _ in 0..periods {
            if mode == 3 {
                set_fifo(0, true);
            }
            let before = now_ns();
            sleep_until_ns(t);
            let late = now_ns().saturating_sub(t);
            if late > 1_000_000 {
                if before > t {
                    MISSED_AWAKE.fetch_add(1, Ordering::Relaxed);
                } else {
                    LATE_WAKE.fetch_add(1, Ordering::Relaxed);
                }
            }
            sum += late;
            max = max.max(late);
            t += 1_000_000;
            // As Hover's guest does: the next wake-up is announced before
            // the unboost, so the booster can reach a thread that loses
            // the CPU right as it is lowered.
            n2.store(t, Ordering::SeqCst);
            if mode == 2 || mode == 3 {
                set_fifo(0, false);
            }
        }
        n2.store(u64::MAX, Ordering::SeqCst);
        (sum / periods as u64, max)
    });
    if mode == 2 {
        // The booster runs one step above the thread it boosts.
        let p = libc::sched_param { sched_priority: 11 };
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) };
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64, 0, 0, 0) };
        while tid.load(Ordering::SeqCst) == 0 {}
        let tid = tid.load(Ordering::SeqCst);
        let mut boosted_for = 0;
        loop {
            let t = next.load(Ordering::SeqCst);
            if t == u64::MAX {
                break;
            }
            if t != boosted_for {
                let at = t.saturating_sub(100_000);
                sleep_until_ns(at);
                set_fifo(tid, true);
                boosted_for = t;
            } else {
                // Sleep past the wake-up so the booster is not on a CPU then.
                let at = t + 300_000;
                sleep_until_ns(at);
            }
        }
        let p = libc::sched_param { sched_priority: 0 };
        unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &p) };
    }
    h.join().unwrap()
}
fn main() {
    // Two spinning threads pinned one per CPU, as `hover bench boost` loads
    // the host; the limit outlasts the 12 runs.
    let hogs = Hogs::start(2, Duration::from_secs(600));
    let t0 = Instant::now();
    for round in 0..3 {
        for mode in [0, 1, 2, 3] {
            let (avg, max) = run(mode, 3000);
            let (m, l) = (
                MISSED_AWAKE.swap(0, Ordering::Relaxed),
                LATE_WAKE.swap(0, Ordering::Relaxed),
            );
            println!("  >1ms late: {m} already past the deadline before sleeping, {l} late waking");
            println!(
                "round {round} mode {} avg {} us max {} us",
                [
                    "normal",
                    "static fifo",
                    "boosted-while-asleep",
                    "self-boost-before-sleep"
                ][mode as usize],
                avg / 1000,
                max / 1000
            );
        }
    }
    hogs.stop();
    eprintln!("{:?}", t0.elapsed());
}
