//! The flags that say how *this host* runs a VM (`hover run`, `hover
//! restore` and `hover receive` share them: none of it is saved with a VM
//! or sent in a migration), and their parsers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::parse::{parse_duration, parse_size};
use clap::Args;
use hover_vmm::config::boost::{BoostTuning, BoostWhen};
use hover_vmm::config::{
    ConsoleTarget, GuestLimits, HostConfig, MigrationKey, PageStore, SeccompMode,
};

/// Parse a console target: `stdout`, `stderr`, `stdio`, `off`, or `file:PATH`.
pub(crate) fn parse_console(s: &str) -> Result<ConsoleTarget, String> {
    match s {
        "stdout" => Ok(ConsoleTarget::Stdout),
        "stdio" => Ok(ConsoleTarget::Stdio),
        "stderr" => Ok(ConsoleTarget::Stderr),
        "off" => Ok(ConsoleTarget::Off),
        _ => match s.strip_prefix("file:") {
            Some(path) if !path.is_empty() => Ok(ConsoleTarget::File(PathBuf::from(path))),
            _ => Err(format!(
                "unknown console '{s}': use stdout, stderr, stdio, off or file:PATH"
            )),
        },
    }
}

fn parse_seccomp(s: &str) -> Result<SeccompMode, String> {
    s.parse()
}

/// The host files a VM uses: its page store (overcommitted VMs) and the
/// I/O device's file.
#[derive(Args)]
pub(crate) struct HostFileArgs {
    /// Page store of a VM with a memory budget: a new file to create (an
    /// existing path is refused, never overwritten), or a directory to
    /// create one in; a file with no name (O_TMPFILE) where the file
    /// system allows, else unlinked as soon as it is open [default: a
    /// temporary file in /var/tmp].
    #[arg(long)]
    pub(crate) page_store: Option<PathBuf>,
    /// Extra latency of every page-store read, modelling a slower device
    /// (e.g. 100us, 2ms).
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub(crate) page_store_latency: Duration,
    /// A further random delay on each page-store read, uniform up to this
    /// (e.g. 1ms): a device whose latency varies.
    #[arg(long, default_value = "0", value_parser = parse_duration)]
    pub(crate) page_store_jitter: Duration,
    /// How the pager takes pages out of guest RAM: `move` (UFFDIO_MOVE,
    /// Linux 6.8+: atomic), `write-protect` (UFFDIO_WRITEPROTECT, 5.7+:
    /// the page is write-protected, copied out and dropped; a guest write
    /// meanwhile waits), or `auto`: move where the kernel has it.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) pager_evict: EvictArg,
    /// File the paravirtual I/O device writes to (created if missing, kept).
    /// Default: a file on tmpfs (/dev/shm), unlinked as soon as it is open.
    #[arg(long)]
    pub(crate) io_file: Option<PathBuf>,
    /// Pre-shared key file (mode 0600, this user's, at least 32 bytes of
    /// secret; `hover migration-key FILE` makes one) that this VM's
    /// migrations prove, outgoing and incoming: each frame then carries a
    /// MAC. Without it a migration over TCP needs --insecure.
    #[arg(long, value_name = "FILE", value_parser = parse_migration_key)]
    pub(crate) migration_key: Option<Arc<MigrationKey>>,
}

/// `--pager-evict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum EvictArg {
    /// UFFDIO_MOVE where the kernel has it, else write-protection.
    Auto,
    /// UFFDIO_MOVE (Linux 6.8+).
    Move,
    /// UFFDIO_WRITEPROTECT, copy, MADV_DONTNEED (Linux 5.7+).
    WriteProtect,
}

impl EvictArg {
    fn mode(self) -> Option<hover_vmm::memory::paged::EvictMode> {
        use hover_vmm::memory::paged::EvictMode;
        match self {
            EvictArg::Auto => None,
            EvictArg::Move => Some(EvictMode::Move),
            EvictArg::WriteProtect => Some(EvictMode::WriteProtect),
        }
    }
}

fn parse_migration_key(
    s: &str,
) -> Result<Arc<MigrationKey>, hover_vmm::config::migration_key::KeyFileError> {
    MigrationKey::load(std::path::Path::new(s)).map(Arc::new)
}

