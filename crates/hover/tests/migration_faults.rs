//! Fault injection into live migrations: a proxy between source and
//! destination cuts the connection or flips a byte at a pseudo-random point
//! of the source's stream. Every time the source keeps running its guest,
//! the destination refuses
//! without ever running anything, and a clean migration afterwards still
//! moves the guest with its memory digest checked. `HOVER_FAULT_TRIALS`
//! sets the number of faulty migrations (default 6; scripts/migration-faults.sh
//! runs 100 and writes the tally for docs/RELIABILITY.md).

mod common;

use std::time::{Duration, Instant};

use common::migrate::{finish, receiver, receiver_with, shut_down_receiver};
use common::proxy::{Fault, Proxy};
use common::{Scratch, Vm};
use hover_vmm::host::kvm_for_test;

/// A small deterministic generator (no RNG crate needed for a spread).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn faults_anywhere_in_the_stream_leave_the_source_running() {
    if !kvm_for_test("faults_anywhere_in_the_stream_leave_the_source_running") {
        return;
    }
    let trials: u64 = std::env::var("HOVER_FAULT_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let dir = Scratch::new("migrate-faults");
    // Outlasts every trial however slow the host; the destination of the
    // last, clean migration ends it.
    let src = Vm::spawn(
        &[
            "run",
            "--cmdline",
            "workload=kvstore wss=8M rate=1000 seconds=3600",
        ],
        &dir.path("src.sock"),
    );
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let mut rng = Lcg(0x5eed);
    let (mut cuts, mut flips) = (0, 0);
    // Early offsets hit the hello, CONF and the first headers; later ones
    // pages (the guest's first round alone is several MiB).
    let stream_len: u64 = 2 << 20;
    for trial in 0..trials {
        let listen = dir.path(&format!("in{trial}.sock"));
        let (dest, _) = receiver(&format!("unix:{}", listen.display()));
        let offset = match trial % 3 {
            0 => rng.next() % 4096,
            _ => rng.next() % stream_len,
        };
        let fault = if rng.next().is_multiple_of(2) {
            cuts += 1;
            Fault::CutAt(offset)
        } else {
            flips += 1;
            Fault::FlipAt(offset)
        };
        let via = dir.path(&format!("proxy{trial}.sock"));
        let _proxy = Proxy::with_fault(&via, &listen, fault);
        let body = serde_json::json!({
            "to": format!("unix:{}", via.display()), "verify": true, "timeout_s": 5,
        });
        let r = src
            .api()
            .call("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap();
        let v = src.api().json("GET", "/vm", None).unwrap();
        assert_eq!(
            v["state"], "running",
            "trial {trial} {fault:?}: {} / {v}",
            r.body
        );
        let (code, o, stderr) = finish(dest);
        assert_ne!(
            r.status, 200,
            "trial {trial} {fault:?}: migrated through a fault: {stderr}"
        );
        assert!(r.status >= 500, "trial {trial} {fault:?}: {}", r.body);
        assert_ne!(
            code,
            Some(0),
            "trial {trial} {fault:?}: the destination ran: {stderr}"
        );
        assert!(
            o.is_null(),
            "trial {trial} {fault:?}: nothing may run there: {o}"
        );
    }
    eprintln!(
        "{trials} faulty migrations ({cuts} cuts, {flips} flipped bytes) in {:?}: the source ran on every time",
        t0.elapsed()
    );
    // And a clean one still moves the guest, memory checked.
    let dest_api = dir.path("last-api.sock");
    let (dest, at) = receiver_with(
        &format!("unix:{}", dir.path("last.sock").display()),
        &["--api-socket", dest_api.to_str().unwrap()],
    );
    let body = serde_json::json!({ "to": at, "verify": true });
    let r = src
        .api()
        .json("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    assert!(r["pages_sent"].as_u64().unwrap() > 0, "{r}");
    // With `verify` the destination runs the guest only if its memory
    // hashes as the source's: a migration that ended here passed that check.
    let (code, o, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["ended"], "migrated", "{o}");
    shut_down_receiver(dest, &dest_api);
}
