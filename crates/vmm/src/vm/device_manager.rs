//! The VM's devices, built once for a boot, a restore and an arriving
//! migration alike: the serial line and the control port (what the vCPU
//! threads dispatch port I/O to), the paravirtual I/O device, the MSI
//! injector behind the control port, and the record of what they write
//! into guest memory (a migration sends those pages again).

use std::sync::Arc;

use kvm_ioctls::VmFd;

use super::persist::{LoadError, Persist};
use crate::config::VmConfig;
use crate::devices::control::ControlDevice;
use crate::devices::msi::MsiInjector;
use crate::devices::pvio::PvioDevice;
use crate::devices::serial::{ConsoleSink, IrqTrigger, LineBoost, SerialConsole};
use crate::devices::Devices;
use crate::memory::host_writes::{GuestWriter, HostWrites};
use crate::memory::GuestRam;
use crate::sched::boost::Booster;
use crate::state::DevicesState;
use crate::Error;

/// The COM1 interrupt line on the IOAPIC.
const COM1_GSI: u32 = 4;

/// The devices of one VM.
pub(crate) struct DeviceManager {
    /// What the vCPU threads dispatch port I/O to.
    pub(crate) bus: Arc<Devices>,
    /// The paravirtual I/O device (MMIO pages and its worker).
    pub(crate) pvio: Arc<PvioDevice>,
    /// Every guest page the devices and monitors wrote, while recording.
    pub(crate) host_writes: Arc<HostWrites>,
}

impl DeviceManager {
    /// The booster every device nudges, and the devices of a VM on `fd`
    /// with guest RAM `ram` under `config`, its console going to `sink`.
    pub(crate) fn new(
        fd: &Arc<VmFd>,
        ram: &GuestRam,
        config: &VmConfig,
        tsc_khz: u32,
        sink: ConsoleSink,
    ) -> Result<(DeviceManager, Arc<Booster>), Error> {
        let host_writes = Arc::new(HostWrites::new(ram.end()));
        // How every device and monitor writes guest memory: recorded.
        let guest = GuestWriter::new(ram.memory().clone(), host_writes.clone());
        let vcpus = config.machine.vcpus;
        let booster = Booster::new(
            config.machine.boost,
            config.host.boost_tuning,
            guest.clone(),
            vcpus as usize,
            tsc_khz as u64,
        );
        let irq = IrqTrigger::new(fd.clone(), COM1_GSI).with_boost(LineBoost::new(
            booster.clone(),
            fd.clone(),
            COM1_GSI as usize,
        ));
        let serial = SerialConsole::new(irq, sink);
        let pvio = PvioDevice::new(
            fd,
            guest.clone(),
            vcpus,
            config.host.io_file.as_deref(),
            config.host.limits.io_file_bytes,
            Some(booster.clone()),
        )?;
        let msi = MsiInjector::new(fd.clone())
            .with_booster(booster.clone())
            .with_max_pending(config.host.limits.msi_pending);
        msi.start().map_err(|e| Error::Host {
            what: "start the MSI timer thread",
            source: std::io::Error::other(e.to_string()),
        })?;
        let control = ControlDevice::new(guest, Some(msi), vcpus)
            .with_limits(config.host.limits)
            .with_pvio(pvio.clone())
            .with_booster(booster.clone());
        let devices = DeviceManager {
            bus: Arc::new(Devices { serial, control }),
            pvio,
            host_writes,
        };
        Ok((devices, booster))
    }
}

impl Persist for DeviceManager {
    type State = DevicesState;

    fn save(&self) -> Result<DevicesState, String> {
        Ok(DevicesState {
            serial: self.bus.serial.state(),
            control: self.bus.control.state(),
            pvio: self.pvio.state(),
        })
    }

    fn load(&self, s: &DevicesState) -> Result<(), LoadError> {
        let unfit = |e| LoadError::Unfit("DEVS", e);
        self.bus.serial.restore(&s.serial).map_err(unfit)?;
        self.bus.control.restore(&s.control).map_err(unfit)?;
        self.pvio.restore(&s.pvio).map_err(|e| {
            LoadError::Host(Error::Host {
                what: "restore the I/O device",
                source: std::io::Error::other(e),
            })
        })
    }
}
