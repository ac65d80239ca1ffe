//! The VM's virtio I/O thread: it waits on every queue's notification
//! eventfd (written by KVM when the driver writes QueueNotify, through an
//! ioeventfd: no exit to user space), serves the queue, and raises the
//! device's interrupt ([`Interrupt`]: its irqfd, or while boosting is on an
//! edge raised here and the boost of the vCPU it reaches). It runs under
//! the `virtio` seccomp filter: it reads and writes disks and eventfds,
//! raises interrupts and boosts, and nothing else.
//! It passes a [`Gate`] for each batch of work, which a pause closes: a
//! paused VM's devices touch neither guest memory nor interrupts. Asked
//! to announce (a restored or arrived VM), it has each device announce
//! itself [`ANNOUNCE_ROUNDS`] times, further apart each time, as QEMU does:
//! a switch that missed the first still learns where the guest is.

use crate::sync::Locked;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use vm_superio::Trigger;

use super::mmio::MmioTransport;
use crate::devices::gate::Gate;
use crate::devices::irq_line::IrqTrigger;

/// One device as the I/O thread serves it.
pub struct Served {
    /// Its transport (shared with the vCPUs' register accesses).
    pub transport: Arc<Mutex<MmioTransport>>,
    /// One notification eventfd per queue.
    pub notify: Vec<EventFd>,
    /// Its interrupt.
    pub irq: Interrupt,
}

/// A device's interrupt, on its IOAPIC pin.
pub struct Interrupt {
    /// Its irqfd: what raises it while no boosting is on.
    pub irqfd: EventFd,
    /// The same pin raised by this thread, with the boost of its
    /// destination vCPU: what raises it while any boosting is on (an irqfd
    /// waits behind real-time vCPU threads, `devices::irq_line`).
    pub line: IrqTrigger,
}

impl Interrupt {
    fn raise(&self) {
        let raised = match self.line.boosting() {
            true => self.line.trigger(),
            false => self.irqfd.write(1),
        };
        if let Err(e) = raised {
            tracing::warn!("virtio I/O thread: interrupt not raised: {e}");
        }
    }
}

/// The running thread; stopped when dropped.
pub struct IoThread {
    stop: EventFd,
    /// Written to start the announcements.
    announce: EventFd,
    /// Set as it stops: a batch held at a closed gate is not served once
    /// the gate opens for the stop.
    stopping: Arc<AtomicBool>,
    gate: Arc<Gate>,
    thread: Option<JoinHandle<()>>,
}

/// The token of the stop eventfd (device tokens are `device << 16 | queue`,
/// a device's backend `device << 16 | BACKEND`).
const STOP: u64 = u64::MAX;
const ANNOUNCE: u64 = u64::MAX - 1;
const BACKEND: u64 = 0xffff;

/// How many times devices announce themselves (QEMU's default, 5).
pub const ANNOUNCE_ROUNDS: u32 = 5;

/// The wait before announcement `sent + 1` (QEMU's defaults: 50 ms, then
/// 100 ms more each time).
fn announce_gap(sent: u32) -> Duration {
    Duration::from_millis(50 + 100 * u64::from(sent.saturating_sub(1)))
}

impl IoThread {
    /// Start serving `devices`.
    pub fn start(devices: Vec<Served>) -> std::io::Result<IoThread> {
        let epoll = Epoll::new()?;
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        let announce = EventFd::new(libc::EFD_NONBLOCK)?;
        for (fd, token) in [(&stop, STOP), (&announce, ANNOUNCE)] {
            epoll.ctl(
                ControlOperation::Add,
                fd.as_raw_fd(),
                EpollEvent::new(EventSet::IN, token),
            )?;
        }
        for (d, dev) in devices.iter().enumerate() {
            let backend = dev.transport.locked().backend_fd();
            if let Some(fd) = backend {
                epoll.ctl(
                    ControlOperation::Add,
                    fd,
                    EpollEvent::new(
                        EventSet::IN | EventSet::EDGE_TRIGGERED,
                        ((d as u64) << 16) | BACKEND,
                    ),
                )?;
            }
            for (q, fd) in dev.notify.iter().enumerate() {
                let token = ((d as u64) << 16) | q as u64;
                epoll.ctl(
                    ControlOperation::Add,
                    fd.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, token),
                )?;
            }
        }
        let gate = Arc::new(Gate::default());
        let stopping = Arc::new(AtomicBool::new(false));
        let (passing, told) = (gate.clone(), stopping.clone());
        let asked = announce.try_clone()?;
        let thread =
            crate::seccomp::spawn(crate::seccomp::Kind::Virtio, "virtio".into(), move || {
                serve(&epoll, &devices, &asked, &passing, &told)
            })?;
        Ok(IoThread {
            stop,
            announce,
            stopping,
            gate,
            thread: Some(thread),
        })
    }

    /// Stop serving (a pause): returns once the work in progress is done.
    pub fn pause(&self) {
        self.gate.close();
    }

    /// Serve again.
    pub fn resume(&self) {
        self.gate.open();
    }

    /// Have every running device announce itself, now and
    /// [`ANNOUNCE_ROUNDS`] - 1 more times (again from the start if asked
    /// while announcing).
    pub fn announce(&self) {
        if let Err(e) = self.announce.write(1) {
            tracing::warn!("virtio I/O thread: announcements not asked for: {e}");
        }
    }
}

