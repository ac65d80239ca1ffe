//! `critical`: a test of vCPU priority boosting. `count` times, a task
//! enters a critical section (the CRITICAL request bit), spins `hold_us`
//! in it while watching the monitor's status bits, leaves, and sleeps
//! `gap_us`. `hold_us=0 gap_us=0` flips the bit as fast as it can (a rogue
//! guest); a long hold asks for a boost "forever". `seconds` (0: none)
//! ends the run early. Reports how many sections ran and saw the vCPU
//! boosted and throttled.

use hover_abi::boost::status;
use hover_abi::exit_code;

use crate::kernel::api::{
    boost_status, critical_begin, critical_end, now, println, sleep_until, ticks_per_sec, Reports,
};

use super::Context;

pub fn run(ctx: &Context) -> u32 {
    let count = ctx.number("count");
    let hold = ticks_per_sec() * ctx.number("hold_us") / 1_000_000;
    let gap = ticks_per_sec() * ctx.number("gap_us") / 1_000_000;
    let seconds = ctx.number("seconds");
    let stop = (seconds > 0).then(|| now() + seconds * ticks_per_sec());
    let (mut boosted, mut throttled, mut sections) = (0u64, 0u64, 0u64);
    for _ in 0..count {
        critical_begin();
        let end = match stop {
            Some(stop) => (now() + hold).min(stop),
            None => now() + hold,
        };
        let mut seen = 0;
        loop {
            seen |= boost_status();
            if now() >= end {
                break;
            }
        }
        critical_end();
        seen |= boost_status();
        boosted += (seen & status::BOOSTED != 0) as u64;
        throttled += (seen & status::THROTTLED != 0) as u64;
        sections += 1;
        if stop.is_some_and(|stop| now() >= stop) {
            break;
        }
        if gap > 0 {
            sleep_until(now() + gap);
        }
    }
    let mut r = Reports::new();
    r.u64(format_args!("critical.sections"), sections);
    r.u64(format_args!("critical.boosted"), boosted);
    r.u64(format_args!("critical.throttled"), throttled);
    r.send();
    println!(
        "critical: {} sections, {} saw a boost, {} saw the throttle",
        sections, boosted, throttled
    );
    exit_code::OK
}
