//! What the guest may make the host do, as bounded by the user.
//!
//! Each quantity a guest request can ask the monitor for (bytes of the I/O
//! device's file, MSI timers and their delays, reports kept, log volume)
//! has a limit here, set by a `--guest-*` flag and checked before the host
//! acts. A request past a limit gets an error status in guest memory and
//! the first one of each kind is logged; the host does nothing for it. The
//! ABI constants ([`hover_abi::control::MAX_MSI_DELAY_NS`],
//! [`hover_abi::pvio::MAX_FILE_BYTES`]) are the ceilings no flag can raise.

use std::sync::atomic::{AtomicBool, Ordering};

pub use crate::config::limits::{GuestLimits, MAX_LOG_BYTES, MAX_PENDING_MSIS, MAX_REPORTS};

/// Logs the first time the guest runs into a limit, once per limit.
#[derive(Debug, Default)]
pub struct LimitHit(AtomicBool);

impl LimitHit {
    /// Note a refused request; the first one is logged with the flag that
    /// raises the limit.
    pub fn hit(&self, what: &str, flag: &str, limit: impl std::fmt::Display) {
        if !self.0.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the guest asked for more {what} than --{flag} allows ({limit}); \
                 refused with an error status (logged once)"
            );
        }
    }
}