impl HostFileArgs {
    /// Whether any page-store flag was given.
    pub(crate) fn names_a_page_store(&self) -> bool {
        self.page_store.is_some()
            || !self.page_store_latency.is_zero()
            || !self.page_store_jitter.is_zero()
    }
}

/// What the host lets the guest make it do: `hover run`, `hover restore`
/// and `hover receive` share these (they are the host's choice, not part of
/// a saved or migrated VM).
#[derive(Args)]
pub(crate) struct GuardArgs {
    /// Largest offset + length the guest's I/O requests may reach in the
    /// --io-file (at most 16G); requests past it fail in the guest.
    #[arg(long, default_value = "16G", value_parser = parse_size)]
    pub(crate) guest_io_max: u64,
    /// Longest delay of a guest-requested MSI timer (at most 10s).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub(crate) guest_msi_max_delay: Duration,
    /// Most guest-requested MSI timers waiting at once (1-65536).
    #[arg(long, default_value_t = hover_vmm::config::limits::DEFAULT_MSI_PENDING)]
    pub(crate) guest_msi_max_pending: u32,
    /// Most reports the guest may record over the run (1-1048576).
    #[arg(long, default_value_t = hover_vmm::config::limits::DEFAULT_REPORTS)]
    pub(crate) guest_reports_max: u32,
    /// Most bytes of guest log messages passed to the log over the run
    /// (at most 1G); later messages are refused.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub(crate) guest_log_max: u64,
    /// seccomp filters on the VMM's threads, one per kind (vCPU, pager,
    /// I/O, API, governor, boost, timer, migration): `on` stops the VMM
    /// with a message naming a forbidden call, `log` lets it through and
    /// has the kernel log it, `off` installs none.
    #[arg(long, default_value = "on", value_parser = parse_seccomp)]
    pub(crate) seccomp: SeccompMode,
}

impl GuardArgs {
    pub(crate) fn limits(&self) -> GuestLimits {
        GuestLimits {
            io_file_bytes: self.guest_io_max,
            msi_delay: self.guest_msi_max_delay,
            msi_pending: self.guest_msi_max_pending,
            reports: self.guest_reports_max,
            log_bytes: self.guest_log_max,
        }
    }
}

/// How this host grants and keeps dynamic boosts: `hover run`, `hover
/// restore` and `hover receive` share these (the host's choice, not part of
/// a saved or migrated VM; `hover ctl boost --when/--keep-us` changes them
/// live).
#[derive(Args)]
pub(crate) struct BoostHostArgs {
    /// When dynamic boosts are granted: always, or only while the vCPU's
    /// thread has lately waited for a CPU (contended; its run-queue wait
    /// from schedstat): on an idle host a boost buys nothing.
    #[arg(long, default_value = "always", value_parser = crate::ctl::boost_whens())]
    pub(crate) boost_when: BoostWhen,
    /// The guest's unboost call keeps the boost when its next announced
    /// real-time wake-up is due within this many microseconds and, even if
    /// the vCPU ran flat out until then, the boost would stay within half
    /// of --boost-max-ms of CPU; while non-zero, the guest's unboost is a
    /// write to its boost area (no exit) where this covers its next
    /// wake-up or its vCPU halts (0: never keep, always call; at most
    /// 100000).
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_KEEP_US, value_parser = crate::parse::micros)]
    pub(crate) boost_keep_us: u64,
    /// A host-side boost (dynamic boosting, an interrupt for a vCPU whose
    /// guest shares no boost area: a Linux guest) ends when the vCPU halts,
    /// or once its thread has run this many microseconds of CPU time since
    /// the boost (50 to 100000).
    #[arg(long, default_value_t = hover_vmm::config::boost::DEFAULT_IRQ_US, value_parser = crate::parse::micros)]
    pub(crate) boost_irq_us: u64,
}

