//! A VM's saved state: one versioned document of typed sections, each
//! CRC-checked, plus guest memory (docs/SNAPSHOT.md).
//!
//! A snapshot file ([`mod@file`]) carries it, and a migration stream
//! carries the same sections, so `hover restore` and the migration receiver
//! build a VM through one path ([`crate::Vm::restore`]).

mod error;
pub mod file;
mod index;
pub mod memory;
mod version;

use kvm_bindings::{kvm_clock_data, kvm_irqchip};
use serde::{Deserialize, Serialize};

use crate::config::MachineConfig;
use crate::devices::control::ControlState;
use crate::devices::pvio::PvioState;
use crate::devices::serial::UartState;
use crate::vcpu::state::VcpuState;

/// What the VM was built as: its machine configuration and the one fact
/// learned while building it. The `CONF` section of a snapshot and the
/// first frame of a migration stream; it names no host resource.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedMachine {
    /// What the VM is (halt polling and boosting as last set).
    pub config: MachineConfig,
    /// One past the guest image: memory below stays resident under paging.
    pub image_end: u64,
}

/// VM-wide KVM state: the interrupt controllers and the clock.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MachineState {
    /// PIC master, PIC slave, IOAPIC (`KVM_GET_IRQCHIP` chips 0, 1, 2).
    pub irqchip: Vec<kvm_irqchip>,
    /// kvmclock, with the wall-clock time it was read at.
    pub clock: kvm_clock_data,
    /// The host TSC when the state was saved (context: the guest sees the
    /// time it spent saved as a TSC jump, which this host cannot hide).
    pub host_tsc: u64,
    /// The PIT, where the VM has one (Linux guests).
    pub pit: Option<kvm_bindings::kvm_pit_state2>,
}

/// The devices and the monitor's own state.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicesState {
    /// COM1.
    pub serial: UartState,
    /// The control port: reports received, MSIs pending.
    pub control: ControlState,
    /// The paravirtual I/O device.
    pub pvio: PvioState,
    /// Each virtio device's transport, in bus order (Linux guests).
    pub virtio: Vec<crate::devices::virtio::mmio::MmioState>,
}

/// Everything but guest memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmState {
    /// What to build.
    pub config: SavedMachine,
    /// Each vCPU, by index.
    pub vcpus: Vec<VcpuState>,
    /// Interrupt controllers and clock.
    pub machine: MachineState,
    /// Devices and monitor state.
    pub devices: DevicesState,
}

/// The host TSC now.
pub fn host_tsc() -> u64 {
    // SAFETY: rdtsc has no side effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}
