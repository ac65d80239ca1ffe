//! `hover firecracker` answers Firecracker's API as docs/FIRECRACKER.md
//! says: every endpoint of its tables against the live server, the
//! command line (and its refusals), the binary invoked as `firecracker`,
//! and Hover's own endpoints on the same socket (refused and out-of-order
//! requests: firecracker_refused.rs).

mod common;

use common::firecracker::{done, guest, refused, req, start_guest, Fc};
use common::{hover, text, Scratch};
use hover_vmm::firecracker::{DEVICES, ENDPOINTS};
use hover_vmm::host::kvm_for_test;

/// The `| \`METHOD /path\` |` rows of a table in docs/FIRECRACKER.md
/// under `heading`.
fn doc_rows(heading: &str) -> Vec<String> {
    let doc = include_str!("../../../docs/FIRECRACKER.md");
    let section = doc.split(heading).nth(1).expect("heading");
    let table = section.split("\n\n").find(|p| p.starts_with('|')).unwrap();
    table
        .lines()
        .skip(2)
        .filter_map(|l| l.split('`').nth(1).map(String::from))
        .collect()
}

#[test]
fn the_docs_list_exactly_the_endpoints_the_server_answers() {
    let documented: Vec<String> = doc_rows("## Endpoints");
    let served: Vec<String> = ENDPOINTS.iter().map(|(m, p)| format!("{m} {p}")).collect();
    for e in &served {
        assert!(
            documented.contains(e),
            "{e} is answered but not in docs/FIRECRACKER.md"
        );
    }
    for e in &documented {
        assert!(served.contains(e), "{e} is documented but not answered");
    }
    let refused = doc_rows("### Refused");
    for (path, _) in DEVICES {
        assert!(
            refused.iter().any(|r| r.starts_with(path)),
            "{path} is refused but not documented"
        );
    }
}

