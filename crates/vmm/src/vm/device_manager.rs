//! The VM's devices, built once for a boot, a restore and an arriving
//! migration alike: the serial line and the control port (what the vCPU
//! threads dispatch port I/O to), the paravirtual I/O device, the MSI
//! injector behind the control port, and the record of what they write
//! into guest memory (a migration sends those pages again).

use crate::sync::Locked;
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, VmFd};
use virtio_bindings::virtio_mmio::VIRTIO_MMIO_QUEUE_NOTIFY;
use vmm_sys_util::eventfd::EventFd;

use super::persist::{LoadError, Persist};
use crate::config::{ConfigError, ConsoleTarget, VmConfig};
use crate::devices::console_in::ConsoleInput;
use crate::devices::control::ControlDevice;
use crate::devices::irq_line::{IrqTrigger, LineBoost};
use crate::devices::msi::MsiInjector;
use crate::devices::pvio::PvioDevice;
use crate::devices::serial::{ConsoleSink, SerialConsole};
use crate::devices::state_error::StateError;
use crate::devices::virtio::balloon::{Balloon, BalloonControl, BalloonReport};
use crate::devices::virtio::block::{open_disk, Block};
use crate::devices::virtio::io_thread::{Interrupt, IoThread, Served};
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::virtio::net::{open_tap, Net};
use crate::devices::virtio::rng::Rng;
use crate::devices::virtio::{self, VirtioDevice, VirtioSlot};
use crate::devices::Devices;
use crate::memory::discard::Discarder;
use crate::memory::host_writes::{DeviceMemory, GuestWriter, HostWrites};
use crate::memory::paged::PagerDiscard;
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
    /// The virtio devices' I/O thread (Linux guests with devices).
    virtio_io: Option<IoThread>,
    /// Each disk's size, in the order of the configuration's disks.
    disk_sizes: Vec<u64>,
    /// The balloon's control.
    balloon: Option<Arc<BalloonControl>>,
    /// How the balloon drops pages (told of the pager when there is one).
    discarder: Arc<Discarder>,
    /// Whether standard input is typed to the console (`--console stdio`).
    stdio: bool,
    /// The thread doing it, while the VM runs.
    console_in: Option<ConsoleInput>,
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
        // The virtio devices' view of guest RAM, whose writes are recorded too.
        let device_memory = DeviceMemory::new(ram.memory()).map_err(|source| Error::Host {
            what: "map guest memory for the devices",
            source,
        })?;
        let host_writes = Arc::new(HostWrites::with_devices(ram.end(), device_memory.clone()));
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
        let discarder =
            Arc::new(
                Discarder::new(ram, host_writes.clone()).map_err(|source| Error::Host {
                    what: "find guest memory for the balloon",
                    source,
                })?,
            );
        let balloon = match &config.machine.balloon {
            Some(b) => Some(
                BalloonControl::new(b, ram.size()).map_err(|source| Error::Host {
                    what: "make the balloon's eventfd",
                    source,
                })?,
            ),
            None => None,
        };
        let extra = Extra {
            balloon: balloon.clone(),
            discarder: discarder.clone(),
            booster: booster.clone(),
        };
        let (virtio, virtio_io, disk_sizes) = virtio_devices(fd, &device_memory, config, extra)?;
        let devices = DeviceManager {
            bus: Arc::new(Devices {
                serial,
                control,
                virtio,
            }),
            pvio,
            host_writes,
            virtio_io,
            disk_sizes,
            balloon,
            discarder,
            stdio: matches!(config.host.console, ConsoleTarget::Stdio),
            console_in: None,
        };
        Ok((devices, booster))
    }

    /// With `--console stdio`, start typing standard input to COM1;
    /// `quit` ends the VM (Ctrl-A x).
    pub(crate) fn start_console_input(&mut self, quit: Box<dyn Fn() + Send>) -> Result<(), Error> {
        if self.stdio && self.console_in.is_none() {
            let input = ConsoleInput::start(libc::STDIN_FILENO, self.bus.clone(), quit).map_err(
                |source| Error::Host {
                    what: "read the console from standard input",
                    source,
                },
            )?;
            self.console_in = Some(input);
        }
        Ok(())
    }

    /// Freeze the devices that run on their own (a pause): the control
    /// port's timers and I/O device, the virtio I/O thread.
    pub(crate) fn pause(&self) {
        self.bus.control.pause();
        if let Some(io) = &self.virtio_io {
            io.pause();
        }
        if let Some(c) = &self.console_in {
            c.pause();
        }
    }

    /// Undo [`Self::pause`].
    pub(crate) fn resume(&self) {
        if let Some(c) = &self.console_in {
            c.resume();
        }
        if let Some(io) = &self.virtio_io {
            io.resume();
        }
        self.bus.control.resume();
    }

    /// From now on the balloon drops pages the pager serves through it
    /// (`None`: no pager, or it let guest memory go).
    pub(crate) fn attach_pager(&self, pager: Option<PagerDiscard>) {
        self.discarder.attach_pager(pager);
    }

    /// The balloon's control, if the VM has a balloon.
    pub(crate) fn balloon_handle(&self) -> Option<Arc<BalloonControl>> {
        self.balloon.clone()
    }

    /// What the balloon holds and did, if the VM has one.
    pub(crate) fn balloon_report(&self) -> Option<BalloonReport> {
        self.balloon.as_ref().map(|c| c.report())
    }

    /// Each disk's size in bytes, in the configuration's order.
    pub(crate) fn disk_sizes(&self) -> &[u64] {
        &self.disk_sizes
    }

    /// Have every ready virtio queue served once (a restored or arrived
    /// VM: requests the guest queued before the state was taken), and
    /// every running network card announce the guest's MAC where it now is.
    pub(crate) fn kick_virtio(&self) {
        for slot in &self.bus.virtio {
            slot.kick_ready();
        }
        if let Some(io) = &self.virtio_io {
            io.announce();
        }
    }

    /// Stop the virtio I/O thread for good (the VM has ended; before its
    /// pager stops, which the thread may be waiting on for a page).
    pub(crate) fn stop_virtio(&mut self) {
        self.virtio_io = None;
    }

    /// Stop reading standard input and give the terminal back its settings.
    pub(crate) fn stop_console_input(&mut self) {
        self.console_in = None;
    }
}

