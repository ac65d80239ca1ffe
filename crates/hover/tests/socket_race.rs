//! No window before the API socket is private (#46, H1): a second,
//! unprivileged user watches the directory with inotify and tries to
//! connect to every socket the moment it appears, while `hover run` and
//! `hover firecracker` start 100 times each under umask 000 in a directory
//! open to all. Before the fix the racer won about 1 start in 25 (the
//! socket was bound 0777, then chmod'ed); it must never connect.
//!
//! The racer is this test binary run again as `nobody` (it needs root to
//! switch users; elsewhere the test is skipped with a printed reason).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{hover_cmd_umask0, Scratch};
use hover_vmm::host::kvm_for_test;

const STARTS: usize = 100;
/// The racer's environment: the directory to watch.
const RACER_DIR: &str = "HOVER_SOCKET_RACER_DIR";

/// The racer's side, run in its own process as `nobody`: watch `dir`,
/// connect to each new file at once and again until it is gone, count
/// the connections made, stop when `dir/stop` appears.
#[test]
fn racer() {
    let Some(dir) = std::env::var_os(RACER_DIR).map(PathBuf::from) else {
        return; // only as the racer process
    };
    let c = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    // SAFETY: plain system calls on our own descriptor.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK) };
    assert!(fd >= 0);
    // SAFETY: as above, with a NUL-terminated path.
    let wd =
        unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) };
    assert!(
        wd >= 0,
        "inotify on {dir:?}: {}",
        std::io::Error::last_os_error()
    );
    println!("RACER READY");
    let mut won = 0u64;
    let mut buf = [0u8; 4096];
    loop {
        // SAFETY: reading into our own buffer.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 {
            let mut at = 0usize;
            while at < n as usize {
                // struct inotify_event: wd, mask, cookie, len, name[len].
                let len = u32::from_ne_bytes(buf[at + 12..at + 16].try_into().unwrap()) as usize;
                let name = &buf[at + 16..at + 16 + len];
                let name = String::from_utf8_lossy(name)
                    .trim_end_matches('\0')
                    .to_string();
                at += 16 + len;
                if name == "stop" {
                    println!("RACER WON {won}");
                    return;
                }
                // Hammer the new file for a moment: the window, if any, is
                // between its creation and its chmod.
                let p = dir.join(&name);
                for _ in 0..200 {
                    if std::os::unix::net::UnixStream::connect(&p).is_ok() {
                        won += 1;
                        break;
                    }
                }
            }
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

fn wait_for(p: &Path, child: &mut Child) -> bool {
    let until = Instant::now() + Duration::from_secs(30);
    while !p.exists() {
        if Instant::now() > until || child.try_wait().ok().flatten().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    true
}

/// Start `args` (naming `sock`) under umask 000, wait for its socket, end it.
fn start_and_end(args: &[&str], sock: &Path) {
    let mut child = hover_cmd_umask0()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for(sock, &mut child), "{args:?}: no socket");
    let mode = std::fs::symlink_metadata(sock)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "{args:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_file(sock);
}

#[test]
fn an_unprivileged_racer_never_connects_to_a_starting_vmms_api_socket() {
    let test = "an_unprivileged_racer_never_connects_to_a_starting_vmms_api_socket";
    if !kvm_for_test(test) {
        return;
    }
    // SAFETY: geteuid has no side effects.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: CI must run as root to switch users"
        );
        eprintln!("skipping {test}: switching to an unprivileged racer needs root");
        return;
    }
    let scratch = Scratch::new("socket-race");
    let dir = scratch.0.join("open");
    std::fs::create_dir(&dir).unwrap();
    // Open to all, as a shared directory would be: only the socket's own
    // mode can keep the racer out.
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy of this binary where nobody may run it (the build directory
    // may be private, as a CI clone in a mktemp directory is).
    let exe = scratch.0.join("racer");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut racer = Command::new(&exe);
    racer
        .args(["--exact", "racer", "--nocapture", "--test-threads", "1"])
        .env(RACER_DIR, &dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: setgid/setuid are async-signal-safe; they drop to nobody.
    unsafe {
        racer.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut racer = racer.spawn().expect("the racer starts as nobody");
    let mut out = std::io::BufReader::new(racer.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("RACER READY") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "the racer ended"
        );
    }
    let run_sock = dir.join("vm.sock");
    let fc_sock = dir.join("fc.sock");
    for _ in 0..STARTS {
        start_and_end(
            &[
                "run",
                "--api-socket",
                run_sock.to_str().unwrap(),
                "--console",
                "off",
                "--cmdline",
                "workload=spin seconds=5",
            ],
            &run_sock,
        );
        start_and_end(
            &["firecracker", "--api-sock", fc_sock.to_str().unwrap()],
            &fc_sock,
        );
    }
    std::fs::write(dir.join("stop"), b"").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let _ = racer.wait();
    let won: u64 = rest
        .lines()
        .find_map(|l| l.strip_prefix("RACER WON "))
        .expect("the racer reports")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        won,
        0,
        "the racer connected {won} times in {} starts",
        2 * STARTS
    );
}
