//! Live migration between two `hover` processes on this machine: a running
//! `kvstore` guest moves over a Unix socket and over TCP and finishes there
//! with its own verification passing (and the memory digest checked before
//! it runs); failures (no destination, a refusal, a stalled or vanishing
//! peer) leave the source running; bad streams are refused by the receiver.

mod common;

use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use common::migrate::{
    assert_breakdown_adds_up, finish, kvstore, receiver, receiver_with, refused_request,
};
use common::proxy::{Fault, Proxy};
use common::{report, Scratch, Vm};
use hover_vmm::host::kvm_for_test;
use hover_vmm::migration::wire::{FrameReader, FrameWriter, Kind};

#[test]
fn kvstore_migrates_over_unix_and_tcp_with_each_tracker() {
    if !kvm_for_test("kvstore_migrates_over_unix_and_tcp_with_each_tracker") {
        return;
    }
    let dir = Scratch::new("migrate");
    let unix = format!("unix:{}", dir.path("in.sock").display());
    let cases = [
        (unix.as_str(), "bitmap"),
        ("tcp:127.0.0.1:0", "manual"),
        (unix.as_str(), "hybrid"),
    ];
    for (listen, tracker) in cases {
        // TCP without a key (tests/migration_auth.rs has it with one).
        let (dest, at) = receiver_with(listen, &["--insecure"]);
        let src = kvstore(&dir, "src");
        std::thread::sleep(Duration::from_millis(500));
        let body = serde_json::json!({
            "to": at, "verify": true, "dirty_tracking": tracker, "insecure": true,
        })
        .to_string();
        let r = src
            .api()
            .json("PUT", "/vm/migrate", Some(&body))
            .unwrap_or_else(|e| panic!("{listen}: {e}"));
        for k in [
            "total_ms",
            "downtime_ms",
            "rounds",
            "pages_sent",
            "bytes_sent",
            "guest_downtime_ms",
        ] {
            assert!(r[k].as_f64().is_some(), "{listen}: {k} in {r}");
        }
        let per_round: u64 = r["round_pages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(per_round, r["pages_sent"].as_u64().unwrap(), "{r}");
        assert_breakdown_adds_up(&r);
        assert_eq!(r["tracker"], tracker);
        assert!(per_round > 100, "the guest's pages went: {r}");
        let (code, o, stderr) = src.wait();
        assert_eq!(code, Some(0), "{stderr}");
        assert_eq!(o["ended"], "migrated");
        let (code, o, stderr) = finish(dest);
        assert_eq!(code, Some(0), "{listen}: {stderr}");
        assert_eq!(report(&o, "kvstore.errors"), 0, "{listen}");
        assert!(report(&o, "kvstore.ops") > 0);
    }
}

/// The source pauses its guest only once the destination has applied
/// everything sent before (a `SYNC` round trip), so the pause never waits
/// behind frames still in flight. With the destination's answers held 1 s
/// on the way back, the source waits twice (the wait outlasts the 100 ms
/// downtime target, so one more round carries what the guest wrote
/// meanwhile, and is waited for in turn): `drain_us` is at least 2 s, and
/// the gap the guest saw (the destination's clock at its start, taken
/// before its `RUNNING` crosses the delay) stays under a second: the waits
/// came before the pause, not inside it.
#[test]
fn the_source_pauses_only_once_the_destination_has_caught_up() {
    if !kvm_for_test("the_source_pauses_only_once_the_destination_has_caught_up") {
        return;
    }
    let dir = Scratch::new("migrate-drain");
    let listen = dir.path("in.sock");
    let (dest, _) = receiver(&format!("unix:{}", listen.display()));
    let via = dir.path("relay.sock");
    let _relay = Proxy::with_fault(&via, &listen, Fault::DelayBack(Duration::from_secs(1)));
    // Outlasts the four delayed answers (READY, SYNCED twice, RUNNING).
    let args = [
        "run",
        "--cmdline",
        "workload=kvstore wss=16M rate=1000 seconds=12",
    ];
    let src = Vm::spawn(&args, &dir.path("src.sock"));
    std::thread::sleep(Duration::from_millis(500));
    let body = serde_json::json!({ "to": format!("unix:{}", via.display()), "verify": true });
    let r = src
        .api()
        .json("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    let drain = r["drain_us"].as_u64().unwrap();
    assert!(drain >= 2_000_000, "two SYNC round trips: {r}");
    let seen = r["guest_downtime_ms"].as_f64().unwrap();
    assert!(seen < 1000.0, "the wait was not inside the pause: {r}");
    assert_breakdown_adds_up(&r);
    let (code, o, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["ended"], "migrated");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
}

#[test]
fn ring_tracking_survives_full_rings() {
    if !kvm_for_test("ring_tracking_survives_full_rings") {
        return;
    }
    let dir = Scratch::new("migrate-ring");
    // A ring of 256 entries fills after 192 dirty pages: many full-ring
    // exits while 16 MiB are written at 20000 writes a second.
    let args = [
        "run",
        "--dirty-ring",
        "256",
        "--cmdline",
        "workload=kvstore wss=16M rate=20000 seconds=8",
    ];
    let src = Vm::spawn(&args, &dir.path("src.sock"));
    std::thread::sleep(Duration::from_millis(500));
    // The other trackers are refused on a VM with rings, naming the field.
    let r = src
        .api()
        .call(
            "PUT",
            "/vm/migrate",
            Some(r#"{"to": "unix:/nowhere", "dirty_tracking": "bitmap"}"#),
        )
        .unwrap();
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("dirty_tracking"), "{}", r.body);
    let (dest, at) = receiver(&format!("unix:{}", dir.path("in.sock").display()));
    let body = serde_json::json!({ "to": at, "verify": true, "dirty_tracking": "ring" });
    let rep = src
        .api()
        .json("PUT", "/vm/migrate", Some(&body.to_string()))
        .unwrap();
    assert_eq!(rep["tracker"], "ring");
    assert!(
        rep["ring_full_exits"].as_u64().unwrap() > 0,
        "the rings filled and the vCPUs went on: {rep}"
    );
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
    // And ring tracking is refused on a VM without rings.
    let plain = kvstore(&dir, "plain");
    refused_request(
        plain,
        r#"{"to": "unix:/nowhere", "dirty_tracking": "ring"}"#,
        &["--dirty-ring"],
    );
}

/// The destination builds everything that does not depend on the guest's
/// final state before the source pauses: while the source is still in its
/// first round (8 MiB of working set over a 1 MB/s link: seconds, against
/// the milliseconds the receiver needs), the receiver already runs its
/// vCPU threads (held), its devices, its pager (the guest has a memory
/// budget) and its API server (not yet published). Then, with the source
/// stopped (SIGSTOP: no frame will come), a SIGTERM ends the receiver
/// within seconds, not its 30 s wait for the next frame, with the
/// signal's status; the source, continued, runs on.
#[test]
fn the_destination_is_ready_before_the_source_pauses() {
    if !kvm_for_test("the_destination_is_ready_before_the_source_pauses") {
        return;
    }
    let dir = Scratch::new("migrate-ready");
    let listen = format!("unix:{}", dir.path("in.sock").display());
    let dest_api = dir.path("dest.sock");
    let (dest, at) = receiver_with(&listen, &["--api-socket", dest_api.to_str().unwrap()]);
    let args = [
        "run",
        "--memory",
        "256M",
        "--memory-budget",
        "128M",
        "--cmdline",
        "workload=kvstore wss=8M rate=1000 seconds=60",
    ];
    let src = Vm::spawn(&args, &dir.path("src.sock"));
    std::thread::sleep(Duration::from_millis(500));
    let body = serde_json::json!({ "to": at, "bandwidth": 1_000_000 }).to_string();
    let api = src.api();
    let migration = std::thread::spawn(move || api.call("PUT", "/vm/migrate", Some(&body)));
    let want = [
        "vcpu0",
        "vcpu1",
        "pvio",
        "msi-timer",
        "pager-faults",
        "api-accept",
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    let names = loop {
        let names: Vec<String> = common::threads(dest.id())
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        if want.iter().all(|w| names.iter().any(|n| n == w)) {
            break names;
        }
        assert!(
            Instant::now() < deadline,
            "the receiver never started {want:?}: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // Asked only now: a source still in its first round has not paused
    // (its progress appears once its tracker runs).
    let info = loop {
        let info = src.api().json("GET", "/vm", None).unwrap();
        if !info["migration"].is_null() {
            break info;
        }
        assert!(Instant::now() < deadline, "no migration progress: {info}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(info["state"], "running", "{info}");
    assert_eq!(
        info["migration"]["round"], 0,
        "the source was still in its first round when the receiver had {names:?}: {info}"
    );
    assert!(
        !dest_api.exists(),
        "the receiver's API is published only once its guest runs"
    );
    // SAFETY: kill(2) on our own children.
    unsafe { libc::kill(src.pid() as i32, libc::SIGSTOP) };
    let t0 = Instant::now();
    unsafe { libc::kill(dest.id() as i32, libc::SIGTERM) };
    let (code, o, stderr) = finish(dest);
    let took = t0.elapsed();
    unsafe { libc::kill(src.pid() as i32, libc::SIGCONT) };
    assert_eq!(code, Some(143), "{stderr}");
    assert_eq!(o["ended"], "signal", "{o}");
    assert!(
        took < Duration::from_secs(15),
        "the signal cut the wait for a frame that was not coming (30 s timeout): {took:?}"
    );
    let r = migration.join().unwrap().unwrap();
    assert_eq!(r.status, 502, "{}", r.body);
    let info = src.api().json("GET", "/vm", None).unwrap();
    assert_eq!(info["state"], "running", "the source runs on: {info}");
    src.api().json("PUT", "/vm/shutdown", None).unwrap();
    let (code, o, stderr) = src.wait();
    assert_eq!(o["ended"], "shutdown", "{code:?} {stderr}");
}

/// A fake destination's opening: read the hello and the configuration and,
/// if `ready`, answer READY. The reader, for the rest of the stream.
fn take_conf(s: &UnixStream, ready: bool) -> FrameReader<UnixStream> {
    let mut r = FrameReader::new(s.try_clone().unwrap());
    r.hello().unwrap();
    r.frame().unwrap();
    if ready {
        FrameWriter::new(s.try_clone().unwrap())
            .frame(Kind::Ready, &[])
            .unwrap();
    }
    r
}

/// A fake destination on a Unix socket: accepts once and runs `script`.
fn fake_destination(path: &std::path::Path, script: impl FnOnce(UnixStream) + Send + 'static) {
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            script(s);
        }
    });
}

#[test]
fn failed_migrations_leave_the_source_running() {
    if !kvm_for_test("failed_migrations_leave_the_source_running") {
        return;
    }
    let dir = Scratch::new("migrate-fail");
    // Long enough for every failure below, each migrating for a while.
    let src = Vm::spawn(
        &[
            "run",
            "--cmdline",
            "workload=kvstore wss=16M rate=1000 seconds=12",
        ],
        &dir.path("src.sock"),
    );
    let t0 = std::time::Instant::now();
    let api = src.api();
    let migrate = |to: &std::path::Path, extra: serde_json::Value| {
        let mut body = serde_json::json!({ "to": format!("unix:{}", to.display()) });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        api.call("PUT", "/vm/migrate", Some(&body.to_string()))
            .unwrap()
    };
    // Nobody there.
    let r = migrate(&dir.path("nobody.sock"), serde_json::json!({}));
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("cannot reach"), "{}", r.body);
    // A destination that refuses after the configuration.
    let refuse = dir.path("refuse.sock");
    fake_destination(&refuse, |s| {
        take_conf(&s, false);
        let mut w = FrameWriter::new(s);
        w.frame(Kind::Error, &[b"no room for this VM here"])
            .unwrap();
    });
    let r = migrate(&refuse, serde_json::json!({}));
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("no room for this VM here"), "{}", r.body);
    // One that accepts memory, then vanishes mid-stream.
    let vanish = dir.path("vanish.sock");
    fake_destination(&vanish, |s| {
        let mut r = take_conf(&s, true);
        for _ in 0..3 {
            r.frame().unwrap();
        }
        s.shutdown(std::net::Shutdown::Both).unwrap();
    });
    let r = migrate(&vanish, serde_json::json!({}));
    // The destination's failure, not this host's: 502, as documented.
    assert_eq!(r.status, 502, "{}", r.body);
    // One that takes everything, the final round and the state included
    // (the source has paused its guest by then), and closes instead of
    // confirming: the source resumes its guest.
    let last = dir.path("last.sock");
    fake_destination(&last, |s| {
        let mut r = take_conf(&s, true);
        let mut saw_state = false;
        loop {
            match r.frame() {
                Ok(f) if f.kind == Kind::End => break,
                // Caught up: the source may pause its guest.
                Ok(f) if f.kind == Kind::Sync => FrameWriter::new(s.try_clone().unwrap())
                    .frame(Kind::Synced, &[])
                    .unwrap(),
                Ok(f) => saw_state |= f.kind == Kind::State,
                Err(e) => panic!("the stream broke before END: {e}"),
            }
        }
        assert!(saw_state, "the state came before END");
        s.shutdown(std::net::Shutdown::Both).unwrap();
    });
    let r = migrate(&last, serde_json::json!({}));
    if r.status != 502 || r.body.contains("guest stopped") {
        let (_, _, stderr) = src.wait();
        panic!("{} (after {:?}): {stderr}", r.body, t0.elapsed());
    }
    let v = api.json("GET", "/vm", None).unwrap();
    assert_eq!(v["state"], "running", "resumed after the final round: {v}");
    // One that stalls after the configuration.
    let stall = dir.path("stall.sock");
    fake_destination(&stall, |s| {
        std::thread::sleep(Duration::from_secs(5));
        drop(s);
    });
    let r = migrate(&stall, serde_json::json!({ "timeout_s": 1 }));
    assert!(r.status >= 500, "{}", r.body);
    assert!(
        r.body.contains("timed out"),
        "a stall is named as one: {}",
        r.body
    );
    // Bad requests name the field.
    let r = migrate(&stall, serde_json::json!({ "batch_pages": 0 }));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("batch_pages"), "{}", r.body);
    // The source ran on through all of it and finishes its work intact.
    let v = api.json("GET", "/vm", None).unwrap();
    assert_eq!(v["state"], "running", "{v}");
    let (code, o, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(o["ended"], "power_off");
    assert_eq!(report(&o, "kvstore.errors"), 0);
}

/// Connect to the receiver at `path`, send `bytes` (it may close before
/// all of them are taken) and end the sending side.
fn send(path: &std::path::Path, bytes: &[u8]) -> UnixStream {
    let mut s = UnixStream::connect(path).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s
}

/// Connect to a fresh `hover receive` and send `noise`, which fails the
/// hello, then `bytes`, a stream it refuses: it must log the first with
/// every `needle`, wait on, and end on the second with exit 2.
fn passed_over(dir: &Scratch, name: &str, noise: &[u8], needles: &[&str], bytes: &[u8]) {
    let path = dir.path(&format!("{name}.sock"));
    let (dest, _) = receiver(&format!("unix:{}", path.display()));
    let mut s = send(&path, noise);
    // The receiver answers with why, then closes.
    let _ = std::io::Read::read_to_end(&mut s, &mut Vec::new());
    send(&path, bytes);
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(2), "{name}: {stderr}");
    assert!(o.is_null(), "{name}: nothing ran");
    let warned = stderr
        .lines()
        .find(|l| l.contains("failed the handshake"))
        .unwrap_or_else(|| panic!("{name}: no warning in {stderr}"));
    for n in needles {
        assert!(warned.contains(n), "{name}: {n:?} not in {warned}");
    }
}

/// Send `bytes` to a fresh `hover receive`: it must refuse with exit 2 and
/// one line that contains every `needle`.
fn refused(dir: &Scratch, name: &str, bytes: &[u8], needles: &[&str]) {
    let path = dir.path(&format!("{name}.sock"));
    let (dest, _) = receiver(&format!("unix:{}", path.display()));
    send(&path, bytes);
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(2), "{name}: {stderr}");
    assert!(o.is_null(), "{name}: nothing ran");
    let err: Vec<&str> = stderr.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(err.len(), 1, "{name}: {stderr}");
    for n in needles {
        assert!(err[0].contains(n), "{name}: {n:?} not in {}", err[0]);
    }
}

