//! Two of the booster's decisions, as pure functions of the numbers they
//! read (so that unit tests feed them): whether a vCPU thread waits for a
//! CPU lately ([`Contention`], from its run-queue wait), and whether the
//! guest's unboost call keeps the boost ([`keeps`]).

/// Whether a thread has lately waited for a CPU, from its run-queue wait
/// (the second field of `/proc/.../schedstat`, ns) read once per monitor
/// poll. One poll in which it waited [`Contention::MIN_WAIT_NS`] or more
/// makes it contended for the next [`Contention::QUIET_POLLS`] polls: a
/// boosted thread stops waiting, and the boost must not flap off with it.
#[derive(Clone, Copy, Debug)]
pub struct Contention {
    last_wait_ns: Option<u64>,
    quiet_polls: u32,
}

impl Default for Contention {
    fn default() -> Self {
        // Uncontended until a wait is seen.
        Contention {
            last_wait_ns: None,
            quiet_polls: Self::QUIET_POLLS,
        }
    }
}

impl Contention {
    /// A poll with at least this much run-queue wait is a contended one.
    pub const MIN_WAIT_NS: u64 = 20_000;
    /// Polls without such a wait after which the thread is uncontended.
    pub const QUIET_POLLS: u32 = 200;

    /// Take the thread's total run-queue wait now; whether it counts as
    /// contended from here.
    pub fn saw(&mut self, wait_ns: u64) -> bool {
        let waited = self
            .last_wait_ns
            .map_or(0, |last| wait_ns.saturating_sub(last));
        self.last_wait_ns = Some(wait_ns);
        self.quiet_polls = if waited >= Self::MIN_WAIT_NS {
            0
        } else {
            self.quiet_polls.saturating_add(1)
        };
        self.contended()
    }

    /// Whether the thread counts as contended now.
    pub fn contended(&self) -> bool {
        self.quiet_polls < Self::QUIET_POLLS
    }
}

/// The run-queue wait in a `schedstat` line (`cpu_ns wait_ns slices`).
pub fn schedstat_wait_ns(line: &str) -> Option<u64> {
    line.split_whitespace().nth(1)?.parse().ok()
}

/// What the unboost call knows when it decides.
#[derive(Clone, Copy, Debug)]
pub struct KeepCheck {
    /// `--boost-keep-us` (0: never keep).
    pub keep_us: u64,
    /// The guest's next announced real-time wake-up, TSC (0: none).
    pub wake_at: u64,
    /// The TSC now.
    pub tsc: u64,
    /// The guest's TSC rate, kHz.
    pub tsc_khz: u64,
    /// CPU time the thread has used since the boost began, ns.
    pub cpu_used_ns: u64,
    /// `--boost-max-ms`.
    pub max_ms: u64,
}

/// Whether the guest's unboost call keeps the boost: its next real-time
/// wake-up is announced and due within `keep_us`, and the boost has used
/// under half of `max_ms` of CPU time (so a kept boost ends, by a normal
/// unboost, long before the throttle would revoke it).
pub fn keeps(c: KeepCheck) -> bool {
    if c.keep_us == 0 || c.wake_at <= c.tsc {
        return false;
    }
    let due_us = (c.wake_at - c.tsc).saturating_mul(1000) / c.tsc_khz.max(1);
    due_us <= c.keep_us && c.cpu_used_ns < c.max_ms.saturating_mul(1_000_000) / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_that_waits_is_contended_until_it_has_been_quiet_a_while() {
        let mut c = Contention::default();
        assert!(!c.contended(), "uncontended until a wait is seen");
        assert!(!c.saw(1_000_000), "the first reading is a baseline");
        assert!(!c.saw(1_005_000), "5 us of waiting is noise");
        assert!(c.saw(1_100_000), "100 us of waiting in a poll");
        // Boosted, it no longer waits: still contended for a while.
        for _ in 0..Contention::QUIET_POLLS - 1 {
            assert!(c.saw(1_100_000));
        }
        assert!(!c.saw(1_100_000), "quiet long enough");
        assert!(c.saw(1_200_000), "and contended again at the next wait");
    }

    #[test]
    fn schedstat_lines_are_read() {
        assert_eq!(
            schedstat_wait_ns("334333729 124312645 2142\n"),
            Some(124_312_645)
        );
        assert_eq!(schedstat_wait_ns("12"), None);
        assert_eq!(schedstat_wait_ns(""), None);
    }

    fn check(wake_in_us: u64, cpu_used_ms: u64) -> KeepCheck {
        let tsc_khz = 2_000_000;
        KeepCheck {
            keep_us: 1000,
            wake_at: 1_000_000_000 + wake_in_us * tsc_khz / 1000,
            tsc: 1_000_000_000,
            tsc_khz,
            cpu_used_ns: cpu_used_ms * 1_000_000,
            max_ms: 10,
        }
    }

    #[test]
    fn a_boost_is_kept_across_a_short_gap_only() {
        assert!(keeps(check(400, 1)), "wake-up in 400 us, 1 ms of 10 used");
        assert!(keeps(check(1000, 1)), "at the limit");
        assert!(!keeps(check(1500, 1)), "wake-up too far");
        assert!(
            !keeps(KeepCheck {
                wake_at: 0,
                ..check(400, 1)
            }),
            "none announced"
        );
        assert!(
            !keeps(KeepCheck {
                tsc: u64::MAX,
                ..check(400, 1)
            }),
            "already due"
        );
        assert!(
            !keeps(KeepCheck {
                keep_us: 0,
                ..check(400, 1)
            }),
            "keeping off"
        );
    }

    #[test]
    fn a_kept_boost_ends_before_the_throttle_would_revoke_it() {
        assert!(keeps(check(400, 4)));
        assert!(
            !keeps(check(400, 5)),
            "half of --boost-max-ms used: unboost"
        );
        assert!(!keeps(check(400, 50)), "a rogue guest is never kept");
    }
}
