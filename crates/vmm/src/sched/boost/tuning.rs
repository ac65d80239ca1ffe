//! This host's tuning of dynamic boosting (`--boost-when`,
//! `--boost-keep-us`, `--boost-irq-us`; `HostConfig::boost_tuning`):
//! whether a vCPU is worth boosting now, and whether the guest's unboost
//! call keeps a boost; and a live change of the settings with the tuning
//! (`Booster::update`, `PUT /vm/boost`). The
//! decisions themselves are `decide.rs`'s pure functions.

use crate::sync::Locked;
use std::sync::atomic::Ordering;

use super::{decide, policy, BoostTuning, BoostWhen, Booster, SlotState, KEPT_GRACE};
use crate::config::boost::{BoostConfig, BoostUpdate};

/// The TSC now: the guest's TSC is the host's here (docs/ARCHITECTURE.md),
/// so guest deadlines compare with it directly.
pub(super) fn host_tsc() -> u64 {
    // SAFETY: rdtsc has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Why a change of boosting was not taken.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// A value out of range: the request's field, and why.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The boost monitor thread could not be started.
    #[error("cannot start the boost monitor: {0}")]
    Monitor(std::io::Error),
}

impl Booster {
    /// A live change (`PUT /vm/boost`): checked whole before anything
    /// changes; this host's tuning taken as given; any other change
    /// unboosts every thread and starts boosting afresh, while a change of
    /// the tuning alone leaves boosts, throttles and cool-downs as they
    /// are. The VM's new settings, and the answer (settings and tuning).
    pub fn update(
        self: &std::sync::Arc<Self>,
        u: &BoostUpdate,
    ) -> Result<(BoostConfig, serde_json::Value), UpdateError> {
        let invalid = |(field, reason)| UpdateError::Invalid { field, reason };
        let new = u.apply(self.config()).map_err(invalid)?;
        let tuning = u.apply_tuning(self.tuning()).map_err(invalid)?;
        self.set_tuning(tuning)?;
        if new != self.config() {
            self.set(new)?;
        }
        Ok((new, new.with_tuning(&tuning)))
    }

    /// This host's tuning now.
    pub fn tuning(&self) -> BoostTuning {
        *self.tuning.locked()
    }

    /// Change this host's tuning while the VM runs (`PUT /vm/boost`).
    pub fn set_tuning(&self, t: BoostTuning) -> Result<(), UpdateError> {
        t.check().map_err(|reason| UpdateError::Invalid {
            field: "tuning",
            reason: reason.to_string(),
        })?;
        *self.tuning.locked() = t;
        Ok(())
    }

    /// Whether `--boost-when` lets vCPU `vcpu` be boosted now.
    pub(super) fn worth_boosting(&self, vcpu: usize) -> bool {
        self.tuning().when == BoostWhen::Always
            || self.slots[vcpu].contended.load(Ordering::Relaxed)
    }

    /// The monitor's reading of whether vCPU `vcpu`'s thread lately waited
    /// for a CPU.
    pub(super) fn set_contended(&self, vcpu: usize, contended: bool) {
        self.slots[vcpu]
            .contended
            .store(contended, Ordering::Relaxed);
    }

    /// vCPU `vcpu`'s thread id, once it runs.
    pub(super) fn tid(&self, vcpu: usize) -> Option<i32> {
        self.lock(vcpu).tid
    }

    /// The monitor's check of a boosted vCPU at `tsc`: end a kept boost
    /// whose announced wake-up passed ([`KEPT_GRACE`] ago) with no request
    /// set and no unboost call since, once its thread has had the CPU to
    /// take the wake-up ([`decide::kept_boost_ends`]).
    pub(super) fn expire_kept(&self, vcpu: usize, gpa: u64, tsc: u64) {
        let s = self.lock(vcpu);
        let Some(kept) = s.kept else {
            return;
        };
        // Most looks come before the end: no CPU clock read for those.
        if tsc <= kept.until || self.requested(vcpu, gpa) != 0 {
            return;
        }
        let ran_ns = s
            .tid
            .and_then(|tid| policy::thread_cpu_ns(tid).ok())
            .map(|cpu| cpu.saturating_sub(kept.cpu0));
        let ends = decide::kept_boost_ends(decide::KeptCheck {
            tsc,
            until: kept.until,
            ran_ns,
            grace: KEPT_GRACE,
            cap_ticks: self.config().max_ms.saturating_mul(self.tsc_khz()),
        });
        if ends {
            self.unboost_locked(s, vcpu, None);
        }
    }

    /// Whether the unboost call keeps vCPU `vcpu`'s boost (`s` its slot,
    /// locked), the wake-up it keeps it for and the thread's CPU time now:
    /// see [`decide::keep`]; and under `--boost-when contended` only while
    /// the thread still counts as contended.
    pub(super) fn keeps(&self, vcpu: usize, gpa: u64, s: &SlotState) -> (decide::Keep, u64, u64) {
        let no = (decide::Keep::NotNear, 0, 0);
        let tuning = self.tuning();
        let (Some((_, cpu0)), Some(tid)) = (s.since, s.tid) else {
            return no;
        };
        if tuning.keep_us == 0 || !self.worth_boosting(vcpu) {
            return no;
        }
        let (cpu_now, cpu_used_ns) = match policy::thread_cpu_ns(tid) {
            Ok(cpu) if cpu0 != u64::MAX => (cpu, cpu.saturating_sub(cpu0)),
            // No CPU clock: the limit cannot be checked, so never keep.
            _ => return no,
        };
        let wake_at = self.read_wake_at(gpa);
        let decision = decide::keep(decide::KeepCheck {
            keep_us: tuning.keep_us,
            wake_at,
            tsc: host_tsc(),
            tsc_khz: self.tsc_khz(),
            cpu_used_ns,
            max_ms: self.config().max_ms,
        });
        (decision, wake_at, cpu_now)
    }
}