#[test]
fn a_receiver_waits_through_connections_that_fail_the_handshake() {
    if !kvm_for_test("a_receiver_waits_through_connections_that_fail_the_handshake") {
        return;
    }
    let dir = Scratch::new("migrate-noise");
    let path = dir.path("in.sock");
    let (dest, at) = receiver(&format!("unix:{}", path.display()));
    // More than the 16 openings a receiver checks at once, each started
    // and never finished: each on its own thread, the oldest turned away
    // to make room, they hold nothing up.
    let slow: Vec<UnixStream> = (0..20)
        .map(|_| {
            let mut c = UnixStream::connect(&path).unwrap();
            c.write_all(b"HOV").unwrap();
            c
        })
        .collect();
    // Connect and close; connect and send garbage.
    drop(UnixStream::connect(&path).unwrap());
    let mut g = UnixStream::connect(&path).unwrap();
    let _ = g.write_all(b"GET / HTTP/1.1\r\n\r\n");
    let _ = g.shutdown(std::net::Shutdown::Write);
    let _ = std::io::Read::read_to_end(&mut g, &mut Vec::new());
    // The real migration still arrives.
    let src = kvstore(&dir, "src");
    std::thread::sleep(Duration::from_millis(300));
    let body = serde_json::json!({ "to": at, "verify": true }).to_string();
    src.api().json("PUT", "/vm/migrate", Some(&body)).unwrap();
    let (code, _, stderr) = src.wait();
    assert_eq!(code, Some(0), "{stderr}");
    let (code, o, stderr) = finish(dest);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report(&o, "kvstore.errors"), 0);
    // The two, and the turned-away or timed-out tricklers, were logged.
    let logged = stderr.matches("failed the handshake").count();
    assert!(logged >= 2, "both were logged: {stderr}");
    assert!(stderr.contains("turning the oldest away"), "{stderr}");
    drop(slow);
}

