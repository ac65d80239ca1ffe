//! The rounds of a pre-copy migration as a policy, fed each round's
//! numbers (the source's loop in `vm/source/` does the I/O): the link's
//! rate measured from the rounds, the pages a tracker may hold back for
//! the final round, when to pause, switch to post-copy or give up
//! ([`Convergence`]), and how hard to throttle the vCPUs ([`Policy`]).

use std::time::Duration;

use hover_abi::layout::PAGE_SIZE;

use super::convergence::{Convergence, Decision, Round};
use super::throttle::Policy;
use super::{postcopy::Mode, transfer_time, MigrateOptions};

/// A round smaller than this is not used to measure the link's rate.
pub const MIN_RATE_BYTES: u64 = 1 << 20;

/// One round as sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sent {
    /// Pages sent.
    pub pages: u64,
    /// Bytes they took on the link.
    pub bytes: u64,
    /// How long sending them took.
    pub took: Duration,
}

/// What the guest left to send after a round.
#[derive(Clone, Debug, PartialEq)]
pub struct Dirty {
    /// Pages dirty or held back by the tracker.
    pub pages: u64,
    /// With per-vCPU dirty counts (rings): each vCPU's.
    pub per_vcpu: Option<Vec<u64>>,
    /// Since the migration started.
    pub elapsed: Duration,
    /// The user asked a hybrid migration to switch now.
    pub postcopy_asked: bool,
}

/// What the source does after a round.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Another round, the pause, post-copy (never giving up: only the
    /// timeout before a round does that).
    pub decision: Decision,
    /// How long sending the rest would take at the measured rate.
    pub left: Duration,
    /// The throttle to set on each vCPU now, if it changes.
    pub throttle: Option<Vec<u8>>,
}

/// See the module documentation.
pub struct Rounds {
    downtime: Duration,
    timeout: Duration,
    convergence: Convergence,
    policy: Policy,
    throttle_on: bool,
    throttle_max: u8,
    /// The link's rate, bytes a second, once measured.
    rate: Option<f64>,
    /// A round large enough to measure the rate by itself was sent.
    measured: bool,
    /// Everything sent so far, and the time it took (the rate while all
    /// rounds were small).
    sent_bytes: u64,
    sending: Duration,
}

impl Rounds {
    /// The rounds of migration `o` of a VM with `vcpus` vCPUs.
    pub fn new(o: &MigrateOptions, vcpus: usize) -> Rounds {
        Rounds {
            downtime: o.downtime,
            timeout: o.timeout,
            convergence: Convergence::new(o.downtime, o.timeout, o.mode == Mode::Hybrid),
            policy: Policy::new(o.throttle, vcpus),
            throttle_on: o.throttle.on,
            throttle_max: o.throttle.max,
            rate: None,
            measured: false,
            sent_bytes: 0,
            sending: Duration::ZERO,
        }
    }

    /// Before a round, `elapsed` into the migration: only the timeout ends
    /// the rounds here ([`Convergence::before_round`]).
    pub fn before_round(&self, elapsed: Duration) -> Decision {
        self.convergence.before_round(elapsed)
    }

    /// A round was sent: the link's rate from it (a large round's own, or
    /// while every round was small, theirs together); the pages a tracker
    /// may hold back for the final round, half of the downtime at that rate.
    pub fn sent(&mut self, s: Sent) -> u64 {
        self.sent_bytes += s.bytes;
        self.sending += s.took;
        if s.bytes >= MIN_RATE_BYTES {
            self.rate = Some(s.bytes as f64 / s.took.as_secs_f64().max(1e-6));
            self.measured = true;
        } else if !self.measured && self.sent_bytes > 0 {
            self.rate = Some(self.sent_bytes as f64 / self.sending.as_secs_f64().max(1e-6));
        }
        (self.rate() * self.downtime.as_secs_f64() / 2.0 / PAGE_SIZE as f64) as u64
    }

    /// The round that sent `sent` pages left `dirty`: what comes next.
    /// Once the rest fits the downtime, the rounds left only trim it:
    /// slowing the guest more would not pay.
    pub fn round(&mut self, sent: u64, dirty: &Dirty) -> Step {
        let left = transfer_time(dirty.pages, self.rate());
        let decision = self.convergence.after_round(Round {
            dirty_pages: dirty.pages,
            left,
            elapsed: dirty.elapsed,
            postcopy_asked: dirty.postcopy_asked,
        });
        let throttle = match decision {
            Decision::Continue | Decision::GiveUp if !self.convergence.fits() => self
                .policy
                .after_round(sent, dirty.pages, dirty.per_vcpu.as_deref())
                .map(<[u8]>::to_vec),
            _ => None,
        };
        Step {
            decision,
            left,
            throttle,
        }
    }

    /// The link's measured rate, bytes a second (0 before any round).
    pub fn rate(&self) -> f64 {
        self.rate.unwrap_or(0.0)
    }

