use std::sync::mpsc;

use hover_abi::boost::{offset, request, status, BOOST_AREA_VERSION};
use hover_abi::control::status as control_status;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::*;
use crate::memory::host_writes::HostWrites;

const AREA: u64 = 0x2000;

fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
}

fn booster(
    mode: BoostMode,
    tweak: impl FnOnce(&mut BoostConfig),
) -> (Arc<Booster>, GuestMemoryMmap) {
    let mem = memory();
    let mut c = BoostConfig {
        mode,
        ..Default::default()
    };
    tweak(&mut c);
    let b = Booster::new(
        c,
        Default::default(),
        GuestWriter::new(mem.clone(), Arc::new(HostWrites::new(0x10000))),
        1,
        1_000_000,
    );
    mem.write_obj(BOOST_AREA_VERSION, GuestAddress(AREA))
        .unwrap();
    (b, mem)
}

fn status_of(mem: &GuestMemoryMmap) -> u32 {
    mem.read_obj(GuestAddress(AREA + offset::STATUS)).unwrap()
}

/// A thread attached as vCPU 0 that stays alive until the returned sender drops.
fn vcpu_thread(b: &Arc<Booster>) -> (i32, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let b2 = b.clone();
    let t = std::thread::spawn(move || {
        b2.attach(0);
        tx.send(policy::gettid()).unwrap();
        let _ = done_rx.recv();
        b2.detach(0);
    });
    (rx.recv().unwrap(), done_tx, t)
}

/// Whether this process may raise a thread to SCHED_FIFO (tests that need
/// it print why they stop otherwise).
fn may_boost() -> bool {
    match policy::fifo_allowed() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipped: cannot use SCHED_FIFO here ({e})");
            false
        }
    }
}

#[test]
fn bad_registrations_are_refused() {
    let (b, mem) = booster(BoostMode::Dynamic, |_| {});
    assert_eq!(b.register(0, AREA + 8, 1), control_status::BAD_RANGE);
    assert_eq!(b.register(0, 0x10000, 1), control_status::BAD_RANGE);
    assert_eq!(b.register(0, u64::MAX - 63, 1), control_status::BAD_RANGE);
    assert_eq!(b.register(0, AREA, 2), control_status::BAD_RECORD);
    mem.write_obj(0x80u32, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    assert_eq!(b.register(0, AREA, 1), control_status::BAD_RECORD);
    assert_eq!(b.areas(), vec![None]);
    mem.write_obj(0u32, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    assert_eq!(b.register(0, AREA, 1), control_status::OK);
    assert_eq!(b.areas(), vec![Some(AREA)]);
    // Accepted with boosting off too (it can be switched on live), but
    // nothing boosts then.
    let (off, mem) = booster(BoostMode::Off, |_| {});
    assert_eq!(off.register(0, AREA, 1), control_status::OK);
    mem.write_obj(request::RT, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    off.on_exit(0);
    off.on_interrupt(0);
    assert!(!off.is_boosted(0));
}

#[test]
fn a_request_boosts_and_the_unboost_call_restores() {
    if !may_boost() {
        return;
    }
    let (b, mem) = booster(BoostMode::Dynamic, |_| {});
    let (tid, done, t) = vcpu_thread(&b);
    assert_eq!(b.register(0, AREA, 1), control_status::OK);
    b.on_exit(0);
    assert!(!b.is_boosted(0), "no bits, no boost");
    mem.write_obj(request::RT, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    b.on_exit(0);
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_FIFO);
    assert_eq!(status_of(&mem) & status::BOOSTED, status::BOOSTED);
    // The call while a bit is still set changes nothing.
    assert_eq!(b.unboost_call(0), control_status::OK);
    assert!(b.is_boosted(0));
    mem.write_obj(0u32, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    b.unboost_call(0);
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_OTHER);
    assert_eq!(status_of(&mem) & status::BOOSTED, 0);
    let r = b.report();
    assert_eq!((r.vcpus[0].boosts, r.vcpus[0].unboosts), (1, 1));
    drop(done);
    t.join().unwrap();
}

#[test]
fn boosting_too_often_throttles_for_the_cooldown() {
    if !may_boost() {
        return;
    }
    let (b, mem) = booster(BoostMode::Dynamic, |c| {
        c.max_rate = 3;
        c.cooldown_ms = 60_000;
    });
    let (_tid, done, t) = vcpu_thread(&b);
    b.register(0, AREA, 1);
    for _ in 0..3 {
        assert!(b.boosts_interrupts(), "an unboosted vCPU to boost");
        b.on_interrupt(0);
        assert!(b.is_boosted(0));
        assert!(
            !b.boosts_interrupts(),
            "every vCPU boosted: an interrupt source need not read its route"
        );
        b.unboost_call(0);
    }
    b.on_interrupt(0);
    assert!(!b.is_boosted(0), "the fourth boost in a second is refused");
    assert_eq!(status_of(&mem) & status::THROTTLED, status::THROTTLED);
    b.on_interrupt(0);
    assert!(!b.is_boosted(0), "none during the cool-down");
    assert_eq!(b.report().vcpus[0].throttles, 1);
    drop(done);
    t.join().unwrap();
}

#[test]
fn pause_unboosts_and_static_mode_boosts_from_the_start() {
    if !may_boost() {
        return;
    }
    let (b, _mem) = booster(BoostMode::Static, |_| {});
    let (tid, done, t) = vcpu_thread(&b);
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_FIFO);
    b.pause();
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_OTHER);
    b.resume();
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_FIFO);
    drop(done);
    t.join().unwrap();
    // detach() ran as the thread ended.
    assert!(!b.is_boosted(0));
}

