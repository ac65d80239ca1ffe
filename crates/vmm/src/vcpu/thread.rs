//! A vCPU's thread: a small state machine driven by messages.
//!
//! ```text
//!            Pause                    guest power-off, crash,
//!  Running ---------> Paused          failed KVM_RUN
//!     ^                 |      Running --------------------> Exited
//!     +----- Resume ----+
//! ```
//! The VM sends a [`VcpuMsg`] and kicks the thread with [`kick_signal`]. The
//! kick handler sets the vCPU's `immediate_exit`, so the signal is never
//! lost: if it lands while `KVM_RUN` runs, `KVM_RUN` returns `EINTR`; if it
//! lands just before, the next `KVM_RUN` returns `EINTR` at once. Either way
//! the thread reads its messages before the guest runs again: one signal per
//! message, no re-signalling loops.
//!
//! Pausing finishes the exit in flight: KVM completes a port or MMIO read
//! only on the next `KVM_RUN`, so the thread enters `KVM_RUN` once more with
//! `immediate_exit` set, which completes the instruction and returns `EINTR`
//! without running the guest. Only then is the vCPU's state whole and may be
//! read or written (from this thread: vCPU ioctls block while `KVM_RUN` runs).
//! Every message gets exactly one reply; the thread ends on [`VcpuMsg::Stop`].

use std::cell::Cell;
use std::os::unix::thread::JoinHandleExt;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::Instant;

use kvm_ioctls::VcpuExit;
use serde::Serialize;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::state::{StateError, VcpuState};
use super::{GuestCrash, Vcpu, VcpuEvent};
use crate::devices::{Devices, PortAction};

/// Where a vCPU thread is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Running guest code (or halted in KVM).
    Running,
    /// Stopped between instructions, its state whole.
    Paused,
    /// The guest powered off or crashed; the vCPU will not run again.
    Exited,
}

/// What the VM asks of a vCPU thread.
pub enum VcpuMsg {
    /// Stop running guest code; reply with the state reached.
    Pause,
    /// Run guest code again (if paused); reply with the state reached.
    Resume,
    /// Read the vCPU's whole state (paused or exited only).
    Save,
    /// Load a saved state (paused only).
    Restore(Box<VcpuState>),
    /// End the thread (no reply: the VM joins it).
    Stop,
}

/// A vCPU thread's answer.
pub enum VcpuReply {
    /// The state the vCPU is in after a Pause or Resume.
    State(RunState),
    /// The saved state, or why it could not be read.
    Saved(Result<Box<VcpuState>, StateError>),
    /// Whether the state was loaded.
    Restored(Result<(), StateError>),
}

/// The real-time signal used to kick vCPU threads out of `KVM_RUN`.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

thread_local! {
    /// This thread's `kvm_run.immediate_exit`, for the kick handler.
    static IMMEDIATE_EXIT: Cell<*mut u8> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let _ = IMMEDIATE_EXIT.try_with(|p| {
        let p = p.get();
        if !p.is_null() {
            // SAFETY: the pointer is this thread's kvm_run mapping, set while
            // the VcpuFd that owns it lives (cleared before it is dropped); a
            // byte store is async-signal-safe.
            unsafe { std::ptr::write_volatile(p, 1) };
        }
    });
}

/// Install the kick handler once per process. Its only jobs are to set
/// `immediate_exit` and to interrupt `KVM_RUN`, so that the signal's
/// default action (terminate) never runs.
pub fn install_kick_handler() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), on_kick)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()));
    });
    result
}

/// The VM's side of a vCPU thread.
pub struct VcpuHandle {
    index: usize,
    tx: Sender<VcpuMsg>,
    rx: Receiver<VcpuReply>,
    thread: Option<JoinHandle<u64>>,
}

/// Kicks one vCPU thread (see [`VcpuHandle::kicker`]).
#[derive(Clone, Copy)]
pub struct Kicker(libc::pthread_t);

impl Kicker {
    /// Kick the thread out of `KVM_RUN` (or make its next one return).
    pub fn kick(&self) {
        // SAFETY: the id is of a thread not yet joined (the kicker does not
        // outlive its handle, which joins the thread); the signal has a
        // handler installed by `spawn`.
        unsafe { libc::pthread_kill(self.0, kick_signal()) };
    }
}

/// Reports a vCPU's end (power-off, crash, failure) to the VM, once.
pub type EventSink = Box<dyn Fn(VcpuEvent) + Send>;

