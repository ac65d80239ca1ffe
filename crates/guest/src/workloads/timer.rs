//! `timer`: like cyclictest, a task sleeps to absolute deadlines every
//! `interval_us` and records how late it wakes (deadline -> task running).
//! With `rt=1` the task is real-time: its vCPU asks the monitor for a boost
//! while it runs and announces its next wake-up (vCPU priority boosting);
//! `background=N` adds N spinning tasks, the rest of a busy guest.

use hover_abi::exit_code;

use super::{Background, Context, Latency};
use crate::kernel::api::{now, println, set_realtime, sleep_until, ticks_per_sec, Reports};

pub fn run(ctx: &Context) -> u32 {
    let interval_us = ctx.number("interval_us");
    let seconds = ctx.number("seconds");
    let rt = ctx.number("rt") == 1;
    let Some(background) = Background::start(ctx.number("background") as usize) else {
        return exit_code::WORKLOAD_FAILED;
    };
    let interval = ticks_per_sec() * interval_us / 1_000_000;
    let samples = seconds * 1_000_000 / interval_us;
    let mut lat = Latency::new();
    set_realtime(rt);
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
    set_realtime(false);
    background.stop();
    let mut r = Reports::new();
    r.u64(format_args!("timer.interval_us"), interval_us);
    r.u64(format_args!("timer.rt"), rt as u64);
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
