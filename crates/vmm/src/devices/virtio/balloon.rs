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

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hover_abi::layout::PAGE_SIZE;
use serde::{Deserialize, Serialize};
use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_queue::{Queue, QueueT, Reader};
use vmm_sys_util::eventfd::EventFd;

use super::{read_config_bytes, VirtioDevice, F_VERSION_1};
use crate::config::BalloonConfig;
use crate::memory::discard::{DiscardCount, Discarder};
use crate::memory::host_writes::TrackedMemory;

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

/// The balloon as the VM's control sees it (the API, `hover ctl balloon`):
/// the target, the guest's answer, its statistics and what was dropped.
pub struct BalloonControl {
    live: Mutex<Live>,
    /// Wakes the I/O thread: the target or the polling interval changed.
    wake: EventFd,
    /// Guest RAM in pages: the most a target may be.
    ram_pages: u64,
    /// Whether the guest may deflate when out of memory (as configured).
    deflate_on_oom: bool,
    /// Whether free page reporting is offered (as configured).
    free_page_reporting: bool,
}

#[derive(Default)]
struct Live {
    target_pages: u32,
    actual_pages: u32,
    stats_interval_s: u32,
    /// The target changed: the driver gets a configuration interrupt.
    target_changed: bool,
    interval_changed: bool,
    stats: BTreeMap<&'static str, u64>,
    stats_at: Option<Instant>,
    inflated_pages: u64,
    deflated_pages: u64,
    reported_pages: u64,
    reports: u64,
    dropped: DiscardCount,
    refused: u64,
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

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.locked()
    }

    /// Ask the guest to hold `mib` MiB in the balloon (0: give it all
    /// back). More than guest RAM is refused.
    pub fn set_target_mib(&self, mib: u64) -> Result<(), String> {
        let pages = mib.saturating_mul(1 << 20) / PAGE_SIZE;
        if pages > self.ram_pages {
            return Err(format!(
                "{mib} MiB is more than the guest's {} MiB of RAM",
                (self.ram_pages * PAGE_SIZE) >> 20
            ));
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
                self.complain(why);
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

    fn load_state(&mut self, bytes: &[u8]) -> Result<(), String> {
        let s: BalloonState = postcard::from_bytes(bytes)
            .map_err(|e| format!("virtio balloon: its saved state: {e}"))?;
        if u64::from(s.target_pages) > self.control.ram_pages {
            return Err(format!(
                "virtio balloon: a saved target of {} pages in a guest of {}",
                s.target_pages, self.control.ram_pages
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
mod tests {
    use super::*;
    use crate::config::MemoryBackend;
    use crate::memory::host_writes::{DeviceMemory, HostWrites};
    use crate::memory::GuestRam;
    use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
    use virtio_queue::desc::{split::Descriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::{Bytes, GuestAddress};

    const ALL: u64 = F_VERSION_1 | F_STATS_VQ | F_REPORTING;

    fn balloon(ram: &GuestRam) -> (Balloon, Arc<BalloonControl>, TrackedMemory) {
        let config = BalloonConfig {
            stats_interval_s: 0,
            ..BalloonConfig::default()
        };
        let control = BalloonControl::new(&config, ram.size()).unwrap();
        let writes = Arc::new(HostWrites::new(ram.end()));
        let discard = Arc::new(Discarder::new(ram, writes).unwrap());
        let mem = DeviceMemory::new(ram.memory()).unwrap().view().clone();
        let mut b = Balloon::new(&config, control.clone(), discard);
        b.ack_features(ALL);
        (b, control, mem)
    }

    /// Queue `index` of `b` served once with one chain of `descs`: whether
    /// it returned a buffer.
    fn serve(b: &mut Balloon, mem: &TrackedMemory, index: usize, descs: &[Descriptor]) -> bool {
        let vq = MockSplitQueue::new(mem, 16);
        let raw: Vec<RawDescriptor> = descs.iter().map(|&d| d.into()).collect();
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        b.process(index, &mut q, mem)
    }

    fn page(mem: &TrackedMemory, gpa: u64) -> u64 {
        mem.read_obj(GuestAddress(gpa)).unwrap()
    }

    #[test]
    fn inflated_and_reported_pages_read_zeros_others_keep_their_data() {
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, control, mem) = balloon(&ram);
        for p in 0x40..0x80u64 {
            mem.write_obj(p, GuestAddress(p << 12)).unwrap();
        }
        // Inflate: frames 0x40, 0x41 (a run) and 0x50.
        for (i, pfn) in [0x40u32, 0x41, 0x50].iter().enumerate() {
            mem.write_obj(*pfn, GuestAddress(0x20000 + 4 * i as u64))
                .unwrap();
        }
        assert!(serve(
            &mut b,
            &mem,
            0,
            &[Descriptor::new(0x20000, 12, 0, 0)]
        ));
        // A report: two free ranges the device may write (the guest's sg).
        let w = VRING_DESC_F_WRITE as u16;
        assert!(serve(
            &mut b,
            &mem,
            3,
            &[
                Descriptor::new(0x60000, 0x2000, w, 0),
                Descriptor::new(0x70000, 0x1000, w, 0)
            ]
        ));
        for p in 0x40..0x80u64 {
            let dropped = matches!(p, 0x40 | 0x41 | 0x50 | 0x60 | 0x61 | 0x70);
            assert_eq!(
                page(&mem, p << 12),
                if dropped { 0 } else { p },
                "page {p:#x}"
            );
        }
        let r = control.report();
        assert_eq!((r.inflated_pages, r.reported_pages, r.reports), (3, 3, 1));
        assert_eq!((r.dropped_pages, r.busy_pages, r.refused_ranges), (6, 0, 0));
        // Deflate: counted, nothing dropped.
        assert!(serve(&mut b, &mem, 1, &[Descriptor::new(0x20000, 4, 0, 0)]));
        assert_eq!(control.report().deflated_pages, 1);
    }

    #[test]
    fn a_report_of_too_many_or_too_large_ranges_is_cut_short() {
        let ram = GuestRam::new(64 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, control, mem) = balloon(&ram);
        let w = VRING_DESC_F_WRITE as u16;
        // One range larger than any buddy block Linux reports.
        assert!(serve(
            &mut b,
            &mem,
            3,
            &[Descriptor::new(0x100_0000, 32 << 20, w, 0)]
        ));
        let r = control.report();
        assert_eq!((r.dropped_pages, r.refused_ranges), (0, 1));
        // A chain of more ranges than a report holds: the first ones only.
        let many: Vec<Descriptor> = (0..MAX_REPORT_RANGES as u64 + 8)
            .map(|i| Descriptor::new(0x100_0000 + i * PAGE_SIZE, PAGE_SIZE as u32, w, 0))
            .collect();
        let vq = MockSplitQueue::new(&mem, 128);
        let raw: Vec<RawDescriptor> = many.iter().map(|&d| d.into()).collect();
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        assert!(b.process(3, &mut q, &mem));
        let r = control.report();
        assert_eq!(r.dropped_pages, MAX_REPORT_RANGES as u64);
        assert_eq!(r.refused_ranges, 2);
    }

    #[test]
    fn a_reset_forgets_the_statistics_buffer_of_the_old_driver() {
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, control, mem) = balloon(&ram);
        control.set_stats_interval(1);
        assert!(!serve(
            &mut b,
            &mem,
            2,
            &[Descriptor::new(0x20000, 10, 0, 0)]
        ));
        assert!(b.stats_head.is_some() && b.deadline().is_some());
        b.ack_features(0);
        assert!(b.stats_head.is_none() && b.deadline().is_none());
    }

    #[test]
    fn ranges_outside_ram_or_not_whole_pages_are_refused_and_drop_nothing() {
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, control, mem) = balloon(&ram);
        mem.write_obj(7u64, GuestAddress(0x40000)).unwrap();
        let w = VRING_DESC_F_WRITE as u16;
        // Past the end of RAM, and a range that is not whole pages.
        mem.write_obj(0x100u32, GuestAddress(0x20000)).unwrap();
        assert!(serve(&mut b, &mem, 0, &[Descriptor::new(0x20000, 4, 0, 0)]));
        assert!(serve(
            &mut b,
            &mem,
            3,
            &[Descriptor::new(0x40000, 100, w, 0)]
        ));
        let r = control.report();
        assert_eq!((r.dropped_pages, r.refused_ranges), (0, 2));
        assert_eq!(page(&mem, 0x40000), 7);
    }

    #[test]
    fn statistics_are_kept_and_the_buffer_goes_back_at_the_next_poll() {
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, control, mem) = balloon(&ram);
        // Two entries: free memory (tag 4) and total memory (tag 5).
        let mut buf = Vec::new();
        for (tag, v) in [(4u16, 123u64), (5, 456)] {
            buf.extend_from_slice(&tag.to_le_bytes());
            buf.extend_from_slice(&v.to_le_bytes());
        }
        mem.write_slice(&buf, GuestAddress(0x20000)).unwrap();
        let vq = MockSplitQueue::new(&mem, 16);
        let raw: Vec<RawDescriptor> = vec![Descriptor::new(0x20000, 20, 0, 0).into()];
        vq.build_desc_chain(&raw).unwrap();
        let mut q: Queue = vq.create_queue().unwrap();
        assert!(!b.process(2, &mut q, &mem), "the buffer is held");
        let r = control.report();
        assert_eq!(r.statistics["free_memory"], 123);
        assert_eq!(r.statistics["total_memory"], 456);
        assert!(b.deadline().is_none(), "no polling asked for");
        control.set_stats_interval(1);
        let mut queues = vec![
            Queue::new(QUEUE_SIZE).unwrap(),
            Queue::new(QUEUE_SIZE).unwrap(),
            q,
            Queue::new(QUEUE_SIZE).unwrap(),
        ];
        assert!(!b.backend_ready(&mut queues, &mem), "not due yet");
        assert!(b.deadline().is_some());
        b.next_poll = Some(Instant::now());
        assert!(b.backend_ready(&mut queues, &mem), "handed back when due");
        let used_idx: u16 = mem.read_obj(GuestAddress(vq.used_addr().0 + 2)).unwrap();
        assert_eq!(used_idx, 1);
        assert!(b.deadline().is_none(), "until the guest refills it");
    }

    #[test]
    fn a_new_target_reads_in_the_config_space_and_raises_a_config_interrupt() {
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, control, mem) = balloon(&ram);
        assert!(control.set_target_mib(2).is_err(), "more than RAM");
        control.set_target_mib(1).unwrap();
        let mut queues: Vec<Queue> = (0..4).map(|_| Queue::new(QUEUE_SIZE).unwrap()).collect();
        b.backend_ready(&mut queues, &mem);
        assert!(b.take_config_change());
        assert!(!b.take_config_change(), "once");
        let mut c = [0u8; 4];
        b.read_config(0, &mut c);
        assert_eq!(u32::from_le_bytes(c), 256);
        b.write_config(4, &200u32.to_le_bytes());
        let r = control.report();
        assert_eq!((r.target_mib, r.actual_pages), (1, 200));
        // Saved and loaded; a saved target larger than RAM is refused.
        let saved = b.save_state();
        let (mut other, c2, _) = balloon(&ram);
        other.load_state(&saved).unwrap();
        assert_eq!(c2.report().target_pages, 256);
        let bad = postcard::to_allocvec(&BalloonState {
            target_pages: 1 << 20,
            ..BalloonState::default()
        })
        .unwrap();
        assert!(other.load_state(&bad).is_err());
        assert!(other.load_state(b"\xff").is_err());
    }

    #[test]
    fn queues_are_numbered_by_the_features_the_driver_took() {
        let ram = GuestRam::new(1 << 20, MemoryBackend::Anonymous).unwrap();
        let (mut b, _, _) = balloon(&ram);
        assert_eq!(b.role(2), Some(Role::Stats));
        assert_eq!(b.role(3), Some(Role::Reporting));
        b.ack_features(F_VERSION_1 | F_REPORTING);
        assert_eq!(b.role(2), Some(Role::Reporting));
        assert_eq!(b.role(3), None);
        b.ack_features(F_VERSION_1);
        assert_eq!(b.role(2), None);
    }
}
