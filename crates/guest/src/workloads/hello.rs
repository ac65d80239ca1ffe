//! `hello`: a task pinned to every vCPU prints a greeting; the main task
//! joins them and reports how many ran and the TSC at vCPU 0's first instruction.

use core::sync::atomic::{AtomicU32, Ordering};

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{apic_id, cpu_index, println, Placement, Reports};

static SEEN: AtomicU32 = AtomicU32::new(0);

fn greet(i: usize) {
    let cpu = cpu_index();
    println!(
        "hello from vCPU {} of {} (x2APIC id {})",
        cpu,
        VCPUS.load(Ordering::Relaxed),
        apic_id()
    );
    debug_assert_eq!(i, cpu);
    SEEN.fetch_add(1, Ordering::AcqRel);
}

static VCPUS: AtomicU32 = AtomicU32::new(0);

pub fn run(ctx: &Context) -> u32 {
    let vcpus = ctx.vcpus();
    VCPUS.store(vcpus as u32, Ordering::Relaxed);
    let Some(ids) = spawn_all(vcpus, greet, Placement::Pinned) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..vcpus]);
    let seen = SEEN.load(Ordering::Acquire);
    let mut r = Reports::new();
    r.u64(format_args!("vcpus_seen"), seen as u64);
    r.send();
    if seen as usize == vcpus {
        println!("hello: all {} vCPUs checked in", seen);
        exit_code::OK
    } else {
        println!("hello: only {} of {} vCPUs checked in", seen, vcpus);
        exit_code::WORKLOAD_FAILED
    }
}
