//! A VM's saved state: one versioned document of typed sections, each
//! CRC-checked, plus guest memory (docs/SNAPSHOT.md).
//!
//! A snapshot file ([`mod@file`]) carries it; a migration stream will carry the
//! same sections, so `hover restore` and the migration receiver build a VM
//! through one path ([`crate::Vm::restore`]).

mod error;
pub mod file;
mod index;
pub mod memory;

use std::path::PathBuf;

use kvm_bindings::{kvm_clock_data, kvm_irqchip};
use serde::{Deserialize, Serialize};

use crate::config::MemoryBackend;
use crate::devices::control::ControlState;
use crate::devices::pvio::PvioState;
use crate::devices::serial::UartState;
use crate::sched::halt_poll::HaltPoll;
use crate::vcpu::state::VcpuState;

/// What the VM was built from: enough to build the same VM again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedConfig {
    /// vCPUs.
    pub vcpus: u32,
    /// Guest RAM, bytes.
    pub memory: u64,
    /// How RAM was backed.
    pub memory_backend: MemoryBackend,
    /// The guest image's name (`builtin` or its path), for people.
    pub guest: String,
    /// The guest command line.
    pub cmdline: String,
    /// One past the guest image: memory below stays resident under paging.
    pub image_end: u64,
    /// Whether async page faults were offered.
    pub async_pf: bool,
    /// Halt polling as last set (at start or through the API).
    pub halt_poll: HaltPoll,
    /// Whether guest HLT exited to KVM.
    pub hlt_exits: bool,
    /// The memory budget and page-store latency, if memory was overcommitted.
    pub paging: Option<SavedPaging>,
    /// The I/O device's file, if the user named one.
    pub io_file: Option<PathBuf>,
    /// Per-vCPU dirty ring entries, if the VM has rings.
    pub dirty_ring: Option<u32>,
    /// vCPU priority boosting.
    pub boost: crate::sched::boost::BoostConfig,
}

/// Overcommit settings (the page store itself is not carried: a restored
/// VM makes a new one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPaging {
    /// Most guest RAM resident, bytes.
    pub budget: u64,
    /// Extra delay on every page-store read, nanoseconds.
    pub store_latency_ns: u64,
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
}

/// Everything but guest memory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VmState {
    /// What to build.
    pub config: SavedConfig,
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
