//! An edge on one pin of the in-kernel IOAPIC, raised with `KVM_IRQ_LINE`
//! by the thread that has the interrupt to give (the serial port's vCPU or
//! console thread, the virtio I/O thread while boosting is on), and the
//! boost of the vCPU the guest routed that pin to, right after.
//!
//! Not an irqfd: KVM injects an irqfd on an IOAPIC pin from a kernel worker
//! queued on the writer's CPU, and that worker waits behind a vCPU thread
//! running real-time there (static RT, a boost) until that vCPU halts: the
//! serial line measured twice as slow with any boosting
//! (docs/BENCHMARKS.md). `KVM_IRQ_LINE` injects in the caller.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvm_ioctls::VmFd;
use vm_superio::Trigger;

use crate::arch::x86_64::ioapic;
use crate::sched::boost::Booster;

/// Raises an interrupt: an edge on one IOAPIC pin (and the boost, if any).
pub struct IrqTrigger {
    line: Line,
    boost: Option<LineBoost>,
}

/// Where an edge goes.
enum Line {
    /// An in-kernel IOAPIC pin, asserted and released by `KVM_IRQ_LINE`.
    Kvm { vm: Arc<VmFd>, gsi: u32 },
    /// Counted, for the UART's own tests (no VM).
    #[cfg(test)]
    Counted(Arc<std::sync::atomic::AtomicU64>),
}

impl Line {
    fn raise(&self) -> io::Result<()> {
        match self {
            Line::Kvm { vm, gsi } => {
                // An edge: the IOAPIC latches the rising side; the release
                // lets the next raise be an edge again.
                vm.set_irq_line(*gsi, true)
                    .and_then(|()| vm.set_irq_line(*gsi, false))
                    .map_err(|e| io::Error::from_raw_os_error(e.errno()))
            }
            #[cfg(test)]
            Line::Counted(n) => {
                n.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn try_clone(&self) -> Line {
        match self {
            Line::Kvm { vm, gsi } => Line::Kvm {
                vm: vm.clone(),
                gsi: *gsi,
            },
            #[cfg(test)]
            Line::Counted(n) => Line::Counted(n.clone()),
        }
    }
}

/// Boosting the vCPU an IOAPIC pin is routed to, as the pin is raised.
pub struct LineBoost {
    booster: Arc<Booster>,
    /// To read the pin's route (the guest changes it without exits).
    vm: Arc<VmFd>,
    pin: usize,
    /// A failure to read the route was logged (once is enough).
    warned: AtomicBool,
}

impl LineBoost {
    /// Boost through `booster` the vCPUs that IOAPIC pin `pin` (< 24) of
    /// `vm` is routed to.
    pub fn new(booster: Arc<Booster>, vm: Arc<VmFd>, pin: usize) -> Self {
        assert!(pin < ioapic::PINS, "IOAPIC pin {pin} does not exist");
        LineBoost {
            booster,
            vm,
            pin,
            warned: AtomicBool::new(false),
        }
    }

    fn boost_destinations(&self) {
        if !self.booster.boosts_interrupts() {
            return;
        }
        match ioapic::entry(&self.vm, self.pin) {
            Ok(entry) => {
                for v in ioapic::destinations(entry, self.booster.vcpus()) {
                    self.booster.on_interrupt(v);
                }
            }
            Err(e) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "cannot read the IOAPIC's route of GSI {} ({e}); its interrupts are not boosted",
                        self.pin
                    );
                }
            }
        }
    }
}

impl LineBoost {
    fn try_clone(&self) -> LineBoost {
        LineBoost::new(self.booster.clone(), self.vm.clone(), self.pin)
    }
}

impl IrqTrigger {
    /// Another trigger of the same line (and boost).
    pub fn try_clone(&self) -> io::Result<IrqTrigger> {
        Ok(IrqTrigger {
            line: self.line.try_clone(),
            boost: self.boost.as_ref().map(LineBoost::try_clone),
        })
    }

    /// A trigger raising edges on pin `gsi` of `vm`'s in-kernel IOAPIC.
    pub fn new(vm: Arc<VmFd>, gsi: u32) -> Self {
        IrqTrigger {
            line: Line::Kvm { vm, gsi },
            boost: None,
        }
    }

    /// A trigger counting its raises in `n` (tests without a VM).
    #[cfg(test)]
    pub(crate) fn counted(n: Arc<std::sync::atomic::AtomicU64>) -> Self {
        IrqTrigger {
            line: Line::Counted(n),
            boost: None,
        }
    }

    /// Boost the line's destination vCPU with each interrupt.
    pub fn with_boost(mut self, boost: LineBoost) -> Self {
        self.boost = Some(boost);
        self
    }
}

impl IrqTrigger {
    /// Whether a boost follows this line's edges now (any boosting on):
    /// an interrupt source with an irqfd too raises through this instead.
    pub fn boosting(&self) -> bool {
        self.boost.as_ref().is_some_and(|b| b.booster.active())
    }
}

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        let raised = self.line.raise();
        // After the wake-up: see `Booster::on_interrupt`.
        if let Some(b) = &self.boost {
            b.boost_destinations();
        }
        raised
    }
}
