//! The guest runtime on /dev/kvm: tasks, preemption, sleeping, events,
//! interrupts and idling, checked through the workloads' reports and KVM's
//! own statistics.

mod common;

use common::{report, run_ok};
use hover_vmm::host::kvm_for_test;

/// 4 spinning tasks on 2 vCPUs: each makes progress, tasks sharing a vCPU
/// share it fairly (only preemption can do that: the tasks never yield), and
/// each is preempted. Shares are compared within a vCPU: how much CPU each
/// vCPU thread gets from the host is the host's business.
#[test]
fn spin_tasks_share_time_by_preemption() {
    if !kvm_for_test("spin_tasks_share_time_by_preemption") {
        return;
    }
    let (o, _) = run_ok(2, "workload=spin tasks=4 seconds=1");
    let counts: Vec<u64> = (0..4)
        .map(|i| report(&o, &format!("spin.task.{i}")))
        .collect();
    assert!(
        counts.iter().all(|&c| c > 0),
        "a task made no progress: {counts:?}"
    );
    let cpus: Vec<u64> = (0..4)
        .map(|i| report(&o, &format!("spin.cpu.{i}")))
        .collect();
    for cpu in 0..2 {
        let on: Vec<u64> = (0..4)
            .filter(|&i| cpus[i] == cpu)
            .map(|i| counts[i])
            .collect();
        assert_eq!(on.len(), 2, "tasks are spread over the vCPUs: {cpus:?}");
        let (min, max) = (*on.iter().min().unwrap(), *on.iter().max().unwrap());
        assert!(
            min as f64 / max as f64 > 0.5,
            "unfair shares on vCPU {cpu}: {on:?} (all {counts:?} on {cpus:?})"
        );
    }
    for i in 0..4 {
        let slices = report(&o, &format!("spin.slices.{i}"));
        assert!(
            slices > 10,
            "task {i} ran in {slices} slices: not preempted at hz=100 over 1 s"
        );
    }
    assert_eq!(report(&o, "spin.total"), counts.iter().sum::<u64>());
}

/// A sleeping task wakes at each deadline; latencies and a histogram come back.
#[test]
fn timer_task_wakes_and_reports_latency() {
    if !kvm_for_test("timer_task_wakes_and_reports_latency") {
        return;
    }
    let (o, _) = run_ok(2, "workload=timer interval_us=2000 seconds=1");
    let samples = report(&o, "timer.samples");
    assert_eq!(samples, 500, "every deadline gives one wake-up");
    let (min, avg, max) = (
        report(&o, "timer.min_ns"),
        report(&o, "timer.avg_ns"),
        report(&o, "timer.max_ns"),
    );
    assert!(min <= avg && avg <= max, "{min} {avg} {max}");
    let hist: u64 = o
        .reports
        .iter()
        .filter(|r| r.key.starts_with("timer.hist."))
        .map(|r| r.value.as_u64().unwrap())
        .sum();
    assert_eq!(hist, samples, "the histogram counts every sample");
}

/// The guest's memory pattern over 64 MiB verifies, and the checksum it
/// reports is what the host computes for that range and seed.
#[test]
fn memtouch_verifies_64_mib() {
    if !kvm_for_test("memtouch_verifies_64_mib") {
        return;
    }
    let (o, _) = run_ok(2, "workload=memtouch size=64M tasks=2 seed=7");
    assert_eq!(report(&o, "memtouch.errors"), 0);
    assert_eq!(report(&o, "memtouch.pages"), 16384);
    let base = report(&o, "memtouch.base");
    let expected = (base..base + (64 << 20)).step_by(8).fold(0u64, |s, a| {
        s.wrapping_add(a.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 7)
    });
    assert_eq!(report(&o, "memtouch.checksum"), expected);
    assert!(
        o.memory.guest_resident >= 64 << 20,
        "the touched memory is resident"
    );
}

