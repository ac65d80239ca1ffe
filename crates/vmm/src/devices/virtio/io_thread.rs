//! The VM's virtio I/O thread: it waits on every queue's notification
//! eventfd (written by KVM when the driver writes QueueNotify, through an
//! ioeventfd: no exit to user space), serves the queue, and raises the
//! device's interrupt through its irqfd. It runs under the `virtio`
//! seccomp filter: it reads and writes disks and eventfds, and nothing else.
//! It passes a [`Gate`] for each batch of work, which a pause closes: a
//! paused VM's devices touch neither guest memory nor interrupts.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::MmioTransport;
use crate::devices::gate::Gate;

/// One device as the I/O thread serves it.
pub struct Served {
    /// Its transport (shared with the vCPUs' register accesses).
    pub transport: Arc<Mutex<MmioTransport>>,
    /// One notification eventfd per queue.
    pub notify: Vec<EventFd>,
    /// Its interrupt (an irqfd on its IOAPIC pin).
    pub irq: EventFd,
}

/// The running thread; stopped when dropped.
pub struct IoThread {
    stop: EventFd,
    /// Set as it stops: a batch held at a closed gate is not served once
    /// the gate opens for the stop.
    stopping: Arc<AtomicBool>,
    gate: Arc<Gate>,
    thread: Option<JoinHandle<()>>,
}

/// The token of the stop eventfd (device tokens are `device << 16 | queue`,
/// a device's backend `device << 16 | BACKEND`).
const STOP: u64 = u64::MAX;
const BACKEND: u64 = 0xffff;

impl IoThread {
    /// Start serving `devices`.
    pub fn start(devices: Vec<Served>) -> std::io::Result<IoThread> {
        let epoll = Epoll::new()?;
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        epoll.ctl(
            ControlOperation::Add,
            stop.as_raw_fd(),
            EpollEvent::new(EventSet::IN, STOP),
        )?;
        for (d, dev) in devices.iter().enumerate() {
            let backend = dev
                .transport
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .backend_fd();
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
        let thread =
            crate::seccomp::spawn(crate::seccomp::Kind::Virtio, "virtio".into(), move || {
                serve(&epoll, &devices, &passing, &told)
            })?;
        Ok(IoThread {
            stop,
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
}

fn serve(epoll: &Epoll, devices: &[Served], gate: &Gate, stopping: &AtomicBool) {
    let mut events = vec![EpollEvent::default(); 32];
    loop {
        let n = match epoll.wait(-1, &mut events) {
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
        for ev in &events[..n] {
            let token = ev.data();
            let (d, q) = ((token >> 16) as usize, (token & 0xffff) as usize);
            let Some(dev) = devices.get(d) else { continue };
            let mut transport = dev.transport.lock().unwrap_or_else(|p| p.into_inner());
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
                if let Err(e) = dev.irq.write(1) {
                    tracing::warn!("virtio I/O thread: interrupt not raised: {e}");
                }
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
