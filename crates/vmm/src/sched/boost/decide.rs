//! The booster's decisions, as pure functions of the numbers they read
//! (so that unit tests feed them): whether a vCPU thread waits for a CPU
//! lately ([`Contention`], from its run-queue wait), whether the guest's
//! unboost call keeps the boost ([`keep`]), when a kept boost ends
//! ([`kept_boost_ends`]) and when a host-side one does
//! ([`host_boost_ends`]).

use std::time::{Duration, Instant};

/// Whether a thread has lately waited for a CPU, from its run-queue wait
/// (the second field of `/proc/.../schedstat`, ns), sampled at most once
/// per [`Contention::SAMPLE`] of wall time. A sample in which it waited
/// [`Contention::MIN_WAIT_NS`] or more makes it contended for the next
/// [`Contention::HOLD`]: a boosted thread stops waiting, and its boosts
/// must not flap off with it. For the same reason a thread boosted for
/// the whole of a sample stays contended as long as it was: a boost kept
/// across many wake-ups (`--boost-keep-us`) would otherwise outlast the
/// hold, and the next wake-up would find its boost refused. Only for the
/// whole sample: a thread boosted briefly and often (for each interrupt)
/// is often boosted when sampled, and was held contended for good by one
/// wait at start-up, on an idle host too.
#[derive(Clone, Copy, Debug, Default)]
pub struct Contention {
    /// The last sample: when, and the total wait then.
    last: Option<(Instant, u64)>,
    /// When the thread last waited enough.
    waited_at: Option<Instant>,
}

impl Contention {
    /// Samples are at least this far apart, whatever wakes the monitor.
    pub const SAMPLE: Duration = Duration::from_millis(1);
    /// A sample with at least this much run-queue wait is a contended one.
    pub const MIN_WAIT_NS: u64 = 20_000;
    /// How long one contended sample counts.
    pub const HOLD: Duration = Duration::from_millis(200);

    /// Offer the thread's total run-queue wait `wait_ns` at `now`, and
    /// since when it runs boosted (`None`: it does not); whether it counts
    /// as contended from here.
    pub fn saw(&mut self, now: Instant, wait_ns: u64, boosted_since: Option<Instant>) -> bool {
        match self.last {
            None => self.last = Some((now, wait_ns)),
            Some((at, last)) if now.duration_since(at) >= Self::SAMPLE => {
                let boosted_throughout = boosted_since.is_some_and(|t| t <= at);
                if wait_ns.saturating_sub(last) >= Self::MIN_WAIT_NS
                    || (boosted_throughout && self.contended(now))
                {
                    self.waited_at = Some(now);
                }
                self.last = Some((now, wait_ns));
            }
            Some(_) => {}
        }
        self.contended(now)
    }

    /// Whether the thread counts as contended at `now`.
    pub fn contended(&self, now: Instant) -> bool {
        self.waited_at
            .is_some_and(|t| now.duration_since(t) < Self::HOLD)
    }
}

/// The run-queue wait in a `schedstat` line (`cpu_ns wait_ns slices`);
/// `None` where the kernel keeps no such statistics (all zeros).
pub fn schedstat_wait_ns(line: &str) -> Option<u64> {
    let mut f = line.split_whitespace().map(|v| v.parse::<u64>().ok());
    let (Some(Some(cpu)), Some(Some(wait))) = (f.next(), f.next()) else {
        return None;
    };
    (cpu != 0 || wait != 0).then_some(wait)
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

/// What the unboost call does with a boost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Keep it: the next wake-up is near and the boost can afford the gap.
    Yes,
    /// Unboost: no wake-up announced within `keep_us` (or keeping is off).
    NotNear,
    /// Unboost: the wake-up is near, but the boost could then run past
    /// half of `max_ms` of CPU time; a boost starts afresh later.
    OverBudget,
}

