//! Building a VM from a snapshot: the same machine as at boot, then the
//! saved memory and state, loaded in the order measured to work on this
//! KVM (docs/PLATFORM.md): memory, irqchip, each vCPU
//! (`vcpu::state`), the clock, the devices.

use crate::sync::Locked;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kvm_bindings::{
    kvm_cpuid_entry2, CpuId, KVM_CPUID_FLAG_SIGNIFCANT_INDEX, KVM_MAX_CPUID_ENTRIES,
};

use super::control::VmEvent;
use super::machine::Machine;
use super::outcome::{us_since, RestoreReport};
use super::persist::{Clock, Irqchips, LoadError, Persist, Pit};
use super::{open_console, Vm};
use crate::config::{HostConfig, VmConfig};
use crate::memory::paged::{self, PageSource};
use crate::state::file::{Snapshot, SnapshotError};
use crate::state::memory;
use crate::state::{SavedMachine, VmState};
use crate::vcpu::state::StateError;
use crate::vcpu::state::VcpuState;
use crate::{Error, KvmOp};

/// How guest memory comes back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryRestore {
    /// `Prefetch` where this host lets the pager use userfaultfd, else
    /// `Eager` (with a warning): the default, since prefetch reaches the
    /// guest's full speed sooner (docs/BENCHMARKS.md) but needs what eager
    /// does not. A VM with a memory budget always comes back through its
    /// pager; one on memfd memory (which the pager cannot serve) eagerly.
    #[default]
    Auto,
    /// Read every saved page before the guest runs.
    Eager,
    /// Load only the pinned part up front (the boot area and the guest
    /// image, about a hundred pages for the built-in guest): every other
    /// page comes from the snapshot file when the guest first touches it,
    /// through the pager (with async PF on, the guest runs other tasks
    /// meanwhile).
    Lazy,
    /// As `Lazy`, and a background loader fills the rest of memory from the
    /// file in large copies, the snapshot's hot set first; a page the guest
    /// touches first is served at once, never behind the loader.
    Prefetch,
}

