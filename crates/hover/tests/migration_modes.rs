//! Live migration's modes beyond the plain pre-copy: throttling a guest
//! that outruns the link, a separate sender process (seed 3's setting), and
//! VMs under a pager (a memory budget, a lazy restore).

mod common;

use hover_vmm::sync::Locked;
use std::time::Duration;

use common::migrate::{finish, kvstore, new_key, receiver, receiver_with, refused_request};
use common::{report, Scratch, Vm};
use hover_vmm::host::kvm_for_test;

/// These tests run one at a time: each runs two or three VMs whose timing
/// matters (a guest must outlast its migration, a pager its budget), and on
/// a 2-core host three at once starve each other.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A guest that dirties its memory faster than the link carries it: one
/// task writing 5000 records a second over 4 MiB, on a link held to 2 MB/s
/// (a round of 4 MiB takes 2 s, in which every page is written again). The
/// rings say which vCPU writes; only that one is slowed, and the migration
/// converges; without the throttle it does not. `GET /vm` shows the rounds
/// and the throttle meanwhile.
#[test]
fn a_guest_that_outruns_the_link_is_throttled_until_it_converges() {
    if !kvm_for_test("a_guest_that_outruns_the_link_is_throttled_until_it_converges") {
        return;
    }
    let _one = ONE_AT_A_TIME.locked();
    let dir = Scratch::new("migrate-throttle");
    let args = [
        "run",
        "--vcpus",
        "2",
        "--dirty-ring",
        "4096",
        "--cmdline",
        "workload=kvstore wss=4M rate=5000 tasks=1 seconds=32",
    ];
    let src = Vm::spawn(&args, &dir.path("src.sock"));
    std::thread::sleep(Duration::from_millis(500));
    // Without the throttle it does not converge: a clear 504 at the
    // timeout, and the source runs on.
    let (dest, at) = receiver(&format!("unix:{}", dir.path("no.sock").display()));
    let body = serde_json::json!({
        "to": at,
        "dirty_tracking": "ring",
        "bandwidth": 2_000_000,
        "auto_converge": false,
        "timeout_s": 7,
    });
    let r = src
        .api()
        .call("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    assert_eq!(r.status, 504, "{}", r.body);
    assert!(r.body.contains("--auto-converge"), "{}", r.body);
    let _ = finish(dest);
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    let body = serde_json::json!({
        "to": at,
        "verify": true,
        "dirty_tracking": "ring",
        "bandwidth": 2_000_000,
        "throttle_initial": 50,
        "throttle_step": 25,
        "timeout_s": 100,
    });
    let api = src.api();
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watch = {
        let (api, watching) = (src.api(), watching.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(v) = api.json("GET", "/vm", None) {
                    if !v["migration"].is_null() {
                        seen.push(v["migration"].clone());
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            seen
        })
    };
    let rep = api
        .json("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let seen = watch.join().unwrap();
    let pct: Vec<u64> = rep["vcpu_throttle_pct"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect();
    let slept: Vec<f64> = rep["vcpu_throttled_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    assert_eq!(pct.len(), 2, "{rep}");
    // The writing vCPU was slowed (and slept), the idle one was not.
    let busy = if pct[0] >= pct[1] { 0 } else { 1 };
    assert!(pct[busy] >= 50, "the writer was throttled: {rep}");
    assert!(slept[busy] > 0.0, "the writer slept: {rep}");
    assert_eq!(pct[1 - busy], 0, "the idle vCPU ran freely: {rep}");
    assert!(rep["rounds"].as_u64().unwrap() >= 4, "{rep}");
    // Progress was visible while it ran, the throttle included.
    assert!(
        seen.iter().any(|m| m["round"].as_u64() > Some(1)),
        "rounds in GET /vm: {seen:?}"
    );
    assert!(
        seen.iter().any(|m| m["vcpu_throttle_pct"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p.as_u64() > Some(0)))),
        "the throttle in GET /vm: {seen:?}"
    );
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
}

/// Seed 3's setting: a separate sender process reads guest memory (by
/// per-page mmap, process_vm_readv, or one mapping of the memfd) and writes
/// the page frames itself; the guest arrives intact each way. The mapping
/// modes are refused on an anonymous-memory VM, naming the field.
#[test]
fn a_sender_process_migrates_the_guest_with_each_mapping_mode() {
    if !kvm_for_test("a_sender_process_migrates_the_guest_with_each_mapping_mode") {
        return;
    }
    let _one = ONE_AT_A_TIME.locked();
    let dir = Scratch::new("migrate-sender");
    // readv on an authenticated link: the process's frames carry on the
    // VMM's MAC sequence, and the destination checks every one.
    let key = new_key(&dir, "k.key");
    let keyed = ["--migration-key", key.to_str().unwrap()];
    for mode in ["per-page", "readv", "persistent"] {
        let extra = if mode == "readv" { &keyed[..] } else { &[][..] };
        let (dest, at) = receiver_with(&format!("unix:{}", dir.path("in.sock").display()), extra);
        let mut args = vec![
            "run",
            "--memory-backend",
            "memfd",
            "--cmdline",
            "workload=kvstore wss=16M rate=1000 seconds=10",
        ];
        args.extend(extra);
        let src = Vm::spawn(&args, &dir.path("src.sock"));
        std::thread::sleep(Duration::from_millis(500));
        let body = serde_json::json!({ "to": at, "verify": true, "sender_process": mode });
        let rep = src
            .api()
            .json("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert_eq!(rep["sender_process"], mode, "{rep}");
        assert_eq!(rep["authenticated"], mode == "readv", "{rep}");
        assert!(rep["pages_sent"].as_u64().unwrap() > 100, "{rep}");
        assert!(
            rep["sender_process_cpu_us"].as_u64().unwrap() > 0,
            "the process did the sending: {rep}"
        );
        let (code, _, stderr) = src.wait();
        assert_eq!(code, Some(0), "{mode}: {stderr}");
        let (code, o, stderr) = finish(dest);
        assert_eq!(code, Some(0), "{mode}: {stderr}");
        assert_eq!(report(&o, "kvstore.errors"), 0, "{mode}");
    }
    let anon = kvstore(&dir, "anon");
    refused_request(
        anon,
        r#"{"to": "unix:/nowhere", "sender_process": "per-page"}"#,
        &["sender_process", "memfd"],
    );
}

/// VMs under a pager migrate: one over its memory budget (pages evicted to
/// its store are read from there; the destination keeps arriving memory in
/// a file and pages it in under the same budget), and one restored lazily
/// from a snapshot (pages still in the snapshot are read from it). The
/// digest and the guest's own checks pass each time.
#[test]
fn vms_under_a_pager_migrate() {
    if !kvm_for_test("vms_under_a_pager_migrate") {
        return;
    }
    let _one = ONE_AT_A_TIME.locked();
    let dir = Scratch::new("migrate-paged");
    let migrate = |src: &Vm, at: &str| {
        let body = serde_json::json!({ "to": at, "verify": true }).to_string();
        src.api()
            .json("PUT", "/vm/migrate", Some(&body))
            .unwrap_or_else(|e| panic!("{e}"))
    };
    // Over budget: 48 MiB written under a 32 MiB budget.
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    let src = Vm::spawn(
        &[
            "run",
            "--memory",
            "256M",
            "--memory-budget",
            "32M",
            "--cmdline",
            "workload=kvstore wss=48M rate=20000 seconds=15",
        ],
        &dir.path("budget.sock"),
    );
    // Migrate once 8 MiB have gone out to the store, so that more than
    // the budget's worth exists to send (the guest writes its 48 MiB first,
    // at whatever speed this host gives it; then it runs 15 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stats = src.api().json("GET", "/vm/stats", None).unwrap();
        if stats["pager"]["evictions"].as_u64().unwrap() >= 2048 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "8 MiB were not evicted in 60 s: {}",
            stats["pager"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rep = migrate(&src, &at);
    assert!(
        rep["pages_sent"].as_u64().unwrap() > 8192,
        "more than the budget went: {rep}"
    );
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
    assert_eq!(o["restore"]["memory_restore"], "lazy", "{}", o["restore"]);
    let pager = &o["pager"];
    assert!(
        pager["resident_pages"].as_u64() <= pager["budget_pages"].as_u64(),
        "the destination kept the budget: {pager}"
    );
    assert!(pager["source_reads"].as_u64().unwrap() > 0, "{pager}");

    // Restored lazily, migrated at once: most pages are still in the snapshot.
    let a = Vm::spawn(
        &[
            "run",
            "--cmdline",
            "workload=kvstore wss=16M rate=5000 seconds=15",
        ],
        &dir.path("a.sock"),
    );
    std::thread::sleep(Duration::from_millis(1000));
    let snap = dir.path("a.snap");
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    a.api().json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    let (code, _, stderr) = a.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let b = Vm::spawn(
        &[
            "restore",
            snap.to_str().unwrap(),
            "--memory-restore",
            "lazy",
        ],
        &dir.path("b.sock"),
    );
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in2.sock").display()));
    let rep = migrate(&b, &at);
    assert!(rep["pages_sent"].as_u64().unwrap() > 1000, "{rep}");
    let (code, _, stderr) = b.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
    // A sender process cannot read what the pager holds elsewhere.
    let c = Vm::spawn(
        &[
            "run",
            "--memory-budget",
            "32M",
            "--cmdline",
            "workload=kvstore wss=8M seconds=600",
        ],
        &dir.path("c.sock"),
    );
    refused_request(
        c,
        r#"{"to": "unix:/nowhere", "sender_process": "readv"}"#,
        &["sender_process"],
    );
}