#[test]
fn an_interrupt_to_a_vcpu_without_an_area_is_a_host_boost_ended_as_it_sleeps() {
    if !may_boost() {
        return;
    }
    let (b, _mem) = booster(BoostMode::Dynamic, |_| {});
    let (tid, done, t) = vcpu_thread(&b);
    assert!(
        b.boosts_interrupts(),
        "a vCPU without an area is boosted too"
    );
    b.on_interrupt(0);
    assert!(b.is_boosted(0));
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_FIFO);
    b.settle_host_boost(0, Some('R'));
    assert!(b.is_boosted(0), "running, within its budget: kept");
    b.settle_host_boost(0, Some('S'));
    assert!(!b.is_boosted(0), "asleep (halted): ended");
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_OTHER);
    let s = &b.report().vcpus[0];
    assert_eq!((s.host_ended_halted, s.host_ended_budget), (1, 0), "{s:?}");
    assert_eq!((s.boosts_interrupt, s.throttles), (1, 0), "{s:?}");
    // The monitor finds it by itself: the thread sleeps on its channel.
    b.start().unwrap();
    b.on_interrupt(0);
    let t0 = Instant::now();
    while b.is_boosted(0) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        !b.is_boosted(0),
        "the monitor ended the boost of a sleeping thread"
    );
    assert_eq!(b.report().vcpus[0].host_ended_halted, 2);
    // A registered vCPU's boost is the guest's to end.
    b.register(0, AREA, 1);
    b.on_interrupt(0);
    assert!(b.is_boosted(0));
    b.settle_host_boost(0, Some('S'));
    assert!(b.is_boosted(0), "the guest unboosts it");
    b.stop();
    assert!(!b.is_boosted(0));
    drop(done);
    t.join().unwrap();
}

