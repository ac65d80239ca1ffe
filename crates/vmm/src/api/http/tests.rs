use super::*;
use std::io::Write;

fn server(limits: Limits) -> (std::path::PathBuf, HttpServer) {
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "hover-http-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let handler: Handler = Arc::new(|r: &Request| {
        (
            200,
            "text/plain",
            format!("{} {} {}", r.method, r.target, r.body.len()),
        )
    });
    let s = HttpServer::start(listener, limits, handler).unwrap();
    (path, s)
}

fn exchange(path: &std::path::Path, raw: &[u8]) -> String {
    let mut c = UnixStream::connect(path).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.write_all(raw);
    let mut out = String::new();
    let _ = c.read_to_string(&mut out);
    out
}

#[test]
fn a_request_is_answered_and_pipelined_ones_follow() {
    let (path, _s) = server(Limits::default());
    let out = exchange(
        &path,
        b"PUT /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /b HTTP/1.1\r\nConnection: close\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
    assert!(out.contains("PUT /a 3"), "{out}");
    assert!(out.contains("GET /b 0"), "{out}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_huge_content_length_is_refused_before_any_body_is_read() {
    let (path, _s) = server(Limits::default());
    for len in [u64::MAX as u128, (1u128 << 63) - 1, 1 << 40, 64 << 10 | 1] {
        let out = exchange(
            &path,
            format!("PUT /x HTTP/1.1\r\nContent-Length: {len}\r\n\r\n{{}}").as_bytes(),
        );
        assert!(
            out.starts_with("HTTP/1.1 413") || out.starts_with("HTTP/1.1 400"),
            "{len}: {out}"
        );
    }
    let out = exchange(&path, b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(out.contains("GET /ok 0"), "{out}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn an_oversized_head_gets_431() {
    let (path, _s) = server(Limits::default());
    let mut raw = b"GET / HTTP/1.1\r\nX-Big: ".to_vec();
    raw.extend(std::iter::repeat_n(b'a', 1 << 20));
    raw.extend_from_slice(b"\r\n\r\n");
    let out = exchange(&path, &raw);
    assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_full_server_closes_its_oldest_waiting_connection_for_a_newcomer() {
    let limits = Limits {
        connections: 2,
        ..Limits::default()
    };
    let (path, s) = server(limits);
    // Two clients hold every slot: one idle, one trickling a request.
    let mut idle = UnixStream::connect(&path).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while s.connections() < 1 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut trickling = UnixStream::connect(&path).unwrap();
    trickling.write_all(b"GET /slow HTTP/1.1\r\n").unwrap();
    while s.connections() < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = exchange(&path, b"GET /new HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(out.contains("GET /new 0"), "{out}");
    // The oldest (the idle one) was closed for it; the trickler still holds.
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(
        idle.read(&mut b).unwrap_or(0),
        0,
        "the idle connection was closed"
    );
    trickling.write_all(b"\r\n").unwrap();
    trickling
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = [0u8; 15];
    trickling.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200 OK");
    let _ = std::fs::remove_file(path);
}

#[test]
fn connections_all_answering_turn_a_newcomer_away_with_503_and_the_server_recovers() {
    let limits = Limits {
        connections: 2,
        ..Limits::default()
    };
    static N: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "hover-http-busy-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_file(&path);
    // A handler that holds its request until released: both slots answering.
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let entered = Arc::new(AtomicU64::new(0));
    let (g, e) = (gate.clone(), entered.clone());
    let handler: Handler = Arc::new(move |r: &Request| {
        e.fetch_add(1, Ordering::SeqCst);
        let (lock, cv) = &*g;
        let mut open = lock.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        (200, "text/plain", r.target.clone())
    });
    let s = HttpServer::start(UnixListener::bind(&path).unwrap(), limits, handler).unwrap();
    let held: Vec<_> = (0..2)
        .map(|i| {
            let mut c = UnixStream::connect(&path).unwrap();
            c.write_all(format!("GET /held{i} HTTP/1.1\r\nConnection: close\r\n\r\n").as_bytes())
                .unwrap();
            c
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(10);
    while entered.load(Ordering::SeqCst) < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = exchange(&path, b"GET / HTTP/1.1\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 503"), "{out}");
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    drop(held);
    while s.connections() > 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = exchange(&path, b"GET /again HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(out.contains("/again"), "{out}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_request_that_stalls_is_timed_out_and_stopping_closes_idle_connections() {
    let limits = Limits {
        request_time: Duration::from_millis(200),
        ..Limits::default()
    };
    let (path, mut s) = server(limits);
    let out = exchange(&path, b"GET / HTTP/1.1\r\nX: ");
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    let idle = UnixStream::connect(&path).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while s.connections() < 1 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    s.stop(Duration::from_secs(5));
    assert_eq!(s.connections(), 0);
    drop(idle);
    let _ = std::fs::remove_file(path);
}

#[test]
fn chunked_bodies_and_bad_lengths_are_refused() {
    let (path, _s) = server(Limits::default());
    let out = exchange(
        &path,
        b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    );
    assert!(out.starts_with("HTTP/1.1 501"), "{out}");
    let out = exchange(&path, b"PUT / HTTP/1.1\r\nContent-Length: x\r\n\r\n");
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    let out = exchange(
        &path,
        b"PUT / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    );
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    let _ = std::fs::remove_file(path);
}
