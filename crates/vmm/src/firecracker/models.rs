//! The request and answer bodies of Firecracker's API (its swagger,
//! version [`API_VERSION`]), as far as Hover answers them. Requests refuse
//! unknown fields, as Firecracker's do.

use serde::{Deserialize, Serialize};

/// The Firecracker API version these models follow.
pub const API_VERSION: &str = "1.0.0";

/// `PUT|PATCH /machine-config`, `GET /machine-config`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MachineConfiguration {
    /// vCPUs, 1-32.
    pub vcpu_count: u32,
    /// Guest memory, MiB.
    pub mem_size_mib: u64,
    /// Simultaneous multithreading (Hover presents none: `true` is refused).
    #[serde(default)]
    pub smt: bool,
    /// Firecracker's CPU templates (refused: Hover passes the host's CPUID
    /// through, less what it hides itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_template: Option<String>,
    /// Dirty page tracking for diff snapshots (accepted; Hover tracks dirty
    /// pages only while it migrates, and makes full snapshots only).
    #[serde(default)]
    pub track_dirty_pages: bool,
}

impl Default for MachineConfiguration {
    /// Firecracker's defaults: 1 vCPU, 128 MiB.
    fn default() -> Self {
        MachineConfiguration {
            vcpu_count: 1,
            mem_size_mib: 128,
            smt: false,
            cpu_template: None,
            track_dirty_pages: false,
        }
    }
}

/// `PATCH /machine-config`: any subset of the fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineConfigurationPatch {
    /// vCPUs.
    pub vcpu_count: Option<u32>,
    /// Guest memory, MiB.
    pub mem_size_mib: Option<u64>,
    /// SMT.
    pub smt: Option<bool>,
    /// CPU template.
    pub cpu_template: Option<String>,
    /// Dirty page tracking.
    pub track_dirty_pages: Option<bool>,
}

/// `PUT /boot-source`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BootSource {
    /// The guest: a Linux kernel (bzImage or x86-64 vmlinux), or Hover's
    /// own guest (an x86-64 ELF executable).
    pub kernel_image_path: String,
    /// The guest's command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
    /// A Linux kernel's initramfs (refused with Hover's own guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
}

/// `PUT /drives/{drive_id}`: a virtio-blk disk of a Linux guest.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Drive {
    /// The disk's id (the guest reads it through get-id).
    pub drive_id: String,
    /// The raw image file or block device.
    pub path_on_host: String,
    /// The guest's root file system: the first disk (`/dev/vda`), named
    /// on the command line (`root=/dev/vda rw`, or `ro`).
    pub is_root_device: bool,
    /// Read-only for the guest (opened read-only).
    #[serde(default)]
    pub is_read_only: bool,
    /// The root partition's unique id (`root=PARTUUID=...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partuuid: Option<String>,
    /// `Unsafe` or `Writeback`: Hover honours every flush either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_type: Option<String>,
    /// `Sync` or `Async`: Hover's disks are served on the VM's I/O thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_engine: Option<String>,
    /// Rate limits (refused: Hover has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<serde_json::Value>,
    /// A vhost-user socket (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// `PUT /network-interfaces/{iface_id}`: a virtio-net card on a tap.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkInterface {
    /// The interface's id.
    pub iface_id: String,
    /// The existing tap device the card sends and receives through.
    pub host_dev_name: String,
    /// The card's MAC (default: Hover's `06:00:00:00:00:NN` by order).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_mac: Option<String>,
    /// Receive rate limits (refused: Hover has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_rate_limiter: Option<serde_json::Value>,
    /// Transmit rate limits (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_rate_limiter: Option<serde_json::Value>,
}

/// `PUT /entropy`: a virtio-rng device.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EntropyDevice {
    /// Rate limits (refused: Hover has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limiter: Option<serde_json::Value>,
}

/// `PUT /balloon` (and `GET /balloon`'s answer): a virtio balloon.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Balloon {
    /// The target, MiB.
    pub amount_mib: u64,
    /// Let the guest deflate when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Seconds between statistics requests (0: none).
    #[serde(default)]
    pub stats_polling_interval_s: u32,
    /// Free page hinting (refused if true: Hover offers reporting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_page_hinting: Option<bool>,
    /// Free page reporting (default off, as in Firecracker).
    #[serde(default)]
    pub free_page_reporting: bool,
}

/// `PATCH /balloon`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonUpdate {
    /// The new target, MiB.
    pub amount_mib: u64,
}

/// `PATCH /balloon/statistics`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonStatsUpdate {
    /// Seconds between statistics requests (0: none).
    pub stats_polling_interval_s: u32,
}