impl VcpuHandle {
    /// Start `vcpu`'s thread, paused if `paused` (a restore loads state
    /// first) or running. `on_event` hears how the guest's run ended.
    pub fn spawn(
        vcpu: Vcpu,
        devices: Arc<Devices>,
        paused: bool,
        on_event: EventSink,
    ) -> std::io::Result<VcpuHandle> {
        install_kick_handler()?;
        let index = vcpu.index() as usize;
        let (tx, thread_rx) = mpsc::channel();
        let (thread_tx, rx) = mpsc::channel();
        let initial = if paused {
            RunState::Paused
        } else {
            RunState::Running
        };
        let thread = crate::seccomp::spawn(
            crate::seccomp::Kind::Vcpu,
            format!("vcpu{index}"),
            move || {
                let mut t = VcpuThread {
                    vcpu,
                    devices,
                    state: initial,
                    on_event,
                };
                let run = std::panic::AssertUnwindSafe(|| t.main(thread_rx, thread_tx));
                if std::panic::catch_unwind(run).is_err() {
                    IMMEDIATE_EXIT.with(|p| p.set(std::ptr::null_mut()));
                    if let Some(b) = &t.vcpu.booster {
                        b.detach(index);
                    }
                    (t.on_event)(VcpuEvent::Panicked { vcpu: index });
                }
                crate::host::thread_cpu_us()
            },
        )?;
        Ok(VcpuHandle {
            index,
            tx,
            rx,
            thread: Some(thread),
        })
    }

    /// The vCPU's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Send `msg` and kick the thread; the reply comes from [`Self::reply`].
    pub fn send(&self, msg: VcpuMsg) {
        if self.tx.send(msg).is_ok() {
            self.kick();
        }
    }

    /// Wait for the reply to the last message sent. `None`: the thread has
    /// ended (it panicked).
    pub fn reply(&self) -> Option<VcpuReply> {
        self.rx.recv().ok()
    }

    /// Send `msg` and wait for its reply.
    pub fn request(&self, msg: VcpuMsg) -> Option<VcpuReply> {
        self.send(msg);
        self.reply()
    }

    fn kick(&self) {
        if let Some(t) = &self.thread {
            let _ = t.kill(kick_signal());
        }
    }

    /// Something that kicks this vCPU's thread from another thread (the
    /// throttle's ticker). It must not outlive this handle: the thread is
    /// joined when the handle stops, and a joined thread's id is stale.
    pub fn kicker(&self) -> Option<Kicker> {
        self.thread.as_ref().map(|t| Kicker(t.as_pthread_t()))
    }

    /// End the thread and wait for it: the host CPU time it used, in
    /// microseconds (`None` if it panicked).
    pub fn stop(mut self) -> Option<u64> {
        self.send(VcpuMsg::Stop);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for VcpuHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(VcpuMsg::Stop);
            let _ = t.kill(kick_signal());
            let _ = t.join();
        }
    }
}

/// What an exit asks for, with the borrow of the run structure released.
enum Next {
    Resume,
    Exit(u32),
    Reboot,
    Crash(String),
    /// KVM_EXIT_INTERNAL_ERROR: the suberror is read from the run structure.
    InternalError,
    /// KVM_EXIT_DIRTY_RING_FULL: harvest this vCPU's ring, then go on.
    RingFull,
}

struct VcpuThread {
    vcpu: Vcpu,
    devices: Arc<Devices>,
    state: RunState,
    on_event: EventSink,
}

impl VcpuThread {
    fn main(&mut self, rx: Receiver<VcpuMsg>, tx: Sender<VcpuReply>) {
        let run = self.vcpu.fd.get_kvm_run();
        IMMEDIATE_EXIT.with(|p| p.set(&mut run.immediate_exit));
        let index = self.vcpu.index as usize;
        if let Some(b) = &self.vcpu.booster {
            b.attach(index);
        }
        let mut slice_start = Instant::now();
        loop {
            let sleep = match (&self.vcpu.throttle, self.state) {
                (Some(t), RunState::Running) => t.due(index, &mut slice_start).map(|d| (t, d)),
                _ => None,
            };
            let msg = if let Some((throttle, d)) = sleep {
                // A throttled vCPU sleeps here, hearing messages at once.
                let asleep = Instant::now();
                let got = rx.recv_timeout(d);
                throttle.slept(index, asleep.elapsed());
                slice_start = Instant::now();
                match got {
                    Ok(m) => m,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else if self.state == RunState::Running {
                match rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Empty) => {
                        self.run_once();
                        continue;
                    }
                    Err(TryRecvError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                }
            };
            let reply = match msg {
                VcpuMsg::Stop => break,
                VcpuMsg::Pause => {
                    if self.state == RunState::Running {
                        self.finish_exit_in_flight();
                        if self.state == RunState::Running {
                            self.state = RunState::Paused;
                        }
                    }
                    VcpuReply::State(self.state)
                }
                VcpuMsg::Resume => {
                    if self.state == RunState::Paused {
                        self.state = RunState::Running;
                    }
                    VcpuReply::State(self.state)
                }
                VcpuMsg::Save => VcpuReply::Saved(match self.state {
                    RunState::Running => Err(StateError::NotPaused),
                    _ => self.vcpu.save_state().map(Box::new),
                }),
                VcpuMsg::Restore(s) => VcpuReply::Restored(match self.state {
                    RunState::Paused => self.vcpu.restore_state(&s),
                    _ => Err(StateError::NotPaused),
                }),
            };
            if tx.send(reply).is_err() {
                break;
            }
        }
        IMMEDIATE_EXIT.with(|p| p.set(std::ptr::null_mut()));
        if let Some(b) = &self.vcpu.booster {
            b.detach(index);
        }
    }

    /// One `KVM_RUN` and its exit.
    fn run_once(&mut self) {
        let vcpu = self.vcpu.index as usize;
        let next = match self.vcpu.fd.run() {
            Ok(exit) => dispatch(vcpu, exit, &self.devices),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                self.vcpu.fd.set_kvm_immediate_exit(0);
                Next::Resume
            }
            Err(error) => return self.end(VcpuEvent::Failed { vcpu, error }),
        };
        if let Some(b) = &self.vcpu.booster {
            b.on_exit(vcpu);
        }
        self.follow(next);
    }