/// The virtio devices on the bus, the thread serving them, each disk's size.
type VirtioBus = (Vec<VirtioSlot>, Option<IoThread>, Vec<u64>);

/// What devices other than disks and cards are built with.
struct Extra {
    balloon: Option<Arc<BalloonControl>>,
    discarder: Arc<Discarder>,
    /// Boosts the vCPU each device interrupt reaches (host-side boosts).
    booster: Arc<Booster>,
}

/// A Linux guest's virtio devices (its disks, cards, the entropy device
/// and the balloon, as
/// `virtio::device_count` and the DSDT number them), each with its
/// notification ioeventfds and irqfd, and the I/O thread serving them.
fn virtio_devices(
    fd: &Arc<VmFd>,
    memory: &DeviceMemory,
    config: &VmConfig,
    extra: Extra,
) -> Result<VirtioBus, Error> {
    let m = &config.machine;
    if virtio::device_count(m) == 0 {
        return Ok((Vec::new(), None, Vec::new()));
    }
    let mut devices: Vec<Box<dyn VirtioDevice>> = Vec::new();
    let mut sizes = Vec::new();
    for (disk, path) in m.disks.iter().zip(&config.host.disk_paths) {
        let (file, size) = open_disk(path, disk.readonly)
            .map_err(|why| ConfigError::Devices(format!("--disk {}: {why}", path.display())))?;
        // A restored or arriving VM's disk must be the one it had.
        if disk.size != 0 && disk.size != size {
            return Err(ConfigError::Devices(format!(
                "--disk {}={}: {size} bytes, but the VM's disk {} has {} bytes: give the disk it had (or a copy of it)",
                disk.id,
                path.display(),
                disk.id,
                disk.size
            ))
            .into());
        }
        sizes.push(size);
        devices.push(Box::new(Block::new(disk.clone(), path.clone(), file, size)));
    }
    for (net, tap) in m.nets.iter().zip(&config.host.taps) {
        let file = open_tap(tap).map_err(|why| ConfigError::Devices(format!("--net {why}")))?;
        devices.push(Box::new(Net::new(net.clone(), tap.clone(), file)));
    }
    if m.rng {
        devices.push(Box::<Rng>::default());
    }
    if let (Some(b), Some(control)) = (&m.balloon, extra.balloon) {
        devices.push(Box::new(Balloon::new(b, control, extra.discarder)));
    }
    let host = |what: &'static str| move |e: std::io::Error| Error::Host { what, source: e };
    let kvm = |what: &'static str| {
        move |e: kvm_ioctls::Error| Error::Host {
            what,
            source: std::io::Error::from_raw_os_error(e.errno()),
        }
    };
    let (mut slots, mut served) = (Vec::new(), Vec::new());
    for (i, device) in devices.into_iter().enumerate() {
        let (base, gsi) = (virtio::window(i), virtio::gsi(i));
        let transport = MmioTransport::new(device, memory.view().clone());
        let queues = transport.queue_count();
        let transport = Arc::new(Mutex::new(transport));
        let mut notify = Vec::new();
        let mut theirs = Vec::new();
        for q in 0..queues {
            let e = EventFd::new(libc::EFD_NONBLOCK).map_err(host("make an eventfd"))?;
            let at = IoEventAddress::Mmio(base + u64::from(VIRTIO_MMIO_QUEUE_NOTIFY));
            fd.register_ioevent(&e, &at, q as u32)
                .map_err(kvm("register a virtio queue's ioeventfd"))?;
            theirs.push(e.try_clone().map_err(host("clone an eventfd"))?);
            notify.push(e);
        }
        let irqfd = EventFd::new(libc::EFD_NONBLOCK).map_err(host("make an eventfd"))?;
        fd.register_irqfd(&irqfd, gsi)
            .map_err(kvm("register a virtio device's irqfd"))?;
        let line = IrqTrigger::new(fd.clone(), gsi).with_boost(LineBoost::new(
            extra.booster.clone(),
            fd.clone(),
            gsi as usize,
        ));
        let irq = Interrupt { irqfd, line };
        slots.push(VirtioSlot {
            base,
            transport: transport.clone(),
            notify: theirs,
        });
        served.push(Served {
            transport,
            notify,
            irq,
        });
    }
    let io = IoThread::start(served).map_err(host("start the virtio I/O thread"))?;
    Ok((slots, Some(io), sizes))
}

