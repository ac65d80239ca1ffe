//! Halt polling's setting (`--halt-poll-ns`, `--halt-poll auto`,
//! `PUT /vm/halt-poll`); `sched::halt_poll` applies it and runs the governor.

use serde::{Deserialize, Serialize};

/// Largest window accepted: 10 ms (KVM's own default maximum is 200 us).
pub const MAX_WINDOW_NS: u64 = 10_000_000;
/// The governor's CPU budget for failed polls, percent of one CPU per vCPU.
pub const DEFAULT_BUDGET_PCT: f64 = 2.5;

/// How halt polling is set for a VM.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HaltPoll {
    /// Leave KVM's default (its module parameter) alone.
    KvmDefault,
    /// A fixed maximum window, nanoseconds (0 = no polling).
    Fixed {
        /// The window.
        window_ns: u64,
    },
    /// The governor, with a CPU budget in percent of one CPU per vCPU.
    Auto {
        /// Budget for failed polls, in (0, 100].
        budget_pct: f64,
    },
}

impl HaltPoll {
    /// The setting in the API's request form: `{"mode": "fixed",
    /// "window_ns": N}`, `{"mode": "auto", "budget_pct": P}` or
    /// `{"mode": "kvm_default"}`.
    pub fn to_json(self) -> serde_json::Value {
        match self {
            HaltPoll::KvmDefault => serde_json::json!({ "mode": "kvm_default" }),
            HaltPoll::Fixed { window_ns } => {
                serde_json::json!({ "mode": "fixed", "window_ns": window_ns })
            }
            HaltPoll::Auto { budget_pct } => {
                serde_json::json!({ "mode": "auto", "budget_pct": budget_pct })
            }
        }
    }
}

impl HaltPoll {
    /// Whether the values are in range, naming the flag that is not.
    pub fn check(&self) -> Result<(), super::ConfigError> {
        match *self {
            HaltPoll::Fixed { window_ns } if window_ns > MAX_WINDOW_NS => {
                Err(super::ConfigError::HaltPollTooLarge(window_ns))
            }
            HaltPoll::Auto { budget_pct } if !(budget_pct > 0.0 && budget_pct <= 100.0) => {
                Err(super::ConfigError::HaltPollBudget(budget_pct))
            }
            _ => Ok(()),
        }
    }
}
