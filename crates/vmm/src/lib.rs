//! Hover: a KVM virtual machine monitor built to keep guests fast when their
//! host is short of memory, busy, or moving them. This library owns KVM, guest
//! memory, vCPUs and devices; the `hover` binary is its command line.
//!
//! A VM's life: [`VmConfig`] is validated, [`Vm::new`] builds memory, the
//! irqchip, vCPUs and devices and loads the guest (or [`Vm::restore`]
//! builds it from a snapshot), [`Vm::run`] runs the vCPU threads and the
//! control loop until the guest powers off or a command ([`Controller`])
//! ends the run, and returns a [`RunOutcome`].
//! docs/ARCHITECTURE.md walks the boot sequence step by step.
#![deny(missing_docs)]
// Functions that fit on a screen: at most 120 lines (clippy.toml).
#![warn(clippy::too_many_lines)]

pub mod api;
pub mod arch;
pub mod boot;
pub mod config;
pub mod devices;
pub mod firecracker;
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod memory;
pub mod migration;
pub mod report;
pub mod sched;
pub mod seccomp;
pub mod signals;
pub mod state;
pub mod stats;
pub mod sync;
pub mod vcpu;
pub mod vm;

pub use config::{ConsoleTarget, GuestImage, MemoryBackend, VmConfig};
pub use report::{ReportEntry, ReportValue};
pub use vcpu::{GuestCrash, RegisterDump};
pub use vm::{
    BootTimings, Command, CommandError, Controller, EndReason, Lifecycle, MemoryRestore,
    MemoryUsage, ReceiveOptions, RestoreOptions, RunOutcome, Vm,
};

/// A KVM operation, named for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum KvmOp {
    CreateVm,
    CreateIrqchip,
    SetTssAddress,
    SetMemoryRegion,
    GetSupportedCpuid,
    CreateVcpu,
    SetCpuid,
    GetCpuid,
    GetSregs,
    SetSregs,
    SetRegs,
    SetFpu,
    SetMpState,
    GetTscKhz,
    GetMsrs,
    RegisterIrqfd,
    EnableCap,
    RegisterIoevent,
    SetGsiRouting,
    GetIrqchip,
    SetIrqchip,
    GetClock,
    SetClock,
    GetPit,
    SetPit,
    Run,
}

impl KvmOp {
    /// A closure turning a KVM error from this operation into an [`Error`].
    pub fn err(self) -> impl Fn(kvm_ioctls::Error) -> Error {
        move |source| Error::Kvm { op: self, source }
    }
}

/// Everything that can stop a VM from being built or run.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is out of range.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// seccomp filters cannot be used (`--seccomp off` runs without).
    #[error(transparent)]
    Seccomp(#[from] seccomp::Error),
    /// The guest image cannot be booted.
    #[error(transparent)]
    Image(#[from] boot::ImageError),
    /// A Linux kernel or initrd was refused.
    #[error(transparent)]
    Linux(Box<boot::linux::LinuxError>),
    /// /dev/kvm cannot be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    KvmUnavailable(kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("KVM operation {op:?} failed: {source}")]
    Kvm {
        /// Which operation.
        op: KvmOp,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// Guest RAM could not be set up.
    #[error(transparent)]
    Memory(#[from] memory::MemoryError),
    /// Writing the boot area into guest memory failed.
    #[error("cannot write the boot area into guest memory: {0}")]
    BootArea(#[from] vm_memory::GuestMemoryError),
    /// The console target could not be opened.
    #[error("cannot open the console target {target}: {source}")]
    Console {
        /// The target, as configured.
        target: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A host-side resource (eventfd, signal handler, thread) failed.
    #[error("cannot {what}: {source}")]
    Host {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The pager could not start.
    #[error(transparent)]
    Pager(#[from] memory::paged::PagerError),
    /// The pager could not serve a guest page during the run.
    #[error("the VM was stopped: {0}")]
    PagerFailed(String),
    /// The API socket could not be set up.
    #[error(transparent)]
    Api(#[from] api::ApiError),
    /// A snapshot could not be read or does not fit this host.
    #[error(transparent)]
    Snapshot(#[from] state::file::SnapshotError),
    /// A migration could not be received.
    #[error("migration: {0}")]
    Migration(migration::MigrationError),
    /// The guest crashed (triple fault, unexpected exit).
    #[error("{0}")]
    GuestCrash(Box<GuestCrash>),
}

impl Error {
    /// Whether the user gave bad input (configuration or guest image).
    pub fn is_bad_input(&self) -> bool {
        if let Error::Migration(m) = self {
            return m.is_bad_input();
        }
        matches!(
            self,
            Error::Config(_)
                | Error::Image(_)
                | Error::Linux(_)
                | Error::Pager(memory::paged::PagerError::Store(_))
                | Error::Console { .. }
                | Error::Api(api::ApiError::Exists(_) | api::ApiError::Bind { .. })
                | Error::Snapshot(_)
        )
    }
}
