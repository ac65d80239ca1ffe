//! Soak: many create/run/destroy cycles and snapshot/restore cycles in one
//! process, then a census: no file descriptor, thread, guest mapping or
//! file of the VMM's may be left. `HOVER_SOAK_CYCLES` sets the number of
//! run cycles (default 12; `scripts/soak.sh` runs 200), a quarter of that
//! (at least 3) snapshot/restore cycles. Each run cycle has an API socket
//! and uses a device in turn: the MSI timer (`irq`), the pager under a
//! memory budget (`memtouch`), the I/O device (`iolat`), or none (`hello`).
//! One test in its own process, so that the census sees no other test.

mod common;

use hover_vmm::config::{HostConfig, MachineConfig};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hover_vmm::host::kvm_for_test;
use hover_vmm::{Command, ConsoleTarget, MemoryRestore, RestoreOptions, Vm, VmConfig};

/// A guest memory size no other mapping of this process has, so that a
/// leaked guest RAM mapping can be told apart.
const GUEST_MEMORY: u64 = 88 << 20;

#[derive(Debug, PartialEq)]
struct Census {
    fds: usize,
    threads: usize,
    guest_mappings: usize,
    maps: usize,
    files: Vec<String>,
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

fn census(scratch: &Path) -> Census {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let guest_mappings = maps
        .lines()
        .filter(|l| {
            let range = l.split_whitespace().next().unwrap_or("");
            let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
            let len =
                u64::from_str_radix(b, 16).unwrap_or(0) - u64::from_str_radix(a, 16).unwrap_or(0);
            len == GUEST_MEMORY
        })
        .count();
    let mut files = Vec::new();
    let pid = std::process::id().to_string();
    for dir in ["/dev/shm", "/var/tmp", "/tmp"] {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("hover-") && name.contains(&pid) && !e.path().starts_with(scratch) {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    for e in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
        files.push(e.path().display().to_string());
    }
    files.sort();
    Census {
        fds: count("/proc/self/fd"),
        threads: count("/proc/self/task"),
        guest_mappings,
        maps: maps.lines().count(),
        files,
    }
}

fn run_cycle(i: usize, scratch: &Path) {
    let (cmdline, paging) = match i % 4 {
        0 => ("workload=hello", None),
        1 => ("workload=irq count=5 delay_us=200", None),
        2 => ("workload=memtouch size=48M", Some(32 << 20)),
        _ => ("workload=iolat seconds=1", None),
    };
    let out = Vm::new(&VmConfig {
        machine: MachineConfig {
            memory: GUEST_MEMORY,
            cmdline: cmdline.into(),
            memory_budget: paging,
            ..Default::default()
        },
        host: HostConfig {
            console: ConsoleTarget::Off,
            ..Default::default()
        },
    })
    .and_then(|mut vm| {
        vm.serve_api(Box::new(hover_vmm::api::SocketApi::new(
            &scratch.join("vm.sock"),
        )));
        vm.run()
    })
    .unwrap_or_else(|e| panic!("cycle {i} ({cmdline}): {e}"));
    assert_eq!(out.exit_code, 0, "cycle {i} ({cmdline})");
}

fn snapshot_cycle(i: usize, scratch: &Path) {
    let snap: PathBuf = scratch.join("vm.snap");
    let vm = common::quiet_vm(GUEST_MEMORY, "workload=memtouch size=8M rounds=400", None);
    let c = vm.controller();
    let run = std::thread::spawn(move || vm.run());
    std::thread::sleep(Duration::from_millis(100));
    c.request(
        Command::Snapshot {
            path: snap.clone(),
            stop: true,
            hot_window: Duration::ZERO,
            also_at: None,
        },
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("snapshot cycle {i}: {e}"));
    run.join().unwrap().unwrap();
    let restored = Vm::restore(
        &snap,
        &RestoreOptions {
            memory: if i.is_multiple_of(2) {
                MemoryRestore::Eager
            } else {
                MemoryRestore::Lazy
            },
            host: HostConfig {
                console: ConsoleTarget::Off,
                ..Default::default()
            },
            prefetch_rate: None,
        },
    )
    .and_then(Vm::run)
    .unwrap_or_else(|e| panic!("restore cycle {i}: {e}"));
    assert_eq!(restored.exit_code, 0, "restore cycle {i}");
    std::fs::remove_file(&snap).unwrap();
}

#[test]
fn many_cycles_leave_no_descriptor_thread_mapping_or_file() {
    if !kvm_for_test("many_cycles_leave_no_descriptor_thread_mapping_or_file") {
        return;
    }
    let cycles: usize = std::env::var("HOVER_SOAK_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let scratch = std::env::temp_dir().join(format!("hover-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    // Warm up: the allocator's arenas and the runtime's lazily made state
    // (one of each kind of cycle) are not leaks.
    for i in 0..4 {
        run_cycle(i, &scratch);
    }
    snapshot_cycle(0, &scratch);
    let before = census(&scratch);
    let t = Instant::now();
    for i in 0..cycles {
        run_cycle(i, &scratch);
    }
    let snapshots = (cycles / 4).max(3);
    for i in 0..snapshots {
        snapshot_cycle(i, &scratch);
    }
    let after = census(&scratch);
    println!(
        "{cycles} run cycles and {snapshots} snapshot/restore cycles in {:.1?}: before {before:?}, after {after:?}",
        t.elapsed()
    );
    assert_eq!(after.fds, before.fds, "file descriptors leaked");
    assert_eq!(after.threads, before.threads, "threads leaked");
    assert_eq!(after.guest_mappings, 0, "guest RAM mappings left");
    assert_eq!(after.files, Vec::<String>::new(), "files left");
    // The allocator may map an arena more for a thread it has not seen;
    // a leak per cycle would show as growth with the cycle count.
    assert!(
        after.maps <= before.maps + 8,
        "mappings grew from {} to {}",
        before.maps,
        after.maps
    );
    std::fs::remove_dir_all(&scratch).unwrap();
}
