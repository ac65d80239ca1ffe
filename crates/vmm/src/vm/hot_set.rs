//! The hot set a snapshot records (its `HOTS` section): the pages a
//! prefetching restore brings in first. A VM under the pager (overcommitted,
//! or itself restored lazily) knows the order its pages were first touched;
//! any running VM is also watched for a window before the pause, with the
//! dirty tracker a migration would use. KVM's dirty logging sees writes
//! only: a page the guest only reads in the window is not in it (it comes
//! with the rest, after the hot set, or on demand).

use std::collections::HashSet;
use std::time::Duration;

use super::control::{CommandError, Lifecycle};
use super::run::Running;
use crate::migration::dirty::{BitmapTracker, DirtyTracker, RingTracker};
use crate::migration::MigrationError;

/// Longest hot-set window accepted.
pub const MAX_HOT_WINDOW: Duration = Duration::from_secs(10);

impl Running {
    /// The hot set: first touches under the pager, then the pages written
    /// during `window` (only while the guest runs).
    pub(super) fn record_hot_set(&mut self, window: Duration) -> Result<Vec<u64>, CommandError> {
        let mut hot = self
            .vm
            .pager
            .as_ref()
            .map(|p| p.first_touches())
            .unwrap_or_default();
        if window.is_zero() || self.state != Lifecycle::Running {
            return Ok(hot);
        }
        let (fd, ram) = (self.vm.fd.clone(), &self.vm.ram);
        let mut tracker: Box<dyn DirtyTracker> = match &self.vm.rings {
            Some(r) => Box::new(RingTracker::new(fd, ram, r.clone())),
            None => Box::new(BitmapTracker::new(fd, ram)),
        };
        let dirty = |e| CommandError::Migration(MigrationError::Dirty(e));
        tracker.start().map_err(dirty)?;
        std::thread::sleep(window.min(MAX_HOT_WINDOW));
        let written = tracker.harvest();
        tracker.stop();
        let written = written.map_err(dirty)?;
        let mut seen: HashSet<u64> = hot.iter().copied().collect();
        hot.extend(written.into_iter().filter(|g| seen.insert(*g)));
        Ok(hot)
    }
}
