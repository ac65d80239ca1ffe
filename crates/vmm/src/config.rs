//! `VmConfig`: what to build, checked before anything touches KVM.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hover_abi::boot::CMDLINE_MAX;
use hover_abi::cmdline::CmdlineError;

pub use crate::devices::limits::GuestLimits;
pub use crate::devices::pvio::PvioConfig;
pub use crate::memory::paged::PagingConfig;
pub use crate::sched::halt_poll::HaltPoll;
use crate::sched::halt_poll::MAX_WINDOW_NS;
use hover_abi::layout::{MAX_MAPPED_GIB, MAX_VCPUS, MMIO_HOLE_END, MMIO_HOLE_START, PAGE_SIZE};
use hover_abi::workload::{self, ParamKind, WorkloadError};

/// Default number of vCPUs.
pub const DEFAULT_VCPUS: u32 = 2;
/// Default guest memory: 256 MiB.
pub const DEFAULT_MEMORY: u64 = 256 << 20;
/// Default command line.
pub const DEFAULT_CMDLINE: &str = "workload=hello";
/// Largest guest memory: what the boot page tables map, less the MMIO hole.
pub const MAX_MEMORY: u64 = (MAX_MAPPED_GIB << 30) - (MMIO_HOLE_END - MMIO_HOLE_START);

/// Which guest to boot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestImage {
    /// The guest embedded in this binary (crates/guest).
    Builtin,
    /// A 64-bit x86 ELF executable on disk.
    Path(PathBuf),
}

/// How guest RAM is backed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryBackend {
    /// Private anonymous memory (the default).
    #[default]
    Anonymous,
    /// A memfd, so that another process can map the same RAM.
    Memfd,
}

/// A byte buffer shared with the caller, for capturing the console.
pub type SharedBuffer = Arc<Mutex<Vec<u8>>>;

/// Where the guest's serial console goes.
#[derive(Clone, Default)]
pub enum ConsoleTarget {
    /// Standard output (the default).
    #[default]
    Stdout,
    /// Standard error.
    Stderr,
    /// Discarded.
    Off,
    /// A file, created or truncated.
    File(PathBuf),
    /// An in-memory buffer (for tests and benchmarks).
    Buffer(SharedBuffer),
}

impl fmt::Debug for ConsoleTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConsoleTarget::Stdout => f.write_str("stdout"),
            ConsoleTarget::Stderr => f.write_str("stderr"),
            ConsoleTarget::Off => f.write_str("off"),
            ConsoleTarget::File(p) => write!(f, "file:{}", p.display()),
            ConsoleTarget::Buffer(_) => f.write_str("buffer"),
        }
    }
}

/// How the boot vCPU enters the guest image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BootProtocol {
    /// Hover's 64-bit entry (docs/ABI.md, "Entry state"), every vCPU at once.
    #[default]
    Hover,
    /// The PVH protocol's 32-bit entry (the image's Xen PHYS32_ENTRY note),
    /// as QEMU boots it; one vCPU.
    Pvh,
}

/// Everything needed to build a VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Number of vCPUs, 1 to [`MAX_VCPUS`] (and no more than KVM allows).
    pub vcpus: u32,
    /// Guest RAM in bytes, a multiple of 4 KiB.
    pub memory: u64,
    /// How RAM is backed.
    pub memory_backend: MemoryBackend,
    /// The guest image.
    pub guest: GuestImage,
    /// The guest command line, e.g. `workload=hello`.
    pub cmdline: String,
    /// How the boot vCPU enters the image (`--boot`).
    pub boot: BootProtocol,
    /// Where the serial console goes.
    pub console: ConsoleTarget,
    /// Overcommit guest memory with the pager (`None`: all RAM stays resident).
    pub paging: Option<PagingConfig>,
    /// Offer KVM's asynchronous page faults to the guest (ASYNC_PF and
    /// ASYNC_PF_INT in the KVM PV CPUID leaf).
    pub async_pf: bool,
    /// Halt polling for this VM.
    pub halt_poll: HaltPoll,
    /// Whether guest HLT exits to KVM (`false`: KVM_CAP_X86_DISABLE_EXITS).
    pub hlt_exits: bool,
    /// The longest the guest may poll before it halts, ns (0: no guest
    /// polling; `--guest-halt-poll-max`, `hover_abi::haltpoll`).
    pub guest_poll_max_ns: u64,
    /// The paravirtual I/O device's file.
    pub pvio: PvioConfig,
    /// Serve live figures on this Unix socket while running.
    pub api_socket: Option<PathBuf>,
    /// Per-vCPU dirty rings of this many entries (`None`: none), for live
    /// migration with `--dirty-tracking ring`.
    pub dirty_ring: Option<u32>,
    /// vCPU priority boosting (`--boost`, `--vcpu-rt`).
    pub boost: crate::sched::boost::BoostConfig,
    /// What guest requests may make the host do (`--guest-*`).
    pub limits: GuestLimits,
    /// seccomp filters on the VMM's threads (`--seccomp`).
    pub seccomp: crate::seccomp::Mode,
}

