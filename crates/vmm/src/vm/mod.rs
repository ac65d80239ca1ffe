//! The VM: built from a [`VmConfig`] ([`Vm::new`]: `machine.rs` the KVM
//! machine, `device_manager.rs` its devices, `linux.rs` a Linux guest's
//! boot) or from a snapshot ([`Vm::restore`], `restore.rs`, with
//! `persist.rs` loading each part's state), then run by its control loop
//! ([`Vm::run`], `run.rs`) until the guest powers off or a command ends it.
//! `control.rs` is how it is steered meanwhile, `save.rs` a snapshot,
//! `hot_set.rs` the pages a snapshot records as hot, `dirty_log.rs`
//! tracking alone, `source/` and `destination/` the two ends of a
//! migration, `outcome.rs` how the run ended, `api_host.rs` what the VM
//! offers an API server (which attaches through the `ApiHost` trait).

mod api_host;
mod control;
mod destination;
mod device_manager;
mod dirty_log;
mod hot_set;
mod linux;
mod machine;
mod outcome;
mod paging;
mod persist;
mod restore;
mod run;
mod save;
mod source;

use crate::sync::Locked;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvm_ioctls::VmFd;

use crate::arch::x86_64::{acpi, cpuid, pvh, tables};
use crate::boot::{self};
use crate::config::{BootProtocol, ConfigError, VmConfig};
use crate::devices::serial::ConsoleSink;
use crate::memory::host_writes::GuestWriter;
use crate::memory::paged::{PageSource, Pager, MIN_BUDGET_PAGES};
use crate::memory::GuestRam;
use crate::migration::dirty::RingSet;
use crate::migration::throttle::Throttle;
use crate::sched::boost::Booster;
use crate::sched::guest_poll;
use crate::state::SavedMachine;
use crate::stats::KvmStats;
use crate::vcpu::{Entry, Vcpu};
use crate::{Error, KvmOp};
use hover_abi::layout::PAGE_SIZE;
use hover_abi::pv::{FEATURE_ASYNC_PF, FEATURE_ASYNC_PF_INT};

pub use api_host::{ApiHost, GovernorSource, LiveSources};
pub use control::{
    Command, CommandError, Controller, DeviceInfo, Lifecycle, Reply, SnapshotInfo, VmInfo,
};
pub(crate) use control::{Status, VmEvent};
pub use destination::ReceiveOptions;
use device_manager::DeviceManager;
pub use hot_set::MAX_HOT_WINDOW;
use machine::{pv_withheld, Machine};
pub use outcome::{BootTimings, EndReason, MemoryUsage, RestoreReport, RunOutcome};
use paging::Paging;
pub use restore::{MemoryRestore, RestoreOptions};

/// The dirty rings (with `--dirty-ring`) a migration's tracker reads, and
/// the throttle auto-converge slows the vCPUs with.
struct Dirtying {
    rings: Option<Arc<RingSet>>,
    throttle: Arc<Throttle>,
}

/// The VM's event channel: vCPUs, the pager, devices and controllers send,
/// the run loop (or a migration's loop) receives.
struct Events {
    tx: Sender<VmEvent>,
    rx: Receiver<VmEvent>,
}

/// A built VM, ready to run.
pub struct Vm {
    fd: Arc<VmFd>,
    ram: GuestRam,
    vcpus: Vec<Vcpu>,
    devices: DeviceManager,
    tsc_khz: u32,
    image_end: u64,
    /// KVM's binary statistics of each vCPU and of the VM.
    kvm_stats: KvmCounters,
    /// Who serves guest memory: the kernel, or the pager.
    paging: Paging,
    /// How this host runs it: API, start, confinement, migration key.
    hosting: Hosting,
    /// How it came here when it was not booted: restored, or arriving.
    arrival: Arrival,
    /// What a migration or a hot set tracks the guest's writes with, and
    /// auto-converge slows them with.
    dirtying: Dirtying,
    booster: Arc<Booster>,
    /// What the VM's threads and controllers tell its run loop.
    events: Events,
    /// The VM's state as the API reads it, and the one live copy of its
    /// machine configuration ([`Vm::config`]).
    status: Arc<Mutex<Status>>,
}

