//! virtio-balloon: memory the guest gives back to the host, on the host's
//! request (inflate: the host sets a target, the guest hands over pages
//! until it holds that many; deflate: it takes them back) and on its own
//! (free page reporting, `VIRTIO_BALLOON_F_REPORTING`: the guest names
//! ranges of its free memory as they build up, 2 MiB or more each, and
//! uses them again after the report returns). Each page given is dropped
//! at once (`memory::discard`: out of host memory, the pager's budget and
//! store, snapshots and migrations; zeros when touched again). The guest's
//! memory statistics come through the stats queue: the device keeps the
//! guest's buffer and hands it back every polling interval, and the guest
//! refills it (the spec's protocol; Firecracker's polling interval).
//!
//! Queues, as the driver numbers them: inflate, deflate, then stats
//! (offered always) and reporting (when configured) in that order, each
//! present only if its feature was accepted.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_queue::{Queue, QueueT, Reader};

use super::{read_config_bytes, VirtioDevice, F_VERSION_1};
use crate::config::BalloonConfig;
use crate::devices::state_error::StateError;
use crate::memory::discard::Discarder;
use crate::memory::host_writes::TrackedMemory;

mod control;

pub use control::{BalloonControl, BalloonReport};

/// The guest's statistics come through a stats queue.
pub const F_STATS_VQ: u64 = 1 << 1;
/// The guest deflates when it runs out of memory.
pub const F_DEFLATE_ON_OOM: u64 = 1 << 2;
/// The guest reports its free pages.
pub const F_REPORTING: u64 = 1 << 5;
/// The page unit of inflate and deflate (a 4 KiB page frame number).
const PFN_SHIFT: u32 = 12;
/// Each queue's size (Linux reports up to 32 ranges at a time).
const QUEUE_SIZE: u16 = 128;
/// The most statistics entries read from one buffer.
const MAX_STATS: usize = 32;
/// The most PFNs read from one inflate or deflate buffer (Linux sends 256).
const MAX_PFNS: usize = 4096;
/// The most ranges taken from one free page report (Linux sends up to 32,
/// `PAGE_REPORTING_CAPACITY`); the rest of a longer chain is refused.
const MAX_REPORT_RANGES: usize = 64;
/// The largest range a report may name (Linux reports buddy blocks of at
/// most 4 MiB): a driver naming more is refused, so that one chain cannot
/// hold the I/O thread (and every pause waiting for it) for long.
const MAX_REPORT_RANGE: u64 = 16 << 20;

/// The statistics' names, by tag (the virtio spec's, Firecracker's names).
const STAT_NAMES: [&str; 16] = [
    "swap_in",
    "swap_out",
    "major_faults",
    "minor_faults",
    "free_memory",
    "total_memory",
    "available_memory",
    "disk_caches",
    "hugetlb_allocations",
    "hugetlb_failures",
    "oom_kill",
    "alloc_stall",
    "async_scan",
    "direct_scan",
    "async_reclaim",
    "direct_reclaim",
];

/// What a queue is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Inflate,
    Deflate,
    Stats,
    Reporting,
}

/// The balloon device's own state in a snapshot or a migration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonState {
    /// The target, in pages.
    pub target_pages: u32,
    /// The guest's answer, in pages.
    pub actual_pages: u32,
    /// The statistics polling interval, seconds.
    pub stats_interval_s: u32,
    /// The guest's statistics buffer the device holds, if it does (its
    /// chain's head: handed back at the next poll).
    pub stats_head: Option<u16>,
}

/// The balloon device.
pub struct Balloon {
    control: Arc<BalloonControl>,
    discard: Arc<Discarder>,
    offered: u64,
    acked: u64,
    stats_head: Option<u16>,
    next_poll: Option<Instant>,
    config_interrupt: bool,
    complained: bool,
}

impl Balloon {
    /// A balloon under `control`, dropping pages through `discard`.
    pub fn new(
        config: &BalloonConfig,
        control: Arc<BalloonControl>,
        discard: Arc<Discarder>,
    ) -> Self {
        let mut offered = F_VERSION_1 | F_STATS_VQ;
        if config.free_page_reporting {
            offered |= F_REPORTING;
        }
        if config.deflate_on_oom {
            offered |= F_DEFLATE_ON_OOM;
        }
        Balloon {
            control,
            discard,
            offered,
            acked: 0,
            stats_head: None,
            next_poll: None,
            config_interrupt: false,
            complained: false,
        }
    }

