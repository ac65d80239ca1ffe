//! Bad snapshot files given to `hover restore`: truncated, corrupted,
//! another format version, not a snapshot at all, or a VM that does not fit
//! this host. Each gets a one-line error naming the section (and offset),
//! exit status 2, and nothing starts.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{hover, text, Scratch, Vm};
use hover_vmm::host::kvm_for_test;
use hover_vmm::state::file::{Snapshot, SnapshotWriter};
use hover_vmm::state::VmState;

/// A real snapshot of a running guest.
fn good_snapshot(dir: &Scratch) -> PathBuf {
    let vm = Vm::spawn(
        // Long enough (seconds) that the snapshot at 300 ms always finds it
        // running; the snapshot ends it.
        &["run", "--cmdline", "workload=memtouch size=8M rounds=20000"],
        &dir.path("vm.sock"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let snap = dir.path("good.snap");
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    vm.api().json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    let (code, _, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    snap
}

/// Copy `from` to a new file with `edit` applied to the bytes.
fn variant(dir: &Scratch, from: &Path, name: &str, edit: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut b = std::fs::read(from).unwrap();
    edit(&mut b);
    let p = dir.path(name);
    std::fs::write(&p, b).unwrap();
    p
}

/// Rewrite `from` with its state changed by `edit` (valid CRCs throughout).
fn restate(dir: &Scratch, from: &Path, name: &str, edit: impl FnOnce(&mut VmState)) -> PathBuf {
    rewrite(dir, from, name, edit, |_| {})
}

/// Rewrite `from` with its state and hot set changed (valid CRCs throughout).
fn rewrite(
    dir: &Scratch,
    from: &Path,
    name: &str,
    edit: impl FnOnce(&mut VmState),
    edit_hot: impl FnOnce(&mut Vec<u64>),
) -> PathBuf {
    let snap = Snapshot::open(from).unwrap();
    let mut state = snap.state.clone();
    edit(&mut state);
    let mut hot = snap.hot.clone();
    edit_hot(&mut hot);
    let p = dir.path(name);
    let mut w = SnapshotWriter::create(&p).unwrap();
    let mut page = vec![0u8; 4096];
    for (gpa, slot) in snap.stored_pages() {
        snap.read_stored(slot, &mut page).unwrap();
        w.page(gpa, &page).unwrap();
    }
    w.hot_set(hot);
    w.finish(&state).unwrap();
    p
}

/// Restore `path`: refused with exit 2 and one line that contains every `needle`.
fn refused(path: &Path, needles: &[&str]) {
    for mode in ["eager", "lazy", "prefetch"] {
        let out = hover(&["restore", path.to_str().unwrap(), "--memory-restore", mode]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path:?} {mode}: {stderr}");
        assert!(
            out.stdout.is_empty(),
            "nothing started: {}",
            text(&out.stdout)
        );
        assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
        for n in needles {
            assert!(stderr.contains(n), "{path:?} {mode}: {n:?} not in {stderr}");
        }
    }
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

#[test]
fn bad_snapshot_files_are_refused_and_nothing_starts() {
    if !kvm_for_test("bad_snapshot_files_are_refused_and_nothing_starts") {
        return;
    }
    let dir = Scratch::new("bad-snapshots");
    let good = good_snapshot(&dir);
    let bytes = std::fs::read(&good).unwrap();
    let sections_at = u64_at(&bytes, 24) as usize;

    let p = variant(&dir, &good, "truncated.snap", |b| b.truncate(b.len() / 2));
    refused(&p, &["truncated", "offset"]);
    let p = variant(&dir, &good, "tail-cut.snap", |b| b.truncate(b.len() - 10));
    refused(&p, &["truncated"]);
    let p = variant(&dir, &good, "empty.snap", |b| b.clear());
    refused(&p, &["truncated", "header"]);
    // A flipped byte in the first section (CONF's payload starts 24 bytes in).
    let p = variant(&dir, &good, "conf-crc.snap", |b| {
        b[sections_at + 30] ^= 0x40
    });
    refused(
        &p,
        &["section CONF", &format!("offset {sections_at}"), "CRC"],
    );
    let p = variant(&dir, &good, "header-crc.snap", |b| b[20] ^= 1);
    refused(&p, &["header", "offset 0", "CRC"]);
    let p = variant(&dir, &good, "version.snap", |b| b[8] = 99);
    refused(&p, &["format version 99", "offset 8"]);
    let p = variant(&dir, &good, "foreign.snap", |b| {
        *b = b"#!/bin/sh\necho this is not a snapshot\n".repeat(100)
    });
    refused(&p, &["not a Hover snapshot"]);
    refused(&dir.path("missing.snap"), &["cannot open"]);

    // A guest page that does not match its CRC: refused up front when eager.
    let p = variant(&dir, &good, "page-crc.snap", |b| b[4096 + 100] ^= 0xff);
    let out = hover(&["restore", p.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("offset 4096") && stderr.contains("CRC"),
        "{stderr}"
    );

    // VMs that do not fit: too much memory, CPUID features this host lacks.
    let p = restate(&dir, &good, "huge.snap", |s| {
        s.config.config.memory = 1 << 40
    });
    refused(&p, &["section CONF", "too large"]);
    let p = restate(&dir, &good, "cpuid.snap", |s| {
        for e in s.vcpus[0].cpuid.iter_mut().filter(|e| e.function == 7) {
            e.ebx = u32::MAX;
            e.ecx = u32::MAX;
            e.edx = u32::MAX;
        }
    });
    refused(&p, &["section VCPU", "CPUID leaf 0x7"]);
    let p = restate(&dir, &good, "vcpus.snap", |s| {
        s.config.config.vcpus = 1;
    });
    refused(&p, &["section VCPU", "2 vCPU states for 1 vCPUs"]);
    // A section header's reserved word set (no CRC covers it).
    let p = variant(&dir, &good, "reserved.snap", |b| b[sections_at + 20] = 1);
    refused(&p, &["section CONF", "reserved word"]);
    // Configurations `hover run` refuses: no image end, a budget too small
    // to hold the image.
    let p = restate(&dir, &good, "image-end.snap", |s| s.config.image_end = 0);
    refused(&p, &["section CONF", "image end"]);
    let p = restate(&dir, &good, "budget.snap", |s| {
        s.config.config.memory_budget = Some(4 << 20)
    });
    refused(&p, &["section CONF", "budget"]);
    // A hot set naming a page outside guest memory.
    let p = rewrite(&dir, &good, "hot.snap", |_| {}, |h| h.insert(0, 1 << 40));
    refused(
        &p,
        &[
            "section HOTS",
            "offset",
            "entry 0",
            "not a page of guest memory",
        ],
    );

    // The good file still restores after all that.
    let out = hover(&["restore", good.to_str().unwrap(), "--console", "off"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// A snapshot carries what the VM is, never a host path: the I/O file a
/// VM wrote before its snapshot is not opened by a restore that names none
/// (its writes go to a fresh tmpfs file), and a restore that names one
/// writes there. Both restores are watched until their guests have written
/// since the restore (the device's request count passes the saved one),
/// then shut down: no timing decides the outcome.
#[test]
fn a_restore_takes_its_io_file_from_its_own_flags_never_from_the_snapshot() {
    if !kvm_for_test("a_restore_takes_its_io_file_from_its_own_flags_never_from_the_snapshot") {
        return;
    }
    let dir = Scratch::new("snap-iofile");
    let first = dir.path("first.io");
    let vm = Vm::spawn(
        &[
            "run",
            "--io-file",
            first.to_str().unwrap(),
            "--cmdline",
            "workload=iolat seconds=600",
        ],
        &dir.path("vm.sock"),
    );
    // The guest is writing once the file has data.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while std::fs::metadata(&first).map_or(0, |m| m.len()) == 0 {
        assert!(std::time::Instant::now() < until, "the guest never wrote");
        std::thread::sleep(Duration::from_millis(20));
    }
    let snap = dir.path("io.snap");
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    vm.api().json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    let (code, _, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !std::fs::read(&snap)
            .unwrap()
            .windows(first.as_os_str().len())
            .any(|w| w == first.as_os_str().as_encoded_bytes()),
        "the snapshot names the host's I/O file"
    );
    let saved = Snapshot::open(&snap).unwrap().state.devices.pvio.requests;
    std::fs::write(&first, b"keep").unwrap();

    let second = dir.path("second.io");
    let unnamed = Vm::spawn(&["restore", snap.to_str().unwrap()], &dir.path("r1.sock"));
    let named = Vm::spawn(
        &[
            "restore",
            snap.to_str().unwrap(),
            "--io-file",
            second.to_str().unwrap(),
        ],
        &dir.path("r2.sock"),
    );
    for r in [&unnamed, &named] {
        let until = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let v = r.api().json("GET", "/vm/stats", None).unwrap();
            if v["io"]["requests"].as_u64().unwrap_or(0) > saved {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "no write after the restore: {v}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        r.api().json("PUT", "/vm/shutdown", None).unwrap();
    }
    for r in [unnamed, named] {
        let (code, outcome, stderr) = r.wait();
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(outcome["ended"], "shutdown");
    }
    assert!(
        std::fs::metadata(&second).unwrap().len() > 0,
        "nothing written to --io-file"
    );
    assert_eq!(
        std::fs::read(&first).unwrap(),
        b"keep",
        "a restore wrote the snapshot's I/O file"
    );
}