/// KVM's binary statistics (`stats.rs`), read by the API, the outcome and
/// the halt-poll governor.
struct KvmCounters {
    /// One per vCPU, in vCPU order.
    vcpus: Vec<KvmStats>,
    /// The VM's own, where KVM offers them.
    vm: Option<KvmStats>,
}

impl KvmCounters {
    /// Open each vCPU's and the VM's. Binary statistics need Linux 5.14;
    /// without them the run still works, with none.
    fn open(vcpus: &[Vcpu], fd: &VmFd) -> KvmCounters {
        let vcpus = vcpus
            .iter()
            .map(|v| KvmStats::open(v.fd()))
            .collect::<Result<Vec<_>, _>>()
            .unwrap_or_else(|e| {
                tracing::warn!("KVM binary statistics unavailable: {e}");
                Vec::new()
            });
        KvmCounters {
            vcpus,
            vm: KvmStats::open(fd).ok(),
        }
    }
}

/// How this host runs the VM, apart from what the VM is.
struct Hosting {
    /// When it began to be built (boot timings count from here).
    created_at: Instant,
    /// Where its API is served while it runs.
    api: Option<Box<dyn ApiHost>>,
    /// Start with every vCPU paused ([`Vm::start_paused`]).
    start_paused: bool,
    /// How its threads are confined (`--seccomp`).
    seccomp: crate::seccomp::Mode,
    /// The key its outgoing migrations prove (`--migration-key`).
    migration_key: Option<Arc<crate::config::MigrationKey>>,
}

/// How a VM that was not booted came here.
#[derive(Default)]
struct Arrival {
    /// A restore's report (a migration that arrived has one too).
    restored: Option<RestoreReport>,
    /// A migration arriving into this VM: the rest of its stream, taken
    /// once every thread runs ([`run::Running::arrive`]).
    arriving: Option<Box<destination::Arriving>>,
    /// A post-copy destination's memory: arriving, or arrived.
    postcopy_in: Option<destination::postcopy::PostcopyIn>,
}

/// The pager a VM under a memory budget or a lazy restore needs (none
/// otherwise), started over guest memory above `image_end`; a page it
/// cannot serve becomes a [`VmEvent::PagerFailed`] on `events`.
fn start_pager(
    ram: &GuestRam,
    config: &VmConfig,
    image_end: u64,
    source: Option<Arc<dyn PageSource>>,
    events: &Sender<VmEvent>,
) -> Result<Option<Pager>, Error> {
    let store = &config.host.page_store;
    let paging = match (config.machine.memory_budget, &source) {
        (Some(budget), _) => Some(crate::memory::paged::PagingConfig {
            budget,
            store: store.path.clone(),
            store_latency: store.latency,
            store_jitter: store.jitter,
            evict: store.evict,
        }),
        // A lazy restore without overcommit: the pager only brings pages in.
        (None, Some(_)) => Some(crate::memory::paged::PagingConfig {
            budget: ram.size(),
            store: None,
            store_latency: std::time::Duration::ZERO,
            store_jitter: std::time::Duration::ZERO,
            evict: store.evict,
        }),
        (None, None) => None,
    };
    let Some(p) = paging else {
        return Ok(None);
    };
    let tx = Mutex::new(events.clone());
    let on_failure = Box::new(move |msg: String| {
        let _ = tx.locked().send(VmEvent::PagerFailed(msg));
    });
    Ok(Some(Pager::start(ram, image_end, &p, source, on_failure)?))
}

impl Vm {
    /// The memory holding the guest-poll areas (`hover_abi::haltpoll`),
    /// for the governor, stats and reports to read: the built-in guest's
    /// boot area. A Linux guest has none (those addresses are its own
    /// memory): None.
    pub(crate) fn guest_poll_areas(&self) -> Option<vm_memory::GuestMemoryMmap> {
        (!self.config().guest.is_linux()).then(|| self.ram.memory().clone())
    }

    /// What the VM is now: the configuration it was built from, with what
    /// changed live. Held once (in its status, which the API reads).
    pub(crate) fn config(&self) -> crate::config::MachineConfig {
        self.status.locked().config.clone()
    }

    /// Change the live configuration (a setting changed while the VM runs).
    pub(crate) fn change_config(&self, change: impl FnOnce(&mut crate::config::MachineConfig)) {
        change(&mut self.status.locked().config);
    }

