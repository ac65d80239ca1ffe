//! Files Hover reads as input are read once, with a bound, through the
//! descriptor it checked (docs/RELIABILITY.md): `/dev/zero`, a 1 GiB
//! sparse file, a named pipe and a file of procfs are refused with a
//! reason, as guest images, kernels, initrds, configuration files, migration
//! keys and snapshot paths, on the command line and through the
//! Firecracker API, without reading them (a hang would be the test
//! binary's watchdog's to report).

mod common;

use std::path::{Path, PathBuf};

use common::firecracker::{refused, Fc};
use common::{hover, text, Scratch};

/// A 1 GiB file with no data in it, a named pipe, and a text file.
fn awkward_files(dir: &Scratch) -> (PathBuf, PathBuf) {
    let sparse = dir.path("sparse.img");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let fifo = dir.path("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    (sparse, fifo)
}

fn refused_with(args: &[&str], want: &str) {
    let out = hover(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: wanted {want:?} in {err}");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn guest_images_kernels_and_initrds_that_cannot_be_read_whole_are_refused() {
    let dir = Scratch::new("inputs-cli");
    let (sparse, fifo) = awkward_files(&dir);
    let run = |extra: &[&str], want: &str| {
        let mut a = vec!["run", "--console", "off"];
        a.extend_from_slice(extra);
        refused_with(&a, want);
    };
    run(&["--guest", "/dev/zero"], "not a regular file");
    run(&["--guest", s(&fifo)], "not a regular file");
    run(&["--guest", s(&sparse)], "larger than");
    run(&["--guest", "/proc/self/status"], "procfs");
    run(&["--kernel", s(&fifo)], "not a regular file");
    run(&["--kernel", s(&sparse)], "larger than");
    refused_with(
        &["firecracker", "--no-api", "--config-file", "/dev/zero"],
        "not a regular file",
    );
    refused_with(
        &["firecracker", "--no-api", "--config-file", s(&fifo)],
        "not a regular file",
    );
    refused_with(
        &[
            "run",
            "--migration-key",
            "/proc/self/environ",
            "--console",
            "off",
        ],
        "procfs",
    );
}

#[test]
fn the_firecracker_api_refuses_such_files_and_keeps_answering() {
    let dir = Scratch::new("inputs-fc");
    let (sparse, fifo) = awkward_files(&dir);
    let fc = Fc::spawn(&dir, &[]);
    let boot = |kernel: &Path| format!(r#"{{"kernel_image_path": "{}"}}"#, kernel.display());
    refused(
        &fc.sock,
        "PUT",
        "/boot-source",
        &boot(&fifo),
        "not a regular file",
    );
    refused(
        &fc.sock,
        "PUT",
        "/boot-source",
        &boot(Path::new("/dev/zero")),
        "not a regular file",
    );
    refused(
        &fc.sock,
        "PUT",
        "/boot-source",
        &boot(&sparse),
        "neither a Linux kernel",
    );
    let load = format!(
        r#"{{"snapshot_path": "{}", "mem_file_path": "{}"}}"#,
        fifo.display(),
        fifo.display()
    );
    refused(
        &fc.sock,
        "PUT",
        "/snapshot/load",
        &load,
        "not a regular file",
    );
    // Still answering.
    let (status, _) = common::firecracker::req(&fc.sock, "GET", "/", "");
    assert_eq!(status, 200);
}

/// `hover bench` checks its flags before it starts anything: a bad value
/// ends it with one line naming the flag, exit 2, and no VM is booted
/// (none of these needs KVM).
#[test]
fn bench_flags_are_checked_before_anything_runs() {
    for (args, says) in [
        (
            &["bench", "snapshot", "--memories", "256"][..],
            "--memories: 256 is not a whole number of 4 KiB pages",
        ),
        (
            &["bench", "migrate", "--memories", "64M,1T"][..],
            "--memories: 1T is more than",
        ),
        (
            &[
                "bench",
                "migrate",
                "--mode",
                "postcopy",
                "--postcopy-memory",
                "1000",
            ][..],
            "--postcopy-memory: 1000 is not a whole number",
        ),
        (
            &["bench", "boost", "--intervals", "5"][..],
            "--intervals: 5 us is out of range",
        ),
        (
            &["bench", "dirty-log", "--memory", "1000"][..],
            "--memory: 1000 is not a whole number",
        ),
        (
            &["bench", "snapshot", "--working-set", "lots"][..],
            "--working-set: 'lots' is not a size",
        ),
        (
            &["bench", "migrate", "--peer", "qemu", "--wss", "16Q"][..],
            "--wss: '16Q' is not a size",
        ),
        (
            &[
                "bench",
                "migrate",
                "--mode",
                "postcopy",
                "--transport",
                "tcp",
            ][..],
            "--transport applies to --mode precopy",
        ),
        (
            &["bench", "migrate", "--link-mbit", "5"][..],
            "--link-mbit applies to --mode postcopy only",
        ),
        (
            &[
                "bench",
                "halt-poll",
                "--devices",
                "fast",
                "--io-dir",
                "/var/tmp",
            ][..],
            "--io-dir is the slow device's",
        ),
        (
            &["bench", "boost", "--tests", "timer", "--buffers", "4"][..],
            "--buffers applies to the audio test",
        ),
        (
            &["bench", "boost", "--keep-us", "5000"][..],
            "--keep-us applies to the keep and keep-contended variants",
        ),
        (
            &[
                "bench",
                "dirty-log",
                "--trackers",
                "bitmap",
                "--ring-entries",
                "1024",
            ][..],
            "--ring-entries applies to the ring tracker",
        ),
        (
            &["bench", "migrate", "--rate", "99999999999"][..],
            "--rate: bad guest command line: rate=99999999999 is out of range",
        ),
        (
            &["bench", "dirty-log", "--trackers", "none"][..],
            "--trackers: give at least one tracker besides none",
        ),
        (
            &["bench", "dirty-log", "--period-ms", "10s"][..],
            "--period-ms 10000 is not shorter than --seconds 2",
        ),
        (
            &["bench", "migrate", "--batches", "1,0"][..],
            "--batches: 0 pages is out of range: give 1 to 4096",
        ),
        (
            &["bench", "migrate", "--wss", "2G", "--memories", "256M"][..],
            "--wss 2G does not fit in --memories 256M",
        ),
        (
            &["bench", "dirty-log", "--wss", "2G"][..],
            "--wss 2G does not fit in --memory 1G",
        ),
        (
            &["bench", "dirty-log", "--period-ms", "0"][..],
            "--period-ms 0: give 1 to 10000",
        ),
        (
            &["bench", "migrate", "--mode", "postcopy", "--link-mbit", "0"][..],
            "--link-mbit 0: give 1 to 100000",
        ),
        (
            &[
                "bench",
                "migrate",
                "--mode",
                "postcopy",
                "--postcopy-seconds",
                "5",
            ][..],
            "--postcopy-seconds 5: give 14 to 3600",
        ),
        (
            &["bench", "snapshot", "--dir", "/nonexistent/hover"][..],
            "--dir /nonexistent/hover: does not exist",
        ),
        (
            &["bench", "snapshot", "--working-set", "0"][..],
            "--working-set: a working set of 0 bytes",
        ),
        (
            &["bench", "halt-poll", "--io-dir", "/proc/self/status"][..],
            "--io-dir /proc/self/status: not a directory",
        ),
        (
            &["bench", "apf", "--out", "/proc/self/status"][..],
            "--out /proc/self/status: not a directory",
        ),
    ] {
        let out = common::hover(args);
        let stderr = common::text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        // Refused up front: one line, not a child's failure.
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
    }
}

/// Values clap itself refuses (a range, a duration, a flag that does not
/// go with another): exit 2, naming the flag, before anything starts.
#[test]
fn bench_values_out_of_their_range_are_refused_by_the_parser() {
    for (args, says) in [
        (
            &["bench", "apf", "--latencies", "0,2x"][..],
            "'2x' is not a duration",
        ),
        (&["bench", "apf", "--runs", "0"][..], "--runs <RUNS>"),
        (
            &["bench", "dirty-log", "--seconds", "0"][..],
            "--seconds <SECONDS>",
        ),
        (
            &["bench", "boost", "--intervals", "1500ns"][..],
            "not a whole number of microseconds",
        ),
        (&["bench", "boot", "--vcpus", "0"][..], "--vcpus <VCPUS>"),
        (&["bench", "runtime", "--runs", "0"][..], "--runs <RUNS>"),
        (
            &["bench", "halt-poll", "--seconds", "0"][..],
            "--seconds <SECONDS>",
        ),
        (
            &["bench", "boost", "--uart-count", "0"][..],
            "--uart-count <UART_COUNT>",
        ),
        (
            &["bench", "apf", "--adaptive-min-us", "99999999999"][..],
            "--adaptive-min-us <ADAPTIVE_MIN_US>",
        ),
        (
            &["bench", "migrate", "--peer", "qemu", "--trackers", "hybrid"][..],
            "cannot be used with '--trackers <TRACKERS>'",
        ),
    ] {
        let out = common::hover(args);
        let stderr = common::text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let first = stderr.lines().next().unwrap_or_default();
        assert!(first.contains(says), "{args:?}: {stderr}");
    }
}