/// With nothing to run a vCPU halts (KVM counts the HLT exits); with
/// `idle=poll` it never does.
#[test]
fn idle_vcpus_halt_unless_idle_poll() {
    if !kvm_for_test("idle_vcpus_halt_unless_idle_poll") {
        return;
    }
    let halts = |cmdline: &str| -> Vec<u64> {
        let (o, _) = run_ok(2, cmdline);
        assert_eq!(o.vcpu_stats.len(), 2, "KVM binary stats are available here");
        o.vcpu_stats.iter().map(|s| s["halt_exits"]).collect()
    };
    let h = halts("workload=timer interval_us=1000 seconds=1");
    assert!(
        h[0] >= 500,
        "vCPU 0 halts between its timer wake-ups: {h:?}"
    );
    assert!(h[1] >= 1, "the idle vCPU 1 halts: {h:?}");
    assert_eq!(
        halts("workload=timer interval_us=1000 seconds=1 idle=poll"),
        vec![0, 0]
    );
}

/// An idle vCPU takes no scheduler ticks: at hz=1000, two vCPUs ticking
/// through 1 s would take 2000 timer interrupts; a sleeper waking 10 times
/// needs its 10 plus at most one tick after each (the lazy idle disarm).
#[test]
fn idle_vcpus_take_no_ticks() {
    if !kvm_for_test("idle_vcpus_take_no_ticks") {
        return;
    }
    let (o, _) = run_ok(2, "workload=timer interval_us=100000 seconds=1 hz=1000");
    assert_eq!(report(&o, "timer.samples"), 10);
    let irqs = report(&o, "runtime.timer_irqs");
    assert!(
        irqs < 100,
        "{irqs} timer interrupts: the tick keeps running while idle"
    );
}

/// Interrupts the monitor injects wake the task waiting for them.
#[test]
fn injected_msis_wake_the_waiting_task() {
    if !kvm_for_test("injected_msis_wake_the_waiting_task") {
        return;
    }
    for delay in [0, 200] {
        let (o, _) = run_ok(2, &format!("workload=irq count=50 delay_us={delay}"));
        assert_eq!(report(&o, "irq.delivered"), 50);
        assert_eq!(report(&o, "irq.samples"), 50);
    }
}

/// Tasks on different vCPUs wake each other through events (IPIs to a
/// halted vCPU), and on one vCPU too.
#[test]
fn events_wake_tasks_across_vcpus() {
    if !kvm_for_test("events_wake_tasks_across_vcpus") {
        return;
    }
    for vcpus in [1, 2] {
        let (o, _) = run_ok(vcpus, "workload=pingpong rounds=500");
        assert_eq!(report(&o, "pingpong.rounds"), 500);
    }
}

/// Voluntary and preemptive switches and nub trips are measured.
#[test]
fn switch_and_nub_costs_are_measured() {
    if !kvm_for_test("switch_and_nub_costs_are_measured") {
        return;
    }
    let (o, _) = run_ok(1, "workload=ctxsw mode=yield seconds=1");
    assert!(report(&o, "ctxsw.switches") > 1000);
    let (o, _) = run_ok(1, "workload=ctxsw mode=preempt seconds=1 hz=1000");
    assert!(
        report(&o, "ctxsw.switches") > 100,
        "preemption at 1000 Hz switches often"
    );
    assert!(report(&o, "ctxsw.ns_per_switch") > 0);
    let (o, _) = run_ok(1, "workload=nubcall count=1000");
    assert!(report(&o, "nubcall.ns_per_trip") > 0);
}

/// Spawning many tasks is linear: a new task waits behind the spawner
/// instead of preempting it, so 40 spinners all start well within a second
/// (spawning used to take one round of time slices per task).
#[test]
fn many_tasks_all_start_promptly() {
    if !kvm_for_test("many_tasks_all_start_promptly") {
        return;
    }
    let (o, _) = run_ok(2, "workload=spin tasks=40 seconds=1");
    let idle: Vec<usize> = (0..40)
        .filter(|i| report(&o, &format!("spin.task.{i}")) == 0)
        .collect();
    assert!(
        idle.is_empty(),
        "tasks that never spun before the deadline: {idle:?}"
    );
}
