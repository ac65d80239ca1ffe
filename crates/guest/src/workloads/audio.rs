//! `audio`: the priority-boosting seed's audio test. A periodic real-time
//! task wakes every `buffer_ms` and must produce the next buffer (`work_us`
//! of computation) before the current one has played out; finishing late
//! is a glitch (an underrun). Periods missed by an overrun are skipped, as
//! a player would. `rt=1` (the default) marks the task real-time;
//! `background=N` adds N spinning tasks.

use hover_abi::exit_code;

use super::{Background, Context, Latency};
use crate::kernel::api::{
    now, println, set_realtime, sleep_until, ticks_per_sec, ticks_to_ns, Reports,
};

/// Iterations of [`work`] per microsecond, from the fastest of a few trials
/// (the slower ones lost the CPU meanwhile).
fn calibrate() -> u64 {
    const N: u64 = 200_000;
    let mut best = u64::MAX;
    for _ in 0..7 {
        let t = now();
        work(N);
        best = best.min(now() - t);
    }
    let ns = ticks_to_ns(best).max(1);
    (N * 1000 / ns).max(1)
}

/// A fixed amount of computation (the "mixing" of one buffer).
#[inline(never)]
fn work(iterations: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..iterations {
        x = core::hint::black_box(x.rotate_left(5) ^ i).wrapping_mul(0x2545_f491_4f6c_dd1d);
    }
    x
}

pub fn run(ctx: &Context) -> u32 {
    let buffer_ms = ctx.number("buffer_ms");
    let work_us = ctx.number("work_us");
    let seconds = ctx.number("seconds");
    let rt = ctx.number("rt") == 1;
    if work_us >= buffer_ms * 1000 {
        println!(
            "audio: work_us={} does not fit in a {} ms buffer even on an idle host",
            work_us, buffer_ms
        );
        return exit_code::WORKLOAD_FAILED;
    }
    let per_us = calibrate();
    let Some(background) = Background::start(ctx.number("background") as usize) else {
        return exit_code::WORKLOAD_FAILED;
    };
    let period = ticks_per_sec() * buffer_ms / 1000;
    let total = seconds * 1000 / buffer_ms;
    let (mut periods, mut glitches, mut skipped) = (0u64, 0u64, 0u64);
    let mut wake = Latency::new();
    let mut finish = Latency::new();
    set_realtime(rt);
    let mut start = now() + period;
    while periods + skipped < total {
        sleep_until(start);
        let woke = now();
        wake.add(woke.saturating_sub(start));
        work(work_us * per_us);
        let done = now();
        finish.add(done - start);
        periods += 1;
        let deadline = start + period;
        if done > deadline {
            glitches += 1;
            // The next buffer starts at the first period boundary after now.
            let missed = (done - deadline) / period + 1;
            skipped += missed - 1;
            start = deadline + missed * period - period;
        }
        start += period;
    }
    set_realtime(false);
    background.stop();
    let mut r = Reports::new();
    r.u64(format_args!("audio.buffer_ms"), buffer_ms);
    r.u64(format_args!("audio.work_us"), work_us);
    r.u64(format_args!("audio.rt"), rt as u64);
    r.u64(format_args!("audio.periods"), periods);
    r.u64(format_args!("audio.glitches"), glitches);
    r.u64(format_args!("audio.skipped"), skipped);
    wake.report(&mut r, "audio.wake", false);
    finish.report(&mut r, "audio.finish", false);
    r.send();
    println!(
        "audio: {} buffers of {} ms, {} glitches ({} periods skipped)",
        periods, buffer_ms, glitches, skipped
    );
    exit_code::OK
}
