//! A bound on how often one kind of warning is logged: outside input (a
//! stream of failing migration handshakes) must not be able to fill the
//! log. At most `burst` lines per window; past that the rest of the
//! window's are counted, and the first line of the next window says how
//! many were left out.

use crate::sync::Locked;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The budget of one kind of warning.
pub struct LogBudget {
    burst: u32,
    window: Duration,
    state: Mutex<State>,
}

struct State {
    since: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogBudget {
    /// At most `burst` lines each `window`.
    pub const fn new(burst: u32, window: Duration) -> LogBudget {
        LogBudget {
            burst,
            window,
            state: Mutex::new(State {
                since: None,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged at `now`, and how many were left out
    /// before it (to say so in it); None: leave this one out.
    pub fn take(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.locked();
        if s.since.is_none_or(|t| now.duration_since(t) >= self.window) {
            s.since = Some(now);
            s.logged = 0;
        }
        if s.logged < self.burst {
            s.logged += 1;
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed += 1;
            None
        }
    }
}

/// Log `msg` as a warning within `budget`, noting lines left out before it.
pub fn warn_within(budget: &LogBudget, msg: impl FnOnce() -> String) {
    match budget.take(Instant::now()) {
        Some(0) => tracing::warn!("{}", msg()),
        Some(n) => tracing::warn!("{} ({n} more like it were not logged)", msg()),
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_logged_the_rest_counted_and_reported_in_the_next_window() {
        let b = LogBudget::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        let taken: Vec<_> = (0..10)
            .map(|i| b.take(t0 + Duration::from_millis(i)))
            .collect();
        assert_eq!(&taken[..3], &[Some(0), Some(0), Some(0)]);
        assert!(taken[3..].iter().all(Option::is_none));
        assert_eq!(b.take(t0 + Duration::from_secs(61)), Some(7));
        assert_eq!(b.take(t0 + Duration::from_secs(62)), Some(0));
    }
}
