//! `irq`: the main task asks the monitor for an MSI on its own vCPU after
//! `delay_us`, then waits for it; repeated `count` times. Latency: from the
//! request to the task running again, less the requested delay (so it
//! includes the request's own exit, the injection and the wake-up).

use hover_abi::{exit_code, vectors};

use super::{Context, Latency};
use crate::kernel::api::{
    cpu_index, inject_msi, irq_count, now, println, ticks_per_sec, wait_irq, Reports,
};

pub fn run(ctx: &Context) -> u32 {
    let count = ctx.number("count");
    let delay_us = ctx.number("delay_us");
    let cpu = cpu_index();
    let vector = vectors::DEVICE_BASE;
    let delay_ticks = ticks_per_sec() * delay_us / 1_000_000;
    let mut lat = Latency::new();
    for _ in 0..count {
        let t0 = now();
        let status = inject_msi(vector, cpu, delay_us * 1000);
        if status == hover_abi::control::status::UNAVAILABLE {
            println!("irq: skipped: this platform cannot inject MSIs on request (no control port)");
            return exit_code::UNAVAILABLE;
        }
        if status != hover_abi::control::status::OK {
            println!(
                "irq: the monitor refused the MSI request (status {})",
                status
            );
            return exit_code::WORKLOAD_FAILED;
        }
        wait_irq(vector);
        lat.add((now() - t0).saturating_sub(delay_ticks));
    }
    let mut r = Reports::new();
    r.u64(format_args!("irq.delivered"), irq_count(cpu, vector));
    lat.report(&mut r, "irq", true);
    r.send();
    println!(
        "irq: {} interrupts, average latency {} ns",
        lat.n,
        lat.avg_ns()
    );
    exit_code::OK
}
