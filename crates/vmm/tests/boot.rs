//! Boot the built-in guest on /dev/kvm and check what it prints and reports.

mod common;

use common::boot;
use hover_abi::exit_code;
use hover_vmm::config::BootProtocol;
use hover_vmm::config::MachineConfig;
use hover_vmm::host::kvm_for_test;
use hover_vmm::{Error, GuestImage, MemoryBackend, ReportValue, VmConfig};

fn hello(vcpus: u32, backend: MemoryBackend) {
    hello_on(MachineConfig {
        vcpus,
        memory_backend: backend,
        ..Default::default()
    });
}

/// Boot `hello` on `machine`: every vCPU says hello and is seen, the timings
/// are in order; the outcome, for more checks.
fn hello_on(machine: MachineConfig) -> hover_vmm::RunOutcome {
    let vcpus = machine.vcpus;
    let (result, console) = boot(VmConfig {
        machine,
        ..VmConfig::default()
    });
    let o = result.unwrap_or_else(|e| panic!("boot failed: {e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, exit_code::OK, "console:\n{console}");
    for i in 0..vcpus {
        let line = format!("hello from vCPU {i} of {vcpus} (x2APIC id {i})");
        assert!(
            console.contains(&line),
            "missing '{line}' in console:\n{console}"
        );
    }
    let seen = o
        .reports
        .iter()
        .find(|r| r.key == "vcpus_seen")
        .expect("vcpus_seen reported");
    assert_eq!(seen.value, ReportValue::U64(vcpus as u64));
    assert_eq!(seen.vcpu, 0);
    let t = &o.timings;
    let first = t
        .first_instruction_us
        .expect("boot_tsc reported, so first instruction is known");
    assert!(t.setup_us <= first && first <= t.exit_us, "{t:?}");
    assert!(t.first_console_byte_us.is_some());
    assert!(o.memory.guest_resident > 0 && o.memory.guest_resident < o.memory.guest_memory);
    assert_eq!(o.console_bytes as usize, console.len());
    o
}

#[test]
fn hello_on_one_vcpu() {
    if kvm_for_test("hello_on_one_vcpu") {
        hello(1, MemoryBackend::Anonymous);
    }
}

#[test]
fn hello_on_two_vcpus() {
    if kvm_for_test("hello_on_two_vcpus") {
        hello(2, MemoryBackend::Anonymous);
    }
}

#[test]
fn hello_on_memfd_memory() {
    if kvm_for_test("hello_on_memfd_memory") {
        hello(2, MemoryBackend::Memfd);
    }
}

/// The image's PVH entry (the one QEMU uses) under Hover's PVH path: the
/// 32-bit stub builds long mode and the boot-info page from the start-info
/// page; the guest runs its workload and reports.
#[test]
fn the_pvh_entry_boots_the_builtin_guest() {
    if !kvm_for_test("the_pvh_entry_boots_the_builtin_guest") {
        return;
    }
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            vcpus: 1,
            boot: BootProtocol::Pvh,
            cmdline: "workload=timer interval_us=1000 seconds=1".into(),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    let o = result.unwrap_or_else(|e| panic!("PVH boot failed: {e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, exit_code::OK, "console:\n{console}");
    // The command line arrived (1000 periods of 1 ms), and the TSC rate
    // the stub read from CPUID is right: 1 s of the guest's time took about
    // 1 s (a wrong rate stretches or shrinks it; the bound is loose for a
    // loaded host).
    let samples = o
        .reports
        .iter()
        .find(|r| r.key == "timer.samples")
        .map(|r| r.value);
    assert_eq!(samples, Some(ReportValue::U64(1000)), "console:\n{console}");
    let t = &o.timings;
    let ran_us = t.exit_us - t.first_instruction_us.expect("boot_tsc reported");
    assert!(
        (900_000..10_000_000).contains(&ran_us),
        "1 s of guest time took {ran_us} us"
    );
}

/// Through its PVH entry the guest learns the vCPUs from the ACPI MADT
/// Hover writes, and starts the others with INIT/SIPI: each says hello.
#[test]
fn pvh_boot_starts_every_vcpu_the_madt_lists() {
    if !kvm_for_test("pvh_boot_starts_every_vcpu_the_madt_lists") {
        return;
    }
    let o = hello_on(MachineConfig {
        vcpus: 3,
        boot: BootProtocol::Pvh,
        ..Default::default()
    });
    // Async page faults are on, as under Hover's own entry: the guest took
    // KVM's PV features from CPUID.
    assert!(
        o.reports.iter().any(|r| r.key == "apf.ready"),
        "no apf.* reports: {:?}",
        o.reports.iter().map(|r| &r.key).collect::<Vec<_>>()
    );
}

#[test]
fn guest_image_from_a_file() {
    if !kvm_for_test("guest_image_from_a_file") {
        return;
    }
    let path = std::env::temp_dir().join(format!("hover-test-guest-{}", std::process::id()));
    std::fs::write(&path, hover_vmm::boot::BUILTIN_GUEST).unwrap();
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            guest: GuestImage::Path(path.clone()),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    std::fs::remove_file(&path).unwrap();
    assert_eq!(result.unwrap().exit_code, 0, "console:\n{console}");
}

#[test]
fn triple_fault_stops_the_vm_with_a_register_dump() {
    if !kvm_for_test("triple_fault_stops_the_vm_with_a_register_dump") {
        return;
    }
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            cmdline: "workload=triple-fault".into(),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    assert!(
        console.contains("triple-fault: vCPU 0"),
        "console:\n{console}"
    );
    match result {
        Err(Error::GuestCrash(crash)) => {
            assert_eq!(crash.vcpu, 0);
            assert!(crash.reason.contains("triple fault"), "{}", crash.reason);
            let regs = crash
                .registers
                .as_ref()
                .expect("registers are readable after a shutdown");
            assert_eq!(regs.cr3, hover_abi::layout::PML4_GPA);
            let text = crash.to_string();
            for field in ["rip", "rsp", "cr0", "cr3", "cr4", "efer"] {
                assert!(text.contains(field), "dump lacks {field}:\n{text}");
            }
        }
        other => panic!("expected a guest crash, got {other:?}"),
    }
}

#[test]
fn guest_exception_is_printed_and_exits_with_its_code() {
    if !kvm_for_test("guest_exception_is_printed_and_exits_with_its_code") {
        return;
    }
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            cmdline: "workload=exception".into(),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    let o = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, exit_code::EXCEPTION);
    assert!(
        console.contains("unhandled exception #UD invalid opcode (vector 6) on vCPU 0"),
        "console:\n{console}"
    );
    assert!(
        console.contains("rip 0x") && console.contains("error code 0x0"),
        "console:\n{console}"
    );
}

/// A page fault in preemptible task code goes first to the runtime (the
/// path async "page not present" takes), which must hand it back to be
/// reported with its own frame, not park the task or retry for ever.
#[test]
fn guest_page_fault_in_preemptible_code_is_reported_with_its_frame() {
    if !kvm_for_test("guest_page_fault_in_preemptible_code_is_reported_with_its_frame") {
        return;
    }
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            cmdline: "workload=exception kind=pf".into(),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    let o = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, exit_code::EXCEPTION, "console:\n{console}");
    let unmapped = (hover_abi::layout::MAX_MAPPED_GIB + 1) << 30;
    assert!(
        console.contains("unhandled exception #PF page fault (vector 14) on vCPU 0"),
        "console:\n{console}"
    );
    // A user-mode read of a page not present; CR2 is the address read.
    assert!(
        console.contains("error code 0x4,") && console.contains(&format!("cr2 {unmapped:#x},")),
        "console:\n{console}"
    );
}

#[test]
fn guest_panic_is_printed_and_exits_with_its_code() {
    if !kvm_for_test("guest_panic_is_printed_and_exits_with_its_code") {
        return;
    }
    let (result, console) = boot(VmConfig {
        machine: MachineConfig {
            cmdline: "workload=panic".into(),
            ..Default::default()
        },
        ..VmConfig::default()
    });
    let o = result.unwrap_or_else(|e| panic!("{e}\nconsole:\n{console}"));
    assert_eq!(o.exit_code, exit_code::PANIC);
    assert!(
        console.contains("guest: panic on vCPU 0: "),
        "console:\n{console}"
    );
    assert!(console.contains("panics on purpose"), "console:\n{console}");
}