impl Persist for DeviceManager {
    type State = DevicesState;

    fn save(&self) -> Result<DevicesState, Error> {
        Ok(DevicesState {
            serial: self.bus.serial.state(),
            control: self.bus.control.state(),
            pvio: self.pvio.state(),
            virtio: self
                .bus
                .virtio
                .iter()
                .map(|v| v.transport.locked().state())
                .collect(),
        })
    }

    fn load(&self, s: &DevicesState) -> Result<(), LoadError> {
        let unfit = |e: StateError| LoadError::Unfit("DEVS", e.to_string());
        self.bus.serial.restore(&s.serial).map_err(unfit)?;
        self.bus.control.restore(&s.control).map_err(unfit)?;
        if s.virtio.len() != self.bus.virtio.len() {
            return Err(LoadError::Unfit(
                "DEVS",
                format!(
                    "{} saved virtio devices for a VM with {}",
                    s.virtio.len(),
                    self.bus.virtio.len()
                ),
            ));
        }
        for (saved, slot) in s.virtio.iter().zip(&self.bus.virtio) {
            let mut t = slot.transport.locked();
            t.restore(saved).map_err(unfit)?;
        }
        self.pvio.restore(&s.pvio).map_err(|e| {
            LoadError::Host(Error::Host {
                what: "restore the I/O device",
                source: std::io::Error::other(e),
            })
        })
    }
}
