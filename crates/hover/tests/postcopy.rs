//! Post-copy migration between two `hover` processes: a running `kvstore`
//! guest starts at the destination at once and its memory follows (pages it
//! touches first, the rest pushed); the workload's own check passes, the
//! memory hash matches the source's, and async page faults parked the tasks
//! that touched a remote page. A hybrid migration switches on request. A
//! link cut or a corrupted batch during post-copy pauses the destination,
//! leaves the source `postcopy-paused` (never resumed: the guest ran at the
//! destination) and is recovered with nothing lost.

mod common;

use std::time::{Duration, Instant};

use common::migrate::{assert_breakdown_adds_up, finish, new_key, receiver, receiver_with};
use common::proxy::{Fault, Proxy};
use common::{report, Scratch, Vm};
use hover_vmm::host::kvm_for_test;

/// A kvstore guest that keeps writing for `seconds`.
fn writer(dir: &Scratch, name: &str, seconds: u32) -> Vm {
    writer_with(dir, name, seconds, &[])
}

/// [`writer`] with more `hover run` arguments.
fn writer_with(dir: &Scratch, name: &str, seconds: u32, extra: &[&str]) -> Vm {
    let cmdline = format!("workload=kvstore wss=32M rate=2000 seconds={seconds}");
    let mut args = vec!["run", "--cmdline", &cmdline];
    args.extend(extra);
    Vm::spawn(&args, &dir.path(&format!("{name}.sock")))
}

