//! A vCPU: its entry state, its saved state, and the thread that runs it.
//!
//! [`Vcpu`] is a vCPU before its thread starts: the VM builds it, loads its
//! entry state (a fresh boot) or its saved state (a restore), then hands it
//! to [`thread::VcpuHandle::spawn`], a small state machine (running, paused,
//! exited) that the VM drives with messages.

pub mod state;
pub mod thread;

use std::fmt;
use std::sync::Arc;

use kvm_bindings::{kvm_mp_state, CpuId, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::{VcpuFd, VmFd};

use crate::arch::x86_64::entry;
use crate::KvmOp;
use state::StateLayout;

/// General and control registers of a stopped vCPU.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RegisterDump {
    /// Instruction pointer.
    pub rip: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// Flags.
    pub rflags: u64,
    /// RAX, RBX, RCX, RDX, RSI, RDI, RBP.
    pub gprs: [u64; 7],
    /// Code segment selector (low bits: privilege level).
    pub cs: u16,
    /// Stack segment selector.
    pub ss: u16,
    /// CR0.
    pub cr0: u64,
    /// CR2 (last page-fault address).
    pub cr2: u64,
    /// CR3 (page-table root).
    pub cr3: u64,
    /// CR4.
    pub cr4: u64,
    /// EFER.
    pub efer: u64,
}

impl fmt::Display for RegisterDump {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.gprs;
        writeln!(
            f,
            "  rip {:#018x}  rsp {:#018x}  rflags {:#x}",
            self.rip, self.rsp, self.rflags
        )?;
        writeln!(
            f,
            "  cs {:#06x} (cpl {})  ss {:#06x}",
            self.cs,
            self.cs & 3,
            self.ss
        )?;
        writeln!(
            f,
            "  rax {:#x}  rbx {:#x}  rcx {:#x}  rdx {:#x}",
            g[0], g[1], g[2], g[3]
        )?;
        writeln!(f, "  rsi {:#x}  rdi {:#x}  rbp {:#x}", g[4], g[5], g[6])?;
        write!(
            f,
            "  cr0 {:#x}  cr2 {:#x}  cr3 {:#x}  cr4 {:#x}  efer {:#x}",
            self.cr0, self.cr2, self.cr3, self.cr4, self.efer
        )
    }
}

/// A guest that stopped in a way it did not ask for.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GuestCrash {
    /// The vCPU that stopped.
    pub vcpu: usize,
    /// KVM's exit reason, in words.
    pub reason: String,
    /// Registers at the stop, if KVM could read them.
    pub registers: Option<RegisterDump>,
}

impl fmt::Display for GuestCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the guest crashed: vCPU {} stopped with {}",
            self.vcpu, self.reason
        )?;
        match &self.registers {
            Some(r) => write!(f, "\nregisters of vCPU {}:\n{r}", self.vcpu),
            None => write!(f, " (registers unavailable)"),
        }
    }
}

/// How a vCPU's run ended, reported to the VM once.
#[derive(Debug)]
pub enum VcpuEvent {
    /// The guest asked to power off with this code.
    Exit {
        /// The vCPU that asked.
        vcpu: usize,
        /// The exit code.
        code: u32,
    },
    /// The guest asked to reset the machine.
    Reboot {
        /// The vCPU that asked.
        vcpu: usize,
    },
    /// The guest crashed.
    Crash(GuestCrash),
    /// A KVM call failed on the host side.
    Failed {
        /// The vCPU.
        vcpu: usize,
        /// The failing ioctl.
        error: kvm_ioctls::Error,
    },
    /// The vCPU's thread panicked (a bug in the monitor).
    Panicked {
        /// The vCPU.
        vcpu: usize,
    },
}

/// Where a vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Hover's 64-bit entry at this address (docs/ABI.md, "Entry state").
    Hover(u64),
    /// The PVH protocol's 32-bit entry, with EBX = `start_info`.
    Pvh {
        /// The 32-bit entry point.
        entry: u64,
        /// Guest-physical address of the start-info page.
        start_info: u64,
    },
    /// The Linux boot protocol's 64-bit entry, with RSI = `zero_page`.
    Linux {
        /// The kernel's 64-bit entry point.
        entry: u64,
        /// Guest-physical address of the zero page (`struct boot_params`).
        zero_page: u64,
    },
}

