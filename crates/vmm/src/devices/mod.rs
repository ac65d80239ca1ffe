//! The VM's devices. On the I/O port bus ([`Devices`]): the serial console
//! (`serial`; `console_in` types standard input to it; its interrupt an
//! `irq_line`, as virtio's are while boosting is on), the control port
//! (`control`: the built-in guest's requests, bounded by `limits`, and the
//! delayed MSIs it asks for, `msi`), and for Linux guests the ACPI
//! power-management port (power-off and reset) and the keyboard
//! controller's reset line. On MMIO: the paravirtual I/O device (`pvio`)
//! and a Linux guest's virtio devices (`virtio`: disks, network cards,
//! entropy, the balloon). `gate` is how a pause stops the devices that run
//! on threads of their own; `state_error` is why a device refused a saved
//! state, `host_file` why a file given for a device cannot serve it.

pub mod console_in;
pub mod control;
pub mod gate;
pub mod host_file;
pub mod irq_line;
pub mod limits;
pub mod msi;
pub mod pvio;
pub mod serial;
pub mod state_error;
pub mod virtio;

use hover_abi::control::CONTROL_PORT;

use crate::arch::x86_64::acpi::{pm_request, PmRequest, ACPI_PM_PORT};

use control::{ControlAction, ControlDevice};
use serial::SerialConsole;

/// First I/O port of COM1.
pub const COM1_BASE: u16 = 0x3f8;
/// Number of COM1 registers.
pub const COM1_LEN: u16 = 8;
/// The i8042 keyboard controller's data and command/status ports.
const I8042_DATA: u16 = 0x60;
const I8042_COMMAND: u16 = 0x64;
/// The i8042 command that pulses the CPU's reset line (Linux's `reboot=k`).
const I8042_RESET: u8 = 0xfe;

/// The VM's devices, shared by all vCPU threads.
pub struct Devices {
    /// COM1.
    pub serial: SerialConsole,
    /// The control port.
    pub control: ControlDevice,
    /// Virtio devices on the MMIO bus (Linux guests).
    pub virtio: Vec<virtio::VirtioSlot>,
}

/// What a vCPU should do after a port access.
#[derive(Debug, PartialEq, Eq)]
pub enum PortAction {
    /// Resume the guest.
    Continue,
    /// The guest asked to power off with this code.
    Exit(u32),
    /// The guest asked to reset the machine (ACPI reset register, i8042).
    Reboot,
}

impl Devices {
    /// Handle a read in MMIO space: whether a device claimed it.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.virtio.iter().find(|d| d.claims(addr)) {
            Some(d) => {
                d.read(addr, data);
                true
            }
            None => false,
        }
    }

    /// Handle a write in MMIO space: whether a device claimed it.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> bool {
        match self.virtio.iter().find(|d| d.claims(addr)) {
            Some(d) => {
                d.write(addr, data);
                true
            }
            None => false,
        }
    }

    /// Handle `out` to `port` from vCPU `vcpu`.
    pub fn port_write(&self, vcpu: usize, port: u16, data: &[u8]) -> PortAction {
        if (COM1_BASE..COM1_BASE + COM1_LEN).contains(&port) {
            if let Some(&byte) = data.first() {
                self.serial.write((port - COM1_BASE) as u8, byte);
            }
        } else if port == ACPI_PM_PORT && data.len() == 1 {
            match pm_request(data[0]) {
                PmRequest::PowerOff => return PortAction::Exit(0),
                PmRequest::Reset => return PortAction::Reboot,
                PmRequest::Ignored => {}
            }
        } else if port == I8042_COMMAND && data.first() == Some(&I8042_RESET) {
            return PortAction::Reboot;
        } else if port == CONTROL_PORT && data.len() == 4 {
            let gpa = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            if let ControlAction::Exit(code) = self.control.handle(vcpu, gpa as u64) {
                return PortAction::Exit(code);
            }
        } else {
            tracing::debug!(
                vcpu,
                port,
                len = data.len(),
                "write to an unclaimed I/O port ignored"
            );
        }
        PortAction::Continue
    }

    /// Handle `in` from `port`; unclaimed ports read as all ones, like a bus with nothing on it.
    pub fn port_read(&self, port: u16, data: &mut [u8]) {
        if (COM1_BASE..COM1_BASE + COM1_LEN).contains(&port) {
            if let Some(b) = data.first_mut() {
                *b = self.serial.read((port - COM1_BASE) as u8);
            }
        } else if port == I8042_COMMAND || port == I8042_DATA || port == ACPI_PM_PORT {
            // The controller is idle (its buffers empty: a reset command is
            // taken at once); the PM port's sleep status reads as not waking.
            data.fill(0);
        } else if port == CONTROL_PORT && data.len() == 4 {
            data.copy_from_slice(&hover_abi::control::CONTROL_ABI_REVISION.to_le_bytes());
        } else {
            data.fill(0xff);
        }
    }
}
