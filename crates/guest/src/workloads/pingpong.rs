//! `pingpong`: two tasks, on vCPU 0 and on the last vCPU, wake each other
//! through events `rounds` times. Each round trip is two cross-vCPU wake-ups
//! (an IPI when the other vCPU is halted); reports the mean round trip.

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{now, println, ticks_to_ns, Event, Placement, Reports};

static PING: Event = Event::new();
static PONG: Event = Event::new();
static ROUNDS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

fn player(i: usize) {
    let rounds = ROUNDS.load(core::sync::atomic::Ordering::Relaxed);
    for _ in 0..rounds {
        if i == 0 {
            PING.signal();
            PONG.wait();
        } else {
            PING.wait();
            PONG.signal();
        }
    }
}

pub fn run(ctx: &Context) -> u32 {
    let rounds = ctx.number("rounds");
    ROUNDS.store(rounds, core::sync::atomic::Ordering::Relaxed);
    let last = ctx.vcpus() - 1;
    let start = now();
    let Some(ids) = spawn_all(2, player, |i| {
        Placement::Pinned(if i == 0 { 0 } else { last })
    }) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..2]);
    let ns = ticks_to_ns(now() - start) / rounds;
    let mut r = Reports::new();
    r.u64(format_args!("pingpong.rounds"), rounds);
    r.u64(format_args!("pingpong.ns_per_round"), ns);
    r.send();
    println!(
        "pingpong: {} rounds between vCPU 0 and vCPU {}, {} ns per round trip",
        rounds, last, ns
    );
    exit_code::OK
}
