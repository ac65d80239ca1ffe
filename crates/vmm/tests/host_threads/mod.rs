//! The host's threads as the boost tests see them: their scheduling
//! policies (read and watched while a VM runs), and the load a test puts
//! on one CPU (pinning, a spinning thread).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hover_vmm::sched::boost::policy;

use super::FIFO;

/// The scheduling policy of this process's thread named `name`, if any.
pub fn policy_of(name: &str) -> Option<i32> {
    for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let tid: i32 = t.file_name().to_str()?.parse().ok()?;
            return policy::read(tid).ok().map(|p| p.policy);
        }
    }
    None
}

/// Watches the policies of threads `names` while a VM runs: every change seen.
pub struct Watcher {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Vec<i32>>>,
}

impl Watcher {
    pub fn start(names: &[&str]) -> Watcher {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = vec![Vec::new(); names.len()];
            while !flag.load(Ordering::Relaxed) {
                for (i, n) in names.iter().enumerate() {
                    if let Some(p) = policy_of(n) {
                        if seen[i].last() != Some(&p) {
                            seen[i].push(p);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            seen
        });
        Watcher { stop, thread }
    }

    pub fn finish(self) -> Vec<Vec<i32>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Wait up to 2 s for thread `name` to run SCHED_FIFO; `what` says what failed.
pub fn wait_for_fifo(name: &str, what: &str) {
    let t = Instant::now();
    while policy_of(name) != Some(FIFO) {
        // Bounded generously: a loaded host may not run the guest for seconds.
        assert!(t.elapsed() < Duration::from_secs(20), "{name}: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// This thread and the threads it starts (a VM's) run on one CPU only,
/// until dropped.
pub struct Pinned(libc::cpu_set_t);

impl Pinned {
    /// Pin to the first CPU this thread may use; `None` if that fails.
    pub fn to_one() -> Option<Pinned> {
        // SAFETY: plain affinity calls on this thread with valid sets.
        unsafe {
            let mut old: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of_val(&old), &mut old) != 0 {
                return None;
            }
            let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &old))?;
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut one);
            (libc::sched_setaffinity(0, std::mem::size_of_val(&one), &one) == 0)
                .then_some(Pinned(old))
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: as above, the set saved before.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&self.0), &self.0) };
    }
}

/// A thread spinning on the CPU it was started on, stopped when dropped
/// (a failing test leaves no CPU busy).
pub struct Spinner(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Spinner {
    pub fn start() -> Spinner {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let t = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        Spinner(stop, Some(t))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}