/// `GET /balloon/statistics`: the target, the guest's answer and its
/// statistics, each under its own key (Firecracker's shape).
#[derive(Debug, Serialize)]
pub struct BalloonStats {
    /// Pages the device aims to hold.
    pub target_pages: u32,
    /// Pages the guest says it holds.
    pub actual_pages: u32,
    /// See `target_pages`, MiB.
    pub target_mib: u64,
    /// See `actual_pages`, MiB.
    pub actual_mib: u64,
    /// The guest's statistics (`swap_in`, `free_memory`, ...).
    #[serde(flatten)]
    pub statistics: std::collections::BTreeMap<String, u64>,
}

/// `PUT /actions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceActionInfo {
    /// `InstanceStart`, `SendCtrlAltDel` or `FlushMetrics`.
    pub action_type: String,
}

/// `PATCH /vm`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmState {
    /// `Paused` or `Resumed`.
    pub state: String,
}

/// `PUT /snapshot/create`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateParams {
    /// Where the state goes (Hover: the whole snapshot).
    pub snapshot_path: String,
    /// Where the memory goes (Hover: a second name of the same file).
    pub mem_file_path: String,
    /// `Full` (default) or `Diff` (refused).
    pub snapshot_type: Option<String>,
    /// The microVM version to write for (accepted when it is ours).
    pub version: Option<String>,
}

/// `mem_backend` of a newer Firecracker's `PUT /snapshot/load`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemBackend {
    /// `File` (`Uffd` is refused: Hover pages memory in itself).
    pub backend_type: String,
    /// The memory file.
    pub backend_path: String,
}

/// `PUT /snapshot/load`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotLoadParams {
    /// The snapshot `snapshot/create` wrote.
    pub snapshot_path: String,
    /// The memory file (Firecracker 1.0; later ones take `mem_backend`).
    pub mem_file_path: Option<String>,
    /// The memory file, in a newer Firecracker's form.
    pub mem_backend: Option<MemBackend>,
    /// Diff snapshots (refused).
    #[serde(default)]
    pub enable_diff_snapshots: bool,
    /// Resume the guest once loaded (else it stays paused).
    #[serde(default)]
    pub resume_vm: bool,
}

/// `PUT /logger`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Logger {
    /// The file (or named pipe) log lines go to.
    pub log_path: String,
    /// `Error`, `Warning` (default), `Info`, `Debug`, `Trace` or `Off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    /// Show each line's level.
    #[serde(default)]
    pub show_level: bool,
    /// Show each line's origin (module).
    #[serde(default)]
    pub show_log_origin: bool,
    /// Only lines of this module (a newer Firecracker's field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

/// `PUT /metrics`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// The file (or named pipe) metrics lines go to.
    pub metrics_path: String,
}

/// `GET /`.
#[derive(Debug, Serialize)]
pub struct InstanceInfo {
    /// `Hover`.
    pub app_name: &'static str,
    /// `--id`.
    pub id: String,
    /// `Not started`, `Running` or `Paused`.
    pub state: &'static str,
    /// Hover's version and the API it answers.
    pub vmm_version: String,
}

/// `GET /version`.
#[derive(Debug, Serialize)]
pub struct FirecrackerVersion {
    /// The API version, with Hover's own as semver build metadata.
    pub firecracker_version: String,
}

/// `GET /vm/config`, and the JSON of `--config-file`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FullVmConfiguration {
    /// The boot source.
    #[serde(rename = "boot-source", skip_serializing_if = "Option::is_none")]
    pub boot_source: Option<BootSource>,
    /// The machine.
    #[serde(rename = "machine-config", skip_serializing_if = "Option::is_none")]
    pub machine_config: Option<MachineConfiguration>,
    /// The logger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logger: Option<Logger>,
    /// The metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// Block devices (a Linux guest's).
    #[serde(default)]
    pub drives: Vec<Drive>,
    /// Network interfaces (a Linux guest's).
    #[serde(rename = "network-interfaces", default)]
    pub network_interfaces: Vec<NetworkInterface>,
    /// vsock (refused if given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsock: Option<serde_json::Value>,
    /// Balloon (a Linux guest's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balloon: Option<Balloon>,
    /// MMDS (refused if given).
    #[serde(rename = "mmds-config", skip_serializing_if = "Option::is_none")]
    pub mmds_config: Option<serde_json::Value>,
    /// Entropy device (a Linux guest's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy: Option<EntropyDevice>,
}

impl FullVmConfiguration {
    /// The first device in it that Hover does not have, if any.
    pub fn device_refused(&self) -> Option<&'static str> {
        if self.vsock.is_some() {
            Some("vsock")
        } else if self.mmds_config.is_some() {
            Some("mmds-config")
        } else {
            None
        }
    }
}
