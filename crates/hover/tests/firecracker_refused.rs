//! Every refused and out-of-order request to `hover firecracker` gets a
//! 400 with a `fault_message` that names the problem, and the server stays
//! as it was: still configuring, or the VM still running.

mod common;

use std::path::{Path, PathBuf};

use common::firecracker::{done, guest, refused, req, start_guest, Fc};
use common::Scratch;
use hover_vmm::host::kvm_for_test;

#[test]
fn out_of_order_and_malformed_requests_get_a_reason_and_change_nothing() {
    if !kvm_for_test("out_of_order_and_malformed_requests_get_a_reason_and_change_nothing") {
        return;
    }
    let dir = Scratch::new("fc-order");
    let image = guest(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    refused(
        s,
        "PATCH",
        "/vm",
        r#"{"state": "Paused"}"#,
        "before starting",
    );
    refused(
        s,
        "PUT",
        "/snapshot/create",
        r#"{"snapshot_path": "a", "mem_file_path": "b"}"#,
        "before starting",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "SendCtrlAltDel"}"#,
        "before starting",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        "without kernel configuration",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "FlushMetrics"}"#,
        "not initialized",
    );
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "Reboot"}"#,
        "unknown action_type",
    );
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "bogus": 1}"#,
        "unknown field",
    );
    refused(s, "PUT", "/machine-config", "{not json", "deserializing");
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 0, "mem_size_mib": 64}"#,
        "vcpu_count",
    );
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "smt": true}"#,
        "SMT",
    );
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64, "cpu_template": "T2"}"#,
        "CPU templates",
    );
    refused(
        s,
        "PUT",
        "/boot-source",
        r#"{"kernel_image_path": "/nonexistent/vmlinux"}"#,
        "/nonexistent/vmlinux",
    );
    let notes = dir.path("notes.txt");
    std::fs::write(&notes, "hello").unwrap();
    refused(
        s,
        "PUT",
        "/boot-source",
        &format!(r#"{{"kernel_image_path": "{}"}}"#, notes.display()),
        "neither a Linux kernel",
    );
    let bz = dir.path("bzImage");
    let mut b = vec![0u8; 1024];
    b[0x202..0x206].copy_from_slice(b"HdrS");
    std::fs::write(&bz, b).unwrap();
    refused(
        s,
        "PUT",
        "/boot-source",
        &format!(r#"{{"kernel_image_path": "{}"}}"#, bz.display()),
        "2.12 or later",
    );
    let with_initrd = format!(
        r#"{{"kernel_image_path": "{}", "initrd_path": "{}"}}"#,
        image.display(),
        notes.display()
    );
    refused(s, "PUT", "/boot-source", &with_initrd, "initrd");
    let bad_args = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=nosuch"}}"#,
        image.display()
    );
    refused(s, "PUT", "/boot-source", &bad_args, "boot_args");
    refused(
        s,
        "PUT",
        "/logger",
        r#"{"log_path": "/tmp/x", "level": "Loud"}"#,
        "level",
    );
    // A named pipe nobody reads: the metrics open without waiting.
    let fifo = dir.path("log.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let metrics = format!(r#"{{"metrics_path": "{}"}}"#, fifo.display());
    done(s, "PUT", "/metrics", &metrics);
    refused(s, "PUT", "/metrics", &metrics, "Reinitialization");
    let boot_fifo = format!(r#"{{"kernel_image_path": "{}"}}"#, fifo.display());
    refused(s, "PUT", "/boot-source", &boot_fifo, "not a regular file");
    // Nothing of the refused requests stuck.
    let (_, mc) = req(s, "GET", "/machine-config", "");
    assert!(
        mc.contains(r#""vcpu_count":1"#) && mc.contains(r#""mem_size_mib":128"#),
        "{mc}"
    );
    let (_, config) = req(s, "GET", "/vm/config", "");
    assert!(!config.contains("boot-source"), "{config}");
    // A snapshot load after configuring the machine.
    done(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 2, "mem_size_mib": 64}"#,
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "a", "mem_file_path": "a"}"#,
        "after configuring",
    );
    let boot = format!(
        r#"{{"kernel_image_path": "{}", "boot_args": "workload=spin tasks=2 seconds=120"}}"#,
        image.display()
    );
    done(s, "PUT", "/boot-source", &boot);
    done(s, "PUT", "/actions", r#"{"action_type": "InstanceStart"}"#);
    // After the start.
    refused(
        s,
        "PUT",
        "/actions",
        r#"{"action_type": "InstanceStart"}"#,
        "already running",
    );
    refused(s, "PUT", "/boot-source", &boot, "after starting");
    refused(
        s,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
        "after starting",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "a", "mem_file_path": "a"}"#,
        "after starting",
    );
    refused(
        s,
        "PUT",
        "/logger",
        r#"{"log_path": "/tmp/x"}"#,
        "after starting",
    );
    refused(
        s,
        "PATCH",
        "/vm",
        r#"{"state": "Frozen"}"#,
        "Paused or Resumed",
    );
    refused(
        s,
        "PATCH",
        "/vm",
        r#"{"state": "Paused", "extra": 1}"#,
        "unknown field",
    );
    let create = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        dir.path("s").display(),
        dir.path("m").display()
    );
    refused(s, "PUT", "/snapshot/create", &create, "pause it first");
    done(s, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    let diff = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}", "snapshot_type": "Diff"}}"#,
        dir.path("s").display(),
        dir.path("m").display()
    );
    refused(s, "PUT", "/snapshot/create", &diff, "full snapshots only");
    let with = |extra: &str, mem: &str| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{mem}"{extra}}}"#,
            dir.path("s").display()
        )
    };
    let m = dir.path("m").display().to_string();
    let half = with(r#", "snapshot_type": "Half""#, &m);
    refused(s, "PUT", "/snapshot/create", &half, "unknown snapshot_type");
    let old = with(r#", "version": "0.25.0""#, &m);
    refused(
        s,
        "PUT",
        "/snapshot/create",
        &old,
        "its own snapshot format",
    );
    // /dev/shm is another filesystem than the scratch directory.
    let shm = format!("/dev/shm/hover-fc-mem-{}", std::process::id());
    refused(
        s,
        "PUT",
        "/snapshot/create",
        &with("", &shm),
        "one filesystem",
    );
    assert!(!Path::new(&shm).exists() && !dir.path("s").exists());
    refused(
        s,
        "PUT",
        "/metrics",
        r#"{"metrics_path": "/tmp/m"}"#,
        "after starting",
    );
    let existing = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        dir.path("s").display(),
        notes.display()
    );
    refused(s, "PUT", "/snapshot/create", &existing, "already exists");
    assert!(!dir.path("s").exists(), "a refused snapshot left its file");
    // The VM still runs after all of it.
    done(s, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    let (_, info) = req(s, "GET", "/", "");
    assert!(info.contains(r#""state":"Running""#), "{info}");
    done(s, "PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#);
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn a_snapshot_load_of_files_that_are_not_hovers_is_refused() {
    if !kvm_for_test("a_snapshot_load_of_files_that_are_not_hovers_is_refused") {
        return;
    }
    let dir = Scratch::new("fc-load");
    let fc = Fc::spawn(&dir, &[]);
    let s = &fc.sock;
    let junk = dir.path("junk");
    std::fs::write(&junk, vec![0x5a; 8192]).unwrap();
    let load = |snap: &Path, mem: &Path| {
        format!(
            r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
            snap.display(),
            mem.display()
        )
    };
    refused(
        s,
        "PUT",
        "/snapshot/load",
        &load(&junk, &junk),
        "not a Hover snapshot",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        &load(&junk, &dir.path("missing")),
        "mem_file_path",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "x", "mem_backend": {"backend_type": "Uffd", "backend_path": "y"}}"#,
        "Uffd",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "x", "mem_file_path": "x", "enable_diff_snapshots": true}"#,
        "full snapshots only",
    );
    refused(
        s,
        "PUT",
        "/snapshot/load",
        r#"{"snapshot_path": "x"}"#,
        "mem_file_path",
    );
    let both = r#"{"snapshot_path": "x", "mem_file_path": "x", "mem_backend": {"backend_type": "File", "backend_path": "x"}}"#;
    refused(s, "PUT", "/snapshot/load", both, "not both");
    let tape =
        r#"{"snapshot_path": "x", "mem_backend": {"backend_type": "Tape", "backend_path": "x"}}"#;
    refused(s, "PUT", "/snapshot/load", tape, "unknown backend_type");
    let (_, info) = req(s, "GET", "/", "");
    assert!(info.contains("Not started"), "{info}");
    // A real snapshot, with another file as its memory, then with a copy.
    let src = Scratch::new("fc-load-src");
    let snap = snapshot_of_a_running_vm(&src);
    refused(
        s,
        "PUT",
        "/snapshot/load",
        &load(&snap, &junk),
        "not the memory of snapshot",
    );
    let copy = dir.path("copy.mem");
    std::fs::copy(&snap, &copy).unwrap();
    done(s, "PUT", "/snapshot/load", &load(&snap, &copy));
    let (_, info) = req(s, "GET", "/", "");
    assert!(
        info.contains(r#""state":"Paused""#),
        "loaded without resume_vm: {info}"
    );
    let (_, mc) = req(s, "GET", "/machine-config", "");
    assert!(
        mc.contains(r#""vcpu_count":2"#) && mc.contains(r#""mem_size_mib":64"#),
        "the snapshot's machine: {mc}"
    );
    done(s, "PATCH", "/vm", r#"{"state": "Resumed"}"#);
    let (code, stdout, stderr) = fc.wait();
    assert_eq!(
        code,
        Some(0),
        "the restored guest runs to its end: {stderr}"
    );
    assert!(stdout.contains("restored from"), "{stdout}");
}

/// A snapshot (both names one file) of a VM `hover firecracker` runs.
fn snapshot_of_a_running_vm(dir: &Scratch) -> PathBuf {
    let image = guest(dir);
    let fc = Fc::spawn(dir, &[]);
    let s = &fc.sock;
    start_guest(s, &image, "workload=kvstore wss=4M rate=1000 seconds=6");
    done(s, "PATCH", "/vm", r#"{"state": "Paused"}"#);
    let snap = dir.path("vm.snap");
    let create = format!(
        r#"{{"snapshot_path": "{0}", "mem_file_path": "{0}"}}"#,
        snap.display()
    );
    done(s, "PUT", "/snapshot/create", &create);
    done(s, "PUT", "/actions", r#"{"action_type": "SendCtrlAltDel"}"#);
    let (code, _, stderr) = fc.wait();
    assert_eq!(code, Some(0), "{stderr}");
    snap
}
