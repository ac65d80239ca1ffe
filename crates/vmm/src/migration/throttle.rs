//! Slowing down vCPUs that dirty memory faster than the link moves it, so
//! that pre-copy converges (QEMU's auto-converge and dirty-limit are the
//! anchors).
//!
//! A throttled vCPU runs for a time slice, then sleeps `pct / (100 - pct)`
//! slices: at 50% it runs half the time, at 99% a hundredth. The sleep is
//! taken by the vCPU's own thread between two `KVM_RUN`s, waiting on its
//! message channel, so a pause or stop is heard at once even mid-sleep. A
//! guest that never exits to the monitor would never reach that point, so
//! while any vCPU is throttled a [`Ticker`] kicks the throttled threads
//! once per slice.
//!
//! [`Policy`] decides the percentages after each round: a round in which
//! the guest dirtied more than half of what the round sent does not
//! converge; after two such rounds throttling starts at `initial` and grows
//! by `step` per further such round, up to `max`. With dirty rings the
//! harvest says which vCPU wrote what, and only the dirtiest vCPUs are
//! slowed (those writing at least half as much as the worst); a vCPU that
//! has gone quiet is released a step per round. Without rings every vCPU
//! shares the blame.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The run slice of a throttled vCPU (QEMU's `CPU_THROTTLE_TIMESLICE_NS`).
pub const SLICE: Duration = Duration::from_millis(10);
/// The highest throttle accepted: a vCPU must still make progress.
pub const MAX_PCT: u8 = 99;
/// The first throttle by default, percent (QEMU's cpu-throttle-initial).
pub const DEFAULT_INITIAL_PCT: u8 = 20;
/// The default step per round that does not converge, percent (QEMU's
/// cpu-throttle-increment).
pub const DEFAULT_STEP_PCT: u8 = 10;

#[derive(Default)]
struct VcpuThrottle {
    pct: AtomicU8,
    slept_us: AtomicU64,
}

/// Each vCPU's throttle, shared by the VM and its vCPU threads.
pub struct Throttle {
    vcpus: Vec<VcpuThrottle>,
}

impl Throttle {
    /// No throttle on any of `vcpus` vCPUs.
    pub fn new(vcpus: usize) -> Self {
        Throttle {
            vcpus: (0..vcpus).map(|_| VcpuThrottle::default()).collect(),
        }
    }

    /// Set vCPU `index`'s throttle to `pct` percent (capped at [`MAX_PCT`]).
    pub fn set(&self, index: usize, pct: u8) {
        if let Some(v) = self.vcpus.get(index) {
            v.pct.store(pct.min(MAX_PCT), Ordering::Relaxed);
        }
    }

    /// vCPU `index`'s throttle, percent.
    pub fn pct(&self, index: usize) -> u8 {
        self.vcpus
            .get(index)
            .map_or(0, |v| v.pct.load(Ordering::Relaxed))
    }

    /// Every vCPU's throttle, percent.
    pub fn all(&self) -> Vec<u8> {
        (0..self.vcpus.len()).map(|i| self.pct(i)).collect()
    }

    /// Lift every throttle.
    pub fn clear(&self) {
        for v in &self.vcpus {
            v.pct.store(0, Ordering::Relaxed);
        }
    }

    /// Time each vCPU has slept for its throttle, microseconds.
    pub fn slept_us(&self) -> Vec<u64> {
        self.vcpus
            .iter()
            .map(|v| v.slept_us.load(Ordering::Relaxed))
            .collect()
    }

    /// For vCPU `index`'s thread, between two `KVM_RUN`s: how long to
    /// sleep now, given when its current run slice began (`slice_start`,
    /// moved on when a sleep is due). `None`: run on.
    pub fn due(&self, index: usize, slice_start: &mut Instant) -> Option<Duration> {
        self.due_at(index, slice_start, Instant::now())
    }

    /// [`Throttle::due`] with the clock read by the caller.
    fn due_at(&self, index: usize, slice_start: &mut Instant, now: Instant) -> Option<Duration> {
        let pct = self.pct(index);
        if pct == 0 {
            *slice_start = now;
            return None;
        }
        if now.saturating_duration_since(*slice_start) < SLICE {
            return None;
        }
        Some(sleep_for(pct))
    }

