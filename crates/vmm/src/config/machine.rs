//! What the VM *is*: the settings that travel with it in a snapshot and a
//! migration stream (the `CONF` section is this type), so that the host
//! that restores or receives it builds the same machine. Nothing here names
//! a host resource: files, sockets and guards come from [`super::host`].

use std::path::PathBuf;

use hover_abi::boot::CMDLINE_MAX;
use hover_abi::haltpoll::MAX_POLL_NS;
use hover_abi::layout::{MAX_MAPPED_GIB, MAX_VCPUS, MMIO_HOLE_END, MMIO_HOLE_START, PAGE_SIZE};
use serde::{Deserialize, Serialize};

use super::boost::BoostConfig;
use super::halt_poll::HaltPoll;
use super::ConfigError;

/// Default number of vCPUs.
pub const DEFAULT_VCPUS: u32 = 2;
/// Default guest memory: 256 MiB.
pub const DEFAULT_MEMORY: u64 = 256 << 20;
/// Default command line.
pub const DEFAULT_CMDLINE: &str = "workload=hello";
/// Largest guest memory: what the boot page tables map, less the MMIO hole.
pub const MAX_MEMORY: u64 = (MAX_MAPPED_GIB << 30) - (MMIO_HOLE_END - MMIO_HOLE_START);

/// Which guest to boot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "SavedGuest", from = "SavedGuest")]
pub enum GuestImage {
    /// The guest embedded in this binary (crates/guest).
    Builtin,
    /// A 64-bit x86 ELF executable on disk, read at boot.
    Path(PathBuf),
    /// An external image already in guest memory (a restored or received
    /// VM): its file name, for people; nothing is opened.
    Loaded(String),
    /// A Linux kernel and its initrd, read at boot. In a restored or
    /// received VM only their file names are left (nothing is opened).
    Linux(super::devices::LinuxBoot),
}

impl GuestImage {
    /// Whether this is a Linux kernel (booted through the Linux boot
    /// protocol, with ACPI tables and the legacy devices Linux expects).
    pub fn is_linux(&self) -> bool {
        matches!(self, GuestImage::Linux(_))
    }
}

/// How a guest image is saved: its kind and, for an external one, only its
/// file name (a saved VM names no host path).
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SavedGuest {
    Builtin,
    External(String),
    Linux {
        kernel: String,
        initrd: Option<String>,
    },
}

/// A path's file name, for a saved VM.
fn file_name(p: &std::path::Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

impl From<GuestImage> for SavedGuest {
    fn from(g: GuestImage) -> Self {
        match g {
            GuestImage::Builtin => SavedGuest::Builtin,
            GuestImage::Path(p) => SavedGuest::External(
                p.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
            GuestImage::Loaded(n) => SavedGuest::External(n),
            GuestImage::Linux(l) => SavedGuest::Linux {
                kernel: file_name(&l.kernel),
                initrd: l.initrd.as_deref().map(file_name),
            },
        }
    }
}

impl From<SavedGuest> for GuestImage {
    fn from(g: SavedGuest) -> Self {
        match g {
            SavedGuest::Builtin => GuestImage::Builtin,
            SavedGuest::External(n) => GuestImage::Loaded(n),
            SavedGuest::Linux { kernel, initrd } => GuestImage::Linux(super::devices::LinuxBoot {
                kernel: kernel.into(),
                initrd: initrd.map(Into::into),
            }),
        }
    }
}

/// How guest RAM is backed; in JSON by the names `--memory-backend` takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryBackend {
    /// Private anonymous memory (the default).
    #[default]
    #[serde(rename = "anon", alias = "anonymous")]
    Anonymous,
    /// A memfd, so that another process can map the same RAM.
    Memfd,
}

/// How the boot vCPU enters the guest image.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BootProtocol {
    /// Hover's 64-bit entry (docs/ABI.md, "Entry state"), every vCPU at once.
    #[default]
    Hover,
    /// The PVH protocol's 32-bit entry (the image's Xen PHYS32_ENTRY note),
    /// as QEMU boots it; ACPI tables list the vCPUs, which the guest starts.
    Pvh,
}

