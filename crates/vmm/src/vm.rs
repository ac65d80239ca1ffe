//! The VM: builds memory, irqchip, vCPUs and devices from a [`VmConfig`],
//! runs the vCPU threads and reports how the guest ended.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use kvm_bindings::{kvm_msr_entry, kvm_userspace_memory_region, Msrs, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use serde::Serialize;
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::signal::Killable;

use crate::api::{ApiServer, LiveSources};
use crate::arch::x86_64::{cpuid, tables};
use crate::boot::{self, ImageLayout};
use crate::config::{ConfigError, VmConfig};
use crate::devices::control::ControlDevice;
use crate::devices::msi::MsiInjector;
use crate::devices::pvio::{PvioDevice, PvioStats};
use crate::devices::serial::{ConsoleSink, SerialConsole};
use crate::devices::Devices;
use crate::memory::paged::{Pager, PagerStats, MIN_BUDGET_PAGES};
use crate::memory::GuestRam;
use crate::report::{self, ReportEntry};
use crate::sched::halt_poll::{self, Governor, GovernorReport, HaltPoll};
use crate::stats::KvmStats;
use crate::vcpu::{self, Vcpu, VcpuEvent};
use crate::{Error, KvmOp};
use hover_abi::layout::PAGE_SIZE;
use hover_abi::pv::{FEATURE_ASYNC_PF, FEATURE_ASYNC_PF_INT, FEATURE_ASYNC_PF_VMEXIT};

/// The COM1 interrupt line on the IOAPIC.
const COM1_GSI: u32 = 4;
/// Where KVM may put its real-mode TSS (in the MMIO hole, as Firecracker does).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;
const MSR_IA32_TSC: u32 = 0x10;
/// How long to keep kicking vCPU threads before giving up on joining them.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Boot timings, in microseconds from the start of [`Vm::new`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct BootTimings {
    /// Until the VM was built and its vCPUs were about to start.
    pub setup_us: u64,
    /// Until the guest's first instruction, from the guest's own TSC reading
    /// (the `boot_tsc` report); `None` if the guest did not report it.
    pub first_instruction_us: Option<u64>,
    /// Until the first byte on the serial console.
    pub first_console_byte_us: Option<u64>,
    /// Until the guest powered off.
    pub exit_us: u64,
}

/// Memory use at exit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryUsage {
    /// Guest RAM configured, bytes.
    pub guest_memory: u64,
    /// Guest RAM resident (touched by guest or monitor), bytes.
    pub guest_resident: u64,
    /// Resident memory of the whole process, bytes.
    pub process_resident: u64,
    /// Process resident memory beyond resident guest RAM: the monitor's own cost.
    pub vmm_overhead: u64,
}

/// How a run ended, when the guest powered off.
#[derive(Clone, Debug, Serialize)]
pub struct RunOutcome {
    /// The guest's exit code.
    pub exit_code: u32,
    /// The vCPU that asked to power off.
    pub exit_vcpu: usize,
    /// Everything the guest reported, in order.
    pub reports: Vec<ReportEntry>,
    /// Boot timings.
    pub timings: BootTimings,
    /// Memory use.
    pub memory: MemoryUsage,
    /// Bytes the guest wrote to its console.
    pub console_bytes: u64,
    /// KVM's statistics of each vCPU at exit (single-valued ones; empty if
    /// this KVM has no binary stats).
    pub vcpu_stats: Vec<BTreeMap<String, u64>>,
    /// KVM's statistics of the VM at exit.
    pub vm_stats: BTreeMap<String, u64>,
    /// KVM's histograms of each vCPU at exit (bucket counts; log histograms:
    /// bucket 0 holds 0, bucket i values in [2^(i-1), 2^i)).
    pub vcpu_histograms: Vec<BTreeMap<String, Vec<u64>>>,
    /// What the pager did (with --memory-budget).
    pub pager: Option<PagerStats>,
    /// What the halt-poll governor did (with --halt-poll auto).
    pub halt_poll: Option<GovernorReport>,
    /// Host CPU time each vCPU thread used, microseconds.
    pub vcpu_cpu_us: Vec<u64>,
    /// What the paravirtual I/O device did, if the guest used it.
    pub io: Option<PvioStats>,
}

