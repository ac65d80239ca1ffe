//! The governor's model: rebuild the distribution of wake-up times from
//! KVM's halt-poll histograms, and pick the window from it.
//!
//! KVM records, per vCPU and by log2 of nanoseconds, the polls that caught
//! the wake-up (`halt_poll_success_hist`, by poll time = wake-up time), the
//! polls that did not (`halt_poll_fail_hist`, by poll time), and the sleeps
//! that followed a failed poll or no poll (`halt_wait_hist`). A vCPU does
//! not poll for the VM's window: KVM grows its own window from
//! `halt_poll_ns_grow_start` (10 us) by doubling after a wake-up it would
//! have caught with more, and shrinks it after long waits, so most waits
//! follow a poll shorter than the VM's window, and many follow none. The
//! wake-up time of a wait is the length of the poll before it plus the
//! wait; the histograms do not pair the two, so each wait is spread over
//! the poll lengths the fail histogram shows in the same period (and over
//! "no poll" for the waits the fail histogram does not account for).
//!
//! (The first governor assumed every wait followed a poll of the full
//! window: with KVM's windows mostly smaller, it placed wake-ups too late
//! and chose windows that missed them; see the tests.)

/// Wake-up times as a log2 histogram: bucket 0 is 0 ns, bucket i is
/// [2^(i-1), 2^i) ns (KVM's layout); counts are fractional because waits are
/// spread over poll lengths.
pub type WakeHist = [f64; 64];

/// The bucket of `ns`.
pub fn bucket(ns: u64) -> usize {
    (64 - ns.leading_zeros() as usize).min(63)
}

/// A representative time of bucket `i`: its middle.
fn mid(i: usize) -> u64 {
    if i == 0 {
        0
    } else {
        let lo = 1u64 << (i - 1).min(62);
        lo + lo / 2
    }
}

/// Add one period's histogram deltas of one vCPU to `hist`. `fail` is
/// `halt_poll_fail_hist`'s delta; without it (a KVM that lacks it), waits
/// are taken to follow a poll of `window`, the VM's maximum.
pub fn add_period(
    hist: &mut WakeHist,
    success: &[u64],
    wait: &[u64],
    fail: Option<&[u64]>,
    window: u64,
) {
    for (i, &n) in success.iter().enumerate().take(64) {
        hist[i] += n as f64;
    }
    let waits: u64 = wait.iter().sum();
    if waits == 0 {
        return;
    }
    // The poll lengths before the waits: (representative length, share).
    let polls: Vec<(u64, f64)> = match fail {
        Some(fail) => {
            let failed: u64 = fail.iter().sum();
            // A fail is recorded before its wait; one that has no wait yet
            // (the vCPU still sleeps at the period's end) is taken as one.
            let total = waits.max(failed) as f64;
            let mut v: Vec<(u64, f64)> = fail
                .iter()
                .enumerate()
                .filter(|(_, &n)| n > 0)
                .map(|(i, &n)| (mid(i), n as f64 / total))
                .collect();
            if failed < waits {
                v.push((0, (waits - failed) as f64 / total));
            }
            v
        }
        None => vec![(window, 1.0)],
    };
    for (j, &n) in wait.iter().enumerate() {
        if n == 0 {
            continue;
        }
        for &(poll, share) in &polls {
            hist[bucket(poll.saturating_add(mid(j)))] += n as f64 * share;
        }
    }
}

/// Share of the wake-ups the best affordable window catches that the chosen
/// window must catch: the last few percent (a long tail of late wake-ups)
/// are not worth a window many times longer.
const CATCH_SHARE: f64 = 0.98;

/// Windows the governor chooses from: 0 and 1 us .. 8 ms in powers of two.
pub const CANDIDATES: [u64; 15] = [
    0,
    1 << 10,
    1 << 11,
    1 << 12,
    1 << 13,
    1 << 14,
    1 << 15,
    1 << 16,
    1 << 17,
    1 << 18,
    1 << 19,
    1 << 20,
    1 << 21,
    1 << 22,
    1 << 23,
];

/// Pick the window: among windows whose failed-poll time over the history
/// stays within `budget_ns`, the smallest that catches at least 98% of what
/// the best of them catches.
pub fn choose_window(hist: &WakeHist, budget_ns: f64, max: u64) -> u64 {
    let outcome = |w: u64| {
        // A bucket counts as caught only if all of it lies within the window.
        let (mut caught, mut waste) = (0f64, 0f64);
        for (i, &n) in hist.iter().enumerate() {
            let upper = if i == 0 { 0 } else { 1u64 << i.min(63) };
            if upper <= w {
                caught += n;
            } else {
                waste += n * w as f64;
            }
        }
        (caught, waste)
    };
    let affordable: Vec<(u64, f64)> = CANDIDATES
        .iter()
        .filter(|&&w| w <= max)
        .map(|&w| (w, outcome(w)))
        .filter(|(_, (_, waste))| *waste <= budget_ns)
        .map(|(w, (caught, _))| (w, caught))
        .collect();
    let best = affordable.iter().map(|a| a.1).fold(0.0, f64::max);
    if best < 0.5 {
        return 0;
    }
    affordable
        .iter()
        .find(|a| a.1 >= CATCH_SHARE * best)
        .map_or(0, |a| a.0)
}

#[cfg(test)]
mod tests;
