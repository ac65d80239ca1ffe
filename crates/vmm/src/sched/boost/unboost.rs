//! How a boost ends: the guest's unboost (its call, or a quiet write to
//! its area the monitor settles), kept across a short gap where this
//! host's tuning says so, and the throttle's revocation. Where boosts
//! begin is `mod.rs` (`Booster::boost`).

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use hover_abi::boost::{offset, status};
use hover_abi::control::status as control_status;

use super::tuning::host_tsc;
use super::{decide, policy, BoostMode, Booster, Kept, SlotState, KEPT_GRACE};

impl Booster {
    /// The guest's `BOOST_UNBOOST` from vCPU `vcpu`: unboost unless a
    /// request bit is (again) set. Returns the control status.
    pub fn unboost_call(&self, vcpu: usize) -> u32 {
        let Some(gpa) = self.area(vcpu) else {
            return control_status::UNAVAILABLE;
        };
        // The guest unboosts as it goes idle, right after announcing its
        // next real-time wake-up: the monitor must plan for it now, not at
        // its next poll (which may come after the deadline). Before the
        // unboost: a thread that lowers itself can lose its CPU to a host
        // thread for a whole time slice right there. Only then: the
        // monitor runs above every vCPU, so a nudge with nothing to plan
        // takes a CPU from the guest for nothing (an interrupt-driven
        // guest's every unboost did: its serial line ran at half speed).
        if self.read_wake_at(gpa) != 0 {
            if let Some(n) = self.nudge.get() {
                n.nudge();
            }
        }
        self.guest_unboosted(vcpu, gpa);
        control_status::OK
    }

    /// The monitor's look for a quiet unboost: if the area's count moved
    /// since this boost began (the guest bumped it instead of calling, its
    /// next wake-up being due within the `keep_us` the area offered),
    /// decide as the call would be.
    pub(super) fn quiet_unboost(&self, vcpu: usize, gpa: u64) {
        if !self.slots[vcpu].boosted.load(Ordering::SeqCst) {
            return;
        }
        let count = self.read_quiet_unboosts(gpa);
        {
            let mut s = self.lock(vcpu);
            if s.since.is_none() || s.quiet_seen == count {
                return;
            }
            s.quiet_seen = count;
            s.stats.quiet_unboosts += 1;
        }
        self.guest_unboosted(vcpu, gpa);
    }

    /// The guest is done with its boost (its call, or a quiet unboost):
    /// unless a request bit is set again, keep the boost across a short gap
    /// to its next announced wake-up ([`decide::keep`]) or end it.
    pub(super) fn guest_unboosted(&self, vcpu: usize, gpa: u64) {
        if self.requested(vcpu, gpa) == 0 && self.mode() == BoostMode::Dynamic {
            let mut s = self.lock(vcpu);
            match self.keeps(vcpu, gpa, &s) {
                (decide::Keep::Yes, wake_at, cpu_now) => {
                    s.stats.kept += 1;
                    let grace = KEPT_GRACE.as_micros() as u64 * self.tsc_khz() / 1000;
                    // A wake-up already past is kept from now.
                    let from = wake_at.max(host_tsc());
                    s.kept = Some(Kept {
                        until: from.saturating_add(grace),
                        cpu0: cpu_now,
                    });
                }
                (why, _, _) => {
                    if why == decide::Keep::OverBudget {
                        s.stats.budget_unboosts += 1;
                    }
                    self.unboost_locked(s, vcpu, Some(false));
                }
            }
        }
    }

    /// Unboost vCPU `vcpu`'s thread if boosted. `by`: `Some(false)` the
    /// guest's call, `Some(true)` the throttle, `None` the monitor's own
    /// (pause, exit).
    pub(super) fn unboost(&self, vcpu: usize, by: Option<bool>) {
        let s = self.lock(vcpu);
        self.unboost_locked(s, vcpu, by);
    }

    /// Ends the boost recorded in `s`, releasing the slot's lock before the
    /// thread is lowered: a vCPU thread that lowers itself is preempted by
    /// a host thread inside that very call, and the monitor, which must
    /// reach that thread by its next deadline, would otherwise wait on the
    /// lock for the host thread's whole time slice (seen as 4-6 ms late
    /// wake-ups with a CPU hog per core).
    pub(super) fn unboost_locked(
        &self,
        mut s: MutexGuard<'_, SlotState>,
        vcpu: usize,
        by: Option<bool>,
    ) {
        let Some((since, _)) = s.since.take() else {
            return;
        };
        self.slots[vcpu].boosted.store(false, Ordering::SeqCst);
        s.kept = None;
        // The offer goes with the boost: a guest later boosted by a host
        // that reads no quiet unboosts (an older one, after a migration)
        // must not find it.
        if let Some(gpa) = self.area(vcpu) {
            self.write_u32(gpa + offset::KEEP_US, 0);
        }
        s.stats.boosted_us += since.elapsed().as_micros() as u64;
        match by {
            Some(false) => s.stats.unboosts += 1,
            Some(true) => s.stats.throttles += 1,
            None => {}
        }
        self.set_status(vcpu, 0, status::BOOSTED);
        let thread = s.tid.zip(s.original);
        drop(s);
        let Some((tid, orig)) = thread else { return };
        #[cfg(test)]
        if let Some(f) = self.before_restore.lock().unwrap().take() {
            f();
        }
        let lowered = policy::restore(tid, orig);
        let mut s = self.lock(vcpu);
        if let Err(e) = lowered {
            tracing::warn!(vcpu, "cannot unboost the vCPU thread: {e}");
            s.stats.errors += 1;
        }
        // A boost granted between the unlock and the restore was undone by
        // it: apply it again, so the thread is as the slot says.
        if s.since.is_some() && s.tid == Some(tid) {
            if let Err(e) = policy::apply(tid, self.config().policy) {
                tracing::warn!(vcpu, "cannot boost the vCPU thread again: {e}");
                s.stats.errors += 1;
            }
        }
    }

    /// Revoke vCPU `vcpu`'s boost and refuse new ones for the cool-down.
    pub(super) fn throttle(&self, vcpu: usize, why: &str) {
        let s = self.lock(vcpu);
        self.throttle_locked(s, vcpu, why);
    }

    pub(super) fn throttle_locked(&self, mut s: MutexGuard<'_, SlotState>, vcpu: usize, why: &str) {
        let cooldown_ms = self.config().cooldown_ms;
        if s.since.is_none() {
            s.stats.throttles += 1;
        }
        s.throttled_until = Some(Instant::now() + Duration::from_millis(cooldown_ms));
        // THROTTLED before BOOSTED clears: a guest that sees itself
        // unboosted must not miss why.
        self.set_status(vcpu, status::THROTTLED, 0);
        self.unboost_locked(s, vcpu, Some(true));
        tracing::info!(vcpu, "boost revoked ({why}); none for {cooldown_ms} ms");
    }
}