/// A built VM, ready to run.
pub struct Vm {
    _kvm: Kvm,
    fd: Arc<VmFd>,
    ram: GuestRam,
    vcpus: Vec<Vcpu>,
    devices: Arc<Devices>,
    tsc_khz: u32,
    image: ImageLayout,
    created_at: Instant,
    vcpu_stats: Vec<KvmStats>,
    vm_stats: Option<KvmStats>,
    pager: Option<Pager>,
    governor_budget: Option<f64>,
    governor: Option<Governor>,
    api_socket: Option<std::path::PathBuf>,
    pvio: Arc<PvioDevice>,
    vcpu_cpu_us: Vec<u64>,
    events: Sender<VmEvent>,
    events_rx: Receiver<VmEvent>,
}

/// What ends a run: a vCPU thread's end, or a pager failure.
enum VmEvent {
    Vcpu(VcpuEvent),
    VcpuPanicked(usize),
    PagerFailed(String),
}

impl Vm {
    /// Build a VM from `config`: validate it, map RAM, create the irqchip and
    /// vCPUs, load the guest and write the boot area. Nothing runs yet.
    pub fn new(config: &VmConfig) -> Result<Vm, Error> {
        let created_at = Instant::now();
        config.validate()?;
        // A write past a file-size limit (page store, I/O device file) must
        // fail with EFBIG and be reported, not kill the process.
        // SAFETY: setting a signal's disposition to "ignore" is always sound.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
        let image = boot::read_image(&config.guest)?;
        let layout = boot::inspect(&image)?;
        boot::check_fits(&image, &layout, config.memory)?;
        if let Some(p) = &config.paging {
            let minimum = layout.end + MIN_BUDGET_PAGES * PAGE_SIZE;
            if p.budget < minimum {
                return Err(ConfigError::BudgetTooSmall {
                    budget: p.budget,
                    minimum,
                }
                .into());
            }
        }

        let kvm = Kvm::new().map_err(Error::KvmUnavailable)?;
        let kvm_max = kvm.get_max_vcpus() as u32;
        if config.vcpus > kvm_max {
            return Err(ConfigError::VcpusOverKvm {
                given: config.vcpus,
                max: kvm_max,
            }
            .into());
        }
        let fd = Arc::new(kvm.create_vm().map_err(KvmOp::CreateVm.err())?);
        let ram = GuestRam::new(config.memory, config.memory_backend)?;
        register_memory(&fd, &ram)?;
        fd.set_tss_address(KVM_TSS_ADDRESS)
            .map_err(KvmOp::SetTssAddress.err())?;
        fd.create_irq_chip().map_err(KvmOp::CreateIrqchip.err())?;
        if config.halt_poll != HaltPoll::KvmDefault && !halt_poll::supported(&fd) {
            return Err(ConfigError::HaltPollUnsupported.into());
        }
        if let HaltPoll::Fixed(ns) = config.halt_poll {
            halt_poll::set_window(&fd, ns).map_err(KvmOp::EnableCap.err())?;
        }
        // KVM accepts this only before vCPUs exist.
        if !config.hlt_exits {
            halt_poll::disable_hlt_exits(&fd).map_err(KvmOp::EnableCap.err())?;
        }

        boot::load(&image, &layout, &ram)?;
        tables::write_page_tables(ram.memory(), ram.end())?;
        tables::write_descriptor_tables(ram.memory(), config.vcpus)?;

        let supported = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(KvmOp::GetSupportedCpuid.err())?;
        let apf_bits = FEATURE_ASYNC_PF | FEATURE_ASYNC_PF_INT;
        let apf_offered = cpuid::pv_features(&supported) & apf_bits == apf_bits;
        if config.async_pf && !apf_offered {
            return Err(ConfigError::AsyncPfUnsupported.into());
        }
        let pv_withheld = if config.async_pf {
            0
        } else {
            apf_bits | FEATURE_ASYNC_PF_VMEXIT
        };
        let mut vcpus = Vec::with_capacity(config.vcpus as usize);
        for i in 0..config.vcpus {
            let vcpu = Vcpu::new(&fd, i)?;
            vcpu.configure(&cpuid::for_vcpu(&supported, i, pv_withheld), layout.entry)?;
            vcpus.push(vcpu);
        }
        let tsc_khz = vcpus[0]
            .fd()
            .get_tsc_khz()
            .map_err(KvmOp::GetTscKhz.err())?;
        // Binary stats need Linux 5.14; without them the run still works.
        let vcpu_stats = vcpus
            .iter()
            .map(|v| KvmStats::open(v.fd()))
            .collect::<Result<Vec<_>, _>>();
        let vcpu_stats = vcpu_stats.unwrap_or_else(|e| {
            tracing::warn!("KVM binary statistics unavailable: {e}");
            Vec::new()
        });
        let vm_stats = KvmStats::open(fd.as_ref()).ok();
        let governor_budget = match config.halt_poll {
            HaltPoll::Auto { budget_pct } => Some(budget_pct),
            _ => None,
        };
        boot::write_boot_info(
            &ram,
            config.vcpus,
            tsc_khz as u64,
            cpuid::pv_features(&supported) & !pv_withheld,
            &config.cmdline,
            &layout,
        )?;

        let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| Error::Host {
            what: "create an eventfd",
            source,
        })?;
        fd.register_irqfd(&irq, COM1_GSI)
            .map_err(KvmOp::RegisterIrqfd.err())?;
        let sink = ConsoleSink::open(&config.console).map_err(|source| Error::Console {
            target: format!("{:?}", config.console),
            source,
        })?;
        let pvio = PvioDevice::new(&fd, ram.memory().clone(), config.vcpus, &config.pvio)?;
        let devices = Arc::new(Devices {
            serial: SerialConsole::new(irq, sink),
            control: ControlDevice::new(
                ram.memory().clone(),
                Some(MsiInjector::new(fd.clone())),
                config.vcpus,
            )
            .with_pvio(pvio.clone()),
        });
        let (events, events_rx) = mpsc::channel();
        let pager = match &config.paging {
            Some(p) => {
                let tx = Mutex::new(events.clone());
                let on_failure = Box::new(move |msg: String| {
                    let _ = tx
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .send(VmEvent::PagerFailed(msg));
                });
                Some(Pager::start(&ram, layout.end, p, on_failure)?)
            }
            None => None,
        };
        tracing::debug!(
            vcpus = config.vcpus,
            memory = config.memory,
            entry = layout.entry,
            "VM built"
        );
        Ok(Vm {
            _kvm: kvm,
            fd,
            ram,
            vcpus,
            devices,
            tsc_khz,
            image: layout,
            created_at,
            vcpu_stats,
            vm_stats,
            pager,
            events,
            events_rx,
            governor_budget,
            governor: None,
            api_socket: config.api_socket.clone(),
            pvio,
            vcpu_cpu_us: Vec::new(),
        })
    }

    /// Guest RAM.
    pub fn ram(&self) -> &GuestRam {
        &self.ram
    }

    /// Where the guest image was loaded.
    pub fn image(&self) -> &ImageLayout {
        &self.image
    }

    /// The VM's KVM handle.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// Run every vCPU on its own thread until the guest powers off (returns
    /// the outcome) or crashes (returns [`Error::GuestCrash`] with a register
    /// dump). All vCPU threads have ended when this returns.
    pub fn run(mut self) -> Result<RunOutcome, Error> {
        vcpu::install_kick_handler().map_err(|source| Error::Host {
            what: "install the vCPU kick signal handler",
            source,
        })?;
        let tsc_ref = self.read_guest_tsc()?;
        if let Some(budget) = self.governor_budget {
            let stats = self
                .vcpus
                .iter()
                .map(|v| KvmStats::open(v.fd()))
                .collect::<Result<Vec<_>, _>>();
            let stats = stats.map_err(|source| Error::Host {
                what: "open KVM statistics for the halt-poll governor",
                source,
            })?;
            let gov =
                Governor::start(self.fd.clone(), stats, budget).map_err(|source| Error::Host {
                    what: "start the halt-poll governor",
                    source,
                })?;
            self.governor = Some(gov);
        }
        let started_at = Instant::now();
        let _api = match &self.api_socket {
            Some(path) => Some(self.start_api(path, started_at)?),
            None => None,
        };
        let stop = Arc::new(AtomicBool::new(false));
        let cpu_us: Arc<Vec<AtomicU64>> =
            Arc::new(self.vcpus.iter().map(|_| AtomicU64::new(0)).collect());
        let mut threads = Vec::new();
        for vcpu in self.vcpus.drain(..) {
            let (devices, stop, tx) = (self.devices.clone(), stop.clone(), self.events.clone());
            let index = vcpu.index() as usize;
            let cpu_us = cpu_us.clone();
            let handle = thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || {
                    let run = std::panic::AssertUnwindSafe(|| vcpu.run(devices, stop));
                    let event = std::panic::catch_unwind(run)
                        .map_or(VmEvent::VcpuPanicked(index), VmEvent::Vcpu);
                    cpu_us[index].store(thread_cpu_us(), Ordering::Relaxed);
                    let _ = tx.send(event);
                })
                .map_err(|source| Error::Host {
                    what: "start a vCPU thread",
                    source,
                })?;
            threads.push(handle);
        }
        // Every vCPU thread sends exactly one event, and the pager one if it
        // fails: the first is how the run ended.
        let first = self.events_rx.recv().ok();
        let exited_at = Instant::now();
        stop.store(true, Ordering::Release);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            for t in threads.iter().filter(|t| !t.is_finished()) {
                let _ = t.kill(vcpu::kick_signal());
            }
            thread::sleep(Duration::from_millis(1));
        }
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!(
                    "a vCPU thread did not stop within {STOP_TIMEOUT:?}; leaving it behind"
                );
            }
        }
        self.devices.serial.flush();
        if let Some(p) = self.pager.as_mut() {
            p.stop();
        }
        if let Some(g) = self.governor.as_mut() {
            g.stop();
        }
        self.pvio.stop();
        self.vcpu_cpu_us = cpu_us.iter().map(|c| c.load(Ordering::Relaxed)).collect();

        match first {
            Some(VmEvent::Vcpu(VcpuEvent::Exit { vcpu, code })) => {
                Ok(self.outcome(code, vcpu, tsc_ref, started_at, exited_at))
            }
            Some(VmEvent::Vcpu(VcpuEvent::Crash(crash))) => Err(Error::GuestCrash(Box::new(crash))),
            Some(VmEvent::Vcpu(VcpuEvent::Failed { error, .. })) => Err(KvmOp::Run.err()(error)),
            Some(VmEvent::PagerFailed(msg)) => Err(Error::PagerFailed(msg)),
            Some(VmEvent::Vcpu(VcpuEvent::Stopped { vcpu })) => Err(Error::Host {
                what: "run the vCPUs",
                source: std::io::Error::other(format!(
                    "vCPU {vcpu} stopped before the guest powered off"
                )),
            }),
            Some(VmEvent::VcpuPanicked(vcpu)) => Err(Error::Host {
                what: "run the vCPUs",
                source: std::io::Error::other(format!("the thread of vCPU {vcpu} panicked")),
            }),
            None => unreachable!("the Vm holds a sender, so the channel stays open"),
        }
    }

    fn start_api(&self, path: &std::path::Path, started: Instant) -> Result<ApiServer, Error> {
        let vcpu_stats = self
            .vcpus
            .iter()
            .map(|v| KvmStats::open(v.fd()))
            .collect::<Result<Vec<_>, _>>();
        let sources = LiveSources {
            vcpu_stats: vcpu_stats.unwrap_or_default(),
            vm_stats: KvmStats::open(self.fd.as_ref()).ok(),
            pager: self
                .pager
                .as_ref()
                .map(|p| Box::new(p.stats_source()) as Box<dyn Fn() -> PagerStats + Send + Sync>),
            governor: self.governor.as_ref().map(|g| {
                Box::new(g.report_source()) as Box<dyn Fn() -> GovernorReport + Send + Sync>
            }),
            io: self.pvio.clone(),
            started,
        };
        Ok(ApiServer::start(path, sources)?)
    }

    /// The guest's TSC now, paired with the host instant: lets the guest's
    /// own `boot_tsc` report be placed on the host's clock.
    fn read_guest_tsc(&self) -> Result<(Instant, u64), Error> {
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry {
            index: MSR_IA32_TSC,
            ..Default::default()
        }])
        .map_err(|e| Error::Host {
            what: "build an MSR list",
            source: std::io::Error::other(format!("{e:?}")),
        })?;
        let now = Instant::now();
        self.vcpus[0]
            .fd()
            .get_msrs(&mut msrs)
            .map_err(KvmOp::GetMsrs.err())?;
        Ok((now, msrs.as_slice()[0].data))
    }

    fn outcome(
        &self,
        code: u32,
        vcpu: usize,
        tsc_ref: (Instant, u64),
        started: Instant,
        exited: Instant,
    ) -> RunOutcome {
        let us = |t: Instant| t.saturating_duration_since(self.created_at).as_micros() as u64;
        let reports = self.devices.control.reports();
        let first_instruction_us = report::find(&reports, "boot_tsc")
            .and_then(|r| r.value.as_u64())
            .and_then(|tsc| tsc.checked_sub(tsc_ref.1))
            .map(|ticks| us(tsc_ref.0) + ticks * 1000 / self.tsc_khz.max(1) as u64);
        let timings = BootTimings {
            setup_us: us(started),
            first_instruction_us,
            first_console_byte_us: self.devices.serial.first_byte_at().map(us),
            exit_us: us(exited),
        };
        RunOutcome {
            exit_code: code,
            exit_vcpu: vcpu,
            reports,
            timings,
            memory: self.memory_usage(),
            console_bytes: self.devices.serial.bytes_written(),
            vcpu_stats: self
                .vcpu_stats
                .iter()
                .filter_map(|s| s.read().ok())
                .map(|s| s.scalars())
                .collect(),
            vcpu_histograms: self
                .vcpu_stats
                .iter()
                .filter_map(|s| s.read().ok())
                .map(|s| s.histograms())
                .collect(),
            pager: self.pager.as_ref().map(Pager::stats),
            halt_poll: self.governor.as_ref().map(Governor::report),
            vcpu_cpu_us: self.vcpu_cpu_us.clone(),
            io: self.pvio.stats(),
            vm_stats: self
                .vm_stats
                .as_ref()
                .and_then(|s| s.read().ok())
                .map(|s| s.scalars())
                .unwrap_or_default(),
        }
    }

    /// Memory use now.
    pub fn memory_usage(&self) -> MemoryUsage {
        let guest_resident = self.ram.resident_bytes().unwrap_or(0);
        let process_resident = process_resident_bytes().unwrap_or(0);
        MemoryUsage {
            guest_memory: self.ram.size(),
            guest_resident,
            process_resident,
            vmm_overhead: process_resident.saturating_sub(guest_resident),
        }
    }
}

fn register_memory(fd: &VmFd, ram: &GuestRam) -> Result<(), Error> {
    for (slot, region) in ram.memory().iter().enumerate() {
        let host = region.get_host_address(vm_memory::MemoryRegionAddress(0))?;
        let r = kvm_userspace_memory_region {
            slot: slot as u32,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region's mapping lives as long as `ram`, which the Vm
        // owns and drops after the VM fd.
        unsafe { fd.set_user_memory_region(r) }.map_err(KvmOp::SetMemoryRegion.err())?;
    }
    Ok(())
}

/// CPU time (user + system) the calling thread has used, microseconds.
fn thread_cpu_us() -> u64 {
    // SAFETY: getrusage fills the struct it is given; the result is checked.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
        return 0;
    }
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(u.ru_utime) + us(u.ru_stime)
}

fn process_resident_bytes() -> std::io::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected /proc/self/statm format"))?;
    // SAFETY: sysconf has no side effects.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    Ok(pages * page)
}