    /// Record that vCPU `index` slept `d` for its throttle.
    pub fn slept(&self, index: usize, d: Duration) {
        if let Some(v) = self.vcpus.get(index) {
            v.slept_us
                .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        }
    }
}

/// The sleep after one run slice at `pct` percent.
pub fn sleep_for(pct: u8) -> Duration {
    let pct = u32::from(pct.min(MAX_PCT));
    SLICE * pct / (100 - pct)
}

/// How throttling starts and grows (percentages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ThrottleSettings {
    /// Whether to throttle at all (off: a guest that outruns the link
    /// makes the migration give up at its timeout).
    pub on: bool,
    /// The first throttle.
    pub initial: u8,
    /// Added per further round that does not converge.
    pub step: u8,
    /// The most a vCPU is throttled.
    pub max: u8,
}

impl Default for ThrottleSettings {
    /// QEMU's defaults (cpu-throttle-initial 20, -increment 10, max 99).
    fn default() -> Self {
        ThrottleSettings {
            on: true,
            initial: DEFAULT_INITIAL_PCT,
            step: DEFAULT_STEP_PCT,
            max: MAX_PCT,
        }
    }
}

impl ThrottleSettings {
    /// Check the values: `(field, reason)` of the first bad one.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        for (field, v) in [
            ("throttle_initial", self.initial),
            ("throttle_step", self.step),
            ("throttle_max", self.max),
        ] {
            if v == 0 || v > MAX_PCT {
                return Err((
                    field,
                    format!("{field} {v}% is out of range: give 1 to {MAX_PCT}"),
                ));
            }
        }
        if self.initial > self.max {
            return Err((
                "throttle_initial",
                format!(
                    "throttle_initial {}% is above throttle_max ({}%)",
                    self.initial, self.max
                ),
            ));
        }
        Ok(())
    }
}

/// Decides the throttles after each round (see the module documentation).
pub struct Policy {
    settings: ThrottleSettings,
    /// Rounds in a row that did not converge.
    strikes: u32,
    /// The current throttle of each vCPU.
    pct: Vec<u8>,
    /// The highest throttle each vCPU reached.
    peak: Vec<u8>,
}

impl Policy {
    /// A policy for `vcpus` vCPUs, none throttled.
    pub fn new(settings: ThrottleSettings, vcpus: usize) -> Self {
        Policy {
            settings,
            strikes: 0,
            pct: vec![0; vcpus],
            peak: vec![0; vcpus],
        }
    }

    /// After a round that sent `sent` pages while the guest dirtied
    /// `dirtied` (with rings: `per_vcpu`, pages each vCPU dirtied): the
    /// throttles to set now, or `None` if nothing changes.
    pub fn after_round(
        &mut self,
        sent: u64,
        dirtied: u64,
        per_vcpu: Option<&[u64]>,
    ) -> Option<&[u8]> {
        if !self.settings.on {
            return None;
        }
        if dirtied * 2 <= sent {
            self.strikes = 0;
            return None;
        }
        self.strikes += 1;
        if self.strikes < 2 {
            return None;
        }
        let s = self.settings;
        let raise = |p: u8| match p {
            0 => s.initial,
            p => p.saturating_add(s.step).min(s.max),
        };
        let before = self.pct.clone();
        match per_vcpu.filter(|c| c.len() == self.pct.len()) {
            Some(counts) => {
                let worst = counts.iter().copied().max().unwrap_or(0);
                for (p, &c) in self.pct.iter_mut().zip(counts) {
                    if worst > 0 && c * 2 >= worst {
                        *p = raise(*p);
                    } else if c * 8 < worst {
                        *p = p.saturating_sub(s.step);
                    }
                }
            }
            None => {
                for p in &mut self.pct {
                    *p = raise(*p);
                }
            }
        }
        for (peak, &p) in self.peak.iter_mut().zip(&self.pct) {
            *peak = (*peak).max(p);
        }
        (self.pct != before).then_some(self.pct.as_slice())
    }

    /// The highest throttle each vCPU reached.
    pub fn peak(&self) -> &[u8] {
        &self.peak
    }
}

