//! The built-in guest's adaptive async page faults (`apf_min_us=N`), as a
//! pure decision: the guest (`kernel/apf.rs`) feeds it each window's counts
//! and applies the answer to its vCPUs' `MSR_KVM_ASYNC_PF_EN`; the host's
//! tests check it here, and `hover bench apf` measures it (the "adaptive"
//! rows).
//!
//! An async page fault pays only if the task's wait for its page is worth
//! more than what parking it costs: an exit and emulated CPL0 code for the
//! "page not present" and "page ready" pair, a task switch, and a page-in
//! started beside the others' on the host's CPUs. Where the store answers
//! fast, a vCPU that simply waits does more work (BENCHMARKS, seed 1). So
//! with async PF on, the guest measures for [`WINDOW_MS`] how long its
//! faults waited; a mean below `N` us turns async PF off for [`PAUSE_MS`],
//! after which it is on again for a window that measures anew.

/// How long a window measures, milliseconds: hundreds of faults at the
/// rates where the choice matters.
pub const WINDOW_MS: u64 = 50;
/// How long async PF stays off before the next window, milliseconds: 20
/// windows, so re-measuring costs a fast store at most 1/20 of its time
/// with async PF on.
pub const PAUSE_MS: u64 = 1000;
/// Fewer faults than this in a window are too few to judge by.
pub const MIN_SAMPLES: u64 = 16;

/// What one window with async PF on saw, all vCPUs together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// "Page not present" notifications taken.
    pub not_present: u64,
    /// Parked tasks whose "page ready" came in the window.
    pub parkings: u64,
    /// Their time parked, nanoseconds in all.
    pub parked_ns: u64,
    /// "Page ready"s that came before their task parked (a wait of ~0).
    pub early: u64,
}

/// Whether async PF stays on after `w` (`min_us` 0: always).
pub fn keep_on(w: Window, min_us: u64) -> bool {
    let resolved = w.parkings + w.early;
    if min_us == 0 || w.not_present < MIN_SAMPLES || resolved < MIN_SAMPLES {
        return true;
    }
    w.parked_ns / resolved >= min_us.saturating_mul(1000)
}

/// The next state and how long it lasts, milliseconds: after a window
/// with async PF on (`on`), [`keep_on`] decides; after a pause, a window
/// starts.
pub fn next(on: bool, w: Window, min_us: u64) -> (bool, u64) {
    if on && !keep_on(w, min_us) {
        (false, PAUSE_MS)
    } else {
        (true, WINDOW_MS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(not_present: u64, parkings: u64, mean_us: u64, early: u64) -> Window {
        Window {
            not_present,
            parkings,
            parked_ns: parkings * mean_us * 1000,
            early,
        }
    }

    #[test]
    fn faults_faster_than_the_threshold_turn_async_pf_off_for_a_pause() {
        assert_eq!(
            next(true, window(200, 200, 300, 0), 1000),
            (false, PAUSE_MS)
        );
    }

    #[test]
    fn faults_slower_than_the_threshold_keep_it_on() {
        assert_eq!(
            next(true, window(200, 200, 2500, 0), 1000),
            (true, WINDOW_MS)
        );
    }

    #[test]
    fn a_ready_before_its_task_parked_counts_as_no_wait() {
        // 100 parkings of 1.5 ms and 100 readies that came first: mean 750 us.
        assert!(!keep_on(window(200, 100, 1500, 100), 1000));
        assert!(keep_on(window(200, 100, 1500, 0), 1000));
    }

    #[test]
    fn too_few_faults_or_a_zero_threshold_change_nothing() {
        assert!(keep_on(window(MIN_SAMPLES - 1, 100, 10, 0), 1000));
        assert!(keep_on(window(100, MIN_SAMPLES - 1, 10, 0), 1000));
        assert!(keep_on(window(1000, 1000, 10, 0), 0));
    }

    #[test]
    fn a_pause_ends_in_a_window_whatever_it_saw() {
        assert_eq!(
            next(false, window(1000, 1000, 10, 0), 1000),
            (true, WINDOW_MS)
        );
    }
}
