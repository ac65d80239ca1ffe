//! `spin`: `tasks` tasks, placed round the vCPUs, count loop iterations until
//! a common deadline. With more tasks than vCPUs only preemption lets each
//! make progress; the per-task counts show how evenly time was shared.

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::exit_code;

use super::{join_all, spawn_all, Context};
use crate::kernel::api::{cpu_index, now, println, task_runs, ticks_per_sec, Placement, Reports};

static COUNTS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static CPUS: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static END: AtomicU64 = AtomicU64::new(0);

fn spinner(i: usize) {
    let end = END.load(Ordering::Relaxed);
    let mut n = 0u64;
    while now() < end {
        n += 1;
    }
    COUNTS[i].store(n, Ordering::Relaxed);
    CPUS[i].store(cpu_index() as u64, Ordering::Relaxed);
}

pub fn run(ctx: &Context) -> u32 {
    let tasks = ctx.number("tasks") as usize;
    let seconds = ctx.number("seconds");
    END.store(now() + seconds * ticks_per_sec(), Ordering::Relaxed);
    let Some(ids) = spawn_all(tasks, spinner, |_| Placement::Any) else {
        return exit_code::WORKLOAD_FAILED;
    };
    join_all(&ids[..tasks]);
    let mut r = Reports::new();
    let (mut total, mut min, mut max) = (0u64, u64::MAX, 0u64);
    for (i, c) in COUNTS[..tasks].iter().enumerate() {
        let n = c.load(Ordering::Relaxed);
        r.u64(format_args!("spin.task.{i}"), n);
        // The vCPU it ran on: tasks sharing a vCPU share it by preemption.
        r.u64(
            format_args!("spin.cpu.{i}"),
            CPUS[i].load(Ordering::Relaxed),
        );
        // Time slices the task got: more than one means it was preempted.
        r.u64(format_args!("spin.slices.{i}"), task_runs(ids[i]));
        total += n;
        min = min.min(n);
        max = max.max(n);
    }
    r.u64(format_args!("spin.tasks"), tasks as u64);
    r.u64(format_args!("spin.total"), total);
    r.send();
    println!(
        "spin: {} tasks, {} iterations in {} s (per task min {}, max {})",
        tasks, total, seconds, min, max
    );
    exit_code::OK
}
