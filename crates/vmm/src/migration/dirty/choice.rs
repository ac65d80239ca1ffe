//! Which tracker a VM gets, and tracking asked for on its own
//! (`PUT /vm/dirty-log`, seed 4's experiment): its request and report.
//! The tracker is chosen here for a migration, a hot-set measurement and
//! a tracking run alike, so the rule (rings only with rings, and only
//! rings then) is stated once.

use std::sync::Arc;
use std::time::Duration;

use kvm_ioctls::VmFd;
use serde::Serialize;

use super::{BitmapTracker, DirtyTracker, HybridTracker, ManualTracker, RingSet, RingTracker};
use crate::memory::GuestRam;
use crate::migration::Tracker;

/// Why a VM cannot have the tracker asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    /// Ring tracking asked of a VM without rings.
    #[error("ring tracking needs the VM started with --dirty-ring ENTRIES (rings must exist before the vCPUs)")]
    NoRings,
    /// A bitmap tracker asked of a VM with rings.
    #[error(
        "this VM has dirty rings (--dirty-ring), and KVM refuses the bitmap ioctls then: use ring"
    )]
    HasRings,
}

/// The tracker `t` for the VM `fd` with guest memory `ram` and, if it was
/// started with them, dirty `rings`: rings only with rings, and only rings
/// then (KVM refuses the bitmap ioctls on a VM with rings).
pub fn tracker(
    t: Tracker,
    fd: Arc<VmFd>,
    ram: &GuestRam,
    rings: Option<&Arc<RingSet>>,
) -> Result<Box<dyn DirtyTracker>, ChoiceError> {
    Ok(match (t, rings) {
        (Tracker::Ring, Some(r)) => Box::new(RingTracker::new(fd, ram, r.clone())),
        (Tracker::Ring, None) => return Err(ChoiceError::NoRings),
        (_, Some(_)) => return Err(ChoiceError::HasRings),
        (Tracker::Manual, None) => Box::new(ManualTracker::new(fd, ram)),
        (Tracker::Hybrid, None) => Box::new(HybridTracker::new(fd, ram)),
        (Tracker::Bitmap, None) => Box::new(BitmapTracker::new(fd, ram)),
    })
}

/// Longest tracking run accepted.
pub const MAX_DIRTY_LOG: Duration = Duration::from_secs(60);

/// What to track, how often to harvest, for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyLogRequest {
    /// The tracker.
    pub tracker: Tracker,
    /// Time between harvests.
    pub period: Duration,
    /// How long tracking stays on.
    pub duration: Duration,
    /// Pages the hybrid tracker may hold back unprotected (a migration
    /// sets this from the link's rate and the downtime target).
    pub hold_pages: u64,
}

/// What tracking did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DirtyLogReport {
    /// The tracker.
    pub tracker: String,
    /// Harvests made.
    pub harvests: u32,
    /// Mean time of a harvest, microseconds.
    pub harvest_us_mean: f64,
    /// Longest harvest, microseconds.
    pub harvest_us_max: u64,
    /// Mean pages a harvest found dirty (and would send).
    pub pages_per_harvest: f64,
    /// Pages the tracker held back at the end (hybrid: hot sections).
    pub held_pages: u64,
    /// From tracking on to off, milliseconds.
    pub elapsed_ms: f64,
}

impl DirtyLogReport {
    /// The means, once `harvests` took `total_us` and found `pages` in all.
    pub fn finish(&mut self, total_us: u64, pages: u64) {
        if self.harvests > 0 {
            self.harvest_us_mean = total_us as f64 / self.harvests as f64;
            self.pages_per_harvest = pages as f64 / self.harvests as f64;
        }
    }
}
