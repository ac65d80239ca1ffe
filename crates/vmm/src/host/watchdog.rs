//! For test binaries: a hang becomes a failure that says where it hung.
//!
//! A VM that never ends (a lost wake-up, a fault nobody serves) would hold
//! a test, and with it the whole suite, until CI's own limit, with nothing
//! printed. [`arm`] starts one thread per test binary that, past a
//! deadline, prints every thread of this process and of the processes it
//! started (name, state, kernel wait channel, and a backtrace from gdb
//! where gdb is installed), kills those processes and exits the binary
//! with a failure, so cargo goes on to the next one.

use std::io::Write;
use std::process::Command;
use std::sync::Once;
use std::time::Duration;

/// Seconds a test binary may run before the watchdog fires
/// (`HOVER_TEST_DEADLINE_SECS`; 0 turns it off). Far above the slowest
/// binary on a loaded 2-CPU host (about 70 s idle), far below CI's limit.
pub const DEFAULT_DEADLINE_SECS: u64 = 480;

/// Start the watchdog for this process (once; later calls do nothing).
pub fn arm() {
    static ARMED: Once = Once::new();
    ARMED.call_once(|| {
        let secs = std::env::var("HOVER_TEST_DEADLINE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_DEADLINE_SECS);
        if secs == 0 {
            return;
        }
        let _ = std::thread::Builder::new()
            .name("test-watchdog".into())
            .spawn(move || {
                std::thread::sleep(Duration::from_secs(secs));
                fire(secs);
            });
    });
}

fn fire(secs: u64) -> ! {
    let me = std::process::id();
    let mut out = format!(
        "\n=== test watchdog: this test binary ran past {secs} s (HOVER_TEST_DEADLINE_SECS); its threads and its children's ===\n"
    );
    let children = descendants(me);
    // Held still from here: none exits (and has its id reused) before it
    // is killed below; gdb attaches to a stopped process all the same.
    for &pid in &children {
        // SAFETY: kill(2) on a process id; a gone process is ESRCH.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    }
    // This process's own threads by name and wait channel only: gdb on
    // its own process would stop this thread too.
    out.push_str(&describe(me, false));
    for &pid in &children {
        out.push_str(&describe(pid, true));
    }
    // Written past the test harness's output capture, which would
    // swallow it when the process exits.
    let _ = std::io::stderr().write_all(out.as_bytes());
    for pid in children {
        // SAFETY: as above.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    std::process::exit(101);
}

/// Every live process below `root`, parents before their children.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = stat_field(&format!("/proc/{pid}/stat"), 1) {
                parent_of.push((pid, ppid.parse::<u32>().unwrap_or(0)));
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// Field `n` (0: state) after the `(comm)` of a /proc stat line.
fn stat_field(path: &str, n: usize) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    rest.split_whitespace().nth(n).map(str::to_string)
}

/// `pid`'s threads, and with `backtraces` each one's stack from gdb (where
/// gdb is installed and may attach; bounded, and killed if it hangs).
fn describe(pid: u32, backtraces: bool) -> String {
    let read = |p: String| {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let cmdline = read(format!("/proc/{pid}/cmdline")).replace('\0', " ");
    let mut s = format!("--- process {pid}: {cmdline}\n");
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let tid = t.file_name().to_string_lossy().into_owned();
            let base = format!("/proc/{pid}/task/{tid}");
            s.push_str(&format!(
                "  thread {tid} {:<16} state {} wchan {}\n",
                read(format!("{base}/comm")),
                stat_field(&format!("{base}/stat"), 0).unwrap_or_default(),
                read(format!("{base}/wchan")),
            ));
        }
    }
    if !backtraces {
        return s;
    }
    if let Ok(bt) = Command::new("timeout")
        .args([
            "-k",
            "5",
            "30",
            "gdb",
            "-p",
            &pid.to_string(),
            "-batch",
            "-nx",
        ])
        .args(["-ex", "thread apply all bt 16"])
        .output()
    {
        let text = String::from_utf8_lossy(&bt.stdout);
        s.extend(
            text.lines()
                .filter(|l| l.starts_with('#') || l.starts_with("Thread "))
                .map(|l| format!("  {}\n", l.chars().take(200).collect::<String>())),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_process_is_found_with_its_threads() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let found = descendants(std::process::id());
        assert!(found.contains(&child.id()), "{found:?}");
        // Its command line may still be ours (read before its exec): the
        // process and its thread are what must be there.
        let d = describe(child.id(), false);
        let head = format!("--- process {}: ", child.id());
        assert!(d.starts_with(&head) && d.contains("\n  thread "), "{d}");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_stat_line_is_read_past_a_name_with_spaces() {
        let dir = std::env::temp_dir().join(format!("hover-watchdog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("stat");
        std::fs::write(&p, "42 (a (b) c) S 7 42 42 0").unwrap();
        assert_eq!(stat_field(p.to_str().unwrap(), 0).as_deref(), Some("S"));
        assert_eq!(stat_field(p.to_str().unwrap(), 1).as_deref(), Some("7"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
