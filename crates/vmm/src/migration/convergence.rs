//! When a pre-copy migration pauses the guest, switches to post-copy or
//! gives up: a pure policy, fed each round's numbers, returning a decision
//! (the source's loop in `vm/source/` does the I/O).
//!
//! Pausing as soon as what is left fits `--downtime-ms` (as Hover did
//! until 2026-11-25) leaves the final round as large as the target allows:
//! beside QEMU, whose downtime was lower in every row, that was the whole
//! difference. So once the rest fits, rounds go on *while they pay*: while
//! each round's dirty set is still at least [`SHRINK`] smaller than the
//! smallest before it, within [`EXTRA_ROUNDS`] more rounds and an extra
//! time of [`EXTRA_TIME_SHARE`] of the time spent so far (at least
//! [`EXTRA_TIME_MIN`]). The pause comes when the dirty set stops shrinking
//! (the final round is as small as it will get), when it is empty, or
//! when a bound is reached. Before the rest fits, a hybrid migration
//! switches to post-copy after [`HYBRID_STALLED_ROUNDS`] rounds that do
//! not shrink the dirty set by a tenth, or when asked; any migration gives
//! up (or, hybrid, switches) at its timeout.

use std::time::Duration;

/// A round counts as shrinking when its dirty set is below this share of
/// the smallest so far.
pub const SHRINK: f64 = 0.9;
/// Rounds run after the rest first fits the downtime target, at most.
pub const EXTRA_ROUNDS: u32 = 8;
/// Time spent after the rest first fits, as a share of the time until then.
pub const EXTRA_TIME_SHARE: f64 = 0.25;
/// ... but at least this much.
pub const EXTRA_TIME_MIN: Duration = Duration::from_millis(100);
/// Pre-copy rounds whose dirty set did not shrink by a tenth before a
/// hybrid migration switches to post-copy.
pub const HYBRID_STALLED_ROUNDS: u32 = 3;

/// What the policy is told after each round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Round {
    /// Pages still to send (dirty, and held back by the tracker).
    pub dirty_pages: u64,
    /// How long sending them would take at the link's measured rate.
    pub left: Duration,
    /// Since the migration started.
    pub elapsed: Duration,
    /// The user asked a hybrid migration to switch now.
    pub postcopy_asked: bool,
}

/// What the source does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Another round while the guest runs.
    Continue,
    /// Pause the guest and send the rest with the state.
    Pause,
    /// Switch to post-copy (hybrid only).
    Postcopy,
    /// Not converged within the timeout: stop, the guest runs on here.
    GiveUp,
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct Convergence {
    downtime: Duration,
    timeout: Duration,
    hybrid: bool,
    least_dirty: u64,
    stalled: u32,
    /// When the rest first fit the downtime, and the rounds since.
    fit: Option<(Duration, u32)>,
}

impl Convergence {
    /// A policy for a migration with this downtime target and timeout;
    /// `hybrid`: post-copy may carry the rest.
    pub fn new(downtime: Duration, timeout: Duration, hybrid: bool) -> Convergence {
        Convergence {
            downtime,
            timeout,
            hybrid,
            least_dirty: u64::MAX,
            stalled: 0,
            fit: None,
        }
    }

    /// The decision before a round is sent: only the timeout can end one
    /// (with a pause if the rest has fit the target before: that migration
    /// is ready; else giving up, or for a hybrid one post-copy).
    pub fn before_round(&self, elapsed: Duration) -> Decision {
        match (elapsed > self.timeout, self.fit.is_some(), self.hybrid) {
            (false, _, _) => Decision::Continue,
            (true, true, _) => Decision::Pause,
            (true, false, true) => Decision::Postcopy,
            (true, false, false) => Decision::GiveUp,
        }
    }

    /// Whether the rest has fit the downtime target: the extra rounds are
    /// under way (throttling the guest more would not pay).
    pub fn fits(&self) -> bool {
        self.fit.is_some()
    }

