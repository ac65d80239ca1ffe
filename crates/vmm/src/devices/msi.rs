//! Injecting MSIs into the guest (`KVM_SIGNAL_MSI`), now or after a delay.
//! Delayed injections wait on one helper thread, ordered by due time. While
//! the VM is paused the timers are frozen (nothing is delivered); their
//! remaining delays are part of the VM's saved state.

use crate::sync::{wait_timeout, Locked};
use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use std::cmp::Reverse;

use kvm_bindings::kvm_msi;

use crate::sched::boost::Booster;
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

/// Base of the x86 MSI address window; the destination APIC id goes in bits 12-19.
const MSI_ADDRESS_BASE: u32 = 0xfee0_0000;

/// An MSI waiting for its time, as saved: how long it still had to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingMsi {
    /// Nanoseconds left until it is due.
    pub remaining_ns: u64,
    /// Destination vCPU.
    pub dest: u8,
    /// Vector.
    pub vector: u8,
}

#[derive(Default)]
struct Timers {
    pending: BinaryHeap<Reverse<(Instant, u8, u8)>>,
    frozen: bool,
    stop: bool,
    thread: bool,
}

#[derive(Default)]
struct Shared {
    timers: Mutex<Timers>,
    changed: Condvar,
    /// Boosts the destination vCPU just after each injection (dynamic boosting).
    booster: Option<Arc<Booster>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Timers> {
        self.timers.locked()
    }
}