/// What the VM is: see the module documentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineConfig {
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
    /// How the boot vCPU enters the image (`--boot`); a restored VM
    /// resumes where it stopped and uses none.
    #[serde(skip)]
    pub boot: BootProtocol,
    /// Overcommit: the most guest RAM kept resident, bytes (`None`: all of
    /// it stays resident). Where evicted pages go is the host's choice.
    pub memory_budget: Option<u64>,
    /// Offer KVM's asynchronous page faults to the guest (ASYNC_PF and
    /// ASYNC_PF_INT in the KVM PV CPUID leaf).
    pub async_pf: bool,
    /// Halt polling for this VM, as last set (at start or through the API).
    pub halt_poll: HaltPoll,
    /// Whether guest HLT exits to KVM (`false`: KVM_CAP_X86_DISABLE_EXITS).
    pub hlt_exits: bool,
    /// The longest the guest may poll before it halts, ns (0: no guest
    /// polling; `--guest-halt-poll-max`, `hover_abi::haltpoll`). Offered in
    /// the boot area at boot, so a restored VM keeps the offer in memory.
    /// In JSON by the flag's name (`guest_halt_poll_max_ns`; the older
    /// `guest_poll_max_ns` is read too).
    #[serde(rename = "guest_halt_poll_max_ns", alias = "guest_poll_max_ns")]
    pub guest_poll_max_ns: u64,
    /// Per-vCPU dirty rings of this many entries (`None`: none), for live
    /// migration with `--dirty-tracking ring`.
    pub dirty_ring: Option<u32>,
    /// vCPU priority boosting (`--boost`, `--vcpu-rt`), as last set.
    pub boost: BoostConfig,
    /// A Linux guest's virtio disks (`--disk`), in order; their files are
    /// the host's (`HostConfig::disk_paths`): a restore or an arriving
    /// migration names a path for each id.
    pub disks: Vec<super::devices::DiskConfig>,
    /// A Linux guest's virtio network cards (`--net`), in order; their taps
    /// are the host's (`HostConfig::taps`), named for each card's id.
    pub nets: Vec<super::devices::NetConfig>,
    /// Whether a Linux guest gets a virtio entropy device (default on).
    #[serde(default = "rng_default")]
    pub rng: bool,
    /// A Linux guest's virtio balloon, if it has one (`--balloon`).
    #[serde(default)]
    pub balloon: Option<super::devices::BalloonConfig>,
}

/// The guest-poll limit a guest gets unless told (`--guest-halt-poll-max`):
/// the built-in guest polls up to [`hover_abi::haltpoll::DEFAULT_POLL_NS`];
/// a Linux guest does not poll (its polling needs the "realtime" hint,
/// which also turns off its paravirtual spinlocks: wrong for a VM on a
/// busy host unless asked for).
pub fn default_guest_poll_ns(guest: &GuestImage) -> u64 {
    if guest.is_linux() {
        0
    } else {
        hover_abi::haltpoll::DEFAULT_POLL_NS
    }
}

/// A Linux guest has an entropy device unless told otherwise.
fn rng_default() -> bool {
    true
}

impl Default for MachineConfig {
    fn default() -> Self {
        MachineConfig {
            vcpus: DEFAULT_VCPUS,
            memory: DEFAULT_MEMORY,
            memory_backend: MemoryBackend::Anonymous,
            guest: GuestImage::Builtin,
            cmdline: DEFAULT_CMDLINE.to_string(),
            boot: BootProtocol::Hover,
            memory_budget: None,
            async_pf: true,
            halt_poll: HaltPoll::KvmDefault,
            hlt_exits: true,
            guest_poll_max_ns: hover_abi::haltpoll::DEFAULT_POLL_NS,
            dirty_ring: None,
            boost: BoostConfig::default(),
            disks: Vec::new(),
            nets: Vec::new(),
            rng: rng_default(),
            balloon: None,
        }
    }
}

impl MachineConfig {
    /// How many virtio devices the machine has: its disks, its network
    /// cards, the entropy device and the balloon (Linux guests only; the
    /// order on the bus is `devices::virtio`'s).
    pub fn virtio_device_count(&self) -> usize {
        if !self.guest.is_linux() {
            return 0;
        }
        self.disks.len()
            + self.nets.len()
            + usize::from(self.rng)
            + usize::from(self.balloon.is_some())
    }