    /// Build a VM from `config`: validate it, map RAM, create the irqchip and
    /// vCPUs, load the guest and write the boot area. Nothing runs yet.
    pub fn new(config: &VmConfig) -> Result<Vm, Error> {
        let created_at = Instant::now();
        config.validate()?;
        if let crate::config::GuestImage::Linux(boot) = &config.machine.guest {
            return Vm::new_linux(config, boot, created_at);
        }
        let image = boot::read_image(&config.machine.guest)?;
        let layout = boot::inspect(&image)?;
        boot::check_fits(&image, &layout, config.machine.memory)?;
        check_budget(config, layout.end)?;
        let m = Machine::create(config)?;
        boot::load(&image, &layout, &m.ram)?;
        tables::write_page_tables(m.ram.memory(), m.ram.end())?;
        tables::write_descriptor_tables(m.ram.memory(), config.machine.vcpus)?;

        let apf_bits = FEATURE_ASYNC_PF | FEATURE_ASYNC_PF_INT;
        let apf_offered = cpuid::pv_features(&m.supported) & apf_bits == apf_bits;
        if config.machine.async_pf && !apf_offered {
            return Err(ConfigError::AsyncPfUnsupported.into());
        }
        let tsc_khz = m.vcpus[0]
            .fd()
            .get_tsc_khz()
            .map_err(KvmOp::GetTscKhz.err())?;
        match config.machine.boot {
            BootProtocol::Hover => {
                for v in &m.vcpus {
                    v.configure(&m.vcpu_cpuid(config, v.index()), layout.entry)?;
                }
            }
            BootProtocol::Pvh => {
                let entry = layout.pvh_entry.ok_or(ConfigError::NoPvhEntry)?;
                // The MADT tells the guest how many vCPUs to start.
                let rsdp = acpi::write_tables(m.ram.memory(), config.machine.vcpus)?;
                let start_info = pvh::write_start_info(
                    m.ram.memory(),
                    m.ram.size(),
                    &config.machine.cmdline,
                    rsdp,
                )?;
                for v in &m.vcpus {
                    let cpuid = pvh::with_tsc_leaf(&m.vcpu_cpuid(config, v.index()), tsc_khz);
                    match v.index() {
                        0 => v.configure_with(&cpuid, Entry::Pvh { entry, start_info })?,
                        _ => v.prepare_application_processor(&cpuid)?,
                    }
                }
            }
        }
        boot::write_boot_info(
            &m.ram,
            config.machine.vcpus,
            tsc_khz as u64,
            cpuid::pv_features(&m.supported) & !pv_withheld(config.machine.async_pf),
            &config.machine.cmdline,
            &layout,
        )?;
        // Before the VM exists: nothing records the monitor's writes yet.
        guest_poll::offer(
            &GuestWriter::unrecorded(m.ram.memory().clone()),
            config.machine.vcpus,
            config.machine.guest_poll_max_ns,
        )?;
        let saved = SavedMachine {
            config: config.machine.clone(),
            image_end: layout.end,
        };
        let sink = open_console(config)?;
        Vm::assemble(m, config, saved, sink, None, created_at)
    }

