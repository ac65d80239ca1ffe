//! Why a configuration is refused: each message names the flag and what
//! it accepts.

use hover_abi::haltpoll::MAX_POLL_NS;

use super::halt_poll::MAX_WINDOW_NS;
use super::machine::MAX_MEMORY;
use super::range::RangeError;

/// A configuration value out of range. Each message names the value and what is accepted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    /// The virtio devices asked for cannot be given.
    #[error("{0}")]
    Devices(String),
    /// vCPU count outside 1..=MAX.
    #[error("--vcpus {given} is out of range: a VM needs 1 to {max} vCPUs")]
    Vcpus {
        /// What was asked for.
        given: u32,
        /// The largest accepted value.
        max: u32,
    },
    /// More vCPUs than this host's KVM allows.
    #[error("--vcpus {given} is more than this host's KVM allows (at most {max} here)")]
    VcpusOverKvm {
        /// What was asked for.
        given: u32,
        /// KVM's recommended maximum.
        max: u32,
    },
    /// Memory not a multiple of the page size.
    #[error("--memory {given} bytes is not a multiple of 4 KiB (try {suggest} bytes)")]
    MemoryUnaligned {
        /// What was asked for.
        given: u64,
        /// The size rounded up to a page.
        suggest: u64,
    },
    /// Memory too large for the boot page tables.
    #[error("--memory {} is too large: at most {} is supported", super::size_text(*.given), super::size_text(MAX_MEMORY))]
    MemoryTooLarge {
        /// What was asked for.
        given: u64,
    },
    /// Command line longer than the boot-info page holds.
    #[error("the command line is {len} bytes long; at most {max} fit in the boot-info page")]
    CmdlineTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Command line refused by the built-in guest's workload table.
    #[error("{0}")]
    Cmdline(String),
    /// The memory budget exceeds the memory.
    #[error("--memory-budget {} is larger than --memory {}: a budget must not exceed the memory it limits", super::size_text(*.budget), super::size_text(*.memory))]
    BudgetOverMemory {
        /// The budget.
        budget: u64,
        /// The memory.
        memory: u64,
    },
    /// The memory budget is below what the guest needs resident.
    #[error("--memory-budget {} is below the working minimum of {} MiB (the boot area and guest image stay resident, plus 4 MiB to page in)", super::size_text(*.budget), .minimum.div_ceil(1 << 20))]
    BudgetTooSmall {
        /// The budget.
        budget: u64,
        /// The minimum.
        minimum: u64,
    },
    /// The budget is not a multiple of the page size.
    #[error("--memory-budget {0} bytes is not a multiple of 4 KiB")]
    BudgetUnaligned(u64),
    /// Paging needs anonymous memory.
    #[error("--memory-backend memfd cannot be combined with --memory-budget: the pager needs anonymous memory")]
    PagingNeedsAnonymous,
    /// Async PF asked for on a KVM without it.
    #[error("--async-pf on: this KVM does not offer asynchronous page faults (CPUID 0x40000001 lacks ASYNC_PF or ASYNC_PF_INT); use --async-pf off")]
    AsyncPfUnsupported,
    /// A halt-poll window out of range.
    #[error("--halt-poll-ns {0} is too large: at most {MAX_WINDOW_NS} (10 ms) is accepted")]
    HaltPollTooLarge(u64),
    /// PVH boot of an image without a PVH entry.
    #[error("--boot pvh: the guest image has no PVH entry (an ELF note \"Xen\" of type XEN_ELFNOTE_PHYS32_ENTRY, 18)")]
    NoPvhEntry,
    /// A guest poll limit out of range.
    #[error("--guest-halt-poll-max {} is out of range: give 0 (no guest polling) up to {}", super::time_text(*.0), super::time_text(MAX_POLL_NS))]
    GuestPollMax(u64),
    /// A governor budget out of range.
    #[error("--halt-poll-budget {0}% is out of range: give a share of one CPU in (0, 100]")]
    HaltPollBudget(f64),
    /// Halt polling asked for on a KVM that cannot set it per VM.
    #[error("this KVM cannot set halt polling per VM (no KVM_CAP_HALT_POLL, Linux 5.10+); leave --halt-poll-ns/--halt-poll unset")]
    HaltPollUnsupported,
    /// A dirty ring size out of range.
    #[error("--dirty-ring {0}: give a power of two from 256 to 65536 entries (a ring is at least a page)")]
    DirtyRing(u32),
    /// An `--io-file` that is not storage.
    #[error("--io-file {path}: {why}; give a regular file (created if missing) or a block device")]
    IoFile {
        /// The path.
        path: String,
        /// Why not.
        why: String,
    },
    /// A boosting setting out of range.
    #[error("{0}")]
    Boost(RangeError),
    /// A `--guest-*` limit out of range.
    #[error("{0}")]
    Limits(RangeError),
}
