//! Dirty tracking on its own (`PUT /vm/dirty-log`): one tracker turned on
//! and harvested every period for a while, exactly as a migration's rounds
//! would, with no page sent. It measures what tracking costs the guest
//! (seed 4's experiment: `hover bench dirty-log`), apart from the link.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::control::{CommandError, Lifecycle};
use super::run::Running;
use crate::migration::dirty::{
    BitmapTracker, DirtyTracker, HybridTracker, ManualTracker, RingTracker,
};
use crate::migration::{MigrationError, Tracker};

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

impl Running {
    /// The tracker `t` for this VM: rings only with rings, and only rings then.
    pub(super) fn tracker(&self, t: Tracker) -> Result<Box<dyn DirtyTracker>, CommandError> {
        let (fd, ram) = (self.vm.fd.clone(), &self.vm.ram);
        let invalid = |reason: &str| CommandError::Invalid {
            field: "dirty_tracking",
            reason: reason.into(),
        };
        Ok(match (t, &self.vm.rings) {
            (Tracker::Ring, Some(r)) => Box::new(RingTracker::new(fd, ram, r.clone())),
            (Tracker::Ring, None) => return Err(invalid("ring tracking needs the VM started with --dirty-ring ENTRIES (rings must exist before the vCPUs)")),
            (_, Some(_)) => return Err(invalid("this VM has dirty rings (--dirty-ring), and KVM refuses the bitmap ioctls then: use ring")),
            (Tracker::Manual, None) => Box::new(ManualTracker::new(fd, ram)),
            (Tracker::Hybrid, None) => Box::new(HybridTracker::new(fd, ram)),
            (Tracker::Bitmap, None) => Box::new(BitmapTracker::new(fd, ram)),
        })
    }

    /// Track as `req` says; the guest runs on meanwhile.
    pub(super) fn dirty_log(
        &mut self,
        req: &DirtyLogRequest,
    ) -> Result<DirtyLogReport, CommandError> {
        if self.state != Lifecycle::Running {
            return Err(CommandError::WrongState {
                state: self.state,
                action: "track dirty pages",
                needs: "running",
            });
        }
        let mut tracker = self.tracker(req.tracker)?;
        let dirty = |e| CommandError::Migration(MigrationError::Dirty(e));
        let t0 = Instant::now();
        tracker.start().map_err(dirty)?;
        self.vm.devices.host_writes.record(true);
        let mut report = DirtyLogReport {
            tracker: tracker.name().into(),
            ..Default::default()
        };
        let (mut total_us, mut pages) = (0u64, 0u64);
        let result = (|| {
            let end = t0 + req.duration.min(MAX_DIRTY_LOG);
            let mut next = t0 + req.period;
            while next <= end {
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
                if let Some(e) = self.guest_ended() {
                    self.stashed.push_back(e);
                    return Err(CommandError::Migration(MigrationError::GuestEnded));
                }
                tracker.set_deferral_budget(req.hold_pages);
                let at = Instant::now();
                let found = tracker.harvest().map_err(dirty)?;
                let us = at.elapsed().as_micros() as u64;
                // What a migration would send: the monitor's writes too.
                let host = self.vm.devices.host_writes.take().len() as u64;
                total_us += us;
                report.harvest_us_max = report.harvest_us_max.max(us);
                pages += found.len() as u64 + host;
                report.harvests += 1;
                next += req.period;
            }
            Ok(())
        })();
        report.held_pages = tracker.deferred_pages();
        tracker.stop();
        self.vm.devices.host_writes.record(false);
        result?;
        report.elapsed_ms = t0.elapsed().as_secs_f64() * 1e3;
        if report.harvests > 0 {
            report.harvest_us_mean = total_us as f64 / report.harvests as f64;
            report.pages_per_harvest = pages as f64 / report.harvests as f64;
        }
        Ok(report)
    }
}
