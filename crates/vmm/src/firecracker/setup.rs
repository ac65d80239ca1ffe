//! Before the start: the requests that configure a microVM, answered on
//! the thread that will run it (it may open the files they name), and the
//! two ways to start one (`InstanceStart`, `snapshot/load`).

use crate::sync::Locked;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::checks::{check_initrd, check_kernel, check_machine, same_snapshot};
use super::devices::LinuxDevices;
use super::models::{
    Balloon, BalloonStatsUpdate, BalloonUpdate, BootSource, Drive, EntropyDevice,
    FullVmConfiguration, InstanceActionInfo, Logger, MachineConfiguration,
    MachineConfigurationPatch, Metrics, NetworkInterface, SnapshotLoadParams,
};
use super::refusal::Refusal;
use super::{done, fault, parse, FirecrackerError, LoggerHook, Shared};
use crate::api::http::Answer;
use crate::config::{GuestImage, HostConfig, MachineConfig, VmConfig};
use crate::vm::{MemoryRestore, RestoreOptions, Vm};

/// What a request led to.
pub(super) enum Step {
    /// Its answer; configuring goes on.
    Answer(Answer),
    /// A VM, built and ready to run.
    Start(Box<Vm>),
}

/// Firecracker's answer to a pre-boot-only request once the VM runs, and
/// its counterpart before.
pub(super) const AFTER_START: &str =
    "The requested operation is not supported after starting the microVM.";
const BEFORE_START: &str = "The requested operation is not supported before starting the microVM.";

/// The microVM being configured.
pub(super) struct Setup {
    shared: Arc<Shared>,
    host: HostConfig,
    machine: MachineConfiguration,
    boot: Option<(BootSource, GuestImage)>,
    /// A Linux guest's drives, network interfaces and entropy device.
    devices: LinuxDevices,
    /// Whether anything but the logger and metrics was configured (a
    /// snapshot load is refused then, as Firecracker refuses it).
    configured: bool,
    /// The signal that ended the wait, if one did.
    pub(super) signalled: Option<i32>,
}

impl Setup {
    pub(super) fn new(shared: Arc<Shared>, host: HostConfig) -> Setup {
        let s = Setup {
            shared,
            host,
            machine: MachineConfiguration::default(),
            boot: None,
            devices: LinuxDevices::default(),
            configured: false,
            signalled: None,
        };
        s.publish();
        s
    }

    /// Show the configuration as it is now in `GET /vm/config`.
    fn publish(&self) {
        let mut c = self.shared.config.locked();
        c.machine_config = Some(self.machine.clone());
        c.boot_source = self.boot.as_ref().map(|(b, _)| b.clone());
        c.drives = self.devices.drives.clone();
        c.network_interfaces = self.devices.nets.clone();
        c.entropy = self.devices.entropy.clone();
        c.balloon = self.devices.balloon.clone();
    }