/// A thread that kicks the given vCPU threads once per [`SLICE`] while
/// their throttle is on, so a guest that does not exit still sleeps.
/// Stopped and joined on drop.
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    /// Start kicking: `kick(i)` kicks vCPU `i`'s thread.
    pub fn start(
        throttle: Arc<Throttle>,
        kick: impl Fn(usize) + Send + 'static,
    ) -> std::io::Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = crate::seccomp::spawn(
            crate::seccomp::Kind::Migration,
            "throttle".into(),
            move || {
                while !flag.load(Ordering::Relaxed) {
                    for (i, p) in throttle.all().into_iter().enumerate() {
                        if p > 0 {
                            kick(i);
                        }
                    }
                    std::thread::sleep(SLICE);
                }
            },
        )?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(vcpus: usize) -> Policy {
        Policy::new(ThrottleSettings::default(), vcpus)
    }

    #[test]
    fn sleep_matches_the_share_of_time_taken() {
        assert_eq!(sleep_for(0), Duration::ZERO);
        assert_eq!(sleep_for(50), SLICE);
        assert_eq!(sleep_for(90), SLICE * 9);
        assert_eq!(sleep_for(200), SLICE * 99);
    }

    #[test]
    fn converging_rounds_never_throttle() {
        let mut p = policy(2);
        for _ in 0..10 {
            assert!(p.after_round(1000, 500, None).is_none());
        }
        assert_eq!(p.peak(), &[0, 0]);
    }

    #[test]
    fn two_rounds_that_do_not_converge_start_throttling_then_it_grows() {
        let mut p = policy(2);
        assert!(p.after_round(1000, 900, None).is_none());
        assert_eq!(p.after_round(1000, 900, None), Some(&[20u8, 20][..]));
        assert_eq!(p.after_round(1000, 900, None), Some(&[30u8, 30][..]));
        for _ in 0..20 {
            p.after_round(1000, 900, None);
        }
        assert_eq!(p.peak(), &[99, 99]);
        // Already at the top: nothing changes.
        assert!(p.after_round(1000, 900, None).is_none());
    }

    #[test]
    fn a_converging_round_resets_the_count_but_keeps_the_throttle() {
        let mut p = policy(1);
        p.after_round(1000, 900, None);
        p.after_round(1000, 900, None);
        assert!(p.after_round(1000, 100, None).is_none());
        // One bad round is not enough again.
        assert!(p.after_round(1000, 900, None).is_none());
        assert_eq!(p.after_round(1000, 900, None), Some(&[30u8][..]));
    }

    #[test]
    fn with_per_vcpu_counts_only_the_dirtiest_are_throttled() {
        let mut p = policy(3);
        let counts = [900u64, 20, 500];
        p.after_round(1000, 1420, Some(&counts));
        assert_eq!(
            p.after_round(1000, 1420, Some(&counts)),
            Some(&[20u8, 0, 20][..])
        );
        // vCPU 2 goes quiet: released a step per round.
        let counts = [900u64, 20, 10];
        assert_eq!(
            p.after_round(1000, 930, Some(&counts)),
            Some(&[30u8, 0, 10][..])
        );
        assert_eq!(
            p.after_round(1000, 930, Some(&counts)),
            Some(&[40u8, 0, 0][..])
        );
        assert_eq!(p.peak(), &[40, 0, 20]);
    }

    #[test]
    fn off_never_throttles() {
        let mut p = Policy::new(
            ThrottleSettings {
                on: false,
                ..Default::default()
            },
            1,
        );
        for _ in 0..5 {
            assert!(p.after_round(10, 1000, None).is_none());
        }
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = ThrottleSettings {
            max: 100,
            ..Default::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "throttle_max");
        let bad = ThrottleSettings {
            initial: 50,
            max: 40,
            ..Default::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "throttle_initial");
        assert!(ThrottleSettings::default().check().is_ok());
    }

    #[test]
    fn a_vcpu_sleeps_only_after_a_whole_slice() {
        let t = Throttle::new(1);
        let now = Instant::now();
        let mut start = now - SLICE;
        assert!(t.due_at(0, &mut start, now).is_none());
        assert_eq!(start, now, "unthrottled: the slice starts afresh");
        t.set(0, 50);
        assert!(t.due_at(0, &mut start, now + SLICE / 2).is_none());
        assert_eq!(t.due_at(0, &mut start, now + SLICE), Some(SLICE));
        t.clear();
        assert!(t.due_at(0, &mut start, now + SLICE).is_none());
    }
}
