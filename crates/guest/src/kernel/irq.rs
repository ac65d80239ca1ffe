//! Interrupts for tasks: device vectors (MSIs from the monitor) wake the
//! task waiting for them on the vCPU they arrive at; IPIs between vCPUs.

use core::sync::atomic::{AtomicU64, Ordering};

use hover_abi::layout::MAX_VCPUS;
use hover_abi::vectors::{self, DEVICE_BASE, DEVICE_COUNT};

use crate::arch::nub;
use crate::arch::percpu::{this_cpu, PerCpu};
use crate::kernel::event::Event;

const X2APIC_ICR: u32 = 0x830;
const N: usize = DEVICE_COUNT as usize;

static EVENTS: [[Event; N]; MAX_VCPUS] = [const { [const { Event::new() }; N] }; MAX_VCPUS];
static COUNTS: [[AtomicU64; N]; MAX_VCPUS] =
    [const { [const { AtomicU64::new(0) }; N] }; MAX_VCPUS];

/// Hand the device interrupts the nub recorded to their waiting tasks;
/// whether there were any.
pub fn process_pending(pc: &PerCpu) -> bool {
    let cpu = pc.index();
    let mut any = false;
    for (w, word) in pc.pending_irqs.iter().enumerate() {
        let mut bits = word.swap(0, Ordering::AcqRel);
        while bits != 0 {
            let vector = (w * 64) as u32 + bits.trailing_zeros();
            bits &= bits - 1;
            if vectors::is_device(vector as u8) {
                let i = vector as usize - DEVICE_BASE as usize;
                COUNTS[cpu][i].fetch_add(1, Ordering::Relaxed);
                EVENTS[cpu][i].signal();
                any = true;
            }
        }
    }
    any
}

/// Do what device interrupt `vector` arriving on `cpu` (this vCPU) would
/// do for its waiting task, without the interrupt: the completion it
/// announces was seen by polling. Not counted as an interrupt.
pub fn signal_local(cpu: usize, vector: u8) {
    if vectors::is_device(vector) {
        EVENTS[cpu][(vector - DEVICE_BASE) as usize].signal();
    }
}

/// Block until device interrupt `vector` arrives at this vCPU (or has
/// arrived since the last wait).
pub fn wait(vector: u8) {
    assert!(
        vectors::is_device(vector),
        "vector {vector:#x} is not a device vector"
    );
    EVENTS[this_cpu().index()][(vector - DEVICE_BASE) as usize].wait();
}

/// Device interrupts `vector` has delivered on `cpu`.
pub fn count(cpu: usize, vector: u8) -> u64 {
    COUNTS[cpu][(vector - DEVICE_BASE) as usize].load(Ordering::Relaxed)
}

/// Send `vector` to `cpu` (x2APIC physical destination = vCPU index).
pub fn send_ipi(cpu: usize, vector: u8) {
    nub::wrmsr(X2APIC_ICR, ((cpu as u64) << 32) | vector as u64);
}
