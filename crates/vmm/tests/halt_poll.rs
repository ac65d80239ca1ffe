//! Halt polling on /dev/kvm: KVM's own statistics under the paravirtual I/O
//! workload, the governor, and the I/O device's writes.

mod common;

use hover_vmm::config::{HostConfig, MachineConfig};
use hover_vmm::sync::Locked;
use std::path::PathBuf;
use std::sync::Mutex;

use common::{boot, report};
use hover_vmm::config::HaltPoll;
use hover_vmm::host::kvm_for_test;
use hover_vmm::{RunOutcome, VmConfig};

/// A fresh path for the device's file on a real disk (a write there takes
/// long enough for the vCPU to halt; on tmpfs it often completes first).
fn io_file(tag: &str) -> PathBuf {
    std::path::Path::new("/var/tmp").join(format!("hover-test-io-{tag}-{}", std::process::id()))
}

/// These tests measure polling, which only works when the host has a CPU
/// free for the I/O thread while a vCPU polls: on a 2-core host, VMs of
/// other tests running at the same time make every poll fail. Run them one
/// at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.locked()
}

fn run(halt_poll: HaltPoll, cmdline: &str, file: Option<PathBuf>) -> RunOutcome {
    run_ok(VmConfig {
        machine: MachineConfig {
            halt_poll,
            cmdline: cmdline.into(),
            ..Default::default()
        },
        host: HostConfig {
            io_file: file,
            ..Default::default()
        },
    })
}

