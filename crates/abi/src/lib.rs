//! The guest <-> host contract of Hover, as types and constants.
//!
//! This crate is the single source of truth shared by the monitor (`hover-vmm`)
//! and the built-in guest (`crates/guest`). It is `no_std` and has no
//! dependencies so that the freestanding guest can use it unchanged.
//! docs/ABI.md explains the same contract in words.
#![no_std]
#![deny(missing_docs)]

pub mod acpi;
pub mod apf_policy;
pub mod boost;
pub mod boot;
pub mod cmdline;
pub mod control;
pub mod haltpoll;
pub mod layout;
pub mod pv;
pub mod pvh;
pub mod pvio;
pub mod vectors;
pub mod workload;

/// Exit codes the built-in guest uses. 0 means success; every failure code is
/// 16 or above so that it never collides with `hover`'s own exit codes (1-3).
pub mod exit_code {
    /// The workload finished and its checks passed.
    pub const OK: u32 = 0;
    /// The command line could not be parsed (a token without `=`, a bad number).
    pub const BAD_CMDLINE: u32 = 16;
    /// `workload=` names a workload the guest does not have.
    pub const UNKNOWN_WORKLOAD: u32 = 17;
    /// The guest runtime panicked (a bug in the guest); the message is on the console.
    pub const PANIC: u32 = 18;
    /// An unexpected CPU exception; vector, RIP and error code are on the console.
    pub const EXCEPTION: u32 = 19;
    /// A workload's own check failed (for example not every vCPU showed up).
    pub const WORKLOAD_FAILED: u32 = 20;
    /// The boot-info page was missing or had the wrong magic/version.
    pub const BAD_BOOT_INFO: u32 = 21;
    /// The workload needs a device this platform lacks (under another VMM:
    /// Hover's I/O device, MSI injection); a message names it.
    pub const UNAVAILABLE: u32 = 22;
}