#[test]
fn a_host_boost_on_a_vcpu_that_computes_ends_at_its_budget() {
    if !may_boost() {
        return;
    }
    let (b, _mem) = booster(BoostMode::Dynamic, |_| {});
    b.set_tuning(BoostTuning {
        irq_us: 1000,
        ..Default::default()
    })
    .unwrap();
    let (go, ran, t) = spinning_vcpu_thread(&b, 3);
    while b.tid(0).is_none() {
        std::thread::yield_now();
    }
    b.on_interrupt(0);
    assert!(b.is_boosted(0));
    go.send(()).unwrap();
    ran.recv().unwrap();
    // Running all along (as a guest computing on): 3 ms of CPU > 1 ms.
    b.settle_host_boost(0, Some('R'));
    assert!(!b.is_boosted(0));
    let s = &b.report().vcpus[0];
    assert_eq!(
        (s.host_ended_budget, s.throttles),
        (1, 0),
        "not a throttle: {s:?}"
    );
    drop(go);
    t.join().unwrap();
}

#[test]
fn an_unboost_lowers_its_thread_without_holding_the_slot_and_keeps_a_boost_granted_meanwhile() {
    if !may_boost() {
        return;
    }
    let (b, mem) = booster(BoostMode::Dynamic, |_| {});
    let (tid, done, t) = vcpu_thread(&b);
    assert_eq!(b.register(0, AREA, 1), control_status::OK);
    b.on_interrupt(0);
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_FIFO);
    // What the monitor does when the thread's next deadline comes while the
    // thread, just lowered, waits behind a host thread.
    let monitor = b.clone();
    *b.before_restore.lock().unwrap() = Some(Box::new(move || {
        assert!(
            monitor.slots[0].state.try_lock().is_ok(),
            "the slot is locked while its thread is being lowered"
        );
        monitor.boost(0, Source::Timer);
    }));
    b.unboost_call(0);
    assert!(b.is_boosted(0));
    assert_eq!(
        policy::read(tid).unwrap().policy,
        libc::SCHED_FIFO,
        "the boost granted during the unboost was undone"
    );
    assert_eq!(status_of(&mem) & status::BOOSTED, status::BOOSTED);
    let r = b.report();
    assert_eq!((r.vcpus[0].boosts, r.vcpus[0].unboosts), (2, 1));
    b.unboost_call(0);
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_OTHER);
    drop(done);
    t.join().unwrap();
}

/// A booster with a 100 ms keep offer, its TSC rate far above the real
/// one: a deadline 50 ms ahead in the booster's terms stays ahead of the
/// real TSC for many seconds, however slow this host is.
fn keeping_booster(max_ms: u64) -> (Arc<Booster>, GuestMemoryMmap) {
    let (b, mem) = booster(BoostMode::Dynamic, |c| c.max_ms = max_ms);
    b.set_tuning(BoostTuning {
        keep_us: 100_000,
        ..Default::default()
    })
    .unwrap();
    b.set_tsc_khz(1_000_000_000);
    (b, mem)
}

