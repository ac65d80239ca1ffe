//! Prefetching restore: the loader fills guest memory with exactly the
//! snapshot's pages, the pager then hands guest memory back to the kernel,
//! and the workload's own checks pass; and a demand fault
//! never waits behind it (a loader slowed to 200 pages a second would need
//! seconds to reach the pages the guest touches at once, and the guest
//! finishes long before).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::report;
use hover_vmm::config::HostConfig;
use hover_vmm::host::kvm_for_test;
use hover_vmm::state::file::Snapshot;
use hover_vmm::{Command, ConsoleTarget, MemoryRestore, RestoreOptions, Vm};
use vm_memory::{Bytes, GuestAddress};

const T: Duration = Duration::from_secs(60);

/// Run `cmdline` on a 64 MiB guest for a moment and snapshot it with a
/// hot-set window; the snapshot's path.
fn snapshot(name: &str, cmdline: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hover-prefetch-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let vm = common::quiet_vm(64 << 20, cmdline, None);
    let c = vm.controller();
    let run = std::thread::spawn(move || vm.run());
    std::thread::sleep(Duration::from_millis(300));
    let snap = dir.join("vm.snap");
    c.request(
        Command::Snapshot {
            path: snap.clone(),
            stop: true,
            hot_window: Duration::from_millis(50),
            also_at: None,
        },
        T,
    )
    .unwrap();
    run.join().unwrap().unwrap();
    snap
}

fn restore(snap: &std::path::Path, rate: Option<u64>) -> Vm {
    Vm::restore(
        snap,
        &RestoreOptions {
            memory: MemoryRestore::Prefetch,
            host: HostConfig {
                console: ConsoleTarget::Off,
                ..Default::default()
            },
            prefetch_rate: rate,
        },
    )
    .unwrap()
}

#[test]
fn prefetch_places_every_saved_page_and_the_workloads_check_passes() {
    if !kvm_for_test("prefetch_places_every_saved_page_and_the_workloads_check_passes") {
        return;
    }
    for (name, cmdline, errors) in [
        (
            "memtouch",
            "workload=memtouch size=16M tasks=2 rounds=1500",
            "memtouch.errors",
        ),
        (
            "kvstore",
            "workload=kvstore wss=16M tasks=2 seconds=6",
            "kvstore.errors",
        ),
    ] {
        let snap = snapshot(name, cmdline);
        let file = Snapshot::open(&snap).unwrap();
        assert!(!file.hot.is_empty(), "{name}: the snapshot has a hot set");
        let mut vm = restore(&snap, None);
        // The guest has not run: the loader alone brings memory in.
        vm.begin_prefetch();
        let t = Instant::now();
        let stats = loop {
            let s = vm.pager_stats().expect("a prefetching restore has a pager");
            if s.prefetch_ms.is_some() {
                break s;
            }
            assert!(t.elapsed() < T, "{name}: the loader never finished: {s:?}");
            std::thread::sleep(Duration::from_millis(5));
        };
        let pageable = file
            .stored_pages()
            .filter(|&(gpa, _)| gpa >= vm.image_end())
            .count() as u64;
        assert_eq!(stats.pushed_pages, pageable, "{name}: {stats:?}");
        assert!(
            stats.push_copies < pageable,
            "{name}: copies by runs: {stats:?}"
        );
        assert_eq!(
            stats.source_reads, 0,
            "{name}: nothing came on demand: {stats:?}"
        );
        // Every page is the snapshot's.
        let mem = vm.ram().memory().clone();
        let (mut want, mut got) = (vec![0u8; 4096], vec![0u8; 4096]);
        for (gpa, slot) in file.stored_pages() {
            file.read_stored(slot, &mut want).unwrap();
            mem.read_slice(&mut got, GuestAddress(gpa)).unwrap();
            assert!(
                want == got,
                "{name}: page {gpa:#x} differs from the snapshot's"
            );
        }
        // Loaded before the guest ran: the control loop hands guest memory
        // back to the kernel as it starts, and the guest runs on without
        // the pager.
        let o = vm.run().unwrap();
        assert_eq!(o.exit_code, 0, "{name}");
        assert_eq!(report(&o, errors), 0, "{name}: the workload's own check");
        let p = o.pager.as_ref().expect("the pager's figures are kept");
        assert!(p.released, "{name}: memory went back to the kernel: {p:?}");
        assert_eq!(p.pushed_pages, pageable, "{name}: {p:?}");
        std::fs::remove_dir_all(snap.parent().unwrap()).unwrap();
    }
}

#[test]
fn a_demand_fault_never_waits_behind_the_loader() {
    if !kvm_for_test("a_demand_fault_never_waits_behind_the_loader") {
        return;
    }
    let snap = snapshot("slow", "workload=memtouch size=16M tasks=2 rounds=1500");
    let file = Arc::new(Snapshot::open(&snap).unwrap());
    // 200 pages a second: the 4096+ pages memtouch wrote would take over
    // 20 s to load; the guest touches them all at once.
    let vm = restore(&snap, Some(200));
    let pageable = file
        .stored_pages()
        .filter(|&(gpa, _)| gpa >= vm.image_end())
        .count() as u64;
    let o = vm.run().unwrap();
    assert_eq!(o.exit_code, 0);
    assert_eq!(report(&o, "memtouch.errors"), 0);
    let p = o.pager.expect("pager stats");
    assert!(
        p.source_reads > 0,
        "the guest's faults were served on demand: {p:?}"
    );
    // The guest's own faults brought in what the loader had not reached.
    assert!(p.pushed_pages < pageable, "{p:?}");
    std::fs::remove_dir_all(snap.parent().unwrap()).unwrap();
}

#[test]
fn a_snapshot_truncated_under_the_loader_stops_the_vm_naming_the_page() {
    if !kvm_for_test("a_snapshot_truncated_under_the_loader_stops_the_vm_naming_the_page") {
        return;
    }
    let snap = snapshot(
        "truncated",
        "workload=memtouch size=16M tasks=2 rounds=1500",
    );
    let vm = restore(&snap, Some(200));
    // Keep the header and the first pages: the loader and the guest's
    // faults soon reach pages that are gone.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&snap)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let e = vm.run().expect_err("the VM stops").to_string();
    // The loader's read or a demand fault's, whichever reached a missing
    // page first: either names it.
    assert!(
        e.contains("guest page 0x") || e.contains("guest pages 0x"),
        "names the page: {e}"
    );
    std::fs::remove_dir_all(snap.parent().unwrap()).unwrap();
}