    /// Answer one request before the start.
    pub(super) fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
        set_logger: &mut LoggerHook,
    ) -> Step {
        let answer = match (method, path) {
            // Queries are answered by the server's threads from what
            // `publish` shows (`super::query_before_start`).
            ("PUT", "/machine-config") => self.put_machine(body),
            ("PATCH", "/machine-config") => self.patch_machine(body),
            ("PUT", "/boot-source") => self.put_boot(body),
            ("PUT", "/entropy") => match parse::<EntropyDevice>(body) {
                Ok(e) => self.device(|d| d.put_entropy(e)),
                Err(a) => a,
            },
            ("PUT", "/balloon") => match parse::<Balloon>(body) {
                Ok(b) if b.amount_mib > self.machine.mem_size_mib => fault(
                    400,
                    format!(
                        "amount_mib {} is more than the microVM's {} MiB of memory",
                        b.amount_mib, self.machine.mem_size_mib
                    ),
                ),
                Ok(b) => self.device(|d| d.put_balloon(b)),
                Err(a) => a,
            },
            ("PATCH", "/balloon") => match parse::<BalloonUpdate>(body) {
                Ok(u) => self.device(|d| d.patch_balloon(u.amount_mib)),
                Err(a) => a,
            },
            ("PATCH", "/balloon/statistics") => match parse::<BalloonStatsUpdate>(body) {
                Ok(u) => self.device(|d| match &mut d.balloon {
                    Some(b) => {
                        b.stats_polling_interval_s = u.stats_polling_interval_s;
                        Ok(())
                    }
                    None => Err(Refusal::from("there is no balloon: PUT /balloon first")),
                }),
                Err(a) => a,
            },
            ("PUT", p) if p.starts_with("/drives/") => match parse::<Drive>(body) {
                Ok(d) => self.device(|s| s.put_drive(&p["/drives/".len()..], d)),
                Err(a) => a,
            },
            ("PUT", p) if p.starts_with("/network-interfaces/") => {
                match parse::<NetworkInterface>(body) {
                    Ok(n) => self.device(|s| s.put_net(&p["/network-interfaces/".len()..], n)),
                    Err(a) => a,
                }
            }
            ("PUT", "/logger") => match parse::<Logger>(body) {
                Ok(l) => self
                    .logger(&l, set_logger)
                    .map_or_else(|e| fault(400, e), |()| done()),
                Err(a) => a,
            },
            ("PUT", "/metrics") => match parse::<Metrics>(body) {
                Ok(m) => self.metrics(&m).map_or_else(|e| fault(400, e), |()| done()),
                Err(a) => a,
            },
            ("PUT", "/actions") => return self.action(body),
            ("PUT", "/snapshot/load") => return self.load(body),
            ("PATCH", "/vm") | ("PUT", "/snapshot/create") => fault(400, BEFORE_START),
            _ => fault(
                400,
                format!("Invalid request method and/or path: {method} {path}."),
            ),
        };
        Step::Answer(answer)
    }

    fn put_machine(&mut self, body: &[u8]) -> Answer {
        match parse::<MachineConfiguration>(body) {
            Ok(m) => self.set_machine(m),
            Err(a) => a,
        }
    }

    fn patch_machine(&mut self, body: &[u8]) -> Answer {
        let p = match parse::<MachineConfigurationPatch>(body) {
            Ok(p) => p,
            Err(a) => return a,
        };
        let mut m = self.machine.clone();
        m.vcpu_count = p.vcpu_count.unwrap_or(m.vcpu_count);
        m.mem_size_mib = p.mem_size_mib.unwrap_or(m.mem_size_mib);
        m.smt = p.smt.unwrap_or(m.smt);
        m.cpu_template = p.cpu_template.or(m.cpu_template);
        m.track_dirty_pages = p.track_dirty_pages.unwrap_or(m.track_dirty_pages);
        self.set_machine(m)
    }

    fn set_machine(&mut self, m: MachineConfiguration) -> Answer {
        if let Err(e) = check_machine(&m) {
            return fault(400, e);
        }
        self.machine = m;
        self.configured = true;
        self.publish();
        done()
    }

    /// Configure a device with `put`: 204, or 400 with its refusal.
    fn device(&mut self, put: impl FnOnce(&mut LinuxDevices) -> Result<(), Refusal>) -> Answer {
        match put(&mut self.devices) {
            Ok(()) => {
                self.configured = true;
                self.publish();
                done()
            }
            Err(e) => fault(400, e),
        }
    }

    fn put_boot(&mut self, body: &[u8]) -> Answer {
        let b = match parse::<BootSource>(body) {
            Ok(b) => b,
            Err(a) => return a,
        };
        let mut image = match check_kernel(
            Path::new(&b.kernel_image_path),
            self.machine.mem_size_mib << 20,
        ) {
            Ok(i) => i,
            Err(e) => return fault(400, e),
        };
        match (&mut image, &b.initrd_path) {
            (GuestImage::Linux(boot), Some(initrd)) => match check_initrd(Path::new(initrd)) {
                Ok(()) => boot.initrd = Some(initrd.into()),
                Err(e) => return fault(400, e),
            },
            (_, Some(_)) => {
                return fault(
                    400,
                    "initrd_path is for a Linux kernel: Hover's own guest is one x86-64 ELF executable (`hover guest-image`) with no initrd; drop initrd_path",
                )
            }
            _ => {}
        }
        if let (GuestImage::Builtin, Some(args)) = (&image, &b.boot_args) {
            // The built-in guest's command line, checked as `hover run` checks it.
            let m = MachineConfig {
                cmdline: args.clone(),
                ..MachineConfig::default()
            };
            if let Err(e) = m.validate() {
                return fault(400, format!("boot_args: {e}"));
            }
        }
        self.boot = Some((b, image));
        self.configured = true;
        self.publish();
        done()
    }

    /// `PUT /logger`, or `--log-path`.
    pub(super) fn logger(&mut self, l: &Logger, set: &mut LoggerHook) -> Result<(), Refusal> {
        set(l)?;
        self.shared.config.locked().logger = Some(l.clone());
        Ok(())
    }

    /// `PUT /metrics`, or `--metrics-path`.
    pub(super) fn metrics(&mut self, m: &Metrics) -> Result<(), Refusal> {
        let mut slot = self.shared.metrics.locked();
        if slot.is_some() {
            return Err(Refusal::from("Reinitialization of metrics not allowed."));
        }
        let file = open_log(Path::new(&m.metrics_path))
            .map_err(|e| format!("metrics_path {}: cannot open it: {e}", m.metrics_path))?;
        *slot = Some(file);
        drop(slot);
        self.shared.config.locked().metrics = Some(m.clone());
        Ok(())
    }

    fn action(&mut self, body: &[u8]) -> Step {
        let a = match parse::<InstanceActionInfo>(body) {
            Ok(a) => a,
            Err(a) => return Step::Answer(a),
        };
        Step::Answer(match a.action_type.as_str() {
            "InstanceStart" => match self.build() {
                Ok(vm) => return Step::Start(Box::new(vm)),
                Err(e) => fault(400, e),
            },
            "FlushMetrics" => super::metrics::flush_answer(&self.shared, None),
            "SendCtrlAltDel" => fault(400, BEFORE_START),
            other => fault(
                400,
                format!(
                    "unknown action_type {}: give InstanceStart, SendCtrlAltDel or FlushMetrics",
                    crate::api::quote(other)
                ),
            ),
        })
    }

    /// Build the configured VM.
    fn build(&self) -> Result<Vm, Refusal> {
        let Some((boot, image)) = &self.boot else {
            return Err(Refusal::from(
                "Cannot start microvm without kernel configuration.",
            ));
        };
        let linux = image.is_linux();
        if !linux && !self.devices.is_empty() {
            return Err(Refusal::from("drives, network interfaces, entropy devices and balloons need a Linux guest: kernel_image_path is Hover's own guest, which has no virtio drivers"));
        }
        let default_cmdline = if linux {
            crate::boot::linux::DEFAULT_CMDLINE
        } else {
            crate::config::DEFAULT_CMDLINE
        };
        let mut config = VmConfig {
            machine: MachineConfig {
                vcpus: self.machine.vcpu_count,
                memory: self.machine.mem_size_mib << 20,
                guest: image.clone(),
                cmdline: boot
                    .boot_args
                    .clone()
                    .unwrap_or_else(|| default_cmdline.into()),
                guest_poll_max_ns: crate::config::default_guest_poll_ns(image),
                ..MachineConfig::default()
            },
            host: self.host.clone(),
        };
        if linux {
            self.devices.apply(&mut config.machine, &mut config.host);
        }
        Vm::new(&config).map_err(|e| Refusal(format!("Cannot start the microVM: {e}")))
    }

    fn load(&mut self, body: &[u8]) -> Step {
        let p = match parse::<SnapshotLoadParams>(body) {
            Ok(p) => p,
            Err(a) => return Step::Answer(a),
        };
        match self.restore(&p) {
            Ok(vm) => Step::Start(Box::new(vm)),
            Err(e) => Step::Answer(fault(400, e)),
        }
    }

    fn restore(&mut self, p: &SnapshotLoadParams) -> Result<Vm, Refusal> {
        if self.configured {
            return Err(Refusal(
                "Loading a microVM snapshot not allowed after configuring boot-specific resources."
                    .into(),
            ));
        }
        if p.enable_diff_snapshots {
            return Err(Refusal(
                "Hover makes full snapshots only: enable_diff_snapshots is not supported".into(),
            ));
        }
        let mem = match (&p.mem_file_path, &p.mem_backend) {
            (Some(m), None) => m.clone(),
            (None, Some(b)) if b.backend_type == "File" => b.backend_path.clone(),
            (None, Some(b)) if b.backend_type == "Uffd" => {
                return Err(Refusal::from("mem_backend Uffd is not supported: Hover pages a snapshot's memory in itself (its own userfaultfd pager); give backend_type File"))
            }
            (None, Some(b)) => {
                return Err(Refusal(format!(
                    "mem_backend: unknown backend_type {}: give File",
                    crate::api::quote(&b.backend_type)
                )))
            }
            (Some(_), Some(_)) => {
                return Err(Refusal::from("give either mem_file_path or mem_backend, not both"))
            }
            (None, None) => return Err(Refusal::from("missing mem_file_path (or mem_backend)")),
        };
        let snap = PathBuf::from(&p.snapshot_path);
        same_snapshot(&snap, Path::new(&mem))?;
        let opts = RestoreOptions {
            memory: MemoryRestore::Prefetch,
            prefetch_rate: None,
            host: self.host.clone(),
        };
        let mut vm =
            Vm::restore(&snap, &opts).map_err(|e| format!("Cannot load the snapshot: {e}"))?;
        if !p.resume_vm {
            vm.start_paused();
        }
        // What the snapshot holds is the machine now (`GET /machine-config`).
        let restored = vm.controller().info().config.machine;
        self.machine.vcpu_count = restored.vcpus;
        self.machine.mem_size_mib = restored.memory >> 20;
        self.publish();
        Ok(vm)
    }

    /// Apply a `--config-file` and build its VM.
    pub(super) fn apply_file(
        &mut self,
        file: FullVmConfiguration,
        set_logger: &mut LoggerHook,
    ) -> Result<Vm, FirecrackerError> {
        if let Some(d) = file.device_refused() {
            return Err(FirecrackerError::Config(format!(
                "--config-file: Hover has no {d} devices: remove \"{d}\" (docs/FIRECRACKER.md)"
            )));
        }
        let bad = |what: &str, a: Answer| {
            let msg = serde_json::from_str::<serde_json::Value>(&a.2)
                .ok()
                .and_then(|v| v["fault_message"].as_str().map(String::from))
                .unwrap_or(a.2);
            FirecrackerError::Config(format!("--config-file: {what}: {msg}"))
        };
        if let Some(l) = &file.logger {
            self.logger(l, set_logger)
                .map_err(|e| FirecrackerError::Config(format!("--config-file: logger: {e}")))?;
        }
        if let Some(m) = &file.metrics {
            self.metrics(m)
                .map_err(|e| FirecrackerError::Config(format!("--config-file: metrics: {e}")))?;
        }
        if let Some(m) = file.machine_config {
            let a = self.set_machine(m);
            if a.0 != 204 {
                return Err(bad("machine-config", a));
            }
        }
        for d in file.drives {
            let id = d.drive_id.clone();
            self.devices.put_drive(&id, d).map_err(|e| {
                FirecrackerError::Config(format!("--config-file: drives: {id}: {e}"))
            })?;
        }
        for n in file.network_interfaces {
            let id = n.iface_id.clone();
            self.devices.put_net(&id, n).map_err(|e| {
                FirecrackerError::Config(format!("--config-file: network-interfaces: {id}: {e}"))
            })?;
        }
        if let Some(e) = file.entropy {
            self.devices
                .put_entropy(e)
                .map_err(|e| FirecrackerError::Config(format!("--config-file: entropy: {e}")))?;
        }
        if let Some(b) = file.balloon {
            self.devices
                .put_balloon(b)
                .map_err(|e| FirecrackerError::Config(format!("--config-file: balloon: {e}")))?;
        }
        let Some(b) = file.boot_source else {
            return Err(FirecrackerError::Config(
                "--config-file: missing \"boot-source\" (the guest image to boot)".into(),
            ));
        };
        let body = serde_json::to_vec(&b).unwrap_or_default();
        let a = self.put_boot(&body);
        if a.0 != 204 {
            return Err(bad("boot-source", a));
        }
        self.build().map_err(|e| FirecrackerError::Config(e.0))
    }
}

/// Open a log or metrics file as Firecracker does (appended to; a named
/// pipe nobody reads yet does not block), with Hover's rules for files it
/// writes ([`crate::host::files::open_output`]).
pub fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    crate::host::files::open_output(path, crate::host::files::Existing::Append)
}
