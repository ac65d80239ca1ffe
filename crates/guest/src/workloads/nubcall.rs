//! `nubcall`: the cost of one trip through the privileged nub (`int3` from
//! CPL3, an emulated RDMSR of the x2APIC id at CPL0, `iretq`).

use hover_abi::exit_code;

use super::Context;
use crate::kernel::api::{apic_id, now, println, ticks_to_ns, Reports};

pub fn run(ctx: &Context) -> u32 {
    let count = ctx.number("count");
    let start = now();
    for _ in 0..count {
        core::hint::black_box(apic_id());
    }
    let ns = ticks_to_ns(now() - start) / count;
    let mut r = Reports::new();
    r.u64(format_args!("nubcall.count"), count);
    r.u64(format_args!("nubcall.ns_per_trip"), ns);
    r.send();
    println!("nubcall: {} trips, {} ns per trip", count, ns);
    exit_code::OK
}