/// What the guest does for a quiet unboost: bits clear, its next wake-up
/// announced (`wake_in_ms` ahead in the booster's terms; `None`: none),
/// and the count bumped.
fn quiet(mem: &GuestMemoryMmap, wake_in_ms: Option<u64>) {
    mem.write_obj(0u32, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    let wake_at = wake_in_ms.map_or(0, |ms| super::tuning::host_tsc() + ms * 1000 * 1_000_000);
    mem.write_obj(wake_at, GuestAddress(AREA + offset::WAKE_AT))
        .unwrap();
    let n: u64 = mem
        .read_obj(GuestAddress(AREA + offset::QUIET_UNBOOSTS))
        .unwrap();
    mem.write_obj(n + 1, GuestAddress(AREA + offset::QUIET_UNBOOSTS))
        .unwrap();
}

/// Register vCPU 0's area and boost it for its RT bit, as the guest's
/// first real-time wake-up would.
fn boosted_by_request(b: &Arc<Booster>, mem: &GuestMemoryMmap) {
    assert_eq!(b.register(0, AREA, 1), control_status::OK);
    mem.write_obj(request::RT, GuestAddress(AREA + offset::REQUEST))
        .unwrap();
    b.on_exit(0);
    assert!(b.is_boosted(0));
}

#[test]
fn a_quiet_unboost_is_kept_or_ended_as_the_call_would_be() {
    if !may_boost() {
        return;
    }
    let (b, mem) = keeping_booster(1000);
    let (tid, done, t) = vcpu_thread(&b);
    // A count moved before this boost began is not an unboost of it.
    mem.write_obj(5u64, GuestAddress(AREA + offset::QUIET_UNBOOSTS))
        .unwrap();
    boosted_by_request(&b, &mem);
    let offer: u32 = mem.read_obj(GuestAddress(AREA + offset::KEEP_US)).unwrap();
    assert_eq!(offer, 100_000, "the boost carries the host's offer");
    b.quiet_unboost(0, AREA);
    assert!(b.is_boosted(0), "an old count ends nothing");
    assert_eq!(b.report().vcpus[0].quiet_unboosts, 0);
    // The task sleeps until a wake-up 50 ms ahead: kept across the gap.
    quiet(&mem, Some(50));
    b.quiet_unboost(0, AREA);
    assert!(b.is_boosted(0), "kept across the gap");
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_FIFO);
    let s = &b.report().vcpus[0];
    assert_eq!((s.quiet_unboosts, s.kept, s.unboosts), (1, 1, 0));
    // Looked at again with no new count: nothing more.
    b.quiet_unboost(0, AREA);
    assert_eq!(b.report().vcpus[0].quiet_unboosts, 1);
    // No wake-up announced any more: the next quiet unboost ends it, and
    // the offer goes with the boost.
    quiet(&mem, None);
    b.quiet_unboost(0, AREA);
    assert!(!b.is_boosted(0));
    assert_eq!(policy::read(tid).unwrap().policy, libc::SCHED_OTHER);
    assert_eq!(status_of(&mem) & status::BOOSTED, 0);
    let offer: u32 = mem.read_obj(GuestAddress(AREA + offset::KEEP_US)).unwrap();
    assert_eq!(offer, 0, "no offer outside a boost");
    let s = &b.report().vcpus[0];
    assert_eq!((s.quiet_unboosts, s.kept, s.unboosts), (2, 1, 1));
    // Not boosted: a stray count changes nothing.
    quiet(&mem, None);
    b.quiet_unboost(0, AREA);
    assert_eq!(b.report().vcpus[0].quiet_unboosts, 2);
    drop(done);
    t.join().unwrap();
}

#[test]
fn a_quiet_unboost_over_the_budget_ends_the_boost() {
    if !may_boost() {
        return;
    }
    // max_ms 100: a gap of 80 ms is within the offer (100 ms) but could
    // take the boost past half of the limit.
    let (b, mem) = keeping_booster(100);
    let (_tid, done, t) = vcpu_thread(&b);
    boosted_by_request(&b, &mem);
    quiet(&mem, Some(80));
    b.quiet_unboost(0, AREA);
    assert!(!b.is_boosted(0));
    let s = &b.report().vcpus[0];
    assert_eq!(
        (s.quiet_unboosts, s.kept, s.budget_unboosts, s.unboosts),
        (1, 0, 1, 1)
    );
    drop(done);
    t.join().unwrap();
}

