//! A vCPU: its entry state, its thread's run loop and exit dispatch.
//!
//! Each vCPU runs `KVM_RUN` on its own thread until the guest powers off, the
//! guest crashes, or the VM tells it to stop. The VM stops a vCPU by setting
//! the shared stop flag and kicking the thread with [`kick_signal`], which
//! makes `KVM_RUN` return `EINTR` (even while the vCPU is halted).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};

use kvm_bindings::{kvm_mp_state, CpuId, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use vmm_sys_util::signal::{register_signal_handler, SIGRTMIN};

use crate::arch::x86_64::entry;
use crate::devices::{Devices, PortAction};
use crate::KvmOp;

/// The real-time signal used to kick vCPU threads out of `KVM_RUN`.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

/// Install the (empty) kick handler once per process; its only job is to
/// interrupt `KVM_RUN`, so that the default action (terminate) never runs.
pub fn install_kick_handler() -> std::io::Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}
        result = register_signal_handler(kick_signal(), on_kick)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()));
    });
    result
}

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

/// How a vCPU thread ended.
#[derive(Debug)]
pub enum VcpuEvent {
    /// The guest asked to power off with this code.
    Exit {
        /// The vCPU that asked.
        vcpu: usize,
        /// The exit code.
        code: u32,
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
    /// The VM asked the vCPU to stop.
    Stopped {
        /// The vCPU.
        vcpu: usize,
    },
}

/// One vCPU, before its thread starts.
pub struct Vcpu {
    index: u32,
    fd: VcpuFd,
}

/// What an exit asks for, with the borrow of the run structure released.
enum Next {
    Resume,
    Exit(u32),
    Crash(String),
    /// KVM_EXIT_INTERNAL_ERROR: the suberror is read from the run structure.
    InternalError,
}

impl Vcpu {
    /// Create vCPU `index` in `vm`.
    pub fn new(vm: &VmFd, index: u32) -> Result<Self, crate::Error> {
        let fd = vm
            .create_vcpu(index as u64)
            .map_err(KvmOp::CreateVcpu.err())?;
        Ok(Vcpu { index, fd })
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
        self.fd.set_cpuid2(cpuid).map_err(KvmOp::SetCpuid.err())?;
        let sregs = self.fd.get_sregs().map_err(KvmOp::GetSregs.err())?;
        self.fd
            .set_sregs(&entry::sregs(sregs, self.index))
            .map_err(KvmOp::SetSregs.err())?;
        self.fd
            .set_regs(&entry::regs(entry_point, self.index))
            .map_err(KvmOp::SetRegs.err())?;
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

    /// The thread body: run until power-off, crash, failure or stop.
    pub fn run(mut self, devices: Arc<Devices>, stop: Arc<AtomicBool>) -> VcpuEvent {
        let vcpu = self.index as usize;
        loop {
            if stop.load(Ordering::Acquire) {
                return VcpuEvent::Stopped { vcpu };
            }
            let next = match self.fd.run() {
                Ok(exit) => dispatch(vcpu, exit, &devices),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    Next::Resume
                }
                Err(error) => return VcpuEvent::Failed { vcpu, error },
            };
            match next {
                Next::Resume => {}
                Next::Exit(code) => return VcpuEvent::Exit { vcpu, code },
                Next::Crash(reason) => {
                    return VcpuEvent::Crash(GuestCrash {
                        vcpu,
                        reason,
                        registers: self.dump(),
                    });
                }
                Next::InternalError => {
                    // SAFETY: KVM fills the `internal` member for this exit reason.
                    let sub = unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
                    let reason = format!(
                        "a KVM internal error (suberror {sub}): the instruction emulator could not continue"
                    );
                    return VcpuEvent::Crash(GuestCrash {
                        vcpu,
                        reason,
                        registers: self.dump(),
                    });
                }
            }
        }
    }
}

fn dispatch(vcpu: usize, exit: VcpuExit<'_>, devices: &Devices) -> Next {
    match exit {
        VcpuExit::IoOut(port, data) => match devices.port_write(vcpu, port, data) {
            PortAction::Continue => Next::Resume,
            PortAction::Exit(code) => Next::Exit(code),
        },
        VcpuExit::IoIn(port, data) => {
            devices.port_read(port, data);
            Next::Resume
        }
        VcpuExit::MmioRead(addr, data) => {
            tracing::debug!(vcpu, "read of unclaimed MMIO address {addr:#x}");
            data.fill(0xff);
            Next::Resume
        }
        VcpuExit::MmioWrite(addr, _) => {
            tracing::debug!(vcpu, "write to unclaimed MMIO address {addr:#x} ignored");
            Next::Resume
        }
        VcpuExit::Shutdown => Next::Crash("a triple fault (KVM_EXIT_SHUTDOWN)".into()),
        VcpuExit::InternalError => Next::InternalError,
        VcpuExit::FailEntry(reason, cpu) => Next::Crash(format!(
            "a failed VM entry (hardware reason {reason:#x} on host CPU {cpu}): the entry state is invalid"
        )),
        VcpuExit::Hlt => Next::Crash("an unexpected HLT exit (the in-kernel irqchip should handle HLT)".into()),
        other => Next::Crash(format!("an unexpected exit: {other:?}")),
    }
}