#[test]
fn a_receiver_gives_up_after_its_timeout() {
    let dir = Scratch::new("migrate-timeout");
    let path = dir.path("in.sock");
    let t0 = Instant::now();
    let out = common::hover(&[
        "receive",
        "--listen",
        &format!("unix:{}", path.display()),
        "--timeout",
        "1s",
    ]);
    let e = common::text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(e.contains("no migration arrived within"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert!(!path.exists(), "the socket is removed");
}

#[test]
fn bad_streams_are_refused_and_nothing_runs() {
    if !kvm_for_test("bad_streams_are_refused_and_nothing_runs") {
        return;
    }
    let dir = Scratch::new("migrate-bad");
    let stream = |frames: &[(Kind, Vec<u8>)]| {
        let mut w = FrameWriter::new(Vec::new());
        w.hello(0).unwrap();
        for (k, p) in frames {
            w.frame(*k, &[p]).unwrap();
        }
        let mut out = Vec::new();
        // The writer owns its buffer: rebuild it by writing into `out`.
        let mut w2 = FrameWriter::new(&mut out);
        w2.hello(0).unwrap();
        for (k, p) in frames {
            w2.frame(*k, &[p]).unwrap();
        }
        drop(w);
        out
    };
    // A connection that fails the hello is logged and dropped: the receiver
    // waits on, and here ends on the next connection's bad stream.
    let pages_first = stream(&[(Kind::Pages, vec![0; 8])]);
    passed_over(
        &dir,
        "magic",
        b"NOTHOVER\x01\0\0\0\0\0\0\0",
        &["not a Hover migration stream", "offset 0"],
        &pages_first,
    );
    passed_over(&dir, "empty", b"", &["ended at offset 0"], &pages_first);
    let good_conf = stream(&[(Kind::Conf, b"whatever".to_vec())]);
    let mut bad = good_conf.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    refused(&dir, "crc", &bad, &["Conf frame at offset 16", "CRC"]);
    refused(
        &dir,
        "undecodable",
        &good_conf,
        &["CONF frame at offset 16", "decoded"],
    );
    refused(
        &dir,
        "truncated",
        &good_conf[..good_conf.len() - 3],
        &["ended at offset"],
    );
    let mut huge = stream(&[(Kind::Conf, vec![0; 8])]);
    huge[16 + 8..16 + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    refused(&dir, "huge", &huge, &["offset 16", "over the"]);
    refused(
        &dir,
        "pages-first",
        &stream(&[(Kind::Pages, vec![0; 8])]),
        &["CONF frame at offset 16"],
    );

    // Once a source has said hello, nobody else can connect.
    let path = dir.path("second.sock");
    let (dest, _) = receiver(&format!("unix:{}", path.display()));
    let mut first = UnixStream::connect(&path).unwrap();
    first.write_all(&stream(&[])).unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(&path).is_ok() {
        assert!(Instant::now() < until, "a second connection was taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(first);
    let (code, _, stderr) = finish(dest);
    assert_eq!(code, Some(2), "{stderr}");
}
