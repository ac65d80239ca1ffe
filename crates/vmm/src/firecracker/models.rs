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
    /// The guest image: an x86-64 ELF executable.
    pub kernel_image_path: String,
    /// The guest's command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_args: Option<String>,
    /// An initrd (refused: Hover's guests have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
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
    /// Block devices (none: Hover has none; refused if given).
    #[serde(default)]
    pub drives: Vec<serde_json::Value>,
    /// Network interfaces (none; refused if given).
    #[serde(rename = "network-interfaces", default)]
    pub network_interfaces: Vec<serde_json::Value>,
    /// vsock (refused if given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vsock: Option<serde_json::Value>,
    /// Balloon (refused if given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balloon: Option<serde_json::Value>,
    /// MMDS (refused if given).
    #[serde(rename = "mmds-config", skip_serializing_if = "Option::is_none")]
    pub mmds_config: Option<serde_json::Value>,
    /// Entropy device (refused if given).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy: Option<serde_json::Value>,
}

impl FullVmConfiguration {
    /// The first device in it that Hover does not have, if any.
    pub fn device_refused(&self) -> Option<&'static str> {
        if !self.drives.is_empty() {
            Some("drives")
        } else if !self.network_interfaces.is_empty() {
            Some("network-interfaces")
        } else if self.vsock.is_some() {
            Some("vsock")
        } else if self.balloon.is_some() {
            Some("balloon")
        } else if self.mmds_config.is_some() {
            Some("mmds-config")
        } else if self.entropy.is_some() {
            Some("entropy")
        } else {
            None
        }
    }
}