    /// Queue `index`'s role under the accepted features.
    fn role(&self, index: usize) -> Option<Role> {
        let mut roles = vec![Role::Inflate, Role::Deflate];
        if self.acked & F_STATS_VQ != 0 {
            roles.push(Role::Stats);
        }
        if self.acked & F_REPORTING != 0 {
            roles.push(Role::Reporting);
        }
        roles.get(index).copied()
    }

    fn index_of(&self, role: Role) -> Option<usize> {
        (0..4).find(|&i| self.role(i) == Some(role))
    }

    fn complain(&mut self, why: String) {
        self.control.live().refused += 1;
        if !self.complained {
            tracing::warn!("virtio balloon: {why}; ignored (logged once)");
            self.complained = true;
        }
    }

    /// Drop `[gpa, gpa + len)`, counting it.
    fn drop_range(&mut self, gpa: u64, len: u64) -> u64 {
        match self.discard.discard(gpa, len) {
            Ok(c) => {
                self.control.live().dropped += c;
                len / PAGE_SIZE
            }
            Err(why) => {
                self.complain(why.to_string());
                0
            }
        }
    }

    /// Inflate or deflate: the chain's PFNs (u32 each).
    fn pfns(&mut self, queue: &mut Queue, mem: &TrackedMemory, inflate: bool) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let mut bytes = Vec::new();
            match Reader::new(mem, chain) {
                Ok(r) => {
                    let _ = r.take((MAX_PFNS * 4) as u64).read_to_end(&mut bytes);
                }
                Err(e) => self.complain(format!("an inflate or deflate buffer: {e}")),
            }
            let pfns: Vec<u64> = bytes
                .chunks_exact(4)
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect();
            if inflate {
                // Runs of consecutive frames are dropped at once.
                let mut i = 0;
                while i < pfns.len() {
                    let mut n = 1;
                    while i + n < pfns.len() && pfns[i + n] == pfns[i] + n as u64 {
                        n += 1;
                    }
                    let got = self.drop_range(pfns[i] << PFN_SHIFT, n as u64 * PAGE_SIZE);
                    self.control.live().inflated_pages += got;
                    i += n;
                }
            } else {
                self.control.live().deflated_pages += pfns.len() as u64;
            }
            if queue.add_used(mem, head, 0).is_err() {
                return used;
            }
            used = true;
        }
        used
    }

    /// A free page report: every buffer of the chain is a free range.
    fn reports(&mut self, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let ranges: Vec<(u64, u64)> = chain
                .clone()
                .take(MAX_REPORT_RANGES + 1)
                .map(|d| (d.addr().0, u64::from(d.len())))
                .collect();
            if ranges.len() > MAX_REPORT_RANGES {
                self.complain(format!(
                    "a free page report of more than {MAX_REPORT_RANGES} ranges (the rest ignored)"
                ));
            }
            let mut pages = 0;
            for (gpa, len) in ranges.into_iter().take(MAX_REPORT_RANGES) {
                if len > MAX_REPORT_RANGE {
                    self.complain(format!(
                        "a reported range of {len:#x} bytes at {gpa:#x}, over {MAX_REPORT_RANGE:#x}"
                    ));
                    continue;
                }
                pages += self.drop_range(gpa, len);
            }
            {
                let mut l = self.control.live();
                l.reported_pages += pages;
                l.reports += 1;
            }
            if queue.add_used(mem, head, 0).is_err() {
                return used;
            }
            used = true;
        }
        used
    }

    /// The guest's statistics: keep the buffer until the next poll.
    fn stats(&mut self, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        let mut used = false;
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let mut bytes = Vec::new();
            if let Ok(r) = Reader::new(mem, chain) {
                let _ = r.take((MAX_STATS * 10) as u64).read_to_end(&mut bytes);
            }
            {
                let mut l = self.control.live();
                for e in bytes.chunks_exact(10) {
                    let tag = u16::from_le_bytes([e[0], e[1]]) as usize;
                    let v = u64::from_le_bytes(e[2..10].try_into().expect("8 bytes"));
                    if let Some(name) = STAT_NAMES.get(tag) {
                        l.stats.insert(name, v);
                    }
                }
                l.stats_at = Some(Instant::now());
            }
            // A second buffer while one is held: give the older back.
            if let Some(old) = self.stats_head.replace(head) {
                used |= queue.add_used(mem, old, 0).is_ok();
            }
            self.schedule_poll();
        }
        used
    }

    fn schedule_poll(&mut self) {
        let s = self.control.live().stats_interval_s;
        self.next_poll = (s > 0 && self.stats_head.is_some())
            .then(|| Instant::now() + Duration::from_secs(u64::from(s)));
    }
}

