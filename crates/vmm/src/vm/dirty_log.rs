//! Dirty tracking on its own (`PUT /vm/dirty-log`, its request and report
//! in `migration::dirty`): one tracker turned on and harvested every
//! period for a while, exactly as a migration's rounds would, with no page
//! sent. It measures what tracking costs the guest
//! (seed 4's experiment: `hover bench dirty-log`), apart from the link.

use std::time::Instant;

use super::control::{CommandError, Lifecycle};
use super::run::Running;
use crate::migration::dirty::{self, DirtyLogReport, DirtyLogRequest, DirtyTracker, MAX_DIRTY_LOG};
use crate::migration::{MigrationError, Tracker};

impl Running {
    /// The tracker `t` for this VM (`migration::dirty::tracker`).
    pub(super) fn tracker(&self, t: Tracker) -> Result<Box<dyn DirtyTracker>, CommandError> {
        dirty::tracker(
            t,
            self.vm.fd.clone(),
            &self.vm.ram,
            self.vm.dirtying.rings.as_ref(),
        )
        .map_err(|e| CommandError::Invalid {
            field: "dirty_tracking",
            reason: e.to_string(),
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
        report.finish(total_us, pages);
        Ok(report)
    }
}