impl MemoryRestore {
    /// The way this restore of `machine` takes: `Auto` decided here (a VM
    /// with a budget pages anyway, so it prefetches up to its budget).
    fn resolve(self, machine: &crate::config::MachineConfig) -> MemoryRestore {
        if self != MemoryRestore::Auto {
            return self;
        }
        if machine.memory_budget.is_some() {
            return MemoryRestore::Prefetch;
        }
        if machine.memory_backend == crate::config::MemoryBackend::Memfd {
            return MemoryRestore::Eager;
        }
        match crate::memory::uffd::pager_usable() {
            Ok(()) => MemoryRestore::Prefetch,
            Err(e) => {
                tracing::warn!("restoring eagerly: userfaultfd is unavailable ({e}); the pager needs Linux 5.7+ and vm.unprivileged_userfaultfd=1 or CAP_SYS_PTRACE");
                MemoryRestore::Eager
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            MemoryRestore::Auto => "auto",
            MemoryRestore::Eager => "eager",
            MemoryRestore::Lazy => "lazy",
            MemoryRestore::Prefetch => "prefetch",
        }
    }
}

/// What a restore takes besides the snapshot: how memory comes back, and
/// how this host runs the VM (none of it is in the snapshot).
#[derive(Clone, Debug, Default)]
pub struct RestoreOptions {
    /// How memory comes back.
    pub memory: MemoryRestore,
    /// This host's settings: console, API socket, page store, I/O file,
    /// guards, seccomp.
    pub host: HostConfig,
    /// With `Prefetch`: at most this many pages a second (`None`: as fast
    /// as the file and the host allow).
    pub prefetch_rate: Option<u64>,
}

impl RestoreOptions {
    /// Check the run's own settings before anything is read or listened on.
    pub(crate) fn check(&self) -> Result<(), Error> {
        self.host.validate()?;
        // Before a snapshot is read or a migration is listened for.
        super::machine::check_io_file(&self.host)?;
        Ok(())
    }
}

/// Leaves and registers whose feature bits the guest may rely on, and bits
/// KVM sets at run time (OSXSAVE, OSPKE), which are not host features.
const FEATURE_REGS: [(u32, u32, usize, u32); 7] = [
    (0x1, 0, 2, !(1 << 27)),
    (0x1, 0, 3, !0),
    (0x7, 0, 1, !0),
    (0x7, 0, 2, !(1 << 4)),
    (0x7, 0, 3, !0),
    (0x8000_0001, 0, 2, !0),
    (0x8000_0001, 0, 3, !0),
];

fn regs(e: &kvm_cpuid_entry2) -> [u32; 4] {
    [e.eax, e.ebx, e.ecx, e.edx]
}

/// CPU features a saved vCPU saw that this host does not offer.
#[derive(Debug, thiserror::Error)]
#[error("vCPU {vcpu} saw CPUID leaf {leaf:#x}.{index} {reg} bits {missing:#x} that this host does not offer")]
struct MissingFeatures {
    vcpu: usize,
    leaf: u32,
    index: u32,
    reg: &'static str,
    missing: u32,
}

/// Whether a vCPU that saw `saved` can run on a host offering `host`: every
/// feature bit it saw must be offered here.
fn check_cpuid(
    vcpu: usize,
    saved: &[kvm_cpuid_entry2],
    host: &CpuId,
) -> Result<(), MissingFeatures> {
    // The index counts only for leaves that have sub-leaves.
    let find = |t: &[kvm_cpuid_entry2], f: u32, i: u32| {
        t.iter()
            .find(|e| {
                e.function == f && (e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX == 0 || e.index == i)
            })
            .copied()
    };
    for (f, i, r, mask) in FEATURE_REGS {
        let Some(s) = find(saved, f, i) else { continue };
        let h = find(host.as_slice(), f, i).map_or(0, |h| regs(&h)[r]);
        let missing = regs(&s)[r] & mask & !h;
        if missing != 0 {
            return Err(MissingFeatures {
                vcpu,
                leaf: f,
                index: i,
                reg: ["eax", "ebx", "ecx", "edx"][r],
                missing,
            });
        }
    }
    Ok(())
}

/// The machine for a saved configuration, its vCPUs created: what restore
/// and receive build before memory and state arrive.
pub(crate) struct Prepared {
    pub(crate) machine: Machine,
    pub(crate) config: VmConfig,
}

/// Check `saved` and build its machine and vCPUs.
pub(crate) fn prepare(saved: &SavedMachine, opts: &RestoreOptions) -> Result<Prepared, LoadError> {
    let mut config = VmConfig {
        machine: saved.config.clone(),
        host: opts.host.clone(),
    };
    // The VM's disks and taps are this host's: each named by its id.
    let disks: Vec<&str> = config.machine.disks.iter().map(|d| d.id.as_str()).collect();
    let nets: Vec<&str> = config.machine.nets.iter().map(|n| n.id.as_str()).collect();
    config
        .host
        .resolve_named(&disks, &nets)
        .map_err(|e| LoadError::Unfit("CONF", e.to_string()))?;
    if config.machine.memory_budget.is_none()
        && config.host.page_store != crate::config::PageStore::default()
    {
        tracing::warn!(
            "--page-store, --page-store-latency and --page-store-jitter are ignored: this VM has no memory budget, so no page store"
        );
    }
    config
        .validate()
        .map_err(|e| LoadError::Unfit("CONF", e.to_string()))?;
    // As `hover run` checks its flags: the image's end inside memory (a
    // guest has one), and a budget that holds the image and some pages.
    if saved.image_end == 0
        || saved.image_end >= config.machine.memory
        || !saved.image_end.is_multiple_of(4096)
    {
        return Err(LoadError::Unfit(
            "CONF",
            format!(
                "the guest image end {:#x} is outside guest memory",
                saved.image_end
            ),
        ));
    }
    super::check_budget(&config, saved.image_end)
        .map_err(|e| LoadError::Unfit("CONF", e.to_string()))?;
    let machine = Machine::create(&config)?;
    Ok(Prepared { machine, config })
}

impl Prepared {
    /// Whether the saved vCPUs can run here: each must have seen no CPUID
    /// feature that a vCPU booted here would not see (KVM adds bits of its
    /// own to the table it is given, so ask a vCPU, not the supported list).
    pub(crate) fn check_vcpus(&self, states: &[VcpuState]) -> Result<(), LoadError> {
        check_saved_vcpus(&self.set_cpuid()?, states)
    }

    /// Give each vCPU the CPUID table of this configuration; what each then
    /// offers (KVM adds bits of its own), for [`check_saved_vcpus`].
    pub(crate) fn set_cpuid(&self) -> Result<Vec<CpuId>, LoadError> {
        self.machine
            .vcpus
            .iter()
            .map(|v| {
                let fd = v.fd();
                fd.set_cpuid2(&self.machine.vcpu_cpuid(&self.config, v.index()))
                    .map_err(|e| LoadError::Host(KvmOp::SetCpuid.err()(e)))?;
                fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES)
                    .map_err(|e| LoadError::Host(KvmOp::GetCpuid.err()(e)))
            })
            .collect()
    }
}

/// Whether saved vCPUs can run on vCPUs offering `here` (one table each,
/// from [`Prepared::set_cpuid`]): as many, and each saw no CPUID feature
/// its vCPU here lacks.
pub(crate) fn check_saved_vcpus(here: &[CpuId], states: &[VcpuState]) -> Result<(), LoadError> {
    if states.len() != here.len() {
        return Err(LoadError::Unfit(
            "VCPU",
            format!("{} vCPU states for {} vCPUs", states.len(), here.len()),
        ));
    }
    for (i, (st, h)) in states.iter().zip(here).enumerate() {
        check_cpuid(i, &st.cpuid, h).map_err(|r| LoadError::Unfit("VCPU", r.to_string()))?;
    }
    Ok(())
}

