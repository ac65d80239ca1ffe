//! `hello`: every vCPU prints a greeting; vCPU 0 waits for all of them and
//! reports how many it saw and the TSC at its own first instruction.

use core::sync::atomic::{AtomicU32, Ordering};

use hover_abi::control::Report;
use hover_abi::exit_code;

use super::{idle, Context};
use crate::{apic, clock, control, println};

/// How long vCPU 0 waits for the others before giving up.
const WAIT_US: u64 = 5_000_000;

static SEEN: AtomicU32 = AtomicU32::new(0);

pub fn run(ctx: Context) -> ! {
    let vcpus = ctx.boot.vcpu_count;
    println!(
        "hello from vCPU {} of {} (x2APIC id {})",
        ctx.cpu,
        vcpus,
        apic::id()
    );
    SEEN.fetch_add(1, Ordering::AcqRel);
    if ctx.cpu != 0 {
        idle();
    }
    let deadline = clock::deadline_after_us(WAIT_US);
    while SEEN.load(Ordering::Acquire) < vcpus && clock::now() < deadline {
        core::hint::spin_loop();
    }
    let seen = SEEN.load(Ordering::Acquire);
    control::report(&[
        Report::u64("vcpus_seen", seen as u64),
        Report::u64("boot_tsc", ctx.boot_tsc),
    ]);
    if seen == vcpus {
        println!("hello: all {} vCPUs checked in", seen);
        control::exit(exit_code::OK)
    } else {
        println!(
            "hello: only {} of {} vCPUs checked in within {} ms",
            seen,
            vcpus,
            WAIT_US / 1000
        );
        control::exit(exit_code::WORKLOAD_FAILED)
    }
}