/// Whether the guest's unboost call keeps the boost: its next real-time
/// wake-up is announced and due within `keep_us`, and even a vCPU that
/// ran flat out until then would stay within half of `max_ms` of CPU time
/// for this boost, so a kept boost ends by a normal unboost long before
/// the throttle could revoke it. A wake-up already past is due now: a
/// guest running behind its real-time task (a loaded host) would otherwise
/// be unboosted here only for the monitor to boost it again at its next
/// look, as a late timer boost; the kept boost still ends
/// [`KEPT_GRACE`](super::KEPT_GRACE) after the keep if the task does not
/// run by then ([`kept_boost_ends`]).
pub fn keep(c: KeepCheck) -> Keep {
    if c.keep_us == 0 || c.wake_at == 0 {
        return Keep::NotNear;
    }
    let due_us = c.wake_at.saturating_sub(c.tsc).saturating_mul(1000) / c.tsc_khz.max(1);
    if due_us > c.keep_us {
        return Keep::NotNear;
    }
    let half_ns = c.max_ms.saturating_mul(1_000_000) / 2;
    match c.cpu_used_ns.saturating_add(due_us.saturating_mul(1000)) <= half_ns {
        true => Keep::Yes,
        false => Keep::OverBudget,
    }
}

/// What the monitor knows when it checks a kept boost (no request set).
#[derive(Clone, Copy, Debug)]
pub struct KeptCheck {
    /// The TSC now.
    pub tsc: u64,
    /// The kept boost's end: the wake-up (or the keep, for one already
    /// past) and the grace, TSC.
    pub until: u64,
    /// CPU time the thread has had since the keep, ns (`None`: no CPU
    /// clock).
    pub ran_ns: Option<u64>,
    /// [`KEPT_GRACE`](super::KEPT_GRACE).
    pub grace: Duration,
    /// How far past its end a kept boost lasts on a thread that has not
    /// had `grace` of CPU: `--boost-max-ms`, in ticks.
    pub cap_ticks: u64,
}

/// Whether the monitor ends a kept boost: its end has passed and its
/// thread has had `grace` of CPU time since the keep, time in which the
/// guest could have taken its wake-up and did not. A thread the host kept
/// off its CPU (a loaded or nested host) keeps the boost it was given for
/// that very wait, up to `cap_ticks` past the end, which also bounds a
/// vCPU that halts for good with a boost kept (a halted thread, like a
/// waiting one, uses no CPU). Without a CPU clock the end alone decides.
pub fn kept_boost_ends(c: KeptCheck) -> bool {
    if c.tsc <= c.until {
        return false;
    }
    match c.ran_ns {
        None => true,
        Some(ran) => {
            ran >= c.grace.as_nanos() as u64 || c.tsc > c.until.saturating_add(c.cap_ticks)
        }
    }
}

