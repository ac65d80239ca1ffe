use super::*;

#[test]
fn without_a_fail_histogram_waits_shift_by_the_window() {
    let mut h = [0f64; 64];
    // 3 waits of ~[64, 128) us after polling 0: bucket of ~96 us.
    let mut wait = vec![0u64; 32];
    wait[17] = 3;
    add_period(&mut h, &[0; 32], &wait, None, 0);
    assert_eq!(h[bucket(96 << 10)], 3.0);
    // After polling 1 ms, the same waits mean wake-ups ~1.1 ms after halting.
    let mut h2 = [0f64; 64];
    add_period(&mut h2, &[0; 32], &wait, None, 1 << 20);
    assert_eq!(h2[bucket((1 << 20) + (96 << 10))], 3.0);
}

#[test]
fn waits_are_spread_over_the_polls_that_failed_before_them() {
    let mut h = [0f64; 64];
    let mut wait = vec![0u64; 32];
    wait[bucket(20_000)] = 4;
    let mut fail = vec![0u64; 32];
    fail[bucket(10_000)] = 2; // two waits followed a ~12 us poll, two no poll
    add_period(&mut h, &[0; 32], &wait, Some(&fail), 1 << 20);
    assert_eq!(h[bucket(mid(bucket(20_000)))], 2.0);
    assert_eq!(h[bucket(mid(bucket(10_000)) + mid(bucket(20_000)))], 2.0);
    assert_eq!(h.iter().sum::<f64>(), 4.0);
}

#[test]
fn the_window_catches_what_the_budget_allows() {
    let mut h = [0f64; 64];
    h[bucket(50_000)] = 1000.0; // 1000 wake-ups at ~50 us
    h[bucket(50_000_000)] = 10.0; // 10 at ~50 ms (idle ticks)
                                  // A window of 64 us catches the 1000; the 10 waste 10 x 64 us = 0.64 ms.
    assert_eq!(choose_window(&h, 1e6, 10_000_000), 1 << 16);
    // With a budget below that, no polling at all.
    assert_eq!(choose_window(&h, 1e5, 10_000_000), 0);
    // An idle vCPU (only long sleeps): nothing to catch, no polling.
    let mut idle = [0f64; 64];
    idle[bucket(1_000_000_000)] = 5.0;
    assert_eq!(choose_window(&idle, 1e9, 10_000_000), 0);
    // The maximum is respected.
    assert!(choose_window(&h, 1e9, 1 << 14) <= 1 << 14);
    // A thin tail (1%) of later wake-ups does not stretch the window...
    let mut tail = h;
    tail[bucket(3_000_000)] = 10.0;
    assert_eq!(choose_window(&tail, 1e9, 10_000_000), 1 << 16);
    // ...but a larger share (5%) is worth catching if the budget allows.
    tail[bucket(3_000_000)] = 50.0;
    assert_eq!(choose_window(&tail, 1e9, 10_000_000), 1 << 22);
}

/// KVM's per-vCPU halt polling (virt/kvm/kvm_main.c, kvm_vcpu_halt) with
/// its module defaults (grow 2, grow_start 10 us, shrink 2), under a VM
/// maximum: the histograms it records for a sequence of wake-up times.
fn kvm_trace(wakeups: &[u64], max: u64) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let (mut success, mut fail, mut wait) = (vec![0u64; 64], vec![0u64; 64], vec![0u64; 64]);
    let mut poll_ns = 0u64;
    for &t in wakeups {
        let poll = poll_ns.min(max);
        if poll > 0 && t <= poll {
            success[bucket(t)] += 1;
        } else {
            if poll > 0 {
                fail[bucket(poll)] += 1;
            }
            wait[bucket(t - poll)] += 1;
        }
        let halt_ns = t;
        if halt_ns <= poll_ns {
        } else if poll_ns > 0 && halt_ns > max {
            poll_ns /= 2;
        } else if poll_ns < max && halt_ns < max {
            poll_ns = (poll_ns * 2).max(10_000).min(max);
        }
    }
    (success, fail, wait)
}

/// A generated trace: I/O completions (40%) 20-45 us after the halt, mixed
/// with idle periods of 20-40 ms, from a fixed seed.
fn wakeups() -> Vec<u64> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..20_000)
        .map(|_| {
            let r = next();
            if r % 10 < 4 {
                20_000 + r / 10 % 25_000
            } else {
                20_000_000 + r / 10 % 20_000_000
            }
        })
        .collect()
}

#[test]
fn the_rebuilt_distribution_follows_kvms_real_windows_and_picks_the_true_window() {
    let w = wakeups();
    // The window the governor had set: KVM's per-vCPU windows, shrunk by
    // the idle periods, stay below it most of the time.
    let max = 1 << 18;
    let (success, fail, wait) = kvm_trace(&w, max);
    let mut truth = [0f64; 64];
    for &t in &w {
        truth[bucket(t)] += 1.0;
    }
    let mut fixed = [0f64; 64];
    add_period(&mut fixed, &success, &wait, Some(&fail), max);
    let mut biased = [0f64; 64];
    add_period(&mut biased, &success, &wait, None, max);

    // Share of wake-ups within 64 us: the I/O completions.
    let early =
        |h: &WakeHist| h[..=bucket(1 << 16) - 1].iter().sum::<f64>() / h.iter().sum::<f64>();
    assert!(
        (early(&truth) - 0.4).abs() < 0.02,
        "truth {}",
        early(&truth)
    );
    assert!(
        (early(&fixed) - early(&truth)).abs() < 0.1,
        "fixed model: {} of wake-ups early, truth {}",
        early(&fixed),
        early(&truth)
    );
    // The old model put the waited completions a whole window late.
    assert!(
        early(&biased) < early(&truth) - 0.2,
        "biased model {}",
        early(&biased)
    );

    // Budget: 2.5% of a CPU over the trace's own length.
    let budget = 0.025 * w.iter().sum::<u64>() as f64;
    let right = choose_window(&truth, budget, 10_000_000);
    assert_eq!(right, 1 << 16, "a window of 64 us catches the completions");
    // Judged on the true wake-ups: a window is right when it is within
    // the budget and catches (nearly) what the best window catches.
    let judge = |w: u64| {
        let caught: f64 = w_caught(&w_list(&w), w);
        let waste = w_list(&w).iter().filter(|&&t| t > w).count() as f64 * w as f64;
        (caught, waste)
    };
    let (best, least_waste) = judge(right);
    let chosen = choose_window(&fixed, budget, 10_000_000);
    let (caught, waste) = judge(chosen);
    assert!(
        caught >= 0.98 * best && waste <= 2.0 * least_waste,
        "fixed model chose {chosen} ns: caught {caught} of {best}, waste {waste} (right: {least_waste})"
    );
    // The old model saw the completions KVM's small windows missed a whole
    // window late, and polled several times longer than needed for them.
    let chosen = choose_window(&biased, budget, 10_000_000);
    let (_, waste) = judge(chosen);
    assert!(
        waste > 4.0 * least_waste,
        "biased model chose {chosen} ns: waste {waste} (right: {least_waste})"
    );
}

fn w_list(_w: &u64) -> Vec<u64> {
    wakeups()
}

/// Wake-ups a window of `w` catches.
fn w_caught(wakeups: &[u64], w: u64) -> f64 {
    wakeups.iter().filter(|&&t| t <= w).count() as f64
}
