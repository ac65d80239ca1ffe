//! What a snapshot or a migration carries of a VM besides its memory, one
//! piece at a time, each piece's save and load side by side ([`Persist`],
//! as Firecracker's `Persist` beside each device): the interrupt
//! controllers and the clock here, the devices in `device_manager.rs`,
//! each vCPU in `vcpu/state.rs` (saved and loaded on its own thread).
//! `save.rs` gathers the pieces into a [`crate::state::VmState`];
//! `restore.rs` loads them back in the order this KVM needs: irqchip, each
//! vCPU, the clock, the devices.

use kvm_bindings::{kvm_clock_data, kvm_irqchip, kvm_pit_state2, KVM_CLOCK_REALTIME};
use kvm_ioctls::VmFd;

use crate::{Error, KvmOp};

/// Why a saved configuration or state could not be taken up.
pub(crate) enum LoadError {
    /// Its section does not fit this host or build.
    Unfit(&'static str, String),
    /// The host failed.
    Host(Error),
}

impl From<Error> for LoadError {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(c) => LoadError::Unfit("CONF", c.to_string()),
            other => LoadError::Host(other),
        }
    }
}

/// A piece of a VM that is saved and loaded as a whole.
pub(crate) trait Persist {
    /// What is saved.
    type State;

    /// Its state now (the VM is paused).
    fn save(&self) -> Result<Self::State, Error>;

    /// Put `state` back (the VM is built and not running). A state that
    /// does not fit is [`LoadError::Unfit`], naming its snapshot section.
    fn load(&self, state: &Self::State) -> Result<(), LoadError>;
}

/// The in-kernel interrupt controllers: both PICs and the IOAPIC.
pub(crate) struct Irqchips<'a>(pub(crate) &'a VmFd);

/// KVM's chip ids: PIC master, PIC slave, IOAPIC.
const IRQCHIPS: u32 = 3;

impl Persist for Irqchips<'_> {
    type State = Vec<kvm_irqchip>;

    fn save(&self) -> Result<Vec<kvm_irqchip>, Error> {
        (0..IRQCHIPS)
            .map(|chip_id| {
                let mut c = kvm_irqchip {
                    chip_id,
                    ..Default::default()
                };
                self.0
                    .get_irqchip(&mut c)
                    .map_err(KvmOp::GetIrqchip.err())?;
                Ok(c)
            })
            .collect()
    }

    fn load(&self, chips: &Vec<kvm_irqchip>) -> Result<(), LoadError> {
        for chip in chips {
            self.0
                .set_irqchip(chip)
                .map_err(|e| LoadError::Host(KvmOp::SetIrqchip.err()(e)))?;
        }
        Ok(())
    }
}

/// kvmclock, the guest's view of time.
pub(crate) struct Clock<'a>(pub(crate) &'a VmFd);

impl Persist for Clock<'_> {
    type State = kvm_clock_data;

    fn save(&self) -> Result<kvm_clock_data, Error> {
        self.0.get_clock().map_err(KvmOp::GetClock.err())
    }

    fn load(&self, saved: &kvm_clock_data) -> Result<(), LoadError> {
        // Keep kvmclock in step with wall time across the gap, where KVM can.
        let mut clock = *saved;
        clock.flags &= KVM_CLOCK_REALTIME;
        self.0
            .set_clock(&clock)
            .map_err(|e| LoadError::Host(KvmOp::SetClock.err()(e)))
    }
}

/// The in-kernel PIT (Linux guests have one; its channels and their
/// counting state).
pub(crate) struct Pit<'a>(pub(crate) &'a VmFd);

impl Persist for Pit<'_> {
    type State = kvm_pit_state2;

    fn save(&self) -> Result<kvm_pit_state2, Error> {
        self.0.get_pit2().map_err(KvmOp::GetPit.err())
    }

    fn load(&self, saved: &kvm_pit_state2) -> Result<(), LoadError> {
        self.0
            .set_pit2(saved)
            .map_err(|e| LoadError::Host(KvmOp::SetPit.err()(e)))
    }
}
