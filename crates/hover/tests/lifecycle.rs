//! Snapshots and restores across processes: a running guest is snapshotted
//! through the API and restored by `hover restore` in a new process, where
//! its workload finishes with its own verification passing and the same
//! reports as an uninterrupted run.

mod common;

use std::time::Duration;

use common::{hover, report, report_keys, text, Scratch, Vm};
use hover_vmm::host::kvm_for_test;

/// An uninterrupted run of `args`: its JSON outcome.
fn reference(args: &[&str]) -> serde_json::Value {
    let mut a = vec!["run", "--json", "--console", "off"];
    a.extend_from_slice(args);
    let out = hover(&a);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Start `args`, snapshot it with stop after `after`, return the snapshot path.
fn snapshot_midway(
    dir: &Scratch,
    name: &str,
    args: &[&str],
    after: Duration,
) -> std::path::PathBuf {
    let mut a = vec!["run"];
    a.extend_from_slice(args);
    let vm = Vm::spawn(&a, &dir.path(&format!("{name}.sock")));
    std::thread::sleep(after);
    let snap = dir.path(&format!("{name}.snap"));
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    let info = vm
        .api()
        .json("PUT", "/vm/snapshot", Some(&body))
        .unwrap_or_else(|e| panic!("{name}: snapshot failed (did the guest end first?): {e}"));
    assert_eq!(info["stopped"], true);
    assert!(info["pages"].as_u64().unwrap() > 0);
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(outcome["ended"], "snapshot", "{outcome}");
    snap
}

/// `hover restore` of `snap`: its JSON outcome, checked to have powered off cleanly.
fn restore(snap: &std::path::Path, mode: &str) -> serde_json::Value {
    let out = hover(&[
        "restore",
        snap.to_str().unwrap(),
        "--memory-restore",
        mode,
        "--json",
        "--console",
        "off",
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "restore {mode}: {stderr}");
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["ended"], "power_off", "{o}");
    assert_eq!(o["exit_code"], 0);
    o
}

#[test]
fn restored_workloads_finish_as_if_uninterrupted() {
    if !kvm_for_test("restored_workloads_finish_as_if_uninterrupted") {
        return;
    }
    let dir = Scratch::new("restored-workloads");
    let cases = [
        // Each runs well past the snapshot at 400 ms (memtouch: about 2.5 s
        // on a fast host).
        ("memtouch", "workload=memtouch size=32M tasks=2 rounds=1500"),
        ("spin", "workload=spin tasks=4 seconds=8"),
        ("timer", "workload=timer interval_us=1000 seconds=3"),
    ];
    for (name, cmdline) in cases {
        let args = ["--cmdline", cmdline];
        let want = reference(&args);
        let snap = snapshot_midway(&dir, name, &args, Duration::from_millis(400));
        let mut loaded = Vec::new();
        for mode in ["eager", "lazy"] {
            let got = restore(&snap, mode);
            assert_eq!(report_keys(&got), report_keys(&want), "{name} {mode}");
            assert_eq!(got["restore"]["memory_restore"], mode);
            loaded.push(got["restore"]["pages_loaded"].as_u64().unwrap());
            match name {
                "memtouch" => {
                    assert_eq!(report(&got, "memtouch.errors"), 0, "{name} {mode}");
                    assert_eq!(
                        report(&got, "memtouch.checksum"),
                        report(&want, "memtouch.checksum"),
                        "{name} {mode}: the pattern read back differs"
                    );
                    assert_eq!(
                        report(&got, "memtouch.pages"),
                        report(&want, "memtouch.pages")
                    );
                    let pager = &got["pager"];
                    if mode == "lazy" {
                        assert!(
                            pager["source_reads"].as_u64().unwrap() > 1000,
                            "lazy: pages come from the snapshot on touch: {pager}"
                        );
                    }
                }
                "spin" => {
                    let tasks: u64 = (0..4)
                        .map(|i| report(&got, &format!("spin.task.{i}")))
                        .sum();
                    assert!((0..4).all(|i| report(&got, &format!("spin.task.{i}")) > 0));
                    assert_eq!(report(&got, "spin.total"), tasks);
                }
                _ => assert_eq!(
                    report(&got, "timer.samples"),
                    report(&want, "timer.samples"),
                    "every deadline gives one wake-up, across the restore"
                ),
            }
        }
        // Only memtouch's buffer lies beyond the guest image, which a lazy
        // restore loads up front too.
        if name == "memtouch" {
            assert!(
                loaded[1] < loaded[0],
                "{name}: lazy loads fewer pages up front ({loaded:?})"
            );
        }
    }
}

/// A filter that makes `userfaultfd(2)` fail with EPERM and allows the
/// rest, as a container's default seccomp profile does.
fn no_userfaultfd() -> seccompiler::BpfProgram {
    let filter = seccompiler::SeccompFilter::new(
        [(libc::SYS_userfaultfd, vec![])].into_iter().collect(),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(libc::EPERM as u32),
        seccompiler::TargetArch::x86_64,
    )
    .unwrap();
    filter.try_into().unwrap()
}

/// `hover restore` without `--memory-restore` prefetches where userfaultfd
/// is usable, and restores eagerly, saying why, where it is not (here the
/// restoring process runs under a filter that refuses `userfaultfd(2)`).
/// The guest's own verification passes both ways; an explicit `prefetch`
/// there is refused with the reason, exit 1, nothing run.
#[test]
fn restore_prefetches_by_default_and_is_eager_without_userfaultfd() {
    use std::os::unix::process::CommandExt;
    if !kvm_for_test("restore_prefetches_by_default_and_is_eager_without_userfaultfd") {
        return;
    }
    if let Err(e) = hover_vmm::memory::uffd::pager_usable() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but userfaultfd is unusable: {e}"
        );
        eprintln!("skipping: userfaultfd is unusable here ({e}), so the default is eager");
        return;
    }
    let dir = Scratch::new("restore-default");
    // Long enough (about 2.5 s on a fast host) that the snapshot at 400 ms
    // always finds the guest running.
    let args = [
        "--cmdline",
        "workload=memtouch size=32M tasks=2 rounds=1500",
    ];
    let want = reference(&args);
    let snap = snapshot_midway(&dir, "memtouch", &args, Duration::from_millis(400));
    let restore_with = |extra: &[&str], refuse_uffd: bool| {
        let mut cmd = common::hover_cmd();
        cmd.args([
            "restore",
            snap.to_str().unwrap(),
            "--json",
            "--console",
            "off",
        ])
        .args(extra);
        if refuse_uffd {
            let prog = no_userfaultfd();
            // SAFETY: between fork and exec only prctl(2) and seccomp(2)
            // run, on a program built before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    seccompiler::apply_filter(&prog).map_err(std::io::Error::other)
                });
            }
        }
        cmd.output().unwrap()
    };
    let check = |out: &std::process::Output, mode: &str| {
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{mode}: {stderr}");
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got["restore"]["memory_restore"], mode, "{}", got["restore"]);
        assert_eq!(report(&got, "memtouch.errors"), 0);
        assert_eq!(
            report(&got, "memtouch.checksum"),
            report(&want, "memtouch.checksum")
        );
        stderr
    };
    check(&restore_with(&[], false), "prefetch");
    let stderr = check(&restore_with(&[], true), "eager");
    assert!(
        stderr.contains("restoring eagerly") && stderr.contains("userfaultfd"),
        "the fallback says why: {stderr}"
    );
    let out = restore_with(&["--memory-restore", "prefetch"], true);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("userfaultfd"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing ran: {}", text(&out.stdout));
}

