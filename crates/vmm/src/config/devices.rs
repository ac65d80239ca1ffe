//! What a Linux guest's kernel and devices are to the VM: the kernel and
//! initrd to boot, each disk's id and read-only flag, each network card's
//! MAC, the balloon. The files and taps behind them are the host's
//! (`HostConfig`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How many virtio devices a VM may have: one IOAPIC pin each, from pin 5
/// (0-4 are the PC's timer, keyboard, cascade and serial lines) to 23.
pub const MAX_VIRTIO_DEVICES: usize = 19;

/// A virtio balloon (`--balloon`, Firecracker's `PUT /balloon`): what the
/// guest is first asked to give back, and what the device offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonConfig {
    /// The first target, MiB (0: the guest keeps all its memory until a
    /// target is set).
    pub target_mib: u64,
    /// Offer free page reporting (the guest names its free memory, which
    /// the host drops).
    pub free_page_reporting: bool,
    /// Let the guest deflate when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Seconds between requests for the guest's statistics (0: none). In
    /// JSON by the name `PUT /vm/balloon` and the balloon's report use.
    #[serde(rename = "stats_polling_interval_s", alias = "stats_interval_s")]
    pub stats_interval_s: u32,
}

impl Default for BalloonConfig {
    fn default() -> Self {
        BalloonConfig {
            target_mib: 0,
            free_page_reporting: true,
            deflate_on_oom: false,
            stats_interval_s: 0,
        }
    }
}

/// A Linux kernel to boot and its initrd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxBoot {
    /// A bzImage or an x86-64 ELF vmlinux.
    pub kernel: PathBuf,
    /// An initramfs, if any.
    pub initrd: Option<PathBuf>,
}

/// Whether `id` can name a device: 1 to 20 printable characters (a
/// disk's is what the guest reads through virtio-blk's get-id).
pub fn valid_device_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 20 && id.bytes().all(|b| b.is_ascii_graphic())
}

/// The first of `ids` that is not a valid id or repeats one before it,
/// with what is wrong, for `what` ("disk", "network card").
pub(crate) fn check_device_ids<'a>(
    what: &str,
    ids: impl IntoIterator<Item = &'a str>,
) -> Result<(), super::error::ConfigError> {
    let mut seen: Vec<&str> = Vec::new();
    for id in ids {
        if !valid_device_id(id) {
            return Err(super::error::ConfigError::Devices(format!(
                "{what} id {id:?}: give 1 to 20 printable characters"
            )));
        }
        if seen.contains(&id) {
            return Err(super::error::ConfigError::Devices(format!(
                "{what} id {id} is given twice: each {what} needs an id of its own"
            )));
        }
        seen.push(id);
    }
    Ok(())
}

/// What a disk is to the VM (saved with it): its id, size and whether it
/// is read-only. Its path is the host's (never saved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskConfig {
    /// The id the guest reads (get-id, at most 20 bytes), unique in the VM.
    pub id: String,
    /// Whether the guest may write.
    pub readonly: bool,
    /// Its size in bytes, as the VM saw it (0 until it is opened): a
    /// restore or an arriving migration must give a disk of this size.
    pub size: u64,
}

/// What a network card is to the VM (saved with it): its id and MAC. The
/// tap's name is the host's (never saved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetConfig {
    /// The card's id (`net0`, `net1`, ... by order, or the Firecracker
    /// API's `iface_id`): what a restore names its tap for.
    pub id: String,
    /// The card's MAC address.
    pub mac: [u8; 6],
}