    /// The decision after a round.
    pub fn after_round(&mut self, r: Round) -> Decision {
        let shrank = (r.dirty_pages as f64) < self.least_dirty as f64 * SHRINK;
        self.least_dirty = self.least_dirty.min(r.dirty_pages);
        // Asked to switch: at once, whatever else holds.
        if self.hybrid && r.postcopy_asked {
            return Decision::Postcopy;
        }
        let fits = r.left <= self.downtime;
        match (self.fit, fits) {
            (_, true) if r.dirty_pages == 0 => Decision::Pause,
            // The rest fits for the first time: from here on, only
            // shrinking pays.
            (None, true) => {
                self.fit = Some((r.elapsed, 0));
                Decision::Continue
            }
            (Some((fit_at, rounds)), _) => {
                let extra = (fit_at.mul_f64(EXTRA_TIME_SHARE)).max(EXTRA_TIME_MIN);
                let within = rounds + 1 < EXTRA_ROUNDS && r.elapsed < fit_at + extra;
                self.fit = Some((fit_at, rounds + 1));
                match (fits, shrank && within) {
                    (_, true) => Decision::Continue,
                    (true, false) => Decision::Pause,
                    // It fit before but not now (the guest sped up): the
                    // extra rounds are spent, pause at the next fit.
                    (false, false) => Decision::Continue,
                }
            }
            (None, false) => {
                if self.hybrid {
                    self.stalled = if shrank { 0 } else { self.stalled + 1 };
                    if self.stalled >= HYBRID_STALLED_ROUNDS {
                        return Decision::Postcopy;
                    }
                }
                Decision::Continue
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn round(dirty: u64, left_ms: u64, at_ms: u64) -> Round {
        Round {
            dirty_pages: dirty,
            left: MS * left_ms as u32,
            elapsed: MS * at_ms as u32,
            postcopy_asked: false,
        }
    }

    #[test]
    fn rounds_go_on_while_the_rest_fits_and_still_shrinks() {
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), false);
        assert_eq!(c.after_round(round(100_000, 900, 1000)), Decision::Continue);
        // Fits: one more round to see whether it still shrinks.
        assert_eq!(c.after_round(round(10_000, 40, 1100)), Decision::Continue);
        assert_eq!(c.after_round(round(5_000, 20, 1150)), Decision::Continue);
        assert_eq!(c.after_round(round(2_000, 8, 1170)), Decision::Continue);
        // No longer shrinking by a tenth: as small as it gets.
        assert_eq!(c.after_round(round(1_900, 7, 1180)), Decision::Pause);
    }

    #[test]
    fn an_empty_dirty_set_pauses_at_once() {
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), false);
        assert_eq!(c.after_round(round(0, 0, 10)), Decision::Pause);
    }

    #[test]
    fn extra_rounds_and_extra_time_are_bounded() {
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), false);
        assert_eq!(c.after_round(round(1 << 20, 40, 1000)), Decision::Continue);
        let mut dirty = 1u64 << 20;
        let mut decisions = Vec::new();
        for i in 1..20 {
            dirty /= 2;
            decisions.push(c.after_round(round(dirty, 40, 1000 + i)));
        }
        let continued = decisions
            .iter()
            .take_while(|d| **d == Decision::Continue)
            .count();
        assert_eq!(continued as u32, EXTRA_ROUNDS - 1, "{decisions:?}");
        assert_eq!(decisions[continued], Decision::Pause);

        // Time: 1 s until it fit, so 250 ms more at most.
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), false);
        c.after_round(round(1000, 40, 1000));
        assert_eq!(c.after_round(round(500, 20, 1200)), Decision::Continue);
        assert_eq!(c.after_round(round(200, 10, 1251)), Decision::Pause);
    }

    #[test]
    fn a_rest_that_stops_fitting_is_paused_at_its_next_fit() {
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), false);
        assert_eq!(c.after_round(round(1000, 40, 100)), Decision::Continue);
        // Bursty: it no longer fits, nor shrinks.
        assert_eq!(c.after_round(round(9000, 400, 200)), Decision::Continue);
        // Fits again, and no smaller than the smallest so far: pause.
        assert_eq!(c.after_round(round(990, 30, 300)), Decision::Pause);
        // A rest that flips between fitting and not never keeps it going.
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), false);
        let mut decisions = Vec::new();
        for i in 0..40u64 {
            let (dirty, left) = if i % 2 == 0 {
                (1000 - i, 40)
            } else {
                (9000, 400)
            };
            decisions.push(c.after_round(round(dirty, left, 100 + i)));
        }
        assert!(decisions.contains(&Decision::Pause), "{decisions:?}");
    }

    #[test]
    fn a_timeout_after_the_rest_fit_pauses() {
        let mut c = Convergence::new(MS * 50, Duration::from_secs(1), false);
        assert_eq!(c.after_round(round(1000, 40, 900)), Decision::Continue);
        assert!(c.fits());
        assert_eq!(c.before_round(MS * 1001), Decision::Pause);
    }

    #[test]
    fn a_switch_asked_for_is_taken_even_when_the_rest_fits() {
        let mut c = Convergence::new(MS * 50, Duration::from_secs(60), true);
        assert_eq!(c.after_round(round(1000, 40, 100)), Decision::Continue);
        let mut r = round(500, 20, 200);
        r.postcopy_asked = true;
        assert_eq!(c.after_round(r), Decision::Postcopy);
    }

    #[test]
    fn hybrid_switches_after_stalled_rounds_or_when_asked() {
        let mut c = Convergence::new(MS * 10, Duration::from_secs(60), true);
        assert_eq!(c.after_round(round(1000, 500, 100)), Decision::Continue);
        assert_eq!(c.after_round(round(990, 500, 200)), Decision::Continue);
        assert_eq!(c.after_round(round(995, 500, 300)), Decision::Continue);
        assert_eq!(c.after_round(round(980, 500, 400)), Decision::Postcopy);

        let mut c = Convergence::new(MS * 10, Duration::from_secs(60), true);
        let mut r = round(1000, 500, 100);
        r.postcopy_asked = true;
        assert_eq!(c.after_round(r), Decision::Postcopy);
        // Pre-copy never switches.
        let mut c = Convergence::new(MS * 10, Duration::from_secs(60), false);
        for i in 0..10 {
            assert_eq!(c.after_round(round(1000, 500, i)), Decision::Continue);
        }
    }

    #[test]
    fn the_timeout_ends_pre_copy_and_switches_hybrid() {
        let c = Convergence::new(MS * 10, Duration::from_secs(1), false);
        assert_eq!(c.before_round(MS * 999), Decision::Continue);
        assert_eq!(c.before_round(MS * 1001), Decision::GiveUp);
        let c = Convergence::new(MS * 10, Duration::from_secs(1), true);
        assert_eq!(c.before_round(MS * 1001), Decision::Postcopy);
    }
}