#[test]
fn every_documented_endpoint_answers_on_the_live_server() {
    if !kvm_for_test("every_documented_endpoint_answers_on_the_live_server") {
        return;
    }
    let dir = Scratch::new("fc-walk");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    // Before the start: queries answer 200, and each device is refused.
    for (m, p) in ENDPOINTS.iter().filter(|(m, _)| *m == "GET") {
        let (status, body) = req(s, m, p, "");
        // This microVM has no balloon (Hover's own guest has no drivers).
        let want = if p.starts_with("/balloon") { 400 } else { 200 };
        assert_eq!(status, want, "{m} {p}: {body}");
    }
    for (path, _) in DEVICES {
        for method in ["GET", "PUT", "PATCH"] {
            refused(s, method, &format!("{path}/x"), "{}", "Hover has no");
            refused(s, method, path, "{}", "Hover has no");
        }
    }
    refused(s, "GET", "/vm", "", "once the microVM runs");
    done(
        s,
        "PUT",
        "/logger",
        &format!(
            r#"{{"log_path": "{}", "level": "Info"}}"#,
            dir.path("log").display()
        ),
    );
    done(
        s,
        "PUT",
        "/metrics",
        &format!(r#"{{"metrics_path": "{}"}}"#, dir.path("metrics").display()),
    );
    done(s, "PATCH", "/machine-config", r#"{"mem_size_mib": 64}"#);
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=spin tasks=2 seconds=120"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    // Running: the rest, and Hover's own endpoints on the same socket.
    let (status, info) = req(s, "GET", "/", "");
    assert_eq!(status, 200);
    assert!(info.contains(r#""state":"Running""#), "{info}");
    let (status, vm) = req(s, "GET", "/vm", "");
    assert_eq!(status, 200, "{vm}");
    done(s, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    let snap = dir.path("vm.snap");
    let mem = dir.path("vm.mem");
    let create = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "snapshot_type": "Full"}}"#,
        snap.display(),
        mem.display()
    );
    done(s, "PUT", "/snapshot/create", &create);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&snap).unwrap().ino(),
        std::fs::metadata(&mem).unwrap().ino(),
        "the memory file is the snapshot's second name"
    );
    done(s, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    done(s, "PUT", "/actions", r#"{"action_type": "FlushMetrics"}"#);
    let (status, config) = req(s, "GET", "/vm/config", "");
    assert_eq!(status, 200);
    assert!(config.contains("spin"), "{config}");
    done(s, "PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#);
    let (code, stdout, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("shut down"), "{stdout}");
    let metrics = std::fs::read_to_string(dir.path("metrics")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        2,
        "one on FlushMetrics, one at the end: {metrics}"
    );
    assert_eq!(lines[0]["state"], "running", "{metrics}");
    assert_eq!(
        lines[1]["state"], "exited",
        "the last line is the ended VM's: {metrics}"
    );
    for l in &lines {
        assert!(l["utc_timestamp_ms"].as_u64().unwrap() > 0);
        assert!(l["vcpu"]["exits"].as_u64().unwrap() > 0, "{l}");
        assert!(l["hover"]["uptime_ms"].is_u64(), "{l}");
    }
    assert!(!dir.path("fc.sock").exists());
}

#[test]
fn sigterm_before_a_start_removes_the_socket() {
    let dir = Scratch::new("fc-sigterm");
    let fc = Fc::spawn(&dir, &[]);
    // SAFETY: kill(2) with a child's pid.
    unsafe { libc::kill(fc.child.as_ref().unwrap().id() as i32, libc::SIGTERM) };
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(143), "{stderr}");
    assert!(!dir.path("fc.sock").exists());
}

#[test]
fn a_guest_that_ends_at_once_still_gets_its_start_answered() {
    if !kvm_for_test("a_guest_that_ends_at_once_still_gets_its_start_answered") {
        return;
    }
    let dir = Scratch::new("fc-short");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=hello"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    // The guest may power off before the answer goes out: it ran, so 204.
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn the_command_line_is_firecrackers_and_never_claims_to_be_it() {
    let dir = Scratch::new("fc-cli");
    let link = dir.path("firecracker");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hover"), &link).unwrap();
    let out = std::process::Command::new(&link)
        .arg("--version")
        .output()
        .unwrap();
    let v = text(&out.stdout);
    assert!(out.status.success());
    assert!(
        v.starts_with("Hover ") && v.contains("not Firecracker"),
        "{v}"
    );
    let out = hover(&[
        "firecracker",
        "--seccomp-filter",
        "/x.bpf",
        "--api-sock",
        "/tmp/none",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--no-seccomp"));
    let out = hover(&["firecracker", "--no-api"]);
    assert_eq!(out.status.code(), Some(2), "--no-api needs --config-file");
    let cfg = dir.path("vm.json");
    std::fs::write(
        &cfg,
        r#"{"boot-source": {"kernel_image_path": "x"}, "vsock": {"guest_cid": 3, "uds_path": "/tmp/v"}}"#,
    )
    .unwrap();
    let out = hover(&[
        "firecracker",
        "--no-api",
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("vsock"), "{}", text(&out.stderr));
    // Drives go to a Linux guest only.
    let image = common::firecracker::guest(&dir);
    let disk = dir.path("disk.img");
    std::fs::write(&disk, [0u8; 4096]).unwrap();
    std::fs::write(
        &cfg,
        format!(
            r#"{{"boot-source": {{"kernel_image_path": "{}"}}, "drives": [{{"drive_id": "rootfs", "path_on_host": "{}", "is_root_device": true}}]}}"#,
            image.display(),
            disk.display()
        ),
    )
    .unwrap();
    let out = hover(&[
        "firecracker",
        "--no-api",
        "--config-file",
        cfg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("need a Linux guest"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_config_file_boots_the_guest_without_an_api() {
    if !kvm_for_test("a_config_file_boots_the_guest_without_an_api") {
        return;
    }
    let dir = Scratch::new("fc-config");
    let image = guest(&dir);
    let cfg = dir.path("vm.json");
    let json = format!(
        r#"{{"boot-source": {{"kernel_image_path": "{}", "boot_args": "workload=memtouch size=8M tasks=2"}},
            "machine-config": {{"vcpu_count": 2, "mem_size_mib": 64}}}}"#,
        image.display()
    );
    std::fs::write(&cfg, json).unwrap();
    let out = hover(&[
        "firecracker",
        "--no-api",
        "--config-file",
        cfg.to_str().unwrap(),
        "--console",
        "off",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(o["ended"], "power_off");
}

#[test]
fn a_vm_a_firecracker_client_started_migrates_with_hover_ctl() {
    if !kvm_for_test("a_vm_a_firecracker_client_started_migrates_with_hover_ctl") {
        return;
    }
    let dir = Scratch::new("fc-migrate");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &["--json"]);
    let s = &fc.sock;
    start_guest(s, &image, "workload=kvstore wss=4M rate=1000 seconds=10");
    let listen = format!("unix:{}", dir.path("in.sock").display());
    let (rx, at) = common::migrate::receiver(&listen);
    let out = hover(&[
        "ctl",
        "--api-socket",
        s.to_str().unwrap(),
        "migrate",
        "--to",
        &at,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, stdout, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let o: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(o["ended"], "migrated", "{o}");
    let (code, o, stderr) = common::migrate::finish(rx);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        o["ended"], "power_off",
        "the guest ran on to its verified end: {o}"
    );
}

#[test]
fn drives_interfaces_and_entropy_are_checked_kept_and_shown_before_the_start() {
    if !kvm_for_test("drives_interfaces_and_entropy_are_checked_kept_and_shown_before_the_start") {
        return;
    }
    let dir = Scratch::new("fc-devices");
    let image = guest(&dir);
    let disk = dir.path("root.img");
    std::fs::write(&disk, [0u8; 8192]).unwrap();
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    let drive = |id: &str, path: &std::path::Path, root: bool| {
        format!(
            r#"{{"drive_id": "{id}", "path_on_host": "{}", "is_root_device": {root}, "is_read_only": false}}"#,
            path.display()
        )
    };
    done(s, "PUT", "/drives/rootfs", &drive("rootfs", &disk, true));
    refused(
        s,
        "PUT",
        "/drives/data",
        &drive("other", &disk, false),
        "does not match",
    );
    refused(
        s,
        "PUT",
        "/drives/data",
        &drive("data", std::path::Path::new("/nonexistent.img"), false),
        "path_on_host",
    );
    refused(
        s,
        "PUT",
        "/drives/second",
        &drive("second", &disk, true),
        "root block device already exists",
    );
    refused(
        s,
        "PUT",
        "/network-interfaces/eth0",
        r#"{"iface_id": "eth0", "host_dev_name": "hvnosuchtap5"}"#,
        "no such network device",
    );
    refused(
        s,
        "PUT",
        "/entropy",
        r#"{"rate_limiter": {"bandwidth": {"size": 1, "refill_time": 100}}}"#,
        "rate limiters",
    );
    done(s, "PUT", "/entropy", "{}");
    refused(
        s,
        "PATCH",
        "/drives/rootfs",
        r#"{"drive_id": "rootfs"}"#,
        "PUT it again",
    );
    let (status, config) = req(s, "GET", "/vm/config", "");
    assert_eq!(status, 200, "{config}");
    let v: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(v["drives"][0]["drive_id"], "rootfs", "{config}");
    assert_eq!(v["drives"].as_array().unwrap().len(), 1, "{config}");
    assert!(v["entropy"].is_object(), "{config}");
    // Hover's own guest has no virtio drivers: the start is refused, and
    // the server goes on configuring.
    done(
        s,
        "PUT",
        "/boot-source",
        &format!(r#"{{"kernel_image_path": "{}"}}"#, image.display()),
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        "need a Linux guest",
    );
    let (status, _) = req(s, "GET", "/", "");
    assert_eq!(status, 200);
}

/// Firecracker's balloon before the start: `PUT /balloon` is kept and
/// shown (`GET /balloon`, `GET /vm/config`), `PATCH /balloon` and `PATCH
/// /balloon/statistics` change it, a target over the machine's memory and
/// free page hinting are refused, statistics wait for the start, and
/// starting Hover's own guest (no virtio drivers) with one is refused, the
/// server still configuring. The running balloon is the lab's
/// (`scripts/lab/linux-balloon.sh`: inflate, deflate, reports).
#[test]
fn a_balloon_is_configured_checked_and_shown_before_the_start() {
    if !kvm_for_test("a_balloon_is_configured_checked_and_shown_before_the_start") {
        return;
    }
    let dir = Scratch::new("fc-balloon");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    refused(s, "GET", "/balloon", "", "no balloon");
    refused(
        s,
        "PATCH",
        "/balloon",
        r#"{"amount_mib": 8}"#,
        "PUT /balloon first",
    );
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
    );
    refused(
        s,
        "PUT",
        "/balloon",
        r#"{"amount_mib": 128, "deflate_on_oom": false}"#,
        "more than the microVM's 64 MiB",
    );
    refused(
        s,
        "PUT",
        "/balloon",
        r#"{"amount_mib": 8, "deflate_on_oom": false, "free_page_hinting": true}"#,
        "free_page_reporting",
    );
    done(
        s,
        "PUT",
        "/balloon",
        r#"{"amount_mib": 8, "deflate_on_oom": true, "free_page_reporting": true}"#,
    );
    done(s, "PATCH", "/balloon", r#"{"amount_mib": 16}"#);
    done(
        s,
        "PATCH",
        "/balloon/statistics",
        r#"{"stats_polling_interval_s": 2}"#,
    );
    let (status, b) = req(s, "GET", "/balloon", "");
    assert_eq!(status, 200, "{b}");
    let b: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(b["amount_mib"], 16);
    assert_eq!(b["deflate_on_oom"], true);
    assert_eq!(b["free_page_reporting"], true);
    assert_eq!(b["stats_polling_interval_s"], 2);
    let (_, config) = req(s, "GET", "/vm/config", "");
    assert!(config.contains(r#""amount_mib":16"#), "{config}");
    refused(s, "GET", "/balloon/statistics", "", "once the microVM runs");
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=hello"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        "balloons need a Linux guest",
    );
    let (status, _) = req(s, "GET", "/balloon", "");
    assert_eq!(status, 200, "still configuring, the balloon kept");
}
