//! A network link with latency and a rate limit on this machine: a network
//! namespace joined to this one by a veth pair, `tc netem` on both ends
//! (set up by the bench itself when it may, torn down when dropped).

use std::process::Command;

/// The source's end of the link.
pub const HOST_ADDR: &str = "10.213.0.1";
/// The destination's end, inside the namespace.
pub const PEER_ADDR: &str = "10.213.0.2";

/// A link; dropping it deletes the namespace and with it the veth pair.
pub struct Link {
    /// The namespace the destination runs in (`ip netns exec NS ...`).
    pub ns: String,
    /// One-way delay, milliseconds.
    pub delay_ms: f64,
    /// Rate each way, megabits per second.
    pub mbit: u64,
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Link {
    /// Set up the namespace, the veth pair and netem (`delay_ms` each way,
    /// `mbit` each way). Needs root (CAP_NET_ADMIN) and iproute2; the error
    /// says what failed.
    pub fn new(delay_ms: f64, mbit: u64) -> Result<Link, String> {
        let id = std::process::id() % 100_000;
        let ns = format!("hover-pc-{id}");
        let (a, b) = (format!("hpc{id}a"), format!("hpc{id}b"));
        sh(&["ip", "netns", "add", &ns])?;
        let link = Link { ns, delay_ms, mbit };
        let ns = link.ns.as_str();
        let delay = format!("{delay_ms}ms");
        let rate = format!("{mbit}mbit");
        let netem = |dev: &str| -> Vec<String> {
            [
                "tc", "qdisc", "add", "dev", dev, "root", "netem", "delay", &delay, "rate", &rate,
                "limit", "100000",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let run = |v: Vec<String>| sh(&v.iter().map(String::as_str).collect::<Vec<_>>());
        sh(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b])?;
        sh(&["ip", "link", "set", &b, "netns", ns])?;
        sh(&["ip", "addr", "add", &format!("{HOST_ADDR}/24"), "dev", &a])?;
        sh(&["ip", "link", "set", &a, "up"])?;
        let inside = |v: &[&str]| {
            let mut c = vec!["ip", "netns", "exec", ns];
            c.extend_from_slice(v);
            sh(&c)
        };
        inside(&["ip", "addr", "add", &format!("{PEER_ADDR}/24"), "dev", &b])?;
        inside(&["ip", "link", "set", &b, "up"])?;
        inside(&["ip", "link", "set", "lo", "up"])?;
        run(netem(&a))?;
        let mut v = vec!["ip".to_string(), "netns".into(), "exec".into(), ns.into()];
        v.extend(netem(&b));
        run(v)?;
        Ok(link)
    }

    /// What the link is, for table headers.
    pub fn describe(&self) -> String {
        format!(
            "veth + netem: {} ms each way, {} Mbit/s",
            self.delay_ms, self.mbit
        )
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = sh(&["ip", "netns", "del", &self.ns]);
    }
}

/// Where `tc netem` is missing (a kernel without `sch_netem`), a relay in
/// this process that delays every chunk by `delay` each way: the latency of
/// a link, without its rate limit (the migration's own `bandwidth` gives
/// that). Forwards the first connection to `listen` on to `target`.
pub struct Relay {
    /// The socket the source connects to: removed with the relay, or if a
    /// signal ends the bench while it relays.
    _socket: crate::hover_process::TempPath,
}

impl Relay {
    /// Listen at `path` and relay to the Unix socket `target`.
    pub fn start(
        path: &std::path::Path,
        target: std::path::PathBuf,
        delay: std::time::Duration,
    ) -> std::io::Result<Relay> {
        use std::os::unix::net::{UnixListener, UnixStream};
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path)?;
        std::thread::spawn(move || {
            let Ok((a, _)) = l.accept() else { return };
            let Ok(b) = UnixStream::connect(&target) else {
                return;
            };
            let pipe = |from: UnixStream, to: UnixStream| {
                std::thread::spawn(move || delayed_copy(from, to, delay));
            };
            pipe(a.try_clone().expect("clone"), b.try_clone().expect("clone"));
            pipe(b, a);
        });
        Ok(Relay {
            _socket: crate::hover_process::TempPath::new(path.into()),
        })
    }
}

/// Copy `from` to `to`, each chunk written `delay` after it was read (a
/// queue in between, so the delay adds latency, not a rate limit).
fn delayed_copy(
    mut from: std::os::unix::net::UnixStream,
    mut to: std::os::unix::net::UnixStream,
    delay: std::time::Duration,
) {
    use std::io::{Read, Write};
    use std::time::Instant;
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        for (due, chunk) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
    let mut buf = vec![0u8; 1 << 16];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0
            || tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
}