    /// The virtio devices a Linux guest gets: its disks, network cards,
    /// the entropy device and the balloon; each needs an interrupt line, and a disk id is unique and
    /// fits the 20 bytes of virtio-blk's get-id.
    fn check_devices(&self) -> Result<(), ConfigError> {
        let devices = self.virtio_device_count();
        let has_devices = !self.disks.is_empty() || !self.nets.is_empty() || self.balloon.is_some();
        if has_devices && !self.guest.is_linux() {
            return Err(ConfigError::Devices(
                "--disk, --net and --balloon need --kernel: the built-in guest has no virtio drivers"
                    .into(),
            ));
        }
        if let Some(b) = &self.balloon {
            if b.target_mib.saturating_mul(1 << 20) > self.memory {
                return Err(ConfigError::Devices(format!(
                    "--balloon target={} MiB: more than the guest's {} MiB of memory",
                    b.target_mib,
                    self.memory >> 20
                )));
            }
        }
        super::devices::check_device_ids("network card", self.nets.iter().map(|n| n.id.as_str()))?;
        for (i, n) in self.nets.iter().enumerate() {
            if self.nets[..i].iter().any(|o| o.mac == n.mac) {
                return Err(ConfigError::Devices(
                    "two --net cards with the same MAC: give each its own mac=".into(),
                ));
            }
        }
        let max = super::devices::MAX_VIRTIO_DEVICES;
        if devices > max {
            return Err(ConfigError::Devices(format!(
                "{devices} virtio devices, more than the {max} interrupt lines Hover gives them"
            )));
        }
        super::devices::check_device_ids("disk", self.disks.iter().map(|d| d.id.as_str()))
    }

    /// Check every value that can be checked without KVM or the image.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let max = MAX_VCPUS as u32;
        if self.vcpus == 0 || self.vcpus > max {
            return Err(ConfigError::Vcpus {
                given: self.vcpus,
                max,
            });
        }
        // Too large first: rounding a huge size up to a page overflows.
        if self.memory > MAX_MEMORY {
            return Err(ConfigError::MemoryTooLarge { given: self.memory });
        }
        if !self.memory.is_multiple_of(PAGE_SIZE) {
            let suggest = self.memory.div_ceil(PAGE_SIZE) * PAGE_SIZE;
            return Err(ConfigError::MemoryUnaligned {
                given: self.memory,
                suggest,
            });
        }
        if self.cmdline.len() > CMDLINE_MAX {
            return Err(ConfigError::CmdlineTooLong {
                len: self.cmdline.len(),
                max: CMDLINE_MAX,
            });
        }
        if self.guest == GuestImage::Builtin {
            super::check_builtin_cmdline(&self.cmdline)?;
        }
        self.check_devices()?;
        if let Some(n) = self.dirty_ring {
            if !n.is_power_of_two() || !(256..=65536).contains(&n) {
                return Err(ConfigError::DirtyRing(n));
            }
        }
        self.boost.check().map_err(ConfigError::Boost)?;
        if self.guest_poll_max_ns > MAX_POLL_NS {
            return Err(ConfigError::GuestPollMax(self.guest_poll_max_ns));
        }
        self.halt_poll.check()?;
        if let Some(budget) = self.memory_budget {
            if budget > self.memory {
                return Err(ConfigError::BudgetOverMemory {
                    budget,
                    memory: self.memory,
                });
            }
            if !budget.is_multiple_of(PAGE_SIZE) {
                return Err(ConfigError::BudgetUnaligned(budget));
            }
            if self.memory_backend != MemoryBackend::Anonymous {
                return Err(ConfigError::PagingNeedsAnonymous);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_machine_names_no_host_path() {
        let m = MachineConfig {
            guest: GuestImage::Path("/home/someone/images/g.elf".into()),
            cmdline: "anything".into(),
            ..MachineConfig::default()
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(!json.contains("/home"), "{json}");
        let back: MachineConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back.guest, GuestImage::Loaded("g.elf".into()));
        let bytes = postcard::to_allocvec(&m).unwrap();
        let back: MachineConfig = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.memory, m.memory);
        assert_eq!(back.guest, GuestImage::Loaded("g.elf".into()));
    }

    #[test]
    fn json_names_follow_the_flags_and_read_the_older_ones() {
        let m = MachineConfig::default();
        let mut v = serde_json::to_value(&m).unwrap();
        assert!(v.get("guest_halt_poll_max_ns").is_some(), "{v}");
        let ns = v
            .as_object_mut()
            .unwrap()
            .remove("guest_halt_poll_max_ns")
            .unwrap();
        v["guest_poll_max_ns"] = ns;
        let back: MachineConfig = serde_json::from_value(v).unwrap();
        assert_eq!(back.guest_poll_max_ns, m.guest_poll_max_ns);
    }
}