impl Vm {
    /// Record where this VM came from (a snapshot, a migration): in the
    /// outcome and in `GET /vm`.
    pub(crate) fn mark_restored(&mut self, from: String, memory_restore: &'static str, pages: u64) {
        self.arrival.restored = Some(RestoreReport {
            snapshot: from.clone(),
            memory_restore,
            to_running_us: us_since(self.hosting.created_at, Instant::now()),
            running_tsc: 0,
            pages_loaded: pages,
        });
        self.status.locked().restored_from = Some(from);
    }

    /// Load a saved state into this built VM, in the order that works:
    /// irqchip, each vCPU, the clock, the devices.
    pub(crate) fn load_state(&mut self, s: &VmState) -> Result<(), LoadError> {
        let vcpus = std::mem::take(&mut self.vcpus);
        let loaded = self.load_state_with(s, |states| {
            vcpus
                .iter()
                .zip(states)
                .enumerate()
                .try_for_each(|(i, (v, st))| v.restore_state(st).map_err(|e| (i, e)))
        });
        self.vcpus = vcpus;
        loaded
    }

    /// [`Vm::load_state`], the vCPUs' states loaded by `load_vcpus`
    /// (directly, or through their threads once threads run, all at once);
    /// Err: the first vCPU that refused its state, and why.
    pub(crate) fn load_state_with(
        &mut self,
        s: &VmState,
        load_vcpus: impl FnOnce(&[VcpuState]) -> Result<(), (usize, StateError)>,
    ) -> Result<(), LoadError> {
        Irqchips(&self.fd).load(&s.machine.irqchip)?;
        // The PIT is a Linux guest's (the VM built from its configuration
        // has one exactly then).
        match (&s.machine.pit, self.config().guest.is_linux()) {
            (Some(pit), true) => Pit(&self.fd).load(pit)?,
            (None, false) => {}
            (Some(_), false) => {
                return Err(LoadError::Unfit(
                    "MACH",
                    "a PIT state for a VM without a PIT".into(),
                ))
            }
            (None, true) => {
                return Err(LoadError::Unfit(
                    "MACH",
                    "no PIT state for a Linux guest, which has a PIT".into(),
                ))
            }
        }
        load_vcpus(&s.vcpus).map_err(|(i, e)| match e {
            StateError::Mismatch(r) => LoadError::Unfit("VCPU", format!("vCPU {i}: {r}")),
            other => LoadError::Host(Error::Host {
                what: "restore a vCPU",
                source: std::io::Error::other(format!("vCPU {i}: {other}")),
            }),
        })?;
        // The guest's TSC keeps its saved rate (KVM scales it).
        if let Some(v) = s.vcpus.first() {
            self.tsc_khz = v.tsc_khz;
            self.booster.set_tsc_khz(v.tsc_khz as u64);
        }
        Clock(&self.fd).load(&s.machine.clock)?;
        self.devices.load(&s.devices)?;
        Ok(())
    }

