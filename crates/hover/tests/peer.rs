//! The built-in guest under QEMU (#12's peer): written out with `hover
//! guest-image`, booted by QEMU's microvm machine through its PVH entry,
//! reporting on the serial console and exiting through isa-debug-exit.
//! `.ci/run` installs QEMU (Debian package qemu-system-x86); outside CI a
//! machine without it skips with a printed reason.

mod common;

use std::time::Duration;

use common::{hover, text, Scratch};
use hover_bench::peer::{self, Boot, Machine};
use hover_vmm::host::kvm_for_test;

fn qemu(test: &str) -> Option<std::path::PathBuf> {
    if !kvm_for_test(test) {
        return None;
    }
    match peer::find() {
        Ok(q) => Some(q),
        Err(e) if std::env::var_os("CI").is_some() => panic!("{test}: {e} (.ci/run installs it)"),
        Err(e) => {
            eprintln!("skipping {test}: {e}");
            None
        }
    }
}

/// A scratch directory holding the built-in guest as `hover guest-image`
/// writes it, and the image's path.
fn guest_image(name: &str) -> (Scratch, std::path::PathBuf) {
    let scratch = Scratch::new(name);
    let image = scratch.0.join("guest.elf");
    let out = hover(&["guest-image", "--out", image.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    (scratch, image)
}

#[test]
fn the_builtin_guest_runs_under_qemu_and_reports_on_its_console() {
    let Some(qemu) = qemu("the_builtin_guest_runs_under_qemu_and_reports_on_its_console") else {
        return;
    };
    let (_scratch, image) = guest_image("qemu-peer");
    let r = peer::run(
        &qemu,
        &Boot::new(
            Machine::Microvm,
            &image,
            1,
            128,
            "workload=timer interval_us=1000 seconds=1",
        ),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("QEMU run: {e}"));
    assert_eq!(r.exit_code, 0, "console:\n{}", r.console);
    // The command line came through the start-info page, the reports
    // through the serial console, and the TSC rate through CPUID: 1000
    // periods of 1 ms took about a second.
    assert_eq!(
        r.number("timer.samples"),
        Some(1000.0),
        "console:\n{}",
        r.console
    );
    assert!(r.number("timer.avg_ns").is_some_and(|v| v > 0.0));
    assert!(r.wall >= Duration::from_millis(900), "{:?}", r.wall);
    // A workload that needs Hover's I/O device says so and exits 22.
    let r = peer::run(
        &qemu,
        &Boot::new(Machine::Microvm, &image, 1, 128, "workload=iolat seconds=1"),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("QEMU run: {e}"));
    assert_eq!(
        r.exit_code,
        hover_abi::exit_code::UNAVAILABLE,
        "console:\n{}",
        r.console
    );
    assert!(
        r.console
            .contains("iolat: skipped: this platform has no Hover I/O device"),
        "{}",
        r.console
    );
}

#[test]
fn qemu_migrates_the_builtin_guest_with_its_data_intact() {
    let Some(qemu) = qemu("qemu_migrates_the_builtin_guest_with_its_data_intact") else {
        return;
    };
    let (_scratch, image) = guest_image("qemu-migrate");
    let b = hover_bench::migrate_peer::PeerMigrateBench {
        memories: vec!["256M".into()],
        wss: vec!["16M".into()],
        rate: 100_000,
        runs: 1,
    };
    let khz = hover_bench::hover_process::tsc_khz().unwrap();
    // Dirty rings: the mode that needs QEMU's KVM dirty-ring support on
    // this KVM. The sample itself fails unless the guest finished on the
    // destination with exit 0 and kvstore found every key it wrote.
    let s =
        hover_bench::migrate_peer::qemu_sample(&qemu, &image, &b, "256M", "16M", "ring", 0, khz)
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.vmm, "QEMU microvm");
    assert!(s.rounds >= 1.0, "{s:?}");
    // The working set (16 MiB, written at random) crossed the wire.
    assert!(s.sent_mib >= 16.0, "{s:?}");
}

#[test]
fn under_qemu_the_boot_vcpu_starts_the_others_and_each_reports() {
    let Some(qemu) = qemu("under_qemu_the_boot_vcpu_starts_the_others_and_each_reports") else {
        return;
    };
    let (_scratch, image) = guest_image("qemu-smp");
    // Only vCPU 0 enters at the PVH entry; it finds the others in QEMU's
    // ACPI MADT and starts them with INIT/SIPI. `hello` fails unless every
    // vCPU the guest counts checks in.
    let r = peer::run(
        &qemu,
        &Boot::new(Machine::Microvm, &image, 2, 128, "workload=hello"),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("QEMU run: {e}"));
    assert_eq!(r.exit_code, 0, "console:\n{}", r.console);
    assert!(
        r.console.contains("hello: all 2 vCPUs checked in"),
        "console:\n{}",
        r.console
    );
    // The task pinned to vCPU 1 ran there, on the CPU with x2APIC id 1.
    assert!(
        r.console.contains("hello from vCPU 1 of 2 (x2APIC id 1)"),
        "console:\n{}",
        r.console
    );
    assert_eq!(r.number("vcpus_seen"), Some(2.0), "console:\n{}", r.console);
    // Under SeaBIOS (`pc`) the started vCPU's first trip to CPL0 needs the
    // entry TSS: with the reset TR it read a non-canonical RSP0 from the
    // real-mode vector table and the VM reset (microvm's low memory hid it).
    let r = peer::run(
        &qemu,
        &Boot::new(Machine::Pc, &image, 2, 128, "workload=hello"),
        Duration::from_secs(120),
    )
    .unwrap_or_else(|e| panic!("QEMU pc run: {e}"));
    assert_eq!(r.exit_code, 0, "console:\n{}", r.console);
    assert_eq!(r.number("vcpus_seen"), Some(2.0), "console:\n{}", r.console);
}

#[test]
fn under_qemu_iolat_writes_through_a_virtio_block_device() {
    let Some(qemu) = qemu("under_qemu_iolat_writes_through_a_virtio_block_device") else {
        return;
    };
    let (scratch, image) = guest_image("qemu-virtio");
    let disk = scratch.0.join("disk.img");
    std::fs::File::create(&disk)
        .and_then(|f| f.set_len(1 << 20))
        .unwrap();
    let extra = hover_bench::halt_poll_peer::virtio_disk_args(&disk);
    let size = 4096u64;
    let cmdline = format!("workload=iolat size={size} seconds=1");
    let boot = Boot {
        extra: &extra,
        ..Boot::new(Machine::Microvm, &image, 2, 128, &cmdline)
    };
    let r = peer::run(&qemu, &boot, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("QEMU run: {e}"));
    assert_eq!(r.exit_code, 0, "console:\n{}", r.console);
    assert_eq!(
        r.number("iolat.errors"),
        Some(0.0),
        "console:\n{}",
        r.console
    );
    let n = r.number("iolat.requests").unwrap() as u64;
    assert!(n >= 64, "only {n} writes:\n{}", r.console);
    // Every slot holds its last write: write k went to slot k % 64 with
    // bytes (k + i) mod 251, so the driver put the right data at the
    // right sectors.
    let data = std::fs::read(&disk).unwrap();
    for slot in 0..64u64 {
        let last = (0..n).rev().find(|k| k % 64 == slot).unwrap();
        let at = (slot * size) as usize;
        let want: Vec<u8> = (0..size).map(|i| ((last + i) % 251) as u8).collect();
        assert!(
            data[at..at + size as usize] == want[..],
            "slot {slot} does not hold write {last}"
        );
    }
}