impl Default for VmConfig {
    fn default() -> Self {
        VmConfig {
            vcpus: DEFAULT_VCPUS,
            memory: DEFAULT_MEMORY,
            memory_backend: MemoryBackend::Anonymous,
            guest: GuestImage::Builtin,
            cmdline: DEFAULT_CMDLINE.to_string(),
            boot: BootProtocol::Hover,
            console: ConsoleTarget::Stdout,
            paging: None,
            async_pf: true,
            halt_poll: HaltPoll::KvmDefault,
            hlt_exits: true,
            guest_poll_max_ns: hover_abi::haltpoll::DEFAULT_POLL_NS,
            pvio: PvioConfig::default(),
            api_socket: None,
            dirty_ring: None,
            boost: Default::default(),
            limits: GuestLimits::default(),
            seccomp: Default::default(),
        }
    }
}

/// A configuration value out of range. Each message names the value and what is accepted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
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
    #[error("--memory {} MiB is too large: at most {} MiB is supported", .given >> 20, MAX_MEMORY >> 20)]
    MemoryTooLarge {
        /// What was asked for.
        given: u64,
    },
    /// A size string that does not parse.
    #[error(
        "'{0}' is not a size: use a number with an optional K, M, G or T suffix (e.g. 256M, 1G)"
    )]
    BadSize(String),
    /// A console target that does not parse.
    #[error("unknown console '{0}': use stdout, stderr, off or file:PATH")]
    BadConsole(String),
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
    #[error("--memory-budget {} MiB is larger than --memory {} MiB: a budget must not exceed the memory it limits", .budget >> 20, .memory >> 20)]
    BudgetOverMemory {
        /// The budget.
        budget: u64,
        /// The memory.
        memory: u64,
    },
    /// The memory budget is below what the guest needs resident.
    #[error("--memory-budget {} MiB is below the working minimum of {} MiB (the boot area and guest image stay resident, plus 4 MiB to page in)", .budget >> 20, .minimum.div_ceil(1 << 20))]
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
    /// PVH boot with more than one vCPU.
    #[error("--boot pvh starts one vCPU (bringing up others with INIT/SIPI is not built yet); got --vcpus {0}")]
    PvhVcpus(u32),
    /// A guest poll limit out of range.
    #[error(transparent)]
    GuestPollMax(#[from] crate::sched::guest_poll::LimitError),
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
    /// A duration that does not parse.
    #[error("'{0}' is not a duration: use a number with ns, us, ms or s (e.g. 0, 100us, 2ms)")]
    BadDuration(String),
    /// A boosting setting out of range.
    #[error("{0}")]
    Boost(String),
    /// A `--guest-*` limit out of range.
    #[error("{0}")]
    Limits(String),
}

