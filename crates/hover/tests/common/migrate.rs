//! Helpers for the migration tests: a `hover receive` child, its end, and a
//! migration request the VM must refuse.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

use super::{hover, hover_cmd, text, Scratch, Vm};

/// `hover receive --listen ADDR --json --console off`, and the address it listens on.
pub fn receiver(listen: &str) -> (Child, String) {
    receiver_with(listen, &[])
}

/// [`receiver`] with more arguments (e.g. `--api-socket PATH`).
pub fn receiver_with(listen: &str, extra: &[&str]) -> (Child, String) {
    // A test that fails before its migration leaves no receiver waiting
    // for ever (the Child is not killed when dropped).
    let bounded: &[&str] = if extra.contains(&"--timeout") {
        &[]
    } else {
        &["--timeout", "5m"]
    };
    let mut child = hover_cmd()
        .args(["receive", "--listen", listen, "--json", "--console", "off"])
        .args(bounded)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let at = line
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    (child, at)
}

pub fn finish(child: Child) -> (Option<i32>, serde_json::Value, String) {
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), v, text(&out.stderr))
}

/// End a receiver started with `--api-socket socket` whose guest now runs
/// there (`PUT /vm/shutdown`), and its outcome, checked to say so. Tests
/// whose guest would outlast them end it here rather than racing a
/// workload's deadline against a loaded host.
#[allow(dead_code)] // not every test file uses every helper
pub fn shut_down_receiver(child: Child, socket: &std::path::Path) -> serde_json::Value {
    // The receiver publishes its API once the guest runs there, which can
    // be a moment after the source has heard that it does.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !socket.exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Vm {
        child: Some(child),
        socket: socket.into(),
    }
    .shut_down()
}

/// `PUT /vm/migrate` with `body` must be refused with 400, the answer
/// naming every `needle`; then the VM runs to its end and exits 0.
pub fn refused_request(vm: Vm, body: &str, needles: &[&str]) {
    let r = vm.api().call("PUT", "/vm/migrate", Some(body)).unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    for n in needles {
        assert!(r.body.contains(n), "{n} in {}", r.body);
    }
    // The VM ran on; the test ends it.
    vm.shut_down();
}

/// A kvstore guest writing at a rate a loaded host can migrate (at full
/// speed it dirties all 16 MiB faster than a busy host sends it, and the
/// migration rightly does not converge).
pub fn kvstore(dir: &Scratch, name: &str) -> Vm {
    Vm::spawn(
        &[
            "run",
            "--cmdline",
            "workload=kvstore wss=16M rate=1000 seconds=5",
        ],
        &dir.path(&format!("{name}.sock")),
    )
}

/// The parts of `downtime_breakdown` add up to within 10% of `downtime_ms`.
#[allow(dead_code)] // not every test file uses every helper
pub fn assert_breakdown_adds_up(r: &serde_json::Value) {
    let b = &r["downtime_breakdown"];
    let parts = [
        "pause_us",
        "final_harvest_us",
        "final_pages_us",
        "state_us",
        "verify_us",
        "destination_load_us",
        "ack_us",
    ];
    let sum: u64 = parts
        .iter()
        .map(|k| b[k].as_u64().unwrap_or_else(|| panic!("{k} in {b}")))
        .sum();
    let downtime_us = r["downtime_ms"].as_f64().unwrap() * 1e3;
    assert!(
        (sum as f64 - downtime_us).abs() <= downtime_us * 0.1,
        "parts add up to {sum} us, downtime {downtime_us} us: {b}"
    );
    assert!(b["destination_load_us"].as_u64().unwrap() > 0, "{b}");
    // Checked against a second clock: the gap the guest saw (its TSC from
    // just after the source's pause began to the destination's RUNNING
    // stamp) ends before the source hears RUNNING. (The TSC and the
    // monotonic clock may differ in rate by NTP's slew, 500 ppm at most.)
    let seen_us = r["guest_downtime_ms"].as_f64().unwrap() * 1e3;
    assert!(
        seen_us <= downtime_us * 1.001 + 50.0,
        "the guest saw {seen_us} us, longer than the source's pause {downtime_us} us: {r}"
    );
}

/// A new migration key file made by `hover migration-key`.
#[allow(dead_code)] // not every test file uses every helper
pub fn new_key(dir: &Scratch, name: &str) -> std::path::PathBuf {
    let p = dir.path(name);
    let out = hover(&["migration-key", p.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    p
}
