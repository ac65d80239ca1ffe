//! The system calls a boost makes (its policy, `--boost-policy`, is a
//! setting: [`crate::config::boost`]): a thread's scheduling class,
//! priority and nice value are read before it is boosted and put back when
//! it is unboosted.

use serde::Serialize;

use crate::config::boost::BoostPolicy;

/// A thread's scheduling as the OS reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SchedParams {
    /// `SCHED_OTHER`, `SCHED_FIFO`, ...
    pub policy: i32,
    /// The static priority (0 for normal policies).
    pub priority: i32,
    /// The nice value.
    pub nice: i32,
}

fn os_err(what: &str, tid: i32) -> std::io::Error {
    let e = std::io::Error::last_os_error();
    std::io::Error::new(e.kind(), format!("{what} of thread {tid}: {e}"))
}

/// The calling thread's id (what the functions below take).
pub fn gettid() -> i32 {
    // SAFETY: gettid has no side effects and cannot fail.
    unsafe { libc::gettid() }
}

/// Read thread `tid`'s scheduling.
pub fn read(tid: i32) -> std::io::Result<SchedParams> {
    // SAFETY: plain system calls on a thread id; results are checked.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        return Err(os_err("sched_getscheduler", tid));
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as above; `param` is a valid out-pointer.
    if unsafe { libc::sched_getparam(tid, &mut param) } != 0 {
        return Err(os_err("sched_getparam", tid));
    }
    // getpriority may return -1 as a value: errno tells an error apart.
    // SAFETY: errno is thread-local; getpriority has no other side effect.
    unsafe { *libc::__errno_location() = 0 };
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    if nice == -1 && std::io::Error::last_os_error().raw_os_error() != Some(0) {
        return Err(os_err("getpriority", tid));
    }
    Ok(SchedParams {
        policy: policy & !libc::SCHED_RESET_ON_FORK,
        priority: param.sched_priority,
        nice,
    })
}

fn set_scheduler(tid: i32, policy: i32, priority: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: a system call on a thread id with a valid parameter block.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(os_err("sched_setscheduler", tid));
    }
    Ok(())
}

fn set_nice(tid: i32, nice: i32) -> std::io::Result<()> {
    // SAFETY: a system call on a thread id.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) } != 0 {
        return Err(os_err("setpriority", tid));
    }
    Ok(())
}

/// Boost thread `tid` with `policy`.
pub fn apply(tid: i32, policy: BoostPolicy) -> std::io::Result<()> {
    match policy {
        BoostPolicy::Fifo(p) => set_scheduler(tid, libc::SCHED_FIFO, p),
        BoostPolicy::Nice(n) => set_nice(tid, n),
    }
}

/// Put thread `tid` back to `original` (after [`apply`]).
pub fn restore(tid: i32, original: SchedParams) -> std::io::Result<()> {
    set_scheduler(tid, original.policy, original.priority)?;
    set_nice(tid, original.nice)
}

/// Whether this process may raise a thread to SCHED_FIFO: tried on the
/// calling thread, which is put back as it was.
pub fn fifo_allowed() -> std::io::Result<()> {
    let tid = gettid();
    let before = read(tid)?;
    apply(tid, BoostPolicy::Fifo(1))?;
    restore(tid, before)
}

/// CPU time thread `tid` (of this process) has used, in nanoseconds.
pub fn thread_cpu_ns(tid: i32) -> std::io::Result<u64> {
    // The kernel's per-thread CPU clock id: MAKE_THREAD_CPUCLOCK(tid,
    // CPUCLOCK_SCHED) = (~tid << 3) | CPUCLOCK_PERTHREAD_MASK | CPUCLOCK_SCHED.
    let clock = (!tid << 3) | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; an unknown clock id fails with EINVAL.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return Err(os_err("the CPU clock", tid));
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_clock_of_a_thread_counts_its_work() {
        let tid = gettid();
        let a = thread_cpu_ns(tid).unwrap();
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::black_box(0u64);
        }
        let b = thread_cpu_ns(tid).unwrap();
        // Spinning 20 ms of wall time on a loaded host may get little CPU,
        // but some: the clock moved.
        assert!(b > a, "{a} -> {b}");
    }

    #[test]
    fn a_thread_is_boosted_and_restored() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let before = read(tid).unwrap();
        assert_eq!(before.policy, libc::SCHED_OTHER);
        match apply(tid, BoostPolicy::Nice(-3)) {
            Ok(()) => {
                assert_eq!(read(tid).unwrap().nice, -3);
                restore(tid, before).unwrap();
                assert_eq!(read(tid).unwrap(), before);
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                eprintln!("skipped: no privilege to raise a thread's priority here ({e})");
            }
            Err(e) => panic!("{e}"),
        }
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
