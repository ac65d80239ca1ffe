//! One running VM's halt polling, set at start and changed live (`PUT
//! /vm/halt-poll`): KVM's window through `KVM_CAP_HALT_POLL`, or the
//! governor started and stopped, its reports kept for the outcome and its
//! live report for the API.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use vm_memory::GuestMemoryMmap;

use super::{governor::Governor, GovernorReport};
use crate::config::{ConfigError, HaltPoll};
use crate::stats::KvmStats;
use crate::sync::Locked;

/// Reads the report of a running governor.
pub type GovernorSource = Box<dyn Fn() -> GovernorReport + Send + Sync>;

/// Why a setting was not taken.
#[derive(Debug)]
pub enum HaltPollError {
    /// The setting is out of range or not offered here: the request's
    /// field at fault, and why.
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// This host failed (KVM, statistics, a thread).
    Host(String),
}

/// See the module documentation.
pub struct HaltPollControl {
    fd: Arc<VmFd>,
    /// Spare statistics handles, one per vCPU, for each governor started.
    stats: Vec<KvmStats>,
    /// The guest's halt-poll areas (the built-in guest), for the governor.
    guest: Option<GuestMemoryMmap>,
    governor: Option<Governor>,
    /// Each stopped governor's last report.
    reports: Vec<GovernorReport>,
    /// What the API reads for the governor running now, if any.
    live: Arc<Mutex<Option<GovernorSource>>>,
}

impl HaltPollControl {
    /// Control the halt polling of VM `fd`, whose vCPUs' statistics are
    /// `stats`; `guest`: its memory holding the guest's halt-poll areas.
    pub fn new(fd: Arc<VmFd>, stats: Vec<KvmStats>, guest: Option<GuestMemoryMmap>) -> Self {
        HaltPollControl {
            fd,
            stats,
            guest,
            governor: None,
            reports: Vec::new(),
            live: Arc::default(),
        }
    }

    /// Start the governor with a failed-poll budget of `budget_pct`, at
    /// KVM's default window until its first decision.
    pub fn start_governor(&mut self, budget_pct: f64) -> Result<(), HaltPollError> {
        let stats = self
            .stats
            .iter()
            .map(KvmStats::try_clone)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                HaltPollError::Host(format!(
                    "open KVM statistics for the halt-poll governor: {e}"
                ))
            })?;
        // Without it (no sysfs), the governor starts with polling off.
        let first = super::kvm_default_window().unwrap_or_else(|e| {
            tracing::warn!(
                "halt-poll governor starts with polling off: cannot read KVM's default window: {e}"
            );
            0
        });
        let gov = Governor::start(
            self.fd.clone(),
            stats,
            budget_pct,
            first,
            self.guest.clone(),
        )
        .map_err(|e| HaltPollError::Host(format!("start the halt-poll governor: {e}")))?;
        *self.live.locked() = Some(Box::new(gov.report_source()));
        self.governor = Some(gov);
        Ok(())
    }

    /// Set halt polling to `h` now: a governor running stops first.
    pub fn set(&mut self, h: HaltPoll) -> Result<(), HaltPollError> {
        let invalid = |field, reason: String| HaltPollError::Invalid { field, reason };
        // The same check as at start (the setting's own).
        // Said of the request's fields (the check's own words name the
        // flags of `hover run`).
        h.check().map_err(|e| match e {
            ConfigError::HaltPollTooLarge(ns) => invalid(
                "window_ns",
                format!(
                    "window_ns {ns} is too large: at most {} (10 ms)",
                    crate::config::halt_poll::MAX_WINDOW_NS
                ),
            ),
            ConfigError::HaltPollBudget(pct) => invalid(
                "budget_pct",
                format!("budget_pct {pct} is out of range: give a share of one CPU in (0, 100]"),
            ),
            e => invalid("mode", e.to_string()),
        })?;
        if !super::supported(&self.fd) {
            return Err(invalid(
                "mode",
                "this KVM cannot set halt polling per VM (no KVM_CAP_HALT_POLL)".into(),
            ));
        }
        self.stop();
        let set = |ns| {
            super::set_window(&self.fd, ns)
                .map_err(|e| HaltPollError::Host(format!("KVM_CAP_HALT_POLL: {e}")))
        };
        match h {
            HaltPoll::Fixed { window_ns } => set(window_ns),
            HaltPoll::KvmDefault => set(super::kvm_default_window()
                .map_err(|e| invalid("mode", format!("cannot read KVM's default window: {e}")))?),
            HaltPoll::Auto { budget_pct } => self.start_governor(budget_pct),
        }
    }

    /// Stop the governor, if one runs (its report is kept).
    pub fn stop(&mut self) {
        if let Some(mut g) = self.governor.take() {
            g.stop();
            self.reports.push(g.report());
            *self.live.locked() = None;
        }
    }

    /// The last governor's report, if one ran.
    pub fn last_report(&self) -> Option<GovernorReport> {
        self.reports.last().cloned()
    }

    /// What the API reads for the governor running now.
    pub fn live(&self) -> Arc<Mutex<Option<GovernorSource>>> {
        self.live.clone()
    }
}