impl VmConfig {
    /// Check every value that can be checked without KVM.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let max = MAX_VCPUS as u32;
        if self.vcpus == 0 || self.vcpus > max {
            return Err(ConfigError::Vcpus {
                given: self.vcpus,
                max,
            });
        }
        if let Some(path) = &self.pvio.file {
            crate::devices::pvio::check_io_path(path).map_err(|why| ConfigError::IoFile {
                path: path.display().to_string(),
                why,
            })?;
        }
        if !self.memory.is_multiple_of(PAGE_SIZE) {
            let suggest = self.memory.div_ceil(PAGE_SIZE) * PAGE_SIZE;
            return Err(ConfigError::MemoryUnaligned {
                given: self.memory,
                suggest,
            });
        }
        if self.memory > MAX_MEMORY {
            return Err(ConfigError::MemoryTooLarge { given: self.memory });
        }
        if self.cmdline.len() > CMDLINE_MAX {
            return Err(ConfigError::CmdlineTooLong {
                len: self.cmdline.len(),
                max: CMDLINE_MAX,
            });
        }
        if self.guest == GuestImage::Builtin {
            check_builtin_cmdline(&self.cmdline)?;
        }
        if let Some(n) = self.dirty_ring {
            if !n.is_power_of_two() || !(256..=65536).contains(&n) {
                return Err(ConfigError::DirtyRing(n));
            }
        }
        self.boost.check().map_err(ConfigError::Boost)?;
        self.limits.check().map_err(ConfigError::Limits)?;
        crate::sched::guest_poll::check_limit(self.guest_poll_max_ns)?;
        if self.boot == BootProtocol::Pvh && self.vcpus != 1 {
            return Err(ConfigError::PvhVcpus(self.vcpus));
        }
        match self.halt_poll {
            HaltPoll::Fixed { window_ns: ns } if ns > MAX_WINDOW_NS => {
                return Err(ConfigError::HaltPollTooLarge(ns))
            }
            HaltPoll::Auto { budget_pct } if !(budget_pct > 0.0 && budget_pct <= 100.0) => {
                return Err(ConfigError::HaltPollBudget(budget_pct))
            }
            _ => {}
        }
        if let Some(p) = &self.paging {
            if p.budget > self.memory {
                return Err(ConfigError::BudgetOverMemory {
                    budget: p.budget,
                    memory: self.memory,
                });
            }
            if !p.budget.is_multiple_of(PAGE_SIZE) {
                return Err(ConfigError::BudgetUnaligned(p.budget));
            }
            if self.memory_backend != MemoryBackend::Anonymous {
                return Err(ConfigError::PagingNeedsAnonymous);
            }
        }
        Ok(())
    }
}

/// Check a command line against the built-in guest's workload table.
pub fn check_builtin_cmdline(cmdline: &str) -> Result<(), ConfigError> {
    workload::resolve(cmdline)
        .map(|_| ())
        .map_err(|e| ConfigError::Cmdline(describe(e)))
}

fn describe(e: WorkloadError<'_>) -> String {
    let names: Vec<&str> = workload::WORKLOADS.iter().map(|w| w.name).collect();
    match e {
        WorkloadError::Syntax(CmdlineError::NotKeyValue(t)) => {
            format!("bad guest command line: '{t}' is not a key=value token")
        }
        WorkloadError::Syntax(CmdlineError::Duplicate(k)) => {
            format!("bad guest command line: '{k}' is given more than once")
        }
        WorkloadError::Syntax(CmdlineError::NotANumber { key, value }) => {
            format!("bad guest command line: {key}={value} is not a number")
        }
        WorkloadError::UnknownWorkload(w) => {
            format!(
                "unknown workload '{w}': the built-in guest has {}",
                names.join(", ")
            )
        }
        WorkloadError::BadValue { param, value } => {
            let accepted = match param.kind {
                ParamKind::Number { min, max, default } => {
                    format!("a number from {min} to {max} (default {default})")
                }
                ParamKind::Size { min, max, default } => {
                    format!("a size from {min} to {max} bytes, with K, M or G (default {default})")
                }
                ParamKind::Choice { values } => format!("one of {}", values.join(", ")),
            };
            format!(
                "bad guest command line: {}={value} is out of range: {} takes {accepted}",
                param.name, param.name
            )
        }
        WorkloadError::UnknownParam { workload: w, key } => {
            let spec = workload::find(w).expect("resolve returned a known workload");
            let mut keys: Vec<&str> = workload::GLOBAL_PARAMS.iter().map(|p| p.name).collect();
            keys.extend(spec.params.iter().map(|p| p.name));
            format!(
                "workload {w} takes no parameter '{key}': it accepts {}",
                keys.join(", ")
            )
        }
    }
}

