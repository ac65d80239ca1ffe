//! The KVM machine under a VM: the VM fd, guest RAM registered with it,
//! the in-kernel irqchip, the settings KVM takes only before vCPUs exist,
//! and the vCPUs. Boot and restore both start here.

use std::sync::Arc;
use std::time::Instant;

use kvm_bindings::{kvm_userspace_memory_region, CpuId, KVM_MAX_CPUID_ENTRIES};
use kvm_ioctls::{Kvm, VmFd};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use crate::arch::x86_64::cpuid;
use crate::config::HaltPoll;
use crate::config::{ConfigError, VmConfig};
use crate::memory::GuestRam;
use crate::sched::halt_poll;
use crate::vcpu::state::StateLayout;
use crate::vcpu::Vcpu;
use crate::{Error, KvmOp};
use hover_abi::pv::{FEATURE_ASYNC_PF, FEATURE_ASYNC_PF_INT, FEATURE_ASYNC_PF_VMEXIT};

/// Where KVM may put its real-mode TSS (in the MMIO hole, as Firecracker does).
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;

/// What boot and restore need from the VM's environment. `/dev/kvm`
/// itself is closed once the VM exists: the VM's descriptor keeps it.
pub(crate) struct Machine {
    pub(super) fd: Arc<VmFd>,
    pub(super) ram: GuestRam,
    pub(super) supported: CpuId,
    /// Its vCPUs, created with it (nothing configured yet).
    pub(super) vcpus: Vec<Vcpu>,
}

/// `--io-file` fit to take the guest's writes (or to be made), checked
/// before anything is built or read: a boot, a restore and a migration's
/// destination alike.
pub(super) fn check_io_file(host: &crate::config::HostConfig) -> Result<(), ConfigError> {
    match &host.io_file {
        Some(path) => {
            crate::devices::pvio::check_io_path(path).map_err(|why| ConfigError::IoFile {
                path: path.display().to_string(),
                why: why.to_string(),
            })
        }
        None => Ok(()),
    }
}

impl Machine {
    /// Open KVM and create the VM with its RAM, irqchip, halt-poll
    /// settings and vCPUs.
    pub(super) fn create(config: &VmConfig) -> Result<Machine, Error> {
        check_io_file(&config.host)?;
        crate::host::block_file_size_signal();
        // Every thread the VM starts from here takes this mode.
        crate::seccomp::set_mode(config.host.seccomp);
        crate::seccomp::check(config.host.seccomp)?;
        let kvm = Kvm::new().map_err(Error::KvmUnavailable)?;
        let kvm_max = kvm.get_max_vcpus() as u32;
        if config.machine.vcpus > kvm_max {
            return Err(ConfigError::VcpusOverKvm {
                given: config.machine.vcpus,
                max: kvm_max,
            }
            .into());
        }
        let fd = Arc::new(kvm.create_vm().map_err(KvmOp::CreateVm.err())?);
        let t = Instant::now();
        let ram = GuestRam::new(config.machine.memory, config.machine.memory_backend)?;
        register_memory(&fd, &ram)?;
        // KVM's per-slot metadata grows with guest memory: the one part of
        // building a VM that does (docs/BENCHMARKS.md, snapshot).
        tracing::debug!(
            us = t.elapsed().as_micros() as u64,
            "guest RAM mapped and registered"
        );
        fd.set_tss_address(KVM_TSS_ADDRESS)
            .map_err(KvmOp::SetTssAddress.err())?;
        fd.create_irq_chip().map_err(KvmOp::CreateIrqchip.err())?;
        if config.machine.guest.is_linux() {
            // Linux calibrates against the PIT and routes its timer through
            // it at boot; the built-in guest keeps time by the LAPIC alone.
            let pit = kvm_bindings::kvm_pit_config {
                flags: kvm_bindings::KVM_PIT_SPEAKER_DUMMY,
                ..Default::default()
            };
            fd.create_pit2(pit).map_err(KvmOp::CreateIrqchip.err())?;
        }
        if config.machine.halt_poll != HaltPoll::KvmDefault && !halt_poll::supported(&fd) {
            return Err(ConfigError::HaltPollUnsupported.into());
        }
        if let HaltPoll::Fixed { window_ns } = config.machine.halt_poll {
            halt_poll::set_window(&fd, window_ns).map_err(KvmOp::EnableCap.err())?;
        }
        // KVM accepts these only before vCPUs exist.
        if let Some(entries) = config.machine.dirty_ring {
            crate::migration::dirty::ring::enable(&fd, entries).map_err(|e| Error::Host {
                what: "enable dirty rings",
                source: std::io::Error::other(e),
            })?;
        }
        if !config.machine.hlt_exits {
            halt_poll::disable_hlt_exits(&fd).map_err(KvmOp::EnableCap.err())?;
        }
        let supported = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(KvmOp::GetSupportedCpuid.err())?;
        let layout = StateLayout::probe(&kvm, &fd).map_err(|e| Error::Host {
            what: "learn this KVM's vCPU state layout",
            source: std::io::Error::other(e.to_string()),
        })?;
        let layout = Arc::new(layout);
        let vcpus = (0..config.machine.vcpus)
            .map(|i| Vcpu::new(&fd, i, layout.clone()))
            .collect::<Result<_, _>>()?;
        Ok(Machine {
            fd,
            ram,
            supported,
            vcpus,
        })
    }

    /// The CPUID table vCPU `index` gets on this host under `config`.
    pub(super) fn vcpu_cpuid(&self, config: &VmConfig, index: u32) -> CpuId {
        cpuid::for_vcpu(
            &self.supported,
            index,
            pv_withheld(config.machine.async_pf),
            pv_hints(&config.machine),
        )
    }
}

/// The KVM PV hints a VM's guest gets: a Linux guest allowed to poll
/// (`--guest-halt-poll-max` above 0) is told its vCPUs are not preempted,
/// the hint without which Linux does not load `cpuidle-haltpoll`. The
/// built-in guest polls by its own `idle=haltpoll` and needs none.
pub(super) fn pv_hints(m: &crate::config::MachineConfig) -> u32 {
    if m.guest.is_linux() && m.guest_poll_max_ns > 0 {
        hover_abi::pv::HINT_REALTIME
    } else {
        0
    }
}

/// PV features kept from the guest: async PF when it is off.
pub(super) fn pv_withheld(async_pf: bool) -> u32 {
    if async_pf {
        0
    } else {
        FEATURE_ASYNC_PF | FEATURE_ASYNC_PF_INT | FEATURE_ASYNC_PF_VMEXIT
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GuestImage, LinuxBoot, MachineConfig};

    #[test]
    fn only_a_linux_guest_allowed_to_poll_gets_the_realtime_hint() {
        let linux = GuestImage::Linux(LinuxBoot {
            kernel: "/vmlinuz".into(),
            initrd: None,
        });
        let m = |guest: GuestImage, ns: u64| MachineConfig {
            guest,
            guest_poll_max_ns: ns,
            ..MachineConfig::default()
        };
        assert_eq!(
            pv_hints(&m(linux.clone(), 100_000)),
            hover_abi::pv::HINT_REALTIME
        );
        assert_eq!(pv_hints(&m(linux.clone(), 0)), 0);
        assert_eq!(pv_hints(&m(GuestImage::Builtin, 100_000)), 0);
        assert_eq!(crate::config::default_guest_poll_ns(&linux), 0);
        assert_eq!(
            crate::config::default_guest_poll_ns(&GuestImage::Builtin),
            MachineConfig::default().guest_poll_max_ns
        );
    }
}