/// What `hover run` and `hover restore` share: the API socket, the console
/// and how the outcome is printed.
#[derive(Args)]
pub(crate) struct RunOutput {
    /// Serve the control API (HTTP on a Unix socket, mode 0600) while the VM
    /// runs: `hover ctl --api-socket PATH ...`; created here (an existing
    /// path is refused, except a stale socket nobody listens on), removed at
    /// exit.
    #[arg(long)]
    pub(crate) api_socket: Option<PathBuf>,
    /// Where the guest console goes: stdout, stderr, off, file:PATH, or
    /// stdio (interactive: what is typed reaches the guest; a terminal is
    /// put in raw mode until the VM ends; Ctrl-A x ends the VM, Ctrl-A
    /// Ctrl-A types Ctrl-A) [default: stdout, or stderr with --json].
    #[arg(long, value_parser = parse_console)]
    pub(crate) console: Option<ConsoleTarget>,
    /// Print the outcome (exit code, reports, timings, memory) as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also print KVM's statistics of the VM and of each vCPU at exit (always
    /// included in --json).
    #[arg(long)]
    pub(crate) stats: bool,
}

/// A restored or arriving VM's disks and taps, named by the ids the VM
/// gave them (the VM's configuration says which it has; its paths are
/// this host's).
#[derive(Args)]
pub(crate) struct SavedDeviceArgs {
    /// A disk of the VM, by its id: `ID=PATH` (repeatable; every disk the
    /// VM has must be given, of the size it had; the error names them).
    #[arg(long = "disk", value_name = "ID=PATH", value_parser = parse_named_disk)]
    pub(crate) disks: Vec<(String, PathBuf)>,
    /// A network card of the VM, by its id: `ID=tap=NAME` (repeatable; an
    /// existing tap for each card the VM has).
    #[arg(long = "net", value_name = "ID=tap=NAME", value_parser = parse_named_tap)]
    pub(crate) nets: Vec<(String, String)>,
}

fn parse_named_disk(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((id, path)) if !id.is_empty() && !path.is_empty() => {
            Ok((id.to_string(), PathBuf::from(path)))
        }
        _ => Err(format!(
            "'{s}': give ID=PATH (the disk's id in the VM, then its file)"
        )),
    }
}

fn parse_named_tap(s: &str) -> Result<(String, String), String> {
    match s.split_once("=tap=") {
        Some((id, tap)) if !id.is_empty() && !tap.is_empty() => {
            Ok((id.to_string(), tap.to_string()))
        }
        _ => Err(format!(
            "'{s}': give ID=tap=NAME (the card's id in the VM, then its tap)"
        )),
    }
}

impl SavedDeviceArgs {
    /// Put these into `host`.
    pub(crate) fn apply(&self, host: &mut HostConfig) {
        host.named_disks = self.disks.clone();
        host.named_taps = self.nets.clone();
    }
}

/// This host's settings from its flags; flags that cannot go together
/// are refused.
pub(crate) fn host_config(
    out: &RunOutput,
    files: &HostFileArgs,
    guard: &GuardArgs,
    boost: &BoostHostArgs,
) -> Result<HostConfig, String> {
    if out.json && matches!(out.console, Some(ConsoleTarget::Stdio)) {
        return Err("--console stdio puts the guest's console on standard output, where --json puts the outcome: use one of them (or --console file:PATH with --json)".into());
    }
    Ok(HostConfig {
        console: console_for(out.console.clone(), out.json),
        page_store: PageStore {
            path: files.page_store.clone(),
            latency: files.page_store_latency,
            jitter: files.page_store_jitter,
            evict: files.pager_evict.mode(),
        },
        io_file: files.io_file.clone(),
        limits: guard.limits(),
        seccomp: guard.seccomp,
        migration_key: files.migration_key.clone(),
        boost_tuning: BoostTuning {
            when: boost.boost_when,
            keep_us: boost.boost_keep_us,
            irq_us: boost.boost_irq_us,
        },
        disk_paths: Vec::new(),
        taps: Vec::new(),
        named_disks: Vec::new(),
        named_taps: Vec::new(),
    })
}

/// The console: as given, else stdout (stderr with --json, whose stdout is
/// the outcome).
fn console_for(console: Option<ConsoleTarget>, json: bool) -> ConsoleTarget {
    console.unwrap_or(if json {
        ConsoleTarget::Stderr
    } else {
        ConsoleTarget::Stdout
    })
}