    /// Complete the instruction of the last exit without running the guest.
    fn finish_exit_in_flight(&mut self) {
        let vcpu = self.vcpu.index as usize;
        while self.state == RunState::Running {
            self.vcpu.fd.set_kvm_immediate_exit(1);
            let next = match self.vcpu.fd.run() {
                Ok(exit) => dispatch(vcpu, exit, &self.devices),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => break,
                Err(error) => {
                    self.end(VcpuEvent::Failed { vcpu, error });
                    break;
                }
            };
            self.follow(next);
        }
        self.vcpu.fd.set_kvm_immediate_exit(0);
    }

    fn follow(&mut self, next: Next) {
        let vcpu = self.vcpu.index as usize;
        match next {
            Next::Resume => {}
            Next::RingFull => match &self.vcpu.rings {
                Some(r) => r.on_full(vcpu),
                None => self.end(VcpuEvent::Crash(GuestCrash {
                    vcpu,
                    reason: "a dirty-ring-full exit without dirty rings".into(),
                    registers: self.vcpu.dump(),
                })),
            },
            Next::Exit(code) => self.end(VcpuEvent::Exit { vcpu, code }),
            Next::Reboot => self.end(VcpuEvent::Reboot { vcpu }),
            Next::Crash(reason) => {
                let registers = self.vcpu.dump();
                self.end(VcpuEvent::Crash(GuestCrash {
                    vcpu,
                    reason,
                    registers,
                }));
            }
            Next::InternalError => {
                // SAFETY: KVM fills the `internal` member for this exit reason.
                let sub = unsafe {
                    self.vcpu
                        .fd
                        .get_kvm_run()
                        .__bindgen_anon_1
                        .internal
                        .suberror
                };
                let reason = format!(
                    "a KVM internal error (suberror {sub}): the instruction emulator could not continue"
                );
                let registers = self.vcpu.dump();
                self.end(VcpuEvent::Crash(GuestCrash {
                    vcpu,
                    reason,
                    registers,
                }));
            }
        }
    }

    fn end(&mut self, event: VcpuEvent) {
        self.state = RunState::Exited;
        (self.on_event)(event);
    }
}

fn dispatch(vcpu: usize, exit: VcpuExit<'_>, devices: &Devices) -> Next {
    match exit {
        VcpuExit::IoOut(port, data) => match devices.port_write(vcpu, port, data) {
            PortAction::Continue => Next::Resume,
            PortAction::Exit(code) => Next::Exit(code),
            PortAction::Reboot => Next::Reboot,
        },
        VcpuExit::IoIn(port, data) => {
            devices.port_read(port, data);
            Next::Resume
        }
        VcpuExit::MmioRead(addr, data) => {
            if !devices.mmio_read(addr, data) {
                tracing::debug!(vcpu, "read of unclaimed MMIO address {addr:#x}");
                data.fill(0xff);
            }
            Next::Resume
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !devices.mmio_write(addr, data) {
                tracing::debug!(vcpu, "write to unclaimed MMIO address {addr:#x} ignored");
            }
            Next::Resume
        }
        VcpuExit::Shutdown => Next::Crash("a triple fault (KVM_EXIT_SHUTDOWN)".into()),
        VcpuExit::InternalError => Next::InternalError,
        VcpuExit::FailEntry(reason, cpu) => Next::Crash(format!(
            "a failed VM entry (hardware reason {reason:#x} on host CPU {cpu}): the entry state is invalid"
        )),
        VcpuExit::Unsupported(kvm_bindings::KVM_EXIT_DIRTY_RING_FULL) => Next::RingFull,
        VcpuExit::Hlt => Next::Crash(
            "an unexpected HLT exit (the in-kernel irqchip should handle HLT)".into(),
        ),
        other => Next::Crash(format!("an unexpected exit: {other:?}")),
    }
}
