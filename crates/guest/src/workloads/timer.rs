//! `timer`: like cyclictest, a task sleeps to absolute deadlines every
//! `interval_us` and records how late it wakes (deadline -> task running).

use hover_abi::exit_code;

use super::{Context, Latency};
use crate::kernel::{now, sleep_until, ticks_per_sec, Reports};
use crate::println;

pub fn run(ctx: &Context) -> u32 {
    let interval_us = ctx.number("interval_us");
    let seconds = ctx.number("seconds");
    let interval = ticks_per_sec() * interval_us / 1_000_000;
    let samples = seconds * 1_000_000 / interval_us;
    let mut lat = Latency::new();
    let mut deadline = now() + interval;
    for _ in 0..samples {
        sleep_until(deadline);
        let woke = now();
        lat.add(woke.saturating_sub(deadline));
        deadline += interval;
        // After an overrun, keep the period but do not queue up missed deadlines.
        if deadline < woke {
            deadline = woke + interval;
        }
    }
    let mut r = Reports::new();
    r.u64(format_args!("timer.interval_us"), interval_us);
    lat.report(&mut r, "timer", true);
    r.send();
    println!(
        "timer: {} wake-ups every {} us, average latency {} ns",
        lat.n,
        interval_us,
        lat.avg_ns()
    );
    exit_code::OK
}
