//! A client, buggy or hostile, cannot end a VM through its API socket:
//! lengths no server may allocate, heads of 1 MB and 256 MB, 20,000 idle
//! connections held at once (docs/RELIABILITY.md).

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{Scratch, Vm};
use hover_vmm::api::Endpoint;
use hover_vmm::host::kvm_for_test;

/// The resident set of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Send `head` (and whatever of `rest` the server takes before it closes)
/// and return the status line's code.
fn status_of(socket: &std::path::Path, head: &[u8], rest: &[u8]) -> u16 {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(head);
    // The server answers and closes once the head is over its limit; the
    // rest of a huge head then fails to send, which is the point.
    for chunk in rest.chunks(1 << 20) {
        if s.write_all(chunk).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut answer);
    let line = String::from_utf8_lossy(&answer);
    line.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {line:?}"))
}

/// Raise this process's descriptor limit to at least `want` if it may (a
/// process with CAP_SYS_RESOURCE may raise the hard limit too), else to its
/// hard limit; the new soft limit.
fn raise_fd_limit(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        let hard = r.rlim_max;
        r.rlim_max = hard.max(want);
        r.rlim_cur = r.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
            r.rlim_max = hard;
            r.rlim_cur = hard;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
    }
    r.rlim_cur
}

/// The helper the flood below runs when one process may not hold all its
/// connections: this test binary again, holding `HOVER_HOLD` connections to
/// `HOVER_HOLD_AT` until its stdin closes.
fn hold_connections_if_asked() -> bool {
    let (Ok(n), Ok(at)) = (std::env::var("HOVER_HOLD"), std::env::var("HOVER_HOLD_AT")) else {
        return false;
    };
    let n: usize = n.parse().unwrap();
    let held: Vec<UnixStream> = (0..n)
        .map(|i| UnixStream::connect(&at).unwrap_or_else(|e| panic!("connection {i} refused: {e}")))
        .collect();
    println!("holding {}", held.len());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    true
}

/// Start a helper process holding `n` connections to `socket`; it lets go
/// when the returned child's stdin is closed (its stdout, returned too,
/// must be read to its end).
fn helper_holding(n: usize, socket: &std::path::Path) -> (std::process::Child, impl std::io::Read) {
    use std::io::BufRead;
    let mut c = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["abusive_clients_never_end_the_vm", "--exact", "--nocapture"])
        .env("HOVER_HOLD", n.to_string())
        .env("HOVER_HOLD_AT", socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("holding") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the helper ended");
    }
    (c, out)
}

#[test]
fn abusive_clients_never_end_the_vm() {
    if hold_connections_if_asked() {
        return;
    }
    if !kvm_for_test("abusive_clients_never_end_the_vm") {
        return;
    }
    let dir = Scratch::new("api-abuse");
    let vm = Vm::spawn(
        &["run", "--cmdline", "workload=spin tasks=2 seconds=600"],
        &dir.path("vm.sock"),
    );
    // Lengths no server may allocate: refused before a byte of body is read.
    for path in Endpoint::ALL
        .iter()
        .filter(|e| e.method() == "PUT")
        .map(|e| e.path())
    {
        for len in [i64::MAX as u64, 1 << 40] {
            let head =
                format!("PUT {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n{{}}");
            assert_eq!(
                status_of(&vm.socket, head.as_bytes(), b""),
                413,
                "{path} {len}"
            );
        }
    }
    // Heads of 1 MB and 256 MB: 431, and the VMM's memory stays bounded.
    let rss_before = rss_kib(vm.pid());
    for size in [1usize << 20, 256 << 20] {
        let head = b"GET /vm HTTP/1.1\r\nHost: x\r\nX-Filler: ";
        let filler = vec![b'a'; size];
        assert_eq!(status_of(&vm.socket, head, &filler), 431, "{size}");
    }
    let rss_after = rss_kib(vm.pid());
    assert!(
        rss_after < rss_before + (16 << 10),
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
    // 20,000 idle connections held at once (a helper process holds those
    // this one's descriptor limit leaves over): extra ones are turned away,
    // the VM never notices, and the API answers again once they are gone.
    const FLOOD: usize = 20_000;
    let budget = raise_fd_limit(FLOOD as u64 + 64)
        .saturating_sub(64)
        .min(FLOOD as u64) as usize;
    let helper = (budget < FLOOD).then(|| helper_holding(FLOOD - budget, &vm.socket));
    let mut idle = Vec::with_capacity(budget);
    for _ in 0..budget {
        match UnixStream::connect(&vm.socket) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connection {} refused: {e}", idle.len()),
        }
    }
    let by_helper = helper.as_ref().map_or(0, |_| FLOOD - budget);
    assert_eq!(idle.len() + by_helper, FLOOD);
    println!("held {} idle connections ({by_helper} by a helper)", FLOOD);
    drop(idle);
    if let Some((mut h, mut out)) = helper {
        drop(h.stdin.take());
        let _ = out.read_to_end(&mut Vec::new());
        assert!(h.wait().unwrap().success());
    }
    let until = Instant::now() + Duration::from_secs(30);
    let answered = loop {
        match vm.api().call("GET", "/vm", None) {
            Ok(r) if r.status == 200 => break true,
            _ if Instant::now() > until => break false,
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert!(answered, "the API answers again after the flood");
    vm.shut_down();
}

#[test]
fn sixteen_clients_trickling_requests_do_not_keep_a_seventeenth_out() {
    if hold_connections_if_asked() {
        return;
    }
    if !kvm_for_test("sixteen_clients_trickling_requests_do_not_keep_a_seventeenth_out") {
        return;
    }
    let dir = Scratch::new("api-trickle");
    let vm = Vm::spawn(
        &["run", "--cmdline", "workload=spin tasks=2 seconds=600"],
        &dir.path("vm.sock"),
    );
    // Each trickler is served once (so the server holds its connection),
    // then sends its next request a byte at a time, never finishing.
    let mut tricklers = Vec::new();
    for _ in 0..16 {
        let mut s = UnixStream::connect(&vm.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.write_all(b"GET /vm HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut head = [0u8; 12];
        s.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        s.write_all(b"GET /vm HTTP/1.1\r\n").unwrap();
        tricklers.push(s);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for s in &mut tricklers {
                    let _ = s.write_all(b"X");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    for i in 0..10 {
        let r = vm.api().call("GET", "/vm", None).expect("the API answers");
        assert_eq!(r.status, 200, "poll {i}: {}", r.body);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickle.join().unwrap();
    vm.shut_down();
}