/// The scheduler state in a thread's `/proc/.../stat` line (`R`, `S`,
/// `D`...): the field after the command, which is in parentheses and may
/// itself hold spaces and parentheses.
pub fn stat_state(line: &str) -> Option<char> {
    let rest = &line[line.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// Why the monitor ends a host-side boost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostEnd {
    /// The vCPU's thread sleeps: it halted (KVM blocks a halted vCPU in an
    /// interruptible sleep), so the interrupt's work is done.
    Halted,
    /// Its thread ran `--boost-irq-us` of CPU time since the boost.
    Budget,
    /// Neither its state nor its CPU time can be read: a boost nobody can
    /// watch is not left on.
    Unwatched,
}

/// Whether a host-side boost ends now: its thread is seen asleep (`state`
/// `S`; not `D`, a wait for the host's own I/O, after which the vCPU goes
/// on with the interrupt's work), or it ran `budget_ns` of CPU time since
/// the boost (`ran_ns`; `None`: no CPU clock, so the state alone decides).
pub fn host_boost_ends(
    state: Option<char>,
    ran_ns: Option<u64>,
    budget_ns: u64,
) -> Option<HostEnd> {
    if state.is_none() && ran_ns.is_none() {
        return Some(HostEnd::Unwatched);
    }
    if ran_ns.is_some_and(|r| r >= budget_ns) {
        return Some(HostEnd::Budget);
    }
    (state == Some('S')).then_some(HostEnd::Halted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_is_read_past_a_command_with_parentheses() {
        assert_eq!(stat_state("123 (vcpu 0) S 1 2 3"), Some('S'));
        assert_eq!(stat_state("123 (a) b) (c) R 1"), Some('R'));
        assert_eq!(stat_state("123 (cut"), None);
        assert_eq!(stat_state("123 (x)"), None);
    }

    #[test]
    fn a_host_boost_ends_at_a_halt_or_at_its_budget() {
        let budget = 1_000_000;
        assert_eq!(host_boost_ends(Some('R'), Some(10), budget), None);
        assert_eq!(
            host_boost_ends(Some('D'), Some(10), budget),
            None,
            "a host I/O wait"
        );
        assert_eq!(
            host_boost_ends(Some('S'), Some(10), budget),
            Some(HostEnd::Halted)
        );
        assert_eq!(
            host_boost_ends(Some('R'), Some(budget), budget),
            Some(HostEnd::Budget)
        );
        assert_eq!(
            host_boost_ends(Some('S'), Some(budget), budget),
            Some(HostEnd::Budget)
        );
        assert_eq!(
            host_boost_ends(None, None, budget),
            Some(HostEnd::Unwatched)
        );
        assert_eq!(host_boost_ends(None, Some(10), budget), None);
        assert_eq!(
            host_boost_ends(Some('S'), None, budget),
            Some(HostEnd::Halted)
        );
    }

    #[test]
    fn a_thread_that_waits_is_contended_for_a_while_after() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut c = Contention::default();
        assert!(!c.contended(t0), "uncontended until a wait is seen");
        assert!(
            !c.saw(ms(0), 1_000_000, None),
            "the first reading is a baseline"
        );
        assert!(!c.saw(ms(1), 1_005_000, None), "5 us of waiting is noise");
        assert!(c.saw(ms(2), 1_100_000, None), "100 us of waiting");
        // Boosted, it no longer waits: still contended for HOLD.
        assert!(c.saw(ms(150), 1_100_000, None));
        assert!(
            !c.saw(ms(203), 1_100_000, None),
            "quiet for longer than HOLD"
        );
        assert!(
            c.saw(ms(204), 1_200_000, None),
            "and contended again at the next wait"
        );
    }

    #[test]
    fn samples_closer_than_a_millisecond_do_not_split_a_wait() {
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let mut c = Contention::default();
        c.saw(us(0), 0, None);
        // 12 us of waiting in each of four passes 250 us apart: 48 us over
        // one sample, however often the monitor woke.
        assert!(!c.saw(us(250), 12_000, None));
        assert!(!c.saw(us(500), 24_000, None));
        assert!(!c.saw(us(750), 36_000, None));
        assert!(c.saw(us(1000), 48_000, None));
    }

    /// A thread seen waiting 100 us in its first millisecond (a sample at
    /// 0 and 1 ms), and the clock of those samples in milliseconds.
    fn waited_in_the_first_ms() -> (Contention, impl Fn(u64) -> Instant) {
        let t0 = Instant::now();
        let ms = move |n| t0 + Duration::from_millis(n);
        let mut c = Contention::default();
        c.saw(ms(0), 0, None);
        assert!(c.saw(ms(1), 100_000, None), "it waited");
        (c, ms)
    }

    #[test]
    fn a_thread_boosted_throughout_stays_contended() {
        let (mut c, ms) = waited_in_the_first_ms();
        // Boosted from here on: no more waiting, for far longer than HOLD.
        for t in (2..1000).step_by(50) {
            assert!(
                c.saw(ms(t), 100_000, Some(ms(1))),
                "still contended at {t} ms"
            );
        }
        // Unboosted and not waiting: the hold runs out as before.
        assert!(c.saw(ms(1100), 100_000, None));
        assert!(!c.saw(ms(1300), 100_000, None));
        // A boosted thread that never waited is not contended.
        let mut idle = Contention::default();
        idle.saw(ms(0), 0, Some(ms(0)));
        assert!(!idle.saw(ms(10), 0, Some(ms(0))));
    }

    #[test]
    fn a_thread_boosted_briefly_at_each_sample_is_not_held_contended() {
        // One wait, at start-up.
        let (mut c, ms) = waited_in_the_first_ms();
        // From here boosted for each interrupt, so boosted at each sample,
        // but each boost began after the sample before: no more waits.
        let mut contended_at = Vec::new();
        for t in (2..1000).step_by(50) {
            if c.saw(ms(t), 100_000, Some(ms(t) - Duration::from_micros(30))) {
                contended_at.push(t);
            }
        }
        assert!(
            contended_at.iter().all(|&t| t < 201),
            "the hold ran out: {contended_at:?}"
        );
    }

    #[test]
    fn schedstat_lines_are_read() {
        assert_eq!(
            schedstat_wait_ns("334333729 124312645 2142\n"),
            Some(124_312_645)
        );
        assert_eq!(schedstat_wait_ns("0 0 0\n"), None, "no schedstats here");
        assert_eq!(schedstat_wait_ns("12"), None);
        assert_eq!(schedstat_wait_ns(""), None);
    }

    fn check(wake_in_us: u64, cpu_used_us: u64) -> KeepCheck {
        let tsc_khz = 2_000_000;
        KeepCheck {
            keep_us: 1000,
            wake_at: 1_000_000_000 + wake_in_us * tsc_khz / 1000,
            tsc: 1_000_000_000,
            tsc_khz,
            cpu_used_ns: cpu_used_us * 1000,
            max_ms: 10,
        }
    }

    #[test]
    fn a_boost_is_kept_across_a_short_gap_only() {
        assert_eq!(
            keep(check(400, 1000)),
            Keep::Yes,
            "wake-up in 400 us, 1 ms of 10 used"
        );
        assert_eq!(keep(check(1000, 1000)), Keep::Yes, "at the limit");
        assert_eq!(keep(check(1500, 1000)), Keep::NotNear, "wake-up too far");
        assert_eq!(
            keep(KeepCheck {
                wake_at: 0,
                ..check(400, 1)
            }),
            Keep::NotNear
        );
        assert_eq!(
            keep(KeepCheck {
                tsc: u64::MAX,
                ..check(400, 1)
            }),
            Keep::Yes,
            "a wake-up already past is due now"
        );
        assert_eq!(
            keep(KeepCheck {
                tsc: u64::MAX,
                ..check(400, 5000)
            }),
            Keep::Yes,
            "due now: the whole half of the limit is the budget"
        );
        assert_eq!(
            keep(KeepCheck {
                tsc: u64::MAX,
                ..check(400, 5001)
            }),
            Keep::OverBudget,
            "and still within the budget only"
        );
        assert_eq!(
            keep(KeepCheck {
                wake_at: 1,
                ..check(400, 1)
            }),
            Keep::Yes,
            "a wake-up announced long past: due now"
        );
        assert_eq!(
            keep(KeepCheck {
                keep_us: 0,
                ..check(400, 1)
            }),
            Keep::NotNear
        );
    }

    #[test]
    fn a_kept_boost_ends_once_its_vcpu_had_the_cpu_or_at_the_cap() {
        let c = KeptCheck {
            tsc: 1001,
            until: 1000,
            ran_ns: Some(1_000_000),
            grace: Duration::from_millis(1),
            cap_ticks: 500,
        };
        assert!(kept_boost_ends(c), "ran its grace past the end: unanswered");
        assert!(!kept_boost_ends(KeptCheck { tsc: 1000, ..c }), "at the end");
        let starved = KeptCheck {
            ran_ns: Some(200_000),
            ..c
        };
        assert!(!kept_boost_ends(starved), "kept off its CPU: kept on");
        assert!(!kept_boost_ends(KeptCheck {
            tsc: 1500,
            ..starved
        }));
        assert!(
            kept_boost_ends(KeptCheck {
                tsc: 1501,
                ..starved
            }),
            "past the cap: ended, halted or not"
        );
        assert!(
            kept_boost_ends(KeptCheck { ran_ns: None, ..c }),
            "no CPU clock: the end alone"
        );
        assert!(
            !kept_boost_ends(KeptCheck {
                tsc: u64::MAX,
                until: u64::MAX - 1,
                ..starved
            }),
            "no overflow"
        );
    }

    #[test]
    fn a_kept_boost_can_afford_its_gap_within_half_the_limit() {
        // 4.5 ms used + 0.4 ms gap <= 5 ms: kept; 4.7 + 0.4 > 5: not.
        assert_eq!(keep(check(400, 4500)), Keep::Yes);
        assert_eq!(keep(check(400, 4700)), Keep::OverBudget);
        // A long gap cannot be kept even on a fresh boost when the vCPU
        // could run through all of it past half the limit.
        let long = KeepCheck {
            keep_us: 100_000,
            ..check(6000, 0)
        };
        assert_eq!(keep(long), Keep::OverBudget);
        assert_eq!(
            keep(check(400, 50_000)),
            Keep::OverBudget,
            "a rogue guest is never kept"
        );
    }
}
