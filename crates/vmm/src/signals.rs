//! SIGTERM and SIGINT end a VM as its API's shutdown does: the vCPUs stop,
//! the outcome is printed (`ended: signal`), the API socket and temporary
//! files go, and the process exits with 128 + the signal (143, 130). Tools
//! stop VMMs this way (the Firecracker Go SDK's `StopVMM` sends SIGTERM).
//!
//! [`install`] blocks both signals in the calling thread before it starts
//! any other, so every thread inherits the mask and none is interrupted
//! by a handler (vCPU threads under seccomp could not run one); a watcher
//! thread takes them with `sigwait` and hands each to whoever [`watch`]es
//! now: a running VM's control loop, or a server still waiting to build
//! one. With nobody watching, the watcher removes the paths registered
//! with [`create_removed_on_signal`] (sockets a VMM listens on before its VM runs)
//! and exits at once. Programs started later get an empty mask (Rust's
//! `Command` resets it), so they see the signals as usual.
//!
//! The watcher reads no outside input (only the signal number the kernel
//! gives it), so, like the [`crate::seccomp::broker`], it runs unfiltered.

use crate::sync::Locked;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The signals that end a VM.
pub const ENDING: [i32; 2] = [libc::SIGTERM, libc::SIGINT];

type Handler = Box<dyn Fn(i32) + Send>;

/// Who hears a signal now: (registration number, handler).
static WATCHER: Mutex<Option<(u64, Handler)>> = Mutex::new(None);
/// Paths removed when a signal ends the process with nobody watching.
static PATHS: Mutex<Vec<(u64, PathBuf)>> = Mutex::new(Vec::new());
/// What the process says as a signal ends it with nobody watching.
static LAST_WORDS: Mutex<&str> = Mutex::new("ended before a VM ran");
static NEXT: AtomicU64 = AtomicU64::new(1);

/// The exit status for a process ended by `signal` (the shell's 128 + N).
pub fn exit_status(signal: i32) -> u8 {
    (128 + signal).clamp(0, 255) as u8
}

/// The signal's name, for messages.
pub fn name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

fn ending_set() -> libc::sigset_t {
    // SAFETY: the set is initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in ENDING {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Block SIGTERM and SIGINT in the calling thread and start the watcher.
/// Call it first thing in `main`, before any thread is started: a thread
/// started before keeps the default action (the process dies at once).
pub fn install() -> std::io::Result<()> {
    let set = ending_set();
    // SAFETY: only the calling thread's mask changes.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let mut sig = 0;
            // SAFETY: `set` lives in this closure; sigwait writes `sig`.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                deliver(sig);
            }
        })?;
    Ok(())
}

fn deliver(sig: i32) {
    let watcher = WATCHER.locked();
    if let Some((_, handler)) = watcher.as_ref() {
        handler(sig);
        return;
    }
    for (_, p) in PATHS.locked().iter() {
        let _ = std::fs::remove_file(p);
    }
    // Not `eprintln!`: with stderr closed (a parent that stopped reading)
    // it panics, which would end this thread with the signals still
    // blocked everywhere else, and the process could no longer be stopped
    // but by SIGKILL.
    let words = *LAST_WORDS.locked();
    let _ = writeln!(std::io::stderr(), "hover: {}: {words}", name(sig));
    std::process::exit(exit_status(sig).into());
}

/// What to say when a signal ends the process with nobody watching
/// (`hover bench`: not "before a VM ran").
pub fn say_on_signal(words: &'static str) {
    *LAST_WORDS.locked() = words;
}

/// A path removed if a signal ends the process while nobody [`watch`]es,
/// for as long as the guard lives (a file another process makes, such as a
/// snapshot a bench asked a VM for).
pub fn remove_on_signal(path: PathBuf) -> RemoveOnSignal {
    register(&mut PATHS.locked(), path)
}

/// `path` into `paths` (the locked registry), removed on a signal while
/// the returned guard lives.
fn register(paths: &mut Vec<(u64, PathBuf)>, path: PathBuf) -> RemoveOnSignal {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    paths.push((id, path));
    RemoveOnSignal(id)
}

/// While the returned guard lives, signals go to `handler` (which must not
/// block: it runs on the watcher thread). The newest registration wins;
/// dropping a guard removes only its own.
#[must_use = "signals go to the handler only while the guard lives"]
pub fn watch(handler: impl Fn(i32) + Send + 'static) -> Watch {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    *WATCHER.locked() = Some((id, Box::new(handler)));
    Watch(id)
}

/// Ignore signals from now on, for good: the VM has ended, and its
/// outcome is being printed and its files removed; a signal now must not
/// cut that short.
pub fn ignore_from_now() {
    std::mem::forget(watch(|_| {}));
}

/// A registration of [`watch`].
pub struct Watch(u64);

impl Drop for Watch {
    fn drop(&mut self) {
        let mut w = WATCHER.locked();
        if w.as_ref().is_some_and(|(id, _)| *id == self.0) {
            *w = None;
        }
    }
}

/// Create `path` with `create` and have it removed if a signal ends the
/// process while nobody [`watch`]es, for as long as the guard lives. A
/// signal that comes while `create` runs waits for it: the file is never
/// seen without its registration.
pub fn create_removed_on_signal<T, E>(
    path: PathBuf,
    create: impl FnOnce() -> Result<T, E>,
) -> Result<(T, RemoveOnSignal), E> {
    let mut paths = PATHS.locked();
    let made = create()?;
    Ok((made, register(&mut paths, path)))
}

/// A registration of [`create_removed_on_signal`].
pub struct RemoveOnSignal(u64);

impl Drop for RemoveOnSignal {
    fn drop(&mut self) {
        PATHS.locked().retain(|(id, _)| *id != self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_the_shells() {
        assert_eq!(exit_status(libc::SIGTERM), 143);
        assert_eq!(exit_status(libc::SIGINT), 130);
    }

    #[test]
    fn the_newest_watcher_hears_and_an_old_guard_leaves_it() {
        use std::sync::atomic::AtomicI32;
        use std::sync::Arc;
        let (a, b) = (Arc::new(AtomicI32::new(0)), Arc::new(AtomicI32::new(0)));
        let (a2, b2) = (a.clone(), b.clone());
        let first = watch(move |s| a2.store(s, Ordering::SeqCst));
        let second = watch(move |s| b2.store(s, Ordering::SeqCst));
        drop(first);
        deliver(libc::SIGTERM);
        assert_eq!(a.load(Ordering::SeqCst), 0);
        assert_eq!(b.load(Ordering::SeqCst), libc::SIGTERM);
        drop(second);
        assert!(WATCHER.lock().unwrap().is_none());
    }
}