#[test]
fn an_overcommitted_vm_restores_through_its_pager() {
    if !kvm_for_test("an_overcommitted_vm_restores_through_its_pager") {
        return;
    }
    let dir = Scratch::new("restore-paged");
    let args = [
        "--memory",
        "96M",
        "--memory-budget",
        "32M",
        "--cmdline",
        "workload=memtouch size=40M tasks=2 rounds=3",
    ];
    let want = reference(&args);
    let snap = snapshot_midway(&dir, "paged", &args, Duration::from_millis(300));
    let got = restore(&snap, "eager");
    assert_eq!(report(&got, "memtouch.errors"), 0);
    assert_eq!(
        report(&got, "memtouch.checksum"),
        report(&want, "memtouch.checksum")
    );
    assert_eq!(
        got["restore"]["memory_restore"], "lazy",
        "paged VMs restore lazily"
    );
    let pager = &got["pager"];
    assert!(
        pager["evictions"].as_u64().unwrap() > 0,
        "the budget still holds: {pager}"
    );
    // Prefetching (what `auto`, the default, picks for a paged VM: a unit
    // test of `MemoryRestore::resolve`) loads the hot set only up to the
    // budget; the rest comes on demand, and the guest's check passes.
    let got = restore(&snap, "prefetch");
    assert_eq!(report(&got, "memtouch.errors"), 0);
    assert_eq!(
        report(&got, "memtouch.checksum"),
        report(&want, "memtouch.checksum")
    );
    assert_eq!(got["restore"]["memory_restore"], "prefetch");
    let pager = &got["pager"];
    let budget_pages = 32 << 20 >> 12;
    assert!(
        pager["pushed_pages"].as_u64().unwrap() <= budget_pages,
        "the loader stays within the budget: {pager}"
    );
    assert!(
        pager["evictions"].as_u64().unwrap() > 0,
        "the budget still holds: {pager}"
    );
}