/// One vCPU, before its thread starts.
pub struct Vcpu {
    index: u32,
    fd: VcpuFd,
    layout: Arc<StateLayout>,
    /// The VM's dirty rings, if it has them (a full ring stops this vCPU).
    rings: Option<Arc<crate::migration::dirty::RingSet>>,
    /// The VM's throttles (a migration slows vCPUs that outrun the link).
    throttle: Option<Arc<crate::migration::throttle::Throttle>>,
    /// The VM's booster (priority boosting of this vCPU's thread).
    booster: Option<Arc<crate::sched::boost::Booster>>,
}

impl Vcpu {
    /// Create vCPU `index` in `vm`; `layout` says which state it has.
    pub fn new(vm: &VmFd, index: u32, layout: Arc<StateLayout>) -> Result<Self, crate::Error> {
        let fd = vm
            .create_vcpu(index as u64)
            .map_err(KvmOp::CreateVcpu.err())?;
        Ok(Vcpu {
            index,
            fd,
            layout,
            rings: None,
            throttle: None,
            booster: None,
        })
    }

    /// Give the vCPU the VM's dirty rings.
    pub fn attach_ring(&mut self, rings: Arc<crate::migration::dirty::RingSet>) {
        self.rings = Some(rings);
    }

    /// Give the vCPU the VM's throttles.
    pub fn attach_throttle(&mut self, throttle: Arc<crate::migration::throttle::Throttle>) {
        self.throttle = Some(throttle);
    }

    /// Give the vCPU the VM's booster.
    pub fn attach_booster(&mut self, booster: Arc<crate::sched::boost::Booster>) {
        self.booster = Some(booster);
    }

    /// The vCPU's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The vCPU's KVM handle.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// Load CPUID and the 64-bit entry state, and make the vCPU runnable
    /// (application processors start in wait-for-SIPI otherwise).
    pub fn configure(&self, cpuid: &CpuId, entry_point: u64) -> Result<(), crate::Error> {
        self.configure_with(cpuid, Entry::Hover(entry_point))
    }

    /// Set CPUID and enter through `how` (Hover's 64-bit entry, or the PVH
    /// protocol's 32-bit one), runnable.
    pub fn configure_with(&self, cpuid: &CpuId, how: Entry) -> Result<(), crate::Error> {
        self.fd.set_cpuid2(cpuid).map_err(KvmOp::SetCpuid.err())?;
        let sregs = self.fd.get_sregs().map_err(KvmOp::GetSregs.err())?;
        let (sregs, regs) = match how {
            Entry::Hover(at) => (entry::sregs(sregs, self.index), entry::regs(at, self.index)),
            Entry::Pvh {
                entry: at,
                start_info,
            } => (entry::pvh_sregs(sregs), entry::pvh_regs(at, start_info)),
            Entry::Linux {
                entry: at,
                zero_page,
            } => (
                entry::linux_sregs(sregs, self.index),
                entry::linux_regs(at, zero_page, self.index),
            ),
        };
        self.fd.set_sregs(&sregs).map_err(KvmOp::SetSregs.err())?;
        self.fd.set_regs(&regs).map_err(KvmOp::SetRegs.err())?;
        self.fd
            .set_fpu(&entry::fpu())
            .map_err(KvmOp::SetFpu.err())?;
        self.fd
            .set_mp_state(kvm_mp_state {
                mp_state: KVM_MP_STATE_RUNNABLE,
            })
            .map_err(KvmOp::SetMpState.err())?;
        Ok(())
    }

    /// Set CPUID only: an application processor of a PVH boot stays in
    /// KVM's wait-for-SIPI state until the guest starts it (INIT/SIPI).
    pub fn prepare_application_processor(&self, cpuid: &CpuId) -> Result<(), crate::Error> {
        self.fd.set_cpuid2(cpuid).map_err(KvmOp::SetCpuid.err())
    }

    /// Read the registers for a crash report.
    pub fn dump(&self) -> Option<RegisterDump> {
        let r = self.fd.get_regs().ok()?;
        let s = self.fd.get_sregs().ok()?;
        Some(RegisterDump {
            rip: r.rip,
            rsp: r.rsp,
            rflags: r.rflags,
            gprs: [r.rax, r.rbx, r.rcx, r.rdx, r.rsi, r.rdi, r.rbp],
            cs: s.cs.selector,
            ss: s.ss.selector,
            cr0: s.cr0,
            cr2: s.cr2,
            cr3: s.cr3,
            cr4: s.cr4,
            efer: s.efer,
        })
    }
}
