//! The balloon device against a mock queue: inflate, deflate, statistics
//! and free page reporting, what each drops and what it refuses.

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