/// Parse a size such as `256M`, `1G`, `4096` or `512MiB` (binary units).
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let bad = || ConfigError::BadSize(s.to_string());
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let stripped = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match stripped.chars().last() {
        Some('k') => (&stripped[..stripped.len() - 1], 10),
        Some('m') => (&stripped[..stripped.len() - 1], 20),
        Some('g') => (&stripped[..stripped.len() - 1], 30),
        Some('t') => (&stripped[..stripped.len() - 1], 40),
        _ => (stripped, 0),
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// Parse a duration such as `0`, `500ns`, `100us`, `2ms`, `1.5ms` or `1s`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, ConfigError> {
    let bad = || ConfigError::BadDuration(s.to_string());
    let t = s.trim();
    let (num, scale) = [("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .iter()
        .find_map(|(suffix, scale)| t.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((t, if t == "0" { 1.0 } else { f64::NAN }));
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(v * scale).is_finite() || v < 0.0 || v * scale > 3600.0 {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs_f64(v * scale))
}

/// Parse a console target: `stdout`, `stderr`, `off`, or `file:PATH`.
pub fn parse_console(s: &str) -> Result<ConsoleTarget, ConfigError> {
    match s {
        "stdout" => Ok(ConsoleTarget::Stdout),
        "stderr" => Ok(ConsoleTarget::Stderr),
        "off" => Ok(ConsoleTarget::Off),
        _ => match s.strip_prefix("file:") {
            Some(path) if !path.is_empty() => Ok(ConsoleTarget::File(PathBuf::from(path))),
            _ => Err(ConfigError::BadConsole(s.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        VmConfig::default().validate().unwrap();
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn durations_parse() {
        use std::time::Duration;
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("1.5ms"), Ok(Duration::from_micros(1500)));
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        for bad in ["2", "fast", "-1ms", "2 hours", "99999s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn paging_values_are_checked() {
        let paged = |memory: u64, budget: u64| VmConfig {
            memory,
            paging: Some(PagingConfig {
                budget,
                store: None,
                store_latency: std::time::Duration::ZERO,
                store_jitter: std::time::Duration::ZERO,
            }),
            ..VmConfig::default()
        };
        assert!(matches!(
            paged(64 << 20, 128 << 20).validate(),
            Err(ConfigError::BudgetOverMemory { .. })
        ));
        assert!(matches!(
            paged(64 << 20, 1000).validate(),
            Err(ConfigError::BudgetUnaligned(1000))
        ));
        let memfd = VmConfig {
            memory_backend: MemoryBackend::Memfd,
            ..paged(64 << 20, 32 << 20)
        };
        assert_eq!(memfd.validate(), Err(ConfigError::PagingNeedsAnonymous));
        paged(256 << 20, 64 << 20).validate().unwrap();
    }

    #[test]
    fn halt_poll_values_are_checked() {
        let c = |h| {
            VmConfig {
                halt_poll: h,
                ..VmConfig::default()
            }
            .validate()
        };
        assert!(c(HaltPoll::Fixed { window_ns: 200_000 }).is_ok());
        assert_eq!(
            c(HaltPoll::Fixed {
                window_ns: u64::MAX
            }),
            Err(ConfigError::HaltPollTooLarge(u64::MAX))
        );
        assert!(c(HaltPoll::Auto { budget_pct: 2.5 }).is_ok());
        for b in [0.0, -1.0, 100.5, f64::NAN] {
            assert!(
                matches!(
                    c(HaltPoll::Auto { budget_pct: b }),
                    Err(ConfigError::HaltPollBudget(_))
                ),
                "{b}"
            );
        }
    }

    #[test]
    fn consoles_parse() {
        assert!(matches!(parse_console("off"), Ok(ConsoleTarget::Off)));
        assert!(matches!(
            parse_console("file:/tmp/x"),
            Ok(ConsoleTarget::File(_))
        ));
        assert!(parse_console("stdot").is_err());
        assert!(parse_console("file:").is_err());
    }

    #[test]
    fn bad_values_are_refused() {
        let c = |f: fn(&mut VmConfig)| {
            let mut c = VmConfig::default();
            f(&mut c);
            c.validate()
        };
        assert_eq!(
            c(|c| c.vcpus = 0),
            Err(ConfigError::Vcpus { given: 0, max: 32 })
        );
        assert_eq!(
            c(|c| c.vcpus = 33),
            Err(ConfigError::Vcpus { given: 33, max: 32 })
        );
        assert!(matches!(
            c(|c| c.memory = 1000),
            Err(ConfigError::MemoryUnaligned { suggest: 4096, .. })
        ));
        assert!(matches!(
            c(|c| c.memory = 1 << 40),
            Err(ConfigError::MemoryTooLarge { .. })
        ));
        let err = c(|c| c.cmdline = "workload=nope".into()).unwrap_err();
        assert!(err.to_string().contains("unknown workload 'nope'"), "{err}");
        assert!(err.to_string().contains("hello"), "{err}");
        let err = c(|c| c.cmdline = "workload=hello x=1".into()).unwrap_err();
        assert!(err.to_string().contains("takes no parameter 'x'"), "{err}");
        // An external guest's command line is its own business.
        c(|c| {
            c.guest = GuestImage::Path("/some/guest".into());
            c.cmdline = "anything goes".into();
        })
        .unwrap();
    }
}