/// The announcements still to make, and when the next is due.
#[derive(Default)]
struct Announcing {
    sent: u32,
    next: Option<Instant>,
}

impl Announcing {
    /// Milliseconds until the next is due, as epoll's timeout (-1: none due).
    fn timeout_ms(&self) -> i32 {
        self.next.map_or(-1, |at| {
            at.saturating_duration_since(Instant::now())
                .as_millis()
                .min(i32::MAX as u128) as i32
        })
    }

    /// Whether one is due now; counts it and schedules the next.
    fn due(&mut self) -> bool {
        match self.next {
            Some(at) if at <= Instant::now() => {
                self.sent += 1;
                self.next =
                    (self.sent < ANNOUNCE_ROUNDS).then(|| Instant::now() + announce_gap(self.sent));
                true
            }
            _ => false,
        }
    }
}

fn serve(epoll: &Epoll, devices: &[Served], asked: &EventFd, gate: &Gate, stopping: &AtomicBool) {
    let mut events = vec![EpollEvent::default(); 32];
    let mut announcing = Announcing::default();
    loop {
        let timeout = devices
            .iter()
            .filter_map(|d| d.transport.locked().deadline())
            .map(|at| {
                at.saturating_duration_since(Instant::now())
                    .as_millis()
                    .min(i32::MAX as u128) as i32
            })
            .fold(
                announcing.timeout_ms(),
                |t, d| if t < 0 { d } else { t.min(d) },
            );
        let n = match epoll.wait(timeout, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!("virtio I/O thread: epoll failed: {e}; devices stop");
                return;
            }
        };
        if events[..n].iter().any(|ev| ev.data() == STOP) {
            return;
        }
        // Paused: wait here; what arrived meanwhile is served on resume
        // (the eventfds keep their counts, a tap keeps its frames).
        let _pass = gate.enter();
        if stopping.load(Ordering::Acquire) {
            return;
        }
        if events[..n].iter().any(|ev| ev.data() == ANNOUNCE) {
            let _ = asked.read();
            announcing = Announcing {
                sent: 0,
                next: Some(Instant::now()),
            };
        }
        if announcing.due() {
            for dev in devices {
                dev.transport.locked().announce();
            }
        }
        // Devices whose deadline passed (the balloon's statistics poll).
        for dev in devices {
            let mut transport = dev.transport.locked();
            if transport.deadline().is_some_and(|at| at <= Instant::now())
                && transport.backend_event()
            {
                drop(transport);
                dev.irq.raise();
            }
        }
        for ev in &events[..n] {
            let token = ev.data();
            if token == ANNOUNCE {
                continue;
            }
            let (d, q) = ((token >> 16) as usize, (token & 0xffff) as usize);
            let Some(dev) = devices.get(d) else { continue };
            let mut transport = dev.transport.locked();
            let interrupt = if q as u64 == BACKEND {
                transport.backend_event()
            } else {
                // Clear the count first: a notification arriving while the
                // queue is served wakes this loop again.
                let _ = dev.notify[q].read();
                transport.process(q)
            };
            drop(transport);
            if interrupt {
                dev.irq.raise();
            }
        }
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.stop.write(1);
        // A paused thread must get past its gate to see the stop.
        self.gate.open();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_come_five_times_further_apart_each_time() {
        let gaps: Vec<u64> = (1..ANNOUNCE_ROUNDS)
            .map(|n| announce_gap(n).as_millis() as u64)
            .collect();
        assert_eq!(gaps, vec![50, 150, 250, 350]);
        let mut a = Announcing::default();
        assert_eq!(a.timeout_ms(), -1, "none asked: wait for events only");
        assert!(!a.due());
        a.next = Some(Instant::now());
        let mut made = 0;
        for _ in 0..ANNOUNCE_ROUNDS {
            assert!(a.timeout_ms() <= 350);
            // Due once its time comes (made due here, not waited for).
            a.next = a.next.map(|_| Instant::now());
            assert!(a.due());
            made += 1;
            assert!(!a.due(), "not due again at once");
        }
        assert_eq!(made, ANNOUNCE_ROUNDS);
        assert_eq!(a.next, None, "done after five");
        assert_eq!(a.timeout_ms(), -1);
    }
}