impl VirtioDevice for Balloon {
    fn device_id(&self) -> u32 {
        VIRTIO_ID_BALLOON
    }

    fn name(&self) -> String {
        "balloon".into()
    }

    fn features(&self) -> u64 {
        self.offered
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE; 4]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let l = self.control.live();
        let mut config = [0u8; 16];
        config[0..4].copy_from_slice(&l.target_pages.to_le_bytes());
        config[4..8].copy_from_slice(&l.actual_pages.to_le_bytes());
        read_config_bytes(&config, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        match (offset, <[u8; 4]>::try_from(data)) {
            (4, Ok(b)) => self.control.live().actual_pages = u32::from_le_bytes(b),
            _ => self.complain(format!(
                "a {}-byte configuration write at {offset}",
                data.len()
            )),
        }
    }

    fn ack_features(&mut self, features: u64) {
        self.acked = features;
        if features == 0 {
            // A reset: the statistics buffer held belonged to the old driver.
            self.stats_head = None;
            self.next_poll = None;
            self.config_interrupt = false;
        }
    }

    fn process(&mut self, index: usize, queue: &mut Queue, mem: &TrackedMemory) -> bool {
        match self.role(index) {
            Some(Role::Inflate) => self.pfns(queue, mem, true),
            Some(Role::Deflate) => self.pfns(queue, mem, false),
            Some(Role::Stats) => self.stats(queue, mem),
            Some(Role::Reporting) => self.reports(queue, mem),
            None => false,
        }
    }

    fn backend_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.control.wake.as_raw_fd())
    }

    fn backend_ready(&mut self, queues: &mut [Queue], mem: &TrackedMemory) -> bool {
        let _ = self.control.wake.read();
        let (target, interval) = {
            let mut l = self.control.live();
            let t = std::mem::take(&mut l.target_changed);
            let i = std::mem::take(&mut l.interval_changed);
            (t, i)
        };
        self.config_interrupt |= target;
        if interval {
            self.schedule_poll();
        }
        let due = self.next_poll.is_some_and(|t| t <= Instant::now());
        if !due {
            return false;
        }
        self.next_poll = None;
        let (Some(head), Some(q)) = (
            self.stats_head.take(),
            self.index_of(Role::Stats).and_then(|i| queues.get_mut(i)),
        ) else {
            return false;
        };
        // Handing the buffer back asks the guest for fresh statistics.
        q.add_used(mem, head, 0).is_ok()
    }

    fn deadline(&self) -> Option<Instant> {
        self.next_poll
    }

    fn take_config_change(&mut self) -> bool {
        std::mem::take(&mut self.config_interrupt)
    }

    fn save_state(&self) -> Vec<u8> {
        let l = self.control.live();
        postcard::to_allocvec(&BalloonState {
            target_pages: l.target_pages,
            actual_pages: l.actual_pages,
            stats_interval_s: l.stats_interval_s,
            stats_head: self.stats_head,
        })
        .expect("the balloon's state encodes")
    }

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), StateError> {
        let s: BalloonState =
            postcard::from_bytes(bytes).map_err(|e| StateError::decode("virtio balloon", e))?;
        if u64::from(s.target_pages) > self.control.ram_pages {
            return Err(StateError::unfit(
                "virtio balloon",
                format!(
                    "a saved target of {} pages in a guest of {}",
                    s.target_pages, self.control.ram_pages
                ),
            ));
        }
        {
            let mut l = self.control.live();
            l.target_pages = s.target_pages;
            l.actual_pages = s.actual_pages;
            l.stats_interval_s = s.stats_interval_s;
        }
        self.stats_head = s.stats_head;
        self.schedule_poll();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
