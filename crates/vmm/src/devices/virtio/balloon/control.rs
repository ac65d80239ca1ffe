//! The balloon as the VM's control sees it (the API, `hover ctl
//! balloon`): the target set, the guest's answer, its statistics and what
//! was dropped, shared with the device on its I/O thread.

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hover_abi::layout::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use vmm_sys_util::eventfd::EventFd;

use crate::config::BalloonConfig;
use crate::memory::discard::DiscardCount;

/// The balloon as the VM's control sees it (the API, `hover ctl balloon`):
/// the target, the guest's answer, its statistics and what was dropped.
pub struct BalloonControl {
    pub(super) live: Mutex<Live>,
    /// Wakes the I/O thread: the target or the polling interval changed.
    pub(super) wake: EventFd,
    /// Guest RAM in pages: the most a target may be.
    pub(super) ram_pages: u64,
    /// Whether the guest may deflate when out of memory (as configured).
    pub(super) deflate_on_oom: bool,
    /// Whether free page reporting is offered (as configured).
    pub(super) free_page_reporting: bool,
}

#[derive(Default)]
pub(super) struct Live {
    pub(super) target_pages: u32,
    pub(super) actual_pages: u32,
    pub(super) stats_interval_s: u32,
    /// The target changed: the driver gets a configuration interrupt.
    pub(super) target_changed: bool,
    pub(super) interval_changed: bool,
    pub(super) stats: BTreeMap<&'static str, u64>,
    pub(super) stats_at: Option<Instant>,
    pub(super) inflated_pages: u64,
    pub(super) deflated_pages: u64,
    pub(super) reported_pages: u64,
    pub(super) reports: u64,
    pub(super) dropped: DiscardCount,
    pub(super) refused: u64,
}

/// The balloon's report (`GET /vm/stats`'s `balloon`, `GET /vm/balloon`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BalloonReport {
    /// What the host asks the guest to hold, MiB and 4 KiB pages.
    pub target_mib: u64,
    /// See `target_mib`.
    pub target_pages: u32,
    /// What the guest says it holds.
    pub actual_mib: u64,
    /// See `actual_mib`.
    pub actual_pages: u32,
    /// Seconds between statistics requests (0: none).
    pub stats_polling_interval_s: u32,
    /// Whether free page reporting is offered.
    pub free_page_reporting: bool,
    /// Whether the guest may deflate when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Pages the guest handed over by inflating, and took back.
    pub inflated_pages: u64,
    /// See `inflated_pages`.
    pub deflated_pages: u64,
    /// Pages the guest reported free, and the reports.
    pub reported_pages: u64,
    /// See `reported_pages`.
    pub reports: u64,
    /// Pages dropped from host memory (inflated or reported).
    pub dropped_pages: u64,
    /// Pages the pager was moving just then, left as they were.
    pub busy_pages: u64,
    /// Ranges refused (outside guest RAM, not whole pages).
    pub refused_ranges: u64,
    /// The guest's latest statistics (the virtio spec's, by Firecracker's
    /// names: bytes for memory, counts for events).
    pub statistics: BTreeMap<String, u64>,
    /// How old they are, milliseconds (`None`: none came yet).
    pub statistics_age_ms: Option<u64>,
}

/// A balloon target larger than the guest's RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{mib} MiB is more than the guest's {ram_mib} MiB of RAM")]
pub struct TargetTooLarge {
    /// The target asked for.
    pub mib: u64,
    /// The guest's RAM.
    pub ram_mib: u64,
}

impl BalloonControl {
    /// A balloon starting at `config`'s target, in a guest of `ram` bytes.
    pub fn new(config: &BalloonConfig, ram: u64) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(BalloonControl {
            live: Mutex::new(Live {
                target_pages: mib_to_pages(config.target_mib),
                stats_interval_s: config.stats_interval_s,
                ..Live::default()
            }),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
            ram_pages: ram / PAGE_SIZE,
            deflate_on_oom: config.deflate_on_oom,
            free_page_reporting: config.free_page_reporting,
        }))
    }

    pub(super) fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.locked()
    }

    /// Ask the guest to hold `mib` MiB in the balloon (0: give it all
    /// back). More than guest RAM is refused.
    pub fn set_target_mib(&self, mib: u64) -> Result<(), TargetTooLarge> {
        let pages = mib.saturating_mul(1 << 20) / PAGE_SIZE;
        if pages > self.ram_pages {
            return Err(TargetTooLarge {
                mib,
                ram_mib: (self.ram_pages * PAGE_SIZE) >> 20,
            });
        }
        let mut l = self.live();
        l.target_pages = pages as u32;
        l.target_changed = true;
        drop(l);
        self.poke();
        Ok(())
    }

    /// Ask the guest for statistics every `s` seconds (0: no more).
    pub fn set_stats_interval(&self, s: u32) {
        let mut l = self.live();
        l.stats_interval_s = s;
        l.interval_changed = true;
        drop(l);
        self.poke();
    }

    fn poke(&self) {
        if let Err(e) = self.wake.write(1) {
            tracing::warn!("virtio balloon: the I/O thread was not told: {e}");
        }
    }

    /// What the balloon holds and did.
    pub fn report(&self) -> BalloonReport {
        let l = self.live();
        BalloonReport {
            target_mib: pages_to_mib(l.target_pages),
            target_pages: l.target_pages,
            actual_mib: pages_to_mib(l.actual_pages),
            actual_pages: l.actual_pages,
            stats_polling_interval_s: l.stats_interval_s,
            free_page_reporting: self.free_page_reporting,
            deflate_on_oom: self.deflate_on_oom,
            inflated_pages: l.inflated_pages,
            deflated_pages: l.deflated_pages,
            reported_pages: l.reported_pages,
            reports: l.reports,
            dropped_pages: l.dropped.dropped,
            busy_pages: l.dropped.busy,
            refused_ranges: l.refused,
            statistics: l.stats.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            statistics_age_ms: l.stats_at.map(|t| t.elapsed().as_millis() as u64),
        }
    }
}

fn mib_to_pages(mib: u64) -> u32 {
    (mib.saturating_mul(1 << 20) / PAGE_SIZE).min(u32::MAX as u64) as u32
}

fn pages_to_mib(pages: u32) -> u64 {
    (u64::from(pages) * PAGE_SIZE) >> 20
}
