//! Criterion micro-benchmarks of the monitor's host-side hot paths:
//! - handling a control request that carries a batch of 64 reports (decode,
//!   validate every key, store), the cost per REPORT exit;
//! - the halt-poll governor's window choice from a wake-up histogram, run
//!   every 100 ms;
//! - checking a guest image's ELF headers (every `hover run`);
//! - reading one vCPU's KVM binary statistics (the governor and the API
//!   socket do this; needs /dev/kvm, skipped without it);
//! - writing and reading one migration frame of 256 pages (1 MiB) with its
//!   CRC only (a Unix socket, `--insecure`) and with its MAC as well (an
//!   authenticated link): what authentication costs per MiB moved.
//!
//! Run: `cargo bench -p hover-vmm --bench host_paths`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use hover_abi::control::{op, ControlRequest, Report};
use hover_vmm::boot::{inspect, ImageBytes, BUILTIN_GUEST};
use hover_vmm::config::halt_poll::MAX_WINDOW_NS;
use hover_vmm::devices::control::ControlDevice;
use hover_vmm::memory::host_writes::GuestWriter;
use hover_vmm::migration::mac::FrameMac;
use hover_vmm::migration::page_lists::pages_header;
use hover_vmm::migration::wire::{FrameReader, FrameWriter, Kind};
use hover_vmm::sched::halt_poll::{choose_window, WakeHist};
use hover_vmm::stats::KvmStats;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn control_report_batch(c: &mut Criterion) {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let mut bytes = Vec::new();
    for i in 0..64u64 {
        let r = Report::u64(&format!("bench.key.{i}"), i);
        bytes.extend_from_slice(&r.key);
        bytes.extend(r.kind.to_le_bytes());
        bytes.extend(r.reserved.to_le_bytes());
        bytes.extend(r.value.to_le_bytes());
    }
    mem.write_slice(&bytes, GuestAddress(0x2000)).unwrap();
    let req = ControlRequest {
        op: op::REPORT,
        status: 0,
        arg0: 0x2000,
        arg1: 64,
    };
    let mut raw = Vec::new();
    raw.extend(req.op.to_le_bytes());
    raw.extend(req.status.to_le_bytes());
    raw.extend(req.arg0.to_le_bytes());
    raw.extend(req.arg1.to_le_bytes());
    mem.write_slice(&raw, GuestAddress(0x1000)).unwrap();
    c.bench_function("control: REPORT with 64 records", |b| {
        // A fresh device per batch keeps the stored reports from growing.
        b.iter_batched(
            || ControlDevice::new(GuestWriter::unrecorded(mem.clone()), None, 1),
            |d| black_box(d.handle(0, 0x1000)),
            criterion::BatchSize::SmallInput,
        )
    });
}

fn governor_choice(c: &mut Criterion) {
    let mut h: WakeHist = [0.0; 64];
    for (i, n) in [(15, 300u64), (16, 2000), (17, 400), (18, 20), (27, 5)] {
        h[i] = n as f64;
    }
    c.bench_function("governor: choose the window", |b| {
        b.iter(|| choose_window(black_box(&h), 2.5e6, MAX_WINDOW_NS))
    });
}

fn elf_inspect(c: &mut Criterion) {
    let img = ImageBytes {
        name: "built-in".into(),
        bytes: BUILTIN_GUEST.into(),
    };
    c.bench_function("boot: inspect the built-in guest's ELF", |b| {
        b.iter(|| inspect(black_box(&img)).unwrap())
    });
}

fn kvm_stats_read(c: &mut Criterion) {
    let Ok(kvm) = kvm_ioctls::Kvm::new() else {
        eprintln!("skipping kvm_stats_read: /dev/kvm is not usable");
        return;
    };
    let vm = kvm.create_vm().unwrap();
    let vcpu = vm.create_vcpu(0).unwrap();
    let stats = KvmStats::open(&vcpu).unwrap();
    c.bench_function("stats: read one vCPU's KVM statistics", |b| {
        b.iter(|| black_box(stats.read().unwrap()))
    });
}

fn page_frame(c: &mut Criterion) {
    let gpas: Vec<u64> = (0..256u64).map(|i| i * 4096).collect();
    let header = pages_header(&gpas);
    let pages: Vec<u8> = (0..256 * 4096u32).map(|i| (i * 7 + 3) as u8).collect();
    for mac in [false, true] {
        let name = if mac { "crc+mac" } else { "crc" };
        let mac_state = || FrameMac::from_key_bytes([7; 32]);
        c.bench_function(&format!("page_frame_write_1mib_{name}"), |b| {
            // Bytes written go nowhere: only the work per frame counts.
            let mut w = FrameWriter::new(std::io::sink());
            if mac {
                w.set_mac(mac_state());
            }
            b.iter(|| w.frame(Kind::Pages, &[&header, black_box(&pages)]).unwrap())
        });
        let mut w = FrameWriter::new(Vec::new());
        if mac {
            w.set_mac(mac_state());
        }
        w.frame(Kind::Pages, &[&header, &pages]).unwrap();
        let bytes = w.into_inner();
        c.bench_function(&format!("page_frame_read_1mib_{name}"), |b| {
            b.iter(|| {
                let mut r = FrameReader::new(black_box(&bytes[..]));
                if mac {
                    r.set_mac(mac_state());
                }
                black_box(r.frame().unwrap().payload.len())
            })
        });
    }
}

criterion_group!(
    benches,
    page_frame,
    control_report_batch,
    governor_choice,
    elf_inspect,
    kvm_stats_read
);
criterion_main!(benches);