/// Boot `config` and check that the guest ended well.
fn run_ok(config: VmConfig) -> RunOutcome {
    let cmdline = config.machine.cmdline.clone();
    let (result, console) = boot(config);
    let o = result.unwrap_or_else(|e| panic!("{cmdline}: {e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, 0, "{cmdline}\nconsole:\n{console}");
    o
}

fn sum(o: &RunOutcome, stat: &str) -> u64 {
    o.vcpu_stats.iter().map(|s| s[stat]).sum()
}

#[test]
fn polling_on_polls_and_off_never_polls() {
    if !kvm_for_test("polling_on_polls_and_off_never_polls") {
        return;
    }
    let _serial = serial();
    let f = io_file("poll");
    let on = run(
        HaltPoll::Fixed { window_ns: 200_000 },
        "workload=iolat seconds=1",
        Some(f.clone()),
    );
    assert!(report(&on, "iolat.requests") > 100);
    // Whether a poll succeeds depends on the host: KVM abandons a poll as
    // soon as another task is runnable, so on a loaded host none succeeds.
    // That KVM polls at all, with the window set, is the mechanism.
    assert!(
        sum(&on, "halt_attempted_poll") > 0,
        "KVM polls with a 200 us window: {:?}",
        on.vcpu_stats[0]
    );
    let off = run(
        HaltPoll::Fixed { window_ns: 0 },
        "workload=iolat seconds=1",
        Some(f.clone()),
    );
    assert!(
        sum(&off, "halt_exits") > 100,
        "the vCPU halts between writes"
    );
    assert_eq!(sum(&off, "halt_successful_poll"), 0);
    assert_eq!(sum(&off, "halt_attempted_poll"), 0);
    // Idle periods shorter than a tick leave the tick armed: disarming and
    // re-arming around each of them would take two timer writes per halt.
    // Lazily, a write pair is due only when a tick fires while idle (at most
    // hz=100 per second), so even a slow host's few halts stay above it.
    let writes = report(&off, "runtime.deadline_writes");
    assert!(
        writes < sum(&off, "halt_exits"),
        "{writes} timer writes for {} halts",
        sum(&off, "halt_exits")
    );
    std::fs::remove_file(&f).unwrap();
}

#[test]
fn governor_adapts_under_io_and_stays_in_budget_when_idle() {
    if !kvm_for_test("governor_adapts_under_io_and_stays_in_budget_when_idle") {
        return;
    }
    let _serial = serial();
    let f = io_file("gov");
    let busy = run(
        HaltPoll::Auto { budget_pct: 2.5 },
        "workload=iolat seconds=1",
        Some(f.clone()),
    );
    std::fs::remove_file(&f).unwrap();
    let g = busy.halt_poll.as_ref().expect("governor report");
    // It starts at KVM's default window, judges the I/O, and keeps a window
    // open at some decision (a change to one, or the default kept at every
    // decision: then nothing changed after the start). Where it ends is not
    // asserted: seen in CI, an older model climbed to 8 ms and then closed
    // the window when the waste went over budget.
    let default = hover_vmm::sched::halt_poll::kvm_default_window()
        .unwrap_or(0)
        .min(hover_vmm::config::halt_poll::MAX_WINDOW_NS);
    assert_eq!(
        g.changes.first(),
        Some(&(0, default)),
        "the governor starts at KVM's default window: {g:?}"
    );
    assert!(g.decisions > 0, "the governor judged the I/O: {g:?}");
    assert!(
        g.changes.iter().skip(1).any(|&(_, w)| w > 0) || (g.changes.len() == 1 && default > 0),
        "the governor kept a window open under I/O: {g:?}"
    );
    assert!(
        sum(&busy, "halt_attempted_poll") > 0,
        "KVM polls with the window the governor set"
    );
    // An idle guest: a timer task waking every 200 ms for 3 s.
    let idle = run(
        HaltPoll::Auto { budget_pct: 2.5 },
        "workload=timer interval_us=200000 seconds=3",
        None,
    );
    // The timer's wake-ups (200 ms) are beyond any window: the governor
    // closes the default one (where KVM has one). (Not asserted: that it stays closed to the
    // end; one quick wake-up in the last second could reopen it.)
    let g = idle.halt_poll.as_ref().expect("governor report");
    assert!(
        default == 0 || g.changes.iter().skip(1).any(|&(_, w)| w == 0),
        "the governor closed the window on an idle guest: {g:?}"
    );
    let wall_ns = idle.timings.exit_us.saturating_sub(idle.timings.setup_us) as f64 * 1000.0;
    for (i, s) in idle.vcpu_stats.iter().enumerate() {
        let wasted = s["halt_poll_fail_ns"] as f64;
        assert!(
            wasted <= 0.025 * wall_ns,
            "vCPU {i} wasted {wasted} ns in failed polls over {wall_ns} ns"
        );
    }
}

#[test]
fn the_device_writes_exactly_what_the_guest_sent() {
    if !kvm_for_test("the_device_writes_exactly_what_the_guest_sent") {
        return;
    }
    let _serial = serial();
    let f = io_file("data");
    let o = run(
        HaltPoll::KvmDefault,
        "workload=iolat size=8K seconds=1",
        Some(f.clone()),
    );
    let (n, size) = (report(&o, "iolat.requests"), report(&o, "iolat.size"));
    assert!(n > 64, "{n} writes");
    assert_eq!(report(&o, "iolat.errors"), 0);
    let io = o.io.as_ref().expect("device stats");
    assert_eq!((io.requests, io.bytes, io.bad_requests), (n, n * size, 0));
    let data = std::fs::read(&f).unwrap();
    std::fs::remove_file(&f).unwrap();
    assert_eq!(data.len() as u64, 64 * size);
    for slot in 0..64u64 {
        // The last write to this slot.
        let k = (0..n).rev().find(|k| k % 64 == slot).unwrap();
        let got = &data[(slot * size) as usize..((slot + 1) * size) as usize];
        let bad = (0..size).find(|&i| got[i as usize] != ((k + i) % 251) as u8);
        assert_eq!(bad, None, "slot {slot} (write {k}) differs at byte {bad:?}");
    }
}

fn run_guest_polling(cmdline: &str, limit_ns: u64) -> RunOutcome {
    run_ok(VmConfig {
        machine: MachineConfig {
            cmdline: cmdline.into(),
            guest_poll_max_ns: limit_ns,
            ..Default::default()
        },
        ..VmConfig::default()
    })
}

#[test]
fn guest_window_grows_under_quick_wakeups_and_collapses_when_idle() {
    if !kvm_for_test("guest_window_grows_under_quick_wakeups_and_collapses_when_idle") {
        return;
    }
    let _serial = serial();
    // The largest window the guest and the monitor allow (10 ms), so that
    // completions count as quick even on a loaded host.
    let o = run_guest_polling(
        "workload=iolat seconds=1 idle=haltpoll poll_us=10000 idle_ms=400",
        10_000_000,
    );
    assert!(report(&o, "iolat.requests") > 100);
    assert!(report(&o, "haltpoll.grows") > 0, "{:?}", o.reports);
    let after_io =
        report(&o, "iolat.window_after_io_ns.0").max(report(&o, "iolat.window_after_io_ns.1"));
    assert!(
        after_io >= 50_000,
        "the window grew under I/O: {after_io} ns"
    );
    assert!(report(&o, "haltpoll.window_peak_ns") <= 10_000_000);
    // Then 400 ms of sleeps of 20 ms each, longer than any window.
    assert!(report(&o, "haltpoll.shrinks") > 0);
    // Down to at most the window a single short idle period restarts it
    // at (50 us, Linux's grow_start: the wake-up after each sleep is one).
    for v in 0..2 {
        let w = report(&o, &format!("haltpoll.window_ns.{v}"));
        assert!(
            w <= 50_000,
            "vCPU {v}: {w} ns after idling; {:?}",
            o.reports
        );
    }
    // The monitor sees the same windows, and skipped interrupts while the
    // guest polled.
    let g = o.guest_halt_poll.as_ref().expect("guest polling offered");
    // (The guest may run one more idle pass between its report and the exit.)
    assert!(g.vcpus.iter().all(|v| v.window_ns <= 50_000), "{g:?}");
    assert_eq!(g.irqs_skipped(), report(&o, "haltpoll.irqs_skipped"));
    assert_eq!(o.io.as_ref().unwrap().irqs_skipped, g.irqs_skipped());
}

#[test]
fn the_guest_never_polls_past_the_monitors_limit() {
    if !kvm_for_test("the_guest_never_polls_past_the_monitors_limit") {
        return;
    }
    let _serial = serial();
    // The guest would allow 10 ms; the monitor offers 30 us.
    let o = run_guest_polling(
        "workload=iolat seconds=1 idle=haltpoll poll_us=10000",
        30_000,
    );
    assert_eq!(report(&o, "haltpoll.max_ns"), 30_000);
    assert!(
        report(&o, "haltpoll.window_peak_ns") <= 30_000,
        "{:?}",
        o.reports
    );
    let g = o.guest_halt_poll.as_ref().expect("offered");
    assert_eq!(g.max_ns, 30_000);
    assert!(g.vcpus.iter().all(|v| v.window_ns <= 30_000));
    // Offered nothing, the guest never polls and every completion interrupts.
    let o = run_guest_polling("workload=iolat seconds=1 idle=haltpoll poll_us=10000", 0);
    assert_eq!(report(&o, "haltpoll.polls"), 0, "{:?}", o.reports);
    assert_eq!(report(&o, "haltpoll.irqs_skipped"), 0);
    assert!(o.guest_halt_poll.is_none());
    assert_eq!(o.io.as_ref().unwrap().irqs_skipped, 0);
}

#[test]
fn an_idle_haltpoll_guest_stays_under_the_cpu_budget() {
    if !kvm_for_test("an_idle_haltpoll_guest_stays_under_the_cpu_budget") {
        return;
    }
    let _serial = serial();
    // A mostly idle guest: a task wakes every 20 ms.
    let o = run_guest_polling(
        "workload=timer interval_us=20000 seconds=2 idle=haltpoll",
        hover_abi::haltpoll::DEFAULT_POLL_NS,
    );
    let cpu_us: u64 = o.vcpu_cpu_us.iter().sum();
    let wall_us = o.timings.exit_us.max(1) * o.vcpu_cpu_us.len() as u64;
    let share = cpu_us as f64 / wall_us as f64;
    // The seed's budget is 2.5% of a CPU per idle vCPU; the bound is loose
    // (4x) so that a slow host does not fail it. Spinning (idle=poll) would
    // take ~100%.
    assert!(
        share < 0.10,
        "idle vCPUs used {:.1}% of a CPU each ({:?} us)",
        share * 100.0,
        o.vcpu_cpu_us
    );
}