/// Sends MSIs to vCPUs.
pub struct MsiInjector {
    vm: Arc<VmFd>,
    shared: Arc<Shared>,
    max_pending: usize,
    /// The delivery thread, joined when the injector goes.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Why an MSI was not injected.
#[derive(Debug, PartialEq, Eq)]
pub enum InjectError {
    /// This many delayed MSIs already wait: the limit.
    Full(usize),
    /// The host failed.
    Host(String),
}

impl std::fmt::Display for InjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InjectError::Full(n) => write!(f, "{n} delayed MSIs already wait (the limit)"),
            InjectError::Host(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for InjectError {}

impl From<InjectError> for String {
    fn from(e: InjectError) -> String {
        e.to_string()
    }
}

/// Raise `vector` on the vCPU whose APIC id is `dest` (fixed delivery, physical destination).
pub fn signal(vm: &VmFd, dest: u8, vector: u8) -> Result<(), kvm_ioctls::Error> {
    let msi = kvm_msi {
        address_lo: MSI_ADDRESS_BASE | (dest as u32) << 12,
        address_hi: 0,
        data: vector as u32,
        ..Default::default()
    };
    vm.signal_msi(msi).map(|_| ())
}

impl MsiInjector {
    /// An injector for `vm`; the helper thread starts with the first delayed request.
    pub fn new(vm: Arc<VmFd>) -> Self {
        MsiInjector {
            vm,
            shared: Arc::default(),
            max_pending: crate::devices::limits::GuestLimits::default().msi_pending as usize,
            thread: Mutex::new(None),
        }
    }

    /// Keep at most `n` delayed MSIs waiting; more are refused.
    pub fn with_max_pending(mut self, n: u32) -> Self {
        self.max_pending = n as usize;
        self
    }

    /// Boost each destination vCPU with `booster` as it is injected into.
    pub fn with_booster(mut self, booster: Arc<Booster>) -> Self {
        self.shared = Arc::new(Shared {
            booster: Some(booster),
            ..Default::default()
        });
        self
    }

    /// Raise `vector` on vCPU `dest` after `delay` (at once if zero).
    pub fn inject_after(&self, dest: u8, vector: u8, delay: Duration) -> Result<(), InjectError> {
        if delay.is_zero() {
            let sent = signal(&self.vm, dest, vector)
                .map_err(|e| InjectError::Host(format!("KVM_SIGNAL_MSI failed: {e}")));
            // After the wake-up: see `Booster::on_interrupt`.
            if let Some(b) = &self.shared.booster {
                b.on_interrupt(dest as usize);
            }
            return sent;
        }
        let mut t = self.start_locked()?;
        if t.pending.len() >= self.max_pending {
            return Err(InjectError::Full(t.pending.len()));
        }
        t.pending
            .push(Reverse((Instant::now() + delay, dest, vector)));
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Start the delivery thread now, from the VM's own thread (so that it
    /// gets the timer's seccomp filter, not that of the vCPU whose request
    /// would otherwise start it).
    pub fn start(&self) -> Result<(), InjectError> {
        self.start_locked().map(|_| ())
    }

    fn start_locked(&self) -> Result<MutexGuard<'_, Timers>, InjectError> {
        let mut t = self.shared.lock();
        if !t.thread {
            let (vm, shared) = (self.vm.clone(), self.shared.clone());
            let h =
                crate::seccomp::spawn(crate::seccomp::Kind::Timer, "msi-timer".into(), move || {
                    timer_loop(&vm, &shared)
                })
                .map_err(|e| InjectError::Host(format!("cannot start the MSI thread: {e}")))?;
            *self.thread.locked() = Some(h);
            t.thread = true;
        }
        Ok(t)
    }

    /// Stop delivering (the VM pauses); returns once no delivery is under way.
    pub fn freeze(&self) {
        self.shared.lock().frozen = true;
    }

    /// Deliver again; what fell due meanwhile is delivered at once.
    pub fn thaw(&self) {
        self.shared.lock().frozen = false;
        self.shared.changed.notify_all();
    }

    /// The MSIs still waiting, with the time each has left.
    pub fn pending(&self) -> Vec<PendingMsi> {
        let now = Instant::now();
        let mut v: Vec<PendingMsi> = self
            .shared
            .lock()
            .pending
            .iter()
            .map(|Reverse((due, dest, vector))| PendingMsi {
                remaining_ns: due.saturating_duration_since(now).as_nanos() as u64,
                dest: *dest,
                vector: *vector,
            })
            .collect();
        v.sort_by_key(|p| p.remaining_ns);
        v
    }
}

impl Drop for MsiInjector {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.locked().take() {
            let _ = t.join();
        }
    }
}

fn timer_loop(vm: &VmFd, shared: &Shared) {
    let mut t = shared.lock();
    loop {
        if t.stop {
            return;
        }
        let now = Instant::now();
        // Delivery happens under the lock, so freeze() returning means none is under way.
        while !t.frozen
            && t.pending
                .peek()
                .is_some_and(|Reverse((due, _, _))| *due <= now)
        {
            let Reverse((_, dest, vector)) = t.pending.pop().expect("peeked");
            if let Err(e) = signal(vm, dest, vector) {
                tracing::warn!("delayed MSI {vector:#x} to vCPU {dest} failed: {e}");
            }
            if let Some(b) = &shared.booster {
                b.on_interrupt(dest as usize);
            }
        }
        let wait = match t.pending.peek() {
            Some(Reverse((due, _, _))) if !t.frozen => due.saturating_duration_since(now),
            _ => Duration::from_secs(3600),
        };
        t = wait_timeout(&shared.changed, t, wait).0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delayed_msis_past_the_pending_limit_are_refused() {
        if !crate::host::kvm_for_test("delayed_msis_past_the_pending_limit_are_refused") {
            return;
        }
        let vm = Arc::new(kvm_ioctls::Kvm::new().unwrap().create_vm().unwrap());
        let msi = MsiInjector::new(vm).with_max_pending(2);
        let later = Duration::from_secs(10);
        msi.inject_after(0, 0x40, later).unwrap();
        msi.inject_after(0, 0x41, later).unwrap();
        assert_eq!(msi.inject_after(0, 0x42, later), Err(InjectError::Full(2)));
        assert_eq!(msi.pending().len(), 2, "the refused one was not queued");
    }
}
