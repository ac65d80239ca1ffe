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
    /// (`devices/console_in.rs`: raw mode on a terminal, Ctrl-A x
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
    /// How the pager takes pages out of guest RAM (`--pager-evict`;
    /// `None`: `UFFDIO_MOVE` where the kernel has it, else write-protection).
    pub evict: Option<EvictMode>,
}

/// How this host runs the VM: see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct HostConfig {
    /// Where the serial console goes.
    pub console: ConsoleTarget,
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
    /// A restore's or a receiver's disks by the id the VM gave each
    /// (`--disk ID=PATH`): put in `disk_paths` once the saved configuration
    /// says which disks the VM has.
    pub named_disks: Vec<(String, PathBuf)>,
    /// A restore's or a receiver's taps by card id (`--net ID=tap=NAME`),
    /// as `named_disks`.
    pub named_taps: Vec<(String, String)>,
}

/// `given`'s values in the order of `ids`, or the ids missing and extra.
fn by_id<T: Clone>(
    flag: &str,
    what: &str,
    ids: &[&str],
    given: &[(String, T)],
) -> Result<Vec<T>, ConfigError> {
    let missing: Vec<&str> = ids
        .iter()
        .copied()
        .filter(|id| !given.iter().any(|(g, _)| g == id))
        .collect();
    let extra: Vec<&str> = given
        .iter()
        .map(|(g, _)| g.as_str())
        .filter(|g| !ids.contains(g))
        .collect();
    if !missing.is_empty() || !extra.is_empty() {
        let list = |v: &[&str]| match v.is_empty() {
            true => "none".to_string(),
            false => v.join(", "),
        };
        return Err(ConfigError::Devices(format!(
            "the VM's {what}s are {}: give {flag} for each (missing: {}; not the VM's: {})",
            list(ids),
            list(&missing),
            list(&extra)
        )));
    }
    if let Some((id, _)) = given
        .iter()
        .enumerate()
        .find(|(i, (g, _))| given[..*i].iter().any(|(o, _)| o == g))
        .map(|(_, g)| g)
    {
        return Err(ConfigError::Devices(format!("{flag}: {id} is given twice")));
    }
    Ok(ids
        .iter()
        .map(|id| {
            given
                .iter()
                .find(|(g, _)| g == id)
                .map(|(_, v)| v.clone())
                .expect("checked above")
        })
        .collect())
}

impl HostConfig {
    /// Check every value that can be checked without touching the host.
    /// Put the disks and taps given by id (`named_disks`, `named_taps`) in
    /// the order of the machine's `disks` and `nets` (ids `disks` and
    /// `nets`): every id the machine has must be given, and no other.
    pub fn resolve_named(&mut self, disks: &[&str], nets: &[&str]) -> Result<(), ConfigError> {
        self.disk_paths = by_id("--disk ID=PATH", "disk", disks, &self.named_disks)?;
        self.taps = by_id("--net ID=tap=NAME", "network card", nets, &self.named_taps)?;
        Ok(())
    }

    /// Check every value that can be checked alone.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.limits.check().map_err(ConfigError::Limits)?;
        self.boost_tuning.check().map_err(ConfigError::Boost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_named_by_id_are_put_in_the_machines_order_and_bad_names_refused() {
        let mut h = HostConfig {
            named_disks: vec![
                ("data".into(), "/d.img".into()),
                ("root".into(), "/r.img".into()),
            ],
            named_taps: vec![("net0".into(), "tap7".into())],
            ..HostConfig::default()
        };
        h.resolve_named(&["root", "data"], &["net0"]).unwrap();
        assert_eq!(h.disk_paths, vec![PathBuf::from("/r.img"), "/d.img".into()]);
        assert_eq!(h.taps, vec!["tap7".to_string()]);
        let e = h
            .resolve_named(&["root", "data", "logs"], &["net0"])
            .unwrap_err();
        assert!(e.to_string().contains("missing: logs"), "{e}");
        let e = h.resolve_named(&["root"], &["net0"]).unwrap_err();
        assert!(e.to_string().contains("not the VM's: data"), "{e}");
        let e = h.resolve_named(&["root", "data"], &[]).unwrap_err();
        assert!(e.to_string().contains("--net ID=tap=NAME"), "{e}");
        h.named_disks.push(("data".into(), "/again.img".into()));
        let e = h.resolve_named(&["root", "data"], &["net0"]).unwrap_err();
        assert!(e.to_string().contains("given twice"), "{e}");
    }
}

/// How the pager takes a page out of guest RAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvictMode {
    /// `UFFDIO_MOVE` (Linux 6.8+): the page leaves guest RAM atomically.
    Move,
    /// Write-protect the page (`UFFDIO_WRITEPROTECT`, Linux 5.7+), copy it
    /// out, drop it (`MADV_DONTNEED`): a guest write meanwhile waits on
    /// the protection and is served after, so none is lost.
    WriteProtect,
}

impl EvictMode {
    /// Its name (`--pager-evict`, the pager's report).
    pub fn name(self) -> &'static str {
        match self {
            EvictMode::Move => "move",
            EvictMode::WriteProtect => "write-protect",
        }
    }
}