#[test]
fn the_monitor_finds_a_quiet_unboost_by_itself() {
    if !may_boost() {
        return;
    }
    let (b, mem) = keeping_booster(1000);
    let (_tid, done, t) = vcpu_thread(&b);
    boosted_by_request(&b, &mem);
    b.start().unwrap();
    // No wake-up announced: the monitor's decision is to end the boost.
    // It looks every --boost-poll-us (1 ms); a loaded host may delay it,
    // so wait for it with a bound far above any delay.
    quiet(&mem, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while b.is_boosted(0) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    b.stop();
    assert!(!b.is_boosted(0), "the monitor ended it");
    let s = &b.report().vcpus[0];
    assert_eq!((s.quiet_unboosts, s.unboosts), (1, 1));
    drop(done);
    t.join().unwrap();
}

/// A thread attached as vCPU 0 that, each time it is told, runs until it
/// has used `ms` more of CPU time and says so; it ends as the sender drops.
fn spinning_vcpu_thread(
    b: &Arc<Booster>,
    ms: u64,
) -> (
    mpsc::Sender<()>,
    mpsc::Receiver<()>,
    std::thread::JoinHandle<()>,
) {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (ran_tx, ran_rx) = mpsc::channel();
    let b2 = b.clone();
    let t = std::thread::spawn(move || {
        b2.attach(0);
        let tid = policy::gettid();
        while go_rx.recv().is_ok() {
            let start = policy::thread_cpu_ns(tid).unwrap();
            while policy::thread_cpu_ns(tid).unwrap() < start + ms * 1_000_000 {
                std::hint::black_box(0u64);
            }
            ran_tx.send(()).unwrap();
        }
        b2.detach(0);
    });
    (go_tx, ran_rx, t)
}

#[test]
fn a_kept_boost_outlasts_its_end_until_its_vcpu_had_the_cpu_to_take_it() {
    if !may_boost() {
        return;
    }
    let (b, mem) = keeping_booster(1000);
    let (go, ran, t) = spinning_vcpu_thread(&b, 2);
    while b.tid(0).is_none() {
        std::thread::yield_now();
    }
    boosted_by_request(&b, &mem);
    quiet(&mem, Some(50));
    b.quiet_unboost(0, AREA);
    let until = b.lock(0).kept.expect("kept across the gap").until;
    b.expire_kept(0, AREA, until);
    assert!(b.is_boosted(0), "at its end");
    // Past its end, the thread not having run since the keep (the host
    // kept it from its CPU, or it halted): kept on.
    b.expire_kept(0, AREA, until + 1);
    assert!(b.is_boosted(0), "no CPU since the keep: kept on");
    // The thread runs 2 ms and still no request: unanswered.
    go.send(()).unwrap();
    ran.recv().unwrap();
    b.expire_kept(0, AREA, until + 1);
    assert!(!b.is_boosted(0), "had the CPU and took no wake-up: ended");
    assert_eq!(
        b.report().vcpus[0].unboosts,
        0,
        "the monitor's, not the guest's"
    );
    drop(go);
    t.join().unwrap();
}

#[test]
fn a_kept_boost_on_a_vcpu_without_the_cpu_ends_at_the_cap() {
    if !may_boost() {
        return;
    }
    let (b, mem) = keeping_booster(1000);
    let (_tid, done, t) = vcpu_thread(&b);
    boosted_by_request(&b, &mem);
    quiet(&mem, Some(50));
    b.quiet_unboost(0, AREA);
    let until = b.lock(0).kept.unwrap().until;
    // --boost-max-ms 1000 at the booster's 1e9 kHz: 1e12 ticks.
    b.expire_kept(0, AREA, until + 1_000_000_000_000);
    assert!(b.is_boosted(0), "at the cap");
    b.expire_kept(0, AREA, until + 1_000_000_000_001);
    assert!(!b.is_boosted(0), "past it");
    drop(done);
    t.join().unwrap();
}

#[test]
fn a_wake_up_already_past_is_kept_from_now() {
    if !may_boost() {
        return;
    }
    let (b, mem) = keeping_booster(1000);
    let (_tid, done, t) = vcpu_thread(&b);
    boosted_by_request(&b, &mem);
    // The guest, running behind, announces a wake-up long past.
    quiet(&mem, None);
    mem.write_obj(1u64, GuestAddress(AREA + offset::WAKE_AT))
        .unwrap();
    let before = super::tuning::host_tsc();
    b.quiet_unboost(0, AREA);
    assert!(b.is_boosted(0), "due now: kept");
    assert_eq!(b.report().vcpus[0].kept, 1);
    let until = b.lock(0).kept.unwrap().until;
    assert!(
        until > before,
        "its end counts from the keep, not the wake-up"
    );
    drop(done);
    t.join().unwrap();
}
