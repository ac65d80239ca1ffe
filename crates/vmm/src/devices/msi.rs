//! Injecting MSIs into the guest (`KVM_SIGNAL_MSI`), now or after a delay.
//! Delayed injections wait on one helper thread, ordered by due time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvm_bindings::kvm_msi;
use kvm_ioctls::VmFd;

/// Base of the x86 MSI address window; the destination APIC id goes in bits 12-19.
const MSI_ADDRESS_BASE: u32 = 0xfee0_0000;

/// Sends MSIs to vCPUs.
pub struct MsiInjector {
    vm: Arc<VmFd>,
    delayed: Mutex<Option<Sender<(Instant, u8, u8)>>>,
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
            delayed: Mutex::new(None),
        }
    }

    /// Raise `vector` on vCPU `dest` after `delay` (at once if zero).
    pub fn inject_after(&self, dest: u8, vector: u8, delay: Duration) -> Result<(), String> {
        if delay.is_zero() {
            return signal(&self.vm, dest, vector)
                .map_err(|e| format!("KVM_SIGNAL_MSI failed: {e}"));
        }
        let mut tx = self.delayed.lock().unwrap_or_else(|p| p.into_inner());
        if tx.is_none() {
            *tx = Some(
                spawn_timer_thread(self.vm.clone())
                    .map_err(|e| format!("cannot start the MSI thread: {e}"))?,
            );
        }
        let due = Instant::now() + delay;
        tx.as_ref()
            .expect("set above")
            .send((due, dest, vector))
            .map_err(|_| "the MSI thread has stopped".to_string())
    }
}

fn spawn_timer_thread(vm: Arc<VmFd>) -> std::io::Result<Sender<(Instant, u8, u8)>> {
    let (tx, rx) = mpsc::channel::<(Instant, u8, u8)>();
    thread::Builder::new()
        .name("msi-timer".into())
        .spawn(move || {
            let mut pending: BinaryHeap<Reverse<(Instant, u8, u8)>> = BinaryHeap::new();
            loop {
                let wait = pending
                    .peek()
                    .map(|Reverse((due, _, _))| due.saturating_duration_since(Instant::now()));
                let msg = match wait {
                    Some(w) => rx.recv_timeout(w),
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                };
                match msg {
                    Ok(item) => pending.push(Reverse(item)),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                while pending
                    .peek()
                    .is_some_and(|Reverse((due, _, _))| *due <= Instant::now())
                {
                    let Reverse((_, dest, vector)) = pending.pop().expect("peeked");
                    if let Err(e) = signal(&vm, dest, vector) {
                        tracing::warn!("delayed MSI {vector:#x} to vCPU {dest} failed: {e}");
                    }
                }
            }
        })?;
    Ok(tx)
}
