//! The hot set a snapshot records (its `HOTS` section): the pages a
//! prefetching restore brings in first. A running VM is watched for a
//! window before the pause with the dirty tracker a migration would use;
//! what it writes then comes first. A VM under the pager (overcommitted, or
//! itself restored lazily) adds the order its pages were first touched.
//! KVM's dirty logging sees writes only: a page the guest only reads in the
//! window is not in it (it comes with the rest, or on demand).

use std::collections::HashSet;
use std::time::Duration;

use super::control::{CommandError, Lifecycle};
use super::run::Running;
use crate::migration::{MigrationError, Tracker};

/// Longest hot-set window accepted.
pub const MAX_HOT_WINDOW: Duration = Duration::from_secs(10);

impl Running {
    /// The hot set: the pages written during `window` (only while the
    /// guest runs; the monitor's own writes too), then the pager's first
    /// touches.
    pub(super) fn record_hot_set(&mut self, window: Duration) -> Result<Vec<u64>, CommandError> {
        let touched = self.vm.first_touches();
        if window.is_zero() || self.state != Lifecycle::Running {
            return Ok(touched);
        }
        let mut tracker = self.tracker(match self.vm.dirtying.rings {
            Some(_) => Tracker::Ring,
            None => Tracker::Bitmap,
        })?;
        let dirty = |e| CommandError::Migration(MigrationError::Dirty(e));
        tracker.start().map_err(dirty)?;
        self.vm.devices.host_writes.record(true);
        std::thread::sleep(window.min(MAX_HOT_WINDOW));
        let written = tracker.harvest();
        tracker.stop();
        let monitor = self.vm.devices.host_writes.take();
        self.vm.devices.host_writes.record(false);
        // A guest that ended meanwhile is not snapshotted as if it ran.
        if let Some(e) = self.guest_ended() {
            self.stashed.push_back(e);
            return Err(CommandError::Migration(MigrationError::GuestEnded));
        }
        // What the guest writes now first, then what it touched first.
        let mut seen = HashSet::new();
        Ok(written
            .map_err(dirty)?
            .into_iter()
            .chain(monitor)
            .chain(touched)
            .filter(|g| seen.insert(*g))
            .collect())
    }
}