#[test]
fn pause_resume_and_state_through_ctl() {
    if !kvm_for_test("pause_resume_and_state_through_ctl") {
        return;
    }
    let dir = Scratch::new("ctl");
    let sock = dir.path("vm.sock");
    let vm = Vm::spawn(
        // Long enough to outlast every request below on a loaded host; the
        // test ends it with `ctl shutdown`.
        &["run", "--cmdline", "workload=spin tasks=2 seconds=600"],
        &sock,
    );
    let s = sock.to_str().unwrap();
    let ctl = |args: &[&str]| {
        let mut a = vec!["ctl", "--api-socket", s];
        a.extend_from_slice(args);
        hover(&a)
    };
    let out = ctl(&["get"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("state: running"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["pause"]);
    assert!(
        text(&out.stdout).contains("paused"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["--json", "get"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "paused");
    // Pausing twice is refused, and says why.
    let out = ctl(&["pause"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("needs a running VM"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(ctl(&["resume"]).status.code(), Some(0));
    let out = ctl(&["metrics"]);
    assert!(
        text(&out.stdout).contains("hover_up 1"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["halt-poll", "--window-ns", "50000"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A boost change carries only what it names; what it leaves out stays.
    let out = ctl(&["boost", "--mode", "static", "--max-ms", "7"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = ctl(&["--json", "get"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["config"]["boost"]["mode"], "static", "{v}");
    assert_eq!(v["config"]["boost"]["max_ms"], 7, "{v}");
    assert_eq!(v["config"]["boost"]["policy"], "fifo:10", "{v}");
    // Boosting has one shape: what PUT /vm/boost answers and takes is what
    // GET /vm shows and what GET /vm/stats reports beside its figures.
    let out = ctl(&["--json", "boost", "--keep-us", "1500"]);
    let put: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let put = put.get("boost").unwrap_or(&put).clone();
    let out = ctl(&["--json", "get"]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = ctl(&["--json", "stats"]);
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut reported = stats["boost"].clone();
    reported.as_object_mut().unwrap().remove("vcpus");
    assert_eq!(put["keep_us"], 1500, "{put}");
    assert_eq!(got["config"]["boost"], put, "GET /vm against PUT's answer");
    assert_eq!(reported, put, "GET /vm/stats against PUT's answer");
    assert_eq!(ctl(&["boost", "--mode", "off"]).status.code(), Some(0));
    // A value the VM refuses is said of ctl's own flag and the request's
    // field, never of another command's flag; the VM runs on.
    for (args, says) in [
        (
            &["halt-poll", "--window-ns", "20ms"][..],
            "hover: error: --window-ns: the VM at",
        ),
        (
            &["halt-poll", "--window-ns", "20ms"][..],
            "window_ns 20000000 is too large",
        ),
        (&["boost", "--max-ms", "0"][..], "--max-ms: the VM at"),
        (
            &["boost", "--max-ms", "0"][..],
            "max_ms 0 is out of range: give 1 to 10000",
        ),
        (&["boost", "--irq-us", "5"][..], "--irq-us: the VM at"),
        (
            &["halt-poll", "--auto", "--budget", "0"][..],
            "--budget: the VM at",
        ),
    ] {
        let out = ctl(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("--halt-poll") && !stderr.contains("--boost-"),
            "{args:?}: {stderr}"
        );
    }
    // `hover stats` stays as an alias of `hover ctl stats`.
    let out = hover(&["stats", "--api-socket", s]);
    assert!(
        text(&out.stdout).contains("halt_exits"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["shutdown"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(outcome["ended"], "shutdown", "{outcome}");
}

#[test]
fn a_lazily_restored_vm_snapshots_pages_it_has_not_fetched() {
    if !kvm_for_test("a_lazily_restored_vm_snapshots_pages_it_has_not_fetched") {
        return;
    }
    let dir = Scratch::new("resnapshot");
    // Long enough (about 2.5 s on a fast host) that the snapshot at 400 ms
    // always finds the guest running.
    let args = [
        "--cmdline",
        "workload=memtouch size=32M tasks=2 rounds=1500",
    ];
    let want = reference(&args);
    let first = snapshot_midway(&dir, "first", &args, Duration::from_millis(400));
    // Restore lazily and snapshot again at once: most pages are still only
    // in the first file, and must be read from there into the second.
    let vm = Vm::spawn(
        &[
            "restore",
            first.to_str().unwrap(),
            "--memory-restore",
            "lazy",
        ],
        &dir.path("restored.sock"),
    );
    let info = match vm.api().json("GET", "/vm", None) {
        Ok(v) => v,
        Err(e) => {
            let (code, _, stderr) = vm.wait();
            panic!("the restored VM does not answer ({e}); it exited with {code:?}: {stderr}");
        }
    };
    assert_eq!(info["restored_from"], first.to_str().unwrap());
    let second = dir.path("second.snap");
    let body = serde_json::json!({ "path": second, "stop": true }).to_string();
    let snap = vm.api().json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(outcome["ended"], "snapshot");
    // Every page the first snapshot held is in the second (a handful may
    // have been zeroed by the guest since, and are then left out).
    let gpas = |p: &std::path::Path| -> std::collections::BTreeSet<u64> {
        hover_vmm::state::file::Snapshot::open(p)
            .unwrap()
            .stored_pages()
            .map(|(gpa, _)| gpa)
            .collect()
    };
    let (before, after) = (gpas(&first), gpas(&second));
    let missing = before.difference(&after).count();
    assert!(
        before.len() > 1000 && missing <= 16,
        "{missing} of the first snapshot's {} pages are not in the second: {snap}",
        before.len()
    );
    std::fs::remove_file(&first).unwrap();
    let got = restore(&second, "eager");
    assert_eq!(report(&got, "memtouch.errors"), 0);
    assert_eq!(
        report(&got, "memtouch.checksum"),
        report(&want, "memtouch.checksum")
    );
}

/// A guest booted through its PVH entry has started its other vCPUs itself
/// (INIT/SIPI from the MADT): a snapshot holds every vCPU as it runs, and
/// the restored guest finishes on all of them.
#[test]
fn a_pvh_booted_guest_on_two_vcpus_is_restored_whole() {
    if !kvm_for_test("a_pvh_booted_guest_on_two_vcpus_is_restored_whole") {
        return;
    }
    let dir = Scratch::new("pvh-restore");
    let args = [
        "--boot",
        "pvh",
        "--vcpus",
        "2",
        "--cmdline",
        "workload=spin tasks=2 seconds=6",
    ];
    let snap = snapshot_midway(&dir, "pvh", &args, Duration::from_millis(500));
    let o = restore(&snap, "eager");
    assert_eq!(report(&o, "spin.tasks"), 2);
    let cpus: std::collections::BTreeSet<u64> = (0..2)
        .map(|t| report(&o, &format!("spin.cpu.{t}")))
        .collect();
    assert_eq!(cpus.len(), 2, "the tasks ran on both vCPUs: {o}");
}

/// Halt polling and boosting changed while the VM runs are what the VM
/// is from then on: `GET /vm` shows them, and a snapshot saves them (the
/// restored VM runs with them).
#[test]
fn settings_changed_live_are_saved_with_the_vm() {
    if !kvm_for_test("settings_changed_live_are_saved_with_the_vm") {
        return;
    }
    let dir = Scratch::new("live-settings");
    let run = ["run", "--cmdline", "workload=spin tasks=1 seconds=600"];
    let vm = Vm::spawn(&run, &dir.path("vm.sock"));
    let api = vm.api();
    let window = r#"{"mode": "fixed", "window_ns": 50000}"#;
    api.json("PUT", "/vm/halt-poll", Some(window)).unwrap();
    api.json("PUT", "/vm/boost", Some(r#"{"max_ms": 7}"#))
        .unwrap();
    let live = api.json("GET", "/vm", None).unwrap();
    let want: serde_json::Value = serde_json::from_str(window).unwrap();
    assert_eq!(live["config"]["halt_poll"], want, "{live}");
    assert_eq!(live["config"]["boost"]["max_ms"], 7, "{live}");
    let snap = dir.path("vm.snap");
    let body = serde_json::json!({ "path": snap, "stop": true }).to_string();
    api.json("PUT", "/vm/snapshot", Some(&body)).unwrap();
    let (code, outcome, stderr) = vm.wait();
    assert_eq!(
        (code, &outcome["ended"]),
        (Some(0), &"snapshot".into()),
        "{stderr}"
    );
    let restored = Vm::spawn(
        &["restore", snap.to_str().unwrap()],
        &dir.path("again.sock"),
    );
    let v = restored.api().json("GET", "/vm", None).unwrap();
    assert_eq!(v["config"]["halt_poll"], want, "{v}");
    assert_eq!(v["config"]["boost"]["max_ms"], 7, "{v}");
    restored.api().json("PUT", "/vm/shutdown", None).unwrap();
    let (code, _, stderr) = restored.wait();
    assert_eq!(code, Some(0), "{stderr}");
}
