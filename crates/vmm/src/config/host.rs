//! How *this host* runs a VM: where its console, API socket, page store and
//! I/O file are, the guards on what its guest may ask for, and the VMM's
//! own confinement. None of it is saved with the VM or sent in a migration:
//! a restoring or receiving host gives its own (`hover restore`, `hover
//! receive` take the same flags as `hover run`), with the same defaults.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::limits::GuestLimits;
use super::ConfigError;
use super::MigrationKey;

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
    /// Standard output, and standard input typed to the guest
    /// ([`crate::devices::console_in`]: raw mode on a terminal, Ctrl-A x
    /// ends the VM).
    Stdio,
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
            ConsoleTarget::Stdio => f.write_str("stdio"),
            ConsoleTarget::Off => f.write_str("off"),
            ConsoleTarget::File(p) => write!(f, "file:{}", p.display()),
            ConsoleTarget::Buffer(_) => f.write_str("buffer"),
        }
    }
}

/// How seccomp filters are applied to the VMM's threads (`--seccomp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SeccompMode {
    /// No filter.
    Off,
    /// Forbidden calls go through and the kernel logs them.
    Log,
    /// Forbidden calls stop the process with a message naming them.
    #[default]
    On,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SeccompMode::Off),
            "log" => Ok(SeccompMode::Log),
            "on" => Ok(SeccompMode::On),
            _ => Err(format!("--seccomp {s:?}: expected off, log or on")),
        }
    }
}

impl SeccompMode {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            SeccompMode::Off => "off",
            SeccompMode::Log => "log",
            SeccompMode::On => "on",
        }
    }
}

/// The page store of an overcommitted VM (`--page-store*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageStore {
    /// Where evicted pages go: a new file, or a directory to make one in
    /// (`None`: a temporary file in /var/tmp). Unlinked once open.
    pub path: Option<PathBuf>,
    /// Extra delay on every read from the store (a slower device).
    pub latency: Duration,
    /// A further delay on each read, uniformly random up to this much (a
    /// device whose latency varies).
    pub jitter: Duration,
}

/// How this host runs the VM: see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct HostConfig {
    /// Where the serial console goes.
    pub console: ConsoleTarget,
    /// Serve the control API on this Unix socket while running.
    pub api_socket: Option<PathBuf>,
    /// Where an overcommitted VM's evicted pages go.
    pub page_store: PageStore,
    /// The paravirtual I/O device's file (created if missing; kept at
    /// exit). `None`: a file on tmpfs (/dev/shm), unlinked once open.
    pub io_file: Option<PathBuf>,
    /// What guest requests may make the host do (`--guest-*`).
    pub limits: GuestLimits,
    /// seccomp filters on the VMM's threads (`--seccomp`).
    pub seccomp: SeccompMode,
    /// The pre-shared key this VMM's migrations prove, both ways
    /// (`--migration-key`); `None`: unauthenticated, so TCP only when a
    /// migration asks for `insecure`.
    pub migration_key: Option<Arc<MigrationKey>>,
    /// When dynamic boosts are granted and kept (`--boost-when`,
    /// `--boost-keep-us`).
    pub boost_tuning: super::boost::BoostTuning,
    /// Each of the machine's disks' file (raw image or block device), in
    /// the order of `MachineConfig::disks`.
    pub disk_paths: Vec<PathBuf>,
    /// Each of the machine's network cards' tap device, in the order of
    /// `MachineConfig::nets`.
    pub taps: Vec<String>,
}

impl HostConfig {
    /// Check every value that can be checked without touching the host.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.check().map_err(ConfigError::Limits)?;
        self.boost_tuning.check().map_err(ConfigError::Boost)
    }
}
