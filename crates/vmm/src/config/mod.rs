//! A VM's configuration: what the VM *is* ([`MachineConfig`], saved in
//! snapshots and sent in migration streams) apart from how *this host* runs
//! it ([`HostConfig`]: files, sockets, guards; never saved or sent). Each
//! setting's type owns its check; subsystems import these types, and this
//! module imports no subsystem. The command line's parsers are the `hover`
//! binary's.

pub mod boost;
pub mod devices;
mod error;
pub mod halt_poll;
pub mod host;
pub mod limits;
pub mod machine;
pub mod migration_key;
pub mod range;

use hover_abi::cmdline::CmdlineError;
use hover_abi::workload::{self, ParamKind, WorkloadError};

pub use boost::{BoostConfig, BoostMode, BoostPolicy, BoostTuning, BoostUpdate, BoostWhen};
pub use devices::{BalloonConfig, DiskConfig, LinuxBoot, NetConfig, MAX_VIRTIO_DEVICES};
pub use error::ConfigError;
pub use halt_poll::HaltPoll;
pub use host::{ConsoleTarget, EvictMode, HostConfig, PageStore, SeccompMode, SharedBuffer};
pub use limits::GuestLimits;
pub use machine::{
    default_guest_poll_ns, BootProtocol, GuestImage, MachineConfig, MemoryBackend, DEFAULT_CMDLINE,
    DEFAULT_MEMORY, DEFAULT_VCPUS, MAX_MEMORY,
};
pub use migration_key::MigrationKey;
pub use range::RangeError;

/// Everything needed to build and run a VM on this host.
#[derive(Clone, Debug, Default)]
pub struct VmConfig {
    /// What the VM is.
    pub machine: MachineConfig,
    /// How this host runs it.
    pub host: HostConfig,
}

impl VmConfig {
    /// Check every value that can be checked without KVM.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.machine.validate()?;
        self.host.validate()
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
            let (accepted, readable) = match param.kind {
                ParamKind::Number { min, max, default } => (
                    format!("a number from {min} to {max} (default {default})"),
                    value.parse::<u64>().is_ok(),
                ),
                ParamKind::Size { min, max, default } => (
                    format!(
                        "a size from {} to {}, with K, M or G (default {})",
                        size_text(min),
                        size_text(max),
                        size_text(default)
                    ),
                    workload::parse_size(value).is_some(),
                ),
                ParamKind::Choice { values } => (format!("one of {}", values.join(", ")), true),
            };
            let why = match (readable, param.kind) {
                (true, _) => "is out of range",
                (false, ParamKind::Size { .. }) => "is not a size",
                (false, _) => "is not a number",
            };
            format!(
                "bad guest command line: {}={value} {why}: {} takes {accepted}",
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

/// A time in nanoseconds as the command line reads it back: in the
/// largest unit that divides it exactly (`20ms`, `1500us`, `0`).
pub fn time_text(ns: u64) -> String {
    for (unit, per) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if ns != 0 && ns.is_multiple_of(per) {
            return format!("{}{unit}", ns / per);
        }
    }
    match ns {
        0 => "0".into(),
        _ => format!("{ns}ns"),
    }
}

/// A duration for a message, to the millisecond (`1s`, `250ms`; under a
/// millisecond, to the nanosecond): a deadline measured from a clock reads
/// `1s`, not `999.999891ms`.
pub fn duration_text(d: std::time::Duration) -> String {
    let ns = d.as_nanos().min(u128::from(u64::MAX)) as u64;
    match ns {
        0..1_000 => time_text(ns),
        1_000..1_000_000 => time_text((ns + 500) / 1_000 * 1_000),
        _ => time_text((ns + 500_000) / 1_000_000 * 1_000_000),
    }
}

/// A byte count as the command line reads it back: in the largest binary unit
/// that divides it exactly (`256K`, `1G`), else in bytes.
pub fn size_text(n: u64) -> String {
    for (unit, shift) in [("T", 40), ("G", 30), ("M", 20), ("K", 10)] {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_in_their_unit() {
        assert_eq!(size_text(256 << 10), "256K");
        assert_eq!(size_text(1 << 30), "1G");
        assert_eq!(size_text(1536), "1536");
    }

    #[test]
    fn default_config_is_valid() {
        VmConfig::default().validate().unwrap();
    }

    #[test]
    fn paging_values_are_checked() {
        let paged = |memory: u64, budget: u64| MachineConfig {
            memory,
            memory_budget: Some(budget),
            ..MachineConfig::default()
        };
        assert!(matches!(
            paged(64 << 20, 128 << 20).validate(),
            Err(ConfigError::BudgetOverMemory { .. })
        ));
        assert!(matches!(
            paged(64 << 20, 1000).validate(),
            Err(ConfigError::BudgetUnaligned(1000))
        ));
        let memfd = MachineConfig {
            memory_backend: MemoryBackend::Memfd,
            ..paged(64 << 20, 32 << 20)
        };
        assert_eq!(memfd.validate(), Err(ConfigError::PagingNeedsAnonymous));
        paged(256 << 20, 64 << 20).validate().unwrap();
    }

    #[test]
    fn halt_poll_values_are_checked() {
        let c = |h: HaltPoll| h.check();
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
    fn guest_poll_limits_past_10ms_are_refused() {
        let c = |ns| {
            MachineConfig {
                guest_poll_max_ns: ns,
                ..MachineConfig::default()
            }
            .validate()
        };
        assert!(c(0).is_ok());
        assert!(c(hover_abi::haltpoll::MAX_POLL_NS).is_ok());
        assert_eq!(
            c(hover_abi::haltpoll::MAX_POLL_NS + 1),
            Err(ConfigError::GuestPollMax(
                hover_abi::haltpoll::MAX_POLL_NS + 1
            ))
        );
    }

    #[test]
    fn durations_read_as_given() {
        use std::time::Duration;
        assert_eq!(duration_text(Duration::from_nanos(999_999_891)), "1s");
        assert_eq!(duration_text(Duration::from_millis(250)), "250ms");
        assert_eq!(duration_text(Duration::from_micros(1500)), "2ms");
        assert_eq!(duration_text(Duration::from_micros(50)), "50us");
        assert_eq!(duration_text(Duration::from_nanos(99_698)), "100us");
        assert_eq!(duration_text(Duration::ZERO), "0");
        assert_eq!(time_text(20_000_000), "20ms");
        assert_eq!(time_text(1_500), "1500ns");
    }

    #[test]
    fn bad_values_are_refused() {
        let c = |f: fn(&mut MachineConfig)| {
            let mut c = MachineConfig::default();
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
        // Not "try 0 bytes": too large, said as such.
        assert!(matches!(
            c(|c| c.memory = u64::MAX),
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