    /// The highest throttle each vCPU reached.
    pub fn peak(&self) -> &[u8] {
        self.policy.peak()
    }

    /// Why the rounds gave up after `rounds` rounds with `pending` pages
    /// dirty, and what to change.
    pub fn give_up(&self, rounds: u32, pending: usize) -> String {
        let most = self.peak().iter().copied().max().unwrap_or(0);
        let hint = if !self.throttle_on {
            "; turn --auto-converge on, or raise --timeout or --downtime-ms"
        } else if most < self.throttle_max {
            "; raise --timeout, --downtime-ms or --throttle-step"
        } else {
            "; raise --timeout or --downtime-ms, or lower the guest's write rate"
        };
        format!(
            "not done after {:?} ({rounds} rounds; the last had {pending} dirty pages, the link moves {:.0} MB/s, vCPUs throttled up to {most}%){hint}",
            self.timeout,
            self.rate() / 1e6
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::Addr;

    fn options(mode: Mode) -> MigrateOptions {
        let mut o = MigrateOptions::to("unix:/x".parse::<Addr>().unwrap());
        o.mode = mode;
        o.downtime = Duration::from_millis(100);
        o.timeout = Duration::from_secs(10);
        o
    }

    fn dirty(pages: u64, at_ms: u64) -> Dirty {
        Dirty {
            pages,
            per_vcpu: None,
            elapsed: Duration::from_millis(at_ms),
            postcopy_asked: false,
        }
    }

    const MB: u64 = 1 << 20;

    #[test]
    fn the_rate_comes_from_large_rounds_or_all_small_ones_together() {
        let mut r = Rounds::new(&options(Mode::Precopy), 1);
        assert_eq!(r.rate(), 0.0);
        let small = |ms| Sent {
            pages: 16,
            bytes: 64 << 10,
            took: Duration::from_millis(ms),
        };
        r.sent(small(1));
        r.sent(small(3));
        assert!(
            (r.rate() - (128 << 10) as f64 / 0.004).abs() < 1.0,
            "{}",
            r.rate()
        );
        // A large round's own rate replaces the small ones' estimate.
        let held = r.sent(Sent {
            pages: 2560,
            bytes: 10 * MB,
            took: Duration::from_millis(100),
        });
        assert!((r.rate() - 100.0 * MB as f64).abs() < 1.0, "{}", r.rate());
        // Half of the 100 ms downtime at 100 MiB/s, in pages.
        assert_eq!(held, (100.0 * MB as f64 * 0.05 / 4096.0) as u64);
    }

    #[test]
    fn the_rounds_pause_once_the_rest_stops_shrinking_and_throttle_only_before() {
        let mut r = Rounds::new(&options(Mode::Precopy), 2);
        r.sent(Sent {
            pages: 25_600,
            bytes: 100 * MB,
            took: Duration::from_secs(1),
        });
        // A guest dirtying more than half of what was sent, twice: throttled.
        let step = r.round(25_600, &dirty(20_000, 1000));
        assert_eq!((step.decision, step.throttle), (Decision::Continue, None));
        let step = r.round(25_600, &dirty(20_000, 2000));
        assert_eq!(step.decision, Decision::Continue);
        assert_eq!(
            step.throttle,
            Some(vec![20, 20]),
            "both vCPUs, the first step"
        );
        assert!(step.left > Duration::from_millis(100));
        // The rest fits (1000 pages at 100 MiB/s: ~39 ms): no more throttle.
        let step = r.round(20_000, &dirty(1000, 2500));
        assert_eq!((step.decision, step.throttle), (Decision::Continue, None));
        assert!(step.left <= Duration::from_millis(100));
        // It stops shrinking: the pause.
        let step = r.round(1000, &dirty(1000, 2600));
        assert_eq!(step.decision, Decision::Pause);
        assert_eq!(r.peak(), &[20, 20]);
    }

    #[test]
    fn at_the_timeout_precopy_gives_up_saying_why_and_hybrid_switches() {
        let r = Rounds::new(&options(Mode::Precopy), 1);
        assert_eq!(r.before_round(Duration::from_secs(11)), Decision::GiveUp);
        let why = r.give_up(7, 12_345);
        assert!(
            why.contains("7 rounds") && why.contains("12345 dirty pages"),
            "{why}"
        );
        assert!(
            why.contains("--throttle-step"),
            "throttled below its max: {why}"
        );
        let h = Rounds::new(&options(Mode::Hybrid), 1);
        assert_eq!(h.before_round(Duration::from_secs(11)), Decision::Postcopy);
        let mut asked = Rounds::new(&options(Mode::Hybrid), 1);
        let mut d = dirty(50_000, 100);
        d.postcopy_asked = true;
        assert_eq!(asked.round(1, &d).decision, Decision::Postcopy);
    }
}