    /// Build a VM from the snapshot at `path`. The file is checked whole
    /// first (header, sections, CRCs, fit to this host): a bad one is
    /// refused with an error naming the section and offset, and nothing
    /// starts. Nothing runs until [`Vm::run`].
    pub fn restore(path: &Path, opts: &RestoreOptions) -> Result<Vm, Error> {
        let created_at = Instant::now();
        let phase = |what: &str| {
            tracing::debug!(us = us_since(created_at, Instant::now()), "restore: {what}")
        };
        opts.check()?;
        let snap = Arc::new(Snapshot::open(path)?);
        phase("snapshot checked");
        let s = &snap.state;
        let unfit = |e: LoadError| match e {
            LoadError::Unfit(section, reason) => Error::Snapshot(SnapshotError::Unfit {
                path: path.into(),
                section,
                reason,
            }),
            LoadError::Host(e) => e,
        };
        let p = prepare(&s.config, opts).map_err(unfit)?;
        phase("machine created");
        p.check_vcpus(&s.vcpus).map_err(unfit)?;
        phase("vCPUs created, CPUID checked");
        let memory = opts.memory.resolve(&p.config.machine);
        let lazy = memory != MemoryRestore::Eager || p.config.machine.memory_budget.is_some();
        // Under the pager only the pinned part is loaded now; eagerly, all.
        let end = if lazy { s.config.image_end } else { u64::MAX };
        let pages_loaded = memory::load(&snap, &p.machine.ram, end)?;
        phase("memory loaded");
        let source = lazy.then(|| snap.clone() as Arc<dyn PageSource>);
        let sink = open_console(&p.config)?;
        let config = p.config;
        let mut vm = Vm::assemble(
            p.machine,
            &config,
            s.config.clone(),
            sink,
            source,
            created_at,
        )?;
        phase("devices and pager started");
        // The pager runs from here on, so KVM may touch any guest page.
        vm.load_state(s).map_err(unfit)?;
        phase("state loaded");
        if memory == MemoryRestore::Prefetch {
            // The hot set first, then every page the file holds (the
            // loader skips what is in place by then). Under a budget only
            // the hot set: cold pages loaded to fill it would be the first
            // evicted, and every demand fault would evict one.
            let budgeted = config.machine.memory_budget.is_some();
            let of = snap.clone();
            let order = move || {
                if budgeted {
                    of.hot.iter().copied().filter(|&g| of.holds(g)).collect()
                } else {
                    let stored: Vec<u64> = of.stored_pages().map(|(gpa, _)| gpa).collect();
                    paged::block_order(&of.hot, &stored)
                }
            };
            let events = vm.events.tx.clone();
            let loaded = Box::new(move || {
                let _ = events.send(VmEvent::PrefetchLoaded);
            });
            let pager = vm.paging.pager_mut().expect("a lazy restore has a pager");
            pager.prefetch(
                order,
                snap.clone(),
                opts.prefetch_rate,
                loaded,
                paged::LoaderStart::Held,
            )?;
            phase("prefetch started");
        }
        vm.mark_restored(
            path.display().to_string(),
            match (config.machine.memory_budget, memory) {
                (Some(_), MemoryRestore::Eager) => "lazy",
                _ => memory.name(),
            },
            pages_loaded,
        );
        Ok(vm)
    }
}

impl Vm {
    /// Once a prefetching restore has placed every page the snapshot held
    /// (or a post-copy destination every page it held when all had arrived),
    /// a VM without a memory budget needs its pager no more: guest memory
    /// goes back to the kernel ([`crate::memory::paged::Pager::release`]),
    /// and snapshots and migrations read it as any VM's. A VM with a budget
    /// keeps paging. Err: the pager could not let go (the VM must end:
    /// faults might wait with nobody to serve them).
    pub(super) fn release_loaded_pager(&mut self) -> Result<(), crate::memory::paged::PagerError> {
        let arriving = matches!(
            self.arrival.postcopy_in,
            Some(super::destination::postcopy::PostcopyIn::Arriving(_))
        );
        if self.config().memory_budget.is_some() || arriving {
            return Ok(());
        }
        if self.paging.pager().is_none() {
            return Ok(());
        }
        // The balloon drops pages itself from now on (and the pager's
        // state goes with it).
        self.devices.attach_pager(None);
        if let Some(stats) = self.paging.release()? {
            tracing::debug!(
                pages = stats.pushed_pages,
                "prefetch loaded; guest memory handed back to the kernel"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, ecx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            ecx,
            ..Default::default()
        }
    }

    #[test]
    fn auto_prefetches_where_the_pager_can_serve_the_vm() {
        use crate::config::{MachineConfig, MemoryBackend};
        let anon = MachineConfig::default();
        let budgeted = MachineConfig {
            memory_budget: Some(32 << 20),
            ..MachineConfig::default()
        };
        let memfd = MachineConfig {
            memory_backend: MemoryBackend::Memfd,
            ..MachineConfig::default()
        };
        assert_eq!(MemoryRestore::default(), MemoryRestore::Auto);
        assert_eq!(
            MemoryRestore::Auto.resolve(&budgeted),
            MemoryRestore::Prefetch
        );
        assert_eq!(MemoryRestore::Auto.resolve(&memfd), MemoryRestore::Eager);
        let here = match crate::memory::uffd::pager_usable() {
            Ok(()) => MemoryRestore::Prefetch,
            Err(_) => MemoryRestore::Eager,
        };
        assert_eq!(MemoryRestore::Auto.resolve(&anon), here);
        for m in [
            MemoryRestore::Eager,
            MemoryRestore::Lazy,
            MemoryRestore::Prefetch,
        ] {
            assert_eq!(m.resolve(&memfd), m, "an explicit choice stands");
        }
    }

    #[test]
    fn cpuid_features_must_be_offered() {
        let host = CpuId::from_entries(&[leaf(1, 0b1011)]).unwrap();
        assert!(check_cpuid(0, &[leaf(1, 0b0011)], &host).is_ok());
        let e = check_cpuid(1, &[leaf(1, 0b0111)], &host)
            .unwrap_err()
            .to_string();
        assert!(e.contains("vCPU 1") && e.contains("0x4"), "{e}");
        // OSXSAVE is set by KVM at run time, not a host feature.
        assert!(check_cpuid(0, &[leaf(1, 1 << 27)], &host).is_ok());
    }
}
