//! A VM steered while it runs, in one process: pause freezes the guest
//! (its memory does not change while paused) and resume lets it continue; a
//! snapshot taken while it runs leaves it running; the snapshot restores
//! into a new VM that finishes the workload; and when a run returns, none of
//! the VM's threads is left. One test in its own process, so that the
//! thread census sees no other test's VM.

mod common;

use hover_vmm::config::HostConfig;
use std::time::Duration;

use common::report;
use hover_vmm::host::kvm_for_test;
use hover_vmm::vm::Reply;
use hover_vmm::{
    Command, CommandError, ConsoleTarget, Lifecycle, MemoryRestore, RestoreOptions, Vm,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

const T: Duration = Duration::from_secs(60);

/// CRC of all guest RAM (read through a second view of the same memory).
fn memory_crc(mem: &vm_memory::GuestMemoryMmap) -> u32 {
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    for r in mem.iter() {
        let mut at = r.start_addr().0;
        while at < r.start_addr().0 + r.len() {
            mem.read_slice(&mut buf, GuestAddress(at)).unwrap();
            h.update(&buf);
            at += buf.len() as u64;
        }
    }
    h.finalize()
}

/// Pages of guest memory holding anything but zeroes.
fn nonzero_pages(mem: &vm_memory::GuestMemoryMmap) -> usize {
    let mut page = vec![0u8; 4096];
    let mut n = 0;
    for r in mem.iter() {
        for at in (r.start_addr().0..r.start_addr().0 + r.len()).step_by(4096) {
            mem.read_slice(&mut page, GuestAddress(at)).unwrap();
            n += usize::from(page.iter().any(|&b| b != 0));
        }
    }
    n
}

/// Names of this process's threads that belong to a VM.
fn vm_threads() -> Vec<String> {
    let mut names = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if let Ok(n) = std::fs::read_to_string(t.path().join("comm")) {
            let n = n.trim().to_string();
            let ours = ["vcpu", "pager", "api", "msi-timer", "pvio", "halt-poll"];
            if ours.iter().any(|p| n.starts_with(p)) {
                names.push(n);
            }
        }
    }
    names
}

#[test]
fn pause_snapshot_restore_and_no_thread_left() {
    if !kvm_for_test("pause_snapshot_restore_and_no_thread_left") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("hover-lifecycle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cmdline = "workload=memtouch size=16M tasks=2 rounds=600";
    let vm = common::quiet_vm(64 << 20, cmdline, Some(dir.join("vm.sock")));
    let c = vm.controller();
    let mem = vm.ram().memory().clone();
    let run = std::thread::spawn(move || vm.run());
    // Running, and the guest has written its 16 MiB (the snapshot below
    // must hold them).
    let t = std::time::Instant::now();
    while c.info().state != Lifecycle::Running || nonzero_pages(&mem) <= 4096 {
        assert!(t.elapsed() < T, "never running: {:?}", c.info().state);
        std::thread::sleep(Duration::from_millis(5));
    }

    // Resuming a running VM is refused and changes nothing.
    assert!(matches!(
        c.request(Command::Resume, T),
        Err(CommandError::WrongState { .. })
    ));
    let paused = c.request(Command::Pause, T).unwrap();
    assert!(matches!(paused, Reply::Paused { .. }), "{paused:?}");
    assert_eq!(c.info().state, Lifecycle::Paused);
    let before = memory_crc(&mem);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        memory_crc(&mem),
        before,
        "guest memory changed while paused"
    );
    c.request(Command::Resume, T).unwrap();
    // Resumed, the guest writes again: however slowly this host runs it.
    let deadline = std::time::Instant::now() + T;
    while memory_crc(&mem) == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest did not continue"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // A snapshot of a running VM leaves it running.
    let snap = dir.join("vm.snap");
    let reply = c
        .request(
            Command::Snapshot {
                path: snap.clone(),
                stop: false,
                hot_window: Duration::ZERO,
                also_at: None,
            },
            T,
        )
        .unwrap();
    let Reply::Snapshot(info) = reply else {
        panic!("{reply:?}")
    };
    assert!(!info.stopped && info.pages > 4096, "{info:?}");
    assert_eq!(c.info().state, Lifecycle::Running);
    // A second snapshot to the same path is refused; the file is kept.
    let again = c.request(
        Command::Snapshot {
            path: snap.clone(),
            stop: false,
            hot_window: Duration::ZERO,
            also_at: None,
        },
        T,
    );
    assert!(again.is_err());
    assert_eq!(std::fs::metadata(&snap).unwrap().len(), info.bytes);

    let first = run.join().unwrap().unwrap();
    assert_eq!(first.exit_code, 0);
    assert_eq!(report(&first, "memtouch.errors"), 0);
    assert!(c.request(Command::Pause, T).is_err(), "the VM has ended");
    // Every thread, the API's accepting and connection threads included,
    // is gone when the run returns.
    assert_eq!(
        vm_threads(),
        Vec::<String>::new(),
        "threads outlived the VM"
    );
    assert!(!dir.join("vm.sock").exists(), "the API socket is removed");

    // The snapshot restores in this process too, lazily, and finishes the same.
    let restored = Vm::restore(
        &snap,
        &RestoreOptions {
            memory: MemoryRestore::Lazy,
            host: HostConfig {
                console: ConsoleTarget::Off,
                ..Default::default()
            },
            prefetch_rate: None,
        },
    )
    .unwrap()
    .run()
    .unwrap();
    assert_eq!(restored.exit_code, 0);
    assert_eq!(report(&restored, "memtouch.errors"), 0);
    assert_eq!(
        report(&restored, "memtouch.checksum"),
        report(&first, "memtouch.checksum")
    );
    assert_eq!(
        vm_threads(),
        Vec::<String>::new(),
        "threads outlived the VM"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