    /// The last steps of building, shared by boot, restore and an arriving
    /// migration: devices, the pager, statistics. The vCPUs run at this
    /// host's TSC rate until a loaded state says otherwise.
    fn assemble(
        m: Machine,
        config: &VmConfig,
        saved: SavedMachine,
        sink: ConsoleSink,
        source: Option<Arc<dyn PageSource>>,
        created_at: Instant,
    ) -> Result<Vm, Error> {
        let fd = m.fd.clone();
        let mut vcpus = m.vcpus;
        let tsc_khz = vcpus[0]
            .fd()
            .get_tsc_khz()
            .map_err(KvmOp::GetTscKhz.err())?;
        let rings = match config.machine.dirty_ring {
            Some(entries) => {
                let fds: Vec<_> = vcpus.iter().map(|v| v.fd()).collect();
                let set = Arc::new(RingSet::map(fd.clone(), &fds, entries).map_err(|source| {
                    Error::Host {
                        what: "map the dirty rings",
                        source,
                    }
                })?);
                for v in &mut vcpus {
                    v.attach_ring(set.clone());
                }
                Some(set)
            }
            None => None,
        };
        let throttle = Arc::new(Throttle::new(vcpus.len()));
        for v in &mut vcpus {
            v.attach_throttle(throttle.clone());
        }
        let kvm_stats = KvmCounters::open(&vcpus, &fd);
        let (devices, booster) = DeviceManager::new(&fd, &m.ram, config, tsc_khz, sink)?;
        for v in &mut vcpus {
            v.attach_booster(booster.clone());
        }
        let (events, events_rx) = mpsc::channel();
        let pager = start_pager(&m.ram, config, saved.image_end, source, &events)?;
        devices.attach_pager(pager.as_ref().map(Pager::discarder));
        tracing::debug!(
            vcpus = config.machine.vcpus,
            memory = config.machine.memory,
            "VM built"
        );
        // The one live copy of what the VM is: what it was built from,
        // with each disk's size as it opened; live changes (halt polling,
        // boosting) go here, and saves and migrations read it.
        let mut machine = saved.config;
        for (disk, &size) in machine.disks.iter_mut().zip(devices.disk_sizes()) {
            disk.size = size;
        }
        let status = Arc::new(Mutex::new(Status {
            state: Lifecycle::Created,
            started: None,
            config: machine,
            boost_tuning: config.host.boost_tuning,
            restored_from: None,
            migration: None,
            postcopy_now: false,
            hangup: None,
        }));
        Ok(Vm {
            fd,
            ram: m.ram,
            vcpus,
            devices,
            tsc_khz,
            image_end: saved.image_end,
            kvm_stats,
            paging: Paging::new(pager),
            hosting: Hosting {
                created_at,
                api: None,
                start_paused: false,
                migration_key: config.host.migration_key.clone(),
                seccomp: config.host.seccomp,
            },
            arrival: Arrival::default(),
            dirtying: Dirtying { rings, throttle },
            booster,
            events: Events {
                tx: events,
                rx: events_rx,
            },
            status,
        })
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// One past the guest image: memory below it stays resident.
    pub fn image_end(&self) -> u64 {
        self.image_end
    }

    /// What its pager has done so far (`None`: no pager).
    pub fn pager_stats(&self) -> Option<crate::memory::paged::PagerStats> {
        self.paging.stats()
    }

    /// The pageable pages in the order the guest first touched them, for a
    /// VM under the pager (overcommitted, or restored lazily; kept when a
    /// prefetching restore's pager let go): a hot set of its own, which
    /// snapshots record and post-copy pushes early. Empty for any other VM.
    pub(super) fn first_touches(&self) -> Vec<u64> {
        self.paging.first_touches()
    }

    /// Let a prefetching restore's loader begin now, before the guest runs
    /// ([`Vm::run`] lets it begin once the vCPUs run): for a caller that
    /// wants memory in place first. Nothing happens without such a loader.
    pub fn begin_prefetch(&mut self) {
        if let Some(p) = self.paging.pager_mut() {
            p.let_loader_go();
        }
    }

    /// The VM's KVM handle.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// Start the run with every vCPU paused and the devices frozen, as if
    /// paused through the API before the guest ran (a Firecracker snapshot
    /// load without `resume_vm`).
    pub fn start_paused(&mut self) {
        self.hosting.start_paused = true;
    }

    /// A controller for this VM: commands sent before [`Vm::run`] starts
    /// wait for it.
    pub fn controller(&self) -> Controller {
        Controller {
            tx: self.events.tx.clone(),
            status: self.status.clone(),
        }
    }
}

pub(crate) fn check_budget(config: &VmConfig, image_end: u64) -> Result<(), ConfigError> {
    if let Some(budget) = config.machine.memory_budget {
        let minimum = image_end + MIN_BUDGET_PAGES * PAGE_SIZE;
        if budget < minimum {
            return Err(ConfigError::BudgetTooSmall { budget, minimum });
        }
    }
    Ok(())
}

fn open_console(config: &VmConfig) -> Result<ConsoleSink, Error> {
    ConsoleSink::open(&config.host.console).map_err(|source| Error::Console {
        target: format!("{:?}", config.host.console),
        source,
    })
}