/// Wait until `vm`'s migration shows `mode` (within 20 s).
fn wait_for_mode(vm: &Vm, mode: &str) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let v = vm.api().json("GET", "/vm", None).unwrap();
        if v["migration"]["mode"] == mode {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no {mode} phase: {v}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn kvstore_runs_at_the_destination_while_its_memory_arrives() {
    if !kvm_for_test("kvstore_runs_at_the_destination_while_its_memory_arrives") {
        return;
    }
    let dir = Scratch::new("postcopy");
    // Over TCP authenticated: requests and pushed pages carry MACs both ways.
    let key = new_key(&dir, "k.key");
    let keyed = ["--migration-key", key.to_str().unwrap()];
    for (listen, extra) in [
        (format!("unix:{}", dir.path("in.sock").display()), &[][..]),
        ("tcp:127.0.0.1:0".to_string(), &keyed[..]),
    ] {
        let (dest, at) = receiver_with(&listen, extra);
        let src = writer_with(&dir, "src", 6, extra);
        std::thread::sleep(Duration::from_millis(1500));
        // 8 MB/s: the pushed pages take over a second to arrive, so the
        // guest (2000 random writes a second over 32 MiB) certainly touches
        // some before they do. On an unlimited local link all of them
        // could arrive before the guest touched one (seen: 38 ms).
        let body = serde_json::json!({
            "to": at, "mode": "postcopy", "verify": true, "bandwidth": 8_000_000u64,
        });
        let r = src
            .api()
            .json("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap_or_else(|e| panic!("{listen}: {e}"));
        assert_eq!(r["mode"], "postcopy", "{r}");
        assert_breakdown_adds_up(&r);
        // The pinned area while the guest ran, then what it dirtied of it
        // during the pause: the rest followed the guest.
        assert_eq!(r["rounds"], 2, "{r}");
        let pc = &r["postcopy"];
        let at_switch = pc["pages_at_switch"].as_u64().unwrap();
        assert!(at_switch > 256, "most memory followed the guest: {r}");
        // The guest wrote while the pinned area crossed at 8 MB/s (over a
        // second): those pages were pushed first.
        assert!(pc["hot_pages"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(pc["pages_received"].as_u64().unwrap(), at_switch, "{r}");
        let (code, o, stderr) = src.wait();
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(o["ended"], "migrated");
        let (code, o, stderr) = finish(dest);
        assert_eq!(code, Some(0), "{listen}: {stderr}");
        let pc = &o["postcopy"];
        assert_eq!(pc["verified"], true, "memory hashes as the source's: {pc}");
        assert_eq!(pc["pages_at_switch"].as_u64().unwrap(), at_switch);
        assert_eq!(o["restore"]["memory_restore"], "postcopy");
        // The guest touched pages still at the source: requested, and the
        // tasks that touched them parked while the vCPU ran others.
        assert!(pc["demand_pages"].as_u64().unwrap() > 0, "{pc}");
        assert!(pc["requests"].as_u64().unwrap() > 0, "{pc}");
        assert!(report(&o, "apf.parked") > 0, "async PF parked tasks");
        // Pushed pages went in by contiguous runs, fewer copies than pages.
        let pager = &o["pager"];
        let (pushed, copies) = (
            pager["pushed_pages"].as_u64().unwrap(),
            pager["push_copies"].as_u64().unwrap(),
        );
        assert!(pushed > 0 && copies < pushed, "{pager}");
        assert_eq!(report(&o, "kvstore.errors"), 0);
        assert!(report(&o, "kvstore.ops") > 0);
    }
}

#[test]
fn a_hybrid_migration_switches_to_postcopy_when_asked() {
    if !kvm_for_test("a_hybrid_migration_switches_to_postcopy_when_asked") {
        return;
    }
    let dir = Scratch::new("postcopy-hybrid");
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    let src = writer(&dir, "src", 8);
    std::thread::sleep(Duration::from_millis(1000));
    // Asking outside a migration, or of a pre-copy one, is refused.
    let r = src.api().call("PUT", "/vm/migrate/postcopy", None).unwrap();
    assert_eq!(r.status, 409, "{}", r.body);
    // A slow link and no auto-converge: pre-copy rounds go on until told.
    let body = serde_json::json!({
        "to": at, "mode": "hybrid", "verify": true, "bandwidth": 2_000_000,
        "auto_converge": false, "timeout_s": 60,
    });
    let api = src.api();
    let mig = std::thread::spawn(move || {
        api.json("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap()
    });
    let v = wait_for_mode(&src, "hybrid");
    assert!(v["migration"]["round"].as_u64().is_some(), "{v}");
    let r = src.api().call("PUT", "/vm/migrate/postcopy", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = mig.join().unwrap();
    assert_eq!(r["mode"], "postcopy", "{r}");
    assert!(
        r["rounds"].as_u64().unwrap() >= 2,
        "pre-copy rounds first: {r}"
    );
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["postcopy"]["verified"], true, "{}", o["postcopy"]);
    assert_eq!(report(&o, "kvstore.errors"), 0);
}

/// A post-copy migration whose link broke: the destination holds its guest
/// (paused) and waits for the source to come back.
struct Broken {
    _dir: Scratch,
    dest: std::process::Child,
    dest_at: String,
    dest_api: std::path::PathBuf,
    src: Vm,
}

/// Migrate a writer in post-copy through a proxy, and break the link with
/// `damage` once post-copy runs.
fn break_link(name: &str, keyed: bool, damage: impl FnOnce(&Proxy)) -> Broken {
    let dir = Scratch::new(name);
    let dest_at = format!("unix:{}", dir.path("in.sock").display());
    let dest_api = dir.path("dest-api.sock");
    // With a key, the recovery connection proves it again.
    let key = keyed.then(|| new_key(&dir, "k.key"));
    let key_args: Vec<&str> = match &key {
        Some(k) => vec!["--migration-key", k.to_str().unwrap()],
        None => vec![],
    };
    let mut rx_args = vec!["--api-socket", dest_api.to_str().unwrap()];
    rx_args.extend(&key_args);
    let (dest, _) = receiver_with(&dest_at, &rx_args);
    let src = writer_with(&dir, "src", 8, &key_args);
    std::thread::sleep(Duration::from_millis(1500));
    let (via, to) = (dir.path("proxy.sock"), dir.path("in.sock"));
    // A keyed stream has MACs the framing parser does not skip: a plain
    // forwarder, cut by hand.
    let proxy = match keyed {
        true => Proxy::with_fault(&via, &to, Fault::CutAt(u64::MAX)),
        false => Proxy::start(&via, &to),
    };
    let body = serde_json::json!({
        "to": format!("unix:{}", dir.path("proxy.sock").display()),
        "mode": "postcopy", "verify": true, "bandwidth": 4_000_000,
    });
    let api = src.api();
    let mig = std::thread::spawn(move || {
        api.call("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap()
    });
    wait_for_mode(&src, "postcopy");
    std::thread::sleep(Duration::from_millis(300));
    damage(&proxy);
    let r = mig.join().unwrap();
    assert!(r.status >= 500, "{}", r.body);
    assert!(r.body.contains("--recover"), "{}", r.body);
    // The destination holds its guest until the link is back.
    let dest_vm = hover_vmm::api::ApiClient::new(&dest_api, Duration::from_secs(30));
    let t0 = Instant::now();
    loop {
        let v = dest_vm.json("GET", "/vm", None).unwrap();
        if v["state"] == "paused" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "not paused: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Broken {
        _dir: dir,
        dest,
        dest_at,
        dest_api,
        src,
    }
}

/// Break the link with `damage`, and recover straight to the destination.
fn break_and_recover(name: &str, keyed: bool, damage: impl FnOnce(&Proxy)) {
    let Broken {
        _dir,
        dest,
        dest_at,
        src,
        ..
    } = break_link(name, keyed, damage);
    // The source keeps the pages and never resumes the guest.
    let v = src.api().json("GET", "/vm", None).unwrap();
    assert_eq!(v["state"], "postcopy-paused", "{v}");
    let r = src.api().call("PUT", "/vm/resume", None).unwrap();
    assert_eq!(r.status, 409, "{}", r.body);
    let plain = serde_json::json!({ "to": dest_at }).to_string();
    let r = src.api().call("PUT", "/vm/migrate", Some(&plain)).unwrap();
    assert_eq!(r.status, 400, "only a recovery: {}", r.body);
    assert!(r.body.contains("recover"), "{}", r.body);
    let body = serde_json::json!({ "to": dest_at, "recover": true, "verify": true });
    let r = src
        .api()
        .json("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    assert_eq!(r["postcopy"]["recoveries"], 1, "{r}");
    let (code, o, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["ended"], "migrated");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    let pc = &o["postcopy"];
    assert_eq!(pc["recoveries"], 1, "{pc}");
    assert_eq!(pc["verified"], true, "nothing lost: {pc}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
}

#[test]
fn a_destination_whose_source_died_ends_on_shutdown() {
    if !kvm_for_test("a_destination_whose_source_died_ends_on_shutdown") {
        return;
    }
    let b = break_link("postcopy-dead-source", false, |p| p.cut());
    // The source dies for good: nobody will ever bring the pages back.
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(b.src.pid() as i32, libc::SIGKILL) };
    let _ = b.src.wait();
    let dest_vm = hover_vmm::api::ApiClient::new(&b.dest_api, Duration::from_secs(30));
    dest_vm.json("PUT", "/vm/shutdown", None).unwrap();
    // The process ends (it used to wait for a recovery forever), and its
    // status says the guest was lost.
    let (code, _, stderr) = finish(b.dest);
    assert_ne!(code, Some(0), "{stderr}");
    assert!(stderr.contains("the guest is lost"), "{stderr}");
}

#[test]
fn a_link_cut_during_postcopy_is_recovered_with_nothing_lost() {
    if !kvm_for_test("a_link_cut_during_postcopy_is_recovered_with_nothing_lost") {
        return;
    }
    break_and_recover("postcopy-cut", true, |p| p.cut());
}

#[test]
fn a_corrupted_batch_is_never_placed_and_the_link_recovers() {
    if !kvm_for_test("a_corrupted_batch_is_never_placed_and_the_link_recovers") {
        return;
    }
    // (The proxy finds PAGES frames by their plain framing: no key.)
    break_and_recover("postcopy-corrupt", false, |p| {
        p.corrupt_next_pages();
        let t0 = Instant::now();
        while !p.corrupted.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no PAGES frame passed"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

#[test]
fn a_guest_that_powers_off_during_a_round_is_not_moved() {
    if !kvm_for_test("a_guest_that_powers_off_during_a_round_is_not_moved") {
        return;
    }
    let dir = Scratch::new("postcopy-ended");
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    // Once the guest has written its 32 MiB store (well within 2 s; its 8 s
    // count from then), the first round (those 32 MiB at 1 MB/s) outlives
    // it; the switch is asked for at once but comes after that round, when
    // the guest has powered off: it must end here, not move.
    let src = writer(&dir, "src", 8);
    std::thread::sleep(Duration::from_millis(2000));
    let body = serde_json::json!({
        "to": at, "mode": "hybrid", "bandwidth": 1_000_000, "auto_converge": false,
    });
    let api = src.api();
    let mig = std::thread::spawn(move || {
        api.call("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap()
    });
    wait_for_mode(&src, "hybrid");
    let r = src.api().call("PUT", "/vm/migrate/postcopy", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let r = mig.join().unwrap();
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(r.body.contains("guest stopped"), "{}", r.body);
    let (code, o, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["ended"], "power_off");
    let (code, o, _) = finish(dest);
    assert_ne!(code, Some(0));
    assert!(o.is_null(), "nothing ran at the destination: {o}");
}

#[test]
fn a_vm_under_a_memory_budget_moves_in_postcopy_within_its_budget() {
    if !kvm_for_test("a_vm_under_a_memory_budget_moves_in_postcopy_within_its_budget") {
        return;
    }
    let dir = Scratch::new("postcopy-budget");
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    let src = Vm::spawn(
        &[
            "run",
            "--memory-budget",
            "48M",
            "--cmdline",
            "workload=kvstore wss=32M rate=2000 seconds=5",
        ],
        &dir.path("src.sock"),
    );
    // Until the source's pager has seen the guest touch 1500 pages of its
    // working set for the first time (at whatever speed this host runs it).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stats = src.api().json("GET", "/vm/stats", None).unwrap();
        if stats["pager"]["zero_fills"].as_u64().unwrap_or(0) >= 1500 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the guest touched too few pages in 60 s: {}",
            stats["pager"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let body = serde_json::json!({ "to": at, "mode": "postcopy", "verify": true });
    let r = src
        .api()
        .json("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    assert_eq!(r["mode"], "postcopy", "{r}");
    // The source's pager saw the guest touch at least 1500 pages of its
    // working set before: those go first with what the guest wrote between the
    // request and the pause (a few hundred pages at most at 2000 writes a
    // second; the destination is local, the round is milliseconds).
    let hot = r["postcopy"]["hot_pages"].as_u64().unwrap();
    assert!(
        hot >= 1000,
        "the pages the guest touched first go first: {r}"
    );
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["postcopy"]["verified"], true, "{}", o["postcopy"]);
    // Pushed pages beyond the budget wait in the destination's file.
    let pager = &o["pager"];
    let budget = pager["budget_pages"].as_u64().unwrap();
    assert!(
        pager["resident_pages"].as_u64().unwrap() <= budget,
        "{pager}"
    );
    assert!(pager["pushed_pages"].as_u64().unwrap() <= budget, "{pager}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
}

/// Once every page of a post-copy has arrived, the destination loads the
/// pages it held since before the switch (a hybrid's pre-copy round) into
/// guest memory and hands guest memory back to the kernel: the pager lets
/// go (`released`), and the guest's fresh memory faults as any VM's. The
/// destination is held paused from the moment it runs, so its guest cannot
/// end before the release (the pager works while the vCPUs are paused).
#[test]
fn a_postcopy_destination_hands_memory_back_once_all_has_arrived() {
    if !kvm_for_test("a_postcopy_destination_hands_memory_back_once_all_has_arrived") {
        return;
    }
    let dir = Scratch::new("postcopy-release");
    let dest_api = dir.path("dest.sock");
    let (dest, at) = receiver_with(
        &format!("unix:{}", dir.path("in.sock").display()),
        &["--api-socket", dest_api.to_str().unwrap()],
    );
    let src = writer(&dir, "src", 10);
    std::thread::sleep(Duration::from_millis(500));
    // A final pause of 1 ms never fits: the rounds go on until told to
    // switch, and their pages are held at the destination.
    let body = serde_json::json!({
        "to": at, "mode": "hybrid", "verify": true, "bandwidth": 8_000_000u64,
        "downtime_ms": 1, "auto_converge": false, "timeout_s": 60,
    });
    let api = src.api();
    let mig = std::thread::spawn(move || api.json("PUT", "/vm/migrate", Some(&body.to_string())));
    wait_for_mode(&src, "hybrid");
    // Ask once a round has sent a good part of memory.
    let t0 = Instant::now();
    while src.api().json("GET", "/vm", None).unwrap()["migration"]["pages_sent"]
        .as_u64()
        .unwrap_or(0)
        < 1000
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the first round never got going"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = src.api().call("PUT", "/vm/migrate/postcopy", None).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    // Hold the destination's guest as soon as it runs.
    let t0 = Instant::now();
    let dest_ctl = hover_vmm::api::ApiClient::new(&dest_api, Duration::from_secs(30));
    loop {
        if dest_api.exists() {
            if let Ok(r) = dest_ctl.call("PUT", "/vm/pause", None) {
                if r.status == 200 {
                    break;
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the destination never ran"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let r = mig.join().unwrap().unwrap();
    assert_eq!(r["mode"], "postcopy", "{r}");
    let t0 = Instant::now();
    loop {
        let stats = dest_ctl.json("GET", "/vm/stats", None).unwrap();
        if stats["pager"]["released"] == true {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the pager never let go: {}",
            stats["pager"]
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    dest_ctl.call("PUT", "/vm/resume", None).unwrap();
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["postcopy"]["verified"], true, "{}", o["postcopy"]);
    assert_eq!(o["pager"]["released"], true, "{}", o["pager"]);
    // The pages held since the pre-copy round were loaded first: the
    // pager placed more pages than post-copy brought.
    let pager = &o["pager"];
    assert!(pager["prefetch_ms"].is_f64(), "{pager}");
    assert!(
        pager["pushed_pages"].as_u64().unwrap() > o["postcopy"]["pages_received"].as_u64().unwrap(),
        "{pager} {}",
        o["postcopy"]
    );
    assert_eq!(
        report(&o, "kvstore.errors"),
        0,
        "every page as the source had it"
    );
}
